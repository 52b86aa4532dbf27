//! The detector: each endpoint's latency quantile over an interval, against the fleet's median.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::{
    Comparison, Description, EndpointPolicy, FailureKind, FleetMember, FleetPolicy, Judgement,
    Nanos, Observation, Outcome, OutlierPolicy, Reason, RecoverySchedule, Signal, Weighting,
    WindowCounts,
};

use crate::config::{FleetBar, LatencyConfig, LatencyStatistic};
use crate::sketch::{Counts, Sketch};

/// Ejects endpoints whose latency stands out from their peers', by LinkedIn D2's relative rule
/// (no threshold to tune per service).
///
/// Every [`interval`](LatencyConfig::interval), for each endpoint in the balancer's set, the
/// [`statistic`](LatencyConfig::statistic) (a quantile, or the mean) of the latencies of its
/// calls in the interval — successes and timeouts (a fast failure says nothing of its speed),
/// and its calls still in flight counted at the age they have reached with no call completing,
/// each as many calls as the bar's worth of time it has held, so that a hung endpoint weighs in
/// before its calls time out — read from a fixed-size sketch, is set against the
/// [`fleet's bar`](LatencyConfig::fleet_bar) (the median of the endpoints' statistics, or their
/// call-weighted mean). With at least
/// [`min_endpoints`](LatencyConfig::min_endpoints) endpoints of at least
/// [`min_calls`](LatencyConfig::min_calls) calls each, one at or above
/// [`eject_above`](LatencyConfig::eject_above) times the bar
/// [`intervals`](LatencyConfig::intervals) in a row is an outlier until the next interval, and
/// the layer ejects it within its budget (or, with
/// [`down_weight`](crate::LatencyConfigBuilder::down_weight), its weight is lowered). It comes back on
/// trial after the recovery schedule's wait; from then on it is an outlier above
/// [`readmit_below`](LatencyConfig::readmit_below) times the bar, until an interval finds it at
/// or below that (D2's hysteresis).
///
/// Why [`LatencyConfig::recommended`] takes a quantile and a median where D2 takes means: one
/// call of a second among a thousand of a millisecond triples an endpoint's mean (a healthy
/// endpoint ejected for one slow call), and a slow endpoint's calls raise a call-weighted fleet
/// mean toward it; the p90 ignores calls rarer than one in ten, and the median ignores one
/// outlier among three endpoints or more. A fleet that slows down together moves either bar with
/// it: no endpoint stands out.
///
/// ```
/// use tower_outlier_latency::{LatencyConfig, LatencyPolicy};
///
/// let policy = LatencyPolicy::new(LatencyConfig::recommended().build()?);
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
    // The latencies of the calls timed since the last evaluation.
    sketch: Sketch,
    // The last evaluation's verdict: an outlier, at this ratio to the fleet's median (f64 bits),
    // against this bar (f64 bits), on this many calls.
    condemned: AtomicBool,
    ratio: AtomicU64,
    bar: AtomicU64,
    judged_calls: AtomicU64,
    // Back from an ejection and not yet found at or below the readmission bar.
    returning: AtomicBool,
    // Intervals in a row it stood out.
    streak: AtomicU32,
    // Down-weighted rather than ejected (`LatencyConfigBuilder::down_weight`): its weight now,
    // f64 bits; 1.0 while it is not. And whether this evaluation judged it.
    weight: AtomicU64,
    judged: AtomicBool,
}

impl LatencyEndpoint {
    fn new() -> Self {
        LatencyEndpoint {
            sketch: Sketch::new(),
            condemned: AtomicBool::new(false),
            ratio: AtomicU64::new(0),
            bar: AtomicU64::new(0),
            judged_calls: AtomicU64::new(0),
            returning: AtomicBool::new(false),
            streak: AtomicU32::new(0),
            weight: AtomicU64::new(1f64.to_bits()),
            judged: AtomicBool::new(false),
        }
    }

