//! The error a standalone breaker fails calls with.

use std::fmt;

use crate::breaker::State;

/// The call was rejected because the circuit breaker is open (or half-open with its single probe
/// in flight). The inner service was not called.
///
/// The standalone [`CircuitBreaker`](crate::CircuitBreaker) returns it boxed in a
/// `tower::BoxError`; find it with `error.downcast_ref::<BrokenCircuit>()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokenCircuit {
    state: State,
}

impl BrokenCircuit {
    pub(crate) fn new(state: State) -> Self {
        BrokenCircuit { state }
    }

    /// The breaker's state when the call was rejected: [`State::Open`] or [`State::HalfOpen`].
    pub fn state(&self) -> State {
        self.state
    }
}

impl fmt::Display for BrokenCircuit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.state {
            State::HalfOpen => f.write_str("circuit breaker is half-open: its probe is in flight"),
            _ => f.write_str("circuit breaker is open"),
        }
    }
}

impl std::error::Error for BrokenCircuit {}
