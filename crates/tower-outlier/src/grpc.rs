//! gRPC classification: the status in the response headers (trailers-only responses) or in the
//! trailers at the end of the body.
//!
//! [`GrpcErrors`] classifies `http::Response<B>` results of a gRPC client (a tonic `Channel`, or
//! a hyper client speaking gRPC):
//!
//! * a `grpc-status` header (a trailers-only response) decides at once;
//! * a non-200 HTTP status without `grpc-status` (a proxy in front of the server answering 503,
//!   say) is mapped as the gRPC spec maps HTTP statuses: 429, 502, 503, 504 are UNAVAILABLE, 400
//!   INTERNAL, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 UNIMPLEMENTED, others UNKNOWN;
//! * otherwise the body is wrapped in a [`GrpcBody`] that records when the trailers arrive (a
//!   call that is a probe — a half-open breaker's, or linkerd's probation — at its first message,
//!   since its breaker holds every other call until it is decided, and a server stream may run
//!   for hours); a
//!   stream that ends with no `grpc-status` at all is UNAVAILABLE, a body error is a transport
//!   failure, and a body dropped before its end counts as cancelled (neither success nor
//!   failure) — unless [`GrpcErrors::stalled_after`] is set and the body was dropped while its
//!   reader had waited on the server that long: a server that sends its headers and then stalls
//!   until the caller's deadline is a timeout;
//! * an unparsable `grpc-status` counts as UNKNOWN.
//!
//! Which codes are failures is configurable; by default UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL,
//! UNKNOWN, RESOURCE_EXHAUSTED and DATA_LOSS are, and NOT_FOUND, INVALID_ARGUMENT and the other
//! codes that are the caller's business are not.
//!
//! **Latency** (for the slow-call breaker and the load estimate) is the time to the response
//! headers, not to the end of the stream: a long server stream is not a slow call.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_outlier_core::classify::error_outcome;
use tower_outlier_core::{duration_to_nanos, FailureKind, Nanos, Outcome};

use crate::response::{Recorder, ResponseClassifier};

/// Classifies gRPC responses by their status; see the [module docs](self).
///
#[cfg_attr(feature = "error-rate", doc = "```")]
#[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
/// use tower_outlier::grpc::{Code, GrpcErrors};
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// // The default failure codes, plus NOT_FOUND for a service where it means a broken replica.
/// let classifier = GrpcErrors::default().with_failure(Code::NotFound);
/// assert!(classifier.is_failure(Code::Unavailable));
/// assert!(!classifier.is_failure(Code::InvalidArgument));
/// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?))
///     .classifier(classifier);
/// # let _ = layer;
/// # Ok::<(), tower_outlier::ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct GrpcErrors {
    failures: u32,
    // A body dropped after its reader waited on the server this long is a timeout.
    stalled_after: Option<Nanos>,
}

impl Default for GrpcErrors {
    fn default() -> Self {
        GrpcErrors::only(&[
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Internal,
            Code::Unknown,
            Code::ResourceExhausted,
            Code::DataLoss,
        ])
    }
}

impl GrpcErrors {
    /// Exactly `codes` count as failures.
    pub fn only(codes: &[Code]) -> Self {
        GrpcErrors {
            failures: codes.iter().fold(0, |bits, code| bits | code.bit()),
            stalled_after: None,
        }
    }

    /// Counts a call whose response body is dropped unfinished, after its reader had been waiting
    /// on the server for at least `wait`, as a timeout (off by default: such a call is cancelled,
    /// neither success nor failure).
    ///
    /// A server that sends its response headers and then stalls completes the response future
    /// (so a `tower::timeout` around the endpoint does not fire) and is dropped by the caller's
    /// own deadline mid-body: without this, such a server is never counted. Set `wait` to the
    /// deadline of your unary calls, or above the longest quiet gap of your server streams: a
    /// stream the caller drops after waiting longer for its next message counts as a timeout too.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier::grpc::GrpcErrors;
    ///
    /// let classifier = GrpcErrors::default().stalled_after(Duration::from_secs(1));
    /// # let _ = classifier;
    /// ```
    pub fn stalled_after(mut self, wait: Duration) -> Self {
        self.stalled_after = Some(duration_to_nanos(wait));
        self
    }

