//! Envoy's consecutive local-origin failure detector against a black hole on loopback: three
//! healthy HTTP servers and one that accepts connections, reads requests and never answers, behind
//! the recommended stack (hyper client, per-endpoint timeout, the outlier layer, p2c, buffer), with
//! four callers sending requests one after another.
//!
//! Until its first call times out nothing marks the black hole out, and it takes a few calls (at
//! most one per caller). Then p2c stops choosing it: its latency estimate is the timeout, which
//! takes tens of seconds to decay. The layer does not send it the four more calls its streak
//! would need to be judged: each would cost a caller a timeout, and p2c already routes around it.
//! It stays in the set, shown avoided, having cost at most one failed call per caller — what p2c
//! alone would cost.

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
use tower_outlier::detectors::{Detector, DetectorStats};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, Snapshot,
};

/// Short enough for a quick test, long enough that a healthy loopback call on a loaded machine
/// never hits it.
const TIMEOUT: Duration = Duration::from_millis(200);

/// Callers sending requests one after another, side by side.
const WORKERS: usize = 4;

/// A server on 127.0.0.1 that counts the connections it accepts and the requests it reads.
struct Server {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl Server {
    /// Answers every request with an empty 200, or — a black hole — none.
    async fn start(black_hole: bool) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (accepted, read) = (connections.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let read = read.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_: hyper::Request<Incoming>| {
                        read.fetch_add(1, Ordering::SeqCst);
                        async move {
                            if black_hole {
                                futures::future::pending::<()>().await;
                            }
                            Ok::<_, Infallible>(hyper::Response::new(Empty::<Bytes>::new()))
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
            connections,
            requests,
        }
    }
}

/// A hyper client pinned to one server: what a discover stream hands the balancer.
#[derive(Clone)]
struct Backend {
    addr: SocketAddr,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Service<http::Request<Empty<Bytes>>> for Backend {
    type Response = http::Response<Incoming>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<Empty<Bytes>>) -> Self::Future {
        *request.uri_mut() = format!("http://{}/", self.addr).parse().unwrap();
        let client = self.client.clone();
        Box::pin(async move { client.request(request).await.map_err(BoxError::from) })
    }
}

fn request() -> http::Request<Empty<Bytes>> {
    http::Request::get("http://placeholder/")
        .body(Empty::new())
        .unwrap()
}

/// What one run saw.
struct Run {
    /// The layer's view once the black hole was ejected and the survivors served 100 more calls.
    snapshot: Snapshot,
    stats: DetectorStats,
    healthy: Vec<Server>,
    black_hole: Server,
    /// Requests the black hole had read when it was ejected and the calls under way had ended.
    black_hole_requests: usize,
    /// Calls that got a response (the warm-up and the last 100 included), and calls that failed.
    succeeded: usize,
    failed: usize,
    elapsed: Duration,
}

/// Three healthy servers and a black hole behind the recommended stack under `config`; callers
/// send requests until the monitor shows the black hole avoided, then 100 more that must all
/// succeed.
async fn run(config: DetectorConfig) -> Run {
    let started = Instant::now();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let (tx, rx) = mpsc::unbounded::<Result<Change<SocketAddr, _>, Infallible>>();
    let discover = |server: &Server| {
        let backend = Backend {
            addr: server.addr,
            client: client.clone(),
        };
        // The timeout sits under the layer, so each black-holed call ends as a failure the layer
        // counts (a `Timeout`, local-origin) rather than a call that never completes.
        let endpoint = Timeout::new(backend, TIMEOUT);
        tx.unbounded_send(Ok(Change::Insert(server.addr, endpoint)))
            .unwrap();
    };
    let mut healthy = Vec::new();
    for _ in 0..3 {
        let server = Server::start(false).await;
        discover(&server);
        healthy.push(server);
    }

    let policy = DetectorPolicy::seeded(config, 7);
    let outliers = OutlierDetectionLayer::new(policy.clone());
    let monitor = outliers.monitor();
    let balancer = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(rx);

    // The healthy servers are measured before the black hole joins, and the layer starts it at
    // their mean latency, so it competes on equal terms. (Were every endpoint new and unmeasured
    // at once, the black hole would look the cheapest of all until its first call timed out.)
    let warm_up = 20;
    for _ in 0..warm_up {
        let response = balancer.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    let black_hole = Server::start(true).await;
    discover(&black_hole);

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let balancer = balancer.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut succeeded, mut failed) = (0, 0);
                while !stop.load(Ordering::SeqCst) {
                    // Spawned on its own: the buffer's future is `Send` where an `async` block
                    // holding it is not provably so (a higher-ranked lifetime limitation).
                    let call = tokio::spawn(balancer.clone().oneshot(request()));
                    match call.await.unwrap() {
                        Ok(response) => {
                            assert_eq!(response.status(), 200);
                            succeeded += 1;
                        }
                        Err(_) => failed += 1,
                    }
                }
                (succeeded, failed)
            })
        })
        .collect();

    // Statuses change when the balancer polls discovery, which the callers' requests keep doing.
    loop {
        let snapshot = monitor.snapshot();
        let avoided = snapshot
            .get_key(&black_hole.addr)
            .is_some_and(|e| e.avoided_for.is_some());
        if avoided {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the black hole was not shown avoided; it read {} requests: {snapshot:#?}",
            black_hole.requests.load(Ordering::SeqCst),
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (mut succeeded, mut failed) = (0, 0);
    for worker in workers {
        let (ok, err) = worker.await.unwrap();
        succeeded += ok;
        failed += err;
    }
    // Every call sent to the black hole has timed out by now: it will see no more.
    let black_hole_requests = black_hole.requests.load(Ordering::SeqCst);

    for _ in 0..100 {
        let response = balancer.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(
        black_hole.requests.load(Ordering::SeqCst),
        black_hole_requests,
        "an avoided endpoint received a request"
    );
    drop(tx);
    Run {
        snapshot: monitor.snapshot(),
        stats: policy.stats(),
        healthy,
        black_hole,
        black_hole_requests,
        succeeded: warm_up + succeeded + 100,
        failed,
        elapsed: started.elapsed(),
    }
}

impl Run {
    /// Checks what the black hole cost and how the layer shows it.
    fn check_avoided(&self) {
        let summary = self.summary();
        let black_hole = self.snapshot.get_key(&self.black_hole.addr).unwrap();
        assert_eq!(black_hole.status, EndpointStatus::Available, "{summary}");
        assert!(black_hole.last_reason.is_none(), "{summary}");
        assert!(black_hole.avoided_for.is_some(), "{summary}");
        // At most one call per caller reached it: the ones under way before its first timeout.
        let counts = black_hole.windows[0].counts;
        assert_eq!(counts.calls, counts.failures, "{summary}");
        assert!(
            (1..=WORKERS as u64).contains(&counts.failures),
            "the black hole failed {} calls, expected 1 to {WORKERS}: {summary}",
            counts.failures
        );
        // A request the server read is a call the layer sent; one could time out before it was
        // read, never the other way round.
        assert!(self.black_hole_requests as u64 <= counts.calls, "{summary}");
        assert!(self.failed as u64 >= counts.failures, "{summary}");
        // Nothing was detected: the streak stayed short of five.
        for detector in [
            Detector::ConsecutiveLocalOriginFailure,
            Detector::Consecutive5xx,
            Detector::ConsecutiveGatewayFailure,
        ] {
            assert_eq!(self.stats.detected(detector), 0, "{summary}");
        }

        // The healthy servers served everything else and stayed in rotation.
        let mut served = 0;
        for server in &self.healthy {
            let endpoint = self.snapshot.get_key(&server.addr).unwrap();
            assert_eq!(endpoint.status, EndpointStatus::Available, "{summary}");
            assert!(endpoint.last_reason.is_none(), "{summary}");
            assert!(endpoint.avoided_for.is_none(), "{summary}");
            let requests = server.requests.load(Ordering::SeqCst);
            assert!(requests > 0, "{summary}");
            served += requests;
        }
        // Every response came from a healthy server (which may also have read a request whose
        // caller timed out).
        assert!(served >= self.succeeded, "{summary}");
    }

    /// The counts, in one line.
    fn counts_line(&self) -> String {
        let healthy: Vec<_> = self
            .healthy
            .iter()
            .map(|s| s.requests.load(Ordering::SeqCst))
            .collect();
        format!(
            "black hole read {} requests on {} connections; healthy servers served {healthy:?}; \
             {} calls succeeded, {} failed; {:.2?}; {:?}",
            self.black_hole_requests,
            self.black_hole.connections.load(Ordering::SeqCst),
            self.succeeded,
            self.failed,
            self.elapsed,
            self.stats,
        )
    }

    /// The counts and the layer's view, for failure messages.
    fn summary(&self) -> String {
        format!("{}; {:#?}", self.counts_line(), self.snapshot)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_is_routed_around_without_calls_pulled_to_it_and_shown_avoided() {
    let _turn = crate::timed_turn().await;
    // Envoy's defaults, with the origins split and room to eject two of the four endpoints
    // (Envoy's default 10 % ejects none of four): the layer could eject the black hole, and
    // still sends it no call on purpose.
    let config = DetectorConfig::envoy()
        .split_external_local_origin_errors(true)
        .max_ejection_percent(50)
        .build()
        .unwrap();
    let run = run(config).await;
    run.check_avoided();
    println!("split: {}", run.counts_line());
}
