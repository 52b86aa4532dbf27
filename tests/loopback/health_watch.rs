//! gRPC health checking (`tower_outlier::grpc_health::GrpcHealth`) against tonic-health servers on
//! loopback: each server's `grpc.health.v1.Health` is tonic-health's own (`HealthReporter`), its
//! `Check` calls counted as the callers' traffic (service `""`, always serving), its `Watch` of the
//! service `"app"` what the layer follows. A server switched to NOT_SERVING while traffic flows
//! leaves rotation with no failed call, and is back within one `Watch` message of SERVING; a
//! server without `Watch` (UNIMPLEMENTED) counts as serving.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder};
use tower_outlier::events::{Event, Readmission};
use tower_outlier::grpc::{GrpcBody, GrpcErrors};
use tower_outlier::grpc_health::GrpcHealth;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, Monitor, OutlierDetectionLayer,
};

/// tonic-health's service, its `Check` calls counted; without `Watch` when `watchless` (a
/// server that answers UNIMPLEMENTED, as one without the health service does); with
/// `healthless`, every call the layer makes (`Watch`, and `Check` of the service `"app"`) answers
/// UNIMPLEMENTED, as a server without `grpc.health.v1` does, while the callers' `Check("")`
/// stands for its application; those fail (UNAVAILABLE) while `broken`.
struct Counted {
    inner: HealthService,
    checks: Arc<AtomicUsize>,
    watchless: bool,
    healthless: bool,
    broken: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl Health for Counted {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        if self.healthless && request.get_ref().service == "app" {
            return Err(Status::unimplemented("no grpc.health.v1 here"));
        }
        self.checks.fetch_add(1, Ordering::SeqCst);
        if self.broken.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the application is down"));
        }
        self.inner.check(request).await
    }

    type WatchStream = <HealthService as Health>::WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        if self.watchless || self.healthless {
            return Err(Status::unimplemented("no Watch here"));
        }
        self.inner.watch(request).await
    }
}

struct TestServer {
    addr: SocketAddr,
    reporter: HealthReporter,
    checks: Arc<AtomicUsize>,
    broken: Arc<AtomicBool>,
}

impl TestServer {
    async fn start(watchless: bool) -> TestServer {
        TestServer::started(watchless, false).await
    }

    /// A server without `grpc.health.v1` (see [`Counted`]).
    async fn healthless() -> TestServer {
        TestServer::started(true, true).await
    }

    async fn started(watchless: bool, healthless: bool) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reporter = HealthReporter::new();
        reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        reporter
            .set_service_status("app", tonic_health::ServingStatus::Serving)
            .await;
        let checks = Arc::new(AtomicUsize::new(0));
        let broken = Arc::new(AtomicBool::new(false));
        let health = Counted {
            inner: HealthService::from_health_reporter(reporter.clone()),
            checks: checks.clone(),
            watchless,
            healthless,
            broken: broken.clone(),
        };
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let stream = listener.accept().await.map(|(stream, _)| {
                let _ = stream.set_nodelay(true);
                stream
            });
            Some((stream, listener))
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(HealthServer::new(health))
                .serve_with_incoming(incoming),
        );
        TestServer {
            addr,
            reporter,
            checks,
            broken,
        }
    }

    fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }

    fn key(&self) -> String {
        format!("{:?}", self.addr)
    }
}

type Discovery = mpsc::UnboundedSender<Result<Change<SocketAddr, Channel>, Infallible>>;
type Balanced = BoxCloneService<http::Request<Body>, http::Response<GrpcBody<Body>>, BoxError>;

/// One `Channel` per server through the layer (gRPC classifier, the recommended rules, health
/// watched), p2c and a buffer; a generated client on top. Every event is kept with its time.
type Events = Arc<Mutex<Vec<(Instant, Event)>>>;

fn client(
    servers: &[TestServer],
) -> (
    HealthClient<Balanced>,
    Monitor,
    Discovery,
    Events,
    tower_outlier::monitor::EventCallback,
) {
    let (discovery, changes) = mpsc::unbounded::<Result<Change<SocketAddr, Channel>, Infallible>>();
    for server in servers {
        let channel = Endpoint::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect_lazy();
        discovery
            .unbounded_send(Ok(Change::Insert(server.addr, channel)))
            .unwrap();
    }
    let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(GrpcErrors::default())
    .probe(GrpcHealth::new("app"));
    let monitor = outliers.monitor();
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let callback =
        monitor.on_event(move |event| sink.lock().unwrap().push((Instant::now(), event.clone())));
    let balancer = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(changes);
    (
        HealthClient::new(BoxCloneService::new(balancer)),
        monitor,
        discovery,
        events,
        callback,
    )
}

