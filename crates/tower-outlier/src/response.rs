//! Classifying a response when it completes, or later: at the end of its body.
//!
//! Most classifiers decide from the result of the response future alone: the core crate's
//! [`Classify`] ones, adapted here by [`ResponseClassifier`] implementations that record at once.
//! Some cannot: a gRPC status usually arrives in the trailers, after the body. Those take the
//! call's [`Recorder`] into the response (for gRPC, into its body) and record when they know.

use std::fmt;
use std::sync::Arc;

use tower_outlier_core::classify::{ClassifyFn, Predicate};
use tower_outlier_core::{
    Classify, Nanos, NetworkErrors, Outcome, ProbePermits, ServerErrors, ServerSignal,
    LOAD_REPORT_HEADER,
};

use crate::shared::Lane;

/// Decides the outcome of a finished call and hands the caller its response.
///
/// Implemented for every classifier of the core crate, which decide at once; wrap a classifier
/// of your own (anything implementing [`Classify`]) in [`Immediate`]. [`GrpcErrors`] defers to the
/// end of the response body.
///
/// [`GrpcErrors`]: crate::grpc::GrpcErrors
pub trait ResponseClassifier<Res, E>: Sized {
    /// What the caller receives: `Res` itself, or a wrapper that records later.
    type Response;

    /// Classifies `result` now (`recorder.record(..)`, with the classifier at
    /// [`Recorder::classifier`]) or moves `recorder` into the response to record later. A
    /// recorder dropped unrecorded counts the call as cancelled.
    fn complete(result: Result<Res, E>, recorder: Recorder<Self>) -> Result<Self::Response, E>;
}

/// Adapts any [`Classify`] implementation into a [`ResponseClassifier`] that records as soon as
/// the response future completes (defined in the core crate, so that the standalone breaker takes
/// it too).
///
/// ```
/// use tower_outlier::classify::{Classify, FailureKind, Immediate, Outcome};
///
/// #[derive(Clone)]
/// struct EveryErrorButNotFound;
///
/// impl Classify<u16, std::io::Error> for EveryErrorButNotFound {
///     fn classify(&self, result: Result<&u16, &std::io::Error>) -> Outcome {
///         match result {
///             Ok(404) | Ok(200) => Outcome::Success,
///             _ => Outcome::Failure(FailureKind::ServerError),
///         }
///     }
/// }
///
/// let classifier = Immediate(EveryErrorButNotFound);
/// # let _ = classifier;
/// ```
pub use tower_outlier_core::classify::Immediate;

macro_rules! immediate {
    ($($classifier:ty $(, $generic:ident)*;)*) => {$(
        impl<Res, E $(, $generic)*> ResponseClassifier<Res, E> for $classifier
        where
            $classifier: Classify<Res, E>,
        {
            type Response = Res;

            #[inline]
            fn complete(result: Result<Res, E>, recorder: Recorder<Self>) -> Result<Res, E> {
                // A classifier is user code: one that panics leaves the call unrecorded (as
                // cancelled: its probe permits go back) and the caller gets the service's answer.
                let classify = std::panic::AssertUnwindSafe(|| {
                    recorder.classifier().classify(result.as_ref())
                });
                match std::panic::catch_unwind(classify) {
                    Ok(outcome) => recorder.record(outcome),
                    Err(panic) => classifier_panicked(panic),
                }
                result
            }
        }
    )*};
}

immediate! {
    Immediate<C>, C;
    NetworkErrors;
    Predicate<F>, F;
    ClassifyFn<F>, F;
}

/// [`ServerErrors`] also reads what the server asks of the client, whatever it makes of the
/// status: a 429 or 503 with `Retry-After` asks the layer to leave the endpoint alone that long
/// ([`pushback`](crate::pushback)), a rate limiter's 429 included, which it counts as a success.
impl<B, E: 'static> ResponseClassifier<http::Response<B>, E> for ServerErrors {
    type Response = http::Response<B>;

    #[inline]
    fn complete(
        result: Result<http::Response<B>, E>,
        recorder: Recorder<Self>,
    ) -> Result<http::Response<B>, E> {
        let classify =
            std::panic::AssertUnwindSafe(|| recorder.classifier().classify(result.as_ref()));
        match std::panic::catch_unwind(classify) {
            Ok(outcome) => {
                if let Ok(response) = &result {
                    recorder.read_response(response);
                }
                recorder.record(outcome);
            }
            Err(panic) => classifier_panicked(panic),
        }
        result
    }
}

#[cold]
fn log_degraded(degraded: bool) {
    if degraded {
        tracing::info!(target: "tower_outlier", "the server says its endpoint is degraded: picked only when no other can take a call");
    } else {
        tracing::info!(target: "tower_outlier", "the server no longer says its endpoint is degraded");
    }
}

#[cold]
fn classifier_panicked(panic: Box<dyn std::any::Any + Send>) {
    tracing::error!(
        target: "tower_outlier",
        panic = tower_outlier_core::panic_message(&*panic),
        "the classifier panicked: the call is not recorded"
    );
    tower_outlier_core::drop_panic(panic);
}

