//! Dry run (layer-wide and per policy) where it crosses other rules, on tokio's paused clock: an
//! endpoint out only in dry run whose service fails `poll_ready` never leaves the balancer with
//! nothing it can pick (beside a forced-out endpoint, an enforcing policy's ejection or an
//! upstream removal); a host another service holds out is held out for real once dry run is off;
//! a dry-run policy neither fails an enforced trial nor changes the enforcing policy's decisions;
//! and the linkerd and slow-call gates hold no call of an endpoint dry run keeps in.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::Harness;
use tower_outlier::events::Event;
use tower_outlier::{EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

const SECOND: Duration = Duration::from_secs(1);

pub(super) fn hsf_layer(ratio: f64) -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .window(Duration::from_secs(2))
            .min_calls(5)
            .recovery_unit(Duration::from_secs(5))
            .max_ejection_ratio(ratio)
            .build()
            .unwrap(),
    ))
}

fn events(layer: &OutlierDetectionLayer) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let cb = layer.monitor().on_event(move |event| {
        sink.lock().unwrap().push(format!("{event:?}"));
    });
    std::mem::forget(cb);
    seen
}

/// Live endpoints whose backend is not broken (the balancer can pick them).
fn pickable<P: tower_outlier::probe::Probe<usize, support::Backend> + Clone>(
    h: &Harness<P>,
) -> Vec<usize> {
    h.live_ids()
        .into_iter()
        .filter(|id| !h.backend(*id).is_broken())
        .collect()
}

// An endpoint out only in dry run whose service fails poll_ready is not counted as one to fall
// back on: forcing out the other one still leaves the balancer an endpoint it can pick.
#[tokio::test(start_paused = true)]
async fn force_out_with_a_shadow_ejected_unready_endpoint() {
    let layer = hsf_layer(0.5);
    let rules = layer.rules();
    rules.set_dry_run(true);
    let mut h = Harness::new(&layer, 2);
    h.calls(0, 10, 0).await;
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().would_be,
        Some(EndpointStatus::Ejected)
    );
    h.backend(0).set_broken(true);
    h.poll_ready_all();
    rules.force_out(&1usize);
    h.sync();
    eprintln!(
        "live {:?} seen {:?} snap {:#?}",
        h.live_ids(),
        h.seen,
        layer.monitor().snapshot().endpoints
    );
    assert!(
        !pickable(&h).is_empty(),
        "no endpoint the balancer can pick: live {:?}, 0 broken; seen {:?}",
        h.live_ids(),
        h.seen
    );
}

// Per-policy dry run. Policy 0 (dry run) shadow-ejects endpoint 0, whose service then fails
// poll_ready; the enforcing policy 1 then judges endpoint 1: the balancer is not left with
// endpoint 0 alone, which it cannot pick.
#[tokio::test(start_paused = true)]
async fn enforcing_policy_ejects_the_last_pickable_next_to_a_shadow_ejected_unready_one() {
    let strict = ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .min_calls(20)
            .error_rate_threshold(0.9)
            .max_ejection_ratio(0.5)
            .build()
            .unwrap(),
    );
    let layer = hsf_layer(0.5).with_policy(strict);
    let rules = layer.rules();
    rules.set_policy_dry_run(0, true).unwrap();
    let mut h = Harness::new(&layer, 2);
    h.calls(0, 5, 0).await;
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().would_be,
        Some(EndpointStatus::Ejected)
    );
    h.backend(0).set_broken(true);
    h.poll_ready_all();
    h.calls_while_live(1, 20, 0).await;
    h.poll_ready_all();
    assert!(
        !pickable(&h).is_empty(),
        "no endpoint the balancer can pick: live {:?} (0 is broken); seen {:?}",
        h.live_ids(),
        h.seen
    );
}

pub(super) fn host_of() -> tower_outlier::hosts::HostOf {
    tower_outlier::hosts::HostOf::new(|key: &usize| Some(format!("10.0.0.{key}")))
}

