//! The breaker as an outlier policy: one breaker per endpoint.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_outlier_core::{
    Admit, Clock, Comparison, Description, EndpointPolicy, Judgement, Nanos, Observation,
    OutlierPolicy, OwnTiming, ProbeGate, Reason, RecoverySchedule, Signal,
};

use crate::breaker::{Admission, Breaker, Observer, State, StateChange};
use crate::config::{BreakerConfig, Strategy};

/// The slow-call breaker as a policy of `tower_outlier::OutlierDetectionLayer`: every endpoint
/// gets its own breaker.
///
/// * When an endpoint's breaker opens, the endpoint is ejected, spending from the layer's shared
///   budget (never the last available endpoint).
/// * After the open duration it is re-admitted for exactly one probe: its readiness admits one
///   request and then stays `Pending` (with a waker) until that request decides. A fast, successful
///   probe closes the breaker; a slow or failed one re-opens it and the endpoint is ejected again
///   for another open duration.
/// * If the budget refuses the ejection, the endpoint stays in rotation and serves normally.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::OutlierPolicy;
/// use tower_outlier_slow_call::{BreakerConfig, SlowCallPolicy};
///
/// let policy = SlowCallPolicy::new(
///     BreakerConfig::slow_ratio(Duration::from_millis(200))
///         .ratio(0.5)
///         .min_requests(10)
///         .open_duration(Duration::from_secs(5))
///         .build()?,
/// );
/// assert_eq!(policy.name(), "slow-call");
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct SlowCallPolicy {
    config: BreakerConfig,
    observers: Vec<Observer>,
}

impl SlowCallPolicy {
    /// The policy's name ([`OutlierPolicy::name`]): in logs, snapshots, metrics, events and
    /// [`Reason::policy`](tower_outlier_core::Reason::policy).
    pub const NAME: &'static str = "slow-call";

    /// A policy giving each endpoint a breaker with `config`.
    pub fn new(config: BreakerConfig) -> Self {
        SlowCallPolicy {
            config,
            observers: Vec::new(),
        }
    }

    /// Registers a callback told of every endpoint breaker's state changes. It runs on the
    /// process's breaker-observer thread, never on the task of the call that changed the state,
    /// as [`CircuitBreakerLayer::on_state_change`](crate::CircuitBreakerLayer::on_state_change)
    /// describes (shared by every breaker: keep it quick);
    /// [`wait_for_state_observers`](crate::wait_for_state_observers) waits until it has run.
    pub fn on_state_change(
        mut self,
        observer: impl Fn(&StateChange) + Send + Sync + 'static,
    ) -> Self {
        self.observers.push(Arc::new(observer));
        self
    }

    /// The same policy (its state-change callbacks) with the rule `config` (what a
    /// reconfiguration of a running layer uses).
    pub fn with_config(&self, config: BreakerConfig) -> Self {
        SlowCallPolicy {
            config,
            observers: self.observers.clone(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }
}

impl std::fmt::Debug for SlowCallPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowCallPolicy")
            .field("config", &self.config)
            .field("observers", &self.observers.len())
            .finish()
    }
}

impl OutlierPolicy for SlowCallPolicy {
    type Endpoint = SlowCallEndpoint;

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn new_endpoint(&self) -> SlowCallEndpoint {
        SlowCallEndpoint {
            breaker: Breaker::with_observers(self.config.clone(), self.observers.clone().into()),
        }
    }

    /// Sentinel's reload: an endpoint whose breaker follows the same rule keeps it, state and
    /// counts; a changed rule starts a fresh breaker, closed.
    fn new_endpoint_from(&self, previous: &SlowCallEndpoint, now: Nanos) -> SlowCallEndpoint {
        let next = OutlierPolicy::new_endpoint(self);
        if previous.breaker.follows(&self.config) {
            next.breaker.take_over(&previous.breaker, now);
        }
        next
    }

