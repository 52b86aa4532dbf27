//! A seedable random source without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// A seedable random source that any thread may draw from without a lock: SplitMix64 over an
/// atomic counter, so two draws racing each get their own number. For the policies' dice
/// (enforcement percentages, jittered back-offs), seeded for repeatable tests and benchmarks.
///
/// ```
/// use tower_outlier_core::Dice;
///
/// let (a, b) = (Dice::new(7), Dice::new(7));
/// assert_eq!(a.next(), b.next());
/// assert!((0.0..1.0).contains(&a.unit()));
/// ```
#[derive(Debug)]
pub struct Dice {
    state: AtomicU64,
}

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl Dice {
    /// A source starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Dice {
            state: AtomicU64::new(seed),
        }
    }

    /// The next number, uniform over `u64`.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&self) -> u64 {
        let mut z = self
            .state
            .fetch_add(GOLDEN_GAMMA, Ordering::Relaxed)
            .wrapping_add(GOLDEN_GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with `percent` % chance. 0 and 100 draw nothing, so the defaults cost no draw.
    pub fn enforce(&self, percent: u32) -> bool {
        match percent {
            0 => false,
            100.. => true,
            _ => self.next() % 100 < u64::from(percent),
        }
    }

    /// A uniform number in `[0, 1)`.
    pub fn unit(&self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
