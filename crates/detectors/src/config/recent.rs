//! linkerd's unified failure accrual's second trigger: the success rate over a recent window.

use std::time::Duration;

use tower_outlier_core::ConfigError;

use super::*;

/// linkerd's success-rate trigger (its "unified" failure accrual, linkerd2-proxy since mid-2026):
/// an endpoint whose success rate over the last `window` falls strictly below `threshold`, on at
/// least `min_requests` calls, trips its breaker as 7 consecutive failures do.
///
/// The window is ten buckets of a tenth of it each, summed whole: the calls of the last nine
/// buckets and of the current one. It is checked after each failed call (a success cannot bring
/// the rate down), while the endpoint is in rotation, and emptied when the endpoint comes back
/// (unless [`DetectorBuilder::recent_window_kept_on_return`] keeps it).
/// A `threshold` of 0 turns the trigger off.
///
/// linkerd counts 429 and gRPC's RESOURCE_EXHAUSTED against the rate but not as consecutive
/// failures; here both triggers count what the layer's classifier calls a failure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecentSuccessRate {
    /// The success rate (0 to 1) strictly below which the endpoint trips.
    pub threshold: f64,
    /// How far back the rate looks: ten buckets of a tenth each (at least 10 ms).
    pub window: Duration,
    /// The calls in the window it needs before it can trip (at most 1 000 000).
    pub min_requests: u32,
}

/// linkerd's defaults, as its control plane sends them: 0.8 over 10 s on at least 5 calls.
pub(super) const LINKERD_RECENT_SUCCESS_RATE: RecentSuccessRate = RecentSuccessRate {
    threshold: 0.8,
    window: Duration::from_secs(10),
    min_requests: 5,
};

/// The buckets of the window (fixed, as linkerd's).
pub(crate) const RECENT_BUCKETS: usize = 10;

/// The shortest window (linkerd's `MIN_SUCCESS_RATE_WINDOW`).
pub(crate) const MIN_RECENT_WINDOW: Duration = Duration::from_millis(10);

impl RecentSuccessRate {
    /// Whether the trigger can trip at all.
    pub fn is_on(&self) -> bool {
        self.threshold > 0.0
    }

    /// linkerd's checks (its proxy's `TryFrom<FailureAccrual>`), and only under its semantics.
    pub(super) fn validate(&self, semantics: DetectorSemantics) -> Result<(), ConfigError> {
        if semantics != DetectorSemantics::Linkerd {
            return Err(ConfigError::new(
                "recent_success_rate",
                format!("{self:?}"),
                "only with linkerd's semantics (DetectorConfig::linkerd)",
            ));
        }
        if !(0.0..=1.0).contains(&self.threshold) {
            return Err(ConfigError::new(
                "recent_success_rate.threshold",
                self.threshold,
                "a success rate from 0 to 1",
            ));
        }
        if self.is_on() && self.window < MIN_RECENT_WINDOW {
            return Err(ConfigError::new(
                "recent_success_rate.window",
                format!("{:?}", self.window),
                "at least 10ms",
            ));
        }
        if self.min_requests > 1_000_000 {
            return Err(ConfigError::new(
                "recent_success_rate.min_requests",
                self.min_requests,
                "at most 1000000",
            ));
        }
        Ok(())
    }
}

impl DetectorBuilder {
    /// linkerd's success-rate trigger ([`RecentSuccessRate`]), or none (its consecutive-only
    /// failure accrual). Only with linkerd's semantics.
    pub fn recent_success_rate(mut self, trigger: Option<RecentSuccessRate>) -> Self {
        self.recent_success_rate = trigger;
        self
    }

    /// Whether the success-rate trigger's window is kept when an ejected endpoint comes back
    /// (`true`), so that the calls before its ejection still count for the rest of the window,
    /// or emptied as linkerd empties it (`false`, the default; [`recommended`] keeps it).
    ///
    /// Kept, an endpoint that fails a share of its calls but passes its health checks (a gray
    /// failure the probe cannot see) is ejected again on its first failure after each return,
    /// while that failure still leaves the window's rate under the threshold. Emptied, each
    /// return judges it afresh on `min_requests` new calls, and it fails a few more callers each
    /// time. An endpoint that has healed answers its calls, and their successes lift the
    /// window's rate above the threshold within a few calls.
    ///
    /// ```
    /// use tower_outlier_detectors::DetectorConfig;
    ///
    /// assert!(DetectorConfig::recommended().build()?.recent_window_kept_on_return());
    /// let linkerd = DetectorConfig::linkerd().build()?;
    /// assert!(!linkerd.recent_window_kept_on_return());
    /// let kept = DetectorConfig::linkerd().recent_window_kept_on_return(true).build()?;
    /// assert!(kept.recent_window_kept_on_return());
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    ///
    /// [`recommended`]: DetectorConfig::recommended
    pub fn recent_window_kept_on_return(mut self, kept: bool) -> Self {
        self.recent_window_kept = kept;
        self
    }
}

impl DetectorConfig {
    /// linkerd's success-rate trigger, if set.
    pub fn recent_success_rate(&self) -> Option<RecentSuccessRate> {
        self.recent_success_rate
    }

    /// Whether the success-rate trigger's window is kept when an ejected endpoint comes back
    /// (see [`DetectorBuilder::recent_window_kept_on_return`]).
    pub fn recent_window_kept_on_return(&self) -> bool {
        self.recent_window_kept
    }
}
