//! Real tonic servers on loopback, a generated tonic client (`tonic_health::pb::HealthClient`)
//! calling through the outlier layer (with the gRPC classifier), p2c and a buffer: a server
//! answering UNAVAILABLE is ejected and gets no calls afterwards; a server answering NOT_FOUND (the
//! caller's fault) is not ejected, unless the classifier is told to count NOT_FOUND.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::stream::BoxStream;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder};
use tower_outlier::grpc::{self, GrpcBody, GrpcErrors};
use tower_outlier::{
    EndpointStatus, ErrorRateConfig, ErrorRatePolicy, Monitor, OutlierDetectionLayer,
};

const SERVING: u8 = 0;
const UNAVAILABLE: u8 = 1;
const NOT_FOUND: u8 = 2;

/// The health service of one test server: answers as `mode` says and counts the calls it gets.
struct TestHealth {
    mode: Arc<AtomicU8>,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Health for TestHealth {
    async fn check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.mode.load(Ordering::SeqCst) {
            UNAVAILABLE => Err(Status::unavailable("broken replica")),
            NOT_FOUND => Err(Status::not_found("no such service")),
            _ => Ok(Response::new(HealthCheckResponse {
                status: ServingStatus::Serving as i32,
            })),
        }
    }

    type WatchStream = BoxStream<'static, Result<HealthCheckResponse, Status>>;

