//! An endpoint whose service fails `poll_ready` (what `tower::reconnect`, a dead inner `Buffer` or
//! a tonic channel whose worker died report) stays in step with the balancer: p2c would drop it
//! for good while the layer still counted it as an endpoint to fall back on, and then ejected the
//! balancer's last one. Now the endpoint reports itself not ready, the layer counts it out (shown
//! `Unready`), and it is back once its service is ready again. Through `Buffer` and p2c on tokio's
//! paused clock.

use std::future::Ready;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use support::announce;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, Monitor, OutlierDetectionLayer,
};

use crate::support;

/// A backend that answers its id, fails every call while `failing`, and fails `poll_ready`
/// while `broken`.
#[derive(Clone)]
struct Backend {
    id: usize,
    failing: Arc<AtomicBool>,
    broken: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Backend {
    fn new(id: usize) -> Self {
        Backend {
            id,
            failing: Arc::new(AtomicBool::new(false)),
            broken: Arc::new(AtomicBool::new(false)),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Service<()> for Backend {
    type Response = usize;
    type Error = std::io::Error;
    type Future = Ready<Result<usize, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        if self.broken.load(Ordering::SeqCst) {
            Poll::Ready(Err(std::io::Error::other(
                "the connection's worker is gone",
            )))
        } else {
            Poll::Ready(Ok(()))
        }
    }

    fn call(&mut self, _: ()) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(if self.failing.load(Ordering::SeqCst) {
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        } else {
            Ok(self.id)
        })
    }
}

fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get_key(&key).unwrap().status
}

/// Sends `n` requests, each of which must be answered within a second of tokio's clock (before,
/// one waited for the buffer's 59 s with an empty balancer); how many got an error.
async fn send<S>(service: &S, n: usize) -> usize
where
    S: Service<(), Response = usize, Error = BoxError> + Clone,
{
    let mut failed = 0;
    for _ in 0..n {
        let answer = tokio::time::timeout(Duration::from_secs(1), service.clone().oneshot(()))
            .await
            .expect("answered within a second");
        failed += usize::from(answer.is_err());
    }
    failed
}

#[tokio::test(start_paused = true)]
async fn a_readiness_error_never_lets_the_layer_eject_the_last_endpoint_the_balancer_can_pick() {
    let (healthy, failing) = (Backend::new(0), Backend::new(1));
    failing.failing.store(true, Ordering::SeqCst);
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let monitor = layer.monitor();
    let services = [(0, healthy.clone()), (1, failing.clone())];
    let balancer = Buffer::new(Balance::new(layer.layer(announce(&services))), 64);
    // The failing endpoint is ejected at its third failure in a row.
    let _ = send(&balancer, 20).await;
    assert_eq!(status(&monitor, 1), EndpointStatus::Ejected);

    // The healthy endpoint's service breaks: the balancer cannot pick it.
    healthy.broken.store(true, Ordering::SeqCst);
    let failed = send(&balancer, 30).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Unready);
    // With no endpoint left to pick, the ejected one came back on trial (a failing endpoint is
    // better than none: every call is answered at once), and the layer keeps it in.
    assert_eq!(failed, 30);
    let snapshot = monitor.snapshot();
    let last = snapshot.get_key(&1).unwrap();
    assert!(last.status.is_available(), "{last:?}");
    assert_eq!(last.refused.as_deref(), Some("last available endpoint"));

    // The service recovers: asked again after its back-off, the endpoint is back, and now the
    // failing one can go.
    healthy.broken.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = send(&balancer, 10).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    assert_eq!(status(&monitor, 1), EndpointStatus::Ejected);
    assert_eq!(send(&balancer, 50).await, 0, "the healthy endpoint serves");
}

#[tokio::test(start_paused = true)]
async fn a_service_that_stays_broken_is_asked_again_with_a_growing_back_off_not_in_a_loop() {
    let backends: Vec<Backend> = (0..3).map(Backend::new).collect();
    let polls: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let monitor = layer.monitor();
    let services: Vec<(usize, CountingPolls)> = backends
        .iter()
        .map(|b| {
            (
                b.id,
                CountingPolls {
                    inner: b.clone(),
                    polls: polls[b.id].clone(),
                },
            )
        })
        .collect();
    let balancer = Buffer::new(Balance::new(layer.layer(announce(&services))), 64);
    assert_eq!(send(&balancer, 10).await, 0);
    backends[2].broken.store(true, Ordering::SeqCst);
    let before = polls[2].load(Ordering::SeqCst);
    let calls_before = backends[2].calls.load(Ordering::SeqCst);
    // A minute of traffic: the broken service is asked again about 100 ms, 200 ms, 400 ms ...
    // after each failure, up to every 30 s: about a dozen times, not at every request.
    for _ in 0..60 {
        assert_eq!(send(&balancer, 10).await, 0, "the other two serve");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(status(&monitor, 2), EndpointStatus::Unready);
    let asked = polls[2].load(Ordering::SeqCst) - before;
    assert!((5..=20).contains(&asked), "asked {asked} times in a minute");
    assert_eq!(
        backends[2].calls.load(Ordering::SeqCst),
        calls_before,
        "never called while not ready"
    );
}

/// Counts the readiness polls of its inner service.
#[derive(Clone)]
struct CountingPolls {
    inner: Backend,
    polls: Arc<AtomicUsize>,
}

impl Service<()> for CountingPolls {
    type Response = usize;
    type Error = std::io::Error;
    type Future = Ready<Result<usize, std::io::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: ()) -> Self::Future {
        self.inner.call(request)
    }
}
