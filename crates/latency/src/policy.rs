//! The detector: each endpoint's mean latency over an interval, against the fleet's.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::{
    Description, EndpointPolicy, FailureKind, FleetMember, FleetPolicy, Judgement, Nanos,
    Observation, Outcome, OutlierPolicy, Reason, RecoverySchedule, Signal, WindowCounts,
};

use crate::config::LatencyConfig;

/// Ejects endpoints whose latency stands out from their peers', as LinkedIn D2's relative
/// strategy does (no threshold to tune per service).
///
/// Every [`interval`](LatencyConfig::interval), for each endpoint in the balancer's set, the mean
/// latency of its calls in the interval — successes and timeouts (a fast failure says nothing of
/// its speed), and its calls still in flight counted at the age they have reached with no call
/// completing, so that a hung endpoint weighs in before its calls time out — is set against the
/// fleet's call-weighted mean. With at least [`min_endpoints`](LatencyConfig::min_endpoints)
/// endpoints of at least [`min_calls`](LatencyConfig::min_calls) calls each, one at or above
/// [`eject_above`](LatencyConfig::eject_above) times the mean is an outlier until the next
/// interval, and the layer ejects it within its budget. It comes back on trial after the
/// recovery schedule's wait; from then on it is an outlier above
/// [`readmit_below`](LatencyConfig::readmit_below) times the mean, until an interval finds it at
/// or below that (D2's hysteresis). A fleet that slows down together moves the mean with it: no
/// endpoint stands out.
///
/// ```
/// use tower_outlier_latency::{LatencyConfig, LatencyPolicy};
///
/// let policy = LatencyPolicy::new(LatencyConfig::d2().build()?);
/// assert_eq!(policy.config().min_endpoints(), 3);
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct LatencyPolicy {
    config: Arc<LatencyConfig>,
}

impl LatencyPolicy {
    /// The policy's name in logs and snapshots.
    pub const NAME: &'static str = "latency";

