//! The client stacks under test, each behind one `Caller`: tower's stack with no detection
//! (PeakEwma + p2c), tower-outlier's presets in the README's recommended stack (a timeout per
//! endpoint, the layer, p2c, a buffer), and a single client in front of a reverse proxy
//! (nginx, HAProxy). Real hyper-util clients for HTTP, real tonic `Channel`s for gRPC.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::Change;
use tower::load::{CompleteOnResponse, PeakEwmaDiscover};
use tower::timeout::Timeout;
use tower::util::BoxService;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_outlier::connection::{ConnectionWatch, WhileConnected};
use tower_outlier::events::Event;
use tower_outlier::grpc::GrpcErrors;
use tower_outlier::latency::{LatencyConfig, LatencyPolicy};
use tower_outlier::policy::OutlierPolicy;
use tower_outlier::probe::{probe_fn, ProbeFuture};
use tower_outlier::{
    ComposedPolicy, DetectorConfig, DetectorPolicy, ErrorRateConfig, ErrorRatePolicy, Monitor,
    OutlierDetectionLayer, ServerErrors,
};

use crate::backend::Protocol;
pub use crate::sample::{Sample, TIMEOUT};

/// A tower-outlier configuration under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// What the README recommends: `DetectorConfig::recommended()` with an active probe (a GET of
    /// `/healthz`, or the gRPC health check).
    Recommended,
    Edas,
    /// EDAS with `min_calls(5)` and `max_ejection_ratio(0.5)`, as a new user of a small fleet
    /// would set it.
    EdasSmallFleet,
    Hsf,
    /// Envoy's defaults with `max_ejection_percent` 50.
    Envoy50,
    Grpc,
    Linkerd,
    /// The recommended configuration or the latency rule (its recommended preset), composed
    /// (`ComposedPolicy::any_of`), with the recommended active probe.
    RecommendedOrLatency,
    /// Finagle's default failure accrual (`finagle::finagle()`).
    Finagle,
}

impl Preset {
    pub fn name(self) -> &'static str {
        match self {
            Preset::Recommended => "tower-outlier, recommended",
            Preset::Edas => "tower-outlier, EDAS preset",
            Preset::EdasSmallFleet => "tower-outlier, EDAS, min_calls 5, max 50 %",
            Preset::Hsf => "tower-outlier, HSF preset",
            Preset::Envoy50 => "tower-outlier, Envoy preset, max 50 %",
            Preset::Grpc => "tower-outlier, gRPC preset",
            Preset::Linkerd => "tower-outlier, linkerd preset",
            Preset::RecommendedOrLatency => "tower-outlier, recommended or latency (recommended)",
            Preset::Finagle => "tower-outlier, Finagle preset",
        }
    }

    fn policy(self) -> Arc<dyn PolicyFactory> {
        match self {
            Preset::Recommended => Arc::new(|| {
                DetectorPolicy::new(DetectorConfig::recommended().build().expect("valid"))
            }),
            Preset::Edas => Arc::new(|| {
                ErrorRatePolicy::new(ErrorRateConfig::edas_spring_cloud().build().expect("valid"))
            }),
            Preset::EdasSmallFleet => Arc::new(|| {
                ErrorRatePolicy::new(
                    ErrorRateConfig::edas_spring_cloud()
                        .min_calls(5)
                        .max_ejection_ratio(0.5)
                        .build()
                        .expect("valid"),
                )
            }),
            Preset::Hsf => {
                Arc::new(|| ErrorRatePolicy::new(ErrorRateConfig::hsf().build().expect("valid")))
            }
            Preset::Envoy50 => Arc::new(|| {
                DetectorPolicy::new(
                    DetectorConfig::envoy()
                        .max_ejection_percent(50)
                        .build()
                        .expect("valid"),
                )
            }),
            Preset::Grpc => {
                Arc::new(|| DetectorPolicy::new(DetectorConfig::grpc().build().expect("valid")))
            }
            Preset::Linkerd => {
                Arc::new(|| DetectorPolicy::new(DetectorConfig::linkerd().build().expect("valid")))
            }
            Preset::RecommendedOrLatency => Arc::new(|| {
                ComposedPolicy::any_of()
                    .member(DetectorPolicy::new(
                        DetectorConfig::recommended().build().expect("valid"),
                    ))
                    .member(LatencyPolicy::new(
                        LatencyConfig::recommended().build().expect("valid"),
                    ))
                    .build()
                    .expect("valid")
            }),
            Preset::Finagle => Arc::new(tower_outlier::finagle::finagle),
        }
    }

    /// Whether the configuration checks ejected endpoints with an active probe.
    fn probes(self) -> bool {
        matches!(self, Preset::Recommended | Preset::RecommendedOrLatency)
    }
}

