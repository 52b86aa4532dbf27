//! Recovery checks: a passive trial, or an active probe the user supplies.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use tower::ServiceExt;
use tower_outlier_core::{Classify, Outcome};
use tower_service::Service;

mod cadence;
pub use cadence::ProbeCadence;

/// A probe in flight: resolves to whether the endpoint answered healthily.
pub type ProbeFuture = Pin<Box<dyn Future<Output = bool> + Send + 'static>>;

/// What an endpoint's health service says of it, as a [`Probe::watch`] stream reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// Serving: the endpoint takes calls (gRPC's `SERVING`).
    Serving,
    /// Not serving (gRPC's `NOT_SERVING`, `SERVICE_UNKNOWN`, `UNKNOWN`): out at once, within the
    /// budget and never the last; back when it says [`Serving`](Self::Serving).
    NotServing,
}

/// A stream of what an endpoint's health service says, from [`Probe::watch`]: each item is its
/// word as of then. A stream that ends, or panics, gives up its word: the endpoint counts as
/// serving again and its calls judge it (it is watched again when the upstream gives its key a
/// new service).
pub type HealthStream = Pin<Box<dyn futures::Stream<Item = Health> + Send + 'static>>;

/// How an ejected endpoint is checked for recovery.
///
/// [`PassiveTrial`] (the default) sends nothing: at each check the endpoint is re-admitted and
/// judged on the real traffic it gets from then on. An active probe sends a request of the user's
/// through a clone of the endpoint's service while the endpoint stays out of the balancer's set;
/// success re-admits it, failure schedules the next, longer interval.
pub trait Probe<K, S> {
    /// Starts a probe of the endpoint `key` through `service`, or returns `None` for a passive
    /// trial.
    fn probe(&mut self, key: &K, service: S) -> Option<ProbeFuture>;

    /// Starts watching the health service of the endpoint `key` through `service`, as a gRPC
    /// client watches `grpc.health.v1.Health/Watch` per subchannel (gRFC A17): called when the
    /// endpoint joins (and again when the upstream gives its key a new service), the stream
    /// polled by the layer for as long as the endpoint is in the upstream's set. `None` (the
    /// default): no watch, the endpoint's health is what its calls say.
    fn watch(&mut self, key: &K, service: &S) -> Option<HealthStream> {
        let _ = (key, service);
        None
    }

    /// Whether [`probe`](Self::probe) sends checks rather than trying endpoints on real traffic
    /// (returning `None`): a [`ProbeCadence`] times only checks that are sent. The default says
    /// no, so a probe of your own keeps its policy's timing unless it says yes, as
    /// [`request_probe`], [`probe_fn`] and gRPC health checking do.
    fn sends_checks(&self) -> bool {
        false
    }
}

/// Recovery by passive trial: re-admit and judge on real traffic.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassiveTrial;

impl<K, S> Probe<K, S> for PassiveTrial {
    fn probe(&mut self, _: &K, _: S) -> Option<ProbeFuture> {
        None
    }
}

/// An active probe that sends `make_request()` through the endpoint and classifies the result
/// with `classifier`: the endpoint has recovered when the outcome is [`Outcome::Success`].
///
/// ```
/// use tower_outlier::{probe::request_probe, NetworkErrors};
///
/// // A GET of /healthz, where only transport errors count.
/// let probe = request_probe(
///     || http::Request::get("http://ignored/healthz").body(String::new()).unwrap(),
///     NetworkErrors,
/// );
/// # let _ = probe;
/// ```
pub fn request_probe<F, C>(make_request: F, classifier: C) -> RequestProbe<F, C> {
    RequestProbe {
        make_request,
        classifier,
    }
}

/// See [`request_probe`].
#[derive(Clone)]
pub struct RequestProbe<F, C> {
    make_request: F,
    classifier: C,
}

impl<F, C> fmt::Debug for RequestProbe<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestProbe").finish_non_exhaustive()
    }
}

impl<K, S, F, C, Req> Probe<K, S> for RequestProbe<F, C>
where
    F: FnMut() -> Req,
    S: Service<Req> + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
    Req: Send + 'static,
    C: Classify<S::Response, S::Error> + Clone + Send + 'static,
{
    fn sends_checks(&self) -> bool {
        true
    }

    fn probe(&mut self, _: &K, service: S) -> Option<ProbeFuture> {
        let request = (self.make_request)();
        let classifier = self.classifier.clone();
        Some(Box::pin(async move {
            let result = service.oneshot(request).await;
            classifier.classify(result.as_ref()) == Outcome::Success
        }))
    }
}

/// An active probe from a function of the key and a clone of the endpoint's service.
///
/// ```
/// use tower::{Service, ServiceExt};
/// use tower_outlier::probe::probe_fn;
///
/// type Backend = tower::util::BoxCloneSyncService<String, u16, std::io::Error>;
///
/// let probe = probe_fn(|_key: &u32, svc: Backend| {
///     Box::pin(async move { matches!(svc.oneshot("ping".to_string()).await, Ok(200)) })
///         as tower_outlier::probe::ProbeFuture
/// });
/// # let _ = probe;
/// ```
pub fn probe_fn<F>(f: F) -> ProbeFn<F> {
    ProbeFn(f)
}

/// See [`probe_fn`].
#[derive(Clone)]
pub struct ProbeFn<F>(F);

impl<F> fmt::Debug for ProbeFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ProbeFn").finish_non_exhaustive()
    }
}

impl<K, S, F> Probe<K, S> for ProbeFn<F>
where
    F: FnMut(&K, S) -> ProbeFuture,
{
    fn probe(&mut self, key: &K, service: S) -> Option<ProbeFuture> {
        Some((self.0)(key, service))
    }

    fn sends_checks(&self) -> bool {
        true
    }
}