    async fn watch(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// One tonic server on 127.0.0.1, port picked by the OS.
struct TestServer {
    addr: SocketAddr,
    calls: Arc<AtomicUsize>,
}

impl TestServer {
    async fn start(mode: u8) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let health = TestHealth {
            mode: Arc::new(AtomicU8::new(mode)),
            calls: calls.clone(),
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
        TestServer { addr, calls }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn key(&self) -> String {
        format!("{:?}", self.addr)
    }
}

type Discovery = mpsc::UnboundedSender<Result<Change<SocketAddr, Channel>, Infallible>>;
type Balanced = BoxCloneService<http::Request<Body>, http::Response<GrpcBody<Body>>, BoxError>;

/// One lazily connected `Channel` per server, fed through a channel-backed discover stream into
/// the outlier layer (gRPC classifier), p2c and a buffer; a generated client on top.
///
/// The discovery sender is returned so the discover stream stays open for the whole test.
fn client(
    servers: &[TestServer],
    classifier: GrpcErrors,
) -> (HealthClient<Balanced>, Monitor, Discovery) {
    let (discovery, changes) = mpsc::unbounded::<Result<Change<SocketAddr, Channel>, Infallible>>();
    for server in servers {
        let channel = Endpoint::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect_lazy();
        discovery
            .unbounded_send(Ok(Change::Insert(server.addr, channel)))
            .unwrap();
    }
    let outliers = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .window(Duration::from_secs(10))
            .min_calls(5)
            .max_ejection_ratio(0.5)
            // No recovery check during the test.
            .recovery_unit(Duration::from_secs(600))
            .build()
            .unwrap(),
    ))
    .classifier(classifier);
    let monitor = outliers.monitor();
    let balancer = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(changes);
    (
        HealthClient::new(BoxCloneService::new(balancer)),
        monitor,
        discovery,
    )
}

/// One `Check` call through the balancer: the serving status, or the gRPC status code.
async fn check(client: &HealthClient<Balanced>) -> Result<ServingStatus, Code> {
    let mut client = client.clone();
    let call = client.check(HealthCheckRequest {
        service: String::new(),
    });
    match tokio::time::timeout(Duration::from_secs(5), call).await {
        Ok(Ok(response)) => Ok(response.into_inner().status()),
        Ok(Err(status)) => Err(status.code()),
        Err(_) => panic!("a call through the balancer took more than 5 s"),
    }
}

/// `n` calls at once (so p2c sees load and spreads them), all awaited.
async fn batch(client: &HealthClient<Balanced>, n: usize) -> Vec<Result<ServingStatus, Code>> {
    futures::future::join_all((0..n).map(|_| check(client))).await
}

fn status(monitor: &Monitor, server: &TestServer) -> Option<EndpointStatus> {
    monitor.snapshot().get(&server.key()).map(|e| e.status)
}

/// Sends batches until the monitor shows `server` ejected; panics after 10 s.
async fn until_ejected(client: &HealthClient<Balanced>, monitor: &Monitor, server: &TestServer) {
    let started = Instant::now();
    while status(monitor, server) != Some(EndpointStatus::Ejected) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} was not ejected: {:#?}",
            server.key(),
            monitor.snapshot()
        );
        batch(client, 16).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_unavailable_is_ejected_and_gets_no_more_calls() {
    let servers = [
        TestServer::start(SERVING).await,
        TestServer::start(SERVING).await,
        TestServer::start(UNAVAILABLE).await,
    ];
    let (client, monitor, _discovery) = client(&servers, GrpcErrors::default());

    until_ejected(&client, &monitor, &servers[2]).await;
    let snapshot = monitor.snapshot();
    let broken = snapshot.get(&servers[2].key()).unwrap();
    assert!(broken.last_reason.is_some(), "{broken:#?}");
    assert!(
        servers[2].calls() >= 5,
        "ejected after {} calls",
        servers[2].calls()
    );
    for healthy in &servers[..2] {
        assert_eq!(
            status(&monitor, healthy),
            Some(EndpointStatus::Available),
            "{snapshot:#?}"
        );
    }

    // From now on the healthy servers serve every call, and the broken one gets none.
    let broken_before = servers[2].calls();
    let healthy_before: Vec<usize> = servers[..2].iter().map(TestServer::calls).collect();
    let mut answered = 0;
    for _ in 0..5 {
        for result in batch(&client, 20).await {
            assert_eq!(result, Ok(ServingStatus::Serving));
            answered += 1;
        }
    }
    assert_eq!(
        servers[2].calls(),
        broken_before,
        "calls to the ejected server"
    );
    let healthy_calls: Vec<usize> = servers[..2]
        .iter()
        .zip(&healthy_before)
        .map(|(server, before)| server.calls() - before)
        .collect();
    assert_eq!(healthy_calls.iter().sum::<usize>(), answered);
    assert!(
        healthy_calls.iter().all(|&n| n > 0),
        "a healthy server got nothing: {healthy_calls:?}"
    );
    assert_eq!(
        status(&monitor, &servers[2]),
        Some(EndpointStatus::Ejected),
        "{:#?}",
        monitor.snapshot()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_answering_not_found_is_not_ejected() {
    let servers = [
        TestServer::start(SERVING).await,
        TestServer::start(SERVING).await,
        TestServer::start(NOT_FOUND).await,
    ];
    let (client, monitor, _discovery) = client(&servers, GrpcErrors::default());

    let mut not_found = 0;
    for _ in 0..10 {
        for result in batch(&client, 20).await {
            match result {
                Ok(status) => assert_eq!(status, ServingStatus::Serving),
                Err(code) => {
                    assert_eq!(code, Code::NotFound);
                    not_found += 1;
                }
            }
        }
    }
    // The caller saw every NOT_FOUND, and the server got enough calls to be judged (and ejected,
    // were NOT_FOUND a failure).
    assert_eq!(not_found, servers[2].calls());
    assert!(
        not_found >= 20,
        "only {not_found} calls reached the NOT_FOUND server"
    );

    let snapshot = monitor.snapshot();
    let endpoint = snapshot.get(&servers[2].key()).unwrap();
    assert_eq!(endpoint.status, EndpointStatus::Available, "{endpoint:#?}");
    assert!(endpoint.last_reason.is_none(), "{endpoint:#?}");
    let counts = endpoint.windows[0].counts;
    assert_eq!(counts.failures, 0, "{endpoint:#?}");
    assert!(counts.calls >= 20, "{endpoint:#?}");
    assert_eq!(snapshot.ejected(), 0, "{snapshot:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_is_ejected_when_the_classifier_counts_it() {
    // The control for the test above: same servers, NOT_FOUND configured as a failure.
    let servers = [
        TestServer::start(SERVING).await,
        TestServer::start(SERVING).await,
        TestServer::start(NOT_FOUND).await,
    ];
    let classifier = GrpcErrors::default().with_failure(grpc::Code::NotFound);
    let (client, monitor, _discovery) = client(&servers, classifier);

    until_ejected(&client, &monitor, &servers[2]).await;
    let before = servers[2].calls();
    for result in batch(&client, 40).await {
        assert_eq!(result, Ok(ServingStatus::Serving));
    }
    assert_eq!(servers[2].calls(), before);
}

/// A server that sends its response headers and then nothing, as a wedged handler does behind a
/// front end that has already answered: the response future completes, the body never does.
async fn stalling_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(|_: http::Request<hyper::body::Incoming>| async {
                        let never = futures::stream::pending::<
                            Result<http_body::Frame<bytes::Bytes>, Infallible>,
                        >();
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(http_body_util::StreamBody::new(never))
                                .unwrap(),
                        )
                    });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
            });
        }
    });
    addr
}

