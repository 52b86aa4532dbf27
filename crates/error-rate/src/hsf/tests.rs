use super::*;
use tower_outlier_core::text::MAX_SHOWN_CHARS;
use tower_outlier_core::BudgetFloor;

/// The application-level example from HSF's documentation, verbatim.
const APPLICATION_SAMPLE: &str = r#"{ "DEFAULT": { "errorRateThreshold":0.5, "isolationTime":60000, "maxIsolationRate":0.2, "maxIsolationTimeMultiple":15, "qosEnabled":true, "requestThreshold":20, "timeWindowInSeconds":10, "ipDimension":true } }"#;

/// The service-level example from HSF's documentation, verbatim.
const SERVICE_SAMPLE: &str = r#"{ "DEFAULT": { "errorRateThreshold":0.5, "isolationTime":60000, "maxIsolationRate":0.2, "maxIsolationTimeMultiple":15, "qosEnabled":true, "requestThreshold":20, "timeWindowInSeconds":10 }, "service:version": { "errorRateThreshold":0.5, "isolationTime":60000, "maxIsolationRate":0.2, "maxIsolationTimeMultiple":15, "qosEnabled":true, "requestThreshold":20, "timeWindowInSeconds":10 } }"#;

fn assert_documented_values(config: &ErrorRateConfig) {
    assert!(config.enabled());
    assert_eq!(config.error_rate_threshold(), 0.5);
    assert_eq!(config.recovery().unit(), Duration::from_millis(60_000));
    assert_eq!(config.budget().max_ratio(), 0.2);
    assert_eq!(config.budget().floor(), BudgetFloor::One);
    assert_eq!(config.recovery().max_multiple(), 15);
    assert_eq!(config.min_calls(), 20);
    assert_eq!(config.window(), Duration::from_secs(10));
}

fn error_of(json: &str) -> DocumentError {
    match HsfQosConfig::from_json(json) {
        Ok(config) => panic!("{json} was accepted as {config:?}"),
        Err(error) => error,
    }
}

/// The error names `key`, shows `value` and states an allowed range, in Display and in the
/// accessors.
fn assert_invalid(json: &str, key: &str, value: &str) {
    let error = error_of(json);
    assert_eq!(error.field(), Some(key), "{json}: {error}");
    let detail = error.config_error().expect("a value error");
    assert_eq!(detail.value(), value, "{json}: {error}");
    let message = error.to_string();
    assert!(message.contains(&format!("`{key}`")), "{message}");
    assert!(message.contains(&format!("= {value} ")), "{message}");
    assert!(
        message.contains(&format!("(allowed: {})", detail.allowed())),
        "{message}"
    );
    assert!(!detail.allowed().is_empty());
}

#[test]
fn application_sample_resolves_to_the_documented_values() {
    let hsf = HsfQosConfig::from_json(APPLICATION_SAMPLE).unwrap();
    assert_documented_values(&hsf.application().unwrap());
    assert_eq!(hsf.services().count(), 0);
    assert!(hsf.ignored_keys().is_empty());
    assert_eq!(hsf.ip_dimension("DEFAULT"), Some(true));
    assert_eq!(hsf.biz_exception_predicate_class_name("DEFAULT"), None);
    // A service without a block inherits the application level.
    assert_eq!(hsf.service("any:1.0").unwrap(), hsf.application().unwrap());
}

#[test]
fn service_sample_resolves_to_the_documented_values() {
    let hsf: HsfQosConfig = SERVICE_SAMPLE.parse().unwrap();
    assert_eq!(hsf.services().collect::<Vec<_>>(), ["service:version"]);
    assert_documented_values(&hsf.application().unwrap());
    assert_documented_values(&hsf.service("service:version").unwrap());
    assert_eq!(hsf.ip_dimension("service:version"), None);
    assert!(hsf.ignored_keys().is_empty());
}

