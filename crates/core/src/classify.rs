//! Classifiers: which results count as failures, and of which kind.
//!
//! The systems this library follows let the user choose what counts against an endpoint, and so
//! do these:
//!
//! | the system's choice | classifier |
//! |---|---|
//! | EDAS "network exceptions" | [`NetworkErrors`] |
//! | EDAS "network exceptions + HTTP 5xx" | [`ServerErrors`] |
//! | HSF `bizExceptionPredicateClassName` | [`predicate`] (a user predicate over the response or error) |
//! | anything else | [`classify_fn`] (a user function returning the [`Outcome`]) |
//!
//! A classifier runs once per finished call, on the caller's task, so it must be cheap and must
//! not block.

use std::any::Any;
use std::error::Error;
use std::fmt;
use std::io;

use crate::outcome::{FailureKind, Outcome};

/// Decides the [`Outcome`] of a finished call from the service's result.
///
/// `Res` is the service's response type and `E` its error type.
pub trait Classify<Res, E> {
    /// Classifies one result. Must not return [`Outcome::Cancelled`], which is reserved for
    /// dropped futures; if it does, the call is not recorded. [`Outcome::NotSent`] says the
    /// caller's own stack refused the call: nothing counts it against the endpoint.
    fn classify(&self, result: Result<&Res, &E>) -> Outcome;
}

/// Counts only errors returned by the service (EDAS "network exceptions"): every `Ok` response is
/// a success, whatever it contains.
///
/// An error is a [`FailureKind::Timeout`] when it is, or is caused by, `tower::timeout`'s or
/// tokio's `Elapsed`, or an `io::Error` of kind `TimedOut`; [`Outcome::NotSent`] when the
/// caller's own stack refused the call ([`error_outcome`]); otherwise it is a
/// [`FailureKind::Transport`] failure.
///
/// ```
/// use tower_outlier_core::{Classify, FailureKind, NetworkErrors, Outcome};
///
/// let err: tower::BoxError = Box::new(tower::timeout::error::Elapsed::new());
/// assert_eq!(
///     NetworkErrors.classify(Err::<&(), _>(&err)),
///     Outcome::Failure(FailureKind::Timeout)
/// );
/// assert_eq!(NetworkErrors.classify(Ok::<_, &tower::BoxError>(&"any response")), Outcome::Success);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NetworkErrors;

impl<Res, E: 'static> Classify<Res, E> for NetworkErrors {
    #[inline]
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        match result {
            Ok(_) => Outcome::Success,
            Err(e) => error_outcome(e),
        }
    }
}

/// Counts service errors and HTTP 5xx responses (EDAS "network exceptions + HTTP 5xx").
///
/// 503 is classified as [`FailureKind::Overload`], 502 and 504 as [`FailureKind::Gateway`], other
/// 5xx as [`FailureKind::ServerError`]. 4xx
/// responses, 429 included, are the caller's business and count as successes; use
/// [`classify_fn`] to count 429 as overload.
///
/// ```
/// use tower_outlier_core::{Classify, FailureKind, Outcome, ServerErrors};
///
/// let unavailable = http::Response::builder().status(503).body(()).unwrap();
/// let not_found = http::Response::builder().status(404).body(()).unwrap();
/// let classify = |r| ServerErrors.classify(Ok::<_, &std::io::Error>(r));
/// assert_eq!(classify(&unavailable), Outcome::Failure(FailureKind::Overload));
/// assert_eq!(classify(&not_found), Outcome::Success);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerErrors;

impl<B, E: 'static> Classify<http::Response<B>, E> for ServerErrors {
    #[inline]
    fn classify(&self, result: Result<&http::Response<B>, &E>) -> Outcome {
        match result {
            Ok(response) => status_outcome(response.status()),
            Err(e) => error_outcome(e),
        }
    }
}

/// The outcome of an HTTP status under [`ServerErrors`]' rules.
pub fn status_outcome(status: http::StatusCode) -> Outcome {
    if status == http::StatusCode::SERVICE_UNAVAILABLE {
        Outcome::Failure(FailureKind::Overload)
    } else if status == http::StatusCode::BAD_GATEWAY || status == http::StatusCode::GATEWAY_TIMEOUT
    {
        Outcome::Failure(FailureKind::Gateway)
    } else if status.is_server_error() {
        Outcome::Failure(FailureKind::ServerError)
    } else {
        Outcome::Success
    }
}

/// A classifier from a user predicate that says whether a result is a failure (HSF's business
/// exception predicate). Errors it flags keep their network kind; responses it flags are
/// [`FailureKind::Business`] failures.
///
/// ```
/// use tower_outlier_core::{classify::predicate, Classify, FailureKind, Outcome};
///
/// // Only responses carrying a business error code count, plus every transport error.
/// let biz = predicate(|result: Result<&(u16, &str), &std::io::Error>| match result {
///     Ok((code, _)) => *code >= 1000,
///     Err(_) => true,
/// });
/// assert_eq!(biz.classify(Ok(&(1001, "stock exhausted"))), Outcome::Failure(FailureKind::Business));
/// assert_eq!(biz.classify(Ok(&(0, "ok"))), Outcome::Success);
/// ```
pub fn predicate<F>(is_failure: F) -> Predicate<F> {
    Predicate(is_failure)
}

