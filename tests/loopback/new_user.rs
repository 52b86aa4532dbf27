//! A new user's first deployment, on loopback: three hyper servers, one answering 503 from its
//! first request, a hyper-util client per server behind the README's stack (a timeout per
//! endpoint, the layer with `DetectorConfig::recommended()` and a probe of `/healthz`, p2c, a
//! buffer), requests sent one after another. The failing server is ejected within a few of its
//! calls, and once it heals it has half its share back within ten seconds. Three runs at once,
//! since the way p2c and a fresh connection's handshake interact varies from run to run.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use futures::future::BoxFuture;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::timeout::Timeout;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_outlier::probe::request_probe;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, ServerErrors,
};

/// A server on 127.0.0.1 answering 200, or 503 while `unavailable` is set; it counts the
/// requests (not the probes of `/healthz`) it answers.
pub(super) struct Server {
    pub(super) addr: SocketAddr,
    pub(super) unavailable: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
}

impl Server {
    pub(super) async fn start(unavailable: bool) -> Server {
        let unavailable = Arc::new(AtomicBool::new(unavailable));
        let state = unavailable.clone();
        let mut server = Server::answering(move |_, _| {
            if state.load(Ordering::SeqCst) {
                503
            } else {
                200
            }
        })
        .await;
        server.unavailable = unavailable;
        server
    }

    /// A server whose answer to a request for `path` has the status `answer(path, n)`, `n` the
    /// number of requests before it (from 0; `/healthz` is not counted).
    pub(super) async fn answering(
        answer: impl Fn(&str, usize) -> u16 + Send + Sync + 'static,
    ) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let (answer, counter) = (Arc::new(answer), requests.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let (answer, counter) = (answer.clone(), counter.clone());
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request: http::Request<Incoming>| {
                            let path = request.uri().path();
                            let n = if path == "/healthz" {
                                counter.load(Ordering::SeqCst)
                            } else {
                                counter.fetch_add(1, Ordering::SeqCst)
                            };
                            let status = answer(path, n);
                            async move {
                                Ok::<_, Infallible>(
                                    http::Response::builder()
                                        .status(status)
                                        .body(Empty::<Bytes>::new())
                                        .unwrap(),
                                )
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Server {
            addr,
            unavailable: Arc::default(),
            requests,
        }
    }

    pub(super) fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// A hyper-util client pinned to one server, keeping the request's path.
#[derive(Clone)]
pub(super) struct Upstream {
    pub(super) addr: SocketAddr,
    pub(super) client: Client<HttpConnector, Empty<Bytes>>,
}

impl Service<http::Request<Empty<Bytes>>> for Upstream {
    type Response = http::Response<Incoming>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<Empty<Bytes>>) -> Self::Future {
        let path = request.uri().path().to_owned();
        *request.uri_mut() = format!("http://{}{path}", self.addr).parse().unwrap();
        let client = self.client.clone();
        Box::pin(async move { client.request(request).await.map_err(BoxError::from) })
    }
}

/// The upstream a discover stream gives for the servers at `addrs`: one hyper-util client shared
/// by them, each server its own `Upstream` with a 1 s timeout, as the README's stack has it. The
/// sender keeps the stream open.
pub(super) type Endpoint = Timeout<Upstream>;
type Discovered = Result<Change<SocketAddr, Endpoint>, Infallible>;

pub(super) fn discovery(
    addrs: impl IntoIterator<Item = SocketAddr>,
) -> (
    mpsc::UnboundedSender<Discovered>,
    mpsc::UnboundedReceiver<Discovered>,
) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new()).build(connector);
    let (tx, rx) = mpsc::unbounded();
    for addr in addrs {
        let upstream = Upstream {
            addr,
            client: client.clone(),
        };
        tx.unbounded_send(Ok(Change::Insert(
            addr,
            Timeout::new(upstream, Duration::from_secs(1)),
        )))
        .unwrap();
    }
    (tx, rx)
}

pub(super) fn get(path: &str) -> http::Request<Empty<Bytes>> {
    http::Request::get(path).body(Empty::new()).unwrap()
}

/// One run: returns how many calls the failing server received before its ejection and the
/// seconds after healing until it had half its share of a second's traffic.
async fn run() -> (usize, f64) {
    let servers = [
        Server::start(true).await,
        Server::start(false).await,
        Server::start(false).await,
    ];
    let (tx, rx) = discovery(servers.iter().map(|s| s.addr));
    let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(ServerErrors)
    .probe(request_probe(|| get("/healthz"), ServerErrors));
    let monitor = outliers.monitor();
    let balancer = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(rx);
    let call = || {
        let balancer = balancer.clone();
        // Spawned: the buffer's future is `Send` where an `async` block holding it is not
        // provably so (a higher-ranked lifetime limitation).
        tokio::spawn(balancer.oneshot(get("/")))
    };

    let started = Instant::now();
    loop {
        let _ = call().await.unwrap();
        let status = monitor.snapshot().get_key(&servers[0].addr).unwrap().status;
        if status == EndpointStatus::Ejected {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the failing server was not ejected: {:#?}",
            monitor.snapshot()
        );
    }
    let before_ejection = servers[0].requests();
    // Out for a while, then healed.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let _ = call().await.unwrap();
    }
    servers[0].unavailable.store(false, Ordering::SeqCst);
    let healed = Instant::now();
    loop {
        let before: Vec<usize> = servers.iter().map(Server::requests).collect();
        let second = Instant::now() + Duration::from_secs(1);
        while Instant::now() < second {
            let response = call().await.unwrap().unwrap();
            assert_eq!(response.status(), 200, "a healthy server answered");
        }
        let got: Vec<usize> = servers
            .iter()
            .zip(&before)
            .map(|(s, b)| s.requests() - b)
            .collect();
        let all: usize = got.iter().sum();
        if got[0] * 3 * 2 >= all {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(10),
            "no half share within 10 s of healing ({got:?}): {:#?}",
            monitor.snapshot()
        );
    }
    drop(tx);
    (before_ejection, healed.elapsed().as_secs_f64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_503_from_the_start_is_ejected_and_back_within_ten_seconds_of_healing() {
    let _turn = crate::timed_turn().await;
    let runs = futures::future::join_all((0..3).map(|_| tokio::spawn(run()))).await;
    for run in runs {
        let (calls, back_after) = run.unwrap();
        // Three in a row eject; a call or two more can be under way when the third fails.
        assert!(calls <= 5, "{calls} calls reached the failing server");
        println!(
            "ejected after {calls} calls; half its share back {back_after:.1} s after healing"
        );
    }
}
