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

    /// A copy of this probe that checks endpoints from a task of its own, for
    /// [`ProbeCadence::no_traffic_interval`]: endpoints without traffic are checked while nothing
    /// polls the balancer (behind tower's `Buffer`, a quiet service's balancer is polled only
    /// when a request comes). `None` (the default): such endpoints are not checked, and the
    /// layer says so once. [`request_probe`], [`probe_fn`] and gRPC health checking return one;
    /// a probe of your own that is `Clone + Send` can return
    /// `Some(IdleChecker::new(self.clone()))`.
    fn idle_checker(&self) -> Option<IdleChecker<K, S>> {
        None
    }
}

/// A probe that checks endpoints from a task of its own ([`Probe::idle_checker`]): the layer
/// spawns the task on the tokio runtime that polls it, once, when
/// [`ProbeCadence::no_traffic_interval`] is set; the task ends with the layer's adaptor.
pub struct IdleChecker<K, S> {
    start: Spawn<K, S>,
}

/// Spawns the checker's task on a board and a runtime.
type Spawn<K, S> = Box<dyn FnOnce(Board<K, S>, &tokio::runtime::Handle) + Send>;

/// What the engine and an idle checker's task share.
type Board<K, S> = std::sync::Arc<crate::engine::IdleBoard<K, S>>;

impl<K, S> IdleChecker<K, S> {
    /// The checker that runs `probe`.
    ///
    /// ```
    /// use tower_outlier::probe::{IdleChecker, Probe, ProbeFuture};
    ///
    /// #[derive(Clone)]
    /// struct Ping;
    ///
    /// impl Probe<u32, u8> for Ping {
    ///     fn probe(&mut self, _: &u32, _: u8) -> Option<ProbeFuture> {
    ///         Some(Box::pin(async { true }))
    ///     }
    ///     fn sends_checks(&self) -> bool {
    ///         true
    ///     }
    ///     fn idle_checker(&self) -> Option<IdleChecker<u32, u8>> {
    ///         Some(IdleChecker::new(self.clone()))
    ///     }
    /// }
    /// # let _ = Ping.idle_checker();
    /// ```
    pub fn new<P>(probe: P) -> Self
    where
        P: Probe<K, S> + Send + 'static,
        K: std::hash::Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
        S: Clone + Send + 'static,
    {
        IdleChecker {
            start: Box::new(move |board, runtime| {
                runtime.spawn(crate::engine::keep_idle(board, probe));
            }),
        }
    }

    /// Starts the task on `board`, on `runtime`.
    pub(crate) fn start(self, board: Board<K, S>, runtime: &tokio::runtime::Handle) {
        (self.start)(board, runtime);
    }
}

impl<K, S> fmt::Debug for IdleChecker<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleChecker").finish_non_exhaustive()
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
    K: std::hash::Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    F: FnMut() -> Req + Clone + Send + 'static,
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
    Req: Send + 'static,
    C: Classify<S::Response, S::Error> + Clone + Send + 'static,
{
    fn sends_checks(&self) -> bool {
        true
    }

    fn idle_checker(&self) -> Option<IdleChecker<K, S>> {
        Some(IdleChecker::new(self.clone()))
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
    K: std::hash::Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    S: Clone + Send + 'static,
    F: FnMut(&K, S) -> ProbeFuture + Clone + Send + 'static,
{
    fn probe(&mut self, key: &K, service: S) -> Option<ProbeFuture> {
        Some((self.0)(key, service))
    }

    fn sends_checks(&self) -> bool {
        true
    }

    fn idle_checker(&self) -> Option<IdleChecker<K, S>> {
        Some(IdleChecker::new(self.clone()))
    }
}