// A host held out by another service: a layer in dry run holds it out only as dry run; when its
// dry run is switched off, the endpoint is held out for its host for real.
#[tokio::test(start_paused = true)]
async fn dry_run_off_forgets_a_host_ejection_that_still_stands() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    payments.rules().set_dry_run(true);
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    o.calls_while_live(2, 10, 0).await;
    assert!(!o.is_live(2));
    p.sync();
    assert!(p.is_live(2), "dry run: kept in");
    assert_eq!(
        payments.monitor().snapshot().get("2").unwrap().would_be,
        Some(EndpointStatus::Ejected)
    );
    payments.rules().set_dry_run(false);
    p.sync();
    assert_eq!(
        hosts.ejected_hosts(),
        vec!["10.0.0.2".to_string()],
        "still out in orders"
    );
    // Control: a fresh enforcing layer joining now holds it out at once.
    let fresh = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let f = Harness::new(&fresh, 5);
    assert!(
        !f.is_live(2),
        "control: an enforcing layer holds the host out"
    );
    p.advance(SECOND).await;
    assert!(
        !p.is_live(2),
        "dry run off: the host another service holds out is still in payments' set; snapshot {:?}",
        payments.monitor().snapshot().get("2")
    );
}

pub(super) fn two_policy_layer() -> OutlierDetectionLayer {
    // Policy 0 (to be dry): 50 % over 5 calls. Policy 1 (enforcing): 90 % over 20 calls.
    let strict = ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .window(Duration::from_secs(2))
            .min_calls(20)
            .error_rate_threshold(0.9)
            .recovery_unit(Duration::from_secs(5))
            .max_ejection_ratio(0.4)
            .build()
            .unwrap(),
    );
    hsf_layer(0.4).with_policy(strict)
}

// A dry-run policy judging an endpoint during the trial after an enforcing policy's ejection
// reports no real (not dry-run) TrialFailed, and counts no failed check on the real episode.
#[tokio::test(start_paused = true)]
async fn a_dry_policy_fails_an_enforced_trial_for_real() {
    let layer = two_policy_layer();
    let rules = layer.rules();
    rules.set_policy_dry_run(0, true).unwrap();
    let seen = events(&layer);
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(2, 20, 0).await;
    assert!(!h.is_live(2), "policy 1 ejects");
    h.advance(5 * SECOND).await;
    assert!(h.is_live(2), "on trial");
    assert_eq!(
        layer.monitor().snapshot().get("2").unwrap().status,
        EndpointStatus::Trial
    );
    seen.lock().unwrap().clear();
    // Only policy 0 (dry run) would judge this: 5 failures in 6 calls.
    h.calls(2, 5, 1).await;
    let seen = seen.lock().unwrap().clone();
    let real_trial_failed: Vec<&String> = seen
        .iter()
        .filter(|e| e.starts_with("TrialFailed"))
        .collect();
    let two = layer.monitor().snapshot().get("2").unwrap().clone();
    assert!(
        real_trial_failed.is_empty() && two.failed_checks == 0,
        "a dry-run policy failed the enforced trial for real: {real_trial_failed:?}; status {:?} would_be {:?} failed_checks {}; events {seen:#?}",
        two.status, two.would_be, two.failed_checks
    );
}

/// The real (not dry-run) decisions, with their times from the start.
fn real_decisions(layer: &OutlierDetectionLayer) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let start = tokio::time::Instant::now();
    let cb = layer.monitor().on_event(move |event| {
        let line = match event {
            Event::Ejected {
                key, next_check_in, ..
            } => format!("{key} ejected, check in {next_check_in:?}"),
            Event::TrialFailed { key, failed_checks } => {
                format!("{key} trial failed ({failed_checks})")
            }
            Event::Recovered { key } => format!("{key} recovered"),
            Event::Readmitted { key, cause, .. } => format!("{key} readmitted {cause:?}"),
            _ => return,
        };
        sink.lock()
            .unwrap()
            .push(format!("{:?}: {line}", tokio::time::Instant::now() - start));
    });
    std::mem::forget(cb);
    seen
}

