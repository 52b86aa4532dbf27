//! What operators check after a change (EDAS and HSF call it "verify the result"): `tracing` events and monitor snapshots tell what the
//! layer did, with the endpoint, the reason, the error rate and the next check.

use crate::support;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::Harness;
use tower_outlier::probe::{probe_fn, ProbeFuture};
use tower_outlier::{EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures this thread's INFO logs and above until the guard is dropped.
    fn install() -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test(start_paused = true)]
async fn events_and_snapshots_tell_what_happened() {
    let (captured, _guard) = Captured::install();

    let healthy = Arc::new(Mutex::new(false));
    let answer = healthy.clone();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud()
            .max_ejection_ratio(0.4)
            .build()
            .unwrap(),
    ))
    .probe(probe_fn(
        move |_: &usize, _: support::Backend| -> ProbeFuture {
            let healthy = *answer.lock().unwrap();
            Box::pin(async move { healthy })
        },
    ))
    // EDAS's times exactly, as the log reads them (no jitter on the checks).
    .probe_cadence(tower_outlier::probe::ProbeCadence::new().interval_jitter_percent(0));
    let monitor = layer.monitor();
    let mut h = Harness::new(&layer, 5);

    h.calls(3, 6, 4).await;
    let log = captured.text();
    assert!(log.contains("endpoint ejected"), "{log}");
    assert!(log.contains("endpoint=3"), "{log}");
    assert!(log.contains("measure=\"error rate\" value=0.6"), "{log}");
    assert!(log.contains("next_check_in=30s"), "{log}");
    // EDAS ejects strictly above its threshold, and the words say so.
    assert!(
        log.contains("error rate 0.600, above its threshold 0.500 (10 calls: 6 failed, 0 slow)"),
        "{log}"
    );

    // 5 × 40 % = 2: the third outlier is refused, and says why.
    h.calls(1, 10, 0).await;
    h.calls(2, 10, 0).await;
    assert!(captured
        .text()
        .contains("ejection refused: ejection budget of 2 for 5 endpoints at 40 % is spent"));
    assert!(captured.text().contains("endpoint=2"));
    let snapshot = monitor.snapshot();
    assert_eq!(snapshot.ejected(), 2);
    assert_eq!(snapshot.get("2").unwrap().status, EndpointStatus::Available);
    assert_eq!(snapshot.get("2").unwrap().error_rate, 1.0);
    assert_eq!(
        snapshot.get("3").unwrap().next_check_in,
        Some(Duration::from_secs(30))
    );

    h.advance(Duration::from_secs(30)).await;
    let log = captured.text();
    assert!(log.contains("probing ejected endpoint"), "{log}");
    assert!(
        log.contains("probe failed: endpoint stays ejected"),
        "{log}"
    );
    assert!(log.contains("next_check_in=60s"), "{log}");
    assert_eq!(monitor.snapshot().get("3").unwrap().failed_checks, 1);

    *healthy.lock().unwrap() = true;
    h.advance(Duration::from_secs(60)).await;
    let log = captured.text();
    assert!(log.contains("endpoint re-admitted"), "{log}");
    assert!(log.contains("cause=probe succeeded"), "{log}");
    let snapshot = monitor.snapshot();
    assert_eq!(snapshot.get("3").unwrap().status, EndpointStatus::Available);
    assert_eq!(snapshot.get("3").unwrap().failed_checks, 0);
    assert_eq!(snapshot.get("3").unwrap().next_check_in, None);
}

