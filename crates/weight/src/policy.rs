//! The weight policy: SOFARPC's fault-tolerance regulation, evaluated once per window.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::{
    Description, EndpointPolicy, FleetMember, FleetPolicy, Judgement, Nanos, Observation,
    OutlierPolicy, RecoverySchedule, Signal, Weighting, WindowCounts,
};

use crate::config::{ExceptionKinds, WeightConfig};

/// Weight degradation with SOFARPC's semantics, as a policy of
/// `tower_outlier::OutlierDetectionLayer`.
///
/// Once per window, over the calls of that window:
/// * an endpoint is *counted* when its calls reach its scaled least count (see below): a degraded
///   endpoint needs fewer calls;
/// * the service average is the exceptions over the calls of all counted endpoints (the judged one
///   included); with none counted nothing is judged, and with an average of 0 (after rounding,
///   below) every counted endpoint is healthy;
/// * a counted endpoint is *abnormal* when its exception rate divided by the average is at least
///   the multiple. With the degrade switch on its weight becomes `current × degrade rate`, never
///   below the least weight, compounding each abnormal window, while at most
///   `max_degraded` endpoints are degraded (a degraded one may degrade further); with the switch
///   off it is only reported;
/// * a counted, healthy, degraded endpoint recovers: `current × recover rate`, and back to exactly
///   the original weight (leaving the degraded set) once it gets there.
///
/// The weight reaches the balancer through the endpoint's `Load`, divided by
/// `current / original`. This policy never ejects.
///
/// # Arithmetic
///
/// As in SOFARPC (`ServiceHorizontalMeasureStrategy` with its `CalculateUtils`), every quotient is
/// a decimal rounded half-up to two places (Java's `BigDecimal` division at scale 2,
/// `ROUND_HALF_UP`), computed here exactly on the integer counts rather than in binary floating
/// point:
/// * an endpoint's exception rate is `exceptions / calls`, rounded: 1 of 8 (0.125) is 0.13,
///   23 of 200 (0.115) is 0.12, 29 of 200 (0.145) is 0.15;
/// * the service average is `exceptions / calls` over the counted endpoints, rounded the same
///   way, so an average under 0.005 is 0 and judges every counted endpoint healthy;
/// * the rounded rate divided by the rounded average is itself rounded half-up to two places and
///   compared with the multiple, abnormal when at least the multiple: 3 exceptions in 10 calls
///   (0.30) against an average of 3 in 60 (0.05) is exactly 6, so abnormal under a multiple of 6
///   (the binary quotient, 5.999…, would not be);
/// * the scaled least count is the least count times `current / original` (that ratio rounded
///   half-up to two places), truncated to an integer and never below 1: least count 10 at weight
///   55 of 100 is 5, not 6. SOFARPC's `BigDecimal` product is first rounded to as many significant
///   digits as the least count has plus one, which lifts a product whose fraction is 0.95 or more
///   to the next integer (least count 5 at ratio 0.99: SOFARPC 5, here 4); this policy truncates
///   the exact product.
///
/// # What p2c can do with weights
///
/// tower's p2c samples two endpoints uniformly and sends the request to the one with the lower
/// load. Dividing the load by the relative weight makes a down-weighted endpoint lose its
/// comparisons, so its share falls — to nothing while its weighted load stays above every other
/// endpoint's. Up-weighting is capped: an endpoint can at most win every pair it is drawn into,
/// which is `2/n` of the draws for `n` endpoints (half the traffic with 4), however large its
/// weight. So weights here can push traffic away from an endpoint, not pull a set share towards
/// it. The measured shares are in the repository's BENCHMARKS.md and `tests/rules/weight.rs`.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::OutlierPolicy;
/// use tower_outlier_weight::{WeightConfig, WeightPolicy};
///
/// let policy = WeightPolicy::new(WeightConfig::sofarpc().interval(Duration::from_secs(20)).build()?);
/// let fleet = policy.fleet().expect("SOFARPC's switches are on");
/// assert_eq!(fleet.interval(), Duration::from_secs(20));
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct WeightPolicy {
    config: Arc<WeightConfig>,
}

impl WeightPolicy {
    /// The policy's name ([`OutlierPolicy::name`]): in logs, snapshots, metrics, events and
    /// [`Reason::policy`](tower_outlier_core::Reason::policy).
    pub const NAME: &'static str = "weight";

