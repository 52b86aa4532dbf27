//! The detector configuration's builder: defaults per system, setters and validation.

use std::time::Duration;

use tower_outlier_core::{check_nonzero_duration, check_ratio, ConfigError, WhenAllOut};

use super::*;

/// The longest duration protobuf (so Envoy's and gRPC's configurations) can express.
pub(super) const MAX_DURATION: Duration = Duration::new(315_576_000_000, 999_999_999);

pub(super) const OFF: Consecutive = Consecutive {
    threshold: 0,
    enforcement: 0,
};

pub(super) const ENVOY_SUCCESS_RATE: SuccessRate = SuccessRate {
    rule: SuccessRateRule::Stdev,
    stdev_factor: 1900,
    enforcement: 100,
    local_origin_enforcement: 100,
    minimum_hosts: 5,
    request_volume: 100,
};

pub(super) const ENVOY_FAILURE_PERCENTAGE: FailurePercentage = FailurePercentage {
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
    pub(crate) recent_success_rate: Option<RecentSuccessRate>,
    pub(crate) recent_window_kept: bool,
    pub(crate) relapse_window: Duration,
    pub(crate) when_all_out: WhenAllOut,
    // The policy's name where it is not its semantics' (`recommended()`'s).
    pub(crate) name: Option<&'static str>,
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
            recent_success_rate: None,
            recent_window_kept: false,
            relapse_window: Duration::ZERO,
            // Envoy's cluster default (`common_lb_config.healthy_panic_threshold`).
            when_all_out: WhenAllOut::PanicBelow(0.5),
            name: None,
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

    /// linkerd's back-off jitter: each back-off is lengthened by up to this multiple (0 to 100,
    /// finite, as linkerd's `ExponentialBackoff` takes) of itself, never beyond the maximum.
    pub fn backoff_jitter(mut self, jitter: f64) -> Self {
        self.backoff_jitter = jitter;
        self
    }

    /// Under linkerd's semantics: an endpoint ejected again within this time of its return from
    /// an ejection (a relapse) continues its back-off where the last trip left it, instead of
    /// starting again at `base_ejection_time` as linkerd does once a probe passes. Zero (the
    /// default) turns it off; [`DetectorConfig::recommended`] sets 10 s, its success-rate
    /// window.
    ///
    /// A gray endpoint passes its health checks, so each probe lets it back in; without this it
    /// came back every `base_ejection_time` and failed a caller each time. With it the back-off
    /// doubles on every relapse, up to `max_ejection_time`. An endpoint that stays in for longer
    /// than the window starts its next trip at the base again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier_detectors::DetectorConfig;
    ///
    /// let recommended = DetectorConfig::recommended().build()?;
    /// assert_eq!(recommended.relapse_window(), Duration::from_secs(10));
    /// assert_eq!(DetectorConfig::linkerd().build()?.relapse_window(), Duration::ZERO);
    /// // Envoy's and gRPC's multipliers decay on their own ticks instead.
    /// assert!(DetectorConfig::envoy().relapse_window(Duration::from_secs(10)).build().is_err());
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub fn relapse_window(mut self, window: Duration) -> Self {
        self.relapse_window = window;
        self
    }

    /// What the layer does when these rules would leave no endpoint to pick
    /// ([`WhenAllOut`]): Envoy's preset panics below 50 % healthy and gRPC's fails fast, as they
    /// do; linkerd's preset keeps the last endpoint, where linkerd fails fast (failing fast never
    /// saved a call in the detection benchmark and cost 64 % more failures than no detection to
    /// a fleet flapping together), as does the recommended configuration. The layer
    /// follows its first policy's choice unless it is given one
    /// (`OutlierDetectionLayer::when_all_out`).
    pub fn when_all_out(mut self, choice: WhenAllOut) -> Self {
        self.when_all_out = choice;
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
        // gRPC accepts zero durations (A50 asks only that they not be negative); Envoy's proto
        // requires both positive; linkerd has no interval (it is unused there).
        if self.semantics != DetectorSemantics::Grpc {
            check_nonzero_duration("interval", self.interval)?;
        }
        // linkerd takes a zero shortest back-off too (only its longest must be positive).
        if self.semantics == DetectorSemantics::Envoy {
            check_nonzero_duration("base_ejection_time", self.base_ejection_time)?;
        }
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
        if !(self.backoff_jitter.is_finite() && (0.0..=100.0).contains(&self.backoff_jitter)) {
            return Err(ConfigError::new(
                "backoff_jitter",
                self.backoff_jitter,
                "0 to 100",
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
        if let Some(recent) = self.recent_success_rate {
            recent.validate(self.semantics)?;
        }
        if !self.relapse_window.is_zero() && self.semantics != DetectorSemantics::Linkerd {
            return Err(ConfigError::new(
                "relapse_window",
                format!("{:?}", self.relapse_window),
                "only with linkerd's semantics (Envoy's and gRPC's multipliers decay on their ticks)",
            ));
        }
        if let Some(fp) = self.failure_percentage {
            percent("failure_percentage_threshold", fp.threshold)?;
            percent("enforcing_failure_percentage", fp.enforcement)?;
            percent(
                "enforcing_failure_percentage_local_origin",
                fp.local_origin_enforcement,
            )?;
        }
        if let WhenAllOut::PanicBelow(threshold) = self.when_all_out {
            check_ratio("healthy_panic_threshold", threshold)?;
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
            recent_success_rate: self.recent_success_rate,
            recent_window_kept: self.recent_window_kept,
            relapse_window: self.relapse_window,
            when_all_out: self.when_all_out,
            name: self.name,
        })
    }
}

fn percent(field: &str, value: u32) -> Result<(), ConfigError> {
    if value > 100 {
        return Err(ConfigError::new(field, value, "0 to 100"));
    }
    Ok(())
}
