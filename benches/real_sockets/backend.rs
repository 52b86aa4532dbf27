//! Loopback backends with injected faults: hyper (HTTP/1.1 and HTTP/2, one server for both) and
//! tonic (gRPC `grpc.health.v1.Health/Check`). Each backend logs when it received every request,
//! so that traffic shares are measured where they land, the same way for every client stack.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::BoxStream;
use http_body::{Body, Frame};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// How a backend answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Healthy = 0,
    /// HTTP 503 / gRPC UNAVAILABLE.
    Unavailable = 1,
    /// HTTP 500 / gRPC INTERNAL.
    Internal = 2,
    /// Accepts and reads the request, never answers.
    BlackHole = 3,
    /// HTTP: headers and a first chunk, then the connection is cut (HTTP scenarios only).
    ResetMidBody = 4,
    /// Ten times the healthy latency and more ([`SLOW_LATENCY`]).
    Slow = 5,
    /// Three calls in ten fail (HTTP 500 / gRPC INTERNAL), in a fixed pattern.
    Gray = 6,
    /// The server is stopped: connections refused, open ones closed.
    Down = 7,
}

impl Mode {
    fn from_u8(value: u8) -> Mode {
        match value {
            1 => Mode::Unavailable,
            2 => Mode::Internal,
            3 => Mode::BlackHole,
            4 => Mode::ResetMidBody,
            5 => Mode::Slow,
            6 => Mode::Gray,
            7 => Mode::Down,
            _ => Mode::Healthy,
        }
    }
}

/// A healthy backend answers at once: a loopback round trip, about 0.1 ms. A slow one sleeps this
/// long first (tokio's timer rounds up to the next millisecond: 1 to 2 ms, 10 to 20 times as
/// long), so that a fresh connection's handshake costs what it costs next to a warm call.
pub const SLOW_LATENCY: Duration = Duration::from_millis(1);

/// What the no-detection stack's PeakEwma assumes of an endpoint it has not measured.
pub const DEFAULT_RTT: Duration = Duration::from_micros(100);

#[derive(Debug)]
struct State {
    mode: AtomicU8,
    served: AtomicU64,
    // Seconds since the run's start at which each request arrived.
    received: Mutex<Vec<f64>>,
    // Requests to the health-check path (probes, peers' checks): not traffic.
    checks: AtomicU64,
    start: Instant,
}

impl State {
    fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::SeqCst))
    }

    fn log(&self) {
        let at = self.start.elapsed().as_secs_f64();
        self.received.lock().unwrap().push(at);
    }

    /// Whether this request falls on a failing slot of the gray pattern.
    fn gray_fails(&self) -> bool {
        let n = self.served.fetch_add(1, Ordering::Relaxed);
        matches!(n % 10, 1 | 4 | 7)
    }
}

/// What kind of server a backend runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
}

/// One backend on 127.0.0.1: a fixed port, so it can be stopped and started again there.
pub struct Backend {
    pub addr: SocketAddr,
    state: Arc<State>,
    up: watch::Sender<bool>,
}

impl Backend {
    pub async fn start(protocol: Protocol, start: Instant) -> std::io::Result<Backend> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            mode: AtomicU8::new(Mode::Healthy as u8),
            served: AtomicU64::new(0),
            received: Mutex::new(Vec::new()),
            checks: AtomicU64::new(0),
            start,
        });
        let (up, up_rx) = watch::channel(true);
        tokio::spawn(serve(protocol, listener, addr, state.clone(), up_rx));
        Ok(Backend { addr, state, up })
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.mode.store(mode as u8, Ordering::SeqCst);
        let _ = self.up.send(mode != Mode::Down);
    }

    /// Arrival times of the requests (not health checks) this backend received.
    pub fn received(&self) -> Vec<f64> {
        self.state.received.lock().unwrap().clone()
    }
}

