use std::future::Future;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tower::load::Load;

use futures::future::{pending, Pending};
use tower_service::Service;

use super::OutlierEndpoint;
use crate::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

#[derive(Clone)]
struct Hang;

impl Service<()> for Hang {
    type Response = ();
    type Error = std::io::Error;
    type Future = Pending<Result<(), std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        pending()
    }
}

fn lanes<S, C>(endpoint: &OutlierEndpoint<S, C>) -> usize {
    endpoint.holder.shared.live_lanes()
}

#[tokio::test(start_paused = true)]
async fn a_handle_gets_a_lane_of_its_own_only_when_it_calls_again() {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let mut balancer_handle = layer.endpoint(Hang);
    assert_eq!(
        lanes(&balancer_handle),
        0,
        "a handle that never called has none"
    );
    let _first = balancer_handle.call(());
    assert_eq!(
        lanes(&balancer_handle),
        1,
        "no lane to inherit: made at the first call"
    );
    // Cloned per request and called once: the clone's call uses the lane it inherited.
    let mut calls = Vec::new();
    for _ in 0..100 {
        calls.push(balancer_handle.clone().call(()));
    }
    assert_eq!(lanes(&balancer_handle), 1);
    assert_eq!(balancer_handle.in_flight(), 101);
    // A clone that keeps calling makes its own at its second call.
    let mut worker = balancer_handle.clone();
    let _second = worker.call(());
    assert_eq!(lanes(&worker), 1);
    let _third = worker.call(());
    assert_eq!(lanes(&worker), 2);
    assert_eq!(balancer_handle.in_flight(), 103);
    drop(calls);
    drop(worker);
    assert_eq!(
        balancer_handle.in_flight(),
        3,
        "the worker's calls outlive it"
    );
}

#[test]
fn reading_calls_in_flight_never_deadlocks_with_a_lane_dropping() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let base = layer.endpoint(Hang);
    let reader = base.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (done, finished) = std::sync::mpsc::channel();
    let writer = {
        let (stop, done) = (stop.clone(), done.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // A lane of its own at the second call, whose last reference is the future.
                let mut handle = base.clone();
                let first = handle.call(());
                let second = handle.call(());
                drop(handle);
                drop((first, second));
            }
            done.send(()).unwrap();
        })
    };
    let reading = std::thread::spawn(move || {
        for _ in 0..3_000_000 {
            // Takes the lanes' lock, and may hold a lane's last reference for a moment.
            let _ = reader.in_flight();
        }
        done.send(()).unwrap();
    });
    let timeout = std::time::Duration::from_secs(20);
    finished.recv_timeout(timeout).expect("the reader finished");
    stop.store(true, Ordering::Relaxed);
    finished.recv_timeout(timeout).expect("the writer finished");
    reading.join().unwrap();
    writer.join().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_handle_cloned_per_request_makes_no_lane() {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let template = layer.endpoint(Hang);
    let mut calls = Vec::new();
    for _ in 0..100 {
        calls.push(template.clone().call(()));
    }
    assert_eq!(
        lanes(&template),
        1,
        "the template's lane, made at its first clone"
    );
    assert_eq!(template.in_flight(), 100);
}

#[tokio::test(start_paused = true)]
async fn calls_in_flight_are_counted_across_every_handle() {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let mut first = layer.endpoint(Hang);
    let mut second = first.clone();
    let idle = first.clone();
    assert_eq!(idle.in_flight(), 0, "no handle has called yet");
    let one = first.call(());
    assert_eq!(first.in_flight(), 1, "one lane: read on its own");
    let two = second.call(());
    let three = second.call(());
    for handle in [&first, &second, &idle] {
        assert_eq!(handle.in_flight(), 3, "lanes are summed for every handle");
    }
    drop(second);
    assert_eq!(
        first.in_flight(),
        3,
        "a dropped handle's calls are still in flight"
    );
    drop((two, three));
    assert_eq!(first.in_flight(), 1);
    assert_eq!(idle.in_flight(), 1);
    // Polled and then dropped, a call leaves the count as well.
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut one = Box::pin(one);
    assert!(one.as_mut().poll(&mut cx).is_pending());
    drop(one);
    assert_eq!(first.in_flight(), 0);
    let load_idle = first.load().value();
    let _pending = first.call(());
    assert!(
        first.load().value() > load_idle,
        "in-flight calls raise the cost"
    );
}