trait PolicyFactory: Send + Sync {
    fn layer(&self) -> OutlierDetectionLayer;
}

impl<F, P> PolicyFactory for F
where
    F: Fn() -> P + Send + Sync,
    P: OutlierPolicy,
{
    fn layer(&self) -> OutlierDetectionLayer {
        OutlierDetectionLayer::new(self())
    }
}

/// The client stack of one cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stack {
    NoDetection,
    Outlier(Preset),
    /// One client to a reverse proxy in front of the backends.
    Proxy(crate::peers::Proxy),
    /// grpcio's C-core client, driven from Python.
    Grpcio,
}

impl Stack {
    pub fn name(self) -> &'static str {
        match self {
            Stack::NoDetection => "no detection (PeakEwma + p2c)",
            Stack::Outlier(preset) => preset.name(),
            Stack::Proxy(proxy) => proxy.name(),
            Stack::Grpcio => "grpcio (C-core), outlier_detection_experimental",
        }
    }
}

/// What the layer decided, with the time (seconds since the run's start).
#[derive(Clone, Debug)]
pub struct Decision {
    pub at: f64,
    pub endpoint: usize,
    pub ejected: bool,
}

pub type Call = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// A built stack: how to send one request, and the layer's monitor and decisions if it has one.
pub struct Caller {
    pub call: Call,
    pub monitor: Option<Monitor>,
    pub decisions: Arc<Mutex<Vec<Decision>>>,
    // Keeps the discover streams open for the run.
    _discovery: Box<dyn Send + Sync>,
}

/// One backend's HTTP client: a hyper-util client pinned to the backend's address (its own
/// connection pool), sending GETs of `/` there.
#[derive(Clone)]
struct HttpEndpoint {
    client: Client<ConnectionWatch<HttpConnector>, Empty<Bytes>>,
    authority: http::uri::Authority,
    // The client's connections go through it; only the layer's stacks read it (`watched`).
    watch: ConnectionWatch<HttpConnector>,
}

type HttpRequest = http::Request<Empty<Bytes>>;

impl HttpEndpoint {
    fn new(addr: SocketAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(TIMEOUT));
        let watch = ConnectionWatch::new(connector);
        HttpEndpoint {
            client: Client::builder(TokioExecutor::new()).build(watch.clone()),
            authority: addr
                .to_string()
                .parse()
                .expect("an address is an authority"),
            watch,
        }
    }

    /// The endpoint as the layer's stacks use it: picked only while its connection is not
    /// refused (`tower_outlier::connection`), as `PinnedClient::new` is.
    fn watched(addr: SocketAddr) -> WhileConnected<Self> {
        let endpoint = HttpEndpoint::new(addr);
        let target = format!("http://{addr}/").parse().expect("a URI");
        endpoint.watch.clone().gate(endpoint, target)
    }
}

impl Service<HttpRequest> for HttpEndpoint {
    type Response = http::Response<Incoming>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<http::Response<Incoming>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: HttpRequest) -> Self::Future {
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let uri = format!("http://{}{}", self.authority, path);
        let client = self.client.clone();
        Box::pin(async move {
            *request.uri_mut() = uri.parse()?;
            Ok(client.request(request).await?)
        })
    }
}

fn get(path: &str) -> HttpRequest {
    http::Request::get(path)
        .body(Empty::new())
        .expect("a valid request")
}

type HttpBalanced =
    Buffer<HttpRequest, BoxFuture<'static, Result<http::Response<Incoming>, BoxError>>>;

