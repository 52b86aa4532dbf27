//! The detectors as one policy of the layer: its endpoint states, its interval evaluation and
//! its counters.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::{
    duration_to_nanos, EjectionBudget, FleetMember, FleetPolicy, Nanos, OutlierPolicy,
    RecoverySchedule, WhenAllOut,
};

use crate::config::{DetectorConfig, DetectorSemantics};
use crate::detector::{Detector, DetectorStats, Runtime, Shared};
use crate::endpoint::DetectorEndpoint;
use crate::statistics::{failure_percentage_outliers, success_rate_outliers, Tally, Verdict};

/// The detectors of Envoy, gRPC and linkerd as one policy of the layer: consecutive failures
/// (event-driven, at exactly the Nth), success rate and failure percentage (on the interval), one
/// ejection counter per endpoint that all of them grow, and the followed system's rules for how long an
/// ejection lasts and how many may be out at once (the layer's budget; never the last endpoint).
///
/// ```
/// use tower_outlier_core::OutlierPolicy;
/// use tower_outlier_detectors::{DetectorConfig, DetectorPolicy};
///
/// let envoy = DetectorPolicy::new(DetectorConfig::envoy().build()?);
/// assert_eq!(envoy.name(), "envoy");
/// // Under Envoy's current rule, 10 % of five endpoints is no ejection at all.
/// assert_eq!(envoy.budget().unwrap().max_ejected(5), 0);
/// let linkerd = DetectorPolicy::seeded(DetectorConfig::linkerd().build()?, 7);
/// assert_eq!(linkerd.name(), "linkerd");
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct DetectorPolicy {
    shared: Arc<Shared>,
}

impl DetectorPolicy {
    /// The policy for `config`, its enforcement dice seeded at random.
    pub fn new(config: DetectorConfig) -> Self {
        // std's hasher keys are random per process: a seed without a dependency on `rand`.
        let seed = RandomState::new().build_hasher().finish();
        Self::seeded(config, seed)
    }

    /// The policy for `config`, its enforcement percentages and jitter drawn from `seed`: two
    /// policies with the same seed fed the same calls decide the same way.
    pub fn seeded(config: DetectorConfig, seed: u64) -> Self {
        Self::with_runtime(config, Runtime::new(seed))
    }

    /// The same policy under `config`: its dice and its [`stats`](Self::stats) go on (what a
    /// reconfiguration of a running layer uses).
    pub fn with_config(&self, config: DetectorConfig) -> Self {
        Self::with_runtime(config, self.shared.runtime().clone())
    }

    fn with_runtime(config: DetectorConfig, runtime: Arc<Runtime>) -> Self {
        DetectorPolicy {
            shared: Arc::new(Shared::new(config, runtime)),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DetectorConfig {
        &self.shared.config
    }

    /// What the detectors found so far, over every endpoint of every layer using this policy
    /// (and the policies made from it by [`with_config`](Self::with_config)).
    pub fn stats(&self) -> DetectorStats {
        self.shared.stats()
    }

    /// The state of one endpoint, on its own (the layer calls [`OutlierPolicy::new_endpoint`]).
    pub fn endpoint(&self) -> DetectorEndpoint {
        DetectorEndpoint::new(self.shared.clone())
    }
}

impl fmt::Debug for DetectorPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DetectorPolicy")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl OutlierPolicy for DetectorPolicy {
    type Endpoint = DetectorEndpoint;

    fn name(&self) -> &'static str {
        self.shared.name
    }

    fn new_endpoint(&self) -> DetectorEndpoint {
        self.endpoint()
    }

    /// Keeps each endpoint's streaks, interval counts and ejection multiplier under the new
    /// thresholds.
    fn new_endpoint_from(&self, previous: &DetectorEndpoint, _now: Nanos) -> DetectorEndpoint {
        let next = self.endpoint();
        next.take_over(previous);
        next
    }

    fn recovery(&self) -> RecoverySchedule {
        // Ejections are timed by the endpoint states (`check_at`); this paces only failed
        // active probes, one base ejection time apart.
        RecoverySchedule::fixed(self.shared.config.base_ejection_time)
    }

    fn trial_period(&self) -> Duration {
        self.shared.config.running_interval()
    }

