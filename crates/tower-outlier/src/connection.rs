//! Connection state as a signal: an endpoint whose connection is refused is picked by no call
//! until it connects again, as a gRPC subchannel in `TRANSIENT_FAILURE` is, and no request is
//! sent to find out.
//!
//! A hyper-util client or a tonic `Channel` says nothing about its connection until a call
//! fails: a balancer keeps picking an endpoint whose server is gone, and every pick is a failed
//! request until the layer's rules eject it. [`ConnectionWatch`] wraps the connector those
//! clients open connections with and remembers whether the last attempt to connect succeeded;
//! [`WhileConnected`] wraps the endpoint's service and, while its connection is refused, fails
//! `poll_ready` once with [`Disconnected`] and then stays `Pending`, trying to connect (through
//! the same connector: TLS and proxies included) with a back-off of 200 ms growing to 2 s,
//! jittered, until an attempt succeeds. When a connection the watch handed out ends (its server
//! closed it — a killed process's kernel does — or it failed, or the client let it go), the
//! gate tries to connect before the endpoint is picked again, `Pending` meanwhile: a server
//! killed while its connection was open costs no call at all, as a gRPC subchannel that sees
//! its connection close and reconnects before it is picked. The price is one connection attempt
//! (dropped at once) after each connection that ends; a server closing every connection after
//! one response (`Connection: close`) pays it on every call. Under an
//! [`OutlierDetectionLayer`](crate::OutlierDetectionLayer) that readiness error takes the
//! endpoint out of the balancer's picks at once; the [`Monitor`](crate::Monitor) shows it
//! `Unready`, the rules count it as an endpoint the balancer cannot pick (an ejection never takes
//! the last one it can), and it is back in the picks at the first attempt that connects (its
//! own, or the next after its back-off's wait when another handle connected meanwhile).
//! `hyper_client::PinnedClient::new` (feature `hyper-client`) watches its connection this way
//! already.
//!
//! Outside the layer, note that tower's p2c `Balance` drops an endpoint whose `poll_ready`
//! fails (as it does for tower's `Reconnect`), and a `Buffer` around a gated service fails for
//! good on the error; put the layer between the discover stream and the balancer. Each handle
//! (each clone of the gated service: the balancer's, a probe's) keeps its own back-off, and a
//! fresh one tries to connect at once; with a TLS connector each attempt is a full handshake.
//!
//! With tonic, one watch per endpoint carries the channel's connections
//! (`Endpoint::connect_with_connector_lazy(watch.clone())`) and gates the channel
//! (`watch.gate(channel, uri)`); any connector that is a `Service<Uri>` will do, as here:
//!
//! ```
//! use std::time::Duration;
//! use http::Uri;
//! use tower::{service_fn, timeout::Timeout};
//! use tower_outlier::connection::ConnectionWatch;
//!
//! // Stands in for a real connector (hyper-util's `HttpConnector`, a TLS one): connecting to
//! // `target` yields the connection.
//! let connector = service_fn(|_target: Uri| async { Ok::<_, std::io::Error>(()) });
//! let watch = ConnectionWatch::new(connector);
//! // The endpoint's client connects through `watch.clone()`; here, a stand-in service.
//! let client = service_fn(|_: ()| async { Ok::<_, std::io::Error>("answer") });
//! let target: Uri = "http://127.0.0.1:8081".parse().unwrap();
//! let endpoint = Timeout::new(watch.gate(client, target), Duration::from_secs(1));
//! // `endpoint` is the service a discover stream hands the layer for this server.
//! # let _ = endpoint;
//! assert!(!watch.is_refused());
//! ```

use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_outlier_core::{Dice, Lock};
use tower_service::Service;

mod io;
mod stats;

use io::Ended;
pub use io::WatchedIo;
pub(crate) use stats::ConnectionSink;
pub use stats::{ConnectionStats, DISCONNECT_REASONS};

