//! A breaker's state, its changes, and what it admits.

use std::fmt;
use std::sync::Arc;

use tower_outlier_core::WindowCounts;

/// A breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Calls pass; completions are counted.
    Closed,
    /// Calls are rejected until the open duration has passed.
    Open,
    /// One probe call is in flight; every other call is rejected until it completes.
    HalfOpen,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Closed => "CLOSED",
            State::Open => "OPEN",
            State::HalfOpen => "HALF_OPEN",
        })
    }
}

pub(super) const CLOSED: u8 = 0;
pub(super) const OPEN: u8 = 1;
pub(super) const HALF_OPEN: u8 = 2;

pub(super) fn state_of(raw: u8) -> State {
    match raw {
        CLOSED => State::Closed,
        OPEN => State::Open,
        _ => State::HalfOpen,
    }
}

/// A state change, as observers receive it.
#[derive(Clone, Debug, PartialEq)]
pub struct StateChange {
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// The value that triggered the change: the slow-call ratio, error ratio or error count that
    /// opened the breaker, or the probe's latency in milliseconds that closed or re-opened it.
    /// `None` for the time-driven OPEN → HALF_OPEN.
    pub value: Option<f64>,
    /// The interval's counts when the breaker opened from CLOSED.
    pub counts: Option<WindowCounts>,
}

/// A callback told of every state change.
pub type Observer = Arc<dyn Fn(&StateChange) + Send + Sync>;

/// Whether a call may go ahead, and as what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Closed: an ordinary call.
    Call,
    /// The single half-open probe: its completion alone decides.
    Probe,
    /// Open, or a probe is already in flight.
    Rejected,
}
