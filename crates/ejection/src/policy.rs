//! The error-rate policy and its per-endpoint state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::{
    store_if_changed, Budget, EndpointPolicy, Judgement, Nanos, Observation, Policy, Reason,
    RecoverySchedule, Signal, Window, WindowCounts,
};

use crate::config::ErrorRateConfig;

/// Error-rate ejection (EDAS / HSF): an endpoint whose error rate over the window is strictly
/// greater than the threshold, once the window holds the minimum number of calls, is an outlier.
///
/// ```
/// use tower_outlier_core::Policy;
/// use tower_outlier_ejection::{ErrorRateConfig, ErrorRatePolicy};
///
/// let policy = ErrorRatePolicy::new(ErrorRateConfig::hsf().build().unwrap());
/// assert_eq!(policy.name(), "error-rate");
/// ```
#[derive(Clone, Debug)]
pub struct ErrorRatePolicy {
    config: Arc<ErrorRateConfig>,
}

impl ErrorRatePolicy {
    /// The policy for a validated configuration.
    pub fn new(config: ErrorRateConfig) -> Self {
        ErrorRatePolicy {
            config: Arc::new(config),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ErrorRateConfig {
        &self.config
    }

    /// The state of one endpoint, on its own (the layer calls [`Policy::new_endpoint`]).
    pub fn endpoint(&self) -> ErrorRateEndpoint {
        ErrorRateEndpoint {
            window: self.config.window.window(),
            enabled: self.config.enabled,
            min_calls: self.config.min_calls,
            threshold: self.config.threshold,
            suspect: AtomicBool::new(false),
        }
    }
}

impl Policy for ErrorRatePolicy {
    fn name(&self) -> &'static str {
        "error-rate"
    }

    fn new_endpoint(&self) -> Box<dyn EndpointPolicy> {
        Box::new(self.endpoint())
    }

    /// Keeps the endpoint's window: its calls count under the new threshold and minimum at once
    /// (a new window size takes them over as they are; see [`Window::absorb`]).
    fn new_endpoint_from(
        &self,
        previous: &dyn EndpointPolicy,
        now: Nanos,
    ) -> Box<dyn EndpointPolicy> {
        let next = self.endpoint();
        if let Some(previous) = previous.as_any().downcast_ref::<ErrorRateEndpoint>() {
            next.window.absorb(&previous.window, now);
        }
        Box::new(next)
    }

    fn enabled(&self) -> bool {
        self.config.enabled
    }

    fn recovery(&self) -> RecoverySchedule {
        self.config.recovery
    }

    fn trial_period(&self) -> Duration {
        self.config.window.span()
    }

    fn budget(&self) -> Option<Budget> {
        Some(self.config.budget)
    }
}

/// One endpoint's error-rate window.
#[derive(Debug)]
pub struct ErrorRateEndpoint {
    // Copied from the configuration so the hot path touches only this endpoint's memory.
    enabled: bool,
    min_calls: u64,
    threshold: f64,
    window: Window,
    // Set when the rate is above the threshold but the window is short of the minimum: the next
    // success may complete the minimum, so it must look at the window too.
    suspect: AtomicBool,
}

impl ErrorRateEndpoint {
    fn outlier(&self, counts: WindowCounts) -> bool {
        counts.calls >= self.min_calls && counts.failure_rate() > self.threshold
    }

    /// Whether the window, just recorded in, makes the endpoint an outlier. Kept out of
    /// `record` so that a plain success runs without the registers this needs.
    #[inline(never)]
    fn check(&self, now: Nanos) -> Signal {
        let counts = self.window.counts(now);
        if counts.calls < self.min_calls {
            store_if_changed(&self.suspect, counts.failure_rate() > self.threshold);
            return Signal::None;
        }
        store_if_changed(&self.suspect, false);
        if self.outlier(counts) {
            Signal::Evaluate
        } else {
            Signal::None
        }
    }
}

impl EndpointPolicy for ErrorRateEndpoint {
    #[inline]
    fn record(&self, observation: &Observation, now: Nanos) -> Signal {
        if !self.enabled {
            return Signal::None;
        }
        let failed = observation.outcome.is_failure();
        self.window.record(now, failed, false);
        // A success lowers the rate, so it can only cross the threshold by completing the
        // minimum; checking the window on failures and on suspect successes is enough.
        if !failed && !self.suspect.load(Ordering::Relaxed) {
            return Signal::None;
        }
        self.check(now)
    }

    fn judge(&self, now: Nanos) -> Judgement {
        let counts = self.window.counts(now);
        if self.enabled && self.outlier(counts) {
            Judgement::Outlier(Reason {
                policy: "error-rate",
                measure: "error rate",
                value: counts.failure_rate(),
                threshold: self.threshold,
                counts,
            })
        } else {
            Judgement::Healthy
        }
    }

    fn counts(&self, now: Nanos) -> WindowCounts {
        self.window.counts(now)
    }

    fn calls_wanted(&self, now: Nanos) -> u64 {
        if !self.enabled {
            return 0;
        }
        let counts = self.window.counts(now);
        if counts.calls < self.min_calls && counts.failure_rate() > self.threshold {
            self.min_calls - counts.calls
        } else {
            0
        }
    }

    fn trial_calls(&self) -> u64 {
        if self.enabled {
            self.min_calls
        } else {
            0
        }
    }

    fn reset(&self) {
        self.window.clear();
        self.suspect.store(false, Ordering::Relaxed);
    }
}
