//! The error-rate policy and its per-endpoint state.

use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::{
    CallsNeeded, Comparison, Description, EjectionBudget, EndpointPolicy, Judgement, Nanos,
    Observation, OutlierPolicy, Reason, RecoverySchedule, SharedWindow, Signal, WindowCounts,
};

use crate::config::ErrorRateConfig;

/// Error-rate ejection (EDAS / HSF): an endpoint whose error rate over the window is strictly
/// greater than the threshold, once the window holds the minimum number of calls, is an outlier.
///
/// ```
/// use tower_outlier_core::OutlierPolicy;
/// use tower_outlier_error_rate::{ErrorRateConfig, ErrorRatePolicy};
///
/// let policy = ErrorRatePolicy::new(ErrorRateConfig::hsf().build().unwrap());
/// assert_eq!(policy.name(), "error-rate");
/// ```
#[derive(Clone, Debug)]
pub struct ErrorRatePolicy {
    config: Arc<ErrorRateConfig>,
}

impl ErrorRatePolicy {
    /// The policy's name ([`OutlierPolicy::name`]): in logs, snapshots, metrics, events and
    /// [`Reason::policy`](tower_outlier_core::Reason::policy).
    pub const NAME: &'static str = "error-rate";

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

    /// The state of one endpoint, on its own (the layer calls [`OutlierPolicy::new_endpoint`]).
    pub fn endpoint(&self) -> ErrorRateEndpoint {
        ErrorRateEndpoint {
            enabled: self.config.enabled,
            min_calls: self.config.min_calls,
            threshold: self.config.threshold,
            shared: Arc::new(SharedWindow::new(self.config.window.window())),
        }
    }
}

impl OutlierPolicy for ErrorRatePolicy {
    type Endpoint = ErrorRateEndpoint;

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn new_endpoint(&self) -> ErrorRateEndpoint {
        self.endpoint()
    }

    /// Keeps the endpoint's window: its calls count under the new threshold and minimum at once
    /// (a new window size takes them over as they are; see
    /// [`Window::absorb`](tower_outlier_core::Window::absorb)).
    fn new_endpoint_from(&self, previous: &ErrorRateEndpoint, now: Nanos) -> ErrorRateEndpoint {
        let next = self.endpoint();
        next.window().absorb(previous.window(), now);
        // Above the new threshold but short of the new minimum, the next success may complete
        // the minimum: it must come to `record` to be checked.
        let counts = next.window().counts(now);
        next.shared.set_watching(
            next.enabled && counts.calls < next.min_calls && counts.failure_rate() > next.threshold,
        );
        next
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

    fn budget(&self) -> Option<EjectionBudget> {
        Some(self.config.budget)
    }

    fn judges_by_host(&self) -> bool {
        self.config.ip_dimension
    }
}

/// One endpoint's error-rate window.
#[derive(Debug)]
pub struct ErrorRateEndpoint {
    // Copied from the configuration so the hot path touches only this endpoint's memory.
    enabled: bool,
    min_calls: u64,
    threshold: f64,
    // The window, shared with the endpoint's record, which counts successes in it itself unless
    // it is watching. Watching while the rate is above the threshold but the window is short of
    // the minimum: the next success may complete the minimum, so it must come here to look at
    // the window too.
    shared: Arc<SharedWindow>,
}

impl ErrorRateEndpoint {
    fn window(&self) -> &tower_outlier_core::Window {
        self.shared.window()
    }

    fn outlier(&self, counts: WindowCounts) -> bool {
        counts.calls >= self.min_calls && counts.failure_rate() > self.threshold
    }

    /// Whether the window, just recorded in, makes the endpoint an outlier. Out of line: only
    /// failures and successes while watching need it.
    #[inline(never)]
    fn check(&self, now: Nanos) -> Signal {
        let counts = self.window().counts(now);
        if counts.calls < self.min_calls {
            self.shared
                .set_watching(counts.failure_rate() > self.threshold);
            return Signal::None;
        }
        self.shared.set_watching(false);
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
        // Everything that comes here is this state's to count: the record counts successes
        // itself only while the shared window is not watching, and then does not call this.
        let failed = observation.outcome.is_failure();
        self.window().record(now, failed, false);
        // A success lowers the rate, so it can only cross the threshold by completing the
        // minimum; checking the window on failures and on successes while watching is enough.
        if !failed && !self.shared.watching() {
            return Signal::None;
        }
        self.check(now)
    }

    fn judge(&self, now: Nanos) -> Judgement {
        let counts = self.window().counts(now);
        if self.enabled && self.outlier(counts) {
            Judgement::Outlier(Reason {
                policy: ErrorRatePolicy::NAME,
                measure: "error rate",
                value: counts.failure_rate(),
                threshold: self.threshold,
                // EDAS ejects strictly above its threshold.
                comparison: Comparison::Above,
                counts,
            })
        } else {
            Judgement::Healthy
        }
    }

    fn describe(&self, now: Nanos) -> Description {
        Description {
            counts: self.window().counts(now),
            ..Description::default()
        }
    }

    fn calls_needed(&self) -> Option<&dyn CallsNeeded> {
        Some(self)
    }

    fn reset(&self) {
        self.window().clear();
        self.shared.set_watching(false);
    }

    /// The window, while the policy is enabled (a disabled one counts nothing).
    fn shared_window(&self) -> Option<Arc<SharedWindow>> {
        self.enabled.then(|| self.shared.clone())
    }
}

/// The calls an error-rate judgement needs: the window's minimum.
impl CallsNeeded for ErrorRateEndpoint {
    fn calls_wanted(&self, now: Nanos) -> u64 {
        if !self.enabled {
            return 0;
        }
        let counts = self.window().counts(now);
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tower_outlier_core::{FailureKind, Outcome};

    use super::*;

    fn call(state: &dyn EndpointPolicy, outcome: Outcome, now: Nanos) -> Signal {
        state.record(
            &Observation {
                outcome,
                latency: Duration::from_millis(1),
            },
            now,
        )
    }

    #[test]
    fn new_rules_watch_the_success_that_may_complete_their_minimum() {
        let strict = ErrorRatePolicy::new(ErrorRateConfig::hsf().min_calls(20).build().unwrap());
        let state = strict.new_endpoint();
        let now = 1_000_000_000;
        for _ in 0..4 {
            call(&state, Outcome::Failure(FailureKind::Timeout), now);
        }
        call(&state, Outcome::Success, now);
        // 4 of 5 failed: above 0.5 but short of 20. The new rules ask for 6.
        let lenient = ErrorRatePolicy::new(ErrorRateConfig::hsf().min_calls(6).build().unwrap());
        let next = lenient.new_endpoint_from(&state, now);
        let shared = next
            .shared_window()
            .expect("an enabled error-rate state shares its window");
        assert!(shared.watching(), "the next success must reach `record`");
        assert_eq!(call(&next, Outcome::Success, now), Signal::Evaluate);
        // Under rules the window already satisfies or cannot breach, nothing is watched.
        let calm = ErrorRatePolicy::new(
            ErrorRateConfig::hsf()
                .error_rate_threshold(0.9)
                .build()
                .unwrap(),
        );
        let next = calm.new_endpoint_from(&state, now);
        assert!(!next.shared_window().unwrap().watching());
    }
}
