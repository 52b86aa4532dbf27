//! Checks of endpoints in service that get no traffic (`ProbeCadence::no_traffic_interval`, with
//! `unhealthy_threshold`), on tokio's paused clock: through a real p2c `Balance`, a server that
//! dies while its service is quiet is out before the first call after the quiet, at the check
//! the threshold says, and back once it answers; and across the modes the checks meet — the
//! budget and the last endpoint (fail-fast and panic included), dry run, operator overrides,
//! traffic that resumes, upstream churn with a check in flight, probes that panic or hang, a
//! probe that sends no checks, reconfiguration.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::balance::p2c::Balance;
use tower::{Service, ServiceExt};
use tower_outlier::events::{Event, ACTIVE_CHECK_POLICY};
use tower_outlier::probe::{probe_fn, PassiveTrial, Probe, ProbeCadence, ProbeFuture};
use tower_outlier::{
    EndpointStatus, ErrorRateConfig, ErrorRatePolicy, Monitor, OutlierDetectionLayer, WhenAllOut,
};

use crate::support::{announce, ejected, Backend, Harness, SeededRng};

pub(super) const S: Duration = Duration::from_secs(1);

pub(super) fn edas(max_ratio: f64) -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud()
            .recovery_unit(Duration::from_secs(10))
            .max_ejection_ratio(max_ratio)
            .build()
            .unwrap(),
    ))
}

/// A probe that calls the backend itself (its `()` request), counting the checks.
#[derive(Clone, Default)]
struct Calls {
    checks: Arc<AtomicUsize>,
}

impl Calls {
    fn probe(&self) -> impl Probe<usize, Backend> + Clone {
        let checks = self.checks.clone();
        probe_fn(move |_: &usize, backend: Backend| -> ProbeFuture {
            checks.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { backend.oneshot(()).await.is_ok() })
        })
    }

    fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }
}

/// A cadence checking idle endpoints every 5 s, without jitter, taken out at `threshold`.
pub(super) fn idle(threshold: u32) -> ProbeCadence {
    ProbeCadence::new()
        .no_traffic_interval(5 * S)
        .unhealthy_threshold(threshold)
        .interval_jitter_percent(0)
}

/// Runs the harness for `span`, 100 ms at a time (timers fire when due, probes answer).
pub(super) async fn run<P: Probe<usize, Backend> + Clone>(h: &mut Harness<P>, span: Duration) {
    let step = Duration::from_millis(100);
    let mut left = span;
    while !left.is_zero() {
        let by = left.min(step);
        h.advance(by).await;
        tokio::task::yield_now().await;
        h.sync();
        left -= by;
    }
}

fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get(&key.to_string()).unwrap().status
}

/// When each endpoint was ejected, from the events.
fn ejections(events: &Mutex<Vec<(Instant, Event)>>) -> Vec<(Instant, String, &'static str)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(at, event)| match event {
            Event::Ejected { key, reason, .. } => Some((*at, key.to_string(), reason.policy)),
            _ => None,
        })
        .collect()
}

/// Five backends through p2c; 2 s of serial calls; backend 3 dies as the service goes quiet for
/// 60 s, in which the balancer is polled every 100 ms (`polled`: a caller waiting in `ready`) or
/// never (behind `Buffer`); then 200 serial calls. Returns the failed calls after the quiet, when backend 3 was
/// taken out (from the quiet's start), and whether it was out when the calls resumed.
async fn quiet_night(
    threshold: Option<u32>,
    polled: bool,
) -> (usize, Option<Duration>, EndpointStatus) {
    let backends: Vec<Backend> = (0..5).map(Backend::new).collect();
    let calls = Calls::default();
    let mut layer = edas(0.4).probe(calls.probe());
    if let Some(threshold) = threshold {
        layer = layer.probe_cadence(idle(threshold));
    }
    let monitor = layer.monitor();
    let events: Arc<Mutex<Vec<(Instant, Event)>>> = Arc::default();
    let sink = events.clone();
    let _callback =
        monitor.on_event(move |e| sink.lock().unwrap().push((Instant::now(), e.clone())));
    let upstream = announce(
        &backends
            .iter()
            .map(|b| (b.id, b.clone()))
            .collect::<Vec<_>>(),
    );
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, upstream), SeededRng(11));
    let until = Instant::now() + 2 * S;
    while Instant::now() < until {
        balancer.ready().await.unwrap().call(()).await.unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    let quiet = Instant::now();
    backends[3].set_failing(true);
    if polled {
        for _ in 0..600 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
        }
    } else {
        // Nothing polls the balancer while the service is quiet: the checks run in their own
        // task, and the ejection is made when the first call polls it.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
    }
    let out = status(&monitor, 3);
    let mut failed = 0;
    for _ in 0..200 {
        if balancer.ready().await.unwrap().call(()).await.is_err() {
            failed += 1;
        }
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    let taken_out = ejections(&events)
        .into_iter()
        .find(|(_, key, _)| key == "3")
        .map(|(at, _, policy)| {
            assert_eq!(
                threshold.is_some(),
                policy == ACTIVE_CHECK_POLICY,
                "{policy}"
            );
            at.duration_since(quiet)
        });
    (failed, taken_out, out)
}