/// The first wait after a failed attempt to connect, grown by [`GROWTH`] after each one in a row
/// up to [`MAX_WAIT`]: a server that restarts is reached again within about 2 s of listening,
/// and a server that stays down costs one connection attempt (a SYN answered by a reset) every
/// 2 s per handle, as HAProxy's default check interval does.
const FIRST_WAIT: Duration = Duration::from_millis(200);
const GROWTH: f64 = 1.6;
const MAX_WAIT: Duration = Duration::from_secs(2);
/// Each wait is drawn within ±20 % of its value, as gRPC's connection back-off is, so that the
/// clients of a fleet do not reconnect in lock-step.
const JITTER: f64 = 0.2;
/// How long one attempt may take before it counts as failed, when the connector sets no timeout
/// of its own (a server whose packets are dropped answers nothing).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connector that remembers whether its last connection attempt succeeded: the connection
/// state of one endpoint, shared by its clones.
///
/// Give one watch per endpoint to the client that connects to it (a hyper-util `Client`, a tonic
/// `Endpoint::connect_with_connector_lazy`), and [`gate`](Self::gate) the endpoint's service with
/// it. Every connection the client opens goes through the watch: a failure to connect (refused,
/// unreachable, timed out, a TLS handshake that fails inside the connector) marks the endpoint
/// refused; a connection made marks it connected. The module's documentation says what the gate
/// does with it.
pub struct ConnectionWatch<C> {
    connector: C,
    state: Arc<State>,
}

struct State {
    // `REFUSED` and `CLOSED` bits; zero while connected.
    bits: AtomicU8,
    // Seeds the jitter of the gates of this endpoint.
    dice: Dice,
    // What its connections did, for the metrics (gRFC A94's).
    attempts_succeeded: AtomicU64,
    attempts_failed: AtomicU64,
    open: AtomicU64,
    ended: [AtomicU64; DISCONNECT_REASONS.len()],
    // The `grpc.target` its metrics carry: the name given, or the first address it connects to.
    target: OnceLock<Box<str>>,
    // Registries counting its connections (`metrics::OutlierMetrics::watch_connections`): told
    // on the connect path, never per call.
    sinks: Lock<Vec<Arc<dyn ConnectionSink>>>,
}

/// The last attempt to connect failed.
const REFUSED: u8 = 1;
/// A connection the watch handed out has ended (closed by its server, failed, or dropped by its
/// client) since the last connection was made: the server may be gone.
const CLOSED: u8 = 2;

impl State {
    #[inline]
    fn bits(&self) -> u8 {
        self.bits.load(Ordering::Relaxed)
    }

    fn connected(&self) {
        // Read first: a healthy endpoint's connections write nothing other cores read.
        if self.bits() != 0 && self.bits.swap(0, Ordering::Relaxed) & REFUSED != 0 {
            tracing::info!(target: "tower_outlier", "an endpoint connected again");
        }
    }

    fn refused(&self) {
        if self.bits.fetch_or(REFUSED, Ordering::Relaxed) & REFUSED == 0 {
            tracing::info!(target: "tower_outlier", "an endpoint's connection was refused: out of the balancer's picks until it connects");
        }
    }

    fn closed(&self) {
        self.bits.fetch_or(CLOSED, Ordering::Relaxed);
    }

    #[cfg(feature = "standard-metrics")]
    fn target(&self, attempted: &Uri) -> &str {
        self.target.get_or_init(|| attempted.to_string().into())
    }

    /// An attempt to connect to `target` ended: `connected` or not.
    fn attempted(&self, target: &Uri, connected: bool) {
        // Counted and told under the sinks' lock, so that a sink joining sees each connection
        // either open already or opening through it, never both or neither.
        let sinks = self.sinks.lock();
        if connected {
            self.attempts_succeeded.fetch_add(1, Ordering::Relaxed);
            self.open.fetch_add(1, Ordering::Relaxed);
        } else {
            self.attempts_failed.fetch_add(1, Ordering::Relaxed);
        }
        for sink in sinks.iter() {
            sink.attempted(connected);
        }
        drop(sinks);
        #[cfg(feature = "standard-metrics")]
        crate::standard_metrics::connection_attempted(self.target(target), connected);
        #[cfg(not(feature = "standard-metrics"))]
        let _ = target;
    }