#[test]
fn service_level_wins_key_by_key() {
    let hsf = HsfQosConfig::from_json(
        r#"{
            "DEFAULT": { "qosEnabled": true, "errorRateThreshold": 0.5, "requestThreshold": 20,
                         "bizExceptionPredicateClassName": "com.foo.AppPredicate" },
            "com.foo.Service:1.0.0": { "errorRateThreshold": 0.3, "isolationTime": 5000 },
            "com.foo.Off:1.0.0": { "qosEnabled": false }
        }"#,
    )
    .unwrap();
    let service = hsf.service("com.foo.Service:1.0.0").unwrap();
    assert!(service.enabled());
    assert_eq!(service.error_rate_threshold(), 0.3);
    assert_eq!(service.recovery().unit(), Duration::from_secs(5));
    assert_eq!(service.min_calls(), 20);
    // Neither block sets these: HSF's built-in defaults.
    assert_eq!(service.window(), Duration::from_secs(10));
    assert_eq!(service.budget().max_ratio(), 0.2);
    assert_eq!(service.recovery().max_multiple(), 60);
    assert_eq!(
        hsf.biz_exception_predicate_class_name("com.foo.Service:1.0.0"),
        Some("com.foo.AppPredicate")
    );

    assert!(!hsf.service("com.foo.Off:1.0.0").unwrap().enabled());
    let application = hsf.application().unwrap();
    assert_eq!(application.error_rate_threshold(), 0.5);
    assert_eq!(application.recovery().unit(), Duration::from_secs(60));
    assert_eq!(
        hsf.services().collect::<Vec<_>>(),
        ["com.foo.Off:1.0.0", "com.foo.Service:1.0.0"]
    );
}

#[test]
fn qos_is_disabled_unless_some_layer_enables_it() {
    let hsf = HsfQosConfig::from_json(
        r#"{ "DEFAULT": { "errorRateThreshold": 0.4 }, "svc:1": { "requestThreshold": 5 } }"#,
    )
    .unwrap();
    assert!(!hsf.application().unwrap().enabled());
    assert!(!hsf.service("svc:1").unwrap().enabled());

    let empty = HsfQosConfig::default();
    let expected = ErrorRateConfig::hsf().enabled(false).build().unwrap();
    assert_eq!(empty.application().unwrap(), expected);
    assert_eq!(HsfQosConfig::from_json("{}").unwrap(), empty);

    let enabled_by_service =
        HsfQosConfig::from_json(r#"{ "svc:1": { "qosEnabled": true } }"#).unwrap();
    assert!(enabled_by_service.service("svc:1").unwrap().enabled());
    assert!(!enabled_by_service.application().unwrap().enabled());
}

#[test]
fn process_properties_sit_below_default() {
    let properties = [
        ("hsf.qos.enable", "TRUE"),
        ("hsf.qos.time.window.in.seconds", "20"),
        ("hsf.qos.request.threshold", "30"),
        ("hsf.qos.error.rate.threshold", "0.25"),
        ("hsf.qos.max.isolation.rate", " 0.6 "),
        ("hsf.qos.isolation.time", "30000"),
        ("-Dhsf.qos.max.isolation.time.multiple", "20"),
        ("hsf.qos.biz.exception.class.name", "com.foo.Predicate"),
        ("java.version", "17"),
        ("hsf.qos.future.knob", "1"),
    ];
    let only_d = HsfQosConfig::default()
        .with_process_properties(properties)
        .unwrap();
    let config = only_d.application().unwrap();
    assert!(config.enabled());
    assert_eq!(config.window(), Duration::from_secs(20));
    assert_eq!(config.min_calls(), 30);
    assert_eq!(config.error_rate_threshold(), 0.25);
    assert_eq!(config.budget().max_ratio(), 0.6);
    assert_eq!(config.recovery().unit(), Duration::from_secs(30));
    assert_eq!(config.recovery().max_multiple(), 20);
    assert_eq!(
        only_d.biz_exception_predicate_class_name("DEFAULT"),
        Some("com.foo.Predicate")
    );
    assert_eq!(only_d.ignored_keys(), ["-Dhsf.qos.future.knob"]);

    let layered = HsfQosConfig::from_json(
        r#"{ "DEFAULT": { "qosEnabled": false, "requestThreshold": 20 },
             "svc:1": { "requestThreshold": 40, "qosEnabled": true } }"#,
    )
    .unwrap()
    .with_process_properties(properties)
    .unwrap();
    let application = layered.application().unwrap();
    assert!(!application.enabled());
    assert_eq!(application.min_calls(), 20);
    assert_eq!(application.window(), Duration::from_secs(20));
    let service = layered.service("svc:1").unwrap();
    assert!(service.enabled());
    assert_eq!(service.min_calls(), 40);
    assert_eq!(service.error_rate_threshold(), 0.25);
}