#[tokio::test(start_paused = true)]
async fn a_monitor_taken_before_with_policy_still_shows_every_endpoint() {
    use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};

    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let early = layer.monitor();
    let layer = layer.with_policy(SlowCallPolicy::new(
        BreakerConfig::slow_ratio(Duration::from_millis(100))
            .open_duration(Duration::from_secs(10))
            .build()
            .unwrap(),
    ));
    let mut h = Harness::new(&layer, 3);
    h.calls(0, 2, 0).await;
    let snapshot = early.snapshot();
    assert_eq!(snapshot.endpoints.len(), 3);
    let windows = &snapshot.get_key(&0).unwrap().windows;
    let names: Vec<&str> = windows.iter().map(|w| w.policy).collect();
    assert_eq!(names, ["error-rate", "slow-call"]);
    assert_eq!(windows[0].counts.failures, 2);
    assert_eq!(layer.monitor().snapshot().endpoints.len(), 3);
}

/// The recommended configuration's words, as an operator reads them in the log and the
/// monitor: its own policy name (not linkerd's, whose semantics it uses), the streak called a
/// streak of failures (not Envoy's "5xx": it counts gRPC statuses and transport errors too), the
/// rule's comparison as the rule makes it (three in a row eject: "at or above"), and the measured
/// value under its measure's name (it was logged as `error_rate=3.0`).
#[tokio::test(start_paused = true)]
async fn the_recommended_configuration_says_what_it_judged() {
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    let (captured, _guard) = Captured::install();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let monitor = layer.monitor();
    let mut h = Harness::new(&layer, 5);
    h.calls(1, 3, 0).await;
    let log = captured.text();
    assert!(log.contains("endpoint ejected"), "{log}");
    assert!(log.contains("policy=\"recommended\""), "{log}");
    assert!(
        log.contains(
            "consecutive failures 3, at or above its threshold 3 (3 calls: 3 failed, 0 slow)"
        ),
        "{log}"
    );
    assert!(
        log.contains("measure=\"consecutive failures\" value=3"),
        "{log}"
    );
    assert!(!log.contains("error_rate"), "{log}");
    assert!(!log.contains("over threshold"), "{log}");
    let snapshot = monitor.snapshot();
    let reason = snapshot.get_key(&1).unwrap().last_reason.clone().unwrap();
    assert_eq!(reason.policy, "recommended");
    assert_eq!(reason.measure, "consecutive failures");
    assert_eq!(
        reason.comparison,
        tower_outlier::policy::Comparison::AtOrAbove
    );
}

/// The recommended configuration with an active probe: the probe passes and the endpoint is
/// re-admitted, then the one request linkerd's gate lets through first fails and it goes out
/// again. The two must not read as a contradiction ("probe succeeded", then "failed probe"):
/// the second is the gate's probation request, and says so.
#[tokio::test(start_paused = true)]
async fn a_passed_probe_and_a_failed_probation_request_say_which_is_which() {
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    let (captured, _guard) = Captured::install();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .probe(probe_fn(|_: &usize, _: support::Backend| -> ProbeFuture {
        Box::pin(async { true })
    }));
    let mut h = Harness::new(&layer, 5);
    h.calls(1, 3, 0).await;
    assert!(!h.is_live(1));
    for _ in 0..60 {
        if h.is_live(1) {
            break;
        }
        h.advance(Duration::from_millis(500)).await;
    }
    assert!(h.is_live(1), "the passing probe re-admits it");
    h.calls_while_live(1, 1, 0).await;
    assert!(!h.is_live(1), "its probation request failed");
    let log = captured.text();
    let readmitted = log.find("cause=probe succeeded").expect(&log);
    let again = log[readmitted..]
        .find("endpoint ejected")
        .map(|at| &log[readmitted + at..])
        .expect(&log);
    assert!(again.contains("failed probation request"), "{log}");
    assert!(!log.contains("failed probe"), "{log}");
}

