//! `GrpcHealth` against faulty health services on loopback: with every server NOT_SERVING the
//! balancer keeps one and calls succeed; a Watch call that fails, ends at once, or fails after a
//! message is called again after a back-off, never in a loop, and costs no call.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder};
use tower_outlier::grpc::{GrpcBody, GrpcErrors};
use tower_outlier::grpc_health::GrpcHealth;
use tower_outlier::{DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    NotServing,
    ErrorAlways,
    EndAtOnce,
    OneThenError,
    ErrorAfterNotServing,
}

struct Odd {
    mode: Mode,
    watches: Arc<AtomicUsize>,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

fn word(s: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse { status: s as i32 }
}

#[tonic::async_trait]
impl Health for Odd {
    async fn check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(word(ServingStatus::Serving)))
    }
    type WatchStream = WatchStream;
    async fn watch(&self, _: Request<HealthCheckRequest>) -> Result<Response<WatchStream>, Status> {
        let n = self.watches.fetch_add(1, Ordering::SeqCst);
        let s: WatchStream = match self.mode {
            Mode::NotServing => Box::pin(
                futures::stream::iter(vec![Ok(word(ServingStatus::NotServing))])
                    .chain(futures::stream::pending()),
            ),
            Mode::ErrorAlways => return Err(Status::unavailable("health is down")),
            Mode::EndAtOnce => Box::pin(futures::stream::empty()),
            Mode::OneThenError => Box::pin(futures::stream::iter(vec![
                Ok(word(ServingStatus::Serving)),
                Err(Status::internal("broke")),
            ])),
            Mode::ErrorAfterNotServing => {
                if n == 0 {
                    Box::pin(futures::stream::iter(vec![
                        Ok(word(ServingStatus::NotServing)),
                        Err(Status::internal("broke")),
                    ]))
                } else {
                    return Err(Status::unavailable("health is down"));
                }
            }
        };
        Ok(Response::new(s))
    }
}

async fn start(mode: Mode) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let watches = Arc::new(AtomicUsize::new(0));
    let incoming = futures::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(s, _)| s), l))
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(HealthServer::new(Odd {
                mode,
                watches: watches.clone(),
            }))
            .serve_with_incoming(incoming),
    );
    (addr, watches)
}

type Discovery = mpsc::UnboundedSender<Result<Change<SocketAddr, Channel>, Infallible>>;
type Balanced = BoxCloneService<
    http::Request<tonic::body::Body>,
    http::Response<GrpcBody<tonic::body::Body>>,
    BoxError,
>;

fn client(addrs: &[SocketAddr]) -> (HealthClient<Balanced>, tower_outlier::Monitor, Discovery) {
    let (tx, rx) = mpsc::unbounded();
    for a in addrs {
        let ch = Endpoint::from_shared(format!("http://{a}"))
            .unwrap()
            .connect_lazy();
        tx.unbounded_send(Ok(Change::Insert(*a, ch))).unwrap();
    }
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(GrpcErrors::default())
    .probe(GrpcHealth::new("app"));
    let monitor = layer.monitor();
    let b = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(layer)
        .service(rx);
    (HealthClient::new(BoxCloneService::new(b)), monitor, tx)
}

async fn calls(client: &HealthClient<Balanced>, span: Duration) -> (usize, usize) {
    let (mut ok, mut failed) = (0, 0);
    let until = std::time::Instant::now() + span;
    let mut c = client.clone();
    while std::time::Instant::now() < until {
        match tokio::time::timeout(
            Duration::from_secs(2),
            c.check(HealthCheckRequest {
                service: String::new(),
            }),
        )
        .await
        {
            Ok(Ok(_)) => ok += 1,
            _ => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (ok, failed)
}

/// Every server says NOT_SERVING: the balancer keeps one, calls keep succeeding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_not_serving() {
    let _turn = super::timed_turn().await;
    let mut addrs = vec![];
    for _ in 0..3 {
        addrs.push(start(Mode::NotServing).await.0);
    }
    let (client, monitor, _tx) = client(&addrs);
    let (ok, failed) = calls(&client, Duration::from_secs(2)).await;
    let st: Vec<_> = monitor
        .snapshot()
        .endpoints
        .iter()
        .map(|e| (e.status, e.not_serving, e.refused.is_some()))
        .collect();
    eprintln!("all not serving: ok {ok}, failed {failed}, {st:?}");
    assert_eq!(failed, 0);
    assert!(ok > 100);
    assert!(st.iter().any(|(s, _, _)| *s == EndpointStatus::Available));
}

/// Watch streams that fail: how often is Watch called in 6 s? (A58: back-off 1 s, x1.6.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_watches_are_not_called_in_a_loop() {
    let _turn = super::timed_turn().await;
    let modes = [
        Mode::ErrorAlways,
        Mode::EndAtOnce,
        Mode::OneThenError,
        Mode::ErrorAfterNotServing,
    ];
    let mut addrs = vec![];
    let mut counters = vec![];
    for m in modes {
        let (a, w) = start(m).await;
        addrs.push(a);
        counters.push(w);
    }
    let (client, monitor, _tx) = client(&addrs);
    let (ok, failed) = calls(&client, Duration::from_secs(6)).await;
    let counts: Vec<usize> = counters.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    let st: Vec<_> = addrs
        .iter()
        .map(|a| {
            monitor
                .snapshot()
                .get(&format!("{a:?}"))
                .map(|e| (e.status, e.not_serving))
        })
        .collect();
    eprintln!("watch calls in 6 s {modes:?}: {counts:?}; calls ok {ok} failed {failed}; {st:?}");
    for (mode, c) in modes.iter().zip(&counts) {
        assert!(
            *c <= 10,
            "{mode:?}: Watch called {c} times in 6 s (every mode: {modes:?} {counts:?})"
        );
    }
    assert_eq!(failed, 0);
}