    fn recovery(&self) -> RecoverySchedule {
        // Sentinel re-opens for a full open duration after each failed probe: no growth.
        RecoverySchedule::fixed(self.config.open_duration)
    }

    fn trial_period(&self) -> Duration {
        self.config.window()
    }
}

/// One endpoint's breaker: [`SlowCallPolicy`]'s state for an endpoint.
#[derive(Debug)]
pub struct SlowCallEndpoint {
    breaker: Breaker,
}

fn signal(open: bool) -> Signal {
    if open {
        Signal::Evaluate
    } else {
        Signal::None
    }
}

impl EndpointPolicy for SlowCallEndpoint {
    #[inline]
    fn record(&self, observation: &Observation, now: Nanos) -> Signal {
        signal(self.breaker.complete(Admission::Call, observation, now))
    }

    fn judge(&self, now: Nanos) -> Judgement {
        // Only an open breaker still inside its open duration is an outlier: once the duration is
        // over, the endpoint must be back in rotation for its probe.
        if self.breaker.state() != State::Open || now >= self.breaker.open_until() {
            return Judgement::Healthy;
        }
        let (measure, threshold) = match self.breaker.strategy() {
            Strategy::SlowRatio { ratio, .. } => ("slow-call ratio", ratio),
            Strategy::ErrorRatio { ratio } => ("error ratio", ratio),
            Strategy::ErrorCount { count } => ("error count", count as f64),
        };
        Judgement::Outlier(Reason {
            policy: SlowCallPolicy::NAME,
            measure,
            value: self.breaker.last_trigger(),
            threshold,
            // Sentinel's rules trip strictly above their threshold (`slowRatio > ratio`).
            comparison: Comparison::Above,
            counts: self.breaker.counts(now),
        })
    }

    fn describe(&self, now: Nanos) -> Description {
        Description {
            counts: self.breaker.counts(now),
            state: Some(match self.breaker.state() {
                State::Closed => "CLOSED",
                State::Open => "OPEN",
                State::HalfOpen => "HALF_OPEN",
            }),
            weight: None,
            judged: None,
        }
    }

    fn reset(&self) {
        // The breaker's own state machine decides re-admission through its probe.
    }

    fn own_timing(&self) -> Option<&dyn OwnTiming> {
        Some(self)
    }

    fn gate(&self) -> Option<&dyn ProbeGate> {
        Some(self)
    }
}

/// The breaker times its own ejections: its open duration.
impl OwnTiming for SlowCallEndpoint {
    fn check_at(&self, _now: Nanos) -> Option<Nanos> {
        // The breaker owns its timing: the endpoint is checked (re-admitted for the half-open
        // probe) exactly when the open duration ends.
        (self.breaker.state() == State::Open).then(|| self.breaker.open_until())
    }
}

/// A half-open breaker admits exactly one call, the probe, and holds the others back until it
/// decides.
impl ProbeGate for SlowCallEndpoint {
    #[inline]
    fn poll_admit(&self, armed: bool, clock: &Clock, cx: &mut Context<'_>) -> Poll<Admit> {
        if armed {
            return Poll::Ready(Admit::Probe);
        }
        if self.breaker.state() == State::Closed {
            return Poll::Ready(Admit::Call);
        }
        self.breaker
            .poll_acquire(clock.now(), cx)
            .map(|admission| match admission {
                Admission::Probe => Admit::Probe,
                // Still open but in rotation: the budget refused the ejection, so it serves.
                Admission::Call | Admission::Rejected => Admit::Call,
            })
    }

    fn record_probe(&self, observation: &Observation, now: Nanos) -> Signal {
        self.breaker.complete(Admission::Probe, observation, now);
        // A probe always changes the breaker's state (closed, or open again): the layer looks, so
        // it can eject again or report the change. Probes are rare; this costs one wake-up each.
        Signal::Evaluate
    }

    fn probe_cancelled(&self, now: Nanos) {
        self.breaker.probe_cancelled(now);
    }
}