async fn trial_script(layer: &OutlierDetectionLayer) -> Vec<String> {
    let seen = real_decisions(layer);
    let mut h = Harness::new(layer, 5);
    h.calls_while_live(2, 20, 0).await;
    h.advance(5 * SECOND).await;
    // Only policy 0 would judge this.
    h.calls(2, 5, 1).await;
    for _ in 0..40 {
        h.calls_while_live(2, 0, 1).await;
        h.advance(Duration::from_millis(500)).await;
    }
    h.calls_while_live(2, 20, 0).await;
    for _ in 0..120 {
        h.calls_while_live(2, 0, 1).await;
        h.advance(Duration::from_millis(500)).await;
    }
    let out = seen.lock().unwrap().clone();
    out
}

// A policy in dry run changes nothing the enforcing policy does: the real decisions are those of
// the same layer with policy 0 switched off.
#[tokio::test(start_paused = true)]
async fn a_dry_policy_changes_the_enforcing_policys_decisions() {
    let dry = two_policy_layer();
    dry.rules().set_policy_dry_run(0, true).unwrap();
    let with_dry = trial_script(&dry).await;
    let off = two_policy_layer();
    off.rules()
        .replace(
            0,
            ErrorRatePolicy::new(
                ErrorRateConfig::hsf()
                    .enabled(false)
                    .window(Duration::from_secs(2))
                    .min_calls(5)
                    .recovery_unit(Duration::from_secs(5))
                    .max_ejection_ratio(0.4)
                    .build()
                    .unwrap(),
            ),
        )
        .unwrap();
    let without = trial_script(&off).await;
    assert_eq!(
        with_dry, without,
        "the enforcing decisions differ with a dry-run policy beside"
    );
}

// Layer-wide dry run. Endpoint 0 is out only in dry run and its service fails poll_ready;
// endpoint 2 is forced out; then endpoint 1's service fails too: the balancer is still left an
// endpoint it can pick.
#[tokio::test(start_paused = true)]
async fn dry_run_shadow_unready_leaves_nothing_pickable_with_one_forced_out() {
    let layer = hsf_layer(0.5);
    let rules = layer.rules();
    rules.set_dry_run(true);
    let mut h = Harness::new(&layer, 3);
    h.calls(0, 5, 0).await;
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().would_be,
        Some(EndpointStatus::Ejected)
    );
    h.backend(0).set_broken(true);
    h.poll_ready_all();
    rules.force_out(&2usize);
    h.sync();
    assert_eq!(h.live_ids(), vec![0, 1]);
    h.backend(1).set_broken(true);
    h.poll_ready_all();
    for _ in 0..5 {
        h.advance(SECOND).await;
        h.poll_ready_all();
    }
    assert!(
        !pickable(&h).is_empty(),
        "nothing the balancer can pick (0 and 1 broken), and healthy forced-out 2 is not brought back: live {:?}; seen {:?}",
        h.live_ids(),
        h.seen
    );
}

// As above, the last pickable endpoint removed by the upstream: the balancer is still left an
// endpoint it can pick.
#[tokio::test(start_paused = true)]
async fn upstream_removal_leaves_nothing_pickable_beside_a_shadow_unready_endpoint() {
    let layer = hsf_layer(0.5);
    let rules = layer.rules();
    rules.set_dry_run(true);
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().would_be,
        Some(EndpointStatus::Ejected)
    );
    h.backend(0).set_broken(true);
    h.poll_ready_all();
    h.backend(1).set_broken(true);
    h.poll_ready_all();
    rules.force_out(&2usize);
    h.sync();
    assert_eq!(h.live_ids(), vec![0, 1, 3]);
    h.remove(3);
    h.sync();
    for _ in 0..5 {
        h.advance(SECOND).await;
        h.poll_ready_all();
    }
    assert!(
        !pickable(&h).is_empty(),
        "nothing the balancer can pick (0 and 1 broken), and healthy forced-out 2 is not brought back: live {:?}; snapshot {:?}",
        h.live_ids(),
        layer.monitor().snapshot().endpoints.iter().map(|e| (e.key.to_string(), e.status, e.would_be, e.forced)).collect::<Vec<_>>()
    );
}

