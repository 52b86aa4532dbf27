//! Maps keyed by the layer's own ids (an adaptor's, an endpoint's): numbers it hands out in
//! sequence, never a peer's input, so they need no defence against chosen keys and are hashed by
//! one multiplication. std's SipHash was about 20 ns of each of the two lookups a snapshot makes
//! per endpoint under the registry's lock.
//!
//! An adaptor's endpoints are an [`IdTable`]: a list in id order, as the ids are handed out, so
//! a snapshot reads them in one pass instead of a lookup each, and an endpoint costs its entry
//! and an eighth (a hash table at 10 000 entries held 16 384 slots and their control bytes).

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

/// Entries in id order. An insert past the newest id (every new endpoint: ids only grow) is a
/// push; a removal leaves a hole, and the holes go in one pass once they are a quarter of the
/// list. Lookups are a binary search.
pub(crate) struct IdTable<V> {
    slots: Vec<(u64, Option<V>)>,
    live: usize,
}

impl<V> Default for IdTable<V> {
    fn default() -> Self {
        IdTable {
            slots: Vec::new(),
            live: 0,
        }
    }
}

impl<V> IdTable<V> {
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    fn position(&self, id: u64) -> Result<usize, usize> {
        self.slots.binary_search_by_key(&id, |&(held, _)| held)
    }

    pub(crate) fn get(&self, id: &u64) -> Option<&V> {
        let at = self.position(*id).ok()?;
        self.slots[at].1.as_ref()
    }

    pub(crate) fn get_mut(&mut self, id: &u64) -> Option<&mut V> {
        let at = self.position(*id).ok()?;
        self.slots[at].1.as_mut()
    }

    pub(crate) fn contains_key(&self, id: &u64) -> bool {
        self.get(id).is_some()
    }

    /// Puts `value` under `id`; what `id` held goes.
    pub(crate) fn insert(&mut self, id: u64, value: V) -> Option<V> {
        if self.slots.last().is_none_or(|&(newest, _)| newest < id) {
            if self.slots.len() == self.slots.capacity() {
                // An eighth more at a time, not twice as many.
                self.slots.reserve_exact((self.slots.len() / 8).max(4));
            }
            self.slots.push((id, Some(value)));
            self.live += 1;
            return None;
        }
        match self.position(id) {
            Ok(at) => {
                let old = self.slots[at].1.replace(value);
                if old.is_none() {
                    self.live += 1;
                }
                old
            }
            Err(at) => {
                self.slots.insert(at, (id, Some(value)));
                self.live += 1;
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, id: &u64) -> Option<V> {
        let at = self.position(*id).ok()?;
        let old = self.slots[at].1.take()?;
        self.live -= 1;
        let holes = self.slots.len() - self.live;
        if holes > 16 && holes > self.live / 4 {
            self.slots.retain(|(_, value)| value.is_some());
            self.slots.shrink_to(self.live + self.live / 8);
        }
        Some(old)
    }

    /// Every entry in id order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.slots
            .iter()
            .filter_map(|(id, value)| Some((*id, value.as_ref()?)))
    }

    /// The entries from `id` on, in id order.
    pub(crate) fn iter_from(&self, id: u64) -> impl Iterator<Item = (u64, &V)> {
        let at = self.position(id).unwrap_or_else(|at| at);
        self.slots[at..]
            .iter()
            .filter_map(|(id, value)| Some((*id, value.as_ref()?)))
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

    #[test]
    fn a_table_keeps_its_entries_in_id_order_through_inserts_and_removals() {
        let mut table = IdTable::default();
        let mut model = std::collections::BTreeMap::new();
        let mut seed = 7u64;
        let mut next = 1u64;
        for step in 0..20_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match seed % 8 {
                // Mostly new ids, as the registry hands them out.
                0..=4 => {
                    assert_eq!(table.insert(next, step), model.insert(next, step));
                    next += 1;
                }
                // An id seen before, moved back in (or never held).
                5 => {
                    let id = seed % next.max(1);
                    assert_eq!(table.insert(id, step), model.insert(id, step));
                }
                _ => {
                    let id = seed % next.max(1);
                    assert_eq!(table.remove(&id), model.remove(&id));
                }
            }
            assert_eq!(table.len(), model.len());
            if step % 500 == 0 {
                let from = seed % next.max(1);
                assert!(table
                    .iter()
                    .map(|(id, v)| (id, *v))
                    .eq(model.iter().map(|(k, v)| (*k, *v))));
                assert!(table
                    .iter_from(from)
                    .map(|(id, v)| (id, *v))
                    .eq(model.range(from..).map(|(k, v)| (*k, *v))));
                assert!((0..next).all(|id| table.get(&id) == model.get(&id)));
            }
        }
        // Emptied, it holds no more than a few holes.
        let ids: Vec<u64> = model.keys().copied().collect();
        for id in ids {
            table.remove(&id);
        }
        assert_eq!(table.len(), 0);
        assert!(table.slots.len() <= 17, "{} slots left", table.slots.len());
    }
}
