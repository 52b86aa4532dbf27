use super::*;
use crate::{DetectorSemantics, FailurePercentage, SuccessRate, SuccessRateRule};
use serde_json::Value;
use std::time::Duration;

/// The service config of grpc-go's outlier-detection end-to-end test for the success-rate
/// algorithm (`internal/xds/balancer/outlierdetection/e2e_test`), its child policy named.
const GRPC_GO_SUCCESS_RATE: &str = r#"{
  "loadBalancingConfig": [
    {
      "outlier_detection_experimental": {
        "interval": "0.050s",
        "baseEjectionTime": "0.100s",
        "maxEjectionTime": "300s",
        "maxEjectionPercent": 33,
        "successRateEjection": {
          "stdevFactor": 50,
          "enforcementPercentage": 100,
          "minimumHosts": 3,
          "requestVolume": 5
        },
        "childPolicy": [{"round_robin": {}}]
      }
    }
  ]
}"#;

/// The same test's failure-percentage service config.
const GRPC_GO_FAILURE_PERCENTAGE: &str = r#"{
  "loadBalancingConfig": [
    {
      "outlier_detection_experimental": {
        "interval": "0.050s",
        "baseEjectionTime": "0.100s",
        "maxEjectionTime": "300s",
        "maxEjectionPercent": 33,
        "failurePercentageEjection": {
          "threshold": 50,
          "enforcementPercentage": 100,
          "minimumHosts": 3,
          "requestVolume": 5
        },
        "childPolicy": [{"round_robin": {}}]
      }
    }
  ]
}"#;

/// Every field set, as grpc-go's `ParseConfig` test "AllFields_Set" writes them.
const ALL_FIELDS: &str = r#"{
  "interval": "10s",
  "baseEjectionTime": "30s",
  "maxEjectionTime": "300s",
  "maxEjectionPercent": 10,
  "successRateEjection": {
    "stdevFactor": 1900,
    "enforcementPercentage": 100,
    "minimumHosts": 5,
    "requestVolume": 100
  },
  "failurePercentageEjection": {
    "threshold": 85,
    "enforcementPercentage": 5,
    "minimumHosts": 5,
    "requestVolume": 50
  },
  "childPolicy": [{"xds_cluster_impl_experimental": {"cluster": "test_cluster"}}]
}"#;

const A50_SUCCESS_RATE: SuccessRate = SuccessRate {
    rule: SuccessRateRule::Stdev,
    stdev_factor: 1900,
    enforcement: 100,
    local_origin_enforcement: 100,
    minimum_hosts: 5,
    request_volume: 100,
};

fn read(json: &str) -> GrpcOutlierDetection {
    match GrpcOutlierDetection::from_json(json) {
        Ok(grpc) => grpc,
        Err(error) => panic!("{json} was refused: {error}"),
    }
}

fn config_of(json: &str) -> DetectorConfig {
    read(json).into_config()
}

fn error_of(json: &str) -> tower_outlier_core::DocumentError {
    match GrpcOutlierDetection::from_json(json) {
        Ok(grpc) => panic!("{json} was accepted as {:?}", grpc.config()),
        Err(error) => error,
    }
}

/// The error names `field`, shows `value` and an allowed range, in the accessors and the message.
fn assert_invalid(json: &str, field: &str, value: &str) {
    let error = error_of(json);
    assert_eq!(error.field(), Some(field), "{json}: {error}");
    let detail = error.config_error().expect("a value error");
    assert_eq!(detail.field(), field);
    assert_eq!(detail.value(), value, "{json}: {error}");
    assert!(!detail.allowed().is_empty());
    let message = error.to_string();
    let start = format!("invalid gRPC outlier_detection_experimental config: `{field}` = {value} ");
    assert!(message.starts_with(&start), "{message}");
    assert!(!error.is_duplicate() && !error.is_unknown_field());
}