// Layer-wide dry run with an error-rate policy (slot 0) and linkerd's breaker (slot 1). A failed
// probation probe shuts linkerd's gate ("every call held until the layer ejects the endpoint or
// refuses to"); when the error-rate policy judges at the same moment, dry run's ejection is the
// error-rate policy's, and the endpoint, still in the balancer's set, must not hold every call
// until the shadow check (an ejection in all but name).
#[tokio::test(start_paused = true)]
async fn linkerd_gate_holds_calls_for_a_whole_shadow_ejection() {
    use std::task::Poll;
    use tower::{Service, ServiceExt};
    use tower_outlier::{DetectorConfig, DetectorPolicy};
    let linkerd = DetectorPolicy::seeded(
        DetectorConfig::linkerd_consecutive()
            .consecutive_5xx(3)
            .backoff_jitter(0.0)
            .build()
            .unwrap(),
        5,
    );
    let error_rate = ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .window(Duration::from_secs(10))
            .min_calls(3)
            .recovery_unit(Duration::from_secs(5))
            .max_ejection_ratio(0.4)
            .build()
            .unwrap(),
    );
    let layer = OutlierDetectionLayer::new(error_rate).with_policy(linkerd);
    layer.rules().set_dry_run(true);
    let mut h = Harness::new(&layer, 5);
    // S S S S F F F: 3/7 failures keep the error-rate policy quiet; linkerd's streak trips.
    h.calls(0, 0, 4).await;
    h.calls(0, 3, 0).await;
    let zero = layer.monitor().snapshot().get("0").unwrap().clone();
    assert_eq!(zero.would_be, Some(EndpointStatus::Ejected), "{zero:?}");
    assert_eq!(zero.last_reason.as_ref().unwrap().policy, "linkerd");
    // Two calls admitted while linkerd's gate is open (in rotation), answered later.
    h.backend(0).set_failing(true);
    let mut in_flight = Vec::new();
    for _ in 0..2 {
        let endpoint = h.live.get_mut(&0).unwrap();
        endpoint.ready().await.unwrap();
        in_flight.push(endpoint.call(()));
    }
    // After the back-off: on (dry run's) probation; the next call is the probe.
    h.advance(SECOND).await;
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().would_be,
        Some(EndpointStatus::Trial)
    );
    let endpoint = h.live.get_mut(&0).unwrap();
    endpoint.ready().await.unwrap();
    let probe = endpoint.call(());
    for call in in_flight {
        let _ = call.await;
    }
    h.sync();
    let _ = probe.await;
    h.sync();
    h.backend(0).set_failing(false);
    let zero = layer.monitor().snapshot().get("0").unwrap().clone();
    eprintln!(
        "F: after failed probe: would_be {:?} reason {:?} windows {:?}",
        zero.would_be, zero.last_reason, zero.windows
    );
    // Still in the set, as dry run promises; can the balancer use it?
    assert!(h.is_live(0));
    let mut held_for = Duration::ZERO;
    for _ in 0..120 {
        let (task, live) = (&mut h.task, &mut h.live);
        let endpoint = live.get_mut(&0).unwrap();
        let ready = task.enter(|cx, _| endpoint.poll_ready(cx));
        if matches!(ready, Poll::Ready(Ok(()))) {
            break;
        }
        h.advance(SECOND).await;
        held_for += SECOND;
    }
    let zero = layer.monitor().snapshot().get("0").unwrap().clone();
    eprintln!(
        "F: at the end: status {:?} would_be {:?} next {:?} windows {:?}",
        zero.status, zero.would_be, zero.next_check_in, zero.windows
    );
    assert!(
        held_for < SECOND,
        "dry run: endpoint 0 is in the set but holds every call for {held_for:?} (linkerd's gate shut)"
    );
}

