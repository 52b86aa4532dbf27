//! What Finagle's failure accrual policies share per endpoint: whether the last failure marked
//! the endpoint dead, how many times in a row it has been, and the revival at its first success.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use tower_outlier_core::{duration_to_nanos, Dice, Nanos};

use crate::EqualJitter;

/// A policy's mark-dead state for one endpoint: Finagle's `markDeadFor` stream and `revived`.
#[derive(Debug)]
pub(crate) struct MarkDead {
    backoff: EqualJitter,
    dice: Dice,
    // The last failure crossed the policy's threshold, and the layer has not acted on it yet.
    fired: AtomicBool,
    // Times marked dead since the last revival: the back-off's position.
    attempt: AtomicU32,
    // Marked dead since the last revival: the next success revives it.
    dead: AtomicBool,
}

impl MarkDead {
    pub(crate) fn new(backoff: EqualJitter, seed: u64) -> Self {
        MarkDead {
            backoff,
            dice: Dice::new(seed),
            fired: AtomicBool::new(false),
            attempt: AtomicU32::new(0),
            dead: AtomicBool::new(false),
        }
    }

    /// The failure just recorded crossed the threshold.
    pub(crate) fn fire(&self) {
        self.fired.store(true, Ordering::Relaxed);
    }

    pub(crate) fn fired(&self) -> bool {
        self.fired.load(Ordering::Relaxed)
    }

    /// A success: true when it revives an endpoint marked dead (Finagle's `revived`), whose
    /// policy then forgets its history and starts its back-off again.
    #[inline]
    pub(crate) fn succeeded(&self) -> bool {
        // A threshold crossed but not acted on yet no longer stands after a success (a streak
        // ended; the average is judged again at the next failure).
        if self.fired.load(Ordering::Relaxed) {
            self.fired.store(false, Ordering::Relaxed);
        }
        if !self.dead.load(Ordering::Relaxed) {
            return false;
        }
        self.dead.store(false, Ordering::Relaxed);
        self.attempt.store(0, Ordering::Relaxed);
        true
    }

    /// The layer ejects the endpoint now: until the next time of the back-off, which moves on.
    pub(crate) fn mark_dead(&self, now: Nanos) -> Option<Nanos> {
        if !self.fired.swap(false, Ordering::Relaxed) {
            return None;
        }
        Some(self.next(now))
    }

    /// The recovery check failed: dead again until the next time of the back-off.
    pub(crate) fn next(&self, now: Nanos) -> Nanos {
        self.dead.store(true, Ordering::Relaxed);
        let attempt = self.attempt.fetch_add(1, Ordering::Relaxed);
        let duration = self.backoff.duration(attempt, &self.dice);
        now.saturating_add(duration_to_nanos(duration))
    }

    /// The layer kept the endpoint in: the next failure that crosses the threshold fires again.
    pub(crate) fn refused(&self) {
        self.fired.store(false, Ordering::Relaxed);
    }

    /// An operator reset the back-off.
    pub(crate) fn reset_backoff(&self) {
        self.attempt.store(0, Ordering::Relaxed);
    }

    /// Takes on `previous`'s state (a reconfiguration): its place in the back-off, whether it is
    /// dead, and a threshold crossed but not acted on.
    pub(crate) fn carry_from(&self, previous: &MarkDead) {
        self.attempt
            .store(previous.attempt.load(Ordering::Relaxed), Ordering::Relaxed);
        self.dead
            .store(previous.dead.load(Ordering::Relaxed), Ordering::Relaxed);
        self.fired
            .store(previous.fired.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The layer re-admits the endpoint: nothing is forgotten until a success revives it (a
    /// failure first marks it dead again, as Finagle's failed probe does).
    pub(crate) fn readmitted(&self) {
        self.fired.store(false, Ordering::Relaxed);
    }
}
