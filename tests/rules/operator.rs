//! What operators decide above the rules (`tower_outlier::controls`), on tokio's paused clock:
//! a dry run that ejects nothing and reports every decision the enforcing rules make, with the
//! same reasons at the same times; endpoints forced out and in; back-off resets; all of them
//! through a reconfiguration.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Harness, Seen};
use tower::discover::Change;
use tower::{Service, ServiceExt};
use tower_outlier::controls::Override;
use tower_outlier::events::{Event, Readmission, Refusal};
use tower_outlier::probe::PassiveTrial;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, ErrorRateConfig, ErrorRatePolicy,
    OutlierDetectionLayer,
};

const SECOND: Duration = Duration::from_secs(1);
const STEP: Duration = Duration::from_millis(100);

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

/// Every decision about an ejection the layer reports, as `(time since start, line)`; what dry
/// run reports is unwrapped and marked, so the two runs can be compared.
fn decisions(layer: &OutlierDetectionLayer) -> Arc<Mutex<Vec<(Duration, String)>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let start = tokio::time::Instant::now();
    let sink = seen.clone();
    let callback = layer.monitor().on_event(move |event| {
        let (dry, event) = match event {
            Event::DryRun(inner) => (true, &**inner),
            other => (false, other),
        };
        let line = match event {
            Event::Ejected {
                key,
                reason,
                next_check_in,
            } => format!(
                "{key} ejected: {} {:.2}, check in {next_check_in:?}",
                reason.measure, reason.value
            ),
            Event::EjectionRefused {
                key,
                reason,
                refusal,
            } => format!("{key} refused ({refusal:?}): {}", reason.measure),
            Event::Readmitted { key, cause, trial } => {
                format!("{key} re-admitted ({cause:?}), trial {trial:?}")
            }
            Event::Recovered { key } => format!("{key} recovered"),
            Event::TrialFailed { key, failed_checks } => {
                format!("{key} failed its trial ({failed_checks})")
            }
            Event::ProbeStarted { key } => format!("{key} probed"),
            Event::ProbeFailed { key, .. } => format!("{key} failed its probe"),
            _ => return,
        };
        let line = if dry { format!("dry: {line}") } else { line };
        sink.lock()
            .unwrap()
            .push((tokio::time::Instant::now() - start, line));
    });
    // Kept for the layer's life.
    std::mem::forget(callback);
    seen
}

/// Whether endpoint `id` fails at `t` in the scripted incident: #1 from 2 s to 30 s, #3 from 4 s
/// to 12 s, #4 from 6 s to 40 s.
fn broken(id: usize, t: Duration) -> bool {
    let (from, to) = match id {
        1 => (2, 30),
        3 => (4, 12),
        4 => (6, 40),
        _ => return false,
    };
    t >= from * SECOND && t < to * SECOND
}