/// Accepts while up; when told down, closes the listener and every open connection, and binds
/// the same port again once up (refused connections in between). Ends with its `Backend`.
async fn serve(
    protocol: Protocol,
    mut listener: TcpListener,
    addr: SocketAddr,
    state: Arc<State>,
    mut up: watch::Receiver<bool>,
) {
    loop {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let _ = stream.set_nodelay(true);
                    connections.spawn(connection(protocol, stream, state.clone()));
                }
                changed = up.changed() => {
                    if changed.is_err() || !*up.borrow() {
                        break;
                    }
                }
                Some(_) = connections.join_next() => {}
            }
        }
        drop(listener);
        connections.shutdown().await;
        // Down until told up again; a dropped backend never comes back.
        loop {
            if up.changed().await.is_err() {
                return;
            }
            if *up.borrow() {
                break;
            }
        }
        listener = loop {
            match TcpListener::bind(addr).await {
                Ok(listener) => break listener,
                // The old socket may linger for a moment.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
    }
}

async fn connection(protocol: Protocol, stream: tokio::net::TcpStream, state: Arc<State>) {
    let io = TokioIo::new(stream);
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    match protocol {
        Protocol::Http => {
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(http_answer(&state, request).await) }
            });
            let _ = builder.serve_connection(io, service).await;
        }
        Protocol::Grpc => {
            let health = HealthServer::new(GrpcBackend { state });
            let service = hyper_util::service::TowerToHyperService::new(health);
            let _ = builder.http2_only().serve_connection(io, service).await;
        }
    }
}

type HttpBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn body(text: &'static str) -> HttpBody {
    use http_body_util::BodyExt;
    http_body_util::Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never| match never {})
        .boxed()
}

async fn http_answer(state: &State, request: http::Request<Incoming>) -> http::Response<HttpBody> {
    if request.uri().path() == "/healthz" {
        // Health checks see the same faults as traffic, but are not counted as traffic.
        state.checks.fetch_add(1, Ordering::Relaxed);
    } else {
        state.log();
    }
    let status = |code: u16, text: &'static str| {
        http::Response::builder()
            .status(code)
            .body(body(text))
            .unwrap()
    };
    match state.mode() {
        Mode::Healthy | Mode::Down => status(200, "ok\n"),
        Mode::Slow => {
            tokio::time::sleep(SLOW_LATENCY).await;
            status(200, "ok\n")
        }
        Mode::Unavailable => status(503, "unavailable\n"),
        Mode::Internal => status(500, "internal\n"),
        Mode::Gray => {
            if state.gray_fails() {
                status(500, "internal\n")
            } else {
                status(200, "ok\n")
            }
        }
        Mode::BlackHole => futures::future::pending().await,
        Mode::ResetMidBody => http::Response::builder()
            .status(200)
            .body(HttpBody::new(CutBody { sent: false }))
            .unwrap(),
    }
}

/// A body that sends one chunk and then fails, which makes hyper abort the connection.
struct CutBody {
    sent: bool,
}

impl Body for CutBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.sent {
            return Poll::Ready(Some(Err(std::io::Error::other("cut mid-body"))));
        }
        self.sent = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"partial")))))
    }
}

struct GrpcBackend {
    state: Arc<State>,
}

#[tonic::async_trait]
impl Health for GrpcBackend {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        if request.get_ref().service == "probe" {
            self.state.checks.fetch_add(1, Ordering::Relaxed);
        } else {
            self.state.log();
        }
        let serving = || {
            Ok(tonic::Response::new(HealthCheckResponse {
                status: ServingStatus::Serving as i32,
            }))
        };
        match self.state.mode() {
            Mode::Healthy | Mode::Down => serving(),
            Mode::Slow => {
                tokio::time::sleep(SLOW_LATENCY).await;
                serving()
            }
            Mode::Unavailable => Err(tonic::Status::unavailable("replica unavailable")),
            Mode::Internal => Err(tonic::Status::internal("replica broken")),
            Mode::Gray => {
                if self.state.gray_fails() {
                    Err(tonic::Status::internal("replica broken"))
                } else {
                    serving()
                }
            }
            Mode::BlackHole => futures::future::pending().await,
            // The scenario runs over HTTP only.
            Mode::ResetMidBody => Err(tonic::Status::internal("replica broken")),
        }
    }

    type WatchStream = BoxStream<'static, Result<HealthCheckResponse, tonic::Status>>;

    async fn watch(
        &self,
        _: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not served"))
    }
}