/// See [`predicate`].
#[derive(Clone, Copy)]
pub struct Predicate<F>(F);

impl<F> fmt::Debug for Predicate<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Predicate").finish_non_exhaustive()
    }
}

impl<Res, E: 'static, F> Classify<Res, E> for Predicate<F>
where
    F: Fn(Result<&Res, &E>) -> bool,
{
    #[inline]
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        if !(self.0)(result) {
            return Outcome::Success;
        }
        match result {
            Ok(_) => Outcome::Failure(FailureKind::Business),
            Err(e) => error_outcome(e),
        }
    }
}

/// Marks a [`Classify`] of your own as one that decides as soon as the response future completes,
/// for the places that also take classifiers deciding later (at the end of a response body, as
/// the gRPC classifier does): the layer's classifier and the standalone breaker's.
///
/// ```
/// use tower_outlier_core::classify::Immediate;
/// use tower_outlier_core::{Classify, FailureKind, Outcome};
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
/// assert_eq!(classifier.classify(Ok(&500)), Outcome::Failure(FailureKind::ServerError));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Immediate<C>(pub C);

impl<C, Res, E> Classify<Res, E> for Immediate<C>
where
    C: Classify<Res, E>,
{
    #[inline]
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        self.0.classify(result)
    }
}

/// A classifier from a user function returning the [`Outcome`] itself.
///
/// ```
/// use tower_outlier_core::{classify::classify_fn, Classify, FailureKind, Outcome};
///
/// // SOFARPC counts only timeouts and "server busy".
/// let sofa = classify_fn(|result: Result<&http::Response<()>, &std::io::Error>| match result {
///     Ok(r) if r.status() == 503 || r.status() == 429 => Outcome::Failure(FailureKind::Overload),
///     Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Outcome::Failure(FailureKind::Timeout),
///     _ => Outcome::Success,
/// });
/// let busy = http::Response::builder().status(429).body(()).unwrap();
/// assert_eq!(sofa.classify(Ok(&busy)), Outcome::Failure(FailureKind::Overload));
/// ```
pub fn classify_fn<F>(f: F) -> ClassifyFn<F> {
    ClassifyFn(f)
}

/// See [`classify_fn`].
#[derive(Clone, Copy)]
pub struct ClassifyFn<F>(F);

impl<F> fmt::Debug for ClassifyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ClassifyFn").finish_non_exhaustive()
    }
}

impl<Res, E, F> Classify<Res, E> for ClassifyFn<F>
where
    F: Fn(Result<&Res, &E>) -> Outcome,
{
    #[inline]
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        (self.0)(result)
    }
}

/// The outcome of a call that ended in `error`: [`Outcome::NotSent`] when the error or any of
/// its causes is the caller's own refusal to send it — `tower::load_shed::error::Overloaded`
/// (a per-endpoint load shedder whose inner service was not ready) or
/// [`NoEndpointAvailable`] (the layer's fail-fast guard, as an inner layer's endpoint) — or,
/// with the `h2` feature, an HTTP/2 connection the client's own h2 closed with a GOAWAY
/// `ENHANCE_YOUR_CALM` (hyperium/h2#856: its count of locally reset streams ran out; a GOAWAY
/// received from the server still counts), and otherwise a failure of the endpoint of kind
/// [`error_kind`].
///
/// ```
/// use tower_outlier_core::classify::error_outcome;
/// use tower_outlier_core::{FailureKind, Outcome};
///
/// let shed: tower::BoxError = Box::new(tower::load_shed::error::Overloaded::new());
/// assert_eq!(error_outcome(&shed), Outcome::NotSent);
/// let reset: tower::BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
/// assert_eq!(error_outcome(&reset), Outcome::Failure(FailureKind::Transport));
/// ```
pub fn error_outcome<E: 'static>(error: &E) -> Outcome {
    let mut next = as_error(error);
    // Cause chains are short; the bound keeps a cyclic `source` from looping forever.
    for _ in 0..32 {
        let Some(error) = next else { break };
        if error.is::<tower::load_shed::error::Overloaded>()
            || error.is::<NoEndpointAvailable>()
            || own_goaway(error)
        {
            return Outcome::NotSent;
        }
        next = error.source();
    }
    Outcome::Failure(error_kind(error))
}