#[test]
fn grpc_go_service_configs_read() {
    let grpc = read(GRPC_GO_SUCCESS_RATE);
    assert!(grpc.ignored_fields().is_empty());
    let config = grpc.config();
    assert_eq!(config.semantics(), DetectorSemantics::Grpc);
    assert_eq!(config.interval(), Duration::from_millis(50));
    assert_eq!(config.base_ejection_time(), Duration::from_millis(100));
    assert_eq!(config.max_ejection_time(), Duration::from_secs(300));
    assert_eq!(config.max_ejection_percent(), 33);
    assert_eq!(
        config.success_rate(),
        Some(SuccessRate {
            stdev_factor: 50,
            minimum_hosts: 3,
            request_volume: 5,
            ..A50_SUCCESS_RATE
        })
    );
    assert_eq!(config.failure_percentage(), None);
    // gRPC has no consecutive-failure detector.
    assert_eq!(config.consecutive_5xx().threshold, 0);
    assert_eq!(config.consecutive_gateway_failure().threshold, 0);

    let config = config_of(GRPC_GO_FAILURE_PERCENTAGE);
    assert_eq!(config.success_rate(), None);
    let failure_percentage = config.failure_percentage().unwrap();
    assert_eq!(failure_percentage.threshold, 50);
    assert_eq!(failure_percentage.enforcement, 100);
    assert_eq!(failure_percentage.minimum_hosts, 3);
    assert_eq!(failure_percentage.request_volume, 5);
}

#[test]
fn all_fields_are_read() {
    let config = config_of(ALL_FIELDS);
    assert_eq!(config.interval(), Duration::from_secs(10));
    assert_eq!(config.base_ejection_time(), Duration::from_secs(30));
    assert_eq!(config.max_ejection_time(), Duration::from_secs(300));
    assert_eq!(config.max_ejection_percent(), 10);
    assert_eq!(config.success_rate(), Some(A50_SUCCESS_RATE));
    assert_eq!(
        config.failure_percentage(),
        Some(FailurePercentage {
            threshold: 85,
            enforcement: 5,
            local_origin_enforcement: 0,
            minimum_hosts: 5,
            request_volume: 50,
        })
    );
}

#[test]
fn the_three_forms_read_alike() {
    let bare = config_of(ALL_FIELDS);
    let entry = config_of(&format!(
        r#"{{"outlier_detection_experimental": {ALL_FIELDS}}}"#
    ));
    let service = config_of(&format!(
        r#"{{"loadBalancingConfig": [{{"outlier_detection_experimental": {ALL_FIELDS}}}],
            "methodConfig": [{{"name": [{{"service": "echo"}}], "timeout": "1s"}}]}}"#
    ));
    assert_eq!(bare, entry);
    assert_eq!(bare, service);
}