/// Runs the incident for a minute: every 100 ms, one call to each endpoint the balancer holds.
async fn incident(h: &mut Harness<PassiveTrial>) {
    let start = tokio::time::Instant::now();
    while start.elapsed() < 60 * SECOND {
        let t = start.elapsed();
        for id in 0..5 {
            if h.is_live(id) {
                let failing = usize::from(broken(id, t));
                h.calls(id, failing, 1 - failing).await;
            }
        }
        h.advance(STEP).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_ejects_nothing_and_reports_every_decision_of_the_enforcing_run() {
    // Two of five may be out: the third outlier is refused, in both runs.
    let enforcing = hsf_layer(0.4);
    let enforced = decisions(&enforcing);
    let mut h = Harness::new(&enforcing, 5);
    incident(&mut h).await;
    let enforced = enforced.lock().unwrap().clone();
    let ejections = enforced
        .iter()
        .filter(|(_, l)| l.contains("ejected:"))
        .count();
    assert!(
        ejections >= 4 && enforced.iter().any(|(_, l)| l.contains("refused (Budget)")),
        "the incident must eject, re-eject after failed trials and refuse: {enforced:#?}"
    );
    assert!(!h.removals().is_empty());

    let dry = hsf_layer(0.4);
    dry.rules().set_dry_run(true);
    let reported = decisions(&dry);
    let mut h = Harness::new(&dry, 5);
    incident(&mut h).await;
    assert!(
        h.removals().is_empty(),
        "dry run took an endpoint out: {:?}",
        h.seen
    );
    assert_eq!(h.live_ids(), vec![0, 1, 2, 3, 4]);
    let reported = reported.lock().unwrap().clone();
    let unwrapped: Vec<(Duration, String)> = reported
        .iter()
        .map(|(at, line)| match line.strip_prefix("dry: ") {
            Some(line) => (*at, line.to_owned()),
            None => panic!("dry run reported a decision as enforced: {line}"),
        })
        .collect();
    assert_eq!(
        unwrapped, enforced,
        "dry run must report the enforcing run's decisions, at the same times"
    );
}

#[tokio::test(start_paused = true)]
async fn dry_run_shows_what_would_be_in_the_snapshot_and_metrics_of_the_monitor() {
    let layer = hsf_layer(0.4);
    let rules = layer.rules();
    rules.set_dry_run(true);
    let mut h = Harness::new(&layer, 5);
    h.calls(1, 10, 0).await;
    assert!(h.is_live(1), "nothing leaves the set in dry run");
    let snapshot = layer.monitor().snapshot();
    assert!(snapshot.dry_run);
    let one = snapshot.get("1").unwrap();
    assert_eq!(one.status, EndpointStatus::Available);
    assert_eq!(one.would_be, Some(EndpointStatus::Ejected));
    assert_eq!(one.next_check_in, Some(5 * SECOND));
    assert_eq!(one.last_reason.as_ref().unwrap().measure, "error rate");
    assert_eq!(snapshot.ejected(), 0);
    // The would-be ejection runs its course: re-admitted on trial, recovered.
    h.advance(5 * SECOND).await;
    let one = layer.monitor().snapshot().get("1").unwrap().clone();
    assert_eq!(one.would_be, Some(EndpointStatus::Trial));
    for _ in 0..20 {
        h.calls(1, 0, 2).await;
        h.advance(SECOND).await;
    }
    let one = layer.monitor().snapshot().get("1").unwrap().clone();
    assert_eq!(one.would_be, None, "recovered in dry run too");
}

#[tokio::test(start_paused = true)]
async fn dry_run_switched_on_returns_the_ejected_and_switched_off_forgets_what_it_would_eject() {
    let layer = hsf_layer(0.4);
    let rules = layer.rules();
    let events = layer.monitor().subscribe();
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(1, 10, 0).await;
    assert!(!h.is_live(1), "enforcing: ejected");
    rules.set_dry_run(true);
    h.sync();
    assert!(
        h.is_live(1),
        "dry run on: back in the balancer's set at once"
    );
    let one = layer.monitor().snapshot().get("1").unwrap().clone();
    assert_eq!(
        (one.status, one.would_be),
        (EndpointStatus::Available, Some(EndpointStatus::Ejected)),
        "the rest of its ejection is what dry run reports"
    );
    let mut events = events;
    let mut readmitted_for_dry_run = false;
    while let Ok(event) = events.try_recv() {
        if let Event::Readmitted {
            cause: Readmission::DryRun,
            ..
        } = event
        {
            readmitted_for_dry_run = true;
        }
    }
    assert!(readmitted_for_dry_run);
    // Another outlier in dry run: reported, kept in.
    h.calls(3, 10, 0).await;
    assert!(h.is_live(3));
    assert_eq!(
        layer.monitor().snapshot().get("3").unwrap().would_be,
        Some(EndpointStatus::Ejected)
    );
    // Off: what it would have ejected is forgotten, with the endpoints' histories...
    rules.set_dry_run(false);
    h.sync();
    assert_eq!(h.live_ids(), vec![0, 1, 2, 3, 4]);
    let snapshot = layer.monitor().snapshot();
    assert!(!snapshot.dry_run);
    assert_eq!(snapshot.get("3").unwrap().would_be, None);
    assert_eq!(snapshot.get("3").unwrap().windows[0].counts.calls, 0);
    // ...and the next failures eject for real.
    h.calls_while_live(3, 10, 0).await;
    assert!(!h.is_live(3));
}

#[tokio::test(start_paused = true)]
async fn a_policy_in_dry_run_never_keeps_an_enforcing_one_from_ejecting() {
    // Policy 0 (dry run) judges at 50 % over 5 calls; policy 1 (enforcing) at 90 % over 20.
    let strict = ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .min_calls(20)
            .error_rate_threshold(0.9)
            .max_ejection_ratio(0.4)
            .build()
            .unwrap(),
    );
    let layer = hsf_layer(0.4).with_policy(strict);
    let rules = layer.rules();
    rules.set_policy_dry_run(0, true).unwrap();
    assert!(rules.policy_dry_run(0) && !rules.policy_dry_run(1));
    let seen = decisions(&layer);
    let mut h = Harness::new(&layer, 5);
    h.calls(2, 5, 0).await;
    assert!(h.is_live(2), "only the dry-run policy judged it");
    assert_eq!(
        layer.monitor().snapshot().get("2").unwrap().would_be,
        Some(EndpointStatus::Ejected)
    );
    h.calls(2, 15, 0).await;
    assert!(!h.is_live(2), "the enforcing policy ejects it all the same");
    let seen = seen.lock().unwrap().clone();
    let lines: Vec<&str> = seen.iter().map(|(_, l)| l.as_str()).collect();
    assert!(lines[0].starts_with("dry: 2 ejected"), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.starts_with("2 ejected")),
        "{lines:?}"
    );
    let snapshot = layer.monitor().snapshot();
    assert_eq!(snapshot.dry_run_policies, vec!["error-rate"]);
    let two = snapshot.get("2").unwrap();
    assert_eq!((two.status, two.would_be), (EndpointStatus::Ejected, None));
}

