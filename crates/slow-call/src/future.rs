//! The standalone breaker's response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_outlier_core::{BoxError, Nanos};

use crate::breaker::Admission;
use crate::classify::{BreakerClassifier, PendingCall};
use crate::error::BrokenCircuit;
use crate::shared::Lane;

pin_project! {
    /// The response future of a [`CircuitBreaker`](crate::CircuitBreaker).
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F>,
        completion: Option<PendingCall<C>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Called { #[pin] future: F },
        Rejected { error: Option<BrokenCircuit> },
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn called(
        future: F,
        lane: Arc<Lane<C>>,
        admission: Admission,
        start: Nanos,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Called { future },
            completion: Some(PendingCall::new(lane, admission, start)),
        }
    }

    pub(crate) fn rejected(error: BrokenCircuit) -> Self {
        ResponseFuture {
            kind: Kind::Rejected { error: Some(error) },
            completion: None,
        }
    }
}

impl<F, C, T, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    C: BreakerClassifier<T, E>,
{
    type Output = Result<C::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Rejected { error } => Poll::Ready(Err(match error.take() {
                Some(error) => error.into(),
                None => BrokenCircuit::new(crate::State::Open).into(),
            })),
            KindProj::Called { future } => {
                let result = std::task::ready!(future.poll(cx));
                let Some(call) = this.completion.take() else {
                    // Polled again after completing, against `Future`'s contract.
                    return Poll::Ready(Err(
                        "the breaker's response future was polled after it completed".into(),
                    ));
                };
                // A classifier of one's own is user code: one that panics gets the caller an
                // error, logged, and the dropped call gives a probe's slot back.
                let complete = std::panic::AssertUnwindSafe(|| C::complete(result, call));
                Poll::Ready(match std::panic::catch_unwind(complete) {
                    Ok(completed) => completed.map_err(Into::into),
                    Err(panic) => {
                        tracing::error!(
                            target: "tower_outlier::breaker",
                            panic = tower_outlier_core::panic_message(&*panic),
                            "the classifier panicked: the call is not recorded"
                        );
                        tower_outlier_core::drop_panic(panic);
                        Err("the circuit breaker's classifier panicked".into())
                    }
                })
            }
        }
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("done", &self.completion.is_none())
            .finish_non_exhaustive()
    }
}