/// Sends one GET through `service` and reads the whole body: a good answer is a 2xx whose body
/// arrived in full, within the caller's timeout.
fn http_call<S>(service: S) -> Call
where
    S: Service<HttpRequest, Response = http::Response<Incoming>, Error = BoxError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    Arc::new(move || {
        let service = service.clone();
        Box::pin(async move {
            let answer = async {
                let response = service.oneshot(get("/")).await.ok()?;
                let good = response.status().is_success();
                response.into_body().collect().await.ok()?;
                Some(good)
            };
            matches!(
                tokio::time::timeout(TIMEOUT * 2, answer).await,
                Ok(Some(true))
            )
        })
    })
}

// Erased at construction, where rustc can see that the buffer's future is `Send`; inside the
// callers' async blocks it cannot (a higher-ranked `From` bound on the buffer's error).
type GrpcBalanced = tower::util::BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    BoxError,
>;

/// One `grpc.health.v1.Health/Check` with an empty request, built by hand (no generated client
/// needed for one method).
fn grpc_call(buffer: GrpcBalanced) -> Call {
    Arc::new(move || {
        let buffer = buffer.clone();
        Box::pin(async move {
            let answer = async {
                // A gRPC message frame: uncompressed, zero bytes long.
                let frame = http_body_util::Full::new(Bytes::from_static(&[0, 0, 0, 0, 0]));
                let request = http::Request::post("http://backend/grpc.health.v1.Health/Check")
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(tonic::body::Body::new(frame))
                    .ok()?;
                let response = buffer.oneshot(request).await.ok()?;
                let in_headers = response.headers().get("grpc-status").cloned();
                let collected = response.into_body().collect().await.ok()?;
                let status =
                    in_headers.or_else(|| collected.trailers()?.get("grpc-status").cloned());
                Some(status.is_some_and(|s| s == "0"))
            };
            matches!(
                tokio::time::timeout(TIMEOUT * 2, answer).await,
                Ok(Some(true))
            )
        })
    })
}