/// One call's pending record: where and when to record its outcome, and the classifier.
///
/// Dropped without recording, the call counts as cancelled (neither success nor failure) and any
/// probe permit it held is given back.
pub struct Recorder<C> {
    lane: Arc<Lane>,
    classifier: C,
    start: Nanos,
    // Fixed when the response headers arrived, for outcomes decided at the end of the body.
    latency: Option<Nanos>,
    probes: ProbePermits,
    recorded: bool,
}

impl<C> Recorder<C> {
    pub(crate) fn new(lane: Arc<Lane>, classifier: C, start: Nanos, probes: ProbePermits) -> Self {
        Recorder {
            lane,
            classifier,
            start,
            latency: None,
            probes,
            recorded: false,
        }
    }

    /// The call's classifier (a copy of the layer's).
    #[inline]
    pub fn classifier(&self) -> &C {
        &self.classifier
    }

    /// Whether the call holds a probe permit of a gated policy (a breaker's half-open probe,
    /// linkerd's probation): the policy holds its other calls until this one is recorded.
    #[inline]
    pub(crate) fn is_probe(&self) -> bool {
        self.probes != 0
    }

    /// Now, on the layer's clock.
    #[inline]
    pub(crate) fn now(&self) -> Nanos {
        self.lane.owner().record.clock().now()
    }

    /// Fixes the call's latency at now (the time to the response headers), for an outcome that
    /// will be recorded later.
    pub fn freeze_latency(&mut self) {
        let now = self.lane.owner().record.clock().now();
        self.latency = Some(now.saturating_sub(self.start));
    }

    /// What the server says of itself beside the call's outcome ([`ServerSignal`]): the layer
    /// acts on a pushback (within its
    /// [`max_pushback`](crate::OutlierDetectionLayer::max_pushback)), a degraded word (with
    /// [`detect_degraded`](crate::OutlierDetectionLayer::detect_degraded) on: picked only when
    /// no endpoint that is not degraded can take the call) and a health word, and hands every
    /// signal to the policies that hear them (`orca::OrcaPolicy` reads load reports). Record the
    /// outcome as well: a degraded endpoint's failures still count, and ejection wins over
    /// degradation.
    pub fn signal(&self, signal: ServerSignal<'_>) {
        let record = &self.lane.owner().record;
        if record.hear(signal, record.clock().now()) {
            if let ServerSignal::Degraded(degraded) = signal {
                log_degraded(degraded);
            }
        }
    }

    /// The server asked to be left alone for `wait` (a `Retry-After`, gRPC's pushback):
    /// `signal(ServerSignal::PushBack { wait })`.
    pub fn push_back(&self, wait: std::time::Duration) {
        self.signal(ServerSignal::PushBack { wait });
    }

    /// The server says the endpoint is degraded (Envoy's `x-envoy-degraded`, or a signal of
    /// your own) or, `false`, that it is not: `signal(ServerSignal::Degraded(degraded))`.
    pub fn degraded(&self, degraded: bool) {
        self.signal(ServerSignal::Degraded(degraded));
    }

    /// Reads what a response's `headers` say of the server where the layer listens:
    /// `x-envoy-degraded` while it reads that signal, a load report while a policy hears them.
    /// One load each otherwise.
    #[inline]
    pub(crate) fn read_headers(&self, headers: &http::HeaderMap) {
        if self.lane.owner().record.watches_degraded() {
            self.degraded(crate::degraded::says_degraded(headers));
        }
        self.read_trailers(headers);
    }

    /// Reads what an HTTP response says of its server, whatever the classifier makes of its
    /// status: its headers ([`read_headers`](Self::read_headers)), and what a 429 or 503 asks
    /// of its client ([`pushback::asked_wait`](crate::pushback::asked_wait): `Retry-After`, or
    /// its rate limiter's reset headers).
    #[inline]
    pub(crate) fn read_response<B>(&self, response: &http::Response<B>) {
        self.read_headers(response.headers());
        if let Some(wait) = crate::pushback::asked_wait(response) {
            self.push_back(wait);
        }
    }

    /// Reads a load report from a response's trailers while a policy hears them: one load
    /// otherwise.
    #[inline]
    pub(crate) fn read_trailers(&self, trailers: &http::HeaderMap) {
        if !self.lane.owner().record.hears() {
            return;
        }
        if let Some(value) = trailers.get(LOAD_REPORT_HEADER) {
            self.signal(ServerSignal::LoadReport(value.as_bytes()));
        }
    }

    /// Records the call's outcome now. [`Outcome::Cancelled`] records nothing;
    /// [`Outcome::NotSent`] only steers the balancer away for a moment (no window counts it).
    #[inline]
    pub fn record(mut self, outcome: Outcome) {
        self.recorded = true;
        let record = &self.lane.owner().record;
        if outcome == Outcome::Cancelled {
            record.cancel_probes(self.probes);
            return;
        }
        let now = record.clock().now();
        let latency = self
            .latency
            .unwrap_or_else(|| now.saturating_sub(self.start));
        record.observe_call(outcome, latency, now, self.probes);
    }
}

impl<C> Drop for Recorder<C> {
    fn drop(&mut self) {
        if !self.recorded {
            self.lane.owner().record.cancel_probes(self.probes);
        }
    }
}

impl<C> fmt::Debug for Recorder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("recorded", &self.recorded)
            .field("latency", &self.latency)
            .finish_non_exhaustive()
    }
}