#[tokio::test(start_paused = true)]
async fn dry_run_through_p2c_keeps_sending_to_the_failing_endpoint() {
    let layer = hsf_layer(0.4);
    layer.rules().set_dry_run(true);
    let would_eject = Arc::new(Mutex::new(0usize));
    let count = would_eject.clone();
    let _callback = layer.monitor().on_event(move |event| {
        if let Event::DryRun(inner) = event {
            if matches!(**inner, Event::Ejected { .. }) {
                *count.lock().unwrap() += 1;
            }
        }
    });
    let backends: Vec<support::Backend> = (0..3).map(support::Backend::new).collect();
    backends[0].set_failing(true);
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for (id, backend) in backends.iter().enumerate() {
        tx.unbounded_send(Ok::<_, std::convert::Infallible>(Change::Insert(
            id,
            backend.clone(),
        )))
        .unwrap();
    }
    let mut balance = tower::balance::p2c::Balance::new(tower::Layer::layer(&layer, rx));
    let mut fewest = usize::MAX;
    for _ in 0..60 {
        for _ in 0..30 {
            let _ = balance.ready().await.unwrap().call(()).await;
            fewest = fewest.min(balance.len());
        }
        tokio::time::advance(SECOND).await;
    }
    assert!(
        *would_eject.lock().unwrap() >= 1,
        "dry run reported nothing"
    );
    assert_eq!(fewest, 3, "the balancer lost an endpoint in dry run");
    // It served calls through the minute, as much as p2c's cost of its failures lets it.
    assert!(backends[0].calls() > 0);
    assert_eq!(layer.monitor().snapshot().ejected(), 0);
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_forced_out_stays_out_until_released_and_counts_in_the_budget() {
    // One of five may be out.
    let layer = hsf_layer(0.2);
    let rules = layer.rules();
    let events = layer.monitor().subscribe();
    let mut h = Harness::new(&layer, 5);
    rules.force_out(&2usize);
    h.sync();
    assert!(!h.is_live(2));
    let two = layer.monitor().snapshot().get("2").unwrap().clone();
    assert_eq!(
        (two.status, two.forced, two.next_check_in),
        (EndpointStatus::Ejected, Some(Override::ForcedOut), None)
    );
    h.advance(600 * SECOND).await;
    assert!(
        !h.is_live(2),
        "no recovery check for an endpoint forced out"
    );
    // The budget is spent by it: a policy's outlier is refused.
    h.calls(0, 10, 0).await;
    assert!(h.is_live(0));
    assert!(layer
        .monitor()
        .snapshot()
        .get("0")
        .unwrap()
        .refused
        .as_deref()
        .is_some_and(|why| why.contains("budget")));
    // Released: back at once, and the refused outlier takes the budget it frees.
    rules.release(&2usize);
    h.sync();
    assert!(h.is_live(2));
    assert!(
        !h.is_live(0),
        "the refused ejection goes through once there is room"
    );
    let two = layer.monitor().snapshot().get("2").unwrap().clone();
    assert_eq!((two.status, two.forced), (EndpointStatus::Available, None));
    let mut events = events;
    let mut actions = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let Event::Operator { key, action } = event {
            actions.push(format!("{key} {action}"));
        }
    }
    assert_eq!(actions, vec!["2 force_out", "2 release"]);
}

