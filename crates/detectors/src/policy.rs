//! The detectors as one policy of the layer: its endpoint states, its interval evaluation and
//! its counters.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::{
    duration_to_nanos, EjectionBudget, FleetMember, FleetPolicy, Nanos, OutlierPolicy,
    RecoverySchedule, WhenAllOut,
};

use crate::config::{DetectorConfig, DetectorSemantics};
use crate::endpoint::DetectorEndpoint;
use crate::enforcement::Dice;
use crate::statistics::{failure_percentage_outliers, success_rate_outliers, Tally, Verdict};

/// One of the detectors, for counters and reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Detector {
    /// Consecutive 5xx (any failure, for services that are not HTTP).
    Consecutive5xx,
    /// Consecutive gateway failures (502, 503, 504).
    ConsecutiveGatewayFailure,
    /// Consecutive local-origin failures (with the origins split).
    ConsecutiveLocalOriginFailure,
    /// Success rate.
    SuccessRate,
    /// Failure percentage.
    FailurePercentage,
    /// Local-origin success rate (with the origins split).
    LocalOriginSuccessRate,
    /// Local-origin failure percentage (with the origins split).
    LocalOriginFailurePercentage,
}

impl Detector {
    /// Every detector, in the order of their counters.
    pub const ALL: [Detector; 7] = [
        Detector::Consecutive5xx,
        Detector::ConsecutiveGatewayFailure,
        Detector::ConsecutiveLocalOriginFailure,
        Detector::SuccessRate,
        Detector::FailurePercentage,
        Detector::LocalOriginSuccessRate,
        Detector::LocalOriginFailurePercentage,
    ];

    pub(crate) const CONSECUTIVE: [Detector; 3] = [
        Detector::Consecutive5xx,
        Detector::ConsecutiveGatewayFailure,
        Detector::ConsecutiveLocalOriginFailure,
    ];

    fn index(self) -> usize {
        self as usize
    }

    pub(crate) fn bit(self) -> u8 {
        1 << self.index()
    }

    pub(crate) fn from_bit(bits: u8) -> Detector {
        Detector::ALL[(bits.trailing_zeros() as usize).min(Detector::ALL.len() - 1)]
    }

    /// What the detector measures, in words (the `measure` of its ejections' reasons).
    pub fn measure(self) -> &'static str {
        match self {
            Detector::Consecutive5xx => "consecutive 5xx",
            Detector::ConsecutiveGatewayFailure => "consecutive gateway failures",
            Detector::ConsecutiveLocalOriginFailure => "consecutive local-origin failures",
            Detector::SuccessRate => "success rate",
            Detector::FailurePercentage => "failure percentage",
            Detector::LocalOriginSuccessRate => "local-origin success rate",
            Detector::LocalOriginFailurePercentage => "local-origin failure percentage",
        }
    }
}

/// What each detector found and what became of it, as Envoy counts it: `detected` (Envoy's
/// `ejections_detected_*`), `enforced` (ejections made, `ejections_enforced_*`), `unenforced`
/// (detections its enforcement percentage let go) and `overflow` (ejections the layer refused:
/// the budget or the last endpoint; `ejections_overflow`, here per detector). A refused ejection
/// may still be made later, within one interval, when room appears.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetectorStats {
    detected: [u64; 7],
    enforced: [u64; 7],
    unenforced: [u64; 7],
    overflow: [u64; 7],
}

impl DetectorStats {
    /// Outliers `detector` found.
    pub fn detected(&self, detector: Detector) -> u64 {
        self.detected[detector.index()]
    }

    /// Ejections `detector`'s findings made.
    pub fn enforced(&self, detector: Detector) -> u64 {
        self.enforced[detector.index()]
    }

    /// Findings its enforcement percentage let go.
    pub fn unenforced(&self, detector: Detector) -> u64 {
        self.unenforced[detector.index()]
    }

    /// Ejections the layer refused (the budget, or the last endpoint).
    pub fn overflow(&self, detector: Detector) -> u64 {
        self.overflow[detector.index()]
    }
}

pub(crate) struct Shared {
    pub(crate) config: DetectorConfig,
    pub(crate) name: &'static str,
    // Kept across reconfigurations: the dice go on, the counters keep counting.
    runtime: Arc<Runtime>,
}

struct Runtime {
    dice: Dice,
    detected: [AtomicU64; 7],
    enforced: [AtomicU64; 7],
    unenforced: [AtomicU64; 7],
    overflow: [AtomicU64; 7],
    // When the layer's interval timer started (`FleetPolicy::started`), `Nanos::MAX` before: the
    // tick series an ejection made before the first tick ends on. A policy shared by layers
    // started at different times aligns to the last one started.
    ticks_from: AtomicU64,
}

