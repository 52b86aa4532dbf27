//! Configuration of the detectors: the builder, the three presets and their validation.

use std::time::Duration;

use crate::detector::Detector;
use tower_outlier_core::{BudgetFloor, EjectionBudget, WhenAllOut};

/// Whose rules decide the details on which Envoy, gRPC and linkerd differ.
///
/// | | Envoy | gRPC | linkerd |
/// |---|---|---|---|
/// | ejection budget | `(ejected + 1) / n ≤ max %`, or one with `always_eject_one_host` | `ejected / n < max %` before each ejection | none (but never the last endpoint) |
/// | failure percentage ejects | at or above the threshold | strictly above it | — |
/// | ejection time | base × multiplier, capped at `max_ejection_time`, plus jitter | base × multiplier, capped at `max(base, max_ejection_time)` | exponential back-off from `base` to `max`, with jitter |
/// | the multiplier grows | on each ejection, while `base × m < max + base` | on each ejection | — (each trip restarts at `base`) |
/// | the multiplier decays | by one per interval from one full interval after re-admission | by one on every interval the endpoint is not ejected | — |
/// | re-admission | on the first interval tick at or after the ejection time | the same (grpc-go re-arms its timer after each run, so a tick always falls just after the time) | after the back-off, for one real request (the probe) |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DetectorSemantics {
    /// Envoy's `outlier_detection` (`source/common/upstream/outlier_detection_impl.cc`).
    Envoy,
    /// gRPC's `outlier_detection_experimental` (proposal A50, grpc-go).
    Grpc,
    /// linkerd2-proxy's consecutive-failures accrual.
    Linkerd,
}

impl DetectorSemantics {
    /// The name of a detector policy with these semantics (`"envoy"`, `"grpc"`, `"linkerd"`):
    /// in logs, snapshots, metrics and events.
    ///
    /// ```
    /// use tower_outlier_detectors::{DetectorConfig, DetectorPolicy, DetectorSemantics};
    /// use tower_outlier_core::OutlierPolicy;
    ///
    /// let policy = DetectorPolicy::new(DetectorConfig::envoy().build()?);
    /// assert_eq!(policy.name(), DetectorSemantics::Envoy.policy_name());
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub const fn policy_name(self) -> &'static str {
        match self {
            DetectorSemantics::Envoy => "envoy",
            DetectorSemantics::Grpc => "grpc",
            DetectorSemantics::Linkerd => "linkerd",
        }
    }
}

/// How the success-rate detector sets its threshold from the fleet's success rates (in percent).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum SuccessRateRule {
    /// Envoy's and gRPC's: `mean − stdev_factor / 1000 × population stdev`.
    ///
    /// When a large part of the fleet fails, the standard deviation grows with it: with two of
    /// five endpoints fully down the threshold falls below zero and nothing is ejected.
    Stdev,
    /// `median − stdev_factor / 1000 × max(1.4826 × MAD, min_spread)`, MAD being the median
    /// absolute deviation from the median.
    ///
    /// The median and the MAD ignore a minority of failing endpoints, so two of five fully down
    /// are both ejected. In a tight healthy fleet the MAD is near zero; `min_spread` (percentage
    /// points) keeps such a fleet from ejecting an endpoint at 99.9 % for being 0.1 point below
    /// the others.
    Robust {
        /// The smallest spread used, in percentage points (default 1.0).
        min_spread: f64,
    },
}

impl SuccessRateRule {
    /// The robust rule with a floor of one percentage point.
    pub const fn robust() -> Self {
        SuccessRateRule::Robust { min_spread: 1.0 }
    }
}

/// One consecutive-failures detector: ejects at exactly the `threshold`-th failure in a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Consecutive {
    /// Failures in a row that trigger the detector; 0 turns it off.
    pub threshold: u32,
    /// The chance, in percent, that a detection ejects (0 counts detections but never ejects).
    pub enforcement: u32,
}

/// The success-rate detector (run on every interval).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SuccessRate {
    /// How the threshold is set.
    pub rule: SuccessRateRule,
    /// The factor, in thousandths, of the spread below the centre that an endpoint must fall.
    pub stdev_factor: u32,
    /// The chance, in percent, that a detection ejects.
    pub enforcement: u32,
    /// The same for local-origin success rate (with the origins split).
    pub local_origin_enforcement: u32,
    /// Endpoints with enough calls that must exist for the detector to run.
    pub minimum_hosts: u32,
    /// Calls in the interval an endpoint needs to take part.
    pub request_volume: u32,
}

