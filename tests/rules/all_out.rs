//! When the rules would leave the balancer no endpoint (`WhenAllOut`), on tokio's paused clock and
//! through a real p2c `Balance`: keeping the last (EDAS, HSF, the recommendation), failing fast
//! (gRPC; linkerd when told) behind the layer's guard or waiting without it, and Envoy's panic threshold.

use crate::support;

use std::convert::Infallible;
use std::time::Duration;

use support::{Backend, Harness, Seen};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_outlier::fail_fast::NoEndpointAvailable;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, WhenAllOut,
};

const SECOND: Duration = Duration::from_secs(1);

/// linkerd's consecutive accrual, quicker, without its jitter.
fn linkerd_preset() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::linkerd_consecutive()
            .consecutive_5xx(3)
            .backoff_jitter(0.0)
            .base_ejection_time(10 * SECOND)
            .build()
            .unwrap(),
        3,
    ))
}

/// The same, failing fast when every endpoint is out, as linkerd does (the preset keeps the
/// last endpoint unless told).
pub(crate) fn linkerd() -> OutlierDetectionLayer {
    linkerd_preset().when_all_out(WhenAllOut::FailFast)
}

fn upstream(
    backends: &[Backend],
) -> futures::channel::mpsc::UnboundedReceiver<Result<Change<usize, Backend>, Infallible>> {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for (id, backend) in backends.iter().enumerate() {
        tx.unbounded_send(Ok(Change::Insert(id, backend.clone())))
            .unwrap();
    }
    // The stream stays open: the upstream holds its endpoints.
    std::mem::forget(tx);
    rx
}

#[tokio::test(start_paused = true)]
async fn fail_fast_fails_calls_at_once_when_every_endpoint_is_out_and_serves_when_one_is_back() {
    let layer = linkerd();
    assert_eq!(
        DetectorConfig::grpc().build().unwrap().when_all_out(),
        WhenAllOut::FailFast
    );
    let backends: Vec<Backend> = (0..2).map(Backend::new).collect();
    for backend in &backends {
        backend.set_failing(true);
    }
    let mut balancer = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(upstream(&backends));
    let mut calls = 0;
    while layer.monitor().snapshot().ejected() < 2 {
        let _ = balancer.ready().await.unwrap().call(()).await;
        calls += 1;
        assert!(calls < 100, "{:#?}", layer.monitor().snapshot());
    }
    let snapshot = layer.monitor().snapshot();
    assert!(
        snapshot
            .all_out
            .as_deref()
            .is_some_and(|why| why.contains("fail fast")),
        "{snapshot:#?}"
    );
    // No endpoint: the call fails at once, with no time passing.
    let started = tokio::time::Instant::now();
    let error: BoxError = balancer.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(error.is::<NoEndpointAvailable>(), "{error}");
    assert_eq!(started.elapsed(), Duration::ZERO);
    // Healed and back after the back-off: served again.
    for backend in &backends {
        backend.set_failing(false);
    }
    tokio::time::advance(11 * SECOND).await;
    let served = balancer.ready().await.unwrap().call(()).await;
    assert!(served.is_ok(), "{served:?}");
    assert_eq!(layer.monitor().snapshot().all_out, None);
}

#[tokio::test(start_paused = true)]
async fn without_the_guard_a_call_waits_for_an_endpoint_to_come_back() {
    let layer = linkerd();
    let backends: Vec<Backend> = (0..2).map(Backend::new).collect();
    for backend in &backends {
        backend.set_failing(true);
    }
    let mut balancer = Balance::new(tower::Layer::layer(&layer, upstream(&backends)));
    let mut calls = 0;
    loop {
        let _ = balancer.ready().await.unwrap().call(()).await;
        calls += 1;
        assert!(calls < 100, "{:#?}", layer.monitor().snapshot());
        // The balancer polls the layer, which acts on the call's failure, without waiting.
        std::future::poll_fn(|cx| {
            let _ = balancer.poll_ready(cx);
            std::task::Poll::Ready(())
        })
        .await;
        if layer.monitor().snapshot().ejected() == 2 {
            break;
        }
    }
    for backend in &backends {
        backend.set_failing(false);
    }
    let started = tokio::time::Instant::now();
    balancer.ready().await.unwrap().call(()).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= 9 * SECOND && waited <= 11 * SECOND,
        "waited {waited:?} for the back-off of 10 s"
    );
}

#[tokio::test(start_paused = true)]
async fn the_linkerd_preset_keeps_the_last_unless_told_to_fail_fast() {
    let layer = linkerd_preset();
    let mut h = Harness::new(&layer, 2);
    h.calls_while_live(0, 3, 0).await;
    h.calls_while_live(1, 3, 0).await;
    assert_eq!(h.live_ids(), vec![1], "the last endpoint stays in");
    // Told to fail fast, as linkerd does: both out.
    let layer = linkerd_preset().when_all_out(WhenAllOut::FailFast);
    let mut h = Harness::new(&layer, 2);
    h.calls_while_live(0, 3, 0).await;
    h.calls_while_live(1, 3, 0).await;
    assert!(h.live_ids().is_empty());
}

fn envoy(endpoints_percent: u32) -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::envoy()
            .max_ejection_percent(endpoints_percent)
            .always_eject_one_host(true)
            .build()
            .unwrap(),
        7,
    ))
}

#[tokio::test(start_paused = true)]
async fn envoy_panics_below_half_healthy_and_hands_the_balancer_every_endpoint() {
    let layer = envoy(100);
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    assert_eq!(
        h.live_ids(),
        vec![2, 3],
        "two of four healthy is not below half"
    );
    assert_eq!(layer.monitor().snapshot().all_out, None);
    h.advance(15 * SECOND).await;
    h.calls(2, 5, 0).await;
    // One of four healthy: panic, and every endpoint is in the balancer's set.
    assert_eq!(h.live_ids(), vec![0, 1, 2, 3]);
    let snapshot = layer.monitor().snapshot();
    assert_eq!(snapshot.get("2").unwrap().status, EndpointStatus::Ejected);
    assert!(
        snapshot
            .all_out
            .as_deref()
            .is_some_and(|why| why.starts_with("panic: 1 of 4")),
        "{snapshot:#?}"
    );
    // #0 and #1 come back on the 30 s tick: three of four healthy, panic over, and #2 (still
    // ejected until the 50 s tick) leaves the set again.
    h.advance(16 * SECOND).await;
    assert_eq!(h.live_ids(), vec![0, 1, 3]);
    assert_eq!(layer.monitor().snapshot().all_out, None);
    let last_of_two = h
        .seen
        .iter()
        .rev()
        .find(|(_, s)| matches!(s, Seen::Insert(2) | Seen::Remove(2)))
        .map(|(_, s)| s.clone());
    assert_eq!(last_of_two, Some(Seen::Remove(2)));
    h.advance(20 * SECOND).await;
    assert_eq!(h.live_ids(), vec![0, 1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn envoy_ejects_even_a_lone_endpoint_and_panic_keeps_it_serving() {
    let layer = envoy(10);
    let mut h = Harness::new(&layer, 1);
    h.calls(0, 5, 0).await;
    assert!(h.is_live(0), "panic: the balancer keeps it");
    let snapshot = layer.monitor().snapshot();
    assert_eq!(snapshot.get("0").unwrap().status, EndpointStatus::Ejected);
    assert!(snapshot.all_out.is_some());
    // Its ejection runs as usual: the next check is Envoy's base time.
    assert_eq!(snapshot.get("0").unwrap().next_check_in, Some(30 * SECOND));
}
