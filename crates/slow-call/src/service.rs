//! The standalone breaker service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_outlier_core::{Classify, Clock};
use tower_service::Service;

use crate::breaker::{Admission, Breaker, State};
use crate::error::BrokenCircuit;
use crate::future::ResponseFuture;

pub(crate) struct Shared<C> {
    pub(crate) breaker: Breaker,
    pub(crate) classifier: C,
    pub(crate) clock: Clock,
}

/// A service guarded by a circuit breaker; built by
/// [`CircuitBreakerLayer`](crate::CircuitBreakerLayer).
///
/// Its error type is `tower::BoxError`: the inner service's errors, boxed, or
/// [`BrokenCircuit`] when the breaker rejected the call.
pub struct CircuitBreaker<S, C> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S, C> CircuitBreaker<S, C> {
    pub(crate) fn new(inner: S, breaker: Breaker, classifier: C, clock: Clock) -> Self {
        CircuitBreaker {
            inner,
            shared: Arc::new(Shared {
                breaker,
                classifier,
                clock,
            }),
        }
    }

    /// The breaker's current state.
    pub fn state(&self) -> State {
        self.shared.breaker.state()
    }

    /// The breaker's statistics interval as it stands now.
    pub fn counts(&self) -> tower_outlier_core::WindowCounts {
        self.shared.breaker.counts(self.shared.clock.now())
    }

    /// The breaker itself.
    pub fn breaker(&self) -> &Breaker {
        &self.shared.breaker
    }

    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, C> Clone for CircuitBreaker<S, C> {
    fn clone(&self) -> Self {
        CircuitBreaker {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for CircuitBreaker<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("breaker", &self.shared.breaker)
            .finish()
    }
}

impl<S, C, Req> Service<Req> for CircuitBreaker<S, C>
where
    S: Service<Req>,
    S::Error: Into<tower_outlier_core::BoxError>,
    C: Classify<S::Response, S::Error>,
{
    type Response = S::Response;
    type Error = tower_outlier_core::BoxError;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is the inner service's: an open breaker fails calls, it does not stall them.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        let now = self.shared.clock.now();
        match self.shared.breaker.acquire(now) {
            Admission::Rejected => {
                ResponseFuture::rejected(BrokenCircuit::new(self.shared.breaker.state()))
            }
            admission => ResponseFuture::called(
                self.inner.call(request),
                self.shared.clone(),
                admission,
                now,
            ),
        }
    }
}