/// The failure-percentage detector (run on every interval).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailurePercentage {
    /// The failure percentage (0 to 100) at or above which (Envoy), or above which (gRPC), an
    /// endpoint is an outlier.
    pub threshold: u32,
    /// The chance, in percent, that a detection ejects.
    pub enforcement: u32,
    /// The same for local-origin failures (with the origins split).
    pub local_origin_enforcement: u32,
    /// Endpoints with enough calls that must exist for the detector to run.
    pub minimum_hosts: u32,
    /// Calls in the interval an endpoint needs to take part.
    pub request_volume: u32,
}

/// The shortest interval the detector runs at (gRPC's zero interval runs at this).
const MIN_RUNNING_INTERVAL: Duration = Duration::from_millis(1);

/// A validated detector configuration. Start from [`DetectorConfig::recommended`] (what this
/// library recommends: linkerd's semantics with a shorter streak and back-off, at most half the
/// fleet out), from a system's preset, [`DetectorConfig::envoy`], [`DetectorConfig::grpc`],
/// [`DetectorConfig::linkerd`] or [`DetectorConfig::linkerd_consecutive`], or read one (Envoy's
/// or gRPC's JSON, behind the `envoy` and `grpc` features).
///
/// Which documents a running layer accepts follows the policy's name: a layer built from
/// [`envoy`](DetectorConfig::envoy) takes Envoy `outlier_detection` documents, one from
/// [`grpc`](DetectorConfig::grpc) gRPC's; one built from `recommended()` (policy
/// `"recommended"`) or a linkerd preset takes neither (`NoPolicy`): change it with
/// `RulesHandle::replace` and a new `DetectorConfig`.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_detectors::DetectorConfig;
///
/// let config = DetectorConfig::envoy()
///     .consecutive_5xx(3)
///     .max_ejection_percent(50)
///     .build()?;
/// assert_eq!(config.base_ejection_time(), Duration::from_secs(30));
/// assert_eq!(config.max_ejection_time(), Duration::from_secs(300));
/// assert_eq!(config.budget().max_ejected(4), 2);
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct DetectorConfig {
    pub(crate) semantics: DetectorSemantics,
    pub(crate) interval: Duration,
    pub(crate) base_ejection_time: Duration,
    pub(crate) max_ejection_time: Duration,
    pub(crate) max_ejection_time_jitter: Duration,
    pub(crate) backoff_jitter: f64,
    pub(crate) max_ejection_percent: u32,
    pub(crate) always_eject_one_host: bool,
    pub(crate) split_external_local_origin_errors: bool,
    pub(crate) consecutive_5xx: Consecutive,
    pub(crate) consecutive_gateway_failure: Consecutive,
    pub(crate) consecutive_local_origin_failure: Consecutive,
    pub(crate) success_rate: Option<SuccessRate>,
    pub(crate) failure_percentage: Option<FailurePercentage>,
    pub(crate) recent_success_rate: Option<RecentSuccessRate>,
    pub(crate) recent_window_kept: bool,
    pub(crate) relapse_window: Duration,
    pub(crate) when_all_out: WhenAllOut,
    pub(crate) name: Option<&'static str>,
}