    /// Also counts `code` as a failure.
    pub fn with_failure(mut self, code: Code) -> Self {
        self.failures |= code.bit();
        self
    }

    /// No longer counts `code` as a failure.
    pub fn without_failure(mut self, code: Code) -> Self {
        self.failures &= !code.bit();
        self
    }

    /// Whether `code` counts as a failure.
    pub fn is_failure(&self, code: Code) -> bool {
        self.failures & code.bit() != 0
    }

    /// The outcome of a call that ended with `code`.
    pub fn outcome(&self, code: Code) -> Outcome {
        if code != Code::Ok && self.is_failure(code) {
            Outcome::Failure(code.failure_kind())
        } else {
            Outcome::Success
        }
    }

    fn status_in(&self, headers: &HeaderMap) -> Option<Code> {
        headers.get("grpc-status").map(Code::from_header)
    }
}

impl fmt::Debug for GrpcErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failures: Vec<Code> = CODES
            .iter()
            .copied()
            .filter(|c| self.is_failure(*c))
            .collect();
        f.debug_struct("GrpcErrors")
            .field("failures", &failures)
            .field(
                "stalled_after",
                &self.stalled_after.map(Duration::from_nanos),
            )
            .finish()
    }
}

impl<B, E: 'static> ResponseClassifier<http::Response<B>, E> for GrpcErrors {
    type Response = http::Response<GrpcBody<B>>;

    fn complete(
        result: Result<http::Response<B>, E>,
        recorder: Recorder<Self>,
    ) -> Result<Self::Response, E> {
        complete(result, Sink::Layer(recorder))
    }
}

/// Around a tonic `Channel` (or a hyper client speaking gRPC), the standalone breaker reads the
/// status as the layer does: at once from the headers, or at the end of the body.
#[cfg(feature = "slow-call")]
impl<B, E: 'static> tower_outlier_slow_call::BreakerClassifier<http::Response<B>, E>
    for GrpcErrors
{
    type Response = http::Response<GrpcBody<B>>;

    fn complete(
        result: Result<http::Response<B>, E>,
        call: tower_outlier_slow_call::PendingCall<Self>,
    ) -> Result<Self::Response, E> {
        complete(result, Sink::Breaker(call))
    }
}

fn complete<B, E: 'static>(
    result: Result<http::Response<B>, E>,
    mut sink: Sink,
) -> Result<http::Response<GrpcBody<B>>, E> {
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            sink.record(error_outcome(&error));
            return Err(error);
        }
    };
    if let Some(recorder) = sink.layer() {
        recorder.read_headers(response.headers());
        // A trailers-only status with gRPC's pushback, or a proxy's 429 / 503 with Retry-After
        // or a rate limiter's reset headers,
        // whatever the classifier makes of the status.
        let wait = crate::pushback::grpc_pushback(response.headers())
            .or_else(|| crate::pushback::asked_wait(&response));
        if let Some(wait) = wait {
            recorder.push_back(wait);
        }
    }
    let classifier = *sink.classifier();
    let code = classifier.status_in(response.headers()).or_else(|| {
        (response.status() != http::StatusCode::OK)
            .then(|| Code::from_http_status(response.status()))
    });
    let recorder = match code {
        Some(code) => {
            sink.record(classifier.outcome(code));
            None
        }
        None => {
            sink.freeze_latency();
            Some(sink)
        }
    };
    Ok(response.map(|inner| GrpcBody {
        inner,
        pending: PendingRecord {
            recorder,
            waiting_since: None,
        },
    }))
}

/// Whom a call's outcome goes to: the layer's record of the endpoint, or a standalone breaker.
enum Sink {
    Layer(Recorder<GrpcErrors>),
    #[cfg(feature = "slow-call")]
    Breaker(tower_outlier_slow_call::PendingCall<GrpcErrors>),
}

/// `$body` with `$call` bound to whichever sink it is: the two have the same methods for what
/// both do (the breaker keeps its own open time, so what the server says goes to the layer only:
/// [`Sink::layer`]).
macro_rules! either_sink {
    ($sink:expr, $call:ident => $body:expr) => {
        match $sink {
            Sink::Layer($call) => $body,
            #[cfg(feature = "slow-call")]
            Sink::Breaker($call) => $body,
        }
    };
}

