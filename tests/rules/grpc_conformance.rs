//! grpc-go's own test cases for its outlier-detection balancer
//! (`internal/xds/balancer/outlierdetection/`), re-expressed against the gRPC reader and the
//! layer with the gRPC preset: each case names the grpc-go test it comes from and keeps its
//! inputs and expected results. grpc-go's unit tests run the interval algorithm by hand; here the
//! layer's ticks fall every interval, and each interval's calls are made before its tick.
//!
//! Where A50's text and grpc-go's code disagree, the case says which this follows. One
//! deliberate difference: grpc-go defaults `failurePercentageEjection.enforcementPercentage` to
//! 0, where A50 and grpc-core (which grpcio, C++ and the other wrapped languages run) default it
//! to 100; the reader follows A50 and grpc-core.

use crate::support;

use std::time::Duration;

use support::Harness;
use tower_outlier::detectors::{Detector, GrpcOutlierDetection};
use tower_outlier::probe::PassiveTrial;
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};

const SECOND: Duration = Duration::from_secs(1);
const CHILD: &str =
    r#""childPolicy": [{"xds_cluster_impl_experimental": {"cluster": "test_cluster"}}]"#;

fn parse(fields: &str) -> DetectorConfig {
    let json = if fields.is_empty() {
        format!("{{{CHILD}}}")
    } else {
        format!("{{{fields}, {CHILD}}}")
    };
    match GrpcOutlierDetection::from_json(&json) {
        Ok(read) => read.into_config(),
        Err(error) => panic!("{json} refused: {error}"),
    }
}

/// The field a refused document names.
fn refused(fields: &str) -> String {
    let json = format!("{{{fields}}}");
    match GrpcOutlierDetection::from_json(&json) {
        Ok(read) => panic!("{json} accepted as {:?}", read.config()),
        Err(error) => error.field().unwrap_or_default().to_string(),
    }
}

/// (stdev factor, enforcement, minimum hosts, request volume) of the success-rate detector.
fn success_rate(config: &DetectorConfig) -> Option<(u32, u32, u32, u32)> {
    config.success_rate().map(|d| {
        (
            d.stdev_factor,
            d.enforcement,
            d.minimum_hosts,
            d.request_volume,
        )
    })
}

/// (threshold, enforcement, minimum hosts, request volume) of the failure-percentage detector.
fn failure_percentage(config: &DetectorConfig) -> Option<(u32, u32, u32, u32)> {
    config.failure_percentage().map(|d| {
        (
            d.threshold,
            d.enforcement,
            d.minimum_hosts,
            d.request_volume,
        )
    })
}

/// (interval, base, max) in seconds and the max ejection percent.
fn top_level(config: &DetectorConfig) -> (u64, u64, u64, u32) {
    (
        config.interval().as_secs(),
        config.base_ejection_time().as_secs(),
        config.max_ejection_time().as_secs(),
        config.max_ejection_percent(),
    )
}

// TestParseConfig/Default.
#[test]
fn parse_default() {
    let config = parse("");
    assert_eq!(top_level(&config), (10, 30, 300, 10));
    assert_eq!(success_rate(&config), None);
    assert_eq!(failure_percentage(&config), None);
}

