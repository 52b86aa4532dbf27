//! How the standalone breaker classifies a call: at once, from the response future's result, or
//! later (a gRPC status in the trailers, at the end of the response body).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::classify::{ClassifyFn, Immediate, Predicate};
use tower_outlier_core::{Classify, Nanos, NetworkErrors, Observation, Outcome, ServerErrors};

use crate::breaker::Admission;
use crate::shared::Lane;

/// Decides the outcome of a call through a [`CircuitBreaker`](crate::CircuitBreaker) and hands
/// the caller its response: at once (every classifier of the core crate, and any
/// [`Classify`] of your own wrapped in [`Immediate`]), or later by moving the [`PendingCall`]
/// into the response (`tower_outlier::grpc::GrpcErrors` reads the gRPC status in the trailers).
pub trait BreakerClassifier<Res, E>: Sized {
    /// What the caller receives: `Res` itself, or a wrapper that records later.
    type Response;

    /// Classifies `result` now (`call.record(..)`, with the classifier at
    /// [`PendingCall::classifier`]) or moves `call` into the response to record later. A call
    /// dropped unrecorded counts as cancelled: neither success nor failure, and a probe's slot
    /// goes back.
    fn complete(result: Result<Res, E>, call: PendingCall<Self>) -> Result<Self::Response, E>;
}

/// One admitted call whose outcome the breaker has not been told yet.
pub struct PendingCall<C> {
    lane: Arc<Lane<C>>,
    admission: Admission,
    start: Nanos,
    // Fixed when the response headers arrived, for outcomes decided at the end of the body.
    latency: Option<Nanos>,
}

impl<C> PendingCall<C> {
    pub(crate) fn new(lane: Arc<Lane<C>>, admission: Admission, start: Nanos) -> Self {
        PendingCall {
            lane,
            admission,
            start,
            latency: None,
        }
    }

    /// The breaker's classifier.
    #[inline]
    pub fn classifier(&self) -> &C {
        &self.lane.owner().classifier
    }

    /// Whether this call is the half-open breaker's probe: the breaker rejects every other call
    /// until the probe's outcome is recorded (or the call dropped).
    #[inline]
    pub fn is_probe(&self) -> bool {
        self.admission == Admission::Probe
    }

    /// Now, on the breaker's clock.
    #[inline]
    pub fn now(&self) -> Nanos {
        self.lane.owner().clock.now()
    }

    /// Fixes the call's latency at now (the time to the response headers), for an outcome that
    /// will be recorded later.
    pub fn freeze_latency(&mut self) {
        self.latency = Some(self.now().saturating_sub(self.start));
    }

    /// Tells the breaker the call's outcome. [`Outcome::Cancelled`] and [`Outcome::NotSent`]
    /// record nothing (a probe's slot goes back).
    pub fn record(mut self, outcome: Outcome) {
        // Disarmed first: this call reports itself, whatever the breaker's observers do.
        let admission = std::mem::replace(&mut self.admission, Admission::Rejected);
        let shared = self.lane.owner();
        let now = shared.clock.now();
        if outcome.is_unrecorded() {
            if admission == Admission::Probe {
                shared.breaker.probe_cancelled(now);
            }
            return;
        }
        let latency = self
            .latency
            .unwrap_or_else(|| now.saturating_sub(self.start));
        let observation = Observation {
            outcome,
            latency: Duration::from_nanos(latency),
        };
        shared.breaker.complete(admission, &observation, now);
    }
}

impl<C> Drop for PendingCall<C> {
    fn drop(&mut self) {
        if self.admission == Admission::Probe {
            let shared = self.lane.owner();
            shared.breaker.probe_cancelled(shared.clock.now());
        }
    }
}

impl<C> fmt::Debug for PendingCall<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingCall")
            .field("admission", &self.admission)
            .field("latency", &self.latency)
            .finish_non_exhaustive()
    }
}

macro_rules! immediate {
    ($($classifier:ty $(, $generic:ident)*;)*) => {$(
        impl<Res, E $(, $generic)*> BreakerClassifier<Res, E> for $classifier
        where
            $classifier: Classify<Res, E>,
        {
            type Response = Res;

            #[inline]
            fn complete(result: Result<Res, E>, call: PendingCall<Self>) -> Result<Res, E> {
                // The classifier is user code. One that panics leaves the call unrecorded; the
                // pending call, dropped, gives a probe's slot back.
                let classify = std::panic::AssertUnwindSafe(|| {
                    call.classifier().classify(result.as_ref())
                });
                match std::panic::catch_unwind(classify) {
                    Ok(outcome) => call.record(outcome),
                    Err(panic) => {
                        tracing::error!(
                            target: "tower_outlier::breaker",
                            panic = tower_outlier_core::panic_message(&*panic),
                            "the classifier panicked: the call is not recorded"
                        );
                        tower_outlier_core::drop_panic(panic);
                    }
                }
                result
            }
        }
    )*};
}

immediate! {
    Immediate<C>, C;
    NetworkErrors;
    ServerErrors;
    Predicate<F>, F;
    ClassifyFn<F>, F;
}