#[tokio::test(start_paused = true)]
async fn forcing_out_never_takes_the_last_endpoint_the_balancer_can_pick() {
    let layer = hsf_layer(0.2);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 2);
    rules.force_out(&0usize);
    rules.force_out(&1usize);
    h.sync();
    assert_eq!(
        h.live_ids(),
        vec![1],
        "the first forced out goes, the last stays"
    );
    let one = layer.monitor().snapshot().get("1").unwrap().clone();
    assert_eq!(one.forced, Some(Override::ForcedOut));
    assert_eq!(
        one.refused.as_deref(),
        Some("forced out by an operator, kept in: last available endpoint")
    );
    // Another endpoint to fall back on: the one held in goes out.
    rules.release(&0usize);
    h.sync();
    assert_eq!(h.live_ids(), vec![0]);
    // A key forced out before it is discovered is out from its first poll.
    rules.force_out(&7usize);
    h.insert(7);
    h.insert(8);
    h.sync();
    assert_eq!(h.live_ids(), vec![0, 8]);
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_forced_in_comes_back_at_once_and_is_never_ejected_until_released() {
    let layer = hsf_layer(0.4);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(1, 10, 0).await;
    assert!(!h.is_live(1));
    rules.force_in(&1usize);
    h.sync();
    assert!(h.is_live(1), "forced in: back at once");
    let one = layer.monitor().snapshot().get("1").unwrap().clone();
    assert_eq!(
        (one.status, one.forced),
        (EndpointStatus::Available, Some(Override::ForcedIn))
    );
    let refused = Arc::new(Mutex::new(Vec::new()));
    let sink = refused.clone();
    let _callback = layer.monitor().on_event(move |event| {
        if let Event::EjectionRefused { refusal, .. } = event {
            sink.lock().unwrap().push(*refusal);
        }
    });
    h.calls(1, 30, 0).await;
    assert!(h.is_live(1), "exempt from ejection");
    assert_eq!(*refused.lock().unwrap(), vec![Refusal::ForcedIn]);
    assert_eq!(
        layer
            .monitor()
            .snapshot()
            .get("1")
            .unwrap()
            .refused
            .as_deref(),
        Some("forced in by an operator")
    );
    rules.release(&1usize);
    h.sync();
    h.calls_while_live(1, 10, 0).await;
    assert!(!h.is_live(1), "released: judged by the rules again");
}

fn envoy_layer() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::envoy()
            .max_ejection_percent(50)
            .build()
            .unwrap(),
        7,
    ))
}

#[tokio::test(start_paused = true)]
async fn a_reset_back_off_makes_the_next_ejection_last_the_base_time() {
    let layer = envoy_layer();
    let rules = layer.rules();
    let next = |layer: &OutlierDetectionLayer| {
        layer
            .monitor()
            .snapshot()
            .get("0")
            .unwrap()
            .next_check_in
            .unwrap()
    };
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 5, 0).await;
    assert_eq!(next(&layer), 30 * SECOND);
    h.advance(30 * SECOND).await;
    h.calls(0, 5, 0).await;
    assert_eq!(
        next(&layer),
        60 * SECOND,
        "Envoy's multiplier: twice the base"
    );
    h.advance(60 * SECOND).await;
    assert!(h.is_live(0));
    rules.reset_backoff(&0usize);
    h.sync();
    h.calls(0, 5, 0).await;
    assert_eq!(next(&layer), 30 * SECOND, "reset: the base time again");
}

