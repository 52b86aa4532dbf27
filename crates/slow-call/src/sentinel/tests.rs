//! The Sentinel `DegradeRule` reader's tests.

use super::*;
use crate::config::Strategy;
use std::time::Duration;
use tower_outlier_core::text::MAX_SHOWN_CHARS;
use tower_outlier_core::ConfigError;

/// The seed's walk-through rule, as the dashboard would store it.
const SEED_RULE: &str = r#"[{"resource":"/testD","limitApp":"default","grade":0,"count":500,"timeWindow":10,"minRequestAmount":5,"statIntervalMs":1000,"slowRatioThreshold":1.0}]"#;

/// One rule of every grade, with the fields Sentinel's dashboard stores.
const MIXED_RULES: &str = r#"[
        {"id":1,"app":"orders","ip":"10.0.0.1","port":8719,"resource":"/testD","limitApp":"default",
         "grade":0,"count":500.0,"timeWindow":10,"minRequestAmount":5,"statIntervalMs":1000,
         "slowRatioThreshold":0.5,"gmtCreate":1700000000000,"gmtModified":1700000000000},
        {"resource":"GET:/orders","grade":1,"count":0.25,"timeWindow":30,"minRequestAmount":20,
         "statIntervalMs":10000},
        {"resource":"GET:/orders","grade":2,"count":3.0,"timeWindow":5,"statIntervalMs":60000}
    ]"#;

fn parse_one(json: &str) -> DegradeRule {
    let mut rules = parse_degrade_rules(json).unwrap_or_else(|e| panic!("{json}: {e}"));
    assert_eq!(rules.len(), 1, "{json}");
    rules.remove(0)
}

fn error_of(json: &str) -> DocumentError {
    match parse_degrade_rules(json) {
        Ok(rules) => panic!("{json} was accepted as {rules:?}"),
        Err(error) => error,
    }
}

fn slow(max_rt_ms: u64, ratio: f64) -> Strategy {
    Strategy::SlowRatio {
        max_rt: Duration::from_millis(max_rt_ms),
        ratio,
    }
}

/// The error names the rule's position and resource, the field, the value and an allowed
/// range, in Display and in the accessors.
fn assert_invalid(
    json: &str,
    index: usize,
    resource: Option<&str>,
    field: &str,
    value: &str,
) -> DocumentError {
    let error = error_of(json);
    assert_eq!(error.entry(), Some(index), "{json}: {error}");
    assert_eq!(error.entry_name(), resource, "{json}: {error}");
    assert_eq!(error.field(), Some(field), "{json}: {error}");
    assert_eq!(error.location(), None, "{json}: {error}");
    let detail = error.config_error().expect("a field error");
    assert_eq!(detail.field(), field);
    assert_eq!(detail.value(), value, "{json}: {error}");
    assert!(!detail.allowed().is_empty());

    let message = error.to_string();
    let rule = match resource {
        Some(resource) => format!("rule #{index} (resource \"{resource}\"): "),
        None => format!("rule #{index}: "),
    };
    let expected = format!(
        "invalid Sentinel degrade {rule}`{field}` = {value} (allowed: {})",
        detail.allowed()
    );
    assert_eq!(message, expected);
    error
}