// TestParseConfig/TopLevelSet.
#[test]
fn parse_top_level_set() {
    let config = parse(r#""interval": "15s", "maxEjectionTime": "350s""#);
    assert_eq!(top_level(&config), (15, 30, 350, 10));
    assert_eq!(success_rate(&config), None);
}

// TestParseConfig/SuccessRate_Defaults.
#[test]
fn parse_success_rate_defaults() {
    let config = parse(r#""successRateEjection": {}"#);
    assert_eq!(success_rate(&config), Some((1900, 100, 5, 100)));
    assert_eq!(top_level(&config), (10, 30, 300, 10));
}

// TestParseConfig/SuccessRate_Partial.
#[test]
fn parse_success_rate_partial() {
    let config = parse(r#""successRateEjection": {"stdevFactor": 1000, "minimumHosts": 5}"#);
    assert_eq!(success_rate(&config), Some((1000, 100, 5, 100)));
}

// TestParseConfig/SuccessRate_Full.
#[test]
fn parse_success_rate_full() {
    let config = parse(
        r#""successRateEjection": {"stdevFactor": 1000, "enforcementPercentage": 50,
            "minimumHosts": 5, "requestVolume": 50}"#,
    );
    assert_eq!(success_rate(&config), Some((1000, 50, 5, 50)));
}

// TestParseConfig/FailurePercentage_Defaults: grpc-go gives {85, 0, 5, 50}; A50 and grpc-core
// give an enforcement of 100, which the reader follows.
#[test]
fn parse_failure_percentage_defaults() {
    let config = parse(r#""failurePercentageEjection": {}"#);
    assert_eq!(failure_percentage(&config), Some((85, 100, 5, 50)));
}

// TestParseConfig/FailurePercentage_Partial (grpc-go: enforcement 0, as above).
#[test]
fn parse_failure_percentage_partial() {
    let config = parse(r#""failurePercentageEjection": {"threshold": 80, "minimumHosts": 10}"#);
    assert_eq!(failure_percentage(&config), Some((80, 100, 10, 50)));
}

// TestParseConfig/FailurePercentage_Full.
#[test]
fn parse_failure_percentage_full() {
    let config = parse(
        r#""failurePercentageEjection": {"threshold": 80, "enforcementPercentage": 100,
            "minimumHosts": 10, "requestVolume": 40}"#,
    );
    assert_eq!(failure_percentage(&config), Some((80, 100, 10, 40)));
}

/// grpc-go's `AllFields_Zero` parse case: every field zero, both detectors present.
pub(crate) const ALL_FIELDS_ZERO: &str = r#""interval": "0s", "baseEjectionTime": "0s",
    "maxEjectionTime": "0s", "maxEjectionPercent": 0,
    "successRateEjection": {"stdevFactor": 0, "enforcementPercentage": 0,
                            "minimumHosts": 0, "requestVolume": 0},
    "failurePercentageEjection": {"threshold": 0, "enforcementPercentage": 0,
                                  "minimumHosts": 0, "requestVolume": 0}"#;

// TestParseConfig/AllFields_Zero: accepted, every field zero, both detectors present.
#[test]
fn parse_all_fields_zero() {
    let config = parse(ALL_FIELDS_ZERO);
    assert_eq!(top_level(&config), (0, 0, 0, 0));
    assert_eq!(success_rate(&config), Some((0, 0, 0, 0)));
    assert_eq!(failure_percentage(&config), Some((0, 0, 0, 0)));
}

// TestParseConfig/AllFields_Set.
#[test]
fn parse_all_fields_set() {
    let config = parse(
        r#""interval": "10s", "baseEjectionTime": "30s", "maxEjectionTime": "300s",
           "maxEjectionPercent": 10,
           "successRateEjection": {"stdevFactor": 1900, "enforcementPercentage": 100,
                                   "minimumHosts": 5, "requestVolume": 100},
           "failurePercentageEjection": {"threshold": 85, "enforcementPercentage": 5,
                                         "minimumHosts": 5, "requestVolume": 50}"#,
    );
    assert_eq!(top_level(&config), (10, 30, 300, 10));
    assert_eq!(success_rate(&config), Some((1900, 100, 5, 100)));
    assert_eq!(failure_percentage(&config), Some((85, 5, 5, 50)));
}

// TestParseConfig/Interval_Negative, BaseEjectionTime_Negative, MaxEjectionTime_Negative,
// MaxEjectionPercent_TooHigh, SuccessRate_Enforcement_TooHigh,
// FailurePercentage_Threshold_TooHigh, FailurePercentage_Enforcement_TooHigh: refused, the
// field named (these have no childPolicy in grpc-go either).
#[test]
fn parse_out_of_range_values_are_refused() {
    for (fields, field) in [
        (r#""interval": "-10s""#, "interval"),
        (r#""baseEjectionTime": "-10s""#, "baseEjectionTime"),
        (r#""maxEjectionTime": "-10s""#, "maxEjectionTime"),
        (r#""maxEjectionPercent": 150"#, "maxEjectionPercent"),
        (
            r#""successRateEjection": {"enforcementPercentage": 150}"#,
            "successRateEjection.enforcementPercentage",
        ),
        (
            r#""failurePercentageEjection": {"threshold": 150}"#,
            "failurePercentageEjection.threshold",
        ),
        (
            r#""failurePercentageEjection": {"enforcementPercentage": 150}"#,
            "failurePercentageEjection.enforcementPercentage",
        ),
    ] {
        assert_eq!(refused(fields), field, "{fields}");
    }
}

/// Three endpoints under `config`: one interval of five successes each, then one where
/// endpoint 2 fails its five; returns the harness after the second tick.
async fn one_failing_of_three(config: DetectorConfig) -> (Harness<PassiveTrial>, DetectorPolicy) {
    let policy = DetectorPolicy::seeded(config, 3);
    let layer = OutlierDetectionLayer::new(policy.clone());
    let mut h = Harness::new(&layer, 3);
    for id in 0..3 {
        h.calls(id, 0, 5).await;
    }
    h.advance(10 * SECOND).await;
    assert_eq!(h.live_ids(), vec![0, 1, 2], "all at 100 %: nothing ejected");
    h.calls(0, 0, 5).await;
    h.calls(1, 0, 5).await;
    h.calls(2, 5, 0).await;
    h.advance(10 * SECOND).await;
    (h, policy)
}

fn failure_percentage_config(json: &str) -> DetectorConfig {
    parse(&format!(
        r#""baseEjectionTime": "30s", "maxEjectionTime": "300s", {json}"#
    ))
}

// TestEjectUnejectSuccessRate/three_upstreams_one_failure (a failure-percentage config despite
// its name): endpoint 2 at 100 % failures is ejected on the tick, and back after the base time.
#[tokio::test(start_paused = true)]
async fn three_upstreams_one_failure() {
    let config = failure_percentage_config(
        r#""maxEjectionPercent": 10, "failurePercentageEjection": {"threshold": 50,
            "enforcementPercentage": 100, "minimumHosts": 3, "requestVolume": 3}"#,
    );
    let (mut h, policy) = one_failing_of_three(config).await;
    assert_eq!(h.live_ids(), vec![0, 1]);
    let stats = policy.stats();
    assert_eq!(stats.enforced(Detector::FailurePercentage), 1);
    assert_eq!(stats.unenforced(Detector::FailurePercentage), 0);
    // grpc-go moves its clock 1 000 s on; here the ticks until 30 s after the ejection.
    h.advance(30 * SECOND).await;
    assert_eq!(h.live_ids(), vec![0, 1, 2]);
}

// TestEjectUnejectSuccessRate/three_upstreams_no_failure.
#[tokio::test(start_paused = true)]
async fn three_upstreams_no_failure() {
    let config = failure_percentage_config(
        r#""maxEjectionPercent": 10, "failurePercentageEjection": {"threshold": 50,
            "enforcementPercentage": 100, "minimumHosts": 3, "requestVolume": 3}"#,
    );
    let policy = DetectorPolicy::seeded(config, 3);
    let layer = OutlierDetectionLayer::new(policy.clone());
    let mut h = Harness::new(&layer, 3);
    for _ in 0..2 {
        for id in 0..3 {
            h.calls(id, 0, 5).await;
        }
        h.advance(10 * SECOND).await;
    }
    assert_eq!(h.live_ids(), vec![0, 1, 2]);
    assert_eq!(policy.stats().detected(Detector::FailurePercentage), 0);
}

// TestEjectUnejectSuccessRate/three_upstreams_one_failure_no_ejection_enforcement_perc:
// detected, never enforced.
#[tokio::test(start_paused = true)]
async fn three_upstreams_one_failure_no_ejection_enforcement_percentage() {
    let config = failure_percentage_config(
        r#""maxEjectionPercent": 10, "failurePercentageEjection": {"threshold": 50,
            "enforcementPercentage": 0, "minimumHosts": 3, "requestVolume": 3}"#,
    );
    let (h, policy) = one_failing_of_three(config).await;
    assert_eq!(h.live_ids(), vec![0, 1, 2]);
    assert_eq!(policy.stats().unenforced(Detector::FailurePercentage), 1);
}

// TestEjectUnejectSuccessRate/three_upstreams_one_failure_no_ejection_max_ejection_perc: with a
// maxEjectionPercent of 0, 0 % ≥ 0 % stops every ejection (A50's comment says one is always
// allowed; its algorithm and grpc-go do not).
#[tokio::test(start_paused = true)]
async fn three_upstreams_one_failure_no_ejection_max_ejection_percentage() {
    let config = failure_percentage_config(
        r#""maxEjectionPercent": 0, "failurePercentageEjection": {"threshold": 50,
            "enforcementPercentage": 100, "minimumHosts": 3, "requestVolume": 3}"#,
    );
    let (h, _) = one_failing_of_three(config).await;
    assert_eq!(h.live_ids(), vec![0, 1, 2]);
}

// TestEjectFailureRate (a success-rate config despite its name): rates 1, 1, 0 with a stdev
// factor of 0.5: the required rate is 0.431 and endpoint 2 is ejected.
#[tokio::test(start_paused = true)]
async fn eject_failure_rate() {
    let config = failure_percentage_config(
        r#""maxEjectionPercent": 10, "successRateEjection": {"stdevFactor": 500,
            "enforcementPercentage": 100, "minimumHosts": 3, "requestVolume": 3}"#,
    );
    let (h, policy) = one_failing_of_three(config).await;
    assert_eq!(h.live_ids(), vec![0, 1]);
    assert_eq!(policy.stats().enforced(Detector::SuccessRate), 1);
}

// The same with the default stdev factor of 1.9: the required rate is −0.229, nothing is
// ejected (a lone outlier among three never is, whatever the gap).
#[tokio::test(start_paused = true)]
async fn eject_failure_rate_with_the_default_factor_ejects_nothing_among_three() {
    let config = failure_percentage_config(
        r#""maxEjectionPercent": 10, "successRateEjection": {
            "enforcementPercentage": 100, "minimumHosts": 3, "requestVolume": 3}"#,
    );
    let (h, _) = one_failing_of_three(config).await;
    assert_eq!(h.live_ids(), vec![0, 1, 2]);
}
