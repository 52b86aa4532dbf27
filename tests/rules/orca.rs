//! Weights from load reports (`orca::OrcaPolicy`), on tokio's paused clock through a real p2c
//! `Balance` and the gRPC classifier: no weight during the blackout, A58's shares after it, the
//! shares computed among the endpoints left when one is ejected, and even shares again once the
//! reports expire; nonsense reports (not numbers, out of range, not base64, huge, not ASCII) fail
//! no call and eject nobody.

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::stream::{self, BoxStream, StreamExt};
use http_body_util::{BodyExt, StreamBody};
use tower::balance::p2c::Balance;
use tower::discover::Change;
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

/// A gRPC server answering OK with `value` as its load report, in its headers (trailers-only) if
/// `in_headers`, else in its trailers; counts its calls.
#[derive(Clone)]
struct Garbage {
    value: Option<http::HeaderValue>,
    in_headers: bool,
    calls: Arc<AtomicUsize>,
}

impl Service<()> for Garbage {
    type Response = http::Response<TestBody>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<http::Response<TestBody>, io::Error>>;
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: ()) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let mut response = http::Response::builder();
        if let Some(v) = &self.value {
            if self.in_headers {
                response = response
                    .header("grpc-status", "0")
                    .header(LOAD_REPORT_HEADER, v.clone());
            } else {
                trailers.insert(LOAD_REPORT_HEADER, v.clone());
            }
        }
        let frames: Vec<Result<http_body::Frame<Bytes>, io::Error>> = if self.in_headers {
            vec![]
        } else {
            vec![
                Ok(http_body::Frame::data(Bytes::from_static(b"\0\0\0\0\0"))),
                Ok(http_body::Frame::trailers(trailers)),
            ]
        };
        let body = StreamBody::new(stream::iter(frames).boxed());
        std::future::ready(Ok(response.body(body).unwrap()))
    }
}

fn report(qps: f64, cpu: f64, eps: f64, app: f64) -> http::HeaderValue {
    LoadReport {
        rps_fractional: qps,
        cpu_utilization: cpu,
        eps,
        application_utilization: app,
        ..Default::default()
    }
    .to_header()
    .parse()
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn nonsense_reports_do_not_break_anything() {
    let huge = http::HeaderValue::from_str(&"A".repeat(200_000)).unwrap();
    let values: Vec<(Option<http::HeaderValue>, bool)> = vec![
        (Some(report(f64::NAN, 0.5, 0.0, 0.0)), false),
        (Some(report(100.0, f64::INFINITY, 0.0, 0.0)), false),
        (Some(report(100.0, -1.0, 0.0, f64::NAN)), false),
        (Some(report(f64::MAX, 1e-308, f64::MAX, 0.0)), false),
        (Some(report(1e308, 1e-300, 0.0, 0.0)), true),
        (Some(report(100.0, 0.5, -5.0, -1.0)), false),
        (
            Some(http::HeaderValue::from_static("!!!not base64===")),
            false,
        ),
        (Some(http::HeaderValue::from_static("/w")), false),
        (Some(huge), false),
        (
            Some(http::HeaderValue::from_bytes(b"\xff\xfe\x80").unwrap()),
            true,
        ),
        (Some(report(100.0, 0.5, 0.0, 0.0)), false),
        (None, false),
    ];
    let counters: Vec<Arc<AtomicUsize>> = values
        .iter()
        .map(|_| Arc::new(AtomicUsize::new(0)))
        .collect();
    let (tx, rx) = mpsc::unbounded::<Result<Change<usize, Garbage>, Infallible>>();
    for (i, (v, h)) in values.iter().enumerate() {
        tx.unbounded_send(Ok(Change::Insert(
            i,
            Garbage {
                value: v.clone(),
                in_headers: *h,
                calls: counters[i].clone(),
            },
        )))
        .unwrap();
    }
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .with_policy(OrcaPolicy::new(OrcaConfig::a58().build().unwrap()))
    .slow_start(
        tower_outlier::SlowStart::new(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
    .classifier(GrpcErrors::default());
    let monitor = layer.monitor();
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(1));
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut failed = 0;
    while tokio::time::Instant::now() < until {
        match balancer.ready().await.unwrap().call(()).await {
            Ok(r) => {
                let _ = r.collect().await;
            }
            Err(_) => failed += 1,
        }
        tokio::time::advance(Duration::from_millis(5)).await;
    }
    let got: Vec<usize> = counters.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    let st: Vec<_> = monitor
        .snapshot()
        .endpoints
        .iter()
        .map(|e| (e.key.to_string(), e.status, e.weight))
        .collect();
    eprintln!("orca garbage: calls {got:?}, failed {failed}; {st:?}");
    assert_eq!(failed, 0);
    assert!(st.iter().all(|(_, s, _)| *s == EndpointStatus::Available));
}