    /// A connection it handed out ended, for the reason at `reason` in [`DISCONNECT_REASONS`];
    /// `None`: it is no longer watched ([`WatchedIo::into_inner`]), and no disconnection.
    fn ended(&self, reason: Option<u8>) {
        let sinks = self.sinks.lock();
        let _ = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if let Some(reason) = reason {
            self.ended[usize::from(reason)].fetch_add(1, Ordering::Relaxed);
        }
        let reason = reason.map(|r| DISCONNECT_REASONS[usize::from(r)]);
        for sink in sinks.iter() {
            sink.ended(reason);
        }
        drop(sinks);
        #[cfg(feature = "standard-metrics")]
        if let Some(target) = self.target.get() {
            crate::standard_metrics::connection_ended(target, reason);
        }
    }
}

impl<C> ConnectionWatch<C> {
    /// Watches the connections `connector` opens. It starts out connected (nothing was refused).
    pub fn new(connector: C) -> Self {
        // Seeded by where this watch lives, so that the clients of a fleet draw different waits.
        static WATCHES: AtomicU64 = AtomicU64::new(0);
        let seed = {
            // `RandomState` draws its keys at random once per thread.
            std::collections::hash_map::RandomState::new()
                .hash_one((std::process::id(), WATCHES.fetch_add(1, Ordering::Relaxed)))
        };
        ConnectionWatch {
            connector,
            state: Arc::new(State {
                bits: AtomicU8::new(0),
                dice: Dice::new(seed),
                attempts_succeeded: AtomicU64::new(0),
                attempts_failed: AtomicU64::new(0),
                open: AtomicU64::new(0),
                ended: Default::default(),
                target: OnceLock::new(),
                sinks: Lock::new(Vec::new()),
            }),
        }
    }

    /// Names the endpoint in its connection metrics (`grpc.target`; gRPC uses the channel's
    /// target URI). Without a name, the first address it connects to.
    ///
    /// ```
    /// use http::Uri;
    /// use tower::service_fn;
    /// use tower_outlier::connection::ConnectionWatch;
    ///
    /// let connector = service_fn(|_: Uri| async { Ok::<_, std::io::Error>(()) });
    /// let watch = ConnectionWatch::new(connector).named("dns:///orders.internal:50051");
    /// assert_eq!(watch.stats().attempts_succeeded, 0);
    /// ```
    pub fn named(self, target: impl Into<String>) -> Self {
        let _ = self.state.target.set(target.into().into_boxed_str());
        self
    }

    /// Has `sink` told of every connection attempt and end from now on.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn add_sink(&self, sink: Arc<dyn ConnectionSink>) {
        let mut sinks = self.state.sinks.lock();
        // Watched twice into the same series, it would count every event twice.
        if sinks.iter().any(|known| known.same_as(&*sink)) {
            return;
        }
        // The connections open already end through it: counted open in it from now.
        sink.joined(self.state.open.load(Ordering::Relaxed));
        sinks.push(sink);
    }

    /// What its connections did since it was made: attempts that connected and failed,
    /// connections open, and those that ended by reason (gRFC A94's subchannel metrics, which
    /// the `standard-metrics` feature also records through the `metrics` facade, and
    /// `metrics::OutlierMetrics::watch_connections` exports to Prometheus).
    pub fn stats(&self) -> ConnectionStats {
        let state = &self.state;
        ConnectionStats {
            attempts_succeeded: state.attempts_succeeded.load(Ordering::Relaxed),
            attempts_failed: state.attempts_failed.load(Ordering::Relaxed),
            open_connections: state.open.load(Ordering::Relaxed),
            disconnections: std::array::from_fn(|i| state.ended[i].load(Ordering::Relaxed)),
        }
    }

    /// Whether the last attempt to connect failed (and none succeeded since).
    pub fn is_refused(&self) -> bool {
        self.state.bits() & REFUSED != 0
    }

    /// The connector inside.
    pub fn get_ref(&self) -> &C {
        &self.connector
    }

    /// `service`, picked by the balancer only while this watch's endpoint is connected; while it
    /// is refused, the gate tries to connect to `target` through this watch (the scheme and
    /// authority matter: the address the service's own connections go to).
    pub fn gate<S>(&self, service: S, target: Uri) -> WhileConnected<S>
    where
        C: Service<Uri> + Clone + Send + Sync + 'static,
        C::Future: Send,
        C::Response: Send,
    {
        WhileConnected {
            inner: service,
            gate: Gate::new(self.clone(), target),
        }
    }
}