    /// The latencies since the last evaluation; the sketch starts again.
    fn take(&self) -> Counts {
        self.sketch.take()
    }

    /// The last evaluation's ratio of this endpoint's latency statistic to the fleet's (0 before
    /// one judged it).
    pub fn ratio(&self) -> f64 {
        f64::from_bits(self.ratio.load(Ordering::Relaxed))
    }

    fn clear(&self) {
        self.condemned.store(false, Ordering::Relaxed);
    }

    /// Its weight while it is down-weighted.
    pub fn down_weighted(&self) -> Option<f64> {
        let weight = f64::from_bits(self.weight.load(Ordering::Relaxed));
        (weight < 1.0).then_some(weight)
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
            self.sketch.record(nanos);
        }
        Signal::None
    }

    fn judge(&self, _: Nanos) -> Judgement {
        if !self.condemned.load(Ordering::Relaxed) {
            return Judgement::Healthy;
        }
        Judgement::Outlier(Reason {
            policy: LatencyPolicy::NAME,
            measure: "latency ÷ fleet bar",
            value: self.ratio(),
            threshold: f64::from_bits(self.bar.load(Ordering::Relaxed)),
            // Ejected at or above its bar; back on trial, strictly above the lower one.
            comparison: if self.returning.load(Ordering::Relaxed) {
                Comparison::Above
            } else {
                Comparison::AtOrAbove
            },
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
                calls: self.sketch.calls(),
                failures: 0,
                slow: 0,
            },
            state: self.condemned.load(Ordering::Relaxed).then_some("SLOW"),
            weight: self.down_weighted().map(|weight| Weighting {
                weight,
                degraded: true,
            }),
            judged: None,
        }
    }

    fn reset(&self) {
        self.take();
        self.clear();
        self.streak.store(0, Ordering::Relaxed);
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
        // Each endpoint in the set: its completed calls, and its calls in flight.
        let mut taken = Vec::new();
        for member in fleet {
            let counts = member.state.take();
            // Each interval judges afresh.
            member.state.clear();
            member.state.judged.store(false, Ordering::Relaxed);
            if member.available {
                taken.push((member, counts));
            }
        }
        // A first bar from the completed calls alone, to weigh the calls in flight by: one that
        // has waited n times the bar counts as n calls that long (the time it held), so a hung
        // endpoint, which p2c soon sends nothing more, still has the calls to be judged on.
        let first_bar = bar_of(
            config,
            taken
                .iter()
                .filter(|(_, counts)| counts.calls() >= config.min_calls)
                .filter_map(|(_, counts)| Some((statistic_of(config, counts)?, counts.calls())))
                .collect(),
        );
        // (member, calls, statistic): each endpoint with enough calls.
        let mut judged: Vec<(&FleetMember<'_, LatencyEndpoint>, u64, f64)> = Vec::new();
        for (member, mut counts) in taken {
            let pending = u32::try_from(member.in_flight).unwrap_or(u32::MAX);
            if pending > 0 {
                let weight = first_bar.map_or(1.0, |bar| {
                    (member.waited as f64 / bar)
                        .ceil()
                        .clamp(1.0, MAX_IN_FLIGHT_WEIGHT)
                });
                counts.add(member.waited, pending.saturating_mul(weight as u32));
            }
            let calls = counts.calls();
            if calls < config.min_calls {
                continue;
            }
            if let Some(statistic) = statistic_of(config, &counts) {
                judged.push((member, calls, statistic));
            }
        }
        // The fleet's bar: the median of the endpoints' statistics, which one outlier cannot
        // drag up with it (a call-weighted mean of a fleet of few endpoints, it can).
        let bar = bar_of(
            config,
            judged.iter().map(|(_, calls, s)| (*s, *calls)).collect(),
        );
        if let Some(bar) = bar {
            self.judge_against(bar, judged);
        }
        if config.down_weight {
            // A down-weighted endpoint p2c now sends too few calls to judge: its weight doubles
            // each such interval, back to full, so a healed one is not left starved.
            for member in fleet {
                let state = member.state;
                if let Some(weight) = state.down_weighted() {
                    if !state.judged.load(Ordering::Relaxed) {
                        let weight = (weight * 2.0).min(1.0);
                        state.weight.store(weight.to_bits(), Ordering::Relaxed);
                        member.record.set_weight(weight);
                    }
                }
            }
        }
    }
}

