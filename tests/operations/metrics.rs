//! The layer's Prometheus metrics (`tower_outlier::metrics`, feature `prometheus`), on tokio's
//! paused clock: counters move with ejections and re-admissions, and endpoint churn leaves the
//! label sets bounded.

use crate::support;

use std::time::Duration;

use prometheus_client::registry::Registry;
use support::Harness;
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// The value of the sample whose line starts with `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

fn layer() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .recovery_unit(Duration::from_secs(30))
            .build()
            .unwrap(),
    ))
}

#[tokio::test(start_paused = true)]
async fn counters_move_with_an_ejection_and_a_readmission() {
    let layer = layer();
    let mut registry = Registry::default();
    tower_outlier::metrics::register(&mut registry, &layer.monitor());
    let mut h = Harness::new(&layer, 5);
    let before = scrape(&registry);
    assert_eq!(
        sample(&before, r#"outlier_ejections_active{upstream="default"}"#),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &before,
            r#"outlier_endpoints{upstream="default",status="available"}"#
        ),
        Some(5.0)
    );

    h.calls(3, 10, 0).await;
    let ejected = scrape(&registry);
    assert_eq!(
        sample(
            &ejected,
            r#"outlier_ejections_total{upstream="default",policy="error-rate",measure="error rate"}"#
        ),
        Some(1.0),
        "{ejected}"
    );
    assert_eq!(
        sample(&ejected, r#"outlier_ejections_active{upstream="default"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &ejected,
            r#"outlier_endpoint_error_rate{upstream="default",upstream_endpoint="3"}"#
        ),
        Some(1.0)
    );

    h.advance(Duration::from_secs(30)).await;
    let back = scrape(&registry);
    assert_eq!(
        sample(
            &back,
            r#"outlier_readmissions_total{upstream="default",cause="passive_trial"}"#
        ),
        Some(1.0),
        "{back}"
    );
    assert_eq!(
        sample(&back, r#"outlier_ejections_active{upstream="default"}"#),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &back,
            r#"outlier_endpoints{upstream="default",status="trial"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &back,
            r#"outlier_endpoint_weight{upstream="default",upstream_endpoint="3"}"#
        ),
        Some(1.0)
    );
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_churned_endpoints_leave_the_label_sets_bounded() {
    let layer = layer();
    let mut registry = Registry::default();
    tower_outlier::metrics::register(&mut registry, &layer.monitor());
    let mut h = Harness::new(&layer, 5);
    for id in 5..10_005 {
        h.insert(id);
        h.sync();
        // Every tenth newcomer fails before it goes: ejections with distinct keys.
        if id % 10 == 0 && h.is_live(id) {
            h.calls(id, 10, 0).await;
        }
        h.remove(id);
        h.sync();
    }
    let text = scrape(&registry);
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    // Two per-endpoint series for each of the five endpoints left, and a fixed number of others.
    assert!(series < 49, "{series} series:\n{text}");
    assert!(!text.contains(r#"upstream_endpoint="5000""#));
    assert!(
        sample(
            &text,
            r#"outlier_ejections_total{upstream="default",policy="error-rate",measure="error rate"}"#
        )
        .unwrap()
            >= 900.0,
        "{text}"
    );
}

/// The recommended configuration's detector counters carry its own name and its streak's
/// (the measure its ejections' reasons give): `policy="recommended"`,
/// `detector="consecutive failures"`.
#[tokio::test(start_paused = true)]
async fn the_recommended_configurations_counters_say_what_its_reasons_say() {
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    let policy = DetectorPolicy::seeded(DetectorConfig::recommended().build().unwrap(), 1);
    let layer = OutlierDetectionLayer::new(policy.clone());
    let mut registry = Registry::default();
    let metrics = tower_outlier::metrics::register(&mut registry, &layer.monitor());
    metrics.watch_detectors("default", &policy);
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 3, 0).await;
    let reason = layer
        .monitor()
        .snapshot()
        .get_key(&0)
        .unwrap()
        .last_reason
        .clone()
        .unwrap();
    let text = scrape(&registry);
    let series = format!(
        r#"outlier_detector_ejections_total{{upstream="default",policy="recommended",detector="{}",result="enforced"}}"#,
        reason.measure
    );
    assert_eq!(reason.measure, "consecutive failures");
    assert_eq!(sample(&text, &series), Some(1.0), "{text}");
}

#[tokio::test(start_paused = true)]
async fn detector_counters_and_breaker_states_are_exported() {
    use tower_outlier::detectors::Detector;
    use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    let policy = DetectorPolicy::seeded(DetectorConfig::envoy().build().unwrap(), 1);
    let breaker = SlowCallPolicy::new(
        BreakerConfig::error_count(2)
            .min_calls(3)
            .open_duration(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    let layer = OutlierDetectionLayer::new(policy.clone()).with_policy(breaker);
    let mut registry = Registry::default();
    let metrics = tower_outlier::metrics::register(&mut registry, &layer.monitor());
    metrics.watch_detectors("default", &policy);
    let mut h = Harness::new(&layer, 5);
    // Five failures in a row: Envoy's 10 % of five refuses the ejection; the breaker opens but
    // the same budget keeps it in too.
    h.calls(0, 5, 0).await;
    let text = scrape(&registry);
    assert_eq!(policy.stats().overflow(Detector::Consecutive5xx), 1);
    assert_eq!(
        sample(
            &text,
            r#"outlier_detector_ejections_total{upstream="default",policy="envoy",detector="consecutive 5xx",result="overflow"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"outlier_endpoint_policy_state{upstream="default",upstream_endpoint="0",policy="slow-call",state="OPEN"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"outlier_endpoint_policy_state{upstream="default",upstream_endpoint="1",policy="slow-call",state="CLOSED"}"#
        ),
        Some(1.0),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn several_layers_share_one_registry_under_service_labels() {
    let (orders, payments) = (layer(), layer());
    let mut registry = Registry::default();
    let metrics = tower_outlier::metrics::OutlierMetrics::register(&mut registry);
    metrics.watch("orders", &orders.monitor());
    // Watched twice: the second is ignored, or every event would be counted twice.
    metrics.watch("orders again", &orders.monitor());
    metrics.watch("pay\"ments", &payments.monitor());
    let mut o = Harness::new(&orders, 5);
    let _p = Harness::new(&payments, 5);
    o.calls(1, 10, 0).await;
    o.remove(4);
    o.sync();
    let text = scrape(&registry);
    assert_eq!(
        sample(
            &text,
            r#"outlier_ejections_total{upstream="orders",policy="error-rate",measure="error rate"}"#
        ),
        Some(1.0),
        "one ejection, counted once: {text}"
    );
    assert!(!text.contains("orders again"), "{text}");
    // One TYPE line per family, whatever the number of layers: a valid exposition.
    let mut types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
    let all = types.len();
    types.sort();
    types.dedup();
    assert_eq!(types.len(), all, "{text}");
    assert_eq!(
        sample(&text, r#"outlier_ejections_active{upstream="orders"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"outlier_ejections_active{upstream="pay\"ments"}"#),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"outlier_removals_total{upstream="orders",status="available"}"#
        ),
        Some(1.0),
        "{text}"
    );
}

/// Counters whose labels are known in advance are exported at 0 from the first scrape, so an
/// alert on their rate sees 0, not "no data".
#[tokio::test(start_paused = true)]
async fn counters_are_present_at_zero_before_any_event() {
    let layer = layer();
    let mut registry = Registry::default();
    tower_outlier::metrics::register(&mut registry, &layer.monitor());
    let _h = Harness::new(&layer, 3);
    let text = scrape(&registry);
    for series in [
        r#"outlier_ejections_refused_total{upstream="default",refusal="budget"}"#,
        r#"outlier_ejections_refused_total{upstream="default",refusal="last_endpoint"}"#,
        r#"outlier_readmissions_total{upstream="default",cause="probe_succeeded"}"#,
        r#"outlier_readmissions_total{upstream="default",cause="passive_trial"}"#,
        r#"outlier_recoveries_total{upstream="default"}"#,
        r#"outlier_trials_failed_total{upstream="default"}"#,
        r#"outlier_probes_total{upstream="default",result="failed"}"#,
        r#"outlier_rules_total{upstream="default",result="rejected"}"#,
        r#"outlier_removals_total{upstream="default",status="ejected"}"#,
    ] {
        assert_eq!(sample(&text, series), Some(0.0), "{series} in:\n{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn dry_run_and_operator_actions_are_counted() {
    let layer = layer();
    let mut registry = Registry::default();
    tower_outlier::metrics::register(&mut registry, &layer.monitor());
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    let before = scrape(&registry);
    for action in ["force_out", "force_in", "release", "reset_backoff"] {
        let series =
            format!(r#"outlier_operator_actions_total{{upstream="default",action="{action}"}}"#);
        assert_eq!(sample(&before, &series), Some(0.0), "{series}");
    }
    rules.set_dry_run(true);
    h.sync();
    h.calls(3, 10, 0).await;
    rules.force_out(&1usize);
    h.sync();
    rules.release(&1usize);
    rules.reset_backoff(&3usize);
    h.sync();
    let after = scrape(&registry);
    assert_eq!(
        sample(
            &after,
            r#"outlier_would_eject_total{upstream="default",policy="error-rate",measure="error rate"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &after,
            r#"outlier_ejections_total{upstream="default",policy="error-rate",measure="error rate"}"#
        ),
        None,
        "dry run ejected nothing"
    );
    for (action, count) in [("force_out", 1.0), ("release", 1.0), ("reset_backoff", 1.0)] {
        let series =
            format!(r#"outlier_operator_actions_total{{upstream="default",action="{action}"}}"#);
        assert_eq!(sample(&after, &series), Some(count), "{series}");
    }
}