impl<C: Clone> Clone for ConnectionWatch<C> {
    fn clone(&self) -> Self {
        ConnectionWatch {
            connector: self.connector.clone(),
            state: self.state.clone(),
        }
    }
}

impl<C: fmt::Debug> fmt::Debug for ConnectionWatch<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionWatch")
            .field("connector", &self.connector)
            .field("refused", &self.is_refused())
            .finish()
    }
}

impl<C> Service<Uri> for ConnectionWatch<C>
where
    C: Service<Uri>,
{
    type Response = WatchedIo<C::Response>;
    type Error = C::Error;
    type Future = Connecting<C::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.connector.poll_ready(cx)
    }

    fn call(&mut self, target: Uri) -> Self::Future {
        Connecting {
            inner: self.connector.call(target.clone()),
            state: self.state.clone(),
            target,
            done: false,
        }
    }
}

pin_project! {
    /// A connection attempt through a [`ConnectionWatch`]: its outcome becomes the endpoint's
    /// connection state.
    pub struct Connecting<F> {
        #[pin]
        inner: F,
        state: Arc<State>,
        target: Uri,
        // Whether the attempt ended (and was counted); one dropped before is a failed attempt.
        done: bool,
    }

    impl<F> PinnedDrop for Connecting<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !*this.done {
                // Abandoned (a caller's timeout, a check's): no connection came of it.
                this.state.attempted(this.target, false);
            }
        }
    }
}

impl<F, T, E> Future for Connecting<F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<WatchedIo<T>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let outcome = std::task::ready!(this.inner.poll(cx));
        *this.done = true;
        Poll::Ready(match outcome {
            Ok(io) => {
                this.state.connected();
                this.state.attempted(this.target, true);
                Ok(WatchedIo {
                    inner: io,
                    ended: Ended {
                        state: Some(this.state.clone()),
                        reason: None,
                        blind: false,
                    },
                })
            }
            Err(error) => {
                this.state.refused();
                this.state.attempted(this.target, false);
                Err(error)
            }
        })
    }
}

impl<F> fmt::Debug for Connecting<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connecting").finish_non_exhaustive()
    }
}

/// The error a [`WhileConnected`] service's `poll_ready` returns once when its endpoint's
/// connection is refused: the layer then holds the endpoint out of the balancer's picks until the
/// service is ready again (the gate stays `Pending` while it reconnects).
#[derive(Debug)]
pub struct Disconnected(());

impl fmt::Display for Disconnected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the endpoint's connection was refused; reconnecting with a back-off")
    }
}

impl std::error::Error for Disconnected {}

type Attempt = Pin<Box<dyn Future<Output = bool> + Send>>;
type StartAttempt = Arc<dyn Fn() -> Attempt + Send + Sync>;

