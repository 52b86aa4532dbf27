//! A gray hyper server on loopback — 500 for requests 1, 4 and 7 of every 10, never two in a row,
//! while its `/healthz` answers 200 — beside two healthy ones, behind the README's stack with
//! `DetectorConfig::recommended()` and a probe of `/healthz`, requests one after another. The
//! probe lets the gray server back in after each back-off; the success-rate trigger's window,
//! kept across its returns, has it out again at its first failure each time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower::balance::p2c::Balance;
use tower::{ServiceBuilder, ServiceExt};
use tower_outlier::probe::request_probe;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, ServerErrors,
};

use super::new_user::{discovery, get, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_server_that_passes_its_health_checks_costs_one_failure_per_return() {
    let _turn = crate::timed_turn().await;
    let failed = Arc::new(AtomicUsize::new(0));
    let counted = failed.clone();
    let gray = Server::answering(move |path, n| {
        if path != "/healthz" && matches!(n % 10, 0 | 3 | 6) {
            counted.fetch_add(1, Ordering::SeqCst);
            500
        } else {
            200
        }
    })
    .await;
    let failed = || failed.load(Ordering::SeqCst);
    let healthy = [Server::start(false).await, Server::start(false).await];
    let (tx, rx) = discovery([gray.addr, healthy[0].addr, healthy[1].addr]);
    let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(ServerErrors)
    .probe(request_probe(|| get("/healthz"), ServerErrors));
    let monitor = outliers.monitor();
    let balancer = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(rx);
    let status = || monitor.snapshot().get_key(&gray.addr).unwrap().status;

    let started = Instant::now();
    let mut was = EndpointStatus::Available;
    let mut ejected_once = false;
    let mut returned_with = None;
    let mut per_return = Vec::new();
    while started.elapsed() < Duration::from_secs(14) {
        let _ = tokio::spawn(balancer.clone().oneshot(get("/")))
            .await
            .unwrap();
        let now = status();
        if now == EndpointStatus::Ejected && was != EndpointStatus::Ejected {
            if let Some(at_return) = returned_with.take() {
                per_return.push(failed() - at_return);
            }
            ejected_once = true;
        }
        if ejected_once && now == EndpointStatus::Available && was != EndpointStatus::Available {
            returned_with = Some(failed());
        }
        was = now;
    }
    drop(tx);
    println!("failed requests between each return and the next ejection: {per_return:?}");
    assert!(
        per_return.len() >= 2,
        "returned and ejected again {} times in 14 s: {per_return:?}; {:#?}",
        per_return.len(),
        monitor.snapshot()
    );
    assert!(
        per_return.iter().all(|&failed| failed == 1),
        "failed requests between each return and the next ejection: {per_return:?}"
    );
}
