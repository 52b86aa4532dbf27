//! Checks of endpoints without traffic behind a real `tower::buffer::Buffer` and a p2c
//! `Balance`, on a multi-thread runtime and the real clock: a quiet service's balancer is never
//! polled, yet its idle endpoints are checked (the keeper runs on its own), a dead one is out
//! before the first call after the quiet, and dropping the last `Buffer` handle ends the keeper.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{ServiceBuilder, ServiceExt};
use tower_outlier::probe::{probe_fn, ProbeCadence, ProbeFuture};
use tower_outlier::{EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

use crate::support::Backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_behind_buffer_on_a_multi_thread_runtime() {
    let _turn = crate::timed_turn().await;
    let backends: Vec<Backend> = (0..3).map(Backend::new).collect();
    let checks = Arc::new(AtomicUsize::new(0));
    let counted = checks.clone();
    let probe = probe_fn(move |_: &usize, backend: Backend| -> ProbeFuture {
        counted.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { backend.oneshot(()).await.is_ok() })
    });
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud()
            .max_ejection_ratio(0.5)
            .build()
            .unwrap(),
    ))
    .probe(probe)
    .probe_cadence(
        ProbeCadence::new()
            .no_traffic_interval(Duration::from_millis(200))
            .unhealthy_threshold(2),
    );
    let monitor = layer.monitor();
    let (tx, rx) = mpsc::unbounded::<Result<Change<usize, Backend>, Infallible>>();
    for b in &backends {
        tx.unbounded_send(Ok(Change::Insert(b.id, b.clone())))
            .unwrap();
    }
    let balancer = ServiceBuilder::new()
        .buffer(16)
        .layer_fn(Balance::new)
        .layer(layer)
        .service(rx);
    for _ in 0..50 {
        tokio::spawn(balancer.clone().oneshot(()))
            .await
            .unwrap()
            .unwrap();
    }
    backends[1].set_failing(true);
    let before = checks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = checks.load(Ordering::SeqCst) - before;
    assert!(
        during >= 6,
        "{during} checks in a 1.5 s quiet of 3 endpoints at 200 ms"
    );
    let mut failed = 0;
    for _ in 0..30 {
        if tokio::spawn(balancer.clone().oneshot(()))
            .await
            .unwrap()
            .is_err()
        {
            failed += 1;
        }
    }
    assert_eq!(
        failed, 0,
        "calls reached the endpoint that died in the quiet"
    );
    assert_eq!(
        monitor.snapshot().get("1").unwrap().status,
        EndpointStatus::Ejected
    );
    // The last handle dropped: Buffer's worker ends, drops the balancer, and the keeper ends.
    drop(balancer);
    drop(tx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after_drop = checks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        checks.load(Ordering::SeqCst),
        after_drop,
        "the keeper still checks after the service was dropped"
    );
    assert_eq!(Arc::strong_count(&checks), 1, "the probe is still held");
}