#[tokio::test(start_paused = true)]
async fn overrides_and_resets_hold_through_a_reconfiguration() {
    let layer = hsf_layer(0.4);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    rules.force_out(&2usize);
    rules.force_in(&3usize);
    h.sync();
    assert!(!h.is_live(2));
    // New rules that eject at a lower error rate: the overrides stay as they were.
    rules
        .replace(
            0,
            ErrorRatePolicy::new(
                ErrorRateConfig::hsf()
                    .window(Duration::from_secs(2))
                    .min_calls(5)
                    .error_rate_threshold(0.2)
                    .recovery_unit(Duration::from_secs(5))
                    .max_ejection_ratio(0.4)
                    .build()
                    .unwrap(),
            ),
        )
        .unwrap();
    h.sync();
    assert!(!h.is_live(2), "still forced out under the new rules");
    h.advance(600 * SECOND).await;
    assert!(!h.is_live(2));
    h.calls(3, 10, 0).await;
    assert!(h.is_live(3), "still forced in under the new rules");
    let snapshot = layer.monitor().snapshot();
    assert_eq!(snapshot.get("2").unwrap().forced, Some(Override::ForcedOut));
    assert_eq!(snapshot.get("3").unwrap().forced, Some(Override::ForcedIn));
    // A failed recovery check counts, and a reset after the reconfiguration clears it.
    h.calls_while_live(1, 10, 0).await;
    assert!(!h.is_live(1));
    h.advance(5 * SECOND).await;
    h.calls_while_live(1, 10, 0).await;
    assert_eq!(
        layer.monitor().snapshot().get("1").unwrap().failed_checks,
        1,
        "failed its trial once"
    );
    rules.reset_backoff(&1usize);
    h.sync();
    assert_eq!(
        layer.monitor().snapshot().get("1").unwrap().failed_checks,
        0
    );
    let last_of_two = h
        .seen
        .iter()
        .rev()
        .find(|(_, s)| matches!(s, Seen::Insert(2) | Seen::Remove(2)))
        .map(|(_, s)| s.clone());
    assert_eq!(last_of_two, Some(Seen::Remove(2)), "never back in the set");
}

/// A snapshot of a fleet read in many batches (1 024 endpoints per hold of the monitor's lock)
/// puts every entry under its own key, in the keys' order: the endpoints forced out, scattered
/// over the batches, and only they, show as ejected.
#[tokio::test(start_paused = true)]
async fn a_large_snapshot_shows_each_endpoint_under_its_own_key_in_order() {
    const FLEET: usize = 25_000;
    let layer = hsf_layer(0.5);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, FLEET);
    let forced = [3usize, 4_999, 12_500, 12_501, 20_000, 24_999];
    for key in forced {
        rules.force_out(&key);
    }
    h.sync();
    let snapshot = layer.monitor().snapshot();
    assert_eq!(snapshot.endpoints.len(), FLEET);
    assert!(snapshot
        .endpoints
        .windows(2)
        .all(|pair| pair[0].key.as_str() < pair[1].key.as_str()));
    for endpoint in &snapshot.endpoints {
        let key: usize = *endpoint.key.downcast_ref().unwrap();
        assert_eq!(endpoint.key.as_str(), key.to_string());
        let out = forced.contains(&key);
        assert_eq!(
            (
                endpoint.status == EndpointStatus::Ejected,
                endpoint.forced.is_some()
            ),
            (out, out),
            "{key}"
        );
    }
}

/// Snapshots taken on another thread while the upstream removes and adds endpoints (the monitor
/// reads each adaptor's list a batch at a time, going on from the last id read): every snapshot
/// lists each endpoint once, and every endpoint that stayed throughout.
#[tokio::test]
async fn snapshots_taken_while_the_upstream_churns_list_each_endpoint_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const FLEET: usize = 5_000;
    const STABLE: usize = FLEET / 2;
    let layer = hsf_layer(0.5);
    let mut h = Harness::new(&layer, FLEET);
    let monitor = layer.monitor();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut taken = 0;
            while !stop.load(Ordering::Relaxed) || taken == 0 {
                let snapshot = monitor.snapshot();
                let keys: Vec<usize> = snapshot
                    .endpoints
                    .iter()
                    .map(|e| *e.key.downcast_ref::<usize>().unwrap())
                    .collect();
                let unique: std::collections::HashSet<usize> = keys.iter().copied().collect();
                assert_eq!(unique.len(), keys.len(), "an endpoint listed twice");
                assert!(
                    (0..STABLE).all(|key| unique.contains(&key)),
                    "an endpoint that stayed is missing"
                );
                taken += 1;
            }
            taken
        }
    });
    // Removes from the churned half and adds new keys past the fleet, a few each round.
    let mut next = FLEET;
    for round in 0..300 {
        for k in 0..8 {
            h.remove(STABLE + (round * 8 + k) % (FLEET - STABLE));
            h.insert(next);
            next += 1;
        }
        h.sync();
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Relaxed);
    let taken = reader.join().expect("no snapshot failed its checks");
    assert!(taken > 0);
    assert_eq!(
        monitor_len(&layer),
        h.live_ids().len(),
        "the monitor tracks what the balancer holds"
    );
}

fn monitor_len(layer: &OutlierDetectionLayer) -> usize {
    layer.monitor().tracked()
}