#[test]
fn later_process_properties_replace_earlier_ones() {
    let hsf = HsfQosConfig::default()
        .with_process_properties([
            ("hsf.qos.request.threshold", "5"),
            ("hsf.qos.request.threshold", "7"),
            ("hsf.qos.unknown", "x"),
        ])
        .unwrap()
        .with_process_properties([("hsf.qos.enable", "true"), ("hsf.qos.unknown", "y")])
        .unwrap();
    let config = hsf.application().unwrap();
    assert_eq!(config.min_calls(), 7);
    assert!(config.enabled());
    assert_eq!(hsf.ignored_keys(), ["-Dhsf.qos.unknown"]);
}

#[test]
fn invalid_process_properties_name_the_parameter() {
    let cases = [
        ("hsf.qos.enable", "yes", "\"yes\""),
        ("hsf.qos.enable", "", "\"\""),
        ("hsf.qos.isolation.time", "0", "\"0\""),
        ("hsf.qos.isolation.time", "60000.5", "\"60000.5\""),
        ("hsf.qos.request.threshold", "-3", "\"-3\""),
        ("hsf.qos.time.window.in.seconds", "ten", "\"ten\""),
        ("hsf.qos.error.rate.threshold", "1.5", "\"1.5\""),
        ("hsf.qos.error.rate.threshold", "NaN", "\"NaN\""),
        ("hsf.qos.max.isolation.rate", "inf", "\"inf\""),
        (
            "hsf.qos.max.isolation.time.multiple",
            "4294967296",
            "\"4294967296\"",
        ),
        ("hsf.qos.biz.exception.class.name", "  ", "\"  \""),
    ];
    for (name, value, shown) in cases {
        let error = HsfQosConfig::default()
            .with_process_properties([(name, value)])
            .unwrap_err();
        let key = format!("-D{name}");
        assert_eq!(error.field(), Some(key.as_str()), "{error}");
        let detail = error.config_error().unwrap();
        assert_eq!(detail.value(), shown);
        let message = error.to_string();
        assert!(
            message.contains(&format!("`{key}` = {shown} (allowed: ")),
            "{message}"
        );
    }
}

