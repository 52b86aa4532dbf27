//! Operator controls at their edges: dry run, overrides and resets against probes, unready endpoints, hosts shared with another layer, several policies and the linkerd and slow-call gates (each case found by a review that tried to break them).

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Harness, Seen};
use tower_outlier::events::Event;
use tower_outlier::{EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

const SECOND: Duration = Duration::from_secs(1);

fn hsf_layer(ratio: f64) -> OutlierDetectionLayer {
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

// A: an endpoint out only in dry run whose service fails poll_ready is still counted as one to
// fall back on; forcing out the other one leaves the balancer with nothing it can pick.
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

// A2: per-policy dry run. Policy 0 (dry run) shadow-ejects endpoint 0, whose service then fails
// poll_ready; the enforcing policy 1 then ejects endpoint 1 for real: the balancer is left with
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

fn host_of() -> tower_outlier::hosts::HostOf {
    tower_outlier::hosts::HostOf::new(|key: &usize| Some(format!("10.0.0.{key}")))
}

// B: a host held out by another service: a layer in dry run holds it out only as dry run; when
// its dry run is switched off, the endpoint should be held out for its host for real.
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

// B': released from a forced out while the host is held out elsewhere: it should be held out for
// its host again (an enforcing layer joining now holds it out).
#[tokio::test(start_paused = true)]
async fn release_ignores_a_host_held_out_elsewhere() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    payments.rules().force_out(&2usize);
    p.sync();
    assert!(!p.is_live(2));
    o.calls_while_live(2, 10, 0).await;
    assert!(!o.is_live(2));
    p.sync();
    payments.rules().release(&2usize);
    p.sync();
    p.advance(SECOND).await;
    assert!(
        !p.is_live(2),
        "released while its host is out elsewhere: back in the set; {:?}",
        payments.monitor().snapshot().get("2")
    );
}

fn two_policy_layer() -> OutlierDetectionLayer {
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

// D: a dry-run policy judging an endpoint during the trial after an enforcing policy's ejection
// reports a real (not dry-run) TrialFailed, and counts a failed check on the real episode.
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

// D': a policy in dry run changes what the enforcing policy does: compared with the same layer
// whose policy 0 is switched off, the real decisions differ.
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

// E: an endpoint whose own service fails poll_ready is forced out: removing it takes nothing the
// balancer can pick, yet it is kept in as "the last available endpoint".
#[tokio::test(start_paused = true)]
async fn an_unready_endpoint_forced_out_is_kept_in_as_the_last_available() {
    let layer = hsf_layer(0.5);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 2);
    h.backend(1).set_broken(true);
    h.poll_ready_all();
    assert_eq!(
        layer.monitor().snapshot().get("1").unwrap().status,
        EndpointStatus::Unready
    );
    rules.force_out(&1usize);
    h.sync();
    assert!(
        !h.is_live(1),
        "forced out, broken, and endpoint 0 serves: still in the set; {:?}",
        layer.monitor().snapshot().get("1").unwrap().refused
    );
}

// A3: layer-wide dry run. Endpoint 0 is out only in dry run and its service fails poll_ready;
// endpoint 2 is forced out; then endpoint 1's service fails too. Nothing in the set can be
// picked, and the forced-out endpoint 2 (healthy) is not brought back.
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

// A4: as A3, the last pickable endpoint removed by the upstream: the healthy forced-out endpoint
// is not brought back although nothing left in the set can be picked.
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

// F: layer-wide dry run with an error-rate policy (slot 0) and linkerd's breaker (slot 1). A
// failed probation probe shuts linkerd's gate ("every call held until the layer ejects the
// endpoint or refuses to"); if the error-rate policy judges at the same moment, dry run's
// ejection is the error-rate policy's, linkerd's gate is never told, and the endpoint, still in
// the balancer's set, holds every call until the shadow check: an ejection in all but name.
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

// G: the slow-call breaker in dry run, through p2c with 16 callers: the slow endpoint keeps
// serving; the longest stretch without a new call to it is measured.
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

// F-control: linkerd alone in dry run: a failed probe does not hold calls.
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

// H: every control change wakes the adaptor's task, and takes effect on the next poll.
#[tokio::test(start_paused = true)]
async fn every_control_change_wakes_the_adaptor() {
    let layer = two_policy_layer();
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(1, 10, 0).await;
    type Change = (&'static str, Box<dyn Fn()>);
    let changes: Vec<Change> = vec![
        (
            "dry on",
            Box::new({
                let r = rules.clone();
                move || r.set_dry_run(true)
            }),
        ),
        (
            "policy dry",
            Box::new({
                let r = rules.clone();
                move || r.set_policy_dry_run(1, true).unwrap()
            }),
        ),
        (
            "dry off",
            Box::new({
                let r = rules.clone();
                move || r.set_dry_run(false)
            }),
        ),
        (
            "force out",
            Box::new({
                let r = rules.clone();
                move || r.force_out(&3usize)
            }),
        ),
        (
            "force in",
            Box::new({
                let r = rules.clone();
                move || r.force_in(&3usize)
            }),
        ),
        (
            "release",
            Box::new({
                let r = rules.clone();
                move || r.release(&3usize)
            }),
        ),
        (
            "reset",
            Box::new({
                let r = rules.clone();
                move || r.reset_backoff(&1usize)
            }),
        ),
        (
            "force out unknown",
            Box::new({
                let r = rules.clone();
                move || r.force_out(&"nope")
            }),
        ),
        (
            "policy dry off",
            Box::new({
                let r = rules.clone();
                move || r.set_policy_dry_run(1, false).unwrap()
            }),
        ),
    ];
    for (name, change) in changes {
        h.sync();
        assert!(!h.task.is_woken(), "{name}: woken before");
        change();
        assert!(h.task.is_woken(), "{name}: the adaptor was not woken");
        h.sync();
    }
}

// H2: p2c picks up a force_out on its next poll_ready, and a release.
#[tokio::test(start_paused = true)]
async fn p2c_sees_force_out_and_release_on_its_next_poll() {
    use tower::{Service, ServiceExt};
    let layer = hsf_layer(0.2);
    let rules = layer.rules();
    let backends: Vec<support::Backend> = (0..3).map(support::Backend::new).collect();
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for (id, backend) in backends.iter().enumerate() {
        tx.unbounded_send(Ok::<_, std::convert::Infallible>(
            tower::discover::Change::Insert(id, backend.clone()),
        ))
        .unwrap();
    }
    let mut balance = tower::balance::p2c::Balance::new(tower::Layer::layer(&layer, rx));
    balance.ready().await.unwrap();
    assert_eq!(balance.len(), 3);
    // All three forced out: the last stays.
    for id in 0..3usize {
        rules.force_out(&id);
    }
    balance.ready().await.unwrap();
    assert_eq!(
        balance.len(),
        1,
        "forced out on the next poll, the last kept"
    );
    for _ in 0..50 {
        let _ = balance.ready().await.unwrap().call(()).await;
    }
    let served: Vec<usize> = backends.iter().map(|b| b.calls()).collect();
    assert_eq!(served.iter().filter(|&&c| c > 0).count(), 1, "{served:?}");
    for id in 0..3usize {
        rules.release(&id);
    }
    balance.ready().await.unwrap();
    assert_eq!(balance.len(), 3, "released on the next poll");
    // Dry run on with everything forced out: still never empty, and dry run off changes nothing.
    for id in 0..3usize {
        rules.force_out(&id);
    }
    rules.set_dry_run(true);
    balance.ready().await.unwrap();
    assert_eq!(balance.len(), 1);
    rules.set_dry_run(false);
    balance.ready().await.unwrap();
    assert_eq!(balance.len(), 1);
    drop(tx);
}

// I: forcing in an endpoint whose active probe is in flight leaves the probe running (it is not
// aborted, as a force-out or a budget re-admission aborts it).
#[tokio::test(start_paused = true)]
async fn force_in_does_not_abort_the_probe_in_flight() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower_outlier::probe::{probe_fn, ProbeFuture};
    let finished = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let (f, s) = (finished.clone(), started.clone());
    let layer = hsf_layer(0.4).probe(probe_fn(
        move |_: &usize, _: support::Backend| -> ProbeFuture {
            s.fetch_add(1, Ordering::SeqCst);
            let f = f.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                f.fetch_add(1, Ordering::SeqCst);
                false
            })
        },
    ));
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(1, 10, 0).await;
    assert!(!h.is_live(1));
    h.advance(5 * SECOND).await;
    assert_eq!(started.load(Ordering::SeqCst), 1);
    assert_eq!(
        layer.monitor().snapshot().get("1").unwrap().status,
        EndpointStatus::Probing
    );
    rules.force_in(&1usize);
    h.sync();
    assert!(h.is_live(1));
    h.advance(4 * SECOND).await;
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the abandoned probe ran to its end against the endpoint"
    );
}

