use super::*;
use crate::{Consecutive, DetectorSemantics, FailurePercentage, SuccessRate, SuccessRateRule};
use serde_json::Value;
use std::time::Duration;

/// The cluster example of Envoy's documentation (`docs/root/api-v3/config/contrib/
/// load_balancing_policies/peak_ewma/peak_ewma.rst`), its `outlier_detection` in JSON.
const PEAK_EWMA_DOC: &str = r#"{"outlier_detection": {"consecutive_5xx": 3, "interval": "30s", "base_ejection_time": "30s"}}"#;

/// The example of Envoy's health-checking tutorial (envoyproxy/katacoda-scenarios), which quotes
/// the count, in JSON.
const TUTORIAL: &str =
    r#"{"outlier_detection": {"consecutive_5xx": "3", "base_ejection_time": "30s"}}"#;

fn config_of(json: &str) -> DetectorConfig {
    match EnvoyOutlierDetection::from_json(json) {
        Ok(envoy) => envoy.into_config(),
        Err(error) => panic!("{json} was refused: {error}"),
    }
}

fn error_of(json: &str) -> tower_outlier_core::DocumentError {
    match EnvoyOutlierDetection::from_json(json) {
        Ok(envoy) => panic!("{json} was accepted as {:?}", envoy.config()),
        Err(error) => error,
    }
}

/// The error names `field`, shows `value` and an allowed range, in the accessors and the message.
fn assert_invalid(json: &str, field: &str, value: &str) {
    let error = error_of(json);
    assert_eq!(error.field(), Some(field), "{json}: {error}");
    let detail = error.config_error().expect("a value error");
    assert_eq!(detail.field(), field, "{json}");
    assert_eq!(detail.value(), value, "{json}: {error}");
    assert!(!detail.allowed().is_empty());
    let message = error.to_string();
    assert!(
        message.starts_with(&format!(
            "invalid Envoy outlier_detection: `{field}` = {value} "
        )),
        "{message}"
    );
    assert!(!error.is_duplicate() && !error.is_unknown_field());
}

fn defaults() -> DetectorConfig {
    DetectorConfig::envoy().build().unwrap()
}

#[test]
fn documentation_examples_read() {
    let config = config_of(PEAK_EWMA_DOC);
    assert_eq!(config.semantics(), DetectorSemantics::Envoy);
    assert_eq!(
        config.consecutive_5xx(),
        Consecutive {
            threshold: 3,
            enforcement: 100
        }
    );
    assert_eq!(config.interval(), Duration::from_secs(30));
    assert_eq!(config.base_ejection_time(), Duration::from_secs(30));
    assert_eq!(config.max_ejection_time(), Duration::from_secs(300));
    assert_eq!(config.max_ejection_percent(), 10);
    assert_eq!(config.success_rate(), defaults().success_rate());
    assert_eq!(config.failure_percentage(), defaults().failure_percentage());

    let tutorial = config_of(TUTORIAL);
    assert_eq!(tutorial.consecutive_5xx().threshold, 3);
    assert_eq!(tutorial.base_ejection_time(), Duration::from_secs(30));
    assert_eq!(tutorial.interval(), Duration::from_secs(10));
}

#[test]
fn an_empty_message_has_envoys_defaults() {
    for json in [
        "{}",
        " { } ",
        "\u{feff}{}",
        r#"{"outlier_detection": {}}"#,
        r#"{"outlierDetection": {}}"#,
    ] {
        assert_eq!(config_of(json), defaults(), "{json:?}");
    }
    let envoy = EnvoyOutlierDetection::from_json("{}").unwrap();
    assert_eq!(envoy.builder(), DetectorConfig::envoy());
    // The detectors Envoy always has are present, the failure percentage one not ejecting.
    let config = defaults();
    assert_eq!(config.failure_percentage().unwrap().enforcement, 0);
    assert_eq!(config.consecutive_gateway_failure().enforcement, 0);
    assert!(config.success_rate().is_some());
}

