//! The standalone breaker's response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower_outlier_core::{BoxError, Classify, Nanos, Observation, Outcome};

use crate::breaker::Admission;
use crate::error::BrokenCircuit;
use crate::service::Lane;

pin_project! {
    /// The response future of a [`CircuitBreaker`](crate::CircuitBreaker).
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F>,
        completion: Option<Completion<C>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Called { #[pin] future: F },
        Rejected { error: Option<BrokenCircuit> },
    }
}

/// What to report when the call completes; dropped unreported, a probe gives back its permit.
struct Completion<C> {
    // The calling handle's lane, not the shared state: see `Lane`.
    lane: Arc<Lane<C>>,
    admission: Admission,
    start: Nanos,
}

impl<C> Drop for Completion<C> {
    fn drop(&mut self) {
        if self.admission == Admission::Probe {
            let shared = &self.lane.shared;
            let now = shared.clock.now();
            shared.breaker.probe_cancelled(now);
        }
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
            completion: Some(Completion {
                lane,
                admission,
                start,
            }),
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
    C: Classify<T, E>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Rejected { error } => Poll::Ready(Err(match error.take() {
                Some(error) => error.into(),
                None => BrokenCircuit::new(crate::State::Open).into(),
            })),
            KindProj::Called { future } => {
                let result = std::task::ready!(future.poll(cx));
                if let Some(mut completion) = this.completion.take() {
                    let shared = &completion.lane.shared;
                    let now = shared.clock.now();
                    // The classifier is user code. One that panics leaves the call unrecorded;
                    // the guard, still armed, gives a probe's slot back as it drops.
                    let classify = std::panic::AssertUnwindSafe(|| {
                        shared.classifier.classify(result.as_ref())
                    });
                    let outcome = match std::panic::catch_unwind(classify) {
                        Ok(outcome) => outcome,
                        Err(panic) => {
                            tracing::error!(
                                target: "tower_outlier::breaker",
                                panic = crate::breaker::panic_text(&*panic),
                                "the classifier panicked: the call is not recorded"
                            );
                            return Poll::Ready(result.map_err(Into::into));
                        }
                    };
                    // Disarm the drop guard: this completion reports itself.
                    let admission =
                        std::mem::replace(&mut completion.admission, Admission::Rejected);
                    let shared = &completion.lane.shared;
                    if outcome == Outcome::Cancelled {
                        if admission == Admission::Probe {
                            shared.breaker.probe_cancelled(now);
                        }
                    } else {
                        let observation = Observation {
                            outcome,
                            latency: Duration::from_nanos(now.saturating_sub(completion.start)),
                        };
                        shared.breaker.complete(admission, &observation, now);
                    }
                }
                Poll::Ready(result.map_err(Into::into))
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
