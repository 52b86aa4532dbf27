//! The response future of an [`OutlierEndpoint`](crate::discover::OutlierEndpoint).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_outlier_core::{Nanos, ProbePermits};

use crate::response::{Recorder, ResponseClassifier};
use crate::shared::Lane;

pin_project! {
    /// The response future of an [`OutlierEndpoint`](crate::discover::OutlierEndpoint).
    ///
    /// When the inner future completes, its classifier records the outcome with its latency (or
    /// takes the call's [`Recorder`] into the response to record later, at the end of a gRPC
    /// body). If this future is dropped first, nothing is recorded: the call counts as cancelled.
    pub struct ResponseFuture<F, C> {
        #[pin]
        inner: F,
        completion: Completion<C>,
        start: Nanos,
    }
}

/// The record to report to and the classifier, taken when the future completes; dropped before,
/// it gives back the call's probe permits.
struct Completion<C> {
    parts: Option<(Arc<Lane>, C)>,
    probes: ProbePermits,
}

impl<C> Drop for Completion<C> {
    fn drop(&mut self) {
        if let Some((lane, _)) = self.parts.take() {
            lane.owner().record.cancel_probes(self.probes);
        }
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn new(
        inner: F,
        lane: Arc<Lane>,
        classifier: C,
        start: Nanos,
        probes: ProbePermits,
    ) -> Self {
        ResponseFuture {
            inner,
            completion: Completion {
                parts: Some((lane, classifier)),
                probes,
            },
            start,
        }
    }
}

impl<F, C, T, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<T, E>>,
    C: ResponseClassifier<T, E>,
{
    type Output = Result<C::Response, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if this.completion.parts.is_none() {
            // Polled after it completed. `Future` allows anything here but a panic is the
            // caller's to have, not ours: stay pending, as the trait permits.
            return Poll::Pending;
        }
        let result = std::task::ready!(this.inner.poll(cx));
        let Some((lane, classifier)) = this.completion.parts.take() else {
            return Poll::Pending;
        };
        let recorder = Recorder::new(lane, classifier, *this.start, this.completion.probes);
        Poll::Ready(C::complete(result, recorder))
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("done", &self.completion.parts.is_none())
            .finish_non_exhaustive()
    }
}
