//! Finagle's `consecutiveFailures`: dead at the n-th failure in a row.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tower_outlier_core::{
    CallsNeeded, Comparison, ConfigError, Description, EndpointPolicy, Judged, Judgement, Nanos,
    Observation, Outcome, OutlierPolicy, OwnTiming, Reason, RecoverySchedule, Signal, WindowCounts,
};

use crate::accrual::MarkDead;
use crate::{seeds, EqualJitter};

/// Finagle's `FailureAccrualPolicy.consecutiveFailures(n, backoff)`: an endpoint is marked dead
/// at its n-th failure in a row, for the next time of its [`EqualJitter`] back-off. A success
/// resets the count. After the time out the endpoint is back; as in Finagle, nothing is forgotten
/// until its first success (which also starts the back-off again), so its first failure marks it
/// dead again, for the back-off's next time.
///
/// ```
/// use tower_outlier_finagle::ConsecutiveFailuresAccrual;
///
/// let policy = ConsecutiveFailuresAccrual::new(5)?;
/// assert_eq!(policy.failures(), 5);
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct ConsecutiveFailuresAccrual {
    failures: u32,
    backoff: EqualJitter,
    seeds: seeds::Seeds,
}

impl ConsecutiveFailuresAccrual {
    /// Name in logs, snapshots and reasons.
    pub const NAME: &'static str = "consecutive-failures";

    /// Dead at the `failures`-th failure in a row (at least 1), with Finagle's back-off.
    pub fn new(failures: u32) -> Result<Self, ConfigError> {
        if failures == 0 {
            return Err(ConfigError::new("consecutive_failures", 0, "at least 1"));
        }
        Ok(ConsecutiveFailuresAccrual {
            failures,
            backoff: EqualJitter::finagle(),
            seeds: seeds::Seeds::random(),
        })
    }

    /// The back-off to mark endpoints dead by.
    pub fn backoff(mut self, backoff: EqualJitter) -> Self {
        self.backoff = backoff;
        self
    }

    /// The back-off's jitter drawn from `seed`: the same calls give the same times.
    pub fn seeded(mut self, seed: u64) -> Self {
        self.seeds = seeds::Seeds::new(seed);
        self
    }

    /// Failures in a row that mark an endpoint dead.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

impl OutlierPolicy for ConsecutiveFailuresAccrual {
    type Endpoint = ConsecutiveFailuresEndpoint;

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn new_endpoint(&self) -> ConsecutiveFailuresEndpoint {
        ConsecutiveFailuresEndpoint {
            needed: self.failures,
            in_a_row: AtomicU32::new(0),
            mark: MarkDead::new(self.backoff, self.seeds.next()),
        }
    }

    /// Keeps the streak, the back-off's place and whether the endpoint is dead.
    fn new_endpoint_from(
        &self,
        previous: &ConsecutiveFailuresEndpoint,
        _: Nanos,
    ) -> ConsecutiveFailuresEndpoint {
        let next = self.new_endpoint();
        next.in_a_row
            .store(previous.in_a_row.load(Ordering::Relaxed), Ordering::Relaxed);
        next.mark.carry_from(&previous.mark);
        next
    }

    fn recovery(&self) -> RecoverySchedule {
        // The endpoint's back-off times each ejection; this is the layer's probe timeout.
        RecoverySchedule::fixed(self.backoff.start())
    }

    fn trial_period(&self) -> Duration {
        self.backoff.start()
    }
}

/// [`ConsecutiveFailuresAccrual`]'s state for one endpoint.
#[derive(Debug)]
pub struct ConsecutiveFailuresEndpoint {
    needed: u32,
    in_a_row: AtomicU32,
    mark: MarkDead,
}

impl EndpointPolicy for ConsecutiveFailuresEndpoint {
    #[inline]
    fn record(&self, observation: &Observation, _: Nanos) -> Signal {
        match observation.outcome {
            Outcome::Success => {
                if self.in_a_row.load(Ordering::Relaxed) != 0 {
                    self.in_a_row.store(0, Ordering::Relaxed);
                }
                self.mark.succeeded();
                Signal::None
            }
            Outcome::Failure(_) => {
                let in_a_row = self
                    .in_a_row
                    .fetch_add(1, Ordering::Relaxed)
                    .saturating_add(1);
                if in_a_row >= self.needed {
                    self.mark.fire();
                    Signal::Evaluate
                } else {
                    Signal::None
                }
            }
            Outcome::Cancelled | Outcome::NotSent => Signal::None,
        }
    }

    fn judge(&self, _: Nanos) -> Judgement {
        if !self.mark.fired() {
            return Judgement::Healthy;
        }
        let in_a_row = self.in_a_row.load(Ordering::Relaxed);
        Judgement::Outlier(Reason {
            policy: ConsecutiveFailuresAccrual::NAME,
            measure: "consecutive failures",
            value: f64::from(in_a_row),
            threshold: f64::from(self.needed),
            comparison: Comparison::AtOrAbove,
            counts: WindowCounts {
                calls: u64::from(in_a_row),
                failures: u64::from(in_a_row),
                slow: 0,
            },
        })
    }

    fn describe(&self, _: Nanos) -> Description {
        let in_a_row = u64::from(self.in_a_row.load(Ordering::Relaxed));
        Description {
            counts: WindowCounts {
                calls: in_a_row,
                failures: in_a_row,
                slow: 0,
            },
            judged: Some(Judged {
                measure: "consecutive failures",
                value: in_a_row as f64,
                threshold: f64::from(self.needed),
            }),
            ..Description::default()
        }
    }

    fn reset(&self) {
        self.mark.readmitted();
    }

    fn own_timing(&self) -> Option<&dyn OwnTiming> {
        Some(self)
    }

    fn calls_needed(&self) -> Option<&dyn CallsNeeded> {
        Some(self)
    }
}

impl CallsNeeded for ConsecutiveFailuresEndpoint {
    /// The rest of the streak: a balancer that avoids an endpoint failing fast would otherwise
    /// never let it reach the count.
    fn calls_wanted(&self, _: Nanos) -> u64 {
        if self.mark.fired() {
            return 0;
        }
        let in_a_row = self.in_a_row.load(Ordering::Relaxed);
        if in_a_row == 0 {
            return 0;
        }
        u64::from(self.needed.saturating_sub(in_a_row))
    }
}

impl OwnTiming for ConsecutiveFailuresEndpoint {
    fn check_at(&self, now: Nanos) -> Option<Nanos> {
        self.mark.mark_dead(now)
    }

    fn check_after_failed_probe(&self, _: u32, now: Nanos) -> Option<Nanos> {
        Some(self.mark.next(now))
    }

    fn ejection_refused(&self, _: Nanos) {
        self.mark.refused();
    }

    fn reset_backoff(&self) {
        self.mark.reset_backoff();
    }
}