impl Shared {
    fn enforcement(&self, detector: Detector) -> u32 {
        let config = &self.config;
        match detector {
            Detector::Consecutive5xx => config.consecutive_5xx.enforcement,
            Detector::ConsecutiveGatewayFailure => config.consecutive_gateway_failure.enforcement,
            Detector::ConsecutiveLocalOriginFailure => {
                config.consecutive_local_origin_failure.enforcement
            }
            // linkerd's success-rate trigger has no enforcement percentage: it always trips.
            Detector::SuccessRate => config.success_rate.map_or_else(
                || u32::from(config.recent_success_rate.is_some()) * 100,
                |d| d.enforcement,
            ),
            Detector::LocalOriginSuccessRate => config
                .success_rate
                .map_or(0, |d| d.local_origin_enforcement),
            Detector::FailurePercentage => config.failure_percentage.map_or(0, |d| d.enforcement),
            Detector::LocalOriginFailurePercentage => config
                .failure_percentage
                .map_or(0, |d| d.local_origin_enforcement),
        }
    }

    /// Counts a detection and rolls its enforcement: whether to ask for the ejection.
    pub(crate) fn detected(&self, detector: Detector) -> bool {
        let runtime = &self.runtime;
        runtime.detected[detector.index()].fetch_add(1, Ordering::Relaxed);
        let enforce = runtime.dice.enforce(self.enforcement(detector));
        if !enforce {
            runtime.unenforced[detector.index()].fetch_add(1, Ordering::Relaxed);
        }
        enforce
    }

    pub(crate) fn ejected(&self, detector: Detector) {
        self.runtime.enforced[detector.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn overflowed(&self, detector: Detector) {
        self.runtime.overflow[detector.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// When the layer's interval timer started, if it has.
    pub(crate) fn ticks_from(&self) -> Option<Nanos> {
        match self.runtime.ticks_from.load(Ordering::Relaxed) {
            Nanos::MAX => None,
            at => Some(at),
        }
    }

    pub(crate) fn dice(&self) -> &Dice {
        &self.runtime.dice
    }
}

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
        let runtime = Arc::new(Runtime {
            dice: Dice::new(seed),
            detected: Default::default(),
            enforced: Default::default(),
            unenforced: Default::default(),
            overflow: Default::default(),
            ticks_from: AtomicU64::new(Nanos::MAX),
        });
        Self::with_runtime(config, runtime)
    }

    /// The same policy under `config`: its dice and its [`stats`](Self::stats) go on (what a
    /// reconfiguration of a running layer uses).
    pub fn with_config(&self, config: DetectorConfig) -> Self {
        Self::with_runtime(config, self.shared.runtime.clone())
    }

    fn with_runtime(config: DetectorConfig, runtime: Arc<Runtime>) -> Self {
        let name = config.semantics.policy_name();
        DetectorPolicy {
            shared: Arc::new(Shared {
                config,
                name,
                runtime,
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DetectorConfig {
        &self.shared.config
    }

    /// What the detectors found so far, over every endpoint of every layer using this policy
    /// (and the policies made from it by [`with_config`](Self::with_config)).
    pub fn stats(&self) -> DetectorStats {
        let load =
            |counters: &[AtomicU64; 7]| counters.each_ref().map(|c| c.load(Ordering::Relaxed));
        let runtime = &self.shared.runtime;
        DetectorStats {
            detected: load(&runtime.detected),
            enforced: load(&runtime.enforced),
            unenforced: load(&runtime.unenforced),
            overflow: load(&runtime.overflow),
        }
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
        self.shared.runtime.ticks_from.store(at, Ordering::Relaxed);
    }

    /// One interval tick: the statistical detectors judge the interval that just ended, and the
    /// ejection multipliers of endpoints in rotation decay.
    fn evaluate(&self, fleet: &[FleetMember<'_, DetectorEndpoint>], now: Nanos) {
        let config = &self.shared.config;
        let mut external: Vec<Option<Tally>> = Vec::with_capacity(fleet.len());
        let mut local: Vec<Option<Tally>> = Vec::with_capacity(fleet.len());
        for member in fleet {
            member.state.last_tick.store(now, Ordering::Relaxed);
            member.state.clear_stale(now);
            let (outside, inside) = member.state.take_tallies();
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