// J: an endpoint forced in is ejected all the same when another service sharing its host holds
// the host out.
#[tokio::test(start_paused = true)]
async fn forced_in_is_ejected_for_its_host() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    payments.rules().force_in(&2usize);
    p.sync();
    o.calls_while_live(2, 10, 0).await;
    assert!(!o.is_live(2));
    p.sync();
    assert!(
        p.is_live(2),
        "forced in, yet ejected for its host: {:?}",
        payments
            .monitor()
            .snapshot()
            .get("2")
            .map(|e| (e.status, e.forced, e.last_reason.clone()))
    );
}

// K: a key forced out before it is discovered, on a host another service holds out: on insert
// it is ejected twice (by the operator, then for its host): the balancer gets Remove twice and
// the engine counts two ejections for one endpoint.
#[tokio::test(start_paused = true)]
async fn forced_out_key_joining_on_a_host_held_out_is_removed_twice() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.5).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 10);
    o.calls_while_live(9, 10, 0).await;
    assert!(!o.is_live(9));
    let mut p = Harness::new(&payments, 3);
    payments.rules().force_out(&9usize);
    p.sync();
    p.insert(9);
    p.sync();
    let of_nine: Vec<Seen> = p
        .seen
        .iter()
        .filter(|(_, s)| matches!(s, Seen::Insert(9) | Seen::Remove(9)))
        .map(|(_, s)| s.clone())
        .collect();
    let ejected = p.adaptor.ejected();
    assert!(
        of_nine == vec![Seen::Insert(9), Seen::Remove(9)] && ejected == 1,
        "balancer saw {of_nine:?}; engine counts {ejected} ejected for one endpoint out"
    );
}

