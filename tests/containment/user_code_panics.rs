//! User code that panics — a probe, an `on_event` callback, a classifier — is contained: the
//! layer logs it, counts a panicking probe as a failed check, and the service behind `Buffer` and
//! p2c keeps answering from its healthy endpoints. Each test fails (the buffer's worker dies, the
//! process aborts, the caller's request panics) without the containment.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{announce, Backend};
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_outlier::classify::{classify_fn, Outcome};
use tower_outlier::probe::{probe_fn, ProbeFuture};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, Monitor, OutlierDetectionLayer,
};

fn layer() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
}

fn backends() -> Vec<Backend> {
    (0..4).map(Backend::new).collect()
}

/// Sends `n` requests through the buffered balancer; how many failed.
async fn send<S>(service: &S, n: usize) -> usize
where
    S: Service<(), Response = usize, Error = BoxError> + Clone,
{
    let mut failed = 0;
    for _ in 0..n {
        if service.clone().oneshot(()).await.is_err() {
            failed += 1;
        }
    }
    failed
}

fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get_key(&key).unwrap().status
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_panics_is_a_failed_check_not_a_dead_buffer() {
    let backends = backends();
    let services: Vec<(usize, Backend)> = backends.iter().map(|b| (b.id, b.clone())).collect();
    let started = Arc::new(AtomicUsize::new(0));
    let probe = {
        let started = started.clone();
        probe_fn(move |key: &usize, _: Backend| {
            let n = started.fetch_add(1, Ordering::SeqCst);
            let key = *key;
            if n.is_multiple_of(2) {
                // Every other probe panics as it starts, the others once polled.
                panic!("probe of {key} panicked as it started");
            }
            Box::pin(async move {
                if key < usize::MAX {
                    panic!("probe of {key} panicked");
                }
                true
            }) as ProbeFuture
        })
    };
    let layer = layer().probe(probe);
    let monitor = layer.monitor();
    let balancer = Buffer::new(Balance::new(layer.layer(announce(&services))), 64);
    backends[0].set_failing(true);
    assert_eq!(send(&balancer, 60).await, 3, "three in a row eject #0");
    assert_eq!(status(&monitor, 0), EndpointStatus::Ejected);
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(send(&balancer, 20).await, 0, "the healthy endpoints answer");
    }
    assert!(
        started.load(Ordering::SeqCst) >= 4,
        "probes ran and panicked"
    );
    let snapshot = monitor.snapshot();
    let zero = snapshot.get_key(&0).unwrap();
    assert_eq!(zero.status, EndpointStatus::Ejected);
    assert!(zero.failed_checks >= 4, "{zero:?}");
}

#[tokio::test(start_paused = true)]
async fn an_on_event_callback_that_panics_loses_no_request() {
    let backends = backends();
    let services: Vec<(usize, Backend)> = backends.iter().map(|b| (b.id, b.clone())).collect();
    let layer = layer();
    let monitor = layer.monitor();
    let seen = Arc::new(AtomicUsize::new(0));
    monitor.on_event(|_| panic!("a broken callback"));
    {
        let seen = seen.clone();
        monitor.on_event(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        });
    }
    let balancer = Buffer::new(Balance::new(layer.layer(announce(&services))), 64);
    backends[1].set_failing(true);
    assert_eq!(send(&balancer, 50).await, 3);
    assert_eq!(status(&monitor, 1), EndpointStatus::Ejected);
    backends[1].set_failing(false);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(send(&balancer, 50).await, 0);
    assert!(
        seen.load(Ordering::SeqCst) >= 2,
        "the callback after the broken one saw the ejection and the re-admission"
    );
    // Dropping the layer's adaptor emits `Removed` for every endpoint: the broken callback panics
    // for each, and nothing aborts.
    drop(balancer);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(monitor.snapshot().endpoints.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_classifier_that_panics_leaves_the_call_unrecorded_and_the_caller_answered() {
    let backends = backends();
    let services: Vec<(usize, Backend)> = backends.iter().map(|b| (b.id, b.clone())).collect();
    let layer =
        layer().classifier(classify_fn(
            |result: Result<&usize, &std::io::Error>| match result {
                Ok(&2) => panic!("the classifier cannot read #2's answers"),
                Ok(_) => Outcome::Success,
                Err(_) => Outcome::Failure(tower_outlier::classify::FailureKind::Transport),
            },
        ));
    let monitor = layer.monitor();
    let balancer = Buffer::new(Balance::new(layer.layer(announce(&services))), 64);
    let mut answers = Vec::new();
    for _ in 0..40 {
        answers.push(balancer.clone().oneshot(()).await.unwrap());
    }
    assert!(answers.contains(&2), "#2 answered its callers: {answers:?}");
    let snapshot = monitor.snapshot();
    let two = snapshot.get_key(&2).unwrap();
    assert_eq!(two.windows[0].counts.calls, 0, "nothing recorded: {two:?}");
    assert_eq!(two.status, EndpointStatus::Available);
}