    /// The policy for a validated configuration.
    pub fn new(config: WeightConfig) -> Self {
        WeightPolicy {
            config: Arc::new(config),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &WeightConfig {
        &self.config
    }

    /// A fresh per-endpoint state (the layer calls [`OutlierPolicy::new_endpoint`]).
    pub fn endpoint(&self) -> WeightEndpoint {
        WeightEndpoint {
            enabled: self.config.regulation_effective,
            exceptions_kinds: self.config.exceptions,
            calls: AtomicU64::new(0),
            exceptions: AtomicU64::new(0),
            weight: AtomicU64::new(self.config.original_weight.to_bits()),
            degraded: AtomicBool::new(false),
        }
    }
}

/// One endpoint's calls and exceptions since the last evaluation, and its current weight.
#[derive(Debug)]
pub struct WeightEndpoint {
    enabled: bool,
    exceptions_kinds: ExceptionKinds,
    calls: AtomicU64,
    exceptions: AtomicU64,
    // f64 bits of the absolute weight.
    weight: AtomicU64,
    degraded: AtomicBool,
}

impl WeightEndpoint {
    /// The current absolute weight.
    pub fn weight(&self) -> f64 {
        f64::from_bits(self.weight.load(Ordering::Relaxed))
    }

    /// Whether the endpoint is in the degraded set.
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// Takes the window's counts, starting the next window at zero.
    fn take_window(&self) -> (u64, u64) {
        let calls = self.calls.swap(0, Ordering::AcqRel);
        let exceptions = self.exceptions.swap(0, Ordering::AcqRel);
        // Counters are taken one after the other; a call recorded in between must not make the
        // exceptions exceed the calls.
        (calls, exceptions.min(calls))
    }
}

impl EndpointPolicy for WeightEndpoint {
    #[inline]
    fn record(&self, observation: &Observation, _: Nanos) -> Signal {
        if self.enabled {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.exceptions_kinds.counts(observation.outcome) {
                self.exceptions.fetch_add(1, Ordering::Relaxed);
            }
        }
        Signal::None
    }

    fn judge(&self, _: Nanos) -> Judgement {
        Judgement::Healthy
    }

    fn describe(&self, _: Nanos) -> Description {
        let calls = self.calls.load(Ordering::Relaxed);
        Description {
            counts: WindowCounts {
                calls,
                failures: self.exceptions.load(Ordering::Relaxed).min(calls),
                slow: 0,
            },
            state: None,
            weight: Some(Weighting {
                weight: self.weight(),
                degraded: self.is_degraded(),
            }),
            judged: None,
        }
    }

    fn reset(&self) {
        // Weights outlive ejections by other policies, as SOFARPC keeps them per address.
    }
}

impl OutlierPolicy for WeightPolicy {
    type Endpoint = WeightEndpoint;

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn new_endpoint(&self) -> WeightEndpoint {
        self.endpoint()
    }

    /// Keeps the endpoint's counts since the last evaluation, its weight and whether it is
    /// degraded: the next evaluation judges them under the new rules.
    fn new_endpoint_from(&self, previous: &WeightEndpoint, _now: Nanos) -> WeightEndpoint {
        let next = self.endpoint();
        for (to, from) in [
            (&next.calls, &previous.calls),
            (&next.exceptions, &previous.exceptions),
            (&next.weight, &previous.weight),
        ] {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        next.degraded
            .store(previous.degraded.load(Ordering::Relaxed), Ordering::Relaxed);
        next
    }

    fn recovery(&self) -> RecoverySchedule {
        // Never used: this policy never ejects.
        RecoverySchedule::fixed(self.config.interval)
    }

    fn trial_period(&self) -> Duration {
        self.config.interval
    }

    fn fleet(&self) -> Option<&dyn FleetPolicy<State = WeightEndpoint>> {
        self.config
            .regulation_effective
            .then_some(self as &dyn FleetPolicy<State = WeightEndpoint>)
    }
}

impl FleetPolicy for WeightPolicy {
    type State = WeightEndpoint;

    fn interval(&self) -> Duration {
        self.config.interval
    }

    fn evaluate(&self, fleet: &[FleetMember<'_, WeightEndpoint>], _: Nanos) {
        let config = &*self.config;
        if !config.regulation_effective {
            return;
        }
        let states: Vec<(&FleetMember<'_, WeightEndpoint>, &WeightEndpoint)> =
            fleet.iter().map(|member| (member, member.state)).collect();
        let windows: Vec<(u64, u64)> = states.iter().map(|(_, s)| s.take_window()).collect();
        let counted: Vec<bool> = states
            .iter()
            .zip(&windows)
            .map(|((_, state), &(calls, _))| calls >= self.scaled_least_count(state.weight()))
            .collect();
        let (sum_calls, sum_exceptions) = windows
            .iter()
            .zip(&counted)
            .filter(|(_, &counted)| counted)
            .fold((0u128, 0u128), |(c, e), (&(calls, exceptions), _)| {
                (c + u128::from(calls), e + u128::from(exceptions))
            });
        if sum_calls == 0 {
            return;
        }
        let average = hundredths(sum_exceptions, sum_calls);
        let mut degraded = states.iter().filter(|(_, s)| s.is_degraded()).count();
        for (((member, state), &(calls, exceptions)), &counted) in
            states.iter().zip(&windows).zip(&counted)
        {
            let verdict = if !counted {
                Verdict::NotCounted
            } else if average == 0 {
                Verdict::Healthy
            } else {
                let rate = hundredths(u128::from(exceptions), u128::from(calls));
                if reaches_multiple(rate, average, config.exception_rate_multiple) {
                    Verdict::Abnormal { rate }
                } else {
                    Verdict::Healthy
                }
            };
            match verdict {
                Verdict::NotCounted => {}
                Verdict::Abnormal { rate } => {
                    let (rate, average) = (as_decimal(rate), as_decimal(average));
                    self.degrade(member, state, rate, average, &mut degraded);
                }
                Verdict::Healthy if state.is_degraded() => {
                    self.recover(member, state, &mut degraded);
                }
                Verdict::Healthy => {}
            }
        }
    }
}

mod evaluation;
use evaluation::*;

#[cfg(test)]
mod tests;
