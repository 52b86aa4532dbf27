//! Maps keyed by the layer's own ids (an adaptor's, an endpoint's): numbers it hands out in
//! sequence, never a peer's input, so they need no defence against chosen keys and are hashed by
//! one multiplication. std's SipHash was about 20 ns of each of the two lookups a snapshot makes
//! per endpoint under the registry's lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by an id the layer handed out.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of one `u64`: the multiplier is odd, so ids that differ in their low bits
/// land in different buckets of any power-of-two table, and its high bits (which the table's
/// control bytes take) mix every bit of the id.
#[derive(Clone, Copy, Default)]
pub(crate) struct IdHasher(u64);

const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used for `u64` keys; correct for any other all the same.
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(FIBONACCI);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id).wrapping_mul(FIBONACCI);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_fill_a_table_without_collisions_in_its_low_bits() {
        // The bucket index is the hash's low bits: 4096 sequential ids, 4096 buckets.
        let mut seen = vec![false; 4096];
        for id in 1_000..5_096u64 {
            let mut hasher = IdHasher::default();
            hasher.write_u64(id);
            let bucket = (hasher.finish() & 4095) as usize;
            assert!(!seen[bucket], "id {id} collides");
            seen[bucket] = true;
        }
        let mut map: IdMap<u64> = IdMap::default();
        for id in 0..10_000 {
            map.insert(id, id * 2);
        }
        assert!((0..10_000).all(|id| map[&id] == id * 2));
    }
}
