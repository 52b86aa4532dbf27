//! Weights from load reports (`orca::OrcaPolicy`), on tokio's paused clock through a real p2c
//! `Balance` and the gRPC classifier: no weight during the blackout, A58's shares after it, the
//! shares computed among the endpoints left when one is ejected, and even shares again once the
//! reports expire.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use http_body_util::{BodyExt, StreamBody};
use tower::balance::p2c::Balance;
use tower::{Service, ServiceExt};
use tower_outlier::grpc::GrpcErrors;
use tower_outlier::orca::{LoadReport, OrcaConfig, OrcaPolicy, LOAD_REPORT_HEADER};
use tower_outlier::{DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer};

use crate::support::{announce, SeededRng};

type TestBody = StreamBody<BoxStream<'static, Result<http_body::Frame<Bytes>, io::Error>>>;

/// A gRPC server answering OK with a load report of `utilization` at 100 qps in its trailers
/// while `reporting`, UNAVAILABLE while `failing`; counts its calls.
#[derive(Clone)]
struct Reporting {
    utilization: f64,
    reporting: Arc<AtomicBool>,
    failing: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Reporting {
    fn new(utilization: f64) -> Self {
        Reporting {
            utilization,
            reporting: Arc::new(AtomicBool::new(true)),
            failing: Arc::new(AtomicBool::new(false)),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<()> for Reporting {
    type Response = http::Response<TestBody>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<http::Response<TestBody>, io::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut trailers = http::HeaderMap::new();
        let status = if self.failing.load(Ordering::SeqCst) {
            "14"
        } else {
            "0"
        };
        trailers.insert("grpc-status", status.parse().unwrap());
        if self.reporting.load(Ordering::SeqCst) {
            let report = LoadReport {
                rps_fractional: 100.0,
                cpu_utilization: self.utilization,
                ..Default::default()
            };
            trailers.insert(LOAD_REPORT_HEADER, report.to_header().parse().unwrap());
        }
        let frames: Vec<Result<http_body::Frame<Bytes>, io::Error>> = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"\0\0\0\0\0"))),
            Ok(http_body::Frame::trailers(trailers)),
        ];
        let body = StreamBody::new(stream::iter(frames).boxed());
        std::future::ready(Ok(http::Response::new(body)))
    }
}

/// Serial calls, one every 10 ms, each body read to its end, for `span`.
async fn traffic<B>(balancer: &mut B, span: Duration)
where
    B: Service<(), Error = tower::BoxError>,
    B::Response: http_body::Body + Send + Unpin,
    <B::Response as http_body::Body>::Error: std::fmt::Debug,
    B::Response: http_body::Body<Data = Bytes>,
{
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        if let Ok(response) = balancer.ready().await.unwrap().call(()).await {
            let _ = response.collect().await;
        }
        tokio::time::advance(Duration::from_millis(10)).await;
    }
}

fn counts(servers: &[Reporting]) -> Vec<usize> {
    servers.iter().map(Reporting::calls).collect()
}

fn since(servers: &[Reporting], before: &[usize]) -> Vec<f64> {
    let calls: Vec<usize> = servers
        .iter()
        .zip(before)
        .map(|(s, b)| s.calls() - b)
        .collect();
    let total: usize = calls.iter().sum();
    calls.iter().map(|c| *c as f64 / total as f64).collect()
}

fn close(shares: &[f64], expected: &[f64]) -> bool {
    shares
        .iter()
        .zip(expected)
        .all(|(s, e)| (s - e).abs() <= 0.1 * e + 0.02)
}

#[tokio::test(start_paused = true)]
async fn shares_follow_a58_after_the_blackout_among_the_endpoints_left() {
    let servers = [0.2, 0.4, 0.8, 0.4].map(Reporting::new);
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .with_policy(OrcaPolicy::new(
        OrcaConfig::a58()
            .weight_expiration_period(Duration::from_secs(30))
            .build()
            .unwrap(),
    ))
    .classifier(GrpcErrors::default());
    let monitor = layer.monitor();
    let upstream: Vec<(usize, Reporting)> = servers.iter().cloned().enumerate().collect();
    let mut balancer = Balance::from_rng(
        tower::Layer::layer(&layer, announce(&upstream)),
        SeededRng(21),
    );
    // The blackout: even shares.
    let before = counts(&servers);
    traffic(&mut balancer, Duration::from_secs(9)).await;
    let blackout = since(&servers, &before);
    assert!(
        close(&blackout, &[0.25; 4]),
        "in the blackout: {blackout:?}"
    );
    traffic(&mut balancer, Duration::from_secs(2)).await;
    // Weights 500 / 250 / 125 / 250 of 1 125.
    let before = counts(&servers);
    traffic(&mut balancer, Duration::from_secs(30)).await;
    let weighted = since(&servers, &before);
    let a58 = [
        500.0 / 1125.0,
        250.0 / 1125.0,
        125.0 / 1125.0,
        250.0 / 1125.0,
    ];
    assert!(close(&weighted, &a58), "{weighted:?}, A58: {a58:?}");
    // #0 fails and is ejected: the others share by their weights, 250 / 125 / 250.
    servers[0].failing.store(true, Ordering::SeqCst);
    while monitor.snapshot().get("0").unwrap().status != EndpointStatus::Ejected {
        traffic(&mut balancer, Duration::from_millis(10)).await;
    }
    servers[0].failing.store(false, Ordering::SeqCst);
    let before = counts(&servers);
    traffic(&mut balancer, Duration::from_millis(800)).await;
    let left = since(&servers, &before);
    assert!(
        close(&left[1..], &[0.4, 0.2, 0.4]),
        "among the three left: {left:?}"
    );
    // The reports stop: once they expire, even shares again.
    for server in &servers {
        server.reporting.store(false, Ordering::SeqCst);
    }
    traffic(&mut balancer, Duration::from_secs(35)).await;
    let before = counts(&servers);
    traffic(&mut balancer, Duration::from_secs(20)).await;
    let expired = since(&servers, &before);
    assert!(close(&expired, &[0.25; 4]), "after expiry: {expired:?}");
}
