//! Network faults on loopback, behind the README's stack (a 1 s timeout per endpoint, the layer
//! with `DetectorConfig::recommended()` and a probe of `/healthz`, p2c, a buffer; one
//! `PinnedClient` per server), requests sent one after another:
//!
//! * a server killed (listener and every open connection closed) and started again on the same
//!   port: out of the picks within a few calls (unready, its connection refused, or ejected), and
//!   back to half its share within 10 s of the restart;
//! * a half-open peer (accepts, never reads, never answers) under large uploads: it costs callers
//!   at most a few timeouts before p2c and the layer route around it, while the healthy servers
//!   take the rest.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::timeout::Timeout;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_outlier::hyper_client::PinnedClient;
use tower_outlier::probe::request_probe;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, Monitor, OutlierDetectionLayer, ServerErrors,
};

/// A server answering 200 (counting the requests other than probes); aborting its task closes
/// the listener and every connection it holds.
pub(crate) fn serve(listener: TcpListener, requests: Arc<AtomicUsize>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let requests = requests.clone();
            connections.spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: http::Request<Incoming>| {
                        if request.uri().path() != "/healthz" {
                            requests.fetch_add(1, Ordering::SeqCst);
                        }
                        async move {
                            // Read the whole upload before answering, as a real handler would.
                            let _ = request.into_body().collect().await;
                            Ok::<_, Infallible>(http::Response::new(Full::<Bytes>::from("ok")))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// A peer that accepts connections and then neither reads nor writes: a half-open connection
/// from the client's side (its writes fill the socket buffers and block).
fn half_open(listener: TcpListener, accepted: Arc<AtomicUsize>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    })
}

type Body = Full<Bytes>;
type Balanced = BoxCloneService<http::Request<Body>, http::Response<Incoming>, BoxError>;
type Discovery =
    mpsc::UnboundedSender<Result<Change<SocketAddr, Timeout<PinnedClient<Body>>>, Infallible>>;

fn stack(addrs: &[SocketAddr]) -> (Balanced, Monitor, Discovery) {
    let (discovery, changes) = mpsc::unbounded();
    for &addr in addrs {
        discovery
            .unbounded_send(Ok(Change::Insert(
                addr,
                Timeout::new(PinnedClient::new(addr), Duration::from_secs(1)),
            )))
            .unwrap();
    }
    let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(ServerErrors)
    .probe(request_probe(
        || {
            http::Request::get("/healthz")
                .body(Full::<Bytes>::default())
                .unwrap()
        },
        ServerErrors,
    ));
    let monitor = outliers.monitor();
    let balancer = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(changes);
    (BoxCloneService::new(balancer), monitor, discovery)
}

/// One request through the stack, within 5 s: whether it got a 200.
async fn send(balancer: &Balanced, body: Bytes) -> bool {
    let request = http::Request::post("/upload")
        .body(Full::new(body))
        .unwrap();
    let call = tokio::spawn(balancer.clone().oneshot(request));
    match tokio::time::timeout(Duration::from_secs(5), call).await {
        Ok(Ok(Ok(response))) => {
            let ok = response.status() == 200;
            let _ = response.into_body().collect().await;
            ok
        }
        Ok(Ok(Err(_))) => false,
        Ok(Err(panic)) => panic!("the call panicked: {panic}"),
        Err(_) => panic!("a call took more than 5 s: the stack is stuck"),
    }
}

fn status(monitor: &Monitor, addr: SocketAddr) -> EndpointStatus {
    monitor.snapshot().get_key(&addr).unwrap().status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_and_restarted_on_its_port_is_taken_out_and_comes_back() {
    let _turn = crate::timed_turn().await;
    let mut addrs = Vec::new();
    let mut counts = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        tasks.push(serve(listener, requests.clone()));
        counts.push(requests);
    }
    let (balancer, monitor, _discovery) = stack(&addrs);
    let body = Bytes::from_static(b"small");
    for _ in 0..30 {
        assert!(send(&balancer, body.clone()).await, "all servers are up");
    }
    assert!(
        counts[0].load(Ordering::SeqCst) > 0,
        "every server has served"
    );

    // Killed: its listener and kept-alive connections close.
    tasks[0].abort();
    let _ = (&mut tasks[0]).await;
    let killed = Instant::now();
    let mut failed = 0;
    while !matches!(
        status(&monitor, addrs[0]),
        EndpointStatus::Ejected | EndpointStatus::Unready
    ) {
        if !send(&balancer, body.clone()).await {
            failed += 1;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the killed server was not taken out ({failed} failed): {:#?}",
            monitor.snapshot()
        );
    }
    assert!(failed <= 5, "{failed} calls failed before it was out");

    // Started again on the same port.
    let listener = TcpListener::bind(addrs[0]).await.unwrap();
    tasks[0] = serve(listener, counts[0].clone());
    let restarted = Instant::now();
    // Each second's calls per server and the restarted server's latency estimate after it, for
    // the failure message.
    let mut history = Vec::new();
    loop {
        let before: Vec<usize> = counts.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        let second = Instant::now() + Duration::from_secs(1);
        while Instant::now() < second {
            assert!(
                send(&balancer, body.clone()).await,
                "a call failed after the restart"
            );
        }
        let got: Vec<usize> = counts
            .iter()
            .zip(&before)
            .map(|(c, b)| c.load(Ordering::SeqCst) - b)
            .collect();
        let all: usize = got.iter().sum();
        if got[0] * 3 * 2 >= all {
            break;
        }
        let estimate = monitor
            .snapshot()
            .get_key(&addrs[0])
            .map(|e| e.latency_estimate);
        history.push((got, estimate));
        assert!(
            restarted.elapsed() < Duration::from_secs(10),
            "no half share within 10 s of the restart ({history:?}): {:#?}",
            monitor.snapshot()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_peer_costs_callers_a_few_timeouts_at_most() {
    let _turn = crate::timed_turn().await;
    let mut addrs = Vec::new();
    let mut counts = Vec::new();
    let accepted = Arc::new(AtomicUsize::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    addrs.push(listener.local_addr().unwrap());
    let _peer = half_open(listener, accepted.clone());
    let mut servers = Vec::new();
    for _ in 0..2 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        servers.push(serve(listener, requests.clone()));
        counts.push(requests);
    }
    let (balancer, monitor, _discovery) = stack(&addrs);
    // Uploads larger than the loopback socket buffers: a write to the peer blocks.
    let body = Bytes::from(vec![b'x'; 16 << 20]);
    let sent = 40;
    let mut failed = 0;
    for _ in 0..sent {
        if !send(&balancer, body.clone()).await {
            failed += 1;
        }
    }
    let served: usize = counts.iter().map(|c| c.load(Ordering::SeqCst)).sum();
    assert!(accepted.load(Ordering::SeqCst) > 0, "the peer was tried");
    assert!(
        failed <= 3,
        "{failed} of {sent} calls failed: {:#?}",
        monitor.snapshot()
    );
    assert_eq!(served, sent - failed, "the healthy servers took the rest");
    // The monitor calls an endpoint avoided once its last call failed a second ago or more.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let standing = monitor.snapshot().get_key(&addrs[0]).cloned().unwrap();
    assert!(
        standing.status == EndpointStatus::Ejected || standing.avoided_for.is_some(),
        "the peer is ejected or reported avoided: {standing:#?}"
    );
}