// K2: the same in dry run: the operator's ejection is real (Remove), then the host's ejection
// turns it into dry run's: the engine believes it is in the balancer's set, which never gets it
// back; the real-ejection count leaks.
#[tokio::test(start_paused = true)]
async fn forced_out_key_joining_on_a_host_held_out_in_dry_run_is_lost() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.5).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 10);
    o.calls_while_live(9, 10, 0).await;
    let mut p = Harness::new(&payments, 3);
    payments.rules().set_dry_run(true);
    payments.rules().force_out(&9usize);
    p.sync();
    p.insert(9);
    p.sync();
    // Released: it should come back into the balancer's set.
    payments.rules().release(&9usize);
    p.sync();
    let nine = payments.monitor().snapshot().get("9").unwrap().clone();
    assert!(
        p.is_live(9),
        "released, never back in the set: status {:?} would_be {:?} forced {:?}; engine counts {} ejected; seen {:?}",
        nine.status,
        nine.would_be,
        nine.forced,
        p.adaptor.ejected(),
        p.seen.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>()
    );
}

// K3: the leaked count, then the upstream removes everything: does the engine underflow?
#[tokio::test(start_paused = true)]
async fn leaked_ejection_count_then_upstream_empties() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.5).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 10);
    o.calls_while_live(9, 10, 0).await;
    let mut p = Harness::new(&payments, 3);
    payments.rules().force_out(&9usize);
    p.sync();
    p.insert(9);
    p.sync();
    let ejected = p.adaptor.ejected();
    p.remove(9);
    p.sync();
    let after = p.adaptor.ejected();
    p.remove(0);
    p.sync();
    p.remove(1);
    p.sync();
    p.remove(2);
    p.sync();
    assert_eq!(
        (ejected, after),
        (1, 0),
        "ejection count after insert, after removal"
    );
}

// L: a back-off reset asked once is applied again by every adaptor made from the layer later
// (each starts with no reset applied): a new balancer's endpoint gets a reset and an Operator
// event nobody asked for.
#[tokio::test(start_paused = true)]
async fn a_reset_is_replayed_by_every_new_adaptor() {
    let layer = hsf_layer(0.4);
    let rules = layer.rules();
    let actions = Arc::new(Mutex::new(Vec::new()));
    let sink = actions.clone();
    let cb = layer.monitor().on_event(move |e| {
        if let Event::Operator { key, action } = e {
            sink.lock().unwrap().push(format!("{key} {action}"));
        }
    });
    let mut h = Harness::new(&layer, 3);
    rules.reset_backoff(&1usize);
    h.sync();
    drop(h);
    let _h2 = Harness::new(&layer, 3);
    let _h3 = Harness::new(&layer, 3);
    drop(cb);
    assert_eq!(
        *actions.lock().unwrap(),
        vec!["1 reset_backoff"],
        "replayed by new adaptors"
    );
}
