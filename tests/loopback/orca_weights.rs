//! Weights from load reports (`tower_outlier::orca`) on loopback: three tonic servers, each adding
//! an ORCA report (`endpoint-load-metrics-bin`) to every response's trailers with the same qps and
//! a utilization of 0.2, 0.4 and 0.8, behind tonic channels, the gRPC classifier, the layer with
//! `OrcaPolicy`, p2c and a buffer. After the blackout, the calls split as gRFC A58's weights say:
//! 4/7, 2/7 and 1/7.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use http_body::{Body as HttpBody, Frame};
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::server::health_reporter;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::util::BoxCloneService;
use tower::{BoxError, Service, ServiceBuilder};
use tower_outlier::grpc::{GrpcBody, GrpcErrors};
use tower_outlier::orca::{LoadReport, OrcaConfig, OrcaPolicy, LOAD_REPORT_HEADER};
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};

/// A body that adds `value` as the load report to its trailers.
struct Reported {
    inner: Body,
    value: http::HeaderValue,
}

impl HttpBody for Reported {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let value = self.value.clone();
        Pin::new(&mut self.inner).poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame.map(|frame| match frame.into_trailers() {
                    Ok(mut trailers) => {
                        trailers.insert(LOAD_REPORT_HEADER, value);
                        Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

/// A server-side middleware adding `value` to every response's trailers.
#[derive(Clone)]
struct WithReport<S> {
    inner: S,
    value: http::HeaderValue,
}

impl<S, B> Service<http::Request<B>> for WithReport<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let value = self.value.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|inner| Body::new(Reported { inner, value })))
        })
    }
}

/// A tonic server (tonic-health's service) reporting `utilization` at 100 qps, counting calls.
async fn server(utilization: f64, calls: Arc<AtomicUsize>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = health_reporter();
    let report = LoadReport {
        rps_fractional: 100.0,
        cpu_utilization: utilization,
        ..Default::default()
    };
    let value = http::HeaderValue::from_str(&report.to_header()).unwrap();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let stream = listener.accept().await.map(|(stream, _)| {
            let _ = stream.set_nodelay(true);
            stream
        });
        Some((stream, listener))
    });
    let counted = tower::layer::layer_fn(move |inner| {
        let calls = calls.clone();
        tower::util::MapRequest::new(inner, move |request: http::Request<Body>| {
            calls.fetch_add(1, Ordering::SeqCst);
            request
        })
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(counted)
            .layer(tower::layer::layer_fn(move |inner| WithReport {
                inner,
                value: value.clone(),
            }))
            .add_service(health)
            .serve_with_incoming(incoming),
    );
    addr
}

type Balanced = BoxCloneService<http::Request<Body>, http::Response<GrpcBody<Body>>, BoxError>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_reporting_utilizations_get_their_a58_shares() {
    let _turn = super::timed_turn().await;
    let utilizations = [0.2, 0.4, 0.8];
    let counts: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    let (discovery, changes) = mpsc::unbounded::<Result<Change<SocketAddr, Channel>, Infallible>>();
    for (utilization, calls) in utilizations.iter().zip(&counts) {
        let addr = server(*utilization, calls.clone()).await;
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        discovery
            .unbounded_send(Ok(Change::Insert(addr, channel)))
            .unwrap();
    }
    let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .with_policy(OrcaPolicy::new(
        OrcaConfig::a58()
            .blackout_period(Duration::from_secs(1))
            .weight_update_period(Duration::from_millis(100))
            .build()
            .unwrap(),
    ))
    .classifier(GrpcErrors::default());
    let monitor = outliers.monitor();
    let balancer = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(changes);
    let client: HealthClient<Balanced> = HealthClient::new(BoxCloneService::new(balancer));
    let call = |mut client: HealthClient<Balanced>| async move {
        client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("a healthy fleet")
    };
    // The blackout, and one update after it.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        call(client.clone()).await;
    }
    let before: Vec<usize> = counts.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    for _ in 0..5000 {
        call(client.clone()).await;
    }
    let calls: Vec<usize> = counts
        .iter()
        .zip(&before)
        .map(|(c, b)| c.load(Ordering::SeqCst) - b)
        .collect();
    let total: usize = calls.iter().sum();
    let weights: Vec<f64> = utilizations.iter().map(|u| 100.0 / u).collect();
    let sum: f64 = weights.iter().sum();
    eprintln!(
        "calls {calls:?}; shares {:?}; A58's {:?}; snapshot {:?}",
        calls
            .iter()
            .map(|c| *c as f64 / total as f64)
            .collect::<Vec<_>>(),
        weights.iter().map(|w| w / sum).collect::<Vec<_>>(),
        monitor
            .snapshot()
            .endpoints
            .iter()
            .map(|e| e.absolute_weight)
            .collect::<Vec<_>>()
    );
    for (i, w) in weights.iter().enumerate() {
        let expected = w / sum;
        let share = calls[i] as f64 / total as f64;
        assert!(
            (share - expected).abs() <= 0.15 * expected,
            "server {i} (utilization {}) got {share:.3} of the calls, A58 says {expected:.3}: \
             {calls:?}",
            utilizations[i]
        );
    }
    drop(discovery);
}