impl DetectorConfig {
    /// The name its policy reports in logs, snapshots, metrics and events: its semantics'
    /// (`"envoy"`, `"grpc"`, `"linkerd"`), or `"recommended"` for
    /// [`recommended`](Self::recommended)'s.
    ///
    /// ```
    /// use tower_outlier_detectors::DetectorConfig;
    ///
    /// assert_eq!(DetectorConfig::recommended().build()?.policy_name(), "recommended");
    /// assert_eq!(DetectorConfig::linkerd().build()?.policy_name(), "linkerd");
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub fn policy_name(&self) -> &'static str {
        self.name.unwrap_or(self.semantics.policy_name())
    }

    /// How soon after its return an ejection continues the endpoint's back-off (see
    /// [`DetectorBuilder::relapse_window`]); zero when off.
    pub fn relapse_window(&self) -> Duration {
        self.relapse_window
    }

    /// What `detector` measures, in these semantics' words (the `measure` of its ejections'
    /// reasons, the `detector` label of its metrics): linkerd's streak counts every failure the
    /// classifier names, gRPC statuses included, so it is `"consecutive failures"` where Envoy's
    /// is `"consecutive 5xx"`.
    ///
    /// ```
    /// use tower_outlier_detectors::{Detector, DetectorConfig};
    ///
    /// let recommended = DetectorConfig::recommended().build()?;
    /// assert_eq!(recommended.measure(Detector::Consecutive5xx), "consecutive failures");
    /// let envoy = DetectorConfig::envoy().build()?;
    /// assert_eq!(envoy.measure(Detector::Consecutive5xx), "consecutive 5xx");
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub fn measure(&self, detector: Detector) -> &'static str {
        match (self.semantics, detector) {
            (DetectorSemantics::Linkerd, Detector::Consecutive5xx) => "consecutive failures",
            _ => detector.measure(),
        }
    }

    /// Envoy's defaults (`DetectorConfig` in `outlier_detection_impl.h`):
    ///
    /// * consecutive 5xx: 5, enforced 100 %; consecutive gateway failures (502, 503, 504): 5,
    ///   enforced **0 %** (counted, never ejecting); consecutive local-origin failures: 5,
    ///   enforced 100 %, only with the origins split (off);
    /// * success rate: 5 hosts with 100 calls, factor 1900, enforced 100 %;
    /// * failure percentage: 85 %, 5 hosts with 50 calls, enforced **0 %** (off);
    /// * interval 10 s; ejection time 30 s × multiplier, at most 300 s, no jitter; at most 10 %
    ///   ejected, so a fleet of fewer than ten ejects nothing unless
    ///   [`always_eject_one_host`](DetectorBuilder::always_eject_one_host) is set.
    pub fn envoy() -> DetectorBuilder {
        DetectorBuilder::default()
    }

    /// gRPC's defaults (A50 as xDS delivers Envoy's defaults): no consecutive-failure detector
    /// (gRPC has none); success rate as Envoy's; no failure-percentage detector; interval 10 s;
    /// ejection time 30 s × multiplier, at most 300 s; at most 10 % ejected, checked before each
    /// ejection, so the first ejection always passes.
    ///
    /// gRPC counts every call that did not end with status OK as a failure; pair this preset
    /// with a classifier that does the same to match it exactly.
    pub fn grpc() -> DetectorBuilder {
        DetectorBuilder {
            semantics: DetectorSemantics::Grpc,
            max_ejection_time: Some(Duration::from_secs(300)),
            consecutive_5xx: OFF,
            consecutive_gateway_failure: OFF,
            consecutive_local_origin_failure: OFF,
            failure_percentage: None,
            // A pick with every address ejected fails (UNAVAILABLE).
            when_all_out: WhenAllOut::FailFast,
            ..DetectorBuilder::default()
        }
    }

    /// linkerd2-proxy's "unified" failure accrual (since mid-2026; annotation
    /// `balancer.linkerd.io/failure-accrual: unified`) with its control plane's defaults: 7
    /// consecutive failures of any kind, or a success rate below 0.8 over the last 10 s on at
    /// least 5 calls ([`RecentSuccessRate`]), eject; the endpoint comes back after an exponential
    /// back-off from 1 s to 60 s with jitter 0.5, for exactly one real request, the probe. A
    /// successful probe closes the breaker (the next trip starts at 1 s again); a failed one
    /// ejects the endpoint for the next, longer back-off. No cap on how many are ejected, no
    /// interval. Where linkerd fails requests fast once every endpoint is out, this preset keeps
    /// the last endpoint (`.when_all_out(WhenAllOut::FailFast)` restores linkerd's choice). The
    /// older consecutive-only accrual is [`linkerd_consecutive`](Self::linkerd_consecutive).
    pub fn linkerd() -> DetectorBuilder {
        DetectorConfig::linkerd_consecutive()
            .recent_success_rate(Some(recent::LINKERD_RECENT_SUCCESS_RATE))
    }

    /// linkerd2-proxy's consecutive-only failure accrual (`failure-accrual: consecutive`): as
    /// [`linkerd`](Self::linkerd) without the success-rate trigger.
    pub fn linkerd_consecutive() -> DetectorBuilder {
        DetectorBuilder {
            semantics: DetectorSemantics::Linkerd,
            base_ejection_time: Duration::from_secs(1),
            max_ejection_time: Some(Duration::from_secs(60)),
            backoff_jitter: 0.5,
            max_ejection_percent: 100,
            consecutive_5xx: Consecutive {
                threshold: 7,
                enforcement: 100,
            },
            consecutive_gateway_failure: OFF,
            consecutive_local_origin_failure: OFF,
            success_rate: None,
            failure_percentage: None,
            // linkerd fails requests fast while every endpoint's breaker is open; this preset
            // keeps the last endpoint instead (`when_all_out(WhenAllOut::FailFast)` gives
            // linkerd's): in the detection benchmark failing fast never saved a call, and a
            // fleet flapping together delivered 64 % more failures than no detection with it.
            when_all_out: WhenAllOut::KeepLast,
            ..DetectorBuilder::default()
        }
    }

    /// What this library recommends for a fleet of any size, from three endpoints up, measured
    /// against no detection, nginx and HAProxy on loopback (see the repository's BENCHMARKS.md):
    ///
    /// * **3 consecutive failures** of any kind eject, on the third call itself. With a latency-driven
    ///   balancer a failing endpoint is sent just the calls its streak needs after a fast failure
    ///   (a refused connection, a 503), and none after a timeout (p2c routes around a black hole
    ///   on its own, at less cost to callers than judging it would take);
    /// * linkerd's recovery: back after an exponential back-off from **1 s to 5 s** with jitter 0.5,
    ///   checked by the layer's active probe if it has one (the endpoint stays out until the probe
    ///   succeeds), else by one real request (probation);
    /// * at most **half the fleet** out at once, and always one if the fleet has two endpoints
    ///   or more: one of three, two of five; never the last endpoint.
    ///
    /// * linkerd's second trigger ([`RecentSuccessRate`], its unified failure accrual): a
    ///   success rate **below 0.8 over the last 10 s**, on 5 calls or more, ejects as a streak
    ///   does, so a gray failure that rarely fails three calls in a row (every third call, say)
    ///   is ejected after a handful of failures instead of being left to the balancer. A fleet
    ///   whose every endpoint fails that often is still served: at most half of it is out.
    ///   Its window is kept when the endpoint comes back
    ///   ([`recent_window_kept_on_return`](DetectorBuilder::recent_window_kept_on_return)),
    ///   so a gray endpoint that passes its health checks is out again on its first failure
    ///   after each return, and an ejection within 10 s of a return continues the back-off
    ///   ([`relapse_window`](DetectorBuilder::relapse_window)): such an endpoint comes back
    ///   after 1, 2, 4, then every 5 s, not every second.
    ///
    /// Its policy is named `"recommended"` in logs, snapshots and metrics. A running layer built
    /// from it is changed with a new `DetectorConfig` (`RulesHandle::replace`); it refuses
    /// Envoy and gRPC documents, which replace policies named `"envoy"` and `"grpc"`.
    ///
    /// ```
    /// use tower_outlier_detectors::{DetectorConfig, DetectorPolicy};
    ///
    /// let config = DetectorConfig::recommended().build()?;
    /// assert_eq!(config.budget().max_ejected(3), 1);
    /// let policy = DetectorPolicy::new(config);
    /// # let _ = policy;
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub fn recommended() -> DetectorBuilder {
        DetectorBuilder {
            semantics: DetectorSemantics::Linkerd,
            base_ejection_time: Duration::from_secs(1),
            max_ejection_time: Some(Duration::from_secs(5)),
            backoff_jitter: 0.5,
            max_ejection_percent: 50,
            always_eject_one_host: true,
            consecutive_5xx: Consecutive {
                threshold: 3,
                enforcement: 100,
            },
            consecutive_gateway_failure: OFF,
            consecutive_local_origin_failure: OFF,
            success_rate: None,
            failure_percentage: None,
            // Whatever the last endpoint still answers beats failing every call.
            when_all_out: WhenAllOut::KeepLast,
            recent_success_rate: Some(recent::LINKERD_RECENT_SUCCESS_RATE),
            // A gray endpoint the probe lets back in is out again on its first failure, not
            // after judging it from an empty window each time it returns.
            recent_window_kept: true,
            // ... and its back-off doubles on each such relapse, up to 5 s, instead of starting
            // again at 1 s: a return each second cost a caller each second.
            relapse_window: recent::LINKERD_RECENT_SUCCESS_RATE.window,
            // Its own name in logs, snapshots and metrics: linkerd's semantics, not linkerd's
            // configuration.
            name: Some("recommended"),
            ..DetectorBuilder::default()
        }
    }

    /// What the layer does when these rules would leave no endpoint to pick (see
    /// [`DetectorBuilder::when_all_out`]).
    ///
    /// ```
    /// use tower_outlier_core::WhenAllOut;
    /// use tower_outlier_detectors::DetectorConfig;
    ///
    /// assert_eq!(DetectorConfig::envoy().build()?.when_all_out(), WhenAllOut::PanicBelow(0.5));
    /// assert_eq!(DetectorConfig::grpc().build()?.when_all_out(), WhenAllOut::FailFast);
    /// assert_eq!(DetectorConfig::linkerd().build()?.when_all_out(), WhenAllOut::KeepLast);
    /// assert_eq!(DetectorConfig::recommended().build()?.when_all_out(), WhenAllOut::KeepLast);
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub fn when_all_out(&self) -> WhenAllOut {
        self.when_all_out
    }

    /// Whose rules decide the details.
    pub fn semantics(&self) -> DetectorSemantics {
        self.semantics
    }

    /// How often the statistical detectors run and ejected endpoints are re-admitted, as
    /// configured (see [`running_interval`](Self::running_interval) for zero).
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The interval the detector runs at: [`interval`](Self::interval), or for gRPC's zero
    /// interval one millisecond. grpc-go re-arms its timer at once after each sweep when the
    /// interval is zero, sweeping back to back; the layer sweeps every millisecond instead (its
    /// timer's resolution), with no busy loop.
    pub fn running_interval(&self) -> Duration {
        self.interval.max(MIN_RUNNING_INTERVAL)
    }

    /// The most calls any of its statistical detectors needs from an endpoint in an interval
    /// (0 without one).
    pub(crate) fn request_volume(&self) -> u64 {
        let success_rate = self.success_rate.as_ref().map_or(0, |d| d.request_volume);
        let failure_percentage = self
            .failure_percentage
            .as_ref()
            .map_or(0, |d| d.request_volume);
        u64::from(success_rate.max(failure_percentage))
    }

    /// The first ejection's length (linkerd: the shortest back-off).
    pub fn base_ejection_time(&self) -> Duration {
        self.base_ejection_time
    }

    /// The longest ejection (the effective one: Envoy's default is `max(300 s, base)`).
    pub fn max_ejection_time(&self) -> Duration {
        self.max_ejection_time
    }

    /// Envoy's jitter: up to this much is added to each ejection time.
    pub fn max_ejection_time_jitter(&self) -> Duration {
        self.max_ejection_time_jitter
    }

    /// linkerd's jitter: each back-off is lengthened by up to this fraction of itself.
    pub fn backoff_jitter(&self) -> f64 {
        self.backoff_jitter
    }

    /// The largest share of endpoints, in percent, ejected at once.
    pub fn max_ejection_percent(&self) -> u32 {
        self.max_ejection_percent
    }

    /// The ejection budget the layer applies, by the system followed.
    pub fn budget(&self) -> EjectionBudget {
        let floor = match self.semantics {
            DetectorSemantics::Grpc => BudgetFloor::RoundUp,
            _ if self.always_eject_one_host => BudgetFloor::One,
            _ => BudgetFloor::Zero,
        };
        let mut ratio = f64::from(self.max_ejection_percent.min(100)) / 100.0;
        if floor == BudgetFloor::One && ratio == 0.0 {
            // Envoy ejects the first host even at 0 % with `always_eject_one_host`; the floor of
            // one applies to a ratio above zero.
            ratio = f64::MIN_POSITIVE;
        }
        EjectionBudget::const_new(ratio, floor)
            .expect("a percentage of at most 100 is a valid ratio")
    }

    /// Whether local-origin failures (errors raised before any response) are counted apart.
    pub fn split_external_local_origin_errors(&self) -> bool {
        self.split_external_local_origin_errors
    }

    /// The consecutive 5xx detector (any failure, for services that are not HTTP).
    pub fn consecutive_5xx(&self) -> Consecutive {
        self.consecutive_5xx
    }

    /// The consecutive gateway-failure detector.
    pub fn consecutive_gateway_failure(&self) -> Consecutive {
        self.consecutive_gateway_failure
    }

    /// The consecutive local-origin-failure detector (only with the origins split).
    pub fn consecutive_local_origin_failure(&self) -> Consecutive {
        self.consecutive_local_origin_failure
    }

    /// The success-rate detector, if present.
    pub fn success_rate(&self) -> Option<SuccessRate> {
        self.success_rate
    }

    /// The failure-percentage detector, if present.
    pub fn failure_percentage(&self) -> Option<FailurePercentage> {
        self.failure_percentage
    }
}

mod builder;
mod recent;

pub use builder::DetectorBuilder;
use builder::*;
pub use recent::RecentSuccessRate;
pub(crate) use recent::{MIN_RECENT_WINDOW, RECENT_BUCKETS};

#[cfg(test)]
mod tests;
