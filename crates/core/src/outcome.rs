//! What one finished call looked like: its outcome and its latency.

use std::fmt;
use std::time::Duration;

/// Why a call counts as failed.
///
/// The kinds follow the vocabulary of the systems this crate family implements: EDAS tells
/// network exceptions apart from HTTP 5xx, HSF lets a predicate name business failures, and
/// SOFARPC counts only timeouts and "server busy".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The request never got an answer: connect refused, reset, broken pipe, protocol error.
    Transport,
    /// The call did not finish in time (for example `tower::timeout` elapsed).
    Timeout,
    /// The server answered with an error of its own (HTTP 5xx other than 502, 503 and 504).
    ServerError,
    /// A gateway reported that the server behind it failed or did not answer in time (HTTP 502
    /// and 504). With [`Overload`](Self::Overload) (503), what Envoy calls a gateway failure.
    Gateway,
    /// The server said it is overloaded (HTTP 503 or 429, gRPC UNAVAILABLE / RESOURCE_EXHAUSTED,
    /// SOFARPC "server busy").
    Overload,
    /// A user predicate judged the response a business failure (HSF's `bizExceptionPredicate`).
    Business,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::Transport => "transport error",
            FailureKind::Timeout => "timeout",
            FailureKind::ServerError => "server error",
            FailureKind::Gateway => "gateway failure",
            FailureKind::Overload => "overload",
            FailureKind::Business => "business failure",
        })
    }
}

/// The outcome of one call, as a classifier sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The call succeeded, or failed in a way the classifier does not count.
    Success,
    /// The call failed in a way that counts against the endpoint.
    Failure(FailureKind),
    /// The caller dropped the response future before it finished. A cancelled call counts as
    /// neither success nor failure: it is never recorded in a window.
    Cancelled,
    /// The caller's own stack refused the call before it reached the endpoint: a per-endpoint
    /// `tower::load_shed` answering `Overloaded`, the layer's fail-fast guard answering
    /// `NoEndpointAvailable`. The endpoint did not fail, so like a cancelled call this counts
    /// as neither success nor failure and is never recorded in a window (Envoy stopped
    /// counting its own circuit breaker's overflow against a host for the same reason: those
    /// false ejections shrank fleets under load). The classifiers return it for the errors
    /// [`error_outcome`](crate::classify::error_outcome) recognises; a classifier of your own
    /// may count such a refusal as a failure instead.
    NotSent,
}

impl Outcome {
    /// Whether this outcome counts as a failure.
    pub fn is_failure(&self) -> bool {
        matches!(self, Outcome::Failure(_))
    }

    /// Whether this outcome says nothing of the endpoint ([`Cancelled`](Self::Cancelled),
    /// [`NotSent`](Self::NotSent)): no window records such a call.
    pub fn is_unrecorded(&self) -> bool {
        matches!(self, Outcome::Cancelled | Outcome::NotSent)
    }
}

/// One finished (not cancelled) call: its outcome and how long it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// Success or a failure kind.
    pub outcome: Outcome,
    /// Time from `Service::call` to the completion of the response future.
    pub latency: Duration,
}