/// One caller sending `Check("")` back to back until `stop`: the calls that failed.
async fn caller(mut client: HealthClient<Balanced>, stop: Arc<AtomicBool>) -> usize {
    let mut failed = 0;
    while !stop.load(Ordering::SeqCst) {
        let call = client.check(HealthCheckRequest {
            service: String::new(),
        });
        match tokio::time::timeout(Duration::from_secs(5), call).await {
            Ok(Ok(answer)) if answer.get_ref().status() == ServingStatus::Serving => {}
            _ => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    failed
}

/// Four callers until `stop`: the calls that failed. Run beside the test's own steps in its task
/// (the generated client's futures are not `Send` for every lifetime `tokio::spawn` asks).
async fn traffic(client: &HealthClient<Balanced>, stop: Arc<AtomicBool>) -> usize {
    let callers = (0..4).map(|_| caller(client.clone(), stop.clone()));
    futures::future::join_all(callers).await.into_iter().sum()
}

fn status(monitor: &Monitor, server: &TestServer) -> Option<EndpointStatus> {
    monitor.snapshot().get(&server.key()).map(|e| e.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_set_not_serving_leaves_rotation_with_no_failed_call_and_returns_on_serving() {
    let _turn = super::timed_turn().await;
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(TestServer::start(false).await);
    }
    let (client, monitor, _discovery, events, _callback) = client(&servers);
    let stop = Arc::new(AtomicBool::new(false));
    let steps = async {
        // In rotation first. A first call slowed by the machine (the connection's setup under a
        // loaded CI runner) can leave p2c's estimate of this server above the others' for a while:
        // p2c of three never picks the costliest, so wait for its traffic rather than a fixed time.
        let warm = Instant::now();
        while servers[0].checks() <= 20 {
            assert!(
                warm.elapsed() < Duration::from_secs(20),
                "{} calls in 20 s: {:#?}",
                servers[0].checks(),
                monitor.snapshot().get(&servers[0].key())
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Draining: the server says it is not serving while it still answers.
        servers[0]
            .reporter
            .set_service_status("app", tonic_health::ServingStatus::NotServing)
            .await;
        let said = Instant::now();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(status(&monitor, &servers[0]), Some(EndpointStatus::Ejected));
        let shown = monitor.snapshot().get(&servers[0].key()).unwrap().clone();
        assert_eq!(
            shown.last_reason.as_ref().unwrap().policy,
            "health",
            "{shown:#?}"
        );
        let out_from = servers[0].checks();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            servers[0].checks(),
            out_from,
            "calls reached the server that said it is not serving"
        );
        let out_at = events
            .lock()
            .unwrap()
            .iter()
            .find_map(|(at, event)| matches!(event, Event::Ejected { .. }).then_some(*at))
            .expect("an ejection event");
        eprintln!("out {:?} after NOT_SERVING", out_at.duration_since(said));
        // Serving again: back at the next Watch message.
        servers[0]
            .reporter
            .set_service_status("app", tonic_health::ServingStatus::Serving)
            .await;
        let serving = Instant::now();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let back_at = events
            .lock()
            .unwrap()
            .iter()
            .find_map(|(at, event)| match event {
                Event::Readmitted {
                    cause: Readmission::Serving,
                    trial: None,
                    ..
                } => Some(*at),
                _ => None,
            })
            .expect("re-admitted when it said it is serving");
        let back_after = back_at.duration_since(serving);
        eprintln!("back {back_after:?} after SERVING");
        assert!(back_after < Duration::from_millis(100), "{back_after:?}");
        let back_from = servers[0].checks();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            servers[0].checks() > back_from + 20,
            "{} calls in the second after it came back",
            servers[0].checks() - back_from
        );
        stop.store(true, Ordering::SeqCst);
    };
    let (failed, ()) = tokio::join!(traffic(&client, stop.clone()), steps);
    assert_eq!(failed, 0, "failed calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_watch_counts_as_serving() {
    let _turn = super::timed_turn().await;
    let servers = vec![
        TestServer::start(true).await,
        TestServer::start(false).await,
        TestServer::start(false).await,
    ];
    let (client, monitor, _discovery, _events, _callback) = client(&servers);
    let stop = Arc::new(AtomicBool::new(false));
    let steps = async {
        // A second at least; longer if a first call slowed by a loaded machine left p2c's
        // estimate of the watchless server above the others' (p2c of three never picks the
        // costliest) — the point is that it is served, not how soon.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let warm = Instant::now();
        while servers[0].checks() <= 20 && warm.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::SeqCst);
    };
    let (failed, ()) = tokio::join!(traffic(&client, stop.clone()), steps);
    assert_eq!(failed, 0);
    assert_eq!(
        status(&monitor, &servers[0]),
        Some(EndpointStatus::Available)
    );
    assert!(servers[0].checks() > 20, "{} calls", servers[0].checks());
    let shown = monitor.snapshot().get(&servers[0].key()).unwrap().clone();
    assert!(!shown.not_serving, "{shown:#?}");
}

/// A server without `grpc.health.v1` that the rules ejected is re-admitted by `GrpcHealth`'s
/// recovery check once it heals: `Check` answering UNIMPLEMENTED counts as serving there as it does
/// in the watch (before, every check failed and the server stayed out for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_health_service_ejected_by_the_rules_comes_back_once_healed() {
    let _turn = super::timed_turn().await;
    let servers = vec![
        TestServer::healthless().await,
        TestServer::healthless().await,
        TestServer::healthless().await,
    ];
    let (client, monitor, _discovery, events, _callback) = client(&servers);
    let stop = Arc::new(AtomicBool::new(false));
    let steps = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        servers[0].broken.store(true, Ordering::SeqCst);
        let out = async {
            while status(&monitor, &servers[0]) != Some(EndpointStatus::Ejected) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), out)
            .await
            .expect("the broken server is ejected");
        servers[0].broken.store(false, Ordering::SeqCst);
        let healed = Instant::now();
        let back = async {
            while status(&monitor, &servers[0]) != Some(EndpointStatus::Available) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let shown = || monitor.snapshot().get(&servers[0].key()).cloned();
        tokio::time::timeout(Duration::from_secs(15), back)
            .await
            .unwrap_or_else(|_| panic!("still out 15 s after healing: {:#?}", shown()));
        eprintln!("back {:?} after healing", healed.elapsed());
        let readmitted = events
            .lock()
            .unwrap()
            .iter()
            .any(|(_, event)| matches!(event, Event::Readmitted { .. }));
        assert!(readmitted, "no re-admission event");
        let from = servers[0].checks();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            servers[0].checks() > from + 20,
            "{} calls in the second after it came back",
            servers[0].checks() - from
        );
        stop.store(true, Ordering::SeqCst);
    };
    let (_failed, ()) = tokio::join!(traffic(&client, stop.clone()), steps);
}