/// The readiness of one handle on an endpoint, from its [`ConnectionWatch`]: what
/// [`WhileConnected`] and `PinnedClient` ask before anything else in `poll_ready`.
pub(crate) struct Gate {
    state: Arc<State>,
    start: StartAttempt,
    // The attempt in flight. In a lock only so that the handle stays `Sync`: it is reached
    // through `&mut self` (`Lock::get_mut`), never locked.
    attempt: Lock<Option<Attempt>>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    failed: u32,
    // Whether this handle told its owner (the layer) with `Disconnected` since it was refused.
    told: bool,
    // Whether this handle has been through an episode (an attempt, a wait, a report) since its
    // last reset: the fast path resets it once the endpoint is connected again.
    dirty: bool,
}

impl Gate {
    pub(crate) fn new<C>(watch: ConnectionWatch<C>, target: Uri) -> Self
    where
        C: Service<Uri> + Clone + Send + Sync + 'static,
        C::Future: Send,
        C::Response: Send,
    {
        let state = watch.state.clone();
        let start: StartAttempt = Arc::new(move || {
            let mut watch = watch.clone();
            let target = target.clone();
            let state = watch.state.clone();
            Box::pin(async move {
                let attempt = async {
                    futures::future::poll_fn(|cx| watch.poll_ready(cx))
                        .await
                        .ok()?;
                    // The connection is dropped (unwatched: its end says nothing of the server):
                    // the client opens its own when a call needs one.
                    watch
                        .call(target.clone())
                        .await
                        .ok()
                        .map(|io| drop(io.into_inner()))
                };
                match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await {
                    Ok(Some(())) => true,
                    Ok(None) => {
                        // The connector's own failure marked it refused; its readiness error
                        // did not go through it.
                        state.refused();
                        false
                    }
                    Err(_) => {
                        // No answer within the attempt's time: as refused as a reset says (the
                        // attempt dropped counts itself failed).
                        state.refused();
                        false
                    }
                }
            })
        });
        Gate {
            state,
            start,
            attempt: Lock::new(None),
            wait: None,
            failed: 0,
            told: false,
            dirty: false,
        }
    }

    /// Ready while connected. While refused: an attempt to connect at once (a handle that has
    /// not tried yet), then `Err(Disconnected)` once if it fails, then `Pending` with the
    /// back-off's timer or the attempt registered, until an attempt (this handle's or another's)
    /// connects.
    #[inline]
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Disconnected>> {
        if self.state.bits() == 0 {
            if self.dirty {
                // An attempt, a wait or a report of an earlier episode: none of it holds now (a
                // half-run attempt kept would be trusted in the next episode).
                self.reset();
            }
            return Poll::Ready(Ok(()));
        }
        self.poll_suspect(cx)
    }

