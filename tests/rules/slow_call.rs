//! `tower_outlier::rules`, section 5 (Sentinel's slow-call ratio, error ratio and error count breaker),
//! rule by rule: on the breaker itself, through the standalone layer on tokio's paused clock, and
//! per endpoint through the outlier layer.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_outlier::classify::{FailureKind, Observation, Outcome};
use tower_outlier::slow_call::{
    Admission, Breaker, BreakerConfig, BrokenCircuit, CircuitBreakerLayer, SlowCallPolicy, State,
    StateChange,
};

const MS: u64 = 1_000_000;
const SECOND: u64 = 1_000 * MS;

fn took(ms: u64) -> Observation {
    Observation {
        outcome: Outcome::Success,
        latency: Duration::from_millis(ms),
    }
}

fn failed() -> Observation {
    Observation {
        outcome: Outcome::Failure(FailureKind::Transport),
        latency: Duration::from_millis(1),
    }
}

/// Completes `observations` as ordinary calls at time `at`.
fn feed(breaker: &Breaker, at: u64, observations: impl IntoIterator<Item = Observation>) {
    for observation in observations {
        let admission = breaker.acquire(at);
        breaker.complete(admission, &observation, at);
    }
}

fn slow_ratio(ratio: f64) -> Breaker {
    Breaker::new(
        BreakerConfig::slow_ratio(Duration::from_millis(500))
            .ratio(ratio)
            .min_calls(5)
            .open_duration(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
}

#[test]
fn slow_means_strictly_slower_than_max_rt() {
    let breaker = slow_ratio(1.0);
    feed(&breaker, 0, (0..5).map(|_| took(500)));
    assert_eq!(
        breaker.state(),
        State::Closed,
        "500 ms is not slower than 500 ms"
    );
    let breaker = slow_ratio(1.0);
    let just_over = Observation {
        outcome: Outcome::Success,
        latency: Duration::from_millis(500) + Duration::from_nanos(1),
    };
    feed(&breaker, 0, (0..5).map(|_| just_over));
    assert_eq!(breaker.state(), State::Open);
}

#[test]
fn nothing_happens_below_the_minimum_requests() {
    let breaker = slow_ratio(1.0);
    feed(&breaker, 0, (0..4).map(|_| took(1000)));
    assert_eq!(breaker.state(), State::Closed);
    feed(&breaker, 0, [took(1000)]);
    assert_eq!(breaker.state(), State::Open);
}

#[test]
fn the_slow_ratio_must_be_strictly_greater() {
    let breaker = slow_ratio(0.5);
    feed(&breaker, 0, (0..5).map(|_| took(10)));
    feed(&breaker, 0, (0..5).map(|_| took(1000)));
    assert_eq!(
        breaker.state(),
        State::Closed,
        "5 of 10 = 0.5 is not above 0.5"
    );
    feed(&breaker, 0, [took(1000)]);
    assert_eq!(breaker.state(), State::Open, "6 of 11 > 0.5");
}

#[test]
fn at_ratio_one_only_an_all_slow_interval_opens() {
    let breaker = slow_ratio(1.0);
    feed(&breaker, 0, [took(10)]);
    feed(&breaker, 0, (0..20).map(|_| took(1000)));
    assert_eq!(
        breaker.state(),
        State::Closed,
        "one fast call keeps it closed"
    );
    let breaker = slow_ratio(1.0);
    feed(&breaker, 0, (0..20).map(|_| took(1000)));
    assert_eq!(breaker.state(), State::Open);
}

#[test]
fn the_interval_restarts_with_one_bucket() {
    let breaker = slow_ratio(1.0);
    feed(&breaker, 0, (0..4).map(|_| took(1000)));
    // The next interval starts empty: four more slow calls are again below the minimum.
    feed(&breaker, SECOND, (0..4).map(|_| took(1000)));
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.counts(SECOND).calls, 4);
}

#[test]
fn error_ratio_and_error_count_are_strict() {
    let ratio = Breaker::new(
        BreakerConfig::error_ratio(0.5)
            .min_calls(10)
            .open_duration(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    feed(&ratio, 0, (0..5).map(|_| failed()));
    feed(&ratio, 0, (0..5).map(|_| took(1)));
    assert_eq!(ratio.state(), State::Closed, "5 of 10 is not above 0.5");
    feed(&ratio, 0, [failed()]);
    assert_eq!(ratio.state(), State::Open);

    let count = Breaker::new(
        BreakerConfig::error_count(3)
            .min_calls(1)
            .open_duration(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    feed(&count, 0, (0..3).map(|_| failed()));
    assert_eq!(count.state(), State::Closed, "3 errors are not above 3");
    feed(&count, 0, [failed()]);
    assert_eq!(count.state(), State::Open);
}

#[test]
fn open_rejects_until_the_duration_then_admits_one_probe() {
    let breaker = slow_ratio(1.0);
    feed(&breaker, 0, (0..5).map(|_| took(1000)));
    assert_eq!(breaker.acquire(10 * SECOND - 1), Admission::Rejected);
    assert_eq!(breaker.acquire(10 * SECOND), Admission::Probe);
    assert_eq!(breaker.state(), State::HalfOpen);
    assert_eq!(breaker.acquire(10 * SECOND), Admission::Rejected);
    assert_eq!(
        breaker.acquire(20 * SECOND),
        Admission::Rejected,
        "still waiting for the probe"
    );
    // An ordinary call admitted before the breaker opened completes now: it does not decide.
    breaker.complete(Admission::Call, &took(1), 20 * SECOND);
    assert_eq!(breaker.state(), State::HalfOpen);
}

#[test]
fn the_probe_alone_decides() {
    let breaker = slow_ratio(1.0);
    feed(&breaker, 0, (0..5).map(|_| took(1000)));
    // Slow probe: open again for a full duration.
    assert_eq!(breaker.acquire(10 * SECOND), Admission::Probe);
    breaker.complete(Admission::Probe, &took(600), 11 * SECOND);
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.acquire(21 * SECOND - 1), Admission::Rejected);
    // Failed probe: the same.
    assert_eq!(breaker.acquire(21 * SECOND), Admission::Probe);
    breaker.complete(Admission::Probe, &failed(), 21 * SECOND);
    assert_eq!(breaker.state(), State::Open);
    // Fast probe: closed, and the statistics restart.
    assert_eq!(breaker.acquire(31 * SECOND), Admission::Probe);
    breaker.complete(Admission::Probe, &took(10), 31 * SECOND);
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(breaker.counts(31 * SECOND).calls, 0);
    assert_eq!(breaker.acquire(31 * SECOND), Admission::Call);
}

#[test]
fn a_dropped_probe_lets_the_next_call_probe() {
    let breaker = slow_ratio(1.0);
    feed(&breaker, 0, (0..5).map(|_| took(1000)));
    assert_eq!(breaker.acquire(10 * SECOND), Admission::Probe);
    breaker.probe_cancelled(10 * SECOND);
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.acquire(10 * SECOND), Admission::Probe);
}

#[test]
fn observers_receive_the_triggering_value() {
    let changes = Arc::new(Mutex::new(Vec::<StateChange>::new()));
    let seen = changes.clone();
    let layer = CircuitBreakerLayer::new(
        BreakerConfig::slow_ratio(Duration::from_millis(500))
            .ratio(0.5)
            .min_calls(4)
            .open_duration(Duration::from_secs(1))
            .build()
            .unwrap(),
    )
    .on_state_change(move |change| seen.lock().unwrap().push(change.clone()));
    let service = tower::Layer::layer(
        &layer,
        service_fn(|()| async { Ok::<_, std::io::Error>(()) }),
    );
    let breaker = service.breaker();
    feed(breaker, 0, [took(10), took(900), took(900), took(900)]);
    breaker.acquire(SECOND);
    breaker.complete(Admission::Probe, &took(20), SECOND);
    tower_outlier::slow_call::wait_for_state_observers();
    let changes = changes.lock().unwrap();
    let summary: Vec<(State, State, Option<f64>)> =
        changes.iter().map(|c| (c.from, c.to, c.value)).collect();
    assert_eq!(
        summary,
        vec![
            (State::Closed, State::Open, Some(0.75)),
            (State::Open, State::HalfOpen, None),
            (State::HalfOpen, State::Closed, Some(20.0)),
        ]
    );
    assert_eq!(changes[0].counts.unwrap().calls, 4);
}

/// A service whose latency is switched between slow (1 s) and fast (10 ms) on tokio's clock.
fn sleepy(
    slow: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
) -> impl Service<(), Response = (), Error = std::io::Error, Future = impl Send> + Clone {
    service_fn(move |()| {
        calls.fetch_add(1, Ordering::SeqCst);
        let slow = slow.load(Ordering::SeqCst);
        async move {
            let latency = if slow { 1000 } else { 10 };
            tokio::time::sleep(Duration::from_millis(latency)).await;
            Ok::<_, std::io::Error>(())
        }
    })
}

fn is_broken(error: &tower::BoxError) -> bool {
    error.downcast_ref::<BrokenCircuit>().is_some()
}

#[tokio::test(start_paused = true)]
async fn the_seed_walk_through_on_a_paused_clock() {
    // Interval 1 s, minimum 5, ratio 1.0, max RT 500 ms; a service that takes 1 s; 10 calls in a
    // second.
    let slow = Arc::new(AtomicBool::new(true));
    let calls = Arc::new(AtomicUsize::new(0));
    let service = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(
            BreakerConfig::slow_ratio(Duration::from_millis(500))
                .ratio(1.0)
                .min_calls(5)
                .window(Duration::from_secs(1))
                .open_duration(Duration::from_secs(10))
                .build()
                .unwrap(),
        ))
        .service(sleepy(slow.clone(), calls.clone()));
    let mut callers = Vec::new();
    for _ in 0..10 {
        callers.push(tokio::spawn(service.clone().oneshot(())));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    assert_eq!(
        service.state(),
        State::Open,
        "ten 1 s calls in a second open the breaker"
    );
    // Rejected during the open time, without reaching the service.
    let before = calls.load(Ordering::SeqCst);
    let error = service.clone().oneshot(()).await.unwrap_err();
    assert!(is_broken(&error), "{error}");
    assert_eq!(calls.load(Ordering::SeqCst), before);
    // After it, one fast call closes the breaker.
    slow.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    service.clone().oneshot(()).await.unwrap();
    assert_eq!(service.state(), State::Closed);
    service.clone().oneshot(()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn exactly_one_probe_under_eight_concurrent_callers() {
    let gate = Arc::new(Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (gate_in, calls_in) = (gate.clone(), calls.clone());
    let service = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(
            BreakerConfig::error_count(0)
                .min_calls(1)
                .open_duration(Duration::from_secs(5))
                .build()
                .unwrap(),
        ))
        .service(service_fn(move |fail: bool| {
            calls_in.fetch_add(1, Ordering::SeqCst);
            let gate = gate_in.clone();
            async move {
                if fail {
                    return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
                }
                // Held until the test releases it, so the probe stays in flight.
                let _permit = gate.acquire().await;
                Ok(())
            }
        }));
    assert!(service.clone().oneshot(true).await.is_err());
    assert_eq!(service.state(), State::Open);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let callers: Vec<_> = (0..8)
        .map(|_| tokio::spawn(service.clone().oneshot(false)))
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one failure, then exactly one probe"
    );
    gate.add_permits(8);
    let mut rejected = 0;
    for caller in callers {
        match caller.await.unwrap() {
            Ok(()) => {}
            Err(error) if is_broken(&error) => rejected += 1,
            Err(error) => panic!("unexpected {error}"),
        }
    }
    assert_eq!(rejected, 7);
    assert_eq!(service.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_standalone_breaker_does_not_busy_poll() {
    // Open breakers fail calls; readiness stays the inner service's, so nothing spins.
    let service = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(
            BreakerConfig::error_count(0)
                .min_calls(1)
                .open_duration(Duration::from_secs(60))
                .build()
                .unwrap(),
        ))
        .service(service_fn(|()| async {
            Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
        }));
    let mut service = service;
    assert!(service.ready().await.unwrap().call(()).await.is_err());
    let mut ready = tokio_test::task::spawn(());
    for _ in 0..3 {
        assert!(ready.enter(|cx, _| service.poll_ready(cx)).is_ready());
        let error = service.call(()).await.unwrap_err();
        assert!(is_broken(&error));
    }
    assert!(!ready.is_woken());
}

mod through_the_outlier_layer {
    use super::support::{announce, SeededRng, Sleepy};
    use super::*;
    use tower::balance::p2c::Balance;
    use tower::buffer::Buffer;
    use tower::Layer;
    use tower_outlier::policy::{BudgetFloor, EjectionBudget};
    use tower_outlier::{
        EndpointStatus, ErrorRateConfig, ErrorRatePolicy, Monitor, OutlierDetectionLayer,
    };

    fn breaker_layer() -> OutlierDetectionLayer {
        OutlierDetectionLayer::new(SlowCallPolicy::new(
            BreakerConfig::slow_ratio(Duration::from_millis(500))
                .ratio(1.0)
                .min_calls(3)
                .window(Duration::from_secs(5))
                .open_duration(Duration::from_secs(10))
                .build()
                .unwrap(),
        ))
        .budget(EjectionBudget::new(0.5, BudgetFloor::One).unwrap())
    }

    /// `workers` callers, each sending requests back to back through the balancer for `span`.
    async fn load<S>(balancer: &Buffer<(), S>, workers: usize, span: Duration) -> usize
    where
        S: std::future::Future<Output = Result<usize, tower::BoxError>> + Send + 'static,
    {
        let until = tokio::time::Instant::now() + span;
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let balancer = balancer.clone();
                tokio::spawn(async move {
                    let mut sent = 0;
                    while tokio::time::Instant::now() < until {
                        let _ = balancer.clone().oneshot(()).await;
                        sent += 1;
                    }
                    sent
                })
            })
            .collect();
        let mut sent = 0;
        for handle in handles {
            sent += handle.await.unwrap();
        }
        sent
    }

    fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
        monitor.snapshot().get(&key.to_string()).unwrap().status
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_endpoint_is_ejected_probed_once_and_brought_back() {
        let backends: Vec<(usize, Sleepy)> = (0..4)
            .map(|id| (id, Sleepy::new(id, if id == 3 { 600 } else { 100 })))
            .collect();
        let layer = breaker_layer();
        let monitor = layer.monitor();
        let balancer = Buffer::new(
            Balance::from_rng(layer.layer(announce(&backends)), SeededRng(3)),
            64,
        );
        let slow = backends[3].1.clone();

        load(&balancer, 16, Duration::from_secs(4)).await;
        assert_eq!(
            status(&monitor, 3),
            EndpointStatus::Ejected,
            "600 ms > 500 ms for every call"
        );
        assert!(slow.calls() >= 3);
        // While it is out, the others serve every request and it gets none.
        let at_ejection = slow.calls();
        let sent = load(&balancer, 16, Duration::from_secs(4)).await;
        assert!(sent > 100);
        assert_eq!(slow.calls(), at_ejection);
        assert!(backends[..3].iter().all(|(_, b)| b.calls() > 50));

        // It becomes fast; after the open duration it is back for exactly one probe.
        slow.set_latency(100);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before_probe = slow.calls();
        slow.max_in_flight.store(0, Ordering::SeqCst);
        load(&balancer, 16, Duration::from_millis(90)).await;
        assert_eq!(
            slow.calls(),
            before_probe + 1,
            "exactly one request while the probe is in flight"
        );
        assert_eq!(slow.max_in_flight.load(Ordering::SeqCst), 1);
        // The probe was fast: the breaker closed and the endpoint takes its share again.
        load(&balancer, 16, Duration::from_secs(2)).await;
        assert!(
            slow.calls() > before_probe + 20,
            "back in rotation ({})",
            slow.calls() - before_probe
        );
        assert!(status(&monitor, 3).is_available());
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_and_the_last_endpoint_hold_when_several_are_slow() {
        let backends: Vec<(usize, Sleepy)> = (0..4)
            .map(|id| (id, Sleepy::new(id, if id == 0 { 100 } else { 600 })))
            .collect();
        let layer = breaker_layer();
        let monitor = layer.monitor();
        let balancer = Buffer::new(
            Balance::from_rng(layer.layer(announce(&backends)), SeededRng(5)),
            64,
        );
        load(&balancer, 16, Duration::from_secs(8)).await;
        // 4 × 50 % = 2 may be out; the third slow endpoint keeps serving.
        assert_eq!(monitor.snapshot().ejected(), 2);
        assert!(status(&monitor, 0).is_available());

        // Every endpoint slow, and only two endpoints: one always stays.
        let pair: Vec<(usize, Sleepy)> = (0..2).map(|id| (id, Sleepy::new(id, 600))).collect();
        let layer = breaker_layer().budget(EjectionBudget::new(1.0, BudgetFloor::One).unwrap());
        let monitor = layer.monitor();
        let balancer = Buffer::new(
            Balance::from_rng(layer.layer(announce(&pair)), SeededRng(9)),
            64,
        );
        load(&balancer, 8, Duration::from_secs(8)).await;
        assert_eq!(
            monitor.snapshot().ejected(),
            1,
            "the last available endpoint is never ejected"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn it_composes_with_error_rate_ejection_and_shares_the_budget() {
        let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::hsf()
                .max_ejection_ratio(0.25)
                .build()
                .unwrap(),
        ))
        .with_policy(SlowCallPolicy::new(
            BreakerConfig::slow_ratio(Duration::from_millis(500))
                .min_calls(3)
                .window(Duration::from_secs(5))
                .open_duration(Duration::from_secs(10))
                .build()
                .unwrap(),
        ));
        let monitor = layer.monitor();
        let mut h = super::support::Harness::new(&layer, 4);
        // Endpoint 0 fails: ejected by the error-rate policy, spending the one slot (4 × 25 %).
        h.calls(0, 10, 0).await;
        assert!(!h.is_live(0));
        let snapshot = monitor.snapshot();
        let reason = snapshot.get("0").unwrap().last_reason.clone().unwrap();
        assert_eq!(reason.policy, "error-rate");
        assert_eq!(snapshot.get("0").unwrap().windows.len(), 2);
        assert_eq!(snapshot.get("0").unwrap().windows[1].policy, "slow-call");
    }
}

/// The breaker owns its endpoint's recovery timing: an endpoint ejected late (the budget was full
/// when its breaker opened) comes back for its half-open probe when the open duration ends, not
/// one open duration after the ejection.
#[tokio::test(start_paused = true)]
async fn a_late_ejection_is_checked_when_the_breaker_s_open_duration_ends() {
    use tower_outlier::policy::{BudgetFloor, EjectionBudget};
    use tower_outlier::{EndpointStatus, OutlierDetectionLayer};

    let layer = OutlierDetectionLayer::new(SlowCallPolicy::new(
        BreakerConfig::error_ratio(0.5)
            .min_calls(3)
            .window(Duration::from_secs(5))
            .open_duration(Duration::from_secs(10))
            .build()
            .unwrap(),
    ))
    .budget(EjectionBudget::new(0.25, BudgetFloor::One).unwrap());
    let monitor = layer.monitor();
    let mut h = support::Harness::new(&layer, 4);
    // Both breakers open at 0 s, until 10 s; the one slot goes to 0, 1 is refused.
    h.calls(0, 3, 0).await;
    h.calls(1, 3, 0).await;
    assert!(!h.is_live(0));
    assert!(h.is_live(1), "the budget keeps 1 in");
    // At 4 s the upstream drops 0: the slot frees and 1 goes out.
    h.advance(Duration::from_secs(4)).await;
    h.remove(0);
    h.sync();
    assert!(!h.is_live(1));
    assert_eq!(
        monitor.snapshot().get_key(&1).unwrap().next_check_in,
        Some(Duration::from_secs(6)),
        "checked when the breaker's open duration ends"
    );
    h.advance(Duration::from_secs(6)).await;
    assert!(h.is_live(1));
    assert_eq!(
        monitor.snapshot().get_key(&1).unwrap().status,
        EndpointStatus::Trial
    );
}

mod against_a_real_server {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Empty;
    use hyper::body::Incoming;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use std::sync::atomic::AtomicU64;

    /// An HTTP/1 server on loopback answering 200 after `delay_ms`, counting requests.
    async fn server(delay_ms: Arc<AtomicU64>, requests: Arc<AtomicUsize>) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (delay_ms, requests) = (delay_ms.clone(), requests.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_: hyper::Request<Incoming>| {
                        requests.fetch_add(1, Ordering::SeqCst);
                        let delay = delay_ms.load(Ordering::SeqCst);
                        async move {
                            tokio::time::sleep(Duration::from_millis(delay)).await;
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                Empty::<Bytes>::new(),
                            ))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_seed_walk_through_against_a_hyper_server() {
        let delay_ms = Arc::new(AtomicU64::new(200));
        let requests = Arc::new(AtomicUsize::new(0));
        let addr = server(delay_ms.clone(), requests.clone()).await;
        let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        // Sentinel's documented rule scaled down: slower than 30 ms is slow, at least 5 calls, ratio 1.0.
        let service = ServiceBuilder::new()
            .layer(CircuitBreakerLayer::new(
                BreakerConfig::slow_ratio(Duration::from_millis(30))
                    .ratio(1.0)
                    .min_calls(5)
                    .window(Duration::from_secs(1))
                    .open_duration(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            ))
            .service(client);
        let uri: http::Uri = format!("http://{addr}/").parse().unwrap();
        let request = || {
            http::Request::get(uri.clone())
                .body(Empty::<Bytes>::new())
                .unwrap()
        };

        // Ten 200 ms calls, started 10 ms apart: at least five land in one interval, all slow.
        // Every call starts before the first completes, with room for a loaded machine's late
        // timers (with 60 ms calls, a run beside other tests opened the breaker before the last
        // caller started).
        let mut callers = Vec::new();
        for _ in 0..10 {
            callers.push(tokio::spawn(service.clone().oneshot(request())));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap().status(), 200);
        }
        assert_eq!(service.state(), State::Open);

        // Rejected at once while open; the server sees nothing.
        let seen = requests.load(Ordering::SeqCst);
        let started = std::time::Instant::now();
        let error = service.clone().oneshot(request()).await.unwrap_err();
        assert!(is_broken(&error), "{error}");
        assert!(started.elapsed() < Duration::from_millis(30), "fails fast");
        assert_eq!(requests.load(Ordering::SeqCst), seen);

        // The server recovers; after the open duration one fast call closes the breaker.
        delay_ms.store(0, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert_eq!(
            service.clone().oneshot(request()).await.unwrap().status(),
            200
        );
        assert_eq!(service.state(), State::Closed);
        assert_eq!(requests.load(Ordering::SeqCst), seen + 1);
    }
}

#[test]
fn invalid_breaker_configurations_are_named() {
    let open = Duration::from_secs(1);
    let cases = [
        (
            BreakerConfig::slow_ratio(Duration::from_millis(1))
                .open_duration(open)
                .min_calls(0),
            "min_requests",
        ),
        (
            BreakerConfig::slow_ratio(Duration::from_millis(1))
                .open_duration(open)
                .window(Duration::ZERO),
            "window",
        ),
        (
            BreakerConfig::slow_ratio(Duration::from_millis(1)),
            "open_duration",
        ),
        (
            BreakerConfig::slow_ratio(Duration::from_millis(1))
                .open_duration(open)
                .ratio(1.01),
            "slow_ratio_threshold",
        ),
        (
            BreakerConfig::slow_ratio(Duration::from_millis(1))
                .open_duration(open)
                .ratio(-0.5),
            "slow_ratio_threshold",
        ),
        (
            BreakerConfig::error_ratio(1.5).open_duration(open),
            "error_ratio",
        ),
        (
            BreakerConfig::error_ratio(f64::NAN).open_duration(open),
            "error_ratio",
        ),
        (
            BreakerConfig::error_count(1).open_duration(open).buckets(0),
            "buckets",
        ),
    ];
    for (builder, field) in cases {
        let error = builder.build().unwrap_err();
        assert_eq!(error.field(), field, "{error}");
        assert!(error.to_string().contains("allowed"), "{error}");
    }
}

#[test]
fn a_fast_call_that_completes_the_minimum_can_open_the_breaker() {
    let breaker = slow_ratio(0.5);
    feed(&breaker, 0, (0..4).map(|_| took(1000)));
    assert_eq!(
        breaker.state(),
        State::Closed,
        "4 calls are below the minimum of 5"
    );
    feed(&breaker, 0, [took(10)]);
    assert_eq!(
        breaker.state(),
        State::Open,
        "4 slow of 5 = 0.8 > 0.5 once the minimum is reached"
    );

    let errors = Breaker::new(
        BreakerConfig::error_ratio(0.5)
            .min_calls(3)
            .open_duration(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    feed(&errors, 0, [failed(), failed()]);
    feed(&errors, 0, [took(1)]);
    assert_eq!(errors.state(), State::Open, "2 of 3 failed > 0.5");
}