/// The knob: without `no_traffic_interval` the first calls after the quiet find the dead server
/// (the rules need failures to judge it); with it, none does — whether or not anything polled the
/// balancer in the quiet — and, polled, it went out at its second failed check, 10 s in.
#[tokio::test(start_paused = true)]
async fn a_server_that_died_while_the_service_was_quiet_is_out_before_the_first_call() {
    let (failed, taken_out, out) = quiet_night(None, false).await;
    assert!(
        failed > 0,
        "without checks of idle endpoints: {failed} failed"
    );
    assert_eq!(out, EndpointStatus::Available);
    assert!(
        taken_out.unwrap() > 60 * S,
        "by the rules, after the calls resumed"
    );

    let (failed, taken_out, out) = quiet_night(Some(2), false).await;
    assert_eq!(
        failed, 0,
        "no call reaches the server that died in the quiet"
    );
    assert_eq!(out, EndpointStatus::Ejected);
    assert!(
        taken_out.unwrap() >= 60 * S,
        "made as the first call polls the balancer"
    );

    let (failed, taken_out, _) = quiet_night(Some(2), true).await;
    assert_eq!(failed, 0);
    let at = taken_out.expect("taken out by its checks");
    assert!(
        at.abs_diff(10 * S) <= Duration::from_millis(150),
        "out {at:?} into the quiet, not at the second check (10 s)"
    );
}

/// `unhealthy_threshold`: with 3, two failed checks keep the endpoint in; the third takes it out
/// (15 s into the quiet, not 10).
#[tokio::test(start_paused = true)]
async fn it_takes_the_unhealthy_threshold_of_failed_checks_in_a_row() {
    let (failed, taken_out, _) = quiet_night(Some(3), true).await;
    assert_eq!(failed, 0);
    let at = taken_out.expect("taken out by its checks");
    assert!(
        at.abs_diff(15 * S) <= Duration::from_millis(150),
        "out {at:?} into the quiet, not at the third check (15 s)"
    );
}

/// Taken out by its checks, it comes back at the first check that passes after it heals (2 s
/// apart by default), and gets calls again.
#[tokio::test(start_paused = true)]
async fn it_comes_back_once_it_answers_its_checks() {
    let calls = Calls::default();
    let layer = edas(0.4).probe(calls.probe()).probe_cadence(idle(2));
    let mut h = Harness::new(&layer, 5);
    h.backend(2).set_failing(true);
    run(&mut h, 11 * S).await;
    assert_eq!(ejected(&layer.monitor()), ["2"]);
    assert!(!h.is_live(2));
    // Envoy's `/clusters` flags it as failing active health checks, not outlier detection.
    let admin = tower_outlier::admin::Admin::builder(&layer.monitor()).build();
    let response = admin
        .oneshot(
            http::Request::get("/clusters?format=json")
                .body(())
                .unwrap(),
        )
        .await
        .unwrap();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let hosts = json["cluster_statuses"][0]["host_statuses"]
        .as_array()
        .unwrap();
    let flags: Vec<&serde_json::Value> = hosts.iter().map(|h| &h["health_status"]).collect();
    let out: Vec<_> = flags
        .iter()
        .filter(|f| f.get("failed_active_health_check").is_some())
        .collect();
    assert_eq!(out.len(), 1, "{json}");
    assert!(out[0].get("failed_outlier_check").is_none(), "{json}");
    run(&mut h, 5 * S).await;
    assert!(!h.is_live(2), "still failing its checks");
    h.backend(2).set_failing(false);
    run(&mut h, 3 * S).await;
    assert!(h.is_live(2), "back once it answers: {:?}", h.seen);
    let reason = layer.monitor().snapshot().get("2").unwrap().clone();
    assert_eq!(reason.status, EndpointStatus::Available, "{reason:#?}");
    // Back in service, idle again: checked again, and it passes.
    let before = calls.checks();
    run(&mut h, 11 * S).await;
    assert!(calls.checks() >= before + 2);
    assert!(h.is_live(2));
}