#[test]
fn an_empty_config_has_a50s_defaults_and_ejects_nothing() {
    for json in [
        "{}",
        r#"{"outlier_detection_experimental": {}}"#,
        "\u{feff}{}",
    ] {
        let grpc = read(json);
        assert_eq!(
            grpc.builder(),
            DetectorConfig::grpc()
                .success_rate(None)
                .failure_percentage(None)
        );
        let config = grpc.config();
        assert_eq!(config.interval(), Duration::from_secs(10));
        assert_eq!(config.base_ejection_time(), Duration::from_secs(30));
        assert_eq!(config.max_ejection_time(), Duration::from_secs(300));
        assert_eq!(config.max_ejection_percent(), 10);
        assert_eq!(config.success_rate(), None);
        assert_eq!(config.failure_percentage(), None);
        assert_eq!(config.consecutive_5xx().threshold, 0);
    }
    // A default maximum below the base is the base, as A50 says.
    let config = config_of(r#"{"baseEjectionTime": "600s"}"#);
    assert_eq!(config.max_ejection_time(), Duration::from_secs(600));
}

#[test]
fn an_algorithm_given_empty_has_a50s_defaults() {
    let config = config_of(r#"{"successRateEjection": {}, "failurePercentageEjection": {}}"#);
    assert_eq!(config.success_rate(), Some(A50_SUCCESS_RATE));
    let failure_percentage = config.failure_percentage().unwrap();
    assert_eq!(failure_percentage.threshold, 85);
    // A50's default; grpc-go's config.go would make this 0.
    assert_eq!(failure_percentage.enforcement, 100);
    assert_eq!(failure_percentage.minimum_hosts, 5);
    assert_eq!(failure_percentage.request_volume, 50);
    // Partly given: the rest keeps its default.
    let config = config_of(r#"{"successRateEjection": {"requestVolume": 7}}"#);
    assert_eq!(
        config.success_rate(),
        Some(SuccessRate {
            request_volume: 7,
            ..A50_SUCCESS_RATE
        })
    );
}

#[test]
fn a50s_limits_are_enforced_by_name() {
    for (json, field, value) in [
        (r#"{"interval": "-10s"}"#, "interval", r#""-10s""#),
        (
            r#"{"baseEjectionTime": "-10s"}"#,
            "baseEjectionTime",
            r#""-10s""#,
        ),
        (
            r#"{"maxEjectionTime": "-10s"}"#,
            "maxEjectionTime",
            r#""-10s""#,
        ),
        (
            r#"{"maxEjectionTime": "-0.000000001s"}"#,
            "maxEjectionTime",
            r#""-0.000000001s""#,
        ),
        (
            r#"{"maxEjectionPercent": 150}"#,
            "maxEjectionPercent",
            "150",
        ),
        (
            r#"{"maxEjectionPercent": 101}"#,
            "maxEjectionPercent",
            "101",
        ),
        (
            r#"{"successRateEjection": {"enforcementPercentage": 150}}"#,
            "successRateEjection.enforcementPercentage",
            "150",
        ),
        (
            r#"{"failurePercentageEjection": {"threshold": 150}}"#,
            "failurePercentageEjection.threshold",
            "150",
        ),
        (
            r#"{"failurePercentageEjection": {"enforcementPercentage": 101}}"#,
            "failurePercentageEjection.enforcementPercentage",
            "101",
        ),
    ] {
        assert_invalid(json, field, value);
    }
    // The same error inside a service config names the whole path.
    assert_invalid(
        r#"{"loadBalancingConfig": [{"outlier_detection_experimental": {"interval": "-1s"}}]}"#,
        "loadBalancingConfig[0].outlier_detection_experimental.interval",
        r#""-1s""#,
    );
}

#[test]
fn what_grpc_does_not_limit_is_accepted() {
    let config = config_of(
        r#"{"maxEjectionPercent": 100, "maxEjectionTime": "0s",
            "successRateEjection": {"stdevFactor": 4294967295, "minimumHosts": 0, "requestVolume": 4294967295},
            "failurePercentageEjection": {"threshold": 0, "enforcementPercentage": 0, "minimumHosts": 4294967295, "requestVolume": 0}}"#,
    );
    // A maximum below the base is raised to it.
    assert_eq!(config.max_ejection_time(), Duration::from_secs(30));
    assert_eq!(config.success_rate().unwrap().stdev_factor, u32::MAX);
    assert_eq!(config.failure_percentage().unwrap().minimum_hosts, u32::MAX);
    let config = config_of(r#"{"baseEjectionTime": "60s", "maxEjectionTime": "1s"}"#);
    assert_eq!(config.max_ejection_time(), Duration::from_secs(60));
    // Durations keep nanoseconds.
    let config = config_of(r#"{"interval": "0.000000001s", "baseEjectionTime": "1.5s"}"#);
    assert_eq!(config.interval(), Duration::from_nanos(1));
    assert_eq!(config.base_ejection_time(), Duration::from_millis(1500));
}

#[test]
fn zero_durations_are_read_as_grpc_reads_them() {
    // Every field zero (grpc-go's AllFields_Zero) is in tests/rules/grpc_conformance.rs; here,
    // each spelling of zero, and what a zero interval runs at.
    for text in ["0s", "-0s", "0.000000000s"] {
        let config = config_of(&format!(
            r#"{{"interval": "{text}", "baseEjectionTime": "{text}"}}"#
        ));
        assert_eq!(config.interval(), Duration::ZERO, "{text}");
        assert_eq!(config.base_ejection_time(), Duration::ZERO, "{text}");
        assert_eq!(config.running_interval(), Duration::from_millis(1));
    }
}

#[test]
fn values_of_other_types_are_refused() {
    for key in ["interval", "baseEjectionTime", "maxEjectionTime"] {
        for json in [
            r#""10""#,
            r#""10ms""#,
            r#"".5s""#,
            r#""+5s""#,
            r#""1.5.0s""#,
            r#""315576000001s""#,
            "10",
            "null",
            "true",
            r#"{"seconds": 10}"#,
        ] {
            let value = serde_json::from_str::<Value>(json).unwrap().to_string();
            assert_invalid(&format!(r#"{{"{key}": {json}}}"#), key, &value);
        }
    }
    let integers = [
        "maxEjectionPercent",
        "successRateEjection.stdevFactor",
        "successRateEjection.minimumHosts",
        "failurePercentageEjection.requestVolume",
        "failurePercentageEjection.threshold",
    ];
    for field in integers {
        for json in [
            "10.0",
            "1e1",
            r#""10""#,
            "-1",
            "4294967296",
            "null",
            "true",
            "[10]",
        ] {
            let document = match field.split_once('.') {
                Some((algorithm, name)) => format!(r#"{{"{algorithm}": {{"{name}": {json}}}}}"#),
                None => format!(r#"{{"{field}": {json}}}"#),
            };
            let value = serde_json::from_str::<Value>(json).unwrap().to_string();
            assert_invalid(&document, field, &value);
        }
    }
    for key in ["successRateEjection", "failurePercentageEjection"] {
        for json in ["null", "true", "[]", r#""on""#] {
            assert_invalid(&format!(r#"{{"{key}": {json}}}"#), key, json);
        }
    }
}

#[test]
fn child_policy_is_checked_for_shape_only() {
    for json in [
        r#"[{"pick_first": {}}]"#,
        r#"[{"round_robin": {}}, {"pick_first": {}}]"#,
        r#"[{"unknown_policy": {"anything": [1, 2]}}]"#,
    ] {
        config_of(&format!(r#"{{"childPolicy": {json}}}"#));
    }
    for (json, field, value) in [
        ("[]", "childPolicy", "[]"),
        ("null", "childPolicy", "null"),
        (
            r#"{"round_robin": {}}"#,
            "childPolicy",
            r#"{"round_robin":{}}"#,
        ),
        (r#"[{}]"#, "childPolicy[0]", "{}"),
        (
            r#"[{"a": {}, "b": {}}]"#,
            "childPolicy[0]",
            r#"{"a":{},"b":{}}"#,
        ),
        (
            r#"[{"round_robin": {}}, "pick_first"]"#,
            "childPolicy[1]",
            r#""pick_first""#,
        ),
    ] {
        assert_invalid(&format!(r#"{{"childPolicy": {json}}}"#), field, value);
    }
}

#[test]
fn other_spellings_of_known_fields_are_refused() {
    for (json, field) in [
        (r#"{"base_ejection_time": "10s"}"#, "base_ejection_time"),
        (r#"{"Interval": "10s"}"#, "Interval"),
        (r#"{"MAXEJECTIONPERCENT": 5}"#, "MAXEJECTIONPERCENT"),
        (r#"{"success_rate_ejection": {}}"#, "success_rate_ejection"),
        (r#"{"child_policy": []}"#, "child_policy"),
        (
            r#"{"successRateEjection": {"stdev_factor": 1}}"#,
            "successRateEjection.stdev_factor",
        ),
        (
            r#"{"successRateEjection": {"enforcingSuccessRate": 1}}"#,
            "successRateEjection.enforcingSuccessRate",
        ),
        (
            r#"{"successRateEjection": {"enforcing_success_rate": 1}}"#,
            "successRateEjection.enforcing_success_rate",
        ),
        (
            r#"{"failurePercentageEjection": {"enforcingFailurePercentage": 1}}"#,
            "failurePercentageEjection.enforcingFailurePercentage",
        ),
        (
            r#"{"outlier_detection_experimental": {}, "round_robin": {}}"#,
            "round_robin",
        ),
    ] {
        let error = error_of(json);
        assert!(error.is_unknown_field(), "{json}: {error}");
        assert_eq!(error.field(), Some(field), "{json}");
        assert_eq!(error.config_error(), None);
    }
    let error = error_of(r#"{"base_ejection_time": "10s"}"#);
    assert_eq!(
        error.to_string(),
        "invalid gRPC outlier_detection_experimental config: unknown field `base_ejection_time` \
         (gRPC reads this field only as `baseEjectionTime`; other spellings are ignored, or read \
         by grpc-go alone)"
    );
}

#[test]
fn unknown_fields_are_ignored_and_listed() {
    let grpc = read(
        r#"{"interval": "10s", "zeta": 1, "alpha": {"x": 1},
            "successRateEjection": {"requestVolumes": 5},
            "failurePercentageEjection": {"enforcing": 1}}"#,
    );
    assert_eq!(
        grpc.ignored_fields(),
        [
            "alpha",
            "zeta",
            "successRateEjection.requestVolumes",
            "failurePercentageEjection.enforcing"
        ]
    );
    assert_eq!(grpc.config().success_rate(), Some(A50_SUCCESS_RATE));
    let grpc = read(
        r#"{"loadBalancingConfig": [{"outlier_detection_experimental": {"extra": true}}], "retryThrottling": {}}"#,
    );
    assert_eq!(
        grpc.ignored_fields(),
        ["loadBalancingConfig[0].outlier_detection_experimental.extra"]
    );
}

#[test]
fn the_service_config_needs_an_outlier_detection_entry() {
    // Entries before it are skipped, as gRPC skips policies it does not support.
    let config = config_of(
        r#"{"loadBalancingConfig": [{"my_custom_policy": {}}, {"outlier_detection_experimental": {"maxEjectionPercent": 20}}, {"round_robin": {}}]}"#,
    );
    assert_eq!(config.max_ejection_percent(), 20);
    for (json, field, value) in [
        (
            r#"{"loadBalancingConfig": []}"#,
            "loadBalancingConfig",
            "[]",
        ),
        (
            r#"{"loadBalancingConfig": [{"round_robin": {}}]}"#,
            "loadBalancingConfig",
            r#"[{"round_robin":{}}]"#,
        ),
        (
            r#"{"loadBalancingConfig": null}"#,
            "loadBalancingConfig",
            "null",
        ),
        (
            r#"{"loadBalancingConfig": {"outlier_detection_experimental": {}}}"#,
            "loadBalancingConfig",
            r#"{"outlier_detection_experimental":{}}"#,
        ),
        (
            r#"{"loadBalancingConfig": [{"round_robin": {}, "outlier_detection_experimental": {}}]}"#,
            "loadBalancingConfig[0]",
            r#"{"outlier_detection_experimental":{},"round_robin":{}}"#,
        ),
        (
            r#"{"loadBalancingConfig": ["round_robin"]}"#,
            "loadBalancingConfig[0]",
            r#""round_robin""#,
        ),
        (
            r#"{"loadBalancingConfig": [{"outlier_detection_experimental": null}]}"#,
            "loadBalancingConfig[0].outlier_detection_experimental",
            "null",
        ),
        (
            r#"{"outlier_detection_experimental": []}"#,
            "outlier_detection_experimental",
            "[]",
        ),
    ] {
        assert_invalid(json, field, value);
    }
}

#[test]
fn a_key_given_twice_is_refused_by_name() {
    for (json, field) in [
        (r#"{"interval": "1s", "interval": "1s"}"#, "interval"),
        (
            r#"{"successRateEjection": {"stdevFactor": 1, "stdevFactor": 2}}"#,
            "successRateEjection.stdevFactor",
        ),
        (
            r#"{"successRateEjection": {}, "successRateEjection": {}}"#,
            "successRateEjection",
        ),
        (
            r#"{"childPolicy": [{"pick_first": {"a": 1, "a": 1}}]}"#,
            "childPolicy[0].pick_first.a",
        ),
        (
            r#"{"loadBalancingConfig": [{"outlier_detection_experimental": {"maxEjectionPercent": 1, "maxEjectionPercent": 2}}]}"#,
            "loadBalancingConfig[0].outlier_detection_experimental.maxEjectionPercent",
        ),
        (
            r#"{"methodConfig": [], "methodConfig": [], "loadBalancingConfig": []}"#,
            "methodConfig",
        ),
    ] {
        let error = error_of(json);
        assert!(error.is_duplicate(), "{json}: {error}");
        assert_eq!(error.field(), Some(field), "{json}");
        assert_eq!(
            error.to_string(),
            format!("invalid gRPC outlier_detection_experimental config: `{field}` is given more than once")
        );
    }
}

#[test]
fn other_json_is_refused() {
    let error = error_of(r#"["interval"]"#);
    assert_eq!(error.field(), None);
    assert_eq!(error.location(), None);
    assert!(error.to_string().starts_with(
        "invalid gRPC outlier_detection_experimental config: the top level is [\"interval\"] (allowed: "
    ));
    let error = error_of("{\"interval\": \"1s\"");
    assert_eq!(error.location(), Some((1, 17)));
    assert!(error
        .to_string()
        .starts_with("gRPC outlier_detection_experimental config is not valid JSON: "));
}

#[test]
fn the_builder_rebuilds_the_config() {
    let grpc = read(GRPC_GO_SUCCESS_RATE);
    assert_eq!(grpc.builder().build().unwrap(), *grpc.config());
    let adjusted = grpc
        .builder()
        .failure_percentage_threshold(90)
        .build()
        .unwrap();
    assert_eq!(adjusted.failure_percentage().unwrap().threshold, 90);
}