/// Every field of the proto, once in each spelling, with values unlike the defaults.
fn every_field(camel: bool) -> String {
    let entries = [
        ("consecutive_5xx", "consecutive5xx", "11"),
        ("interval", "interval", r#""2.5s""#),
        ("base_ejection_time", "baseEjectionTime", r#""7s""#),
        ("max_ejection_percent", "maxEjectionPercent", "40"),
        ("enforcing_consecutive_5xx", "enforcingConsecutive5xx", "90"),
        ("enforcing_success_rate", "enforcingSuccessRate", "80"),
        ("success_rate_minimum_hosts", "successRateMinimumHosts", "3"),
        (
            "success_rate_request_volume",
            "successRateRequestVolume",
            "20",
        ),
        (
            "success_rate_stdev_factor",
            "successRateStdevFactor",
            "1500",
        ),
        (
            "consecutive_gateway_failure",
            "consecutiveGatewayFailure",
            "4",
        ),
        (
            "enforcing_consecutive_gateway_failure",
            "enforcingConsecutiveGatewayFailure",
            "60",
        ),
        (
            "split_external_local_origin_errors",
            "splitExternalLocalOriginErrors",
            "true",
        ),
        (
            "consecutive_local_origin_failure",
            "consecutiveLocalOriginFailure",
            "2",
        ),
        (
            "enforcing_consecutive_local_origin_failure",
            "enforcingConsecutiveLocalOriginFailure",
            "70",
        ),
        (
            "enforcing_local_origin_success_rate",
            "enforcingLocalOriginSuccessRate",
            "50",
        ),
        (
            "failure_percentage_threshold",
            "failurePercentageThreshold",
            "75",
        ),
        (
            "enforcing_failure_percentage",
            "enforcingFailurePercentage",
            "30",
        ),
        (
            "enforcing_failure_percentage_local_origin",
            "enforcingFailurePercentageLocalOrigin",
            "20",
        ),
        (
            "failure_percentage_minimum_hosts",
            "failurePercentageMinimumHosts",
            "6",
        ),
        (
            "failure_percentage_request_volume",
            "failurePercentageRequestVolume",
            "25",
        ),
        ("max_ejection_time", "maxEjectionTime", r#""60s""#),
        (
            "max_ejection_time_jitter",
            "maxEjectionTimeJitter",
            r#""0.25s""#,
        ),
        (
            "successful_active_health_check_uneject_host",
            "successfulActiveHealthCheckUnejectHost",
            "false",
        ),
        ("monitors", "monitors", "[]"),
        ("always_eject_one_host", "alwaysEjectOneHost", "true"),
    ];
    assert_eq!(entries.len(), FIELDS.len());
    let body: Vec<String> = entries
        .iter()
        .map(|(snake, lower_camel, value)| {
            format!("\"{}\": {value}", if camel { lower_camel } else { snake })
        })
        .collect();
    format!("{{ {} }}", body.join(",\n  "))
}

#[test]
fn every_field_is_read_in_both_spellings() {
    let snake = config_of(&every_field(false));
    let camel = config_of(&every_field(true));
    assert_eq!(snake, camel);
    let config = snake;
    assert_eq!(
        config.consecutive_5xx(),
        Consecutive {
            threshold: 11,
            enforcement: 90
        }
    );
    assert_eq!(config.interval(), Duration::from_millis(2500));
    assert_eq!(config.base_ejection_time(), Duration::from_secs(7));
    assert_eq!(config.max_ejection_percent(), 40);
    assert_eq!(
        config.success_rate(),
        Some(SuccessRate {
            rule: SuccessRateRule::Stdev,
            stdev_factor: 1500,
            enforcement: 80,
            local_origin_enforcement: 50,
            minimum_hosts: 3,
            request_volume: 20,
        })
    );
    assert_eq!(
        config.consecutive_gateway_failure(),
        Consecutive {
            threshold: 4,
            enforcement: 60
        }
    );
    assert!(config.split_external_local_origin_errors());
    assert_eq!(
        config.consecutive_local_origin_failure(),
        Consecutive {
            threshold: 2,
            enforcement: 70
        }
    );
    assert_eq!(
        config.failure_percentage(),
        Some(FailurePercentage {
            threshold: 75,
            enforcement: 30,
            local_origin_enforcement: 20,
            minimum_hosts: 6,
            request_volume: 25,
        })
    );
    assert_eq!(config.max_ejection_time(), Duration::from_secs(60));
    assert_eq!(
        config.max_ejection_time_jitter(),
        Duration::from_millis(250)
    );
    assert_eq!(config.budget().max_ejected(1), 1); // always_eject_one_host

    // Spellings may be mixed, one per field.
    let mixed =
        config_of(r#"{"consecutive5xx": 2, "base_ejection_time": "1s", "maxEjectionTime": "2s"}"#);
    assert_eq!(mixed.consecutive_5xx().threshold, 2);
    assert_eq!(mixed.max_ejection_time(), Duration::from_secs(2));
}

#[test]
fn null_leaves_the_default() {
    let mut body: Vec<String> = Vec::new();
    for spec in &FIELDS {
        body.push(format!("\"{}\": null", spec.proto));
    }
    assert_eq!(config_of(&format!("{{{}}}", body.join(","))), defaults());
    assert_eq!(
        config_of(r#"{"baseEjectionTime": null, "interval": "1s"}"#).base_ejection_time(),
        Duration::from_secs(30)
    );
}

#[test]
fn counts_are_whole_numbers_or_strings_of_digits() {
    for (json, expected) in [
        ("5", 5),
        ("5.0", 5),
        ("5e0", 5),
        ("0.5e1", 5),
        ("-0", 0),
        (r#""5""#, 5),
        (r#""007""#, 7),
        ("4294967295", u32::MAX),
        (r#""4294967295""#, u32::MAX),
    ] {
        let config = config_of(&format!(r#"{{"consecutive_5xx": {json}}}"#));
        assert_eq!(config.consecutive_5xx().threshold, expected, "{json}");
    }
    for json in [
        "5.5",
        "-1",
        "4294967296",
        "1e10",
        r#""-1""#,
        r#""+5""#,
        r#"" 5""#,
        r#""5e0""#,
        r#""5.0""#,
        r#""""#,
        r#""0x10""#,
        "true",
        "[5]",
        r#"{"value": 5}"#,
        r#""4294967296""#,
    ] {
        let value = serde_json::from_str::<Value>(json).unwrap().to_string();
        assert_invalid(
            &format!(r#"{{"consecutive5xx": {json}}}"#),
            "consecutive5xx",
            &value,
        );
    }
}

#[test]
fn every_percentage_above_100_is_refused_by_name() {
    let percentages: Vec<&Spec> = FIELDS
        .iter()
        .filter(|spec| matches!(spec.kind, Kind::Percent(_)))
        .collect();
    assert_eq!(percentages.len(), 9);
    for spec in percentages {
        for key in [spec.proto, spec.json] {
            config_of(&format!(r#"{{"{key}": 100}}"#));
            assert_invalid(&format!(r#"{{"{key}": 101}}"#), key, "101");
            assert_invalid(&format!(r#"{{"{key}": "101"}}"#), key, r#""101""#);
        }
    }
}

#[test]
fn durations_are_proto3_strings_in_whole_milliseconds() {
    for (text, expected) in [
        ("10s", Duration::from_secs(10)),
        ("1.5s", Duration::from_millis(1500)),
        ("0.001s", Duration::from_millis(1)),
        ("1.0019s", Duration::from_millis(1001)),
        ("0.000999999s", Duration::ZERO),
    ] {
        let config = config_of(&format!(r#"{{"max_ejection_time_jitter": "{text}"}}"#));
        assert_eq!(config.max_ejection_time_jitter(), expected, "{text}");
    }
    let config = config_of(
        r#"{"interval": "0.0015s", "baseEjectionTime": "315576000000s", "maxEjectionTime": "315576000000.999999999s"}"#,
    );
    assert_eq!(config.interval(), Duration::from_millis(1));
    assert_eq!(
        config.base_ejection_time(),
        Duration::from_secs(315_576_000_000)
    );
    assert_eq!(
        config.max_ejection_time(),
        Duration::from_millis(315_576_000_000_999)
    );

    let positive = [
        "interval",
        "base_ejection_time",
        "baseEjectionTime",
        "max_ejection_time",
        "maxEjectionTime",
    ];
    for key in positive {
        for text in [
            "0s",
            "-0s",
            "0.000999999s",
            "-1s",
            "-0.5s",
            "10",
            "10ms",
            "1m",
            ".5s",
            "+1s",
            "1.5.0s",
            "315576000001s",
            "",
        ] {
            assert_invalid(
                &format!(r#"{{"{key}": "{text}"}}"#),
                key,
                &format!("\"{text}\""),
            );
        }
        assert_invalid(&format!(r#"{{"{key}": 10}}"#), key, "10");
        assert_invalid(
            &format!(r#"{{"{key}": {{"seconds": 10}}}}"#),
            key,
            r#"{"seconds":10}"#,
        );
    }
    for key in ["max_ejection_time_jitter", "maxEjectionTimeJitter"] {
        assert_eq!(
            config_of(&format!(r#"{{"{key}": "0s"}}"#)).max_ejection_time_jitter(),
            Duration::ZERO
        );
        assert_invalid(&format!(r#"{{"{key}": "-1s"}}"#), key, r#""-1s""#);
        assert_invalid(&format!(r#"{{"{key}": "1"}}"#), key, r#""1""#);
    }
    let error = error_of(r#"{"baseEjectionTime": "-1s"}"#);
    assert_eq!(
        error.to_string(),
        "invalid Envoy outlier_detection: `baseEjectionTime` = \"-1s\" (allowed: a duration string \
         from 0.001s to 315576000000s, such as \"10s\" or \"1.5s\" (Envoy counts whole \
         milliseconds))"
    );
}

#[test]
fn max_ejection_time_below_the_base_is_refused() {
    assert_invalid(
        r#"{"baseEjectionTime": "60s", "maxEjectionTime": "59.999s"}"#,
        "maxEjectionTime",
        r#""59.999s""#,
    );
    assert_invalid(
        r#"{"max_ejection_time": "29s"}"#,
        "max_ejection_time",
        r#""29s""#,
    );
    let error = error_of(
        r#"{"outlierDetection": {"base_ejection_time": "60s", "maxEjectionTime": "10s"}}"#,
    );
    assert_eq!(error.field(), Some("outlierDetection.maxEjectionTime"));
    assert_eq!(
        error.config_error().unwrap().allowed(),
        "a duration string of at least `outlierDetection.base_ejection_time`, 60s"
    );
    let error = error_of(r#"{"max_ejection_time": "29s"}"#);
    assert_eq!(
        error.config_error().unwrap().allowed(),
        "a duration string of at least base_ejection_time (default), 30s"
    );
    // Equal is allowed, and so is a max equal to the base in whole milliseconds.
    let config = config_of(r#"{"baseEjectionTime": "60s", "maxEjectionTime": "60s"}"#);
    assert_eq!(config.max_ejection_time(), Duration::from_secs(60));
    let config = config_of(r#"{"baseEjectionTime": "1.0009s", "maxEjectionTime": "1s"}"#);
    assert_eq!(config.max_ejection_time(), config.base_ejection_time());
    // Without a max, Envoy's is max(300 s, base).
    let config = config_of(r#"{"baseEjectionTime": "600s"}"#);
    assert_eq!(config.max_ejection_time(), Duration::from_secs(600));
}

#[test]
fn booleans_are_unquoted() {
    for key in [
        "split_external_local_origin_errors",
        "alwaysEjectOneHost",
        "successful_active_health_check_uneject_host",
    ] {
        config_of(&format!(r#"{{"{key}": false}}"#));
        assert_invalid(&format!(r#"{{"{key}": "true"}}"#), key, r#""true""#);
        assert_invalid(&format!(r#"{{"{key}": 1}}"#), key, "1");
    }
}

#[test]
fn fields_without_effect_are_accepted() {
    let with = config_of(
        r#"{"successfulActiveHealthCheckUnejectHost": false,
            "monitors": [{"name": "m", "typed_config": {"@type": "type.googleapis.com/x"}}]}"#,
    );
    assert_eq!(with, defaults());
    assert_eq!(config_of(r#"{"monitors": null}"#), defaults());
    assert_invalid(r#"{"monitors": {}}"#, "monitors", "{}");
    assert_invalid(r#"{"monitors": [{}, 1]}"#, "monitors[1]", "1");
}

#[test]
fn unknown_fields_are_refused_by_name() {
    for (json, field) in [
        (r#"{"consecutive_5xxx": 3}"#, "consecutive_5xxx"),
        (r#"{"Interval": "1s"}"#, "Interval"),
        (
            r#"{"base_ejection_time_ms": 3000}"#,
            "base_ejection_time_ms",
        ),
        (
            r#"{"detect_gateway_failures": true}"#,
            "detect_gateway_failures",
        ),
        (
            r#"{"outlier_detection": {"intervalMs": 1}}"#,
            "outlier_detection.intervalMs",
        ),
        (r#"{"outlier_detection": {}, "name": "backend"}"#, "name"),
    ] {
        let error = error_of(json);
        assert!(error.is_unknown_field(), "{json}: {error}");
        assert_eq!(error.field(), Some(field), "{json}");
        assert_eq!(error.config_error(), None);
        assert!(
            error.to_string().starts_with(&format!(
                "invalid Envoy outlier_detection: unknown field `{field}` ("
            )),
            "{error}"
        );
    }
}

#[test]
fn a_field_given_twice_is_refused_by_name() {
    for (json, field, message) in [
        (
            r#"{"interval": "1s", "interval": "2s"}"#,
            "interval",
            "invalid Envoy outlier_detection: `interval` is given more than once",
        ),
        (
            r#"{"baseEjectionTime": "1s", "base_ejection_time": "1s"}"#,
            "base_ejection_time",
            "invalid Envoy outlier_detection: `base_ejection_time` is given more than once \
             (also as `baseEjectionTime`)",
        ),
        (
            r#"{"outlierDetection": {"consecutive5xx": 1, "consecutive_5xx": 2}}"#,
            "outlierDetection.consecutive_5xx",
            "invalid Envoy outlier_detection: `outlierDetection.consecutive_5xx` is given more \
             than once (also as `consecutive5xx`)",
        ),
        (
            r#"{"outlier_detection": {}, "outlierDetection": {}}"#,
            "outlier_detection",
            "invalid Envoy outlier_detection: `outlier_detection` is given more than once (also \
             as `outlierDetection`)",
        ),
        (
            r#"{"monitors": [{"name": "a", "name": "b"}]}"#,
            "monitors[0].name",
            "invalid Envoy outlier_detection: `monitors[0].name` is given more than once",
        ),
    ] {
        let error = error_of(json);
        assert!(error.is_duplicate(), "{json}: {error}");
        assert_eq!(error.field(), Some(field), "{json}");
        assert_eq!(error.to_string(), message);
    }
}

#[test]
fn other_json_is_refused() {
    let error = error_of(r#"[{"interval": "1s"}]"#);
    assert_eq!(error.field(), None);
    assert!(error.to_string().starts_with(
        "invalid Envoy outlier_detection: the top level is [{\"interval\":\"1s\"}] (allowed: "
    ));
    assert_invalid(
        r#"{"outlier_detection": null}"#,
        "outlier_detection",
        "null",
    );
    assert_invalid(
        r#"{"outlierDetection": "5s"}"#,
        "outlierDetection",
        r#""5s""#,
    );

    let error = error_of("{\n  \"interval\": \"1s\",\n}");
    assert_eq!(error.location(), Some((3, 1)));
    assert!(
        error
            .to_string()
            .starts_with("Envoy outlier_detection is not valid JSON: "),
        "{error}"
    );
    // Malformed JSON is reported even after a repeated key.
    let error = error_of(r#"{"interval": "1s", "interval": "1s", "x": }"#);
    assert!(error.location().is_some());
}

#[test]
fn names_in_messages_are_escaped_but_accessors_keep_them() {
    let error = error_of("{\"evil\\nkey\": 1}");
    assert_eq!(error.field(), Some("evil\nkey"));
    assert!(
        error.to_string().contains(r#"unknown field `"evil\nkey"`"#),
        "{error}"
    );
}

#[test]
fn the_builder_rebuilds_the_config() {
    let envoy = EnvoyOutlierDetection::from_json(&every_field(true)).unwrap();
    assert_eq!(envoy.builder().build().unwrap(), *envoy.config());
    // The builder's own errors name its settings.
    let error = envoy
        .builder()
        .max_ejection_percent(200)
        .build()
        .unwrap_err();
    assert_eq!(error.field(), "max_ejection_percent");
}