// The slow-call breaker in dry run, through p2c with 16 callers: the slow endpoint keeps serving;
// the longest stretch without a new call to it is measured.
#[tokio::test(start_paused = true)]
async fn slow_call_breaker_in_dry_run_keeps_serving() {
    use tower::balance::p2c::Balance;
    use tower::buffer::Buffer;
    use tower::Layer;
    use tower_outlier::policy::{BudgetFloor, EjectionBudget};
    use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
    let layer = OutlierDetectionLayer::new(SlowCallPolicy::new(
        BreakerConfig::slow_ratio(Duration::from_millis(500))
            .ratio(1.0)
            .min_calls(3)
            .window(Duration::from_secs(5))
            .open_duration(Duration::from_secs(10))
            .build()
            .unwrap(),
    ))
    .budget(EjectionBudget::new(0.5, BudgetFloor::One).unwrap());
    layer.rules().set_dry_run(true);
    let dry_ejections = Arc::new(Mutex::new(0usize));
    let sink = dry_ejections.clone();
    let cb = layer.monitor().on_event(move |e| {
        if let Event::DryRun(inner) = e {
            if matches!(**inner, Event::Ejected { .. }) {
                *sink.lock().unwrap() += 1;
            }
        }
    });
    let backends: Vec<(usize, support::Sleepy)> = (0..4)
        .map(|id| {
            (
                id,
                support::Sleepy::new(id, if id == 3 { 600 } else { 100 }),
            )
        })
        .collect();
    let balancer = Buffer::new(
        Balance::from_rng(
            layer.layer(support::announce(&backends)),
            support::SeededRng(3),
        ),
        64,
    );
    let slow = backends[3].1.clone();
    let until = tokio::time::Instant::now() + Duration::from_secs(40);
    let workers = spawn_load(&balancer, 16, until);
    let mut last = slow.calls();
    let mut last_at = tokio::time::Instant::now();
    let mut longest = Duration::ZERO;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = slow.calls();
        if now != last {
            last = now;
            last_at = tokio::time::Instant::now();
        } else {
            longest = longest.max(last_at.elapsed());
        }
    }
    for w in workers {
        w.await.unwrap();
    }
    drop(cb);
    eprintln!(
        "G: slow endpoint calls {}, dry ejections {}, longest gap {longest:?}, max in flight {}",
        slow.calls(),
        dry_ejections.lock().unwrap(),
        slow.max_in_flight.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(*dry_ejections.lock().unwrap() >= 1);
    assert!(longest < Duration::from_secs(2), "held {longest:?}");
}

fn spawn_load<S>(
    balancer: &tower::buffer::Buffer<(), S>,
    workers: usize,
    until: tokio::time::Instant,
) -> Vec<tokio::task::JoinHandle<()>>
where
    S: std::future::Future<Output = Result<usize, tower::BoxError>> + Send + 'static,
{
    use tower::ServiceExt;
    (0..workers)
        .map(|_| {
            let balancer = balancer.clone();
            tokio::spawn(async move {
                while tokio::time::Instant::now() < until {
                    let _ = balancer.clone().oneshot(()).await;
                }
            })
        })
        .collect()
}

// Linkerd alone in dry run: a failed probe does not hold calls.
#[tokio::test(start_paused = true)]
async fn linkerd_alone_in_dry_run_does_not_hold_after_a_failed_probe() {
    use std::task::Poll;
    use tower::{Service, ServiceExt};
    use tower_outlier::{DetectorConfig, DetectorPolicy};
    let layer = OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::linkerd()
            .consecutive_5xx(3)
            .backoff_jitter(0.0)
            .build()
            .unwrap(),
        5,
    ));
    layer.rules().set_dry_run(true);
    let mut h = Harness::new(&layer, 5);
    for round in 0..6 {
        h.calls(0, 3, 0).await;
        h.advance(Duration::from_secs(1 << round.min(5))).await;
        let mut held_for = Duration::ZERO;
        for _ in 0..30 {
            let (task, live) = (&mut h.task, &mut h.live);
            let endpoint = live.get_mut(&0).unwrap();
            let ready = task.enter(|cx, _| endpoint.poll_ready(cx));
            if matches!(ready, Poll::Ready(Ok(()))) {
                break;
            }
            h.advance(Duration::from_millis(100)).await;
            held_for += Duration::from_millis(100);
        }
        assert!(held_for < SECOND, "round {round}: held {held_for:?}");
        let _ = h
            .live
            .get_mut(&0)
            .unwrap()
            .ready()
            .await
            .unwrap()
            .call(())
            .await;
        h.sync();
    }
    assert!(h.removals().is_empty());
}
