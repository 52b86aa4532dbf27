//! The breaker: Sentinel's CLOSED → OPEN → HALF_OPEN state machine, lock-free.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use tower_outlier_core::{
    duration_to_nanos, store_if_changed, Nanos, Observation, Window, WindowCounts,
};

use crate::config::{BreakerConfig, Strategy};

/// A circuit breaker with Sentinel's degrade semantics.
///
/// * In CLOSED, after each completion: with fewer calls than the minimum in the interval nothing
///   happens; otherwise the breaker opens when the strategy's measure is strictly greater than its
///   threshold (or, for the slow-call ratio at 1.0, when every call was slow).
/// * OPEN rejects every call until the open duration has passed; then exactly one call is admitted
///   as the probe ([`Admission::Probe`]) and the breaker is HALF_OPEN.
/// * The probe's completion alone decides: slow or failed re-opens for a full open duration,
///   otherwise the breaker closes and the statistics restart. A probe that is dropped before it
///   completes returns the breaker to OPEN with the open duration already over, so the next call
///   probes again.
///
/// Admission and recording take no lock and allocate nothing. A state change is handed to one
/// thread per process that logs it through `tracing` and runs the observers, in the order the
/// changes were handed over, each under `catch_unwind`, inside the caller's runtime and span (the
/// hand-off takes no lock; the channel allocates a block every 31 changes); the caller's task
/// never runs them. [`wait_for_state_observers`](crate::wait_for_state_observers)
/// waits until they have run.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::{Observation, Outcome};
/// use tower_outlier_slow_call::{Admission, Breaker, BreakerConfig, State};
///
/// let config = BreakerConfig::error_count(2).min_requests(1).open_duration(Duration::from_secs(5)).build()?;
/// let breaker = Breaker::new(config);
/// let failed = Observation { outcome: Outcome::Failure(tower_outlier_core::FailureKind::Transport), latency: Duration::ZERO };
/// for _ in 0..3 {
///     assert_eq!(breaker.acquire(0), Admission::Call);
///     breaker.complete(Admission::Call, &failed, 0);
/// }
/// assert_eq!(breaker.state(), State::Open);
/// assert_eq!(breaker.acquire(4_999_999_999), Admission::Rejected);
/// assert_eq!(breaker.acquire(5_000_000_000), Admission::Probe);
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
pub struct Breaker {
    state: AtomicU8,
    open_until: AtomicU64,
    // f64 bits of the value that last opened the breaker.
    last_trigger: AtomicU64,
    window: Window,
    // Set when the measure is over its threshold but the interval is short of the minimum: then a
    // call that does not count towards the measure may still complete the minimum, so it must
    // check too. Otherwise only calls that count (slow, or failed) can trip the breaker.
    suspect: AtomicBool,
    strategy: Strategy,
    max_rt_nanos: u64,
    min_requests: u64,
    open_nanos: u64,
    observers: Arc<[Observer]>,
    // Woken when a probe decides, for callers whose readiness waits on it.
    probe_done: AtomicWaker,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self::with_observers(config, Arc::new([]))
    }

    /// A closed breaker that tells `observers` of every state change.
    pub fn with_observers(config: BreakerConfig, observers: Arc<[Observer]>) -> Self {
        let max_rt_nanos = match config.strategy {
            Strategy::SlowRatio { max_rt, .. } => duration_to_nanos(max_rt),
            _ => u64::MAX,
        };
        Breaker {
            state: AtomicU8::new(CLOSED),
            open_until: AtomicU64::new(0),
            last_trigger: AtomicU64::new(0f64.to_bits()),
            window: config.interval.window_counting_slow(),
            suspect: AtomicBool::new(false),
            strategy: config.strategy,
            max_rt_nanos,
            min_requests: config.min_requests,
            open_nanos: duration_to_nanos(config.open_duration),
            observers,
            probe_done: AtomicWaker::new(),
        }
    }

    /// Whether this breaker was made for `config`'s rule (the same strategy, thresholds, interval
    /// and open duration).
    pub fn follows(&self, config: &BreakerConfig) -> bool {
        self.strategy == config.strategy
            && self.min_requests == config.min_requests
            && self.open_nanos == duration_to_nanos(config.open_duration)
            && self.window.span() == config.interval.span()
            && self.window.buckets() == config.interval.buckets()
    }

    /// Takes over `previous`'s state and interval counts (a rule reloaded unchanged keeps its
    /// breaker, as Sentinel does). A probe in flight answers to `previous`, so a half-open
    /// breaker is taken over as open and due: the next call is a new probe.
    pub fn take_over(&self, previous: &Breaker, now: Nanos) {
        let state = previous.state.load(Ordering::Acquire);
        let (state, open_until) = if state == HALF_OPEN {
            (OPEN, now)
        } else {
            (state, previous.open_until.load(Ordering::Relaxed))
        };
        self.open_until.store(open_until, Ordering::Relaxed);
        self.last_trigger.store(
            previous.last_trigger.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.window.absorb(&previous.window, now);
        self.suspect
            .store(previous.suspect.load(Ordering::Relaxed), Ordering::Relaxed);
        self.state.store(state, Ordering::Release);
    }

    /// The current state.
    pub fn state(&self) -> State {
        state_of(self.state.load(Ordering::Acquire))
    }

    /// When the breaker may admit its probe (meaningful while OPEN).
    pub fn open_until(&self) -> Nanos {
        self.open_until.load(Ordering::Acquire)
    }

    /// The value that last opened the breaker: the measure that tripped it from CLOSED, or the
    /// failed probe's latency in milliseconds.
    pub fn last_trigger(&self) -> f64 {
        f64::from_bits(self.last_trigger.load(Ordering::Relaxed))
    }

    /// The strategy this breaker applies.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The interval's counts at `now`.
    pub fn counts(&self, now: Nanos) -> WindowCounts {
        self.window.counts(now)
    }

    /// Asks to make a call at `now`.
    #[inline]
    pub fn acquire(&self, now: Nanos) -> Admission {
        match self.state.load(Ordering::Acquire) {
            CLOSED => Admission::Call,
            OPEN if now >= self.open_until.load(Ordering::Acquire) => {
                if self
                    .state
                    .compare_exchange(OPEN, HALF_OPEN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    self.changed(State::Open, State::HalfOpen, None, None);
                    Admission::Probe
                } else {
                    Admission::Rejected
                }
            }
            _ => Admission::Rejected,
        }
    }

    /// Readiness for callers that wait instead of failing: `Ready(admission)` when a call may go
    /// (an ordinary call or the probe), `Pending` while the probe is in flight (woken when it
    /// decides). While OPEN it returns `Ready(Rejected)`: the caller decides what an open breaker
    /// means (the outlier layer ejects the endpoint; the standalone layer fails fast).
    pub fn poll_acquire(&self, now: Nanos, cx: &mut Context<'_>) -> Poll<Admission> {
        match self.acquire(now) {
            Admission::Rejected if self.state.load(Ordering::Acquire) == HALF_OPEN => {
                self.probe_done.register(cx.waker());
                // The probe may have decided between the check and the registration.
                match self.acquire(now) {
                    Admission::Rejected if self.state.load(Ordering::Acquire) == HALF_OPEN => {
                        Poll::Pending
                    }
                    admission => Poll::Ready(admission),
                }
            }
            admission => Poll::Ready(admission),
        }
    }

    /// Whether `observation` counts as slow under this breaker's strategy.
    #[inline]
    pub fn is_slow(&self, observation: &Observation) -> bool {
        duration_to_nanos(observation.latency) > self.max_rt_nanos
    }

    /// Records the completion of a call admitted as `admission` at `now`.
    ///
    /// Returns whether the breaker is open after it (the outlier layer ejects on that).
    #[inline]
    pub fn complete(&self, admission: Admission, observation: &Observation, now: Nanos) -> bool {
        let failed = observation.outcome.is_failure();
        let slow = self.is_slow(observation);
        match admission {
            Admission::Call => {
                if self.state.load(Ordering::Acquire) != CLOSED {
                    // Admitted before the breaker opened: the statistics restart on closing, so
                    // late completions have nothing left to count towards.
                    return false;
                }
                self.window.record(now, failed, slow);
                let counts_towards = match self.strategy {
                    Strategy::SlowRatio { .. } => slow,
                    Strategy::ErrorRatio { .. } | Strategy::ErrorCount { .. } => failed,
                };
                if counts_towards || self.suspect.load(Ordering::Relaxed) {
                    return self.check(now);
                }
                false
            }
            Admission::Probe => {
                let value = Some(observation.latency.as_secs_f64() * 1_000.0);
                if failed || slow {
                    if let Some(latency) = value {
                        self.last_trigger
                            .store(latency.to_bits(), Ordering::Relaxed);
                    }
                    self.open_until
                        .store(now.saturating_add(self.open_nanos), Ordering::Release);
                    if self
                        .state
                        .compare_exchange(HALF_OPEN, OPEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        self.changed(State::HalfOpen, State::Open, value, None);
                    }
                } else {
                    self.window.clear();
                    self.suspect.store(false, Ordering::Relaxed);
                    if self
                        .state
                        .compare_exchange(HALF_OPEN, CLOSED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        self.changed(State::HalfOpen, State::Closed, value, None);
                    }
                }
                self.probe_done.wake();
                self.state.load(Ordering::Acquire) == OPEN
            }
            Admission::Rejected => false,
        }
    }

    /// The probe was dropped before it completed: back to OPEN, with the open duration over so
    /// the next call probes again.
    pub fn probe_cancelled(&self, now: Nanos) {
        self.open_until.store(now, Ordering::Release);
        if self
            .state
            .compare_exchange(HALF_OPEN, OPEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.changed(State::HalfOpen, State::Open, None, None);
        }
        self.probe_done.wake();
    }

    fn check(&self, now: Nanos) -> bool {
        let counts = self.window.counts(now);
        let (trip, value) = match self.strategy {
            Strategy::SlowRatio { ratio, .. } => {
                let measured = counts.slow_rate();
                let all_slow = ratio >= 1.0 && counts.slow == counts.calls;
                (measured > ratio || all_slow, measured)
            }
            Strategy::ErrorRatio { ratio } => {
                let measured = counts.failure_rate();
                (measured > ratio, measured)
            }
            Strategy::ErrorCount { count } => (counts.failures > count, counts.failures as f64),
        };
        if counts.calls < self.min_requests {
            store_if_changed(&self.suspect, trip);
            return false;
        }
        store_if_changed(&self.suspect, false);
        if !trip {
            return false;
        }
        self.last_trigger.store(value.to_bits(), Ordering::Relaxed);
        self.open_until
            .store(now.saturating_add(self.open_nanos), Ordering::Release);
        if self
            .state
            .compare_exchange(CLOSED, OPEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.changed(State::Closed, State::Open, Some(value), Some(counts));
        }
        true
    }

    fn changed(&self, from: State, to: State, value: Option<f64>, counts: Option<WindowCounts>) {
        let change = StateChange {
            from,
            to,
            value,
            counts,
        };
        observe::changed(&self.observers, change, self.strategy);
    }

    /// The open duration.
    pub fn open_duration(&self) -> Duration {
        Duration::from_nanos(self.open_nanos)
    }
}

pub(crate) struct StrategyDisplay(pub(crate) Strategy);

impl fmt::Display for StrategyDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("state", &self.state())
            .field("strategy", &self.strategy)
            .field("min_requests", &self.min_requests)
            .field("open_duration", &self.open_duration())
            .finish_non_exhaustive()
    }
}

mod observe;
mod state;

pub use observe::{state_observers_told, wait_for_state_observers};
use state::*;
pub use state::{Admission, Observer, State, StateChange};
