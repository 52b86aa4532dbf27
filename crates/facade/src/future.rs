//! The endpoint's response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower_outlier_core::{Classify, Nanos, Observation, Outcome, ProbePermits};

use crate::endpoint::Shared;

pin_project! {
    /// The response future of an [`Endpoint`](crate::Endpoint).
    ///
    /// When the inner future completes, the result is classified and recorded with its latency.
    /// If this future is dropped first, nothing is recorded: the call counts as cancelled.
    pub struct ResponseFuture<F, C> {
        #[pin]
        inner: F,
        completion: Completion<C>,
        start: Nanos,
    }
}

/// The record to report to, taken when the outcome is recorded so it is recorded once; dropped
/// unrecorded, it gives back the call's probe permits.
struct Completion<C> {
    shared: Option<Arc<Shared<C>>>,
    probes: ProbePermits,
}

impl<C> Drop for Completion<C> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.record.cancel_probes(self.probes);
        }
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn new(
        inner: F,
        shared: Arc<Shared<C>>,
        start: Nanos,
        probes: ProbePermits,
    ) -> Self {
        ResponseFuture {
            inner,
            completion: Completion {
                shared: Some(shared),
                probes,
            },
            start,
        }
    }
}

impl<F, C, T, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<T, E>>,
    C: Classify<T, E>,
{
    type Output = Result<T, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        if let Some(shared) = this.completion.shared.take() {
            let record = &shared.record;
            let now = record.clock().now();
            let outcome = shared.classifier.classify(result.as_ref());
            if outcome != Outcome::Cancelled {
                let observation = Observation {
                    outcome,
                    latency: Duration::from_nanos(now.saturating_sub(*this.start)),
                };
                record.observe(&observation, now, this.completion.probes);
            } else {
                record.cancel_probes(this.completion.probes);
            }
        }
        Poll::Ready(result)
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("done", &self.completion.shared.is_none())
            .finish_non_exhaustive()
    }
}
