//! Through a real `tower::balance::p2c::Balance` behind `tower::buffer::Buffer`, on tokio's paused
//! clock: ejected endpoints get no requests, recovered ones get traffic again, and an idle
//! balancer is not polled in a loop.

use crate::support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::channel::mpsc;
use futures::StreamExt;
use support::{Backend, SeededRng};
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::Change;
use tower::{Layer, ServiceExt};
use tower_outlier::{EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

fn upstream(
    backends: &[Backend],
) -> mpsc::UnboundedReceiver<Result<Change<usize, Backend>, Infallible>> {
    let (tx, rx) = mpsc::unbounded();
    for backend in backends {
        tx.unbounded_send(Ok(Change::Insert(backend.id, backend.clone())))
            .unwrap();
    }
    // Keep the upstream open for the whole test, as a registry watch would be.
    std::mem::forget(tx);
    rx
}

/// Counts how often the wrapped future is polled, and gives up after `limit` polls so a
/// busy-polling bug fails the test instead of hanging it (a busy task keeps the paused clock from
/// advancing).
struct CountPolls<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
    limit: usize,
}

impl<F: Future<Output = ()>> Future for CountPolls<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.polls.fetch_add(1, Ordering::SeqCst) >= self.limit {
            return Poll::Ready(());
        }
        self.inner.as_mut().poll(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn an_ejected_endpoint_gets_no_requests_and_returns_on_schedule() {
    let backends: Vec<Backend> = (0..5).map(Backend::new).collect();
    backends[4].set_failing(true);
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .recovery_unit(Duration::from_secs(5))
            .build()
            .unwrap(),
    ));
    let monitor = layer.monitor();
    let balancer = Buffer::new(
        Balance::from_rng(layer.layer(upstream(&backends)), SeededRng(7)),
        16,
    );

    let mut sent = 0;
    while monitor.snapshot().ejected() == 0 {
        let _ = balancer.clone().oneshot(()).await;
        sent += 1;
        assert!(sent < 1_000, "the failing endpoint was never ejected");
    }
    let snapshot = monitor.snapshot();
    assert_eq!(snapshot.get("4").unwrap().status, EndpointStatus::Ejected);
    let at_ejection = backends[4].calls();
    assert!(
        at_ejection >= 10,
        "judged only after the minimum of 10 calls"
    );

    for _ in 0..500 {
        let answer = balancer.clone().oneshot(()).await;
        assert!(
            answer.is_ok(),
            "only healthy endpoints answer while 4 is out"
        );
    }
    assert_eq!(
        backends[4].calls(),
        at_ejection,
        "no request reaches an ejected endpoint"
    );

    // It heals; the recovery check comes one unit (5 s) after the ejection.
    backends[4].set_failing(false);
    tokio::time::sleep(Duration::from_millis(4_900)).await;
    for _ in 0..100 {
        balancer.clone().oneshot(()).await.unwrap();
    }
    assert_eq!(backends[4].calls(), at_ejection, "not before its check");
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..500 {
        balancer.clone().oneshot(()).await.unwrap();
    }
    let after = backends[4].calls() - at_ejection;
    assert!(
        after > 20,
        "re-admitted on schedule, it gets traffic again ({after})"
    );
    assert_eq!(
        monitor.snapshot().get("4").unwrap().status,
        EndpointStatus::Trial
    );
    // A healthy trial of one window (10 s) completes the recovery, given calls to judge it by:
    // the window must hold the minimum when the trial ends.
    tokio::time::sleep(Duration::from_secs(9)).await;
    for _ in 0..200 {
        balancer.clone().oneshot(()).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    balancer.clone().oneshot(()).await.unwrap();
    assert_eq!(
        monitor.snapshot().get("4").unwrap().status,
        EndpointStatus::Available
    );
}

