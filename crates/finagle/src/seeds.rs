//! Where each endpoint's dice start.

use std::hash::{BuildHasher, RandomState};

use tower_outlier_core::Dice;

/// A policy's source of seeds for its endpoints' dice: random unless the policy is seeded.
#[derive(Debug)]
pub(crate) struct Seeds(Dice);

impl Seeds {
    pub(crate) fn new(seed: u64) -> Self {
        Seeds(Dice::new(seed))
    }

    /// Seeded from the process's random hash keys.
    pub(crate) fn random() -> Self {
        Seeds::new(RandomState::new().hash_one(0x5eed_u64))
    }

    pub(crate) fn next(&self) -> u64 {
        self.0.next()
    }
}