impl Sink {
    fn classifier(&self) -> &GrpcErrors {
        either_sink!(self, call => call.classifier())
    }

    /// Whether a policy or breaker holds its other calls until this one is recorded.
    fn is_probe(&self) -> bool {
        either_sink!(self, call => call.is_probe())
    }

    fn now(&self) -> Nanos {
        either_sink!(self, call => call.now())
    }

    fn freeze_latency(&mut self) {
        either_sink!(self, call => call.freeze_latency())
    }

    fn record(self, outcome: Outcome) {
        either_sink!(self, call => call.record(outcome))
    }

    /// The layer's recorder, which hears what the server says; `None` for a breaker.
    fn layer(&self) -> Option<&Recorder<GrpcErrors>> {
        match self {
            Sink::Layer(recorder) => Some(recorder),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

pin_project! {
    /// A gRPC response body that records the call's outcome from its trailers.
    pub struct GrpcBody<B> {
        #[pin]
        inner: B,
        pending: PendingRecord,
    }
}

/// The call's record until the body decides it, and since when the body's reader has been
/// waiting on the server (a poll returned `Pending` and no frame came since), for
/// [`GrpcErrors::stalled_after`]. Dropped undecided, it records a stall as a timeout, or nothing
/// (the recorder then counts the call as cancelled).
struct PendingRecord {
    recorder: Option<Sink>,
    waiting_since: Option<Nanos>,
}

impl Drop for PendingRecord {
    fn drop(&mut self) {
        let Some(recorder) = self.recorder.take() else {
            return;
        };
        if let (Some(wait), Some(since)) = (recorder.classifier().stalled_after, self.waiting_since)
        {
            if recorder.now().saturating_sub(since) >= wait {
                recorder.record(Outcome::Failure(FailureKind::Timeout));
            }
        }
    }
}

impl<B> GrpcBody<B> {
    /// The wrapped body.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for GrpcBody<B>
where
    B::Error: 'static,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let pending = this.pending;
        let frame = match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if pending.waiting_since.is_none() {
                    if let Some(recorder) = &pending.recorder {
                        if recorder.classifier().stalled_after.is_some() {
                            pending.waiting_since = Some(recorder.now());
                        }
                    }
                }
                return Poll::Pending;
            }
        };
        pending.waiting_since = None;
        let recorder_slot = &mut pending.recorder;
        let outcome = match &frame {
            // A probe is decided at its first message: the breaker (or the gated policy) holds
            // every other call until it is, and a server stream's status may be hours away.
            Some(Ok(frame))
                if frame.is_data() && recorder_slot.as_ref().is_some_and(Sink::is_probe) =>
            {
                Some(Outcome::Success)
            }
            Some(Ok(frame)) => frame.trailers_ref().map(|trailers| {
                let recorder = recorder_slot.as_ref();
                if let Some(layer) = recorder.and_then(Sink::layer) {
                    layer.read_trailers(trailers);
                    // Whatever the classifier makes of the status.
                    if let Some(wait) = crate::pushback::grpc_pushback(trailers) {
                        layer.push_back(wait);
                    }
                }
                match recorder.map(|r| (*r.classifier(), r.classifier().status_in(trailers))) {
                    Some((classifier, Some(code))) => classifier.outcome(code),
                    // Trailers without a status are as bad as none at all.
                    Some((classifier, None)) => classifier.outcome(Code::Unavailable),
                    None => Outcome::Success,
                }
            }),
            // The caller's own stack's error (its h2 closing the connection on its own count)
            // is no failure of the endpoint, as before the response (`error_outcome`).
            Some(Err(error)) => Some(match error_outcome(error) {
                Outcome::Failure(_) => Outcome::Failure(FailureKind::Transport),
                outcome => outcome,
            }),
            None => recorder_slot
                .as_ref()
                .map(|r| r.classifier().outcome(Code::Unavailable)),
        };
        if let Some(outcome) = outcome {
            if let Some(recorder) = recorder_slot.take() {
                recorder.record(outcome);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug> fmt::Debug for GrpcBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcBody")
            .field("inner", &self.inner)
            .field("pending", &self.pending.recorder.is_some())
            .finish()
    }
}

mod code;
pub use code::Code;
use code::CODES;
