//! The standalone breaker survives user code that panics: a state observer that panics as the
//! probe is admitted, a classifier that panics on the probe's answer. Before, either left the
//! breaker HALF_OPEN for ever, rejecting every call.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::reset_while as backend;

use tower::{Layer, Service, ServiceExt};
use tower_outlier::classify::{classify_fn, FailureKind, Outcome};
use tower_outlier::slow_call::{BreakerConfig, CircuitBreakerLayer, State};

fn config() -> BreakerConfig {
    BreakerConfig::error_count(0)
        .min_calls(1)
        .open_duration(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_observer_that_panics_as_the_probe_is_admitted_does_not_strand_the_breaker() {
    let failing = Arc::new(AtomicBool::new(true));
    let layer = CircuitBreakerLayer::new(config()).on_state_change(|change| {
        if change.to == State::HalfOpen {
            panic!("an observer that cannot take HALF_OPEN");
        }
    });
    let mut breaker = layer.layer(backend(failing.clone()));
    assert!(breaker.ready().await.unwrap().call(()).await.is_err());
    assert_eq!(breaker.state(), State::Open);
    failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(11)).await;
    // The probe goes through although its observer panicked, and closes the breaker.
    assert_eq!(breaker.ready().await.unwrap().call(()).await.unwrap(), 7);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.ready().await.unwrap().call(()).await.unwrap(), 7);
}

#[tokio::test(start_paused = true)]
async fn a_classifier_that_panics_on_the_probe_gives_its_slot_back() {
    let failing = Arc::new(AtomicBool::new(true));
    let panic_once = Arc::new(AtomicBool::new(false));
    let layer = CircuitBreakerLayer::new(config()).classifier(classify_fn({
        let panic_once = panic_once.clone();
        move |result: Result<&u32, &std::io::Error>| {
            if panic_once.swap(false, Ordering::SeqCst) {
                panic!("a classifier that cannot read this answer");
            }
            match result {
                Ok(_) => Outcome::Success,
                Err(_) => Outcome::Failure(FailureKind::Transport),
            }
        }
    }));
    let mut breaker = layer.layer(backend(failing.clone()));
    assert!(breaker.ready().await.unwrap().call(()).await.is_err());
    assert_eq!(breaker.state(), State::Open);
    failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(11)).await;
    panic_once.store(true, Ordering::SeqCst);
    // The probe's answer reaches its caller; its classification panicked, so it decides nothing
    // and the next call is the probe.
    assert_eq!(breaker.ready().await.unwrap().call(()).await.unwrap(), 7);
    assert_eq!(breaker.ready().await.unwrap().call(()).await.unwrap(), 7);
    assert_eq!(breaker.state(), State::Closed);
}

/// A `BreakerClassifier` of one's own that panics: the caller gets an error instead of the
/// unwind, and the probe's slot comes back (the next call probes and closes the breaker).
#[tokio::test(start_paused = true)]
async fn a_breaker_classifier_of_ones_own_that_panics_is_contained() {
    use tower_outlier::slow_call::{BreakerClassifier, PendingCall};

    #[derive(Clone)]
    struct Erratic(Arc<AtomicBool>);

    impl BreakerClassifier<u32, std::io::Error> for Erratic {
        type Response = u32;

        fn complete(
            result: Result<u32, std::io::Error>,
            call: PendingCall<Self>,
        ) -> Result<u32, std::io::Error> {
            if call.classifier().0.swap(false, Ordering::SeqCst) {
                panic!("a classifier that cannot read this answer");
            }
            call.record(match result {
                Ok(_) => Outcome::Success,
                Err(_) => Outcome::Failure(FailureKind::Transport),
            });
            result
        }
    }

    let failing = Arc::new(AtomicBool::new(true));
    let panic_once = Arc::new(AtomicBool::new(false));
    let layer = CircuitBreakerLayer::new(config()).classifier(Erratic(panic_once.clone()));
    let mut breaker = layer.layer(backend(failing.clone()));
    assert!(breaker.ready().await.unwrap().call(()).await.is_err());
    assert_eq!(breaker.state(), State::Open);
    failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(11)).await;
    panic_once.store(true, Ordering::SeqCst);
    let error = breaker.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(error.to_string().contains("classifier panicked"), "{error}");
    assert_eq!(breaker.ready().await.unwrap().call(()).await.unwrap(), 7);
    assert_eq!(breaker.state(), State::Closed);
}

/// Observers are user code that may be slow: they run on a thread of their own, never on the
/// task whose call changed the state (before, an observer blocking for 300 ms held the call that
/// opened the breaker, and its caller, for 300 ms).
#[tokio::test]
async fn observers_run_off_the_callers_task() {
    use std::sync::Mutex;
    let failing = Arc::new(AtomicBool::new(true));
    let seen: Arc<Mutex<Vec<(State, std::thread::ThreadId)>>> = Arc::default();
    let layer = CircuitBreakerLayer::new(config()).on_state_change({
        let seen = seen.clone();
        move |change| {
            std::thread::sleep(Duration::from_millis(300));
            seen.lock()
                .unwrap()
                .push((change.to, std::thread::current().id()));
        }
    });
    let mut breaker = layer.layer(backend(failing));
    let started = std::time::Instant::now();
    assert!(breaker.ready().await.unwrap().call(()).await.is_err());
    let took = started.elapsed();
    assert_eq!(breaker.state(), State::Open);
    assert!(
        took < Duration::from_millis(250),
        "the call that opened the breaker took {took:?}: its observer ran on the caller's task"
    );
    tower_outlier::slow_call::wait_for_state_observers();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, State::Open);
    assert_ne!(seen[0].1, std::thread::current().id());
}