    /// Judges by `config`.
    pub fn new(config: LatencyConfig) -> Self {
        LatencyPolicy {
            config: Arc::new(config),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LatencyConfig {
        &self.config
    }
}

/// One endpoint's calls and verdict, as [`LatencyPolicy`] keeps them.
#[derive(Debug)]
pub struct LatencyEndpoint {
    // Calls timed since the last evaluation, and their latencies added up.
    calls: AtomicU64,
    total: AtomicU64,
    // The last evaluation's verdict: an outlier, at this ratio to the fleet's mean (f64 bits),
    // against this bar (f64 bits), on this many calls.
    condemned: AtomicBool,
    ratio: AtomicU64,
    bar: AtomicU64,
    judged_calls: AtomicU64,
    // Back from an ejection and not yet found at or below the readmission bar.
    returning: AtomicBool,
}

impl LatencyEndpoint {
    fn new() -> Self {
        LatencyEndpoint {
            calls: AtomicU64::new(0),
            total: AtomicU64::new(0),
            condemned: AtomicBool::new(false),
            ratio: AtomicU64::new(0),
            bar: AtomicU64::new(0),
            judged_calls: AtomicU64::new(0),
            returning: AtomicBool::new(false),
        }
    }

    /// The calls and their total latency since the last evaluation; the counters start again.
    fn take(&self) -> (u64, u64) {
        let calls = self.calls.swap(0, Ordering::AcqRel);
        let total = self.total.swap(0, Ordering::AcqRel);
        (calls, total)
    }

    /// The last evaluation's ratio of this endpoint's mean latency to the fleet's (0 before one
    /// judged it).
    pub fn ratio(&self) -> f64 {
        f64::from_bits(self.ratio.load(Ordering::Relaxed))
    }

    fn clear(&self) {
        self.condemned.store(false, Ordering::Relaxed);
    }
}

impl EndpointPolicy for LatencyEndpoint {
    #[inline]
    fn record(&self, observation: &Observation, _: Nanos) -> Signal {
        if matches!(
            observation.outcome,
            Outcome::Success | Outcome::Failure(FailureKind::Timeout)
        ) {
            let nanos = u64::try_from(observation.latency.as_nanos()).unwrap_or(u64::MAX);
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.total.fetch_add(nanos, Ordering::Relaxed);
        }
        Signal::None
    }

    fn judge(&self, _: Nanos) -> Judgement {
        if !self.condemned.load(Ordering::Relaxed) {
            return Judgement::Healthy;
        }
        Judgement::Outlier(Reason {
            policy: LatencyPolicy::NAME,
            measure: "latency ÷ fleet mean",
            value: self.ratio(),
            threshold: f64::from_bits(self.bar.load(Ordering::Relaxed)),
            counts: WindowCounts {
                calls: self.judged_calls.load(Ordering::Relaxed),
                failures: 0,
                slow: 0,
            },
        })
    }

    fn describe(&self, _: Nanos) -> Description {
        Description {
            counts: WindowCounts {
                calls: self.calls.load(Ordering::Relaxed),
                failures: 0,
                slow: 0,
            },
            state: self.condemned.load(Ordering::Relaxed).then_some("SLOW"),
            weight: None,
        }
    }

    fn reset(&self) {
        self.take();
        self.clear();
        // Back from an ejection: judged by the readmission bar until it meets it.
        self.returning.store(true, Ordering::Relaxed);
    }
}

impl OutlierPolicy for LatencyPolicy {
    type Endpoint = LatencyEndpoint;

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn new_endpoint(&self) -> LatencyEndpoint {
        LatencyEndpoint::new()
    }

    fn recovery(&self) -> RecoverySchedule {
        self.config.recovery
    }

    fn trial_period(&self) -> Duration {
        // Long enough for one evaluation of the endpoint's trial calls, whatever the phase.
        self.config.interval.saturating_mul(2)
    }

    fn fleet(&self) -> Option<&dyn FleetPolicy<State = LatencyEndpoint>> {
        Some(self)
    }
}

impl FleetPolicy for LatencyPolicy {
    type State = LatencyEndpoint;

    fn interval(&self) -> Duration {
        self.config.interval
    }

    fn counts_in_flight(&self) -> bool {
        true
    }

    fn evaluate(&self, fleet: &[FleetMember<'_, LatencyEndpoint>], _now: Nanos) {
        let config = &*self.config;
        // (member, calls, total latency): each endpoint in the set with enough calls.
        let mut judged: Vec<(&FleetMember<'_, LatencyEndpoint>, u64, f64)> = Vec::new();
        for member in fleet {
            let (calls, total) = member.state.take();
            // Each interval judges afresh.
            member.state.clear();
            if !member.available {
                continue;
            }
            let pending = member.in_flight as u64;
            let calls = calls.saturating_add(pending);
            let total = total as f64 + pending as f64 * member.waited as f64;
            if calls >= config.min_calls {
                judged.push((member, calls, total));
            }
        }
        if judged.len() < config.min_endpoints {
            return;
        }
        let (calls, total) = judged
            .iter()
            .fold((0u64, 0f64), |(c, t), (_, calls, total)| {
                (c.saturating_add(*calls), t + total)
            });
        let mean = total / calls as f64;
        if !(mean.is_finite() && mean > 0.0) {
            return;
        }
        for (member, calls, total) in judged {
            let state = member.state;
            let ratio = total / calls as f64 / mean;
            state.ratio.store(ratio.to_bits(), Ordering::Relaxed);
            state.judged_calls.store(calls, Ordering::Relaxed);
            let returning = state.returning.load(Ordering::Relaxed);
            let (outlier, bar) = if returning {
                (ratio > config.readmit_below, config.readmit_below)
            } else {
                (ratio >= config.eject_above, config.eject_above)
            };
            if outlier {
                state.bar.store(bar.to_bits(), Ordering::Relaxed);
                state.condemned.store(true, Ordering::Relaxed);
                tracing::debug!(
                    target: "tower_outlier",
                    endpoint = ?member.key,
                    ratio,
                    bar,
                    calls,
                    "latency outlier against the fleet's mean"
                );
                member.record.request_evaluation();
            } else if returning {
                state.returning.store(false, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc as StdArc;
    use tower_outlier_core::{Clock, EndpointRecord, Notifier};

    fn record() -> EndpointRecord {
        EndpointRecord::new(Clock::tokio(), Box::new([]), StdArc::new(Notifier::new()))
    }

    fn ms(n: u64) -> Observation {
        Observation {
            outcome: Outcome::Success,
            latency: Duration::from_millis(n),
        }
    }

    /// Evaluates `policy` over states that recorded `calls` calls of `latency_ms` each (and the
    /// given calls in flight, waited that long): which were judged outliers.
    fn verdicts(
        policy: &LatencyPolicy,
        states: &[LatencyEndpoint],
        fleet: &[(u64, u64, usize, u64)],
    ) -> Vec<bool> {
        let records: Vec<EndpointRecord> = fleet.iter().map(|_| record()).collect();
        for (state, &(calls, latency_ms, _, _)) in states.iter().zip(fleet) {
            for _ in 0..calls {
                state.record(&ms(latency_ms), 0);
            }
        }
        let keys: Vec<usize> = (0..fleet.len()).collect();
        let members: Vec<FleetMember<'_, LatencyEndpoint>> = states
            .iter()
            .zip(&records)
            .zip(fleet)
            .zip(&keys)
            .map(
                |(((state, record), &(_, _, in_flight, waited_ms)), key)| FleetMember {
                    key,
                    state,
                    record,
                    available: true,
                    in_flight,
                    waited: waited_ms * 1_000_000,
                },
            )
            .collect();
        policy.evaluate(&members, 0);
        states
            .iter()
            .map(|s| matches!(s.judge(0), Judgement::Outlier(_)))
            .collect()
    }

    fn states(n: usize) -> Vec<LatencyEndpoint> {
        (0..n).map(|_| LatencyEndpoint::new()).collect()
    }

    #[test]
    fn a_slow_endpoint_stands_out_and_a_fleet_slowing_together_does_not() {
        let policy = LatencyPolicy::new(LatencyConfig::d2().build().unwrap());
        let fleet = states(5);
        let slow = [
            (20, 30, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
        ];
        assert_eq!(
            verdicts(&policy, &fleet, &slow),
            [true, false, false, false, false]
        );
        let together = [(100, 30, 0, 0); 5];
        assert_eq!(
            verdicts(&policy, &fleet, &together),
            [false; 5],
            "each interval judges afresh"
        );
        // Too few calls, or too few endpoints with enough: nobody is judged.
        let few = [
            (5, 300, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
        ];
        assert_eq!(verdicts(&policy, &fleet, &few), [false; 5]);
        let two = [
            (100, 300, 0, 0),
            (100, 10, 0, 0),
            (0, 0, 0, 0),
            (0, 0, 0, 0),
            (0, 0, 0, 0),
        ];
        assert_eq!(verdicts(&policy, &fleet, &two), [false; 5]);
    }

    #[test]
    fn calls_in_flight_count_at_their_age() {
        let policy = LatencyPolicy::new(LatencyConfig::d2().build().unwrap());
        let fleet = states(4);
        // Eight fast calls done and two hung for 2 s: a mean of 400 ms.
        let hung = [
            (8, 10, 2, 2000),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
        ];
        assert_eq!(
            verdicts(&policy, &fleet, &hung),
            [true, false, false, false]
        );
        let ratio = fleet[0].ratio();
        assert!(ratio > 10.0, "{ratio}");
    }

    #[test]
    fn a_returning_endpoint_must_come_down_to_the_lower_bar() {
        let policy = LatencyPolicy::new(LatencyConfig::d2().build().unwrap());
        let fleet = states(4);
        fleet[0].reset();
        // 1.2 times the others: under the ejection bar, over the readmission one.
        let between = [
            (100, 12, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
        ];
        assert!(verdicts(&policy, &fleet, &between)[0]);
        let back = [(100, 10, 0, 0); 4];
        assert!(!verdicts(&policy, &fleet, &back)[0]);
        // Healthy again: only the ejection bar applies now.
        assert!(!verdicts(&policy, &fleet, &between)[0]);
    }

    #[test]
    fn fast_failures_are_not_timed_and_timeouts_are() {
        let state = LatencyEndpoint::new();
        let failed = |kind, ms| Observation {
            outcome: Outcome::Failure(kind),
            latency: Duration::from_millis(ms),
        };
        state.record(&failed(FailureKind::Transport, 1), 0);
        state.record(&failed(FailureKind::Timeout, 1000), 0);
        assert_eq!(state.take(), (1, 1_000_000_000));
    }
}