/// A server that stalls after its headers is dropped by the caller's deadline mid-body: counted
/// as nothing by default (the call was cancelled), as a timeout with `stalled_after`.
#[tokio::test]
async fn a_server_stalling_after_its_headers_is_a_timeout_with_stalled_after() {
    let addr = stalling_server().await;
    let stalled = GrpcErrors::default().stalled_after(Duration::from_millis(200));
    for (classifier, expected) in [(GrpcErrors::default(), (0, 0)), (stalled, (1, 1))] {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::hsf().build().unwrap(),
        ))
        .classifier(classifier);
        let endpoint = layer.endpoint(channel);
        let mut client = HealthClient::new(endpoint.clone());
        let call = client.check(HealthCheckRequest {
            service: String::new(),
        });
        assert!(
            tokio::time::timeout(Duration::from_millis(500), call)
                .await
                .is_err(),
            "the stalling server answered"
        );
        let record = endpoint.record();
        let counts = record.policies()[0].describe(record.clock().now()).counts;
        assert_eq!((counts.calls, counts.failures), expected, "{classifier:?}");
    }
}

/// The standalone breaker around one tonic `Channel`, calls one after another: with `GrpcErrors`
/// it reads the UNAVAILABLE status and opens, and calls then fail at once without reaching the
/// server; with the default classifier (transport errors only) it never sees a failure.
#[tokio::test]
async fn the_standalone_breaker_opens_on_unavailable_with_grpc_errors() {
    use tower_outlier::slow_call::{BreakerConfig, BrokenCircuit, CircuitBreakerLayer, State};

    let config = BreakerConfig::error_ratio(0.5)
        .min_calls(5)
        .window(Duration::from_secs(10))
        .open_duration(Duration::from_secs(60))
        .build()
        .unwrap();
    let server = TestServer::start(UNAVAILABLE).await;
    let channel = || {
        Endpoint::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect_lazy()
    };

    let opened = Arc::new(AtomicUsize::new(0));
    let seen = opened.clone();
    let breaker = CircuitBreakerLayer::new(config.clone())
        .classifier(GrpcErrors::default())
        .on_state_change(move |change| {
            if change.to == State::Open {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
    let mut client = HealthClient::new(ServiceBuilder::new().layer(breaker).service(channel()));
    let mut rejected = 0;
    for _ in 0..20 {
        let status = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap_err();
        let broken = std::error::Error::source(&status)
            .and_then(|source| source.downcast_ref::<BrokenCircuit>())
            .is_some();
        if broken {
            rejected += 1;
        } else {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        }
    }
    tower_outlier::slow_call::wait_for_state_observers();
    assert_eq!(opened.load(Ordering::SeqCst), 1, "the breaker opened once");
    assert_eq!(
        rejected, 15,
        "after 5 UNAVAILABLE calls, the rest fail at once"
    );
    assert_eq!(server.calls(), 5, "rejected calls never reach the server");

    // The default classifier sees only transport errors: every call reaches the server.
    let before = server.calls();
    let mut client = HealthClient::new(
        ServiceBuilder::new()
            .layer(CircuitBreakerLayer::new(config))
            .service(channel()),
    );
    for _ in 0..10 {
        let _ = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
    }
    assert_eq!(server.calls() - before, 10);
}
