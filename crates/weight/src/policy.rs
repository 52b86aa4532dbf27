//! The weight policy: SOFARPC's fault-tolerance regulation, evaluated once per window.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::{
    EndpointPolicy, FleetMember, Judgement, Nanos, Observation, Policy, RecoverySchedule, Signal,
    WindowCounts,
};

use crate::config::{ExceptionKinds, WeightConfig};

/// Weight degradation with SOFARPC's semantics, as a policy of
/// `tower_outlier::OutlierDetectionLayer`.
///
/// Once per window, over the calls of that window:
/// * an endpoint is *counted* when its calls reach the least count scaled by its current weight
///   over its original weight (rounded, never below 1): a degraded endpoint needs fewer calls;
/// * the service average is the exceptions over the calls of all counted endpoints (the judged one
///   included); with none counted nothing is judged, and with an average of 0 every counted
///   endpoint is healthy;
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
/// # What p2c can do with weights
///
/// tower's p2c samples two endpoints uniformly and sends the request to the one with the lower
/// load. Dividing the load by the relative weight makes a down-weighted endpoint lose its
/// comparisons, so its share falls — to nothing while its weighted load stays above every other
/// endpoint's. Up-weighting is capped: an endpoint can at most win every pair it is drawn into,
/// which is `2/n` of the draws for `n` endpoints (half the traffic with 4), however large its
/// weight. So weights here can push traffic away from an endpoint, not pull a set share towards
/// it. The measured shares are in the repository's BENCHMARKS.md and `tests/weight.rs`.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::Policy;
/// use tower_outlier_weight::{WeightConfig, WeightPolicy};
///
/// let policy = WeightPolicy::new(WeightConfig::sofarpc().time_window(Duration::from_secs(20)).build()?);
/// assert_eq!(policy.fleet_interval(), Some(Duration::from_secs(20)));
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct WeightPolicy {
    config: Arc<WeightConfig>,
}

impl WeightPolicy {
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

    /// A fresh per-endpoint state (the layer calls [`Policy::new_endpoint`]).
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

    fn counts(&self, _: Nanos) -> WindowCounts {
        let calls = self.calls.load(Ordering::Relaxed);
        WindowCounts {
            calls,
            failures: self.exceptions.load(Ordering::Relaxed).min(calls),
            slow: 0,
        }
    }

    fn reset(&self) {
        // Weights outlive ejections by other policies, as SOFARPC keeps them per address.
    }
}

/// What one evaluation decided for one endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Verdict {
    NotCounted,
    Healthy,
    Abnormal { rate: f64 },
}

impl Policy for WeightPolicy {
    fn name(&self) -> &'static str {
        "weight"
    }

    fn new_endpoint(&self) -> Box<dyn EndpointPolicy> {
        Box::new(self.endpoint())
    }

    fn recovery(&self) -> RecoverySchedule {
        // Never used: this policy never ejects.
        RecoverySchedule::fixed(self.config.time_window)
    }

    fn trial_period(&self) -> Duration {
        self.config.time_window
    }

    fn fleet_interval(&self) -> Option<Duration> {
        self.config
            .regulation_effective
            .then_some(self.config.time_window)
    }

    fn evaluate_fleet(&self, fleet: &[FleetMember<'_>], _: Nanos) {
        let config = &*self.config;
        if !config.regulation_effective {
            return;
        }
        let states: Vec<(&FleetMember<'_>, &WeightEndpoint)> = fleet
            .iter()
            .filter_map(|member| {
                let state = member.state.as_any().downcast_ref::<WeightEndpoint>()?;
                Some((member, state))
            })
            .collect();
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
            .fold((0u64, 0u64), |(c, e), (&(calls, exceptions), _)| {
                (c + calls, e + exceptions)
            });
        if sum_calls == 0 {
            return;
        }
        let average = sum_exceptions as f64 / sum_calls as f64;
        let mut degraded = states.iter().filter(|(_, s)| s.is_degraded()).count();
        for (((member, state), &(calls, exceptions)), &counted) in
            states.iter().zip(&windows).zip(&counted)
        {
            let verdict = if !counted {
                Verdict::NotCounted
            } else if average == 0.0 {
                Verdict::Healthy
            } else {
                let rate = exceptions as f64 / calls as f64;
                if rate / average >= config.exception_rate_multiple {
                    Verdict::Abnormal { rate }
                } else {
                    Verdict::Healthy
                }
            };
            match verdict {
                Verdict::NotCounted => {}
                Verdict::Abnormal { rate } => {
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

impl WeightPolicy {
    /// The least calls an endpoint at `weight` needs to be counted.
    fn scaled_least_count(&self, weight: f64) -> u64 {
        let scaled = self.config.least_window_count as f64 * weight / self.config.original_weight;
        (scaled.round() as u64).max(1)
    }

    fn degrade(
        &self,
        member: &FleetMember<'_>,
        state: &WeightEndpoint,
        rate: f64,
        average: f64,
        degraded: &mut usize,
    ) {
        let config = &*self.config;
        let current = state.weight();
        let next = (current * config.degrade_rate).max(config.least_weight);
        if !config.degrade_effective {
            tracing::warn!(
                target: "tower_outlier::weight",
                endpoint = ?member.key,
                exception_rate = rate,
                average,
                weight = current,
                would_be = next,
                "abnormal endpoint (degrade switch off: weight unchanged)"
            );
            return;
        }
        if !state.is_degraded() {
            if *degraded >= config.max_degraded {
                tracing::info!(
                    target: "tower_outlier::weight",
                    endpoint = ?member.key,
                    exception_rate = rate,
                    average,
                    degraded = *degraded,
                    "abnormal endpoint not degraded: the degraded set is full"
                );
                return;
            }
            state.degraded.store(true, Ordering::Relaxed);
            *degraded += 1;
        }
        self.set_weight(member, state, next);
        tracing::warn!(
            target: "tower_outlier::weight",
            endpoint = ?member.key,
            exception_rate = rate,
            average,
            from = current,
            to = next,
            "endpoint weight degraded"
        );
    }

    fn recover(&self, member: &FleetMember<'_>, state: &WeightEndpoint, degraded: &mut usize) {
        let config = &*self.config;
        let current = state.weight();
        let mut next = current * config.recover_rate;
        if next >= config.original_weight {
            next = config.original_weight;
            state.degraded.store(false, Ordering::Relaxed);
            *degraded = degraded.saturating_sub(1);
        }
        self.set_weight(member, state, next);
        tracing::info!(
            target: "tower_outlier::weight",
            endpoint = ?member.key,
            from = current,
            to = next,
            recovered = !state.is_degraded(),
            "endpoint weight recovering"
        );
    }

    fn set_weight(&self, member: &FleetMember<'_>, state: &WeightEndpoint, weight: f64) {
        state.weight.store(weight.to_bits(), Ordering::Relaxed);
        member
            .record
            .set_weight(weight / self.config.original_weight);
    }
}
