//! Failing calls at once while the rules leave the balancer no endpoint to pick
//! ([`WhenAllOut::FailFast`](crate::WhenAllOut)): what gRPC does when every address is ejected
//! and linkerd while every endpoint's breaker is open. tower's balancers wait for an endpoint
//! instead; this guard in front of one turns that wait into an error.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower::{BoxError, Layer, Service};

use crate::monitor::Registry;

/// Builds [`FailFast`] guards for the balancers of one layer: take it from
/// [`OutlierDetectionLayer::fail_fast`](crate::OutlierDetectionLayer::fail_fast) and put it in
/// front of the balancer.
#[derive(Clone)]
pub struct FailFastLayer {
    registry: Arc<Registry>,
}

impl FailFastLayer {
    pub(crate) fn new(registry: Arc<Registry>) -> Self {
        FailFastLayer { registry }
    }
}

impl fmt::Debug for FailFastLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailFastLayer").finish_non_exhaustive()
    }
}

impl<S> Layer<S> for FailFastLayer {
    type Service = FailFast<S>;

    fn layer(&self, inner: S) -> FailFast<S> {
        FailFast {
            inner,
            registry: self.registry.clone(),
            failing: false,
        }
    }
}

/// A balancer that answers [`NoEndpointAvailable`] at once while its layer's rules leave it no
/// endpoint to pick, instead of waiting for one. It still polls the balancer every time (which
/// drives the layer's timers and re-admissions), and serves through it as soon as it is ready.
/// With one adaptor per layer, as a `ServiceBuilder` stack builds, "no endpoint" is that
/// balancer's; a layer shared by several balancers fails calls while any of them has none. An
/// upstream that holds no endpoint at all (before discovery's first answer, say) is the
/// upstream's state, not the rules': the guard waits with the balancer then.
#[derive(Clone)]
pub struct FailFast<S> {
    inner: S,
    registry: Arc<Registry>,
    // The balancer was not ready and had no endpoint: the next call fails.
    failing: bool,
}

impl<S: fmt::Debug> fmt::Debug for FailFast<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailFast")
            .field("inner", &self.inner)
            .field("failing", &self.failing)
            .finish()
    }
}

impl<S, Req> Service<Req> for FailFast<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = FailFastFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self.inner.poll_ready(cx) {
            Poll::Ready(ready) => {
                self.failing = false;
                Poll::Ready(ready.map_err(Into::into))
            }
            // The balancer registered the waker: an endpoint back wakes this task.
            Poll::Pending if self.registry.nothing_to_pick.load(Ordering::Acquire) > 0 => {
                self.failing = true;
                Poll::Ready(Ok(()))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, request: Req) -> Self::Future {
        if std::mem::take(&mut self.failing) {
            drop(request);
            return FailFastFuture::failed();
        }
        FailFastFuture::inner(self.inner.call(request))
    }
}

pin_project! {
    /// The response future of [`FailFast`].
    pub struct FailFastFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // Through the balancer.
        Inner { #[pin] future: F },
        // Failed at once: no endpoint to pick.
        Failed,
    }
}

impl<F> FailFastFuture<F> {
    fn inner(future: F) -> Self {
        FailFastFuture {
            state: State::Inner { future },
        }
    }

    fn failed() -> Self {
        FailFastFuture {
            state: State::Failed,
        }
    }
}

impl<F, T, E> Future for FailFastFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => future.poll(cx).map_err(Into::into),
            StateProj::Failed => Poll::Ready(Err(Box::new(NoEndpointAvailable::new()))),
        }
    }
}

impl<F> fmt::Debug for FailFastFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailFastFuture").finish_non_exhaustive()
    }
}

/// The error of a call [`FailFast`] failed: every endpoint is out of the balancer's set. The
/// classifiers tell it from an endpoint's failure
/// ([`error_outcome`](tower_outlier_core::classify::error_outcome)), so an outer layer whose
/// endpoints are inner balancers does not eject one for it.
pub use tower_outlier_core::classify::NoEndpointAvailable;