/// The budget and the last endpoint: a whole quiet fleet dead, the checks take out as many as
/// the budget allows and never the last one — under fail-fast and panic too (a check is no
/// judgement of the rules); healed, all come back.
#[tokio::test(start_paused = true)]
async fn a_dead_quiet_fleet_keeps_one_and_the_budget_holds() {
    for (max_ratio, all_out, most) in [
        (0.4, WhenAllOut::KeepLast, 2),
        (1.0, WhenAllOut::KeepLast, 4),
        (1.0, WhenAllOut::FailFast, 4),
        (1.0, WhenAllOut::panic_below(0.5).unwrap(), 4),
    ] {
        let calls = Calls::default();
        let layer = edas(max_ratio)
            .when_all_out(all_out)
            .probe(calls.probe())
            .probe_cadence(idle(1));
        let mut h = Harness::new(&layer, 5);
        for id in 0..5 {
            h.backend(id).set_failing(true);
        }
        for _ in 0..12 {
            run(&mut h, 5 * S).await;
            let out = ejected(&layer.monitor()).len();
            assert!(out <= most, "{all_out:?}: {out} out");
            assert!(
                !h.live_ids().is_empty(),
                "{all_out:?}: the balancer has none"
            );
        }
        assert_eq!(ejected(&layer.monitor()).len(), most, "{all_out:?}");
        for id in 0..5 {
            h.backend(id).set_failing(false);
        }
        run(&mut h, 10 * S).await;
        assert!(ejected(&layer.monitor()).is_empty(), "{all_out:?}");
        assert_eq!(h.live_ids().len(), 5, "{all_out:?}");
    }
}

/// Dry run: the checks report what they would do and the endpoint stays in the balancer's set;
/// switched off, the endpoint still failing goes out after the threshold of checks anew (a mode
/// switch forgets what dry run held, as it does for the rules).
#[tokio::test(start_paused = true)]
async fn dry_run_only_reports() {
    let calls = Calls::default();
    let layer = edas(0.4).probe(calls.probe()).probe_cadence(idle(2));
    layer.rules().set_dry_run(true);
    let mut h = Harness::new(&layer, 5);
    h.backend(1).set_failing(true);
    run(&mut h, 11 * S).await;
    let shown = layer.monitor().snapshot().get("1").unwrap().clone();
    assert_eq!(shown.would_be, Some(EndpointStatus::Ejected), "{shown:#?}");
    assert!(h.is_live(1), "dry run changes no routing");
    layer.rules().set_dry_run(false);
    run(&mut h, 11 * S).await;
    assert!(!h.is_live(1), "{:#?}", layer.monitor().snapshot().get("1"));
    h.backend(1).set_failing(false);
    run(&mut h, 3 * S).await;
    assert!(h.is_live(1));
}

/// Operator overrides: forced in, failing checks never take it out; released, they do; forced
/// out and released, a healthy idle endpoint stays in.
#[tokio::test(start_paused = true)]
async fn overrides_win() {
    let calls = Calls::default();
    let layer = edas(0.4).probe(calls.probe()).probe_cadence(idle(2));
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    rules.force_in(&0usize);
    h.backend(0).set_failing(true);
    run(&mut h, 21 * S).await;
    assert!(h.is_live(0), "forced in");
    assert!(
        calls.checks() >= 4,
        "it is still checked: {}",
        calls.checks()
    );
    rules.release(&0usize);
    run(&mut h, 6 * S).await;
    assert!(!h.is_live(0), "released while its checks fail");
    rules.force_out(&4usize);
    run(&mut h, S).await;
    assert!(!h.is_live(4));
    rules.release(&4usize);
    run(&mut h, 12 * S).await;
    assert!(h.is_live(4), "a healthy idle endpoint released stays in");
}

/// Traffic resumes: a call completed clears the failed checks (its calls judge it from then on),
/// so one more failed check after the next quiet does not reach a threshold of 2.
#[tokio::test(start_paused = true)]
async fn a_call_clears_the_count() {
    let calls = Calls::default();
    let layer = edas(0.4).probe(calls.probe()).probe_cadence(idle(2));
    let mut h = Harness::new(&layer, 5);
    h.backend(3).set_failing(true);
    run(&mut h, 6 * S).await; // one failed check at 5 s
    h.backend(3).set_failing(false);
    h.calls(3, 0, 1).await; // a call answers
    run(&mut h, S).await;
    h.backend(3).set_failing(true);
    run(&mut h, 7 * S).await; // the next check (5 s after the call... ) fails once more
    assert!(h.is_live(3), "{:#?}", layer.monitor().snapshot().get("3"));
    run(&mut h, 5 * S).await; // and the one after: two in a row
    assert!(!h.is_live(3));
}