/// A rule for `/r` with `fields` (JSON object members, without braces) after its resource.
fn rule_with(fields: &str) -> String {
    format!(r#"[{{"resource":"/r",{fields}}}]"#)
}

#[test]
fn seed_rule_becomes_the_walk_through_config() {
    let rule = parse_one(SEED_RULE);
    assert_eq!(rule.resource(), "/testD");
    assert!(rule.ignored_fields().is_empty());
    let expected = BreakerConfig::slow_ratio(Duration::from_millis(500))
        .ratio(1.0)
        .min_calls(5)
        .window(Duration::from_secs(1))
        .open_duration(Duration::from_secs(10))
        .build()
        .unwrap();
    assert_eq!(rule.config(), &expected);
    assert_eq!(rule.config().strategy(), slow(500, 1.0));
    assert_eq!(rule.config().min_calls(), 5);
    assert_eq!(rule.config().window(), Duration::from_secs(1));
    assert_eq!(
        rule.config().window_shape(),
        tower_outlier_core::WindowShape::new(Duration::from_secs(1), 1).unwrap()
    );
    assert_eq!(rule.config().open_duration(), Duration::from_secs(10));
}

#[test]
fn every_grade_is_read() {
    let rules = parse_degrade_rules(MIXED_RULES).unwrap();
    assert_eq!(rules.len(), 3);

    assert_eq!(rules[0].resource(), "/testD");
    assert_eq!(rules[0].config().strategy(), slow(500, 0.5));
    assert_eq!(rules[0].config().open_duration(), Duration::from_secs(10));
    assert!(rules[0].ignored_fields().is_empty());

    assert_eq!(rules[1].resource(), "GET:/orders");
    assert_eq!(
        rules[1].config().strategy(),
        Strategy::ErrorRatio { ratio: 0.25 }
    );
    assert_eq!(rules[1].config().min_calls(), 20);
    assert_eq!(rules[1].config().window(), Duration::from_secs(10));
    assert_eq!(rules[1].config().open_duration(), Duration::from_secs(30));

    assert_eq!(rules[2].resource(), "GET:/orders");
    assert_eq!(
        rules[2].config().strategy(),
        Strategy::ErrorCount { count: 3 }
    );
    assert_eq!(rules[2].config().min_calls(), 5);
    assert_eq!(rules[2].config().window(), Duration::from_secs(60));
    assert_eq!(rules[2].config().open_duration(), Duration::from_secs(5));

    // The explicit default grade and integer or whole-double counts.
    let explicit = parse_one(&rule_with(r#""grade":0,"count":200,"timeWindow":1"#));
    assert_eq!(explicit.config().strategy(), slow(200, 1.0));
    let count = parse_one(&rule_with(r#""grade":2,"count":7,"timeWindow":1"#));
    assert_eq!(count.config().strategy(), Strategy::ErrorCount { count: 7 });
    let exponent = parse_one(&rule_with(r#""grade":2,"count":1e3,"timeWindow":1"#));
    assert_eq!(
        exponent.config().strategy(),
        Strategy::ErrorCount { count: 1000 }
    );
    let ratio = parse_one(&rule_with(r#""grade":1,"count":1,"timeWindow":1"#));
    assert_eq!(
        ratio.config().strategy(),
        Strategy::ErrorRatio { ratio: 1.0 }
    );
}

#[test]
fn absent_optional_fields_take_sentinels_defaults() {
    let rule = parse_one(r#"[{"resource":"/r","count":100,"timeWindow":5}]"#);
    let expected = BreakerConfig::slow_ratio(Duration::from_millis(100))
        .open_duration(Duration::from_secs(5))
        .build()
        .unwrap();
    assert_eq!(rule.config(), &expected);
    assert_eq!(rule.config().strategy(), slow(100, 1.0));
    assert_eq!(rule.config().min_calls(), 5);
    assert_eq!(rule.config().window(), Duration::from_millis(1000));

    let ratio = parse_one(r#"[{"resource":"/r","grade":1,"count":0.5,"timeWindow":5}]"#);
    assert_eq!(ratio.config().min_calls(), 5);
    assert_eq!(ratio.config().window(), Duration::from_secs(1));
}

#[test]
fn max_rt_is_rounded_half_up_like_sentinel() {
    for (count, millis) in [
        ("500.5", 501),
        ("500.4", 500),
        ("500.49999", 500),
        ("0.5", 1),
        ("0.3", 0),
        ("0", 0),
        ("-0.0", 0),
        ("1e3", 1000),
        ("18446744073709551615", u64::MAX),
    ] {
        let rule = parse_one(&rule_with(&format!(r#""count":{count},"timeWindow":1"#)));
        assert_eq!(rule.config().strategy(), slow(millis, 1.0), "{count}");
    }
}

#[test]
fn extreme_in_range_values_are_accepted() {
    let rule = parse_one(&rule_with(
        r#""grade":2,"count":18446744073709551615,"timeWindow":2147483647,
               "minRequestAmount":2147483647,"statIntervalMs":2147483647"#,
    ));
    assert_eq!(
        rule.config().strategy(),
        Strategy::ErrorCount { count: u64::MAX }
    );
    assert_eq!(
        rule.config().open_duration(),
        Duration::from_secs(2_147_483_647)
    );
    assert_eq!(rule.config().min_calls(), 2_147_483_647);
    assert_eq!(rule.config().window(), Duration::from_millis(2_147_483_647));

    let minimal = parse_one(&rule_with(
        r#""grade":2,"count":0,"timeWindow":1,"minRequestAmount":1,"statIntervalMs":1"#,
    ));
    assert_eq!(
        minimal.config().strategy(),
        Strategy::ErrorCount { count: 0 }
    );
    assert_eq!(minimal.config().window(), Duration::from_millis(1));

    let ratios = parse_one(&rule_with(
        r#""grade":0,"count":1,"timeWindow":1,"slowRatioThreshold":0"#,
    ));
    assert_eq!(ratios.config().strategy(), slow(1, 0.0));
    let zero = parse_one(&rule_with(r#""grade":1,"count":0,"timeWindow":1"#));
    assert_eq!(
        zero.config().strategy(),
        Strategy::ErrorRatio { ratio: 0.0 }
    );
}

#[test]
fn invalid_rules_name_resource_field_value_and_range() {
    // (fields after `"resource":"/r",`, field, value as shown)
    let cases: &[(&str, &str, &str)] = &[
        // grade
        (r#""grade":3,"count":1,"timeWindow":1"#, "grade", "3"),
        (r#""grade":-1,"count":1,"timeWindow":1"#, "grade", "-1"),
        (r#""grade":0.0,"count":1,"timeWindow":1"#, "grade", "0.0"),
        (r#""grade":"0","count":1,"timeWindow":1"#, "grade", "\"0\""),
        (r#""grade":null,"count":1,"timeWindow":1"#, "grade", "null"),
        (r#""grade":true,"count":1,"timeWindow":1"#, "grade", "true"),
        // count, grade 0
        (r#""count":-1,"timeWindow":1"#, "count", "-1"),
        (r#""count":-0.4,"timeWindow":1"#, "count", "-0.4"),
        (r#""count":"500","timeWindow":1"#, "count", "\"500\""),
        (r#""count":null,"timeWindow":1"#, "count", "null"),
        (r#""count":[500],"timeWindow":1"#, "count", "[500]"),
        (r#""timeWindow":1"#, "count", "(missing)"),
        (r#""count":1e20,"timeWindow":1"#, "count", "1e+20"),
        // count, grade 1
        (r#""grade":1,"count":1.5,"timeWindow":1"#, "count", "1.5"),
        (r#""grade":1,"count":-0.1,"timeWindow":1"#, "count", "-0.1"),
        (
            r#""grade":1,"count":"0.5","timeWindow":1"#,
            "count",
            "\"0.5\"",
        ),
        (r#""grade":1,"timeWindow":1"#, "count", "(missing)"),
        // count, grade 2
        (r#""grade":2,"count":2.5,"timeWindow":1"#, "count", "2.5"),
        (r#""grade":2,"count":-1,"timeWindow":1"#, "count", "-1"),
        (r#""grade":2,"count":"3","timeWindow":1"#, "count", "\"3\""),
        (
            r#""grade":2,"count":false,"timeWindow":1"#,
            "count",
            "false",
        ),
        (
            r#""grade":2,"count":18446744073709551616,"timeWindow":1"#,
            "count",
            "1.8446744073709552e+19",
        ),
        // timeWindow
        (r#""count":1,"timeWindow":0"#, "timeWindow", "0"),
        (r#""count":1"#, "timeWindow", "(missing)"),
        (r#""count":1,"timeWindow":-10"#, "timeWindow", "-10"),
        (r#""count":1,"timeWindow":1.5"#, "timeWindow", "1.5"),
        (r#""count":1,"timeWindow":10.0"#, "timeWindow", "10.0"),
        (r#""count":1,"timeWindow":1e1"#, "timeWindow", "10.0"),
        (r#""count":1,"timeWindow":"10""#, "timeWindow", "\"10\""),
        (r#""count":1,"timeWindow":null"#, "timeWindow", "null"),
        (r#""count":1,"timeWindow":true"#, "timeWindow", "true"),
        (
            r#""count":1,"timeWindow":2147483648"#,
            "timeWindow",
            "2147483648",
        ),
        // minRequestAmount
        (
            r#""count":1,"timeWindow":1,"minRequestAmount":0"#,
            "minRequestAmount",
            "0",
        ),
        (
            r#""count":1,"timeWindow":1,"minRequestAmount":-5"#,
            "minRequestAmount",
            "-5",
        ),
        (
            r#""count":1,"timeWindow":1,"minRequestAmount":2.5"#,
            "minRequestAmount",
            "2.5",
        ),
        (
            r#""count":1,"timeWindow":1,"minRequestAmount":"5""#,
            "minRequestAmount",
            "\"5\"",
        ),
        (
            r#""count":1,"timeWindow":1,"minRequestAmount":null"#,
            "minRequestAmount",
            "null",
        ),
        // statIntervalMs
        (
            r#""count":1,"timeWindow":1,"statIntervalMs":0"#,
            "statIntervalMs",
            "0",
        ),
        (
            r#""count":1,"timeWindow":1,"statIntervalMs":-1000"#,
            "statIntervalMs",
            "-1000",
        ),
        (
            r#""count":1,"timeWindow":1,"statIntervalMs":1000.5"#,
            "statIntervalMs",
            "1000.5",
        ),
        (
            r#""count":1,"timeWindow":1,"statIntervalMs":"1000""#,
            "statIntervalMs",
            "\"1000\"",
        ),
        (
            r#""count":1,"timeWindow":1,"statIntervalMs":null"#,
            "statIntervalMs",
            "null",
        ),
        // slowRatioThreshold (grade 0)
        (
            r#""count":1,"timeWindow":1,"slowRatioThreshold":1.2"#,
            "slowRatioThreshold",
            "1.2",
        ),
        (
            r#""count":1,"timeWindow":1,"slowRatioThreshold":-0.1"#,
            "slowRatioThreshold",
            "-0.1",
        ),
        (
            r#""count":1,"timeWindow":1,"slowRatioThreshold":"0.5""#,
            "slowRatioThreshold",
            "\"0.5\"",
        ),
        (
            r#""count":1,"timeWindow":1,"slowRatioThreshold":null"#,
            "slowRatioThreshold",
            "null",
        ),
        // regex
        (r#""regex":true,"count":1,"timeWindow":1"#, "regex", "true"),
        (
            r#""regex":"false","count":1,"timeWindow":1"#,
            "regex",
            "\"false\"",
        ),
        (r#""regex":null,"count":1,"timeWindow":1"#, "regex", "null"),
    ];
    for (fields, field, value) in cases {
        assert_invalid(&rule_with(fields), 0, Some("/r"), field, value);
    }
}

#[test]
fn invalid_resources_are_named_without_a_resource() {
    let cases: &[(&str, &str)] = &[
        (r#"{"count":1,"timeWindow":1}"#, "(missing)"),
        (r#"{"resource":"","count":1,"timeWindow":1}"#, "\"\""),
        (
            r#"{"resource":"  \t","count":1,"timeWindow":1}"#,
            "\"  \\t\"",
        ),
        (r#"{"resource":42,"count":1,"timeWindow":1}"#, "42"),
        (r#"{"resource":null,"count":1,"timeWindow":1}"#, "null"),
        (
            r#"{"resource":["/r"],"count":1,"timeWindow":1}"#,
            "[\"/r\"]",
        ),
    ];
    for (rule, value) in cases {
        let json = format!("[{rule}]");
        let error = assert_invalid(&json, 0, None, "resource", value);
        assert!(error.to_string().contains("non-blank"), "{error}");
    }
    // A resource error comes first, even when other fields are wrong too.
    assert_invalid(r#"[{"timeWindow":0}]"#, 0, None, "resource", "(missing)");
}

#[test]
fn error_message_matches_the_house_format() {
    let error = error_of(
        r#"[{"resource":"/a","count":1,"timeWindow":1},
                {"resource":"/b","grade":2,"count":3,"timeWindow":1},
                {"resource":"GET:/orders","count":1,"timeWindow":0}]"#,
    );
    assert_eq!(
        error.to_string(),
        "invalid Sentinel degrade rule #2 (resource \"GET:/orders\"): `timeWindow` = 0 \
         (allowed: a JSON integer from 1 to 2147483647, in seconds (required))"
    );
    assert_eq!(error.entry(), Some(2));

    // The first invalid field in the documented order is reported.
    let error = error_of(&rule_with(r#""grade":1,"count":2,"timeWindow":0"#));
    assert_eq!(error.field(), Some("count"));
    let error = error_of(&rule_with(r#""grade":9,"count":-1"#));
    assert_eq!(error.field(), Some("grade"));
}

#[test]
fn each_grade_states_its_own_count_range() {
    let allowed = |fields: &str| {
        error_of(&rule_with(fields))
            .config_error()
            .unwrap()
            .allowed()
            .to_owned()
    };
    assert!(allowed(r#""count":-1,"timeWindow":1"#).contains("milliseconds"));
    assert!(allowed(r#""grade":1,"count":2,"timeWindow":1"#).contains("[0, 1]"));
    assert!(allowed(r#""grade":2,"count":2.5,"timeWindow":1"#).contains("whole"));
}

#[test]
fn resources_are_escaped_and_clipped_in_messages() {
    let long = "x".repeat(500);
    let error = error_of(&format!(
        r#"[{{"resource":"{long}","count":1,"timeWindow":0}}]"#
    ));
    assert_eq!(error.entry_name(), Some(long.as_str()));
    let message = error.to_string();
    assert!(
        message.contains(&format!("\"{}…", "x".repeat(79))),
        "{message}"
    );
    assert!(message.len() < 300, "{message}");

    let error = error_of(r#"[{"resource":"a\nb","count":1,"timeWindow":0}]"#);
    assert_eq!(error.entry_name(), Some("a\nb"));
    assert!(!error.to_string().contains('\n'));
    assert!(error.to_string().contains(r#"(resource "a\nb")"#));

    let error = error_of(&rule_with(&format!(
        r#""count":1,"timeWindow":"{}""#,
        "9".repeat(500)
    )));
    let shown = error.config_error().unwrap().value();
    assert_eq!(shown.chars().count(), MAX_SHOWN_CHARS + 1);
    assert!(shown.ends_with('…'));
}

#[test]
fn slow_ratio_threshold_is_ignored_for_error_grades() {
    for fields in [
        r#""grade":1,"count":0.5,"timeWindow":1,"slowRatioThreshold":5"#,
        r#""grade":1,"count":0.5,"timeWindow":1,"slowRatioThreshold":null"#,
        r#""grade":2,"count":1,"timeWindow":1,"slowRatioThreshold":"x""#,
    ] {
        let rule = parse_one(&rule_with(fields));
        assert!(rule.ignored_fields().is_empty(), "{fields}");
    }
}

#[test]
fn regex_false_is_accepted() {
    let rule = parse_one(&rule_with(r#""regex":false,"count":1,"timeWindow":1"#));
    assert_eq!(rule.resource(), "/r");
    assert!(rule.ignored_fields().is_empty());
}

#[test]
fn bookkeeping_is_accepted_and_unknown_fields_are_listed() {
    let rule = parse_one(
        r#"[{"id":null,"app":{"x":1},"ip":7,"port":"8719","limitApp":"other-app",
                 "gmtCreate":"2024-01-01 00:00:00","gmtModified":null,
                 "resource":"/r","count":1,"timeWindow":1,
                 "rtSlowRequestAmount":5,"passCount":0,"TimeWindow":99,"minRequestamount":1}]"#,
    );
    assert_eq!(
        rule.ignored_fields(),
        [
            "TimeWindow",
            "minRequestamount",
            "passCount",
            "rtSlowRequestAmount"
        ]
    );
    // The misspelt fields had no effect.
    assert_eq!(rule.config().min_calls(), 5);
    assert_eq!(rule.config().open_duration(), Duration::from_secs(1));

    // A misspelt required field is reported as missing.
    assert_invalid(
        &rule_with(r#""count":1,"TimeWindow":10"#),
        0,
        Some("/r"),
        "timeWindow",
        "(missing)",
    );
}

#[test]
fn sentinel_demo_file_is_read() {
    // sentinel-demo-dynamic-file-rule's DegradeRule.json: whole-double counts and the
    // pre-1.8 `passCount`.
    let rules = parse_degrade_rules(
        r#"[
  {"resource": "abc0", "count": 20.0, "grade": 0, "passCount": 0, "timeWindow": 10},
  {"resource": "abc1", "count": 15.0, "grade": 0, "passCount": 0, "timeWindow": 10}
]"#,
    )
    .unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].resource(), "abc0");
    assert_eq!(rules[0].config().strategy(), slow(20, 1.0));
    assert_eq!(rules[1].config().strategy(), slow(15, 1.0));
    assert_eq!(rules[1].ignored_fields(), ["passCount"]);
}

#[test]
fn duplicate_resources_are_all_kept_in_order() {
    let rules = parse_degrade_rules(
        r#"[{"resource":"/r","count":100,"timeWindow":1},
                {"resource":"/r","grade":2,"count":3,"timeWindow":2},
                {"resource":"/r","count":100,"timeWindow":1}]"#,
    )
    .unwrap();
    assert_eq!(rules.len(), 3);
    assert!(rules.iter().all(|rule| rule.resource() == "/r"));
    assert_eq!(rules[0].config().strategy(), slow(100, 1.0));
    assert_eq!(
        rules[1].config().strategy(),
        Strategy::ErrorCount { count: 3 }
    );
    assert_eq!(rules[0], rules[2]);
}

#[test]
fn a_field_given_twice_is_an_error_naming_it() {
    for (json, field) in [
        (
            r#"[{"resource":"a","count":100,"count":200,"timeWindow":10}]"#,
            "count",
        ),
        // Even with equal values, even when the first value alone would be invalid, and for
        // fields this reader ignores.
        (
            rule_with(r#""count":1,"count":1,"timeWindow":1"#).as_str(),
            "count",
        ),
        (
            rule_with(r#""count":1,"timeWindow":0,"timeWindow":4"#).as_str(),
            "timeWindow",
        ),
        (
            r#"[{"resource":"a","resource":"b","count":1,"timeWindow":1}]"#,
            "resource",
        ),
        (
            rule_with(r#""count":1,"timeWindow":1,"app":"x","app":null"#).as_str(),
            "app",
        ),
        (
            rule_with(r#""count":1,"timeWindow":1,"future":1,"future":2"#).as_str(),
            "future",
        ),
    ] {
        let error = error_of(json);
        assert!(error.is_duplicate(), "{json}: {error}");
        assert_eq!(error.entry(), Some(0), "{json}: {error}");
        assert_eq!(error.field(), Some(field), "{json}: {error}");
        assert_eq!(error.entry_name(), None, "{json}: {error}");
        assert_eq!(error.config_error(), None, "{json}: {error}");
        assert_eq!(error.location(), None, "{json}: {error}");
        assert_eq!(
            error.to_string(),
            format!("invalid Sentinel degrade rule #0: field `{field}` is given more than once")
        );
    }

    // The rule is named by its position; a repeat is found before any rule is validated.
    let error = error_of(
        r#"[{"resource":"a","count":1,"timeWindow":0},
            {"resource":"b","count":1,"timeWindow":1},
            {"resource":"c","grade":2,"grade":2,"count":3,"timeWindow":1}]"#,
    );
    assert_eq!((error.entry(), error.field()), (Some(2), Some("grade")));

    // Repeats elsewhere are errors too, named with where their object is.
    for (json, index, key, message) in [
        (
            rule_with(r#""count":1,"timeWindow":1,"extra":{"a":[{"x":1,"x":2}]}"#),
            Some(0),
            "extra.a[0].x",
            "invalid Sentinel degrade rule #0: key `x` is given more than once in `extra.a[0]`",
        ),
        (
            r#"{"resource":"a","count":1,"count":2}"#.to_owned(),
            None,
            "count",
            "invalid Sentinel degrade rule list: key `count` is given more than once in the \
             top-level object",
        ),
        (
            r#"{"rules":[{"count":1,"count":2}]}"#.to_owned(),
            None,
            "rules[0].count",
            "invalid Sentinel degrade rule list: key `count` is given more than once in `rules[0]`",
        ),
    ] {
        let error = error_of(&json);
        assert!(error.is_duplicate(), "{json}: {error}");
        assert_eq!(error.entry(), index, "{json}: {error}");
        assert_eq!(error.field(), Some(key), "{json}: {error}");
        assert_eq!(error.to_string(), message);
    }

    // Names are escaped and clipped in the message, and kept as written by the accessor.
    let error = error_of(&rule_with(
        r#""count":1,"timeWindow":1,"evil\nkey\u001b[0m":1,"evil\nkey\u001b[0m":2"#,
    ));
    assert_eq!(error.field(), Some("evil\nkey\u{1b}[0m"));
    assert_eq!(
        error.to_string(),
        r#"invalid Sentinel degrade rule #0: field `"evil\nkey\u{1b}[0m"` is given more than once"#
    );
    let long = "n".repeat(100_000);
    let error = error_of(&rule_with(&format!(
        r#""count":1,"timeWindow":1,"{long}":1,"{long}":2"#
    )));
    assert_eq!(error.field().map(str::len), Some(100_000));
    let message = error.to_string();
    assert!(message.chars().count() < 200, "{message}");
    assert!(message.contains('…'), "{message}");

    // Malformed JSON after a repeat is still reported as malformed JSON.
    let error = error_of(r#"[{"resource":"a","count":1,"count":2,"timeWindow":}]"#);
    assert!(!error.is_duplicate());
    assert!(error.location().is_some());
    // Other errors are not duplicates.
    assert!(!error_of(&rule_with(r#""count":1,"timeWindow":0"#)).is_duplicate());
    assert!(!error_of("{}").is_duplicate());
}

#[test]
fn resource_is_kept_as_written() {
    let rule = parse_one(r#"[{"resource":" GET:/Orders ","count":1,"timeWindow":1}]"#);
    assert_eq!(rule.resource(), " GET:/Orders ");
}

#[test]
fn document_shape_errors() {
    assert_eq!(parse_degrade_rules("[]").unwrap(), Vec::new());
    assert_eq!(parse_degrade_rules(" [ ] \n").unwrap(), Vec::new());

    for (json, shown) in [
        (
            r#"{"resource":"/r","count":1,"timeWindow":1}"#,
            "{\"count\"",
        ),
        ("null", "null"),
        ("42", "42"),
        ("\"[]\"", "\"[]\""),
    ] {
        let error = error_of(json);
        assert_eq!(error.entry(), None, "{json}");
        assert_eq!(error.field(), None);
        assert_eq!(error.entry_name(), None);
        assert_eq!(error.config_error(), None);
        assert_eq!(error.location(), None);
        let message = error.to_string();
        assert!(
            message.starts_with(&format!(
                "invalid Sentinel degrade rule list: the top level is {shown}"
            )),
            "{message}"
        );
        assert!(message.contains("allowed: a JSON array"), "{message}");
    }

    let error = error_of(r#"[{"resource":"/r","count":1,"timeWindow":1}, 5]"#);
    assert_eq!(error.entry(), Some(1));
    assert_eq!(error.field(), None);
    assert_eq!(error.entry_name(), None);
    assert_eq!(error.config_error(), None);
    assert_eq!(
        error.to_string(),
        "invalid Sentinel degrade rule #1: the rule is 5 (allowed: a JSON object of \
         DegradeRule fields)"
    );
    for element in ["null", "[]", "\"/r\"", "true"] {
        let error = error_of(&format!("[{element}]"));
        assert_eq!(error.entry(), Some(0), "{element}");
        assert!(error
            .to_string()
            .contains(&format!("the rule is {element} ")));
    }
}

#[test]
fn malformed_json_reports_line_and_column() {
    let error = error_of("[\n  {\"resource\": \"/r\", \"count\" 1}\n]");
    assert_eq!(error.location(), Some((2, 30)));
    assert_eq!(error.entry(), None);
    assert_eq!(error.field(), None);
    assert_eq!(error.config_error(), None);
    let message = error.to_string();
    assert!(
        message.starts_with("Sentinel degrade rule list is not valid JSON: "),
        "{message}"
    );
    assert!(message.contains("line 2 column 30"), "{message}");

    for json in [
        "",
        "   ",
        "[",
        "[{]",
        "[1,]",
        "[] []",
        "[1e999]",
        "[{\"a\":1,}]",
    ] {
        let error = error_of(json);
        assert!(error.location().is_some(), "{json}: {error}");
    }
}

#[test]
fn byte_order_mark_is_skipped() {
    let with_bom = format!("\u{feff}{SEED_RULE}");
    assert_eq!(
        parse_degrade_rules(&with_bom).unwrap(),
        parse_degrade_rules(SEED_RULE).unwrap()
    );
}

#[test]
fn builder_errors_are_renamed_to_sentinel_fields() {
    for (builder, sentinel) in [
        ("slow_ratio_threshold", "slowRatioThreshold"),
        ("error_ratio", "count"),
        ("min_requests", "minRequestAmount"),
        ("window", "statIntervalMs"),
        ("open_duration", "timeWindow"),
        ("buckets", "buckets"),
    ] {
        let renamed = sentinel_names(ConfigError::new(builder, 7, "some range"));
        assert_eq!(renamed.field(), sentinel);
        assert_eq!(renamed.value(), "7");
        assert_eq!(renamed.allowed(), "some range");
    }
}

#[test]
fn errors_are_send_sync_and_box_into_dyn_error() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<DocumentError>();
    assert_send_sync::<DegradeRule>();

    fn read(json: &str) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
        Ok(parse_degrade_rules(json)?.len())
    }
    assert_eq!(read(SEED_RULE).unwrap(), 1);
    let error = read(&rule_with(r#""count":1,"timeWindow":0"#)).unwrap_err();
    assert!(error.to_string().contains("`timeWindow` = 0"));
}

#[test]
fn no_input_panics() {
    let samples = [SEED_RULE, MIXED_RULES];
    let replacements = [
        '"', '{', '}', '[', ']', ':', ',', '-', '.', 'e', '0', '1', '2', '9', '\\', ' ',
    ];
    for sample in samples {
        for (index, _) in sample.char_indices() {
            let _ = parse_degrade_rules(&sample[..index]);
            for replacement in replacements {
                let mut mutated = String::with_capacity(sample.len());
                mutated.push_str(&sample[..index]);
                mutated.push(replacement);
                mutated.push_str(&sample[index + 1..]);
                match parse_degrade_rules(&mutated) {
                    Ok(rules) => {
                        for rule in &rules {
                            assert!(!rule.resource().trim().is_empty());
                            assert!(rule.config().min_calls() >= 1);
                            assert!(!rule.config().open_duration().is_zero());
                        }
                    }
                    Err(error) => {
                        let _ = error.to_string();
                    }
                }
            }
        }
    }

    // Deep nesting is refused by serde_json's recursion limit, not by overflowing the stack.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(parse_degrade_rules(&deep).is_err());
    let deep_field = format!(
        r#"[{{"resource":"/r","count":1,"timeWindow":1,"x":{}{}}}]"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert!(parse_degrade_rules(&deep_field).is_err());

    // A small deterministic generator over JSON-ish tokens.
    let tokens = [
        "[",
        "]",
        "{",
        "}",
        ":",
        ",",
        "\"resource\"",
        "\"/r\"",
        "\"grade\"",
        "\"count\"",
        "\"timeWindow\"",
        "\"minRequestAmount\"",
        "\"statIntervalMs\"",
        "\"slowRatioThreshold\"",
        "\"regex\"",
        "true",
        "false",
        "null",
        "0",
        "1",
        "2",
        "-1",
        "0.5",
        "1.5",
        "1e999",
        "18446744073709551616",
        " ",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let mut text = String::new();
        let length = next() % 32;
        for _ in 0..length {
            text.push_str(tokens[(next() % tokens.len() as u64) as usize]);
        }
        match parse_degrade_rules(&text) {
            Ok(rules) => {
                for rule in rules {
                    let _ = rule.config().strategy();
                }
            }
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
}