#[test]
fn invalid_values_name_the_qualified_key_value_and_range() {
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"{"DEFAULT":{"errorRateThreshold":1.5}}"#,
            "DEFAULT.errorRateThreshold",
            "1.5",
        ),
        (
            r#"{"DEFAULT":{"errorRateThreshold":-0.1}}"#,
            "DEFAULT.errorRateThreshold",
            "-0.1",
        ),
        (
            r#"{"svc:1.0":{"errorRateThreshold":1e308}}"#,
            "svc:1.0.errorRateThreshold",
            "1e+308",
        ),
        (
            r#"{"svc:1.0":{"maxIsolationRate":2}}"#,
            "svc:1.0.maxIsolationRate",
            "2",
        ),
        (
            r#"{"DEFAULT":{"errorRateThreshold":"0.5"}}"#,
            "DEFAULT.errorRateThreshold",
            "\"0.5\"",
        ),
        (
            r#"{"DEFAULT":{"isolationTime":0}}"#,
            "DEFAULT.isolationTime",
            "0",
        ),
        (
            r#"{"DEFAULT":{"isolationTime":-60000}}"#,
            "DEFAULT.isolationTime",
            "-60000",
        ),
        (
            r#"{"DEFAULT":{"isolationTime":18446744073709551616}}"#,
            "DEFAULT.isolationTime",
            "1.8446744073709552e+19",
        ),
        (
            r#"{"DEFAULT":{"requestThreshold":0}}"#,
            "DEFAULT.requestThreshold",
            "0",
        ),
        (
            r#"{"DEFAULT":{"requestThreshold":1e30}}"#,
            "DEFAULT.requestThreshold",
            "1e+30",
        ),
        (
            r#"{"DEFAULT":{"timeWindowInSeconds":10.5}}"#,
            "DEFAULT.timeWindowInSeconds",
            "10.5",
        ),
        (
            r#"{"DEFAULT":{"timeWindowInSeconds":10.0}}"#,
            "DEFAULT.timeWindowInSeconds",
            "10.0",
        ),
        (
            r#"{"DEFAULT":{"timeWindowInSeconds":"10"}}"#,
            "DEFAULT.timeWindowInSeconds",
            "\"10\"",
        ),
        (
            r#"{"DEFAULT":{"maxIsolationTimeMultiple":4294967296}}"#,
            "DEFAULT.maxIsolationTimeMultiple",
            "4294967296",
        ),
        (
            r#"{"DEFAULT":{"maxIsolationTimeMultiple":0}}"#,
            "DEFAULT.maxIsolationTimeMultiple",
            "0",
        ),
        (
            r#"{"DEFAULT":{"qosEnabled":"true"}}"#,
            "DEFAULT.qosEnabled",
            "\"true\"",
        ),
        (r#"{"DEFAULT":{"qosEnabled":1}}"#, "DEFAULT.qosEnabled", "1"),
        (
            r#"{"svc:1.0":{"ipDimension":null}}"#,
            "svc:1.0.ipDimension",
            "null",
        ),
        (
            r#"{"DEFAULT":{"requestThreshold":[20]}}"#,
            "DEFAULT.requestThreshold",
            "[20]",
        ),
        (
            r#"{"DEFAULT":{"errorRateThreshold":{"value":0.5}}}"#,
            "DEFAULT.errorRateThreshold",
            r#"{"value":0.5}"#,
        ),
        (
            r#"{"DEFAULT":{"bizExceptionPredicateClassName":""}}"#,
            "DEFAULT.bizExceptionPredicateClassName",
            "\"\"",
        ),
        (
            r#"{"DEFAULT":{"bizExceptionPredicateClassName":42}}"#,
            "DEFAULT.bizExceptionPredicateClassName",
            "42",
        ),
        // A block that is not an object is named by the block alone.
        (r#"{"DEFAULT":[1,2]}"#, "DEFAULT", "[1,2]"),
        (r#"{"svc:1.0":true}"#, "svc:1.0", "true"),
    ];
    for (json, key, value) in cases {
        assert_invalid(json, key, value);
    }
}

#[test]
fn an_invalid_block_fails_even_when_it_is_never_resolved() {
    let json = r#"{ "DEFAULT": { "qosEnabled": true }, "unused:1.0": { "isolationTime": 0 } }"#;
    assert_invalid(json, "unused:1.0.isolationTime", "0");
}

#[test]
fn top_level_must_be_an_object() {
    for (json, shown) in [
        ("[]", "[]"),
        (r#"[{"DEFAULT":{}}]"#, r#"[{"DEFAULT":{}}]"#),
        ("null", "null"),
        ("0.5", "0.5"),
        (r#""DEFAULT""#, r#""DEFAULT""#),
    ] {
        let error = error_of(json);
        assert_eq!(error.field(), None);
        assert_eq!(error.config_error(), None);
        assert_eq!(error.location(), None);
        let message = error.to_string();
        assert!(
            message.contains(&format!("the top level is {shown} (allowed: a JSON object")),
            "{message}"
        );
    }
}

#[test]
fn malformed_json_reports_serde_json_position() {
    let error = error_of("{ \"DEFAULT\": {\n  \"qosEnabled\": tru } }");
    assert_eq!(error.field(), None);
    let (line, _) = error.location().unwrap();
    assert_eq!(line, 2);
    let message = error.to_string();
    assert!(message.starts_with("HSF QoS configuration is not valid JSON: "));
    assert!(message.contains("line 2 column"), "{message}");

    for json in [
        "",
        "{",
        "{\"DEFAULT\":}",
        "{'DEFAULT':{}}",
        "{\"DEFAULT\":{\"errorRateThreshold\":1e400}}",
        "{} trailing",
    ] {
        let error = error_of(json);
        assert!(error.location().is_some(), "{json}: {error}");
        assert!(error.to_string().contains("line "), "{json}: {error}");
    }
}

#[test]
fn unknown_keys_are_ignored_and_listed() {
    let hsf = HsfQosConfig::from_json(
        r#"{ "DEFAULT": { "qosEnabled": true, "errorratethreshold": 0.9, "newKey": [1] },
             "svc:1": { "future": {} } }"#,
    )
    .unwrap();
    assert_eq!(
        hsf.ignored_keys(),
        [
            "DEFAULT.errorratethreshold",
            "DEFAULT.newKey",
            "svc:1.future"
        ]
    );
    assert_eq!(hsf.application().unwrap().error_rate_threshold(), 0.5);
}

#[test]
fn byte_order_mark_is_skipped() {
    let with_bom = format!("\u{feff}{APPLICATION_SAMPLE}");
    assert_eq!(
        HsfQosConfig::from_json(&with_bom).unwrap(),
        HsfQosConfig::from_json(APPLICATION_SAMPLE).unwrap()
    );
}

#[test]
fn long_values_are_clipped_in_errors() {
    let long = "x".repeat(500);
    let json = format!(r#"{{"DEFAULT":{{"isolationTime":"{long}"}}}}"#);
    let error = error_of(&json);
    let shown = error.config_error().unwrap().value();
    assert_eq!(shown.chars().count(), MAX_SHOWN_CHARS + 1);
    assert!(shown.ends_with('…'));
}

#[test]
fn extreme_in_range_values_resolve() {
    let hsf = HsfQosConfig::from_json(
        r#"{ "DEFAULT": { "qosEnabled": true, "errorRateThreshold": 0, "maxIsolationRate": 1,
             "isolationTime": 18446744073709551615, "maxIsolationTimeMultiple": 4294967295,
             "requestThreshold": 18446744073709551615,
             "timeWindowInSeconds": 18446744073 } }"#,
    )
    .unwrap();
    let config = hsf.application().unwrap();
    assert_eq!(config.error_rate_threshold(), 0.0);
    assert_eq!(config.budget().max_ratio(), 1.0);
    assert_eq!(config.recovery().max_multiple(), u32::MAX);
    assert_eq!(config.min_calls(), u64::MAX);
    assert_eq!(config.window(), Duration::from_secs(18_446_744_073));

    let minimal = HsfQosConfig::from_json(
        r#"{ "DEFAULT": { "isolationTime": 1, "maxIsolationTimeMultiple": 1,
             "requestThreshold": 1, "timeWindowInSeconds": 1 } }"#,
    )
    .unwrap();
    assert!(minimal.application().is_ok());
}