/// An Envoy operator's partial update: `{"consecutive5xx": 2}` replaces the whole
/// `outlier_detection`, as Envoy does, so the budget raised to 50 % goes back to Envoy's 10 %
/// (nothing ejects among three endpoints). Accepted, but a WARN names the field and both values;
/// a document that keeps every running value says nothing more.
#[tokio::test(start_paused = true)]
async fn a_partial_envoy_document_warns_of_each_field_it_resets() {
    use tower_outlier::dialect::Envoy;
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    let (captured, _guard) = Captured::install();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::envoy()
            .max_ejection_percent(50)
            .build()
            .unwrap(),
    ));
    let rules = layer.rules();
    rules
        .apply(&Envoy, r#"{"consecutive5xx": 2, "maxEjectionPercent": 50}"#)
        .unwrap();
    assert!(!captured.text().contains("WARN"), "{}", captured.text());
    rules.apply(&Envoy, r#"{"consecutive5xx": 2}"#).unwrap();
    let log = captured.text();
    let warning = log
        .lines()
        .find(|line| line.contains("WARN"))
        .unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(
        warning.contains("`max_ejection_percent` is not in the document: Envoy's default 10 replaces the running 50"),
        "{warning}"
    );
    assert_eq!(log.matches("WARN").count(), 1, "{log}");

    // A layer on the recommended configuration refuses Envoy documents and says what it runs.
    let recommended = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let error = recommended
        .rules()
        .apply(&Envoy, r#"{"consecutive5xx": 2}"#)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "the layer has no envoy policy (it runs: recommended); a document replaces a policy of \
         its own kind only"
    );
}

/// A gRPC `outlier_detection_experimental` config that leaves out a field, or an algorithm the
/// running config has, warns of each: gRPC replaces the whole config, so `{"interval": "5s"}`
/// over the gRPC preset turns its success-rate detector off.
#[tokio::test]
async fn a_partial_grpc_config_warns_of_each_field_it_resets() {
    use tower_outlier::dialect::Grpc;
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    let (captured, _guard) = Captured::install();
    let layer =
        OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::grpc().build().unwrap()));
    let rules = layer.rules();
    rules
        .apply(&Grpc, r#"{"interval": "5s", "successRateEjection": {}}"#)
        .unwrap();
    assert!(!captured.text().contains("WARN"), "{}", captured.text());
    rules.apply(&Grpc, r#"{"interval": "5s"}"#).unwrap();
    let log = captured.text();
    let warning = log
        .lines()
        .find(|line| line.contains("WARN"))
        .unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(
        warning.contains(
            "`successRateEjection` is not in the config: its detector is off, where it runs now"
        ),
        "{warning}"
    );
    assert_eq!(log.matches("WARN").count(), 1, "{log}");
}

/// A snapshot lists endpoints in the order of their keys' text, whatever the order they joined
/// in, across two adaptors of one layer (a key both hold listed twice, side by side); the keys
/// share long prefixes, as socket addresses do.
#[tokio::test(start_paused = true)]
async fn a_snapshot_lists_endpoints_in_the_order_of_their_keys() {
    use futures::StreamExt;
    use std::convert::Infallible;
    use tower::discover::Change;
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let keys: Vec<String> = (0..300u32)
        .map(|i| format!("10.0.{}.{}:8080", (i * 7919) % 13, (i * 104_729) % 251))
        .collect();
    let mut adaptors = Vec::new();
    for take in [300, 40] {
        let (tx, rx) = futures::channel::mpsc::unbounded::<
            Result<Change<String, support::Backend>, Infallible>,
        >();
        for key in keys.iter().rev().take(take) {
            tx.unbounded_send(Ok(Change::Insert(key.clone(), support::Backend::new(0))))
                .unwrap();
        }
        let mut adaptor = tower::Layer::layer(&layer, rx);
        for _ in 0..take {
            let _ = adaptor.next().await;
        }
        adaptors.push((tx, adaptor));
    }
    let shown: Vec<String> = layer
        .monitor()
        .snapshot()
        .endpoints
        .iter()
        .map(|e| e.key.to_string())
        .collect();
    // A key's text is its `Debug` form (a `String` key's is quoted).
    let mut wanted: Vec<String> = keys.iter().map(|k| format!("{k:?}")).collect();
    wanted.extend(keys.iter().rev().take(40).map(|k| format!("{k:?}")));
    wanted.sort();
    assert_eq!(shown, wanted);
}
