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
use tower_outlier_core::{Dice, Lock};
use tower_service::Service;

mod gate;
mod io;
mod stats;

pub(crate) use gate::Gate;
pub use gate::{Disconnected, ResponseFuture, WhileConnected};

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