#[test]
fn errors_are_send_sync_and_box_into_dyn_error() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<DocumentError>();
    assert_send_sync::<HsfQosConfig>();

    fn read(json: &str) -> Result<ErrorRateConfig, Box<dyn std::error::Error + Send + Sync>> {
        Ok(HsfQosConfig::from_json(json)?.application()?)
    }
    assert!(read(APPLICATION_SAMPLE).is_ok());
    let error = read(r#"{"DEFAULT":{"requestThreshold":0}}"#).unwrap_err();
    assert!(error.to_string().contains("`DEFAULT.requestThreshold` = 0"));

    let wrapped = DocumentError::from(ConfigError::new("min_calls", 0, "at least 1"));
    assert_eq!(wrapped.field(), Some("min_calls"));
}

#[test]
fn no_input_panics() {
    let samples = [APPLICATION_SAMPLE, SERVICE_SAMPLE];
    let replacements = [
        '"', '{', '}', '[', ']', ':', ',', '-', '.', 'e', '0', '\\', ' ',
    ];
    for sample in samples {
        for (index, _) in sample.char_indices() {
            let _ = HsfQosConfig::from_json(&sample[..index]);
            for replacement in replacements {
                let mut mutated = String::with_capacity(sample.len());
                mutated.push_str(&sample[..index]);
                mutated.push(replacement);
                mutated.push_str(&sample[index + 1..]);
                if let Ok(config) = HsfQosConfig::from_json(&mutated) {
                    let _ = config.application();
                    for service in config.services() {
                        let _ = config.service(service);
                    }
                }
            }
        }
    }

    // Deep nesting is refused by serde_json's recursion limit, not by overflowing the stack.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(HsfQosConfig::from_json(&deep).is_err());
    let deep_block = format!(
        "{{\"DEFAULT\":{{\"x\":{}{}}}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert!(HsfQosConfig::from_json(&deep_block).is_err());

    // A small deterministic generator over JSON-ish tokens.
    let tokens = [
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        "\"DEFAULT\"",
        "\"svc:1\"",
        "\"qosEnabled\"",
        "\"isolationTime\"",
        "\"errorRateThreshold\"",
        "true",
        "null",
        "0",
        "-1",
        "1.5",
        "1e999",
        "\"x\"",
        " ",
    ];
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..5_000 {
        let mut text = String::new();
        for _ in 0..(state % 24) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            text.push_str(tokens[(state % tokens.len() as u64) as usize]);
        }
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        if let Ok(config) = HsfQosConfig::from_json(&text) {
            let _ = config.application();
        }
    }

    let _ = HsfQosConfig::default().with_process_properties([
        ("hsf.qos.isolation.time", "\u{0}"),
        ("hsf.qos.enable", "\u{feff}true"),
        ("", ""),
        ("-D", "x"),
    ]);
}

