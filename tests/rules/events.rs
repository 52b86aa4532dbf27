//! The layer's decisions as typed events (`Monitor::subscribe`, `Monitor::on_event`), on tokio's
//! paused clock: a scripted incident arrives whole and in order.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::Harness;
use tower_outlier::dialect::Hsf;
use tower_outlier::events::{Event, Readmission, Refusal};
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

/// Each event as one line: what happened to which key.
fn line(event: &Event) -> String {
    match event {
        Event::Ejected {
            key,
            reason,
            next_check_in,
        } => format!(
            "{key} ejected by {} ({} {:.2}), check in {next_check_in:?}",
            reason.policy, reason.measure, reason.value
        ),
        Event::EjectionRefused {
            key,
            refusal,
            reason,
        } => format!("{key} kept in ({refusal:?}): {}", reason.measure),
        Event::Readmitted { key, cause, trial } => {
            format!("{key} re-admitted ({cause:?}), trial {trial:?}")
        }
        Event::Recovered { key } => format!("{key} recovered"),
        Event::TrialFailed { key, failed_checks } => {
            format!("{key} failed its trial ({failed_checks})")
        }
        Event::ProbeStarted { key } => format!("{key} probed"),
        Event::ProbeFailed { key, .. } => format!("{key} failed its probe"),
        Event::WeightChanged { key, from, to } => format!("{key} weight {from} -> {to}"),
        Event::RulesApplied { version } => format!("rules {version} applied"),
        Event::RulesRejected { .. } => "rules rejected".to_string(),
        Event::PolicyStateChanged {
            key,
            policy,
            from,
            to,
        } => format!("{key} {policy} {from:?} -> {to:?}"),
        other => format!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_receives_every_event_of_an_incident_in_order() {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .recovery_unit(Duration::from_secs(60))
            .max_ejection_ratio(0.25)
            .build()
            .unwrap(),
    ));
    let monitor = layer.monitor();
    let mut events = monitor.subscribe();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = seen.clone();
    monitor.on_event(move |event| sink.lock().unwrap().push(line(event)));
    let mut h = Harness::new(&layer, 4);

    // #0 fails: ejected. #1 fails too: the budget (one of four) keeps it in.
    h.calls(0, 10, 0).await;
    h.calls(1, 10, 0).await;
    // #0's check: back on trial; it fails again during the trial.
    h.advance(Duration::from_secs(60)).await;
    h.calls(0, 10, 0).await;
    // Its second check, two units later: back, healthy, recovered after a trial period with
    // enough calls in its window. (#1's refused judgement has long left its window.)
    h.advance(Duration::from_secs(120)).await;
    h.advance(Duration::from_secs(9)).await;
    h.calls(0, 0, 10).await;
    h.advance(Duration::from_secs(1)).await;
    // New rules, one refused, one applied.
    let rules = layer.rules();
    let hsf = Hsf::service("svc:1.0");
    assert!(rules
        .apply(&hsf, r#"{"DEFAULT": {"maxIsolationRate": 2}}"#)
        .is_err());
    rules
        .apply(&hsf, r#"{"DEFAULT": {"maxIsolationRate": 0.5}}"#)
        .unwrap();
    h.sync();

    let expected = vec![
        "0 ejected by error-rate (error rate 1.00), check in Some(60s)",
        "1 kept in (Budget): error rate",
        "0 re-admitted (PassiveTrial), trial Some(10s)",
        "0 failed its trial (1)",
        "0 ejected by error-rate (error rate 1.00), check in Some(120s)",
        "0 re-admitted (PassiveTrial), trial Some(10s)",
        "0 recovered",
        "rules rejected",
        "rules 1 applied",
    ];
    let mut received = Vec::new();
    while let Ok(event) = events.try_recv() {
        received.push(line(&event));
    }
    assert_eq!(received, expected, "through the broadcast channel");
    assert_eq!(*seen.lock().unwrap(), expected, "through the callback");
    // The kinds carry their typed fields too.
    let _ = (Readmission::PassiveTrial, Refusal::Budget);
}

#[tokio::test(start_paused = true)]
async fn keys_are_typed() {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let mut events = layer.monitor().subscribe();
    let mut h = Harness::new(&layer, 3);
    h.calls(2, 10, 0).await;
    let Ok(Event::Ejected { key, .. }) = events.try_recv() else {
        panic!("no ejection event");
    };
    assert_eq!(key.downcast_ref::<usize>(), Some(&2));
    assert_eq!(key.downcast_ref::<String>(), None);
    let snapshot = layer.monitor().snapshot();
    assert_eq!(snapshot.endpoints[2].key.downcast_ref::<usize>(), Some(&2));
    assert_eq!(snapshot.endpoints[2].key, "2");
}

#[tokio::test(start_paused = true)]
async fn breaker_states_are_reported_as_the_layer_sees_them() {
    use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
    let layer = OutlierDetectionLayer::new(SlowCallPolicy::new(
        BreakerConfig::error_count(2)
            .min_calls(3)
            .open_duration(Duration::from_secs(5))
            .build()
            .unwrap(),
    ));
    let mut events = layer.monitor().subscribe();
    let mut h = Harness::new(&layer, 3);
    // Three errors open #0's breaker: ejected.
    h.calls(0, 3, 0).await;
    // After the open duration: re-admitted, and its probe (the next call) closes the breaker.
    h.advance(Duration::from_secs(5)).await;
    h.calls(0, 0, 1).await;
    let mut received = Vec::new();
    while let Ok(event) = events.try_recv() {
        received.push(line(&event));
    }
    assert_eq!(
        received,
        vec![
            "0 slow-call Some(\"CLOSED\") -> Some(\"OPEN\")",
            "0 ejected by slow-call (error count 3.00), check in Some(5s)",
            "0 re-admitted (PassiveTrial), trial Some(1s)",
            "0 slow-call Some(\"OPEN\") -> Some(\"CLOSED\")",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn probes_weights_and_removals_are_events_too() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower_outlier::probe::{probe_fn, ProbeFuture};

    let healthy = Arc::new(AtomicBool::new(false));
    let answer = healthy.clone();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .recovery_unit(Duration::from_secs(10))
            .build()
            .unwrap(),
    ))
    .probe(probe_fn(
        move |_: &usize, _: support::Backend| -> ProbeFuture {
            let healthy = answer.load(Ordering::SeqCst);
            Box::pin(async move { healthy })
        },
    ))
    // HSF's times exactly, as the events read them (no jitter on the checks).
    .probe_cadence(tower_outlier::probe::ProbeCadence::new().interval_jitter_percent(0));
    let mut events = layer.monitor().subscribe();
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 10, 0).await;
    // The first probe fails; the second, 20 s later, succeeds.
    h.advance(Duration::from_secs(10)).await;
    h.sync();
    healthy.store(true, Ordering::SeqCst);
    h.advance(Duration::from_secs(20)).await;
    h.sync();
    h.remove(3);
    h.sync();
    let mut received = Vec::new();
    while let Ok(event) = events.try_recv() {
        received.push(line(&event));
    }
    assert_eq!(
        received,
        vec![
            "0 ejected by error-rate (error rate 1.00), check in Some(10s)",
            "0 probed",
            "0 failed its probe",
            "0 probed",
            "0 re-admitted (ProbeSucceeded), trial None",
            "Removed { key: 3, status: Available }",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_callback_unsubscribed_is_called_no_more() {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let monitor = layer.monitor();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = {
        let seen = seen.clone();
        monitor.on_event(move |event| seen.lock().unwrap().push(line(event)))
    };
    let gone = Arc::new(Mutex::new(0usize));
    let removed = {
        let gone = gone.clone();
        monitor.on_event(move |_| *gone.lock().unwrap() += 1)
    };
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    let before = *gone.lock().unwrap();
    assert!(before >= 1, "both saw the ejection");
    assert!(removed.unsubscribe());
    h.calls(1, 10, 0).await;
    assert_eq!(*gone.lock().unwrap(), before, "unsubscribed: no more calls");
    assert!(
        seen.lock().unwrap().iter().any(|l| l.starts_with("1 ")),
        "the other one still sees events"
    );
    drop(kept);
    h.calls(2, 0, 1).await;
}

/// A writer the test reads back.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A scripted incident under the Envoy preset, written as Envoy's event log: one
/// `OutlierDetectionEvent` JSON line per eject and uneject, Envoy's field names and enum
/// spellings, `num_ejections` counting and `secs_since_last_action` the time since the other
/// action.
#[tokio::test(start_paused = true)]
async fn the_envoy_event_log_writes_outlier_detection_events() {
    use tower_outlier::events::EnvoyEventLog;
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::envoy()
            .max_ejection_percent(50)
            .base_ejection_time(Duration::from_secs(30))
            .build()
            .unwrap(),
    ));
    let lines = Lines::default();
    let log = EnvoyEventLog::new("orders", lines.clone());
    let _subscription = log.attach(&layer.monitor());
    let mut h = Harness::new(&layer, 5);
    // Five failures in a row eject; the ejection lasts 30 s (Envoy: on the 10 s ticks).
    h.calls(3, 5, 0).await;
    h.advance(Duration::from_secs(45)).await;
    h.calls(3, 0, 2).await;
    h.advance(Duration::from_secs(5)).await;
    h.calls(3, 5, 0).await;

    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(events.len(), 3, "{text}");
    let fields = |e: &serde_json::Value| {
        let mut keys: Vec<String> = e.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    let first = &events[0];
    assert_eq!(first["type"], "CONSECUTIVE_5XX");
    assert_eq!(first["cluster_name"], "orders");
    assert_eq!(first["upstream_url"], "3");
    assert_eq!(first["action"], "EJECT");
    assert_eq!(first["num_ejections"], 1);
    assert_eq!(first["enforced"], true);
    assert_eq!(first["eject_consecutive_event"], serde_json::json!({}));
    assert_eq!(
        fields(first),
        [
            "action",
            "cluster_name",
            "eject_consecutive_event",
            "enforced",
            "num_ejections",
            "timestamp",
            "type",
            "upstream_url"
        ],
        "no secs_since_last_action before any action"
    );
    let timestamp = first["timestamp"].as_str().unwrap();
    assert!(
        timestamp.len() >= 20 && timestamp.ends_with('Z') && timestamp.as_bytes()[10] == b'T',
        "{timestamp}"
    );

    let uneject = &events[1];
    assert_eq!(uneject["action"], "UNEJECT");
    assert_eq!(uneject["enforced"], false);
    assert_eq!(uneject["type"], "CONSECUTIVE_5XX");
    assert_eq!(uneject["num_ejections"], 1);
    let out_for: u64 = uneject["secs_since_last_action"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((30..=45).contains(&out_for), "{out_for}");

    let again = &events[2];
    assert_eq!(again["action"], "EJECT");
    assert_eq!(again["num_ejections"], 2);
    assert_eq!(
        again["secs_since_last_action"], "5",
        "since the re-admission"
    );
    assert_eq!(log.write_errors(), 0);
}

/// In dry run Envoy's event log writes what would be ejected as Envoy writes a detection its
/// `enforcing_*` percentage did not enforce: an EJECT with `enforced: false`, and no UNEJECT.
#[tokio::test(start_paused = true)]
async fn the_envoy_event_log_writes_dry_run_ejections_as_not_enforced() {
    use tower_outlier::events::EnvoyEventLog;
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::envoy()
            .max_ejection_percent(50)
            .build()
            .unwrap(),
    ));
    layer.rules().set_dry_run(true);
    let lines = Lines::default();
    let log = EnvoyEventLog::new("orders", lines.clone());
    let _subscription = log.attach(&layer.monitor());
    let mut h = Harness::new(&layer, 5);
    h.calls(3, 5, 0).await;
    assert!(h.is_live(3));
    h.advance(Duration::from_secs(45)).await;
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{text}");
    assert_eq!(events[0]["action"], "EJECT");
    assert_eq!(events[0]["type"], "CONSECUTIVE_5XX");
    assert_eq!(events[0]["enforced"], false);
    assert_eq!(events[0]["num_ejections"], 0, "nothing was ejected");
}