    /// Refused, or a connection ended: an attempt to connect decides (this handle's, or any
    /// connection made meanwhile).
    #[cold]
    fn poll_suspect(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Disconnected>> {
        self.dirty = true;
        loop {
            let slot = self.attempt.get_mut();
            if let Some(running) = slot.as_mut() {
                let connected = std::task::ready!(running.as_mut().poll(cx));
                *slot = None;
                if connected || self.state.bits() == 0 {
                    self.reset();
                    return Poll::Ready(Ok(()));
                }
                self.failed = self.failed.saturating_add(1);
                let wait = self.next_wait();
                self.wait = Some(Box::pin(tokio::time::sleep(wait)));
                if !self.told {
                    self.told = true;
                    return Poll::Ready(Err(Disconnected(())));
                }
                continue;
            }
            if let Some(wait) = self.wait.as_mut() {
                std::task::ready!(wait.as_mut().poll(cx));
                self.wait = None;
                if self.state.bits() == 0 {
                    self.reset();
                    return Poll::Ready(Ok(()));
                }
            }
            let attempt = (self.start)();
            *self.attempt.get_mut() = Some(attempt);
        }
    }

    fn next_wait(&self) -> Duration {
        let grown =
            FIRST_WAIT.as_secs_f64() * GROWTH.powi(self.failed.saturating_sub(1).min(16) as i32);
        let capped = grown.min(MAX_WAIT.as_secs_f64());
        let jitter = 1.0 + JITTER * (2.0 * self.state.dice.unit() - 1.0);
        Duration::from_secs_f64(capped * jitter)
    }

    fn reset(&mut self) {
        *self.attempt.get_mut() = None;
        self.wait = None;
        self.failed = 0;
        self.told = false;
        self.dirty = false;
    }
}

impl Clone for Gate {
    /// A fresh handle on the same endpoint: it tries to connect at once if the endpoint is
    /// refused (a probe's handle on an ejected endpoint finds out for itself).
    fn clone(&self) -> Self {
        Gate {
            state: self.state.clone(),
            start: self.start.clone(),
            attempt: Lock::new(None),
            wait: None,
            failed: 0,
            told: false,
            dirty: false,
        }
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("refused", &(self.state.bits() & REFUSED != 0))
            .field("failed_attempts", &self.failed)
            .finish_non_exhaustive()
    }
}

/// A service picked only while its endpoint is connected: see the [module](self). Made by
/// [`ConnectionWatch::gate`]. Its errors are boxed (its own [`Disconnected`] beside the
/// service's), as tower's middleware boxes them.
#[derive(Clone, Debug)]
pub struct WhileConnected<S> {
    inner: S,
    gate: Gate,
}

impl<S> WhileConnected<S> {
    /// The service inside.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, Req> Service<Req> for WhileConnected<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        std::task::ready!(self.gate.poll(cx))?;
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project! {
    /// The response of a [`WhileConnected`] service (or a `PinnedClient`), its error boxed.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F> ResponseFuture<F> {
    #[cfg(feature = "hyper-client")]
    pub(crate) fn new(inner: F) -> Self {
        ResponseFuture { inner }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map_err(Into::into)
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tower::ServiceExt;

    /// A connector that decides when called whether the server accepts, and answers 10 ms later.
    fn connector(
        up: Arc<AtomicBool>,
    ) -> impl Service<Uri, Response = (), Error = std::io::Error, Future: Send> + Clone + Send + Sync
    {
        tower::service_fn(move |_: Uri| {
            let accepts = up.load(Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if accepts {
                    Ok(())
                } else {
                    Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
                }
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_left_half_run_is_not_trusted_in_a_later_episode() {
        let up = Arc::new(AtomicBool::new(true));
        let watch = ConnectionWatch::new(connector(up.clone()));
        let target: Uri = "http://server/".parse().unwrap();
        let mut gate = Gate::new(watch.clone(), target.clone());
        // A connection ended: the gate starts an attempt (which would succeed) and waits on it.
        watch.state.closed();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(gate.poll(&mut cx).is_pending());
        // Another handle connects meanwhile: the gate is ready without its attempt.
        let connection = watch.clone().oneshot(target.clone()).await.unwrap();
        let () = connection.into_inner();
        assert!(matches!(gate.poll(&mut cx), Poll::Ready(Ok(()))));
        // The server is killed later and its connection closes: a fresh attempt decides, and it
        // is refused (the first attempt, had it been kept, would say it connected).
        up.store(false, Ordering::SeqCst);
        watch.state.closed();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let outcome = futures::future::poll_fn(|cx| gate.poll(cx)).await;
        assert!(outcome.is_err(), "a stale attempt was trusted");
        assert!(watch.is_refused());
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_times_out_marks_the_endpoint_refused() {
        let watch = ConnectionWatch::new(tower::service_fn(|_: Uri| {
            futures::future::pending::<Result<(), std::io::Error>>()
        }));
        let mut gate = Gate::new(watch.clone(), "http://server/".parse().unwrap());
        watch.state.closed();
        let outcome = futures::future::poll_fn(|cx| gate.poll(cx)).await;
        assert!(outcome.is_err());
        assert!(watch.is_refused());
    }
}
