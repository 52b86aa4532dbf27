//! Configuration of the detectors: the builder, the three presets and their validation.

use std::time::Duration;

use tower_outlier_core::{check_nonzero_duration, BudgetFloor, ConfigError, EjectionBudget};

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

/// A validated detector configuration. Start from a preset, [`DetectorConfig::envoy`],
/// [`DetectorConfig::grpc`] or [`DetectorConfig::linkerd`], or read one (Envoy's or gRPC's
/// JSON, behind the `envoy` and `grpc` features).
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
}

impl DetectorConfig {
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
            ..DetectorBuilder::default()
        }
    }

    /// linkerd2-proxy's failure accrual with its control plane's defaults: 7 consecutive failures
    /// of any kind eject; the endpoint comes back after an exponential back-off from 1 s to 60 s
    /// with jitter 0.5, for exactly one real request, the probe. A successful probe closes the
    /// breaker (the next trip starts at 1 s again); a failed one ejects the endpoint for the next,
    /// longer back-off. No cap on how many are ejected (but never the last endpoint), no
    /// statistical detector.
    pub fn linkerd() -> DetectorBuilder {
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
    /// No statistical detector: a gray failure (some calls failing, never three in a row) is left
    /// to the balancer, whose latency estimate a fast failure raises.
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
            ..DetectorBuilder::default()
        }
    }

    /// Whose rules decide the details.
    pub fn semantics(&self) -> DetectorSemantics {
        self.semantics
    }

    /// How often the statistical detectors run and ejected endpoints are re-admitted.
    pub fn interval(&self) -> Duration {
        self.interval
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

/// The longest duration protobuf (so Envoy's and gRPC's configurations) can express.
const MAX_DURATION: Duration = Duration::new(315_576_000_000, 999_999_999);

const OFF: Consecutive = Consecutive {
    threshold: 0,
    enforcement: 0,
};

const ENVOY_SUCCESS_RATE: SuccessRate = SuccessRate {
    rule: SuccessRateRule::Stdev,
    stdev_factor: 1900,
    enforcement: 100,
    local_origin_enforcement: 100,
    minimum_hosts: 5,
    request_volume: 100,
};

const ENVOY_FAILURE_PERCENTAGE: FailurePercentage = FailurePercentage {
    threshold: 85,
    enforcement: 0,
    local_origin_enforcement: 0,
    minimum_hosts: 5,
    request_volume: 50,
};

/// Builds a [`DetectorConfig`]; [`build`](Self::build) validates every field and names the one
/// that is wrong. Field names follow Envoy's.
#[derive(Clone, Debug, PartialEq)]
pub struct DetectorBuilder {
    pub(crate) semantics: DetectorSemantics,
    pub(crate) interval: Duration,
    pub(crate) base_ejection_time: Duration,
    pub(crate) max_ejection_time: Option<Duration>,
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
}

impl Default for DetectorBuilder {
    fn default() -> Self {
        DetectorBuilder {
            semantics: DetectorSemantics::Envoy,
            interval: Duration::from_secs(10),
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: None,
            max_ejection_time_jitter: Duration::ZERO,
            backoff_jitter: 0.0,
            max_ejection_percent: 10,
            always_eject_one_host: false,
            split_external_local_origin_errors: false,
            consecutive_5xx: Consecutive {
                threshold: 5,
                enforcement: 100,
            },
            consecutive_gateway_failure: Consecutive {
                threshold: 5,
                enforcement: 0,
            },
            consecutive_local_origin_failure: Consecutive {
                threshold: 5,
                enforcement: 100,
            },
            success_rate: Some(ENVOY_SUCCESS_RATE),
            failure_percentage: Some(ENVOY_FAILURE_PERCENTAGE),
        }
    }
}

impl DetectorBuilder {
    /// Whose rules decide the details (set by the presets).
    pub fn semantics(mut self, semantics: DetectorSemantics) -> Self {
        self.semantics = semantics;
        self
    }

    /// `interval`: how often the statistical detectors run and ejections are checked. Non-zero.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// `base_ejection_time`. Non-zero.
    pub fn base_ejection_time(mut self, base: Duration) -> Self {
        self.base_ejection_time = base;
        self
    }

    /// `max_ejection_time`. Envoy rejects one below the base; gRPC uses `max(base, max)`.
    pub fn max_ejection_time(mut self, max: Duration) -> Self {
        self.max_ejection_time = Some(max);
        self
    }

    /// `max_ejection_time_jitter` (Envoy): up to this much, in whole milliseconds, is added to
    /// each ejection.
    pub fn max_ejection_time_jitter(mut self, jitter: Duration) -> Self {
        self.max_ejection_time_jitter = jitter;
        self
    }

    /// linkerd's back-off jitter: each back-off is lengthened by up to this fraction (0 to 1,
    /// finite) of itself, never beyond the maximum.
    pub fn backoff_jitter(mut self, jitter: f64) -> Self {
        self.backoff_jitter = jitter;
        self
    }

    /// `max_ejection_percent` (0 to 100).
    pub fn max_ejection_percent(mut self, percent: u32) -> Self {
        self.max_ejection_percent = percent;
        self
    }

    /// `always_eject_one_host` (Envoy): one endpoint may be ejected whatever the percentage.
    pub fn always_eject_one_host(mut self, always: bool) -> Self {
        self.always_eject_one_host = always;
        self
    }

    /// `split_external_local_origin_errors`: count errors raised before any response (refused,
    /// reset, timed out) apart, in the local-origin detectors, instead of as 5xx.
    pub fn split_external_local_origin_errors(mut self, split: bool) -> Self {
        self.split_external_local_origin_errors = split;
        self
    }

    /// `consecutive_5xx`: failures in a row (any failure, for services that are not HTTP) that
    /// eject; 0 turns the detector off.
    pub fn consecutive_5xx(mut self, threshold: u32) -> Self {
        self.consecutive_5xx.threshold = threshold;
        self
    }

    /// `enforcing_consecutive_5xx` (0 to 100).
    pub fn enforcing_consecutive_5xx(mut self, percent: u32) -> Self {
        self.consecutive_5xx.enforcement = percent;
        self
    }

    /// `consecutive_gateway_failure`: 502, 503 and 504 in a row (and, with the origins not
    /// split, refused connections and timeouts); 0 turns the detector off.
    pub fn consecutive_gateway_failure(mut self, threshold: u32) -> Self {
        self.consecutive_gateway_failure.threshold = threshold;
        self
    }

    /// `enforcing_consecutive_gateway_failure` (0 to 100).
    pub fn enforcing_consecutive_gateway_failure(mut self, percent: u32) -> Self {
        self.consecutive_gateway_failure.enforcement = percent;
        self
    }

    /// `consecutive_local_origin_failure` (with the origins split); 0 turns the detector off.
    pub fn consecutive_local_origin_failure(mut self, threshold: u32) -> Self {
        self.consecutive_local_origin_failure.threshold = threshold;
        self
    }

    /// `enforcing_consecutive_local_origin_failure` (0 to 100).
    pub fn enforcing_consecutive_local_origin_failure(mut self, percent: u32) -> Self {
        self.consecutive_local_origin_failure.enforcement = percent;
        self
    }

    fn success_rate_mut(&mut self) -> &mut SuccessRate {
        self.success_rate.get_or_insert(ENVOY_SUCCESS_RATE)
    }

    fn failure_percentage_mut(&mut self) -> &mut FailurePercentage {
        self.failure_percentage
            .get_or_insert(ENVOY_FAILURE_PERCENTAGE)
    }

    /// Sets the whole success-rate detector, or removes it (`None`).
    pub fn success_rate(mut self, detector: Option<SuccessRate>) -> Self {
        self.success_rate = detector;
        self
    }

    /// Sets the whole failure-percentage detector, or removes it (`None`).
    pub fn failure_percentage(mut self, detector: Option<FailurePercentage>) -> Self {
        self.failure_percentage = detector;
        self
    }

    /// How the success-rate threshold is set (adds the detector with Envoy's defaults if absent).
    pub fn success_rate_rule(mut self, rule: SuccessRateRule) -> Self {
        self.success_rate_mut().rule = rule;
        self
    }

    /// `success_rate_stdev_factor`, in thousandths.
    pub fn success_rate_stdev_factor(mut self, factor: u32) -> Self {
        self.success_rate_mut().stdev_factor = factor;
        self
    }

    /// `success_rate_minimum_hosts`.
    pub fn success_rate_minimum_hosts(mut self, hosts: u32) -> Self {
        self.success_rate_mut().minimum_hosts = hosts;
        self
    }

    /// `success_rate_request_volume`.
    pub fn success_rate_request_volume(mut self, calls: u32) -> Self {
        self.success_rate_mut().request_volume = calls;
        self
    }

    /// `enforcing_success_rate` (0 to 100).
    pub fn enforcing_success_rate(mut self, percent: u32) -> Self {
        self.success_rate_mut().enforcement = percent;
        self
    }

    /// `enforcing_local_origin_success_rate` (0 to 100).
    pub fn enforcing_local_origin_success_rate(mut self, percent: u32) -> Self {
        self.success_rate_mut().local_origin_enforcement = percent;
        self
    }

    /// `failure_percentage_threshold` (0 to 100).
    pub fn failure_percentage_threshold(mut self, percent: u32) -> Self {
        self.failure_percentage_mut().threshold = percent;
        self
    }

    /// `failure_percentage_minimum_hosts`.
    pub fn failure_percentage_minimum_hosts(mut self, hosts: u32) -> Self {
        self.failure_percentage_mut().minimum_hosts = hosts;
        self
    }

    /// `failure_percentage_request_volume`.
    pub fn failure_percentage_request_volume(mut self, calls: u32) -> Self {
        self.failure_percentage_mut().request_volume = calls;
        self
    }

    /// `enforcing_failure_percentage` (0 to 100).
    pub fn enforcing_failure_percentage(mut self, percent: u32) -> Self {
        self.failure_percentage_mut().enforcement = percent;
        self
    }

    /// `enforcing_failure_percentage_local_origin` (0 to 100).
    pub fn enforcing_failure_percentage_local_origin(mut self, percent: u32) -> Self {
        self.failure_percentage_mut().local_origin_enforcement = percent;
        self
    }

    /// Validates and builds the configuration.
    pub fn build(self) -> Result<DetectorConfig, ConfigError> {
        check_nonzero_duration("interval", self.interval)?;
        check_nonzero_duration("base_ejection_time", self.base_ejection_time)?;
        for (field, value) in [
            ("interval", Some(self.interval)),
            ("base_ejection_time", Some(self.base_ejection_time)),
            ("max_ejection_time", self.max_ejection_time),
            (
                "max_ejection_time_jitter",
                Some(self.max_ejection_time_jitter),
            ),
        ] {
            if value.is_some_and(|value| value > MAX_DURATION) {
                return Err(ConfigError::new(
                    field,
                    format!("{value:?}", value = value.unwrap_or_default()),
                    "at most 315576000000.999999999s (protobuf's largest duration)",
                ));
            }
        }
        let max_ejection_time = match (self.max_ejection_time, self.semantics) {
            (None, _) => self.base_ejection_time.max(Duration::from_secs(300)),
            (Some(max), DetectorSemantics::Envoy | DetectorSemantics::Linkerd)
                if max < self.base_ejection_time =>
            {
                return Err(ConfigError::new(
                    "max_ejection_time",
                    format!("{max:?}"),
                    format!(
                        "at least base_ejection_time ({:?})",
                        self.base_ejection_time
                    ),
                ));
            }
            (Some(max), _) => max.max(self.base_ejection_time),
        };
        if !(self.backoff_jitter.is_finite() && (0.0..=1.0).contains(&self.backoff_jitter)) {
            return Err(ConfigError::new(
                "backoff_jitter",
                self.backoff_jitter,
                "0 to 1",
            ));
        }
        percent("max_ejection_percent", self.max_ejection_percent)?;
        percent(
            "enforcing_consecutive_5xx",
            self.consecutive_5xx.enforcement,
        )?;
        percent(
            "enforcing_consecutive_gateway_failure",
            self.consecutive_gateway_failure.enforcement,
        )?;
        percent(
            "enforcing_consecutive_local_origin_failure",
            self.consecutive_local_origin_failure.enforcement,
        )?;
        if let Some(sr) = self.success_rate {
            percent("enforcing_success_rate", sr.enforcement)?;
            percent(
                "enforcing_local_origin_success_rate",
                sr.local_origin_enforcement,
            )?;
            if let SuccessRateRule::Robust { min_spread } = sr.rule {
                if !(min_spread.is_finite() && min_spread >= 0.0) {
                    return Err(ConfigError::new(
                        "success_rate_rule.min_spread",
                        min_spread,
                        "a finite number of percentage points, at least 0",
                    ));
                }
            }
        }
        if let Some(fp) = self.failure_percentage {
            percent("failure_percentage_threshold", fp.threshold)?;
            percent("enforcing_failure_percentage", fp.enforcement)?;
            percent(
                "enforcing_failure_percentage_local_origin",
                fp.local_origin_enforcement,
            )?;
        }
        Ok(DetectorConfig {
            semantics: self.semantics,
            interval: self.interval,
            base_ejection_time: self.base_ejection_time,
            max_ejection_time,
            max_ejection_time_jitter: self.max_ejection_time_jitter,
            backoff_jitter: self.backoff_jitter,
            max_ejection_percent: self.max_ejection_percent,
            always_eject_one_host: self.always_eject_one_host,
            split_external_local_origin_errors: self.split_external_local_origin_errors,
            consecutive_5xx: self.consecutive_5xx,
            consecutive_gateway_failure: self.consecutive_gateway_failure,
            consecutive_local_origin_failure: self.consecutive_local_origin_failure,
            success_rate: self.success_rate,
            failure_percentage: self.failure_percentage,
        })
    }
}

fn percent(field: &str, value: u32) -> Result<(), ConfigError> {
    if value > 100 {
        return Err(ConfigError::new(field, value, "0 to 100"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