    fn budget(&self) -> Option<EjectionBudget> {
        Some(self.shared.config.budget())
    }

    fn when_all_out(&self) -> Option<WhenAllOut> {
        Some(self.shared.config.when_all_out())
    }

    fn fleet(&self) -> Option<&dyn FleetPolicy<State = DetectorEndpoint>> {
        // linkerd has no interval: nothing to count, decay or align to.
        (self.shared.config.semantics != DetectorSemantics::Linkerd)
            .then_some(self as &dyn FleetPolicy<State = DetectorEndpoint>)
    }
}

impl FleetPolicy for DetectorPolicy {
    type State = DetectorEndpoint;

    fn interval(&self) -> Duration {
        self.shared.config.running_interval()
    }

    fn started(&self, at: Nanos) {
        self.shared.started(at);
    }

    /// One interval tick: the statistical detectors judge the interval that just ended, and the
    /// ejection multipliers of endpoints in rotation decay.
    fn evaluate(&self, fleet: &[FleetMember<'_, DetectorEndpoint>], now: Nanos) {
        let config = &self.shared.config;
        let mut external: Vec<Option<Tally>> = Vec::with_capacity(fleet.len());
        let mut local: Vec<Option<Tally>> = Vec::with_capacity(fleet.len());
        let volume = config.request_volume();
        for member in fleet {
            let previous = member.state.last_tick.swap(now, Ordering::Relaxed);
            member.state.clear_stale(now);
            let (mut outside, mut inside) = member.state.take_tallies();
            // In rotation for the whole interval: known at the tick before, and not back from
            // an ejection since. One that joined or came back meanwhile would not have carried
            // the volume under its system either.
            let back_at = member.state.ejected_until.load(Ordering::Relaxed);
            let whole_interval =
                previous != Nanos::MAX && (back_at == Nanos::MAX || back_at <= previous);
            if member.available && whole_interval && member.record.last_call_failed() {
                // Starved on its failures: the balancer routes around an endpoint whose calls
                // fail, so it never reaches the volume its system would have sent it (gRPC's
                // round robin, Envoy's balancers give it its share until it is ejected). Every
                // call it had failed, and it still fails: judged as if it had carried the
                // volume at that rate, as its system would have judged it.
                outside = outside.carried(volume);
                inside = inside.carried(volume);
            }
            // Ejected endpoints do not take part (and have no traffic to count anyway).
            external.push(member.available.then_some(outside));
            local.push(member.available.then_some(inside));
        }
        let mut condemned = vec![false; fleet.len()];
        let mut judge = |detector: Detector, verdicts: Vec<Verdict>| {
            for verdict in verdicts {
                if condemned[verdict.index] {
                    continue;
                }
                if self.shared.detected(detector) {
                    condemned[verdict.index] = true;
                    fleet[verdict.index].state.condemn_statistically(
                        detector,
                        verdict.value,
                        verdict.threshold,
                        now,
                    );
                }
            }
        };
        if let Some(detector) = &config.success_rate {
            judge(
                Detector::SuccessRate,
                success_rate_outliers(detector, &external),
            );
            if config.split_external_local_origin_errors {
                judge(
                    Detector::LocalOriginSuccessRate,
                    success_rate_outliers(detector, &local),
                );
            }
        }
        if let Some(detector) = &config.failure_percentage {
            judge(
                Detector::FailurePercentage,
                failure_percentage_outliers(detector, config.semantics, &external),
            );
            if config.split_external_local_origin_errors {
                judge(
                    Detector::LocalOriginFailurePercentage,
                    failure_percentage_outliers(detector, config.semantics, &local),
                );
            }
        }
        let interval = duration_to_nanos(config.running_interval());
        for member in fleet.iter().filter(|m| m.available) {
            let state = member.state;
            let decays = match config.semantics {
                // From one full interval after it came back.
                DetectorSemantics::Envoy => {
                    let until = state.ejected_until.load(Ordering::Relaxed);
                    until != Nanos::MAX && now >= until.saturating_add(interval)
                }
                _ => true,
            };
            state.tick(decays, now);
        }
        for member in fleet {
            if member.state.is_condemned(now) {
                member.record.request_evaluation();
            }
        }
    }
}