/// Churn: an endpoint removed while its check hangs is forgotten (the check given up); inserted
/// again under its key, it starts with no failed check.
#[tokio::test(start_paused = true)]
async fn churn_with_a_check_in_flight() {
    let hang = Arc::new(AtomicUsize::new(0));
    let seen = hang.clone();
    let probe = probe_fn(move |key: &usize, backend: Backend| -> ProbeFuture {
        let hangs = *key == 2 && seen.load(Ordering::SeqCst) == 1;
        Box::pin(async move {
            if hangs {
                std::future::pending::<()>().await;
            }
            backend.oneshot(()).await.is_ok()
        })
    });
    let layer = edas(0.4)
        .probe(probe)
        .probe_cadence(idle(2).timeout(Duration::from_secs(60)));
    let mut h = Harness::new(&layer, 5);
    h.backend(2).set_failing(true);
    run(&mut h, 6 * S).await; // one failed check
    hang.store(1, Ordering::SeqCst);
    run(&mut h, 5 * S).await; // its second check hangs
    assert!(h.is_live(2));
    h.remove(2);
    h.sync();
    h.insert(2);
    hang.store(0, Ordering::SeqCst);
    run(&mut h, 6 * S).await; // the new one's first failed check
    assert!(
        h.is_live(2),
        "a fresh count: {:#?}",
        layer.monitor().snapshot().get("2")
    );
    run(&mut h, 5 * S).await;
    assert!(!h.is_live(2));
}

/// A probe that panics or hangs past the timeout is a failed check: the layer goes on.
#[tokio::test(start_paused = true)]
async fn panicking_and_hanging_checks_fail() {
    for hangs in [false, true] {
        let probe = probe_fn(move |key: &usize, backend: Backend| -> ProbeFuture {
            let bad = *key == 1;
            Box::pin(async move {
                if bad && hangs {
                    std::future::pending::<()>().await;
                }
                assert!(!bad, "the user's probe panics");
                backend.oneshot(()).await.is_ok()
            })
        });
        let layer = edas(0.4).probe(probe).probe_cadence(idle(2).timeout(S));
        let mut h = Harness::new(&layer, 5);
        run(&mut h, 12 * S).await;
        assert!(!h.is_live(1), "hangs {hangs}");
        assert_eq!(h.live_ids().len(), 4);
    }
}

/// A probe that sends no checks (a passive trial) checks nothing: no endpoint goes out for want
/// of traffic.
#[tokio::test(start_paused = true)]
async fn no_checks_without_a_probe_that_sends_them() {
    let layer = edas(0.4).probe(PassiveTrial).probe_cadence(idle(1));
    let mut h = Harness::new(&layer, 5);
    h.backend(0).set_failing(true);
    run(&mut h, 60 * S).await;
    assert_eq!(h.live_ids().len(), 5);
    assert_eq!(h.backend(0).calls(), 0);
}

/// New rules in the middle: the count and the checks go on (the cadence is the layer's, not the
/// rules').
#[tokio::test(start_paused = true)]
async fn reconfiguration_keeps_the_count() {
    let calls = Calls::default();
    let layer = edas(0.4).probe(calls.probe()).probe_cadence(idle(2));
    let mut h = Harness::new(&layer, 5);
    h.backend(4).set_failing(true);
    run(&mut h, 6 * S).await;
    layer
        .rules()
        .replace(
            0,
            ErrorRatePolicy::new(
                ErrorRateConfig::edas_spring_cloud()
                    .recovery_unit(Duration::from_secs(20))
                    .max_ejection_ratio(0.4)
                    .build()
                    .unwrap(),
            ),
        )
        .unwrap();
    run(&mut h, 5 * S).await;
    assert!(
        !h.is_live(4),
        "{:#?} {:?}",
        layer.monitor().snapshot().get("4"),
        h.seen
    );
}

/// An idle fleet of 1000 healthy endpoints: checks are spread and bounded (a tenth at a time),
/// none goes out.
#[tokio::test(start_paused = true)]
async fn a_large_idle_fleet() {
    let calls = Calls::default();
    let layer = edas(0.4)
        .probe(calls.probe())
        .probe_cadence(ProbeCadence::new().no_traffic_interval(5 * S));
    let mut h = Harness::new(&layer, 1000);
    run(&mut h, 31 * S).await;
    assert_eq!(h.live_ids().len(), 1000);
    let checks = calls.checks();
    // Six rounds of 1000 at most (the default jitter spreads them).
    assert!((4000..=6000).contains(&checks), "{checks} checks");
}

/// A large quiet fleet dead at once: every endpoint flagged together, the budget's worth taken
/// out (in discovery order), the rest kept in; the balancer keeps half.
#[tokio::test(start_paused = true)]
async fn a_large_dead_idle_fleet() {
    let calls = Calls::default();
    let layer = edas(0.5).probe(calls.probe()).probe_cadence(idle(1));
    let mut h = Harness::new(&layer, 5000);
    for id in 0..5000 {
        h.backend(id).set_failing(true);
    }
    // A tenth of the fleet checked at a time: all checked within two intervals.
    run(&mut h, 12 * S).await;
    assert_eq!(h.live_ids().len(), 2500);
    assert_eq!(h.live_ids()[0], 2500, "the first discovered go out first");
}
