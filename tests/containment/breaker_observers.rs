//! The standalone breaker's state observers, which run on a thread of their own: inside the
//! caller's tokio runtime, waitable from async code without blocking the runtime, and never
//! stopped by what an observer does (a panic whose payload panics again when dropped ended the
//! thread: later changes were lost, or told on the caller's task again).

use crate::support;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::reset_while as backend;

use tower::{Layer, Service, ServiceExt};
use tower_outlier::slow_call::{
    state_observers_told, wait_for_state_observers, BreakerConfig, CircuitBreakerLayer, State,
};

fn config() -> BreakerConfig {
    BreakerConfig::error_count(0)
        .min_calls(1)
        .open_duration(Duration::from_millis(20))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_runs_inside_the_callers_runtime() {
    let (sent, mut received) = tokio::sync::mpsc::unbounded_channel();
    let layer = CircuitBreakerLayer::new(config()).on_state_change(move |change| {
        // What an observer that forwards to a task does: it needs the caller's runtime.
        let sent = sent.clone();
        let to = change.to;
        let spawned = std::panic::catch_unwind(|| {
            tokio::spawn(async move {
                let _ = sent.send(to);
            })
        });
        assert!(spawned.is_ok(), "no runtime on the observers' thread");
    });
    let mut breaker = layer.layer(backend(Arc::new(AtomicBool::new(true))));
    assert!(breaker.ready().await.unwrap().call(()).await.is_err());
    let told = tokio::time::timeout(Duration::from_secs(5), received.recv())
        .await
        .expect("the observer's task ran");
    assert_eq!(told, Some(State::Open));
}

#[tokio::test(flavor = "current_thread")]
async fn waiting_for_observers_does_not_block_the_runtime() {
    // An observer forwarding to a task of this current-thread runtime through a bounded channel:
    // a blocking wait would hold the only thread the task needs to drain it.
    let (sent, mut received) = tokio::sync::mpsc::channel(1);
    let layer = CircuitBreakerLayer::new(config()).on_state_change(move |change| {
        let _ = sent.blocking_send(change.to);
    });
    let failing = Arc::new(AtomicBool::new(true));
    let mut breaker = layer.layer(backend(failing.clone()));
    // CLOSED → OPEN, then OPEN → HALF_OPEN → OPEN: three changes.
    assert!(breaker.ready().await.unwrap().call(()).await.is_err());
    tokio::time::sleep(Duration::from_millis(30)).await;
    let _ = breaker.ready().await.unwrap().call(()).await;
    let drain = async {
        let mut seen = Vec::new();
        while seen.len() < 3 {
            seen.push(received.recv().await.unwrap());
        }
        seen
    };
    let (seen, ()) = tokio::time::timeout(
        Duration::from_secs(5),
        futures::future::join(drain, state_observers_told()),
    )
    .await
    .expect("told within 5 s");
    assert_eq!(seen, [State::Open, State::HalfOpen, State::Open]);
}

/// A panic payload that panics again when it is dropped.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a panic payload that panics when dropped");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_observer_stops_the_observers_thread() {
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !matches!(info.payload_as_str(), Some(text) if text.contains("when dropped"))
            && !info.payload().is::<Bomb>()
        {
            quiet(info);
        }
    }));
    let seen: Arc<Mutex<Vec<(State, std::thread::ThreadId)>>> = Arc::default();
    let bomb = CircuitBreakerLayer::new(config()).on_state_change(|_| {
        std::panic::panic_any(Bomb);
    });
    let record = {
        let seen = seen.clone();
        CircuitBreakerLayer::new(config()).on_state_change(move |change| {
            seen.lock()
                .unwrap()
                .push((change.to, std::thread::current().id()));
        })
    };
    let mut first = bomb.layer(backend(Arc::new(AtomicBool::new(true))));
    assert!(first.ready().await.unwrap().call(()).await.is_err());
    wait_for_state_observers();
    // The thread lives on: a later change of another breaker is told, off the caller's thread.
    let mut second = record.layer(backend(Arc::new(AtomicBool::new(true))));
    assert!(second.ready().await.unwrap().call(()).await.is_err());
    wait_for_state_observers();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, State::Open);
    assert_ne!(seen[0].1, std::thread::current().id());
}