#[tokio::test(start_paused = true)]
async fn the_budget_and_the_last_endpoint_hold_through_the_balancer() {
    let backends: Vec<Backend> = (0..5).map(Backend::new).collect();
    for backend in &backends {
        backend.set_failing(true);
    }
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud()
            .max_ejection_ratio(0.6)
            .build()
            .unwrap(),
    ));
    let monitor = layer.monitor();
    let balancer = Buffer::new(
        Balance::from_rng(layer.layer(upstream(&backends)), SeededRng(7)),
        16,
    );
    for _ in 0..1_000 {
        let _ = balancer.clone().oneshot(()).await;
    }
    // 5 × 60 % = 3: two endpoints stay in rotation although every one fails.
    assert_eq!(monitor.snapshot().ejected(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_idle_balancer_is_not_polled_in_a_loop() {
    let backends: Vec<Backend> = (0..5).map(Backend::new).collect();
    for backend in &backends[1..] {
        backend.set_failing(true);
    }
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .max_ejection_ratio(1.0)
            .build()
            .unwrap(),
    ));
    let monitor = layer.monitor();

    // The balancer's own task: the buffer worker, spawned by us so its polls can be counted.
    let (balancer, worker) = Buffer::pair(
        Balance::from_rng(layer.layer(upstream(&backends)), SeededRng(7)),
        16,
    );
    let worker_polls = Arc::new(AtomicUsize::new(0));
    tokio::spawn(CountPolls {
        inner: Box::pin(worker),
        polls: worker_polls.clone(),
        limit: 100_000,
    });
    let mut sent = 0;
    while monitor.snapshot().ejected() < 4 {
        let _ = balancer.clone().oneshot(()).await;
        sent += 1;
        assert!(sent < 2_000, "four failing endpoints were not all ejected");
    }
    // The same adaptor type driven directly as a discover stream by a task of its own.
    let adaptor_layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .max_ejection_ratio(1.0)
            .build()
            .unwrap(),
    ));
    let adaptor_monitor = adaptor_layer.monitor();
    let mut adaptor = adaptor_layer.layer(upstream(&backends));
    let (endpoints_tx, mut endpoints_rx) = mpsc::unbounded();
    let adaptor_polls = Arc::new(AtomicUsize::new(0));
    tokio::spawn(CountPolls {
        inner: Box::pin(async move {
            while let Some(Ok(change)) = adaptor.next().await {
                let _ = endpoints_tx.unbounded_send(change);
            }
        }),
        polls: adaptor_polls.clone(),
        limit: 100_000,
    });
    let mut live = std::collections::HashMap::new();
    while live.len() < 5 {
        if let Some(Change::Insert(k, e)) = endpoints_rx.next().await {
            live.insert(k, e);
        }
    }
    for id in 1..5 {
        let endpoint: &mut tower_outlier::discover::OutlierEndpoint<Backend, _> =
            live.get_mut(&id).unwrap();
        for _ in 0..10 {
            let _ = endpoint.ready().await.unwrap().call(()).await;
        }
    }
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(adaptor_monitor.snapshot().ejected(), 4);

    let worker_before = worker_polls.load(Ordering::SeqCst);
    let adaptor_before = adaptor_polls.load(Ordering::SeqCst);
    // Ten seconds with no requests and four endpoints out (their checks are 60 s away).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let worker_idle = worker_polls.load(Ordering::SeqCst) - worker_before;
    let adaptor_idle = adaptor_polls.load(Ordering::SeqCst) - adaptor_before;
    assert!(
        worker_idle <= 2,
        "buffer worker polled {worker_idle} times while idle"
    );
    assert!(
        adaptor_idle <= 2,
        "adaptor task polled {adaptor_idle} times while idle"
    );
    // And when the recovery check is due, the adaptor's timer wakes its task a bounded number of
    // times to re-admit all four.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let woken = adaptor_polls.load(Ordering::SeqCst) - adaptor_before;
    assert!(
        woken <= 6,
        "adaptor task polled {woken} times around the recovery check"
    );
    assert_eq!(adaptor_monitor.snapshot().ejected(), 0);
    use tower::Service;
}