#[test]
fn a_block_given_twice_is_an_error_naming_it() {
    for (json, block) in [
        (
            r#"{"DEFAULT":{"qosEnabled":true},"DEFAULT":{"timeWindowInSeconds":5}}"#,
            "DEFAULT",
        ),
        // Even when both are equal, and even when another block lies between them.
        (
            r#"{"svc:1":{"qosEnabled":true},"DEFAULT":{},"svc:1":{"qosEnabled":true}}"#,
            "svc:1",
        ),
        (r#"{"svc:1":{},"svc:1":[]}"#, "svc:1"),
    ] {
        let error = error_of(json);
        assert!(error.is_duplicate(), "{json}: {error}");
        assert_eq!(error.field(), Some(block), "{json}: {error}");
        assert_eq!(error.config_error(), None);
        assert_eq!(error.location(), None);
        assert_eq!(
            error.to_string(),
            format!("invalid HSF QoS configuration: block `{block}` is given more than once")
        );
    }
    // Malformed JSON after the repeat is still reported as such.
    assert!(error_of(r#"{"DEFAULT":{},"DEFAULT":{"qosEnabled":tru}}"#)
        .location()
        .is_some());
}

#[test]
fn a_key_given_twice_in_a_block_is_an_error_naming_it() {
    for (json, key) in [
        (
            r#"{"DEFAULT":{"qosEnabled":true,"requestThreshold":5,"qosEnabled":false}}"#,
            "DEFAULT.qosEnabled",
        ),
        (
            r#"{"DEFAULT":{},"svc:1":{"isolationTime":5000,"isolationTime":5000}}"#,
            "svc:1.isolationTime",
        ),
        // Unknown keys too: which of the two would be listed as ignored is as arbitrary.
        (
            r#"{"DEFAULT":{"futureKey":1,"futureKey":2}}"#,
            "DEFAULT.futureKey",
        ),
    ] {
        let error = error_of(json);
        assert!(error.is_duplicate(), "{json}: {error}");
        assert_eq!(error.field(), Some(key), "{json}: {error}");
        assert_eq!(error.config_error(), None);
        assert_eq!(
            error.to_string(),
            format!("invalid HSF QoS configuration: key `{key}` is given more than once")
        );
    }
    // Repeats inside a value are not the reader's business: an unknown key's object may repeat.
    let hsf = HsfQosConfig::from_json(r#"{"DEFAULT":{"future":{"a":1,"a":2}}}"#).unwrap();
    assert_eq!(hsf.ignored_keys(), ["DEFAULT.future"]);
    // Other errors are not duplicates.
    assert!(!error_of(r#"{"DEFAULT":{"isolationTime":0}}"#).is_duplicate());
    assert!(!error_of("[]").is_duplicate());
    assert!(!error_of("{").is_duplicate());
}

#[test]
fn long_names_are_clipped_in_errors() {
    let long = "n".repeat(130_000);
    let cases = [
        // A block with an invalid value, a block that is not an object, a repeated block.
        format!(r#"{{"{long}":{{"isolationTime":0}}}}"#),
        format!(r#"{{"{long}":[1]}}"#),
        format!(r#"{{"{long}":{{}},"{long}":{{}}}}"#),
        // A repeated key, alone and under a long block name.
        format!(r#"{{"DEFAULT":{{"{long}":1,"{long}":2}}}}"#),
        format!(r#"{{"{long}":{{"{long}":1,"{long}":2}}}}"#),
    ];
    for json in &cases {
        let error = error_of(json);
        let message = error.to_string();
        assert!(
            message.chars().count() < 400,
            "{} chars: {}",
            message.chars().count(),
            message.chars().take(400).collect::<String>()
        );
        assert!(message.contains('…'), "{message}");
        // The accessor keeps the name as written.
        assert!(error.field().unwrap().len() >= 130_000);
    }
}

#[test]
fn control_characters_in_names_are_escaped_in_errors() {
    // JSON escapes, so the names hold a real newline and a real ESC.
    let block = r#"svc\n\u001b[31m:1"#;
    let key = r#"evil\nkey\u001b[0m"#;
    let cases = [
        (
            format!(r#"{{"{block}":{{"isolationTime":0}}}}"#),
            "svc\n\u{1b}[31m:1.isolationTime",
            r#""svc\n\u{1b}[31m:1".isolationTime"#,
        ),
        (
            format!(r#"{{"{block}":7}}"#),
            "svc\n\u{1b}[31m:1",
            r#""svc\n\u{1b}[31m:1""#,
        ),
        (
            format!(r#"{{"{block}":{{}},"{block}":{{}}}}"#),
            "svc\n\u{1b}[31m:1",
            r#""svc\n\u{1b}[31m:1""#,
        ),
        (
            format!(r#"{{"DEFAULT":{{"{key}":1,"{key}":2}}}}"#),
            "DEFAULT.evil\nkey\u{1b}[0m",
            r#"DEFAULT."evil\nkey\u{1b}[0m""#,
        ),
    ];
    for (json, raw, shown) in &cases {
        let error = error_of(json);
        assert_eq!(error.field(), Some(*raw));
        let message = error.to_string();
        assert!(!message.contains('\n'), "{message:?}");
        assert!(!message.contains('\u{1b}'), "{message:?}");
        assert!(message.contains(&format!("`{shown}`")), "{message:?}");
    }
}

#[test]
fn the_window_is_bounded_by_its_nanosecond_representation() {
    // (2⁶⁴ − 1) ns in whole seconds.
    let max = u64::MAX / 1_000_000_000;
    assert_eq!(max, 18_446_744_073);

    let hsf = HsfQosConfig::from_json(&format!(r#"{{"DEFAULT":{{"timeWindowInSeconds":{max}}}}}"#))
        .unwrap();
    assert_eq!(
        hsf.application().unwrap().window(),
        Duration::from_secs(max)
    );
    let hsf = HsfQosConfig::default()
        .with_process_properties([("hsf.qos.time.window.in.seconds", max.to_string().as_str())])
        .unwrap();
    assert_eq!(
        hsf.application().unwrap().window(),
        Duration::from_secs(max)
    );

    let above = max + 1;
    let json = format!(r#"{{"DEFAULT":{{"timeWindowInSeconds":{above}}}}}"#);
    assert_invalid(&json, "DEFAULT.timeWindowInSeconds", &above.to_string());
    assert_eq!(
        error_of(&json).to_string(),
        format!(
            "invalid HSF QoS configuration: `DEFAULT.timeWindowInSeconds` = {above} \
             (allowed: a JSON integer from 1 to {max}, in seconds)"
        )
    );
    let error = HsfQosConfig::default()
        .with_process_properties([("hsf.qos.time.window.in.seconds", above.to_string().as_str())])
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "invalid HSF QoS configuration: `-Dhsf.qos.time.window.in.seconds` = \"{above}\" \
             (allowed: an integer from 1 to {max}, in seconds)"
        )
    );
}