impl LatencyPolicy {
    /// Each endpoint judged this interval, against the fleet's `median`.
    fn judge_against(
        &self,
        median: f64,
        judged: Vec<(&FleetMember<'_, LatencyEndpoint>, u64, f64)>,
    ) {
        let config = &*self.config;
        for (member, calls, statistic) in judged {
            let state = member.state;
            state.judged.store(true, Ordering::Relaxed);
            let ratio = statistic / median;
            state.ratio.store(ratio.to_bits(), Ordering::Relaxed);
            state.judged_calls.store(calls, Ordering::Relaxed);
            let returning = state.returning.load(Ordering::Relaxed);
            let (stands_out, bar) = if returning {
                (ratio > config.readmit_below, config.readmit_below)
            } else {
                (ratio >= config.eject_above, config.eject_above)
            };
            let streak = if stands_out {
                state.streak.fetch_add(1, Ordering::Relaxed) + 1
            } else {
                state.streak.store(0, Ordering::Relaxed);
                0
            };
            // Back on trial, one interval above the lower bar fails it.
            let outlier = stands_out && (returning || streak >= config.intervals);
            if config.down_weight {
                // Weighed down rather than ejected: by its ratio while it stands out, back to
                // full weight once it meets the readmission bar.
                let weighted = state.down_weighted().is_some();
                let weight = if outlier || (weighted && ratio > config.readmit_below) {
                    (1.0 / ratio).min(1.0)
                } else {
                    1.0
                };
                if weighted || weight < 1.0 {
                    state.weight.store(weight.to_bits(), Ordering::Relaxed);
                    member.record.set_weight(weight);
                }
                continue;
            }
            if outlier {
                state.bar.store(bar.to_bits(), Ordering::Relaxed);
                state.condemned.store(true, Ordering::Relaxed);
                tracing::debug!(
                    target: "tower_outlier",
                    endpoint = ?member.key,
                    ratio,
                    bar,
                    calls,
                    "latency outlier against the fleet's median"
                );
                member.record.request_evaluation();
            } else if returning {
                state.returning.store(false, Ordering::Relaxed);
            }
        }
    }
}

/// The most calls one call in flight counts as.
const MAX_IN_FLIGHT_WEIGHT: f64 = 10_000.0;

/// The endpoint's statistic from its interval's counts.
fn statistic_of(config: &LatencyConfig, counts: &Counts) -> Option<f64> {
    match config.statistic {
        LatencyStatistic::Quantile(q) => counts.quantile(q),
        LatencyStatistic::Mean => counts.mean(),
    }
}

/// The fleet's bar from the endpoints' (statistic, calls), if there are enough of them and it is
/// a positive number.
fn bar_of(config: &LatencyConfig, judged: Vec<(f64, u64)>) -> Option<f64> {
    match config.bar {
        FleetBar::Median => median_of(
            judged.into_iter().map(|(statistic, _)| statistic).collect(),
            config.min_endpoints,
        ),
        FleetBar::CallWeightedMean => {
            if judged.len() < config.min_endpoints.max(1) {
                return None;
            }
            let calls: u64 = judged.iter().map(|(_, calls)| *calls).sum();
            let sum: f64 = judged.iter().map(|(s, calls)| s * *calls as f64).sum();
            let mean = sum / calls.max(1) as f64;
            (mean.is_finite() && mean > 0.0).then_some(mean)
        }
    }
}

/// The median of `statistics`, if there are `at_least` of them and it is a positive number.
fn median_of(mut statistics: Vec<f64>, at_least: usize) -> Option<f64> {
    if statistics.len() < at_least.max(1) {
        return None;
    }
    statistics.sort_by(f64::total_cmp);
    let middle = statistics.len() / 2;
    let median = if statistics.len().is_multiple_of(2) {
        (statistics[middle - 1] + statistics[middle]) / 2.0
    } else {
        statistics[middle]
    };
    (median.is_finite() && median > 0.0).then_some(median)
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
        let policy = LatencyPolicy::new(LatencyConfig::recommended().intervals(1).build().unwrap());
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
        let policy = LatencyPolicy::new(LatencyConfig::recommended().intervals(1).build().unwrap());
        let fleet = states(4);
        // Eight fast calls done and two hung for 2 s: a p90 of 2 s.
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
        let policy = LatencyPolicy::new(LatencyConfig::recommended().build().unwrap());
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
    fn an_endpoint_must_stand_out_the_intervals_in_a_row() {
        let policy = LatencyPolicy::new(LatencyConfig::recommended().build().unwrap());
        let fleet = states(4);
        let slow = [
            (100, 30, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
        ];
        let fine = [(100, 10, 0, 0); 4];
        assert!(!verdicts(&policy, &fleet, &slow)[0], "one interval");
        assert!(!verdicts(&policy, &fleet, &fine)[0]);
        assert!(
            !verdicts(&policy, &fleet, &slow)[0],
            "the streak began again"
        );
        assert!(verdicts(&policy, &fleet, &slow)[0], "two in a row");
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
        let counts = state.take();
        assert_eq!(counts.calls(), 1);
        let p90 = counts.quantile(0.9).unwrap();
        assert!((p90 / 1e9 - 1.0).abs() < 0.2, "{p90}");
    }

    #[test]
    fn one_slow_call_or_a_rare_tail_judges_nobody() {
        let policy = LatencyPolicy::new(LatencyConfig::recommended().intervals(1).build().unwrap());
        let fleet = states(4);
        // 499 calls of 1 ms and one of 1 s on #0.
        fleet[0].record(&ms(1000), 0);
        let one_slow = [
            (499, 1, 0, 0),
            (500, 1, 0, 0),
            (500, 1, 0, 0),
            (500, 1, 0, 0),
        ];
        assert_eq!(verdicts(&policy, &fleet, &one_slow), [false; 4]);
        // A tail of 5 % of calls at 10× on #0 alone.
        for _ in 0..25 {
            fleet[0].record(&ms(100), 0);
        }
        let tail = [
            (475, 10, 0, 0),
            (500, 10, 0, 0),
            (500, 10, 0, 0),
            (500, 10, 0, 0),
        ];
        assert_eq!(verdicts(&policy, &fleet, &tail), [false; 4]);
    }

    #[test]
    fn d2_judges_means_against_the_call_weighted_mean_and_one_slow_call_moves_it() {
        let policy = LatencyPolicy::new(LatencyConfig::d2().build().unwrap());
        let fleet = states(4);
        // Three times slower on #0, one interval: an outlier at once (D2 judges one interval).
        let slow = [
            (100, 30, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
            (100, 10, 0, 0),
        ];
        assert_eq!(
            verdicts(&policy, &fleet, &slow),
            [true, false, false, false]
        );
        let ratio = fleet[0].ratio();
        // The call-weighted mean is 15 ms: 30 ms is twice it (within the sketch's buckets).
        assert!((ratio - 2.0).abs() < 0.15, "{ratio}");
        // One call of a second among 499 of a millisecond: the mean triples, an outlier (the
        // weakness the recommended p90 and median do not have).
        fleet[0].record(&ms(1000), 0);
        let one_slow = [
            (499, 1, 0, 0),
            (500, 1, 0, 0),
            (500, 1, 0, 0),
            (500, 1, 0, 0),
        ];
        assert_eq!(
            verdicts(&policy, &fleet, &one_slow),
            [true, false, false, false]
        );
    }
}