/// Whether `error` is an HTTP/2 GOAWAY the client's own h2 sent (`ENHANCE_YOUR_CALM`, raised by
/// the library: "too_many_internal_resets" when more streams than h2's
/// `max_local_error_reset_streams` were reset on the client's side, hyperium/h2#856). The
/// client closed the connection on its own count; a GOAWAY the server sent
/// (`h2::Error::is_remote`) is the server's word and counts against it as any transport error.
#[cfg(feature = "h2")]
fn own_goaway(error: &(dyn Error + 'static)) -> bool {
    error.downcast_ref::<h2::Error>().is_some_and(|h2| {
        h2.is_go_away() && h2.is_library() && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM)
    })
}

#[cfg(not(feature = "h2"))]
fn own_goaway(_: &(dyn Error + 'static)) -> bool {
    false
}

/// The error of a call that the layer's fail-fast guard (`tower_outlier::fail_fast::FailFast`)
/// failed: every endpoint is out of the balancer's set. Defined here so that a classifier can
/// tell it from an endpoint's failure where layers nest ([`error_outcome`]).
#[derive(Debug)]
pub struct NoEndpointAvailable {
    _private: (),
}

impl NoEndpointAvailable {
    /// The error, as the guard answers it.
    pub fn new() -> Self {
        NoEndpointAvailable { _private: () }
    }
}

impl Default for NoEndpointAvailable {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for NoEndpointAvailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no endpoint available: every endpoint is ejected")
    }
}

impl Error for NoEndpointAvailable {}

/// `error` as a `dyn Error` when its type is one the classifiers recognise: `tower::BoxError`
/// (and its `Send`-only and unsendable kin), `std::io::Error`, `tower::timeout::error::Elapsed`,
/// `tokio::time::error::Elapsed`, `tower::load_shed::error::Overloaded`.
fn as_error<E: 'static>(error: &E) -> Option<&(dyn Error + 'static)> {
    let any = error as &dyn Any;
    if let Some(boxed) = any.downcast_ref::<tower::BoxError>() {
        Some(&**boxed)
    } else if let Some(boxed) = any.downcast_ref::<Box<dyn Error + Send>>() {
        Some(&**boxed)
    } else if let Some(boxed) = any.downcast_ref::<Box<dyn Error>>() {
        Some(&**boxed)
    } else if let Some(io) = any.downcast_ref::<io::Error>() {
        Some(io)
    } else if let Some(elapsed) = any.downcast_ref::<tower::timeout::error::Elapsed>() {
        Some(elapsed)
    } else if let Some(shed) = any.downcast_ref::<tower::load_shed::error::Overloaded>() {
        Some(shed)
    } else {
        any.downcast_ref::<tokio::time::error::Elapsed>()
            .map(|e| e as &(dyn Error + 'static))
    }
}

/// The failure kind of a service error: [`FailureKind::Timeout`] when the error or any of its
/// causes is a timeout, else [`FailureKind::Transport`]. Whether the endpoint failed at all is
/// [`error_outcome`]'s question.
///
/// Recognised error types: `tower::BoxError`, `std::io::Error`, `tower::timeout::error::Elapsed`,
/// `tokio::time::error::Elapsed`; causes are followed through `Error::source`.
pub fn error_kind<E: 'static>(error: &E) -> FailureKind {
    let mut next = as_error(error);
    // Cause chains are short; the bound keeps a cyclic `source` from looping forever.
    for _ in 0..32 {
        let Some(error) = next else { break };
        if error.is::<tower::timeout::error::Elapsed>()
            || error.is::<tokio::time::error::Elapsed>()
            || error
                .downcast_ref::<io::Error>()
                .is_some_and(|io| io.kind() == io::ErrorKind::TimedOut)
        {
            return FailureKind::Timeout;
        }
        next = error.source();
    }
    FailureKind::Transport
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(io::Error);
    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }
    impl Error for Wrapped {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn timeouts_are_found_through_causes() {
        let err: tower::BoxError = Box::new(Wrapped(io::Error::from(io::ErrorKind::TimedOut)));
        assert_eq!(error_kind(&err), FailureKind::Timeout);
        let err: tower::BoxError =
            Box::new(Wrapped(io::Error::from(io::ErrorKind::ConnectionReset)));
        assert_eq!(error_kind(&err), FailureKind::Transport);
        assert_eq!(error_kind(&"some string error"), FailureKind::Transport);
    }

    #[test]
    fn server_errors_split_overload() {
        let resp = |s: u16| http::Response::builder().status(s).body(()).unwrap();
        let c = |r: &http::Response<()>| ServerErrors.classify(Ok::<_, &io::Error>(r));
        assert_eq!(c(&resp(500)), Outcome::Failure(FailureKind::ServerError));
        assert_eq!(c(&resp(503)), Outcome::Failure(FailureKind::Overload));
        assert_eq!(c(&resp(429)), Outcome::Success);
        assert_eq!(c(&resp(200)), Outcome::Success);
        // Network-only counts no response at all.
        assert_eq!(
            NetworkErrors.classify(Ok::<_, &io::Error>(&resp(500))),
            Outcome::Success
        );
    }
}