/// Builds `stack` over `backends` (in-process stacks only; peers are in `peers.rs`).
pub fn build(stack: Stack, protocol: Protocol, backends: &[SocketAddr], start: Instant) -> Caller {
    let decisions = Arc::new(Mutex::new(Vec::new()));
    match (stack, protocol) {
        (Stack::NoDetection, Protocol::Http) => {
            let (tx, rx) = mpsc::unbounded();
            for (i, addr) in backends.iter().enumerate() {
                let service = Timeout::new(HttpEndpoint::new(*addr), TIMEOUT);
                tx.unbounded_send(Ok::<_, Infallible>(Change::Insert(i, service)))
                    .expect("open");
            }
            let discover = PeakEwmaDiscover::new(
                rx,
                crate::backend::DEFAULT_RTT,
                Duration::from_secs(10),
                CompleteOnResponse::default(),
            );
            let balance = Balance::new(discover);
            let buffer: HttpBalanced = Buffer::new(BoxService::new(balance), 1024);
            Caller {
                call: http_call(buffer),
                monitor: None,
                decisions,
                _discovery: Box::new(tx),
            }
        }
        (Stack::NoDetection, Protocol::Grpc) => {
            let (tx, rx) = mpsc::unbounded();
            for (i, addr) in backends.iter().enumerate() {
                let service = Timeout::new(channel(*addr), TIMEOUT);
                tx.unbounded_send(Ok::<_, Infallible>(Change::Insert(i, service)))
                    .expect("open");
            }
            let discover = PeakEwmaDiscover::new(
                rx,
                crate::backend::DEFAULT_RTT,
                Duration::from_secs(10),
                CompleteOnResponse::default(),
            );
            let balance = Balance::new(discover).map_response(|r| r.map(tonic::body::Body::new));
            let buffer = GrpcBalanced::new(Buffer::new(BoxService::new(balance), 1024));
            Caller {
                call: grpc_call(buffer),
                monitor: None,
                decisions,
                _discovery: Box::new(tx),
            }
        }
        (Stack::Outlier(preset), Protocol::Http) => {
            let (tx, rx) = mpsc::unbounded();
            for (i, addr) in backends.iter().enumerate() {
                let service = Timeout::new(HttpEndpoint::watched(*addr), TIMEOUT);
                tx.unbounded_send(Ok::<_, Infallible>(Change::Insert(i, service)))
                    .expect("open");
            }
            let layer = preset.policy().layer().classifier(ServerErrors);
            let monitor = layer.monitor();
            watch(&monitor, &decisions, start);
            let balance = if preset.probes() {
                let probe = probe_fn(
                    |_: &usize, service: Timeout<WhileConnected<HttpEndpoint>>| {
                        Box::pin(async move {
                            matches!(service.oneshot(get("/healthz")).await,
                            Ok(response) if response.status().is_success())
                        }) as ProbeFuture
                    },
                );
                BoxService::new(Balance::new(layer.probe(probe).layer(rx)))
            } else {
                BoxService::new(Balance::new(layer.layer(rx)))
            };
            let buffer: HttpBalanced = Buffer::new(balance, 1024);
            Caller {
                call: http_call(buffer),
                monitor: Some(monitor),
                decisions,
                _discovery: Box::new(tx),
            }
        }
        (Stack::Outlier(preset), Protocol::Grpc) => {
            let (tx, rx) = mpsc::unbounded();
            for (i, addr) in backends.iter().enumerate() {
                let service = Timeout::new(watched_channel(*addr), TIMEOUT);
                tx.unbounded_send(Ok::<_, Infallible>(Change::Insert(i, service)))
                    .expect("open");
            }
            let layer = preset.policy().layer().classifier(GrpcErrors::default());
            let monitor = layer.monitor();
            watch(&monitor, &decisions, start);
            let balance = if preset.probes() {
                let probe = probe_fn(|_: &usize, service: Timeout<WhileConnected<Channel>>| {
                    Box::pin(async move {
                        let mut client = HealthClient::new(service);
                        let request = HealthCheckRequest {
                            service: "probe".into(),
                        };
                        client.check(request).await.is_ok()
                    }) as ProbeFuture
                });
                let balance = Balance::new(layer.probe(probe).layer(rx));
                BoxService::new(balance.map_response(|r| r.map(tonic::body::Body::new)))
            } else {
                let balance = Balance::new(layer.layer(rx));
                BoxService::new(balance.map_response(|r| r.map(tonic::body::Body::new)))
            };
            let buffer = GrpcBalanced::new(Buffer::new(balance, 1024));
            Caller {
                call: grpc_call(buffer),
                monitor: Some(monitor),
                decisions,
                _discovery: Box::new(tx),
            }
        }
        (Stack::Proxy(_), _) => {
            // One address: the proxy's.
            let endpoint = Timeout::new(HttpEndpoint::new(backends[0]), TIMEOUT);
            let service = endpoint.map_err(BoxError::from);
            let buffer: HttpBalanced = Buffer::new(BoxService::new(service), 1024);
            Caller {
                call: http_call(buffer),
                monitor: None,
                decisions,
                _discovery: Box::new(()),
            }
        }
        (Stack::Grpcio, _) => unreachable!("grpcio runs in its own process"),
    }
}

fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("an address is a URI")
        .connect_timeout(TIMEOUT)
        .tcp_nodelay(true)
        .connect_lazy()
}

/// A channel connecting through a watch, picked only while its connection is not refused
/// (`tower_outlier::connection`): what gRPC's own client knows of its subchannels.
fn watched_channel(addr: SocketAddr) -> WhileConnected<Channel> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(TIMEOUT));
    let watch = ConnectionWatch::new(connector);
    let target: http::Uri = format!("http://{addr}").parse().expect("a URI");
    let channel = Endpoint::from(target.clone()).connect_with_connector_lazy(watch.clone());
    watch.gate(channel, target)
}

/// Records ejections and re-admissions with their time.
fn watch(monitor: &Monitor, decisions: &Arc<Mutex<Vec<Decision>>>, start: Instant) {
    let decisions = decisions.clone();
    monitor.on_event(move |event| {
        let (key, ejected) = match event {
            Event::Ejected { key, .. } => (key, true),
            Event::Readmitted { key, .. } => (key, false),
            _ => return,
        };
        if let Some(&endpoint) = key.downcast_ref::<usize>() {
            decisions.lock().unwrap().push(Decision {
                at: start.elapsed().as_secs_f64(),
                endpoint,
                ejected,
            });
        }
    });
}
