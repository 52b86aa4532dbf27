//! The SOFARPC properties reader's tests.

use super::*;
use tower_outlier_core::text::MAX_SHOWN_CHARS;
use tower_outlier_core::FailureKind;

/// The property portion of the seed's example, verbatim (with its `ture`), on one line.
const SEED_ONE_LINE: &str = "Com.alipay.sofa.rpc.aft.time.window=20 Com.alipay.sofa.rpc.aft.least.window.count=30 Com.alipay.sofa.rpc.aft.least.window.exception.rate.multiple=6 Com.alipay.sofa.rpc.aft.weight.degrade.rate=0.5 Com.alipay.sofa.rpc.aft.weight.recover.rate=1.2 Com.alipay.sofa.rpc.aft.degrade.effective=ture Com.alipay.sofa.rpc.aft.degrade.least.weight=1 Com.alipay.sofa.rpc.aft.degrade.max.ip.count=2 Com.alipay.sofa.rpc.aft.regulation.effective=true";

/// The seed's text from `Example` on, prose included.
const SEED_WITH_PROSE: &str = "Com.alipay.sofa.rpc.aft.time.window=20 Com.alipay.sofa.rpc.aft.least.window.count=30 Com.alipay.sofa.rpc.aft.least.window.exception.rate.multiple=6 Com.alipay.sofa.rpc.aft.weight.degrade.rate=0.5 Com.alipay.sofa.rpc.aft.weight.recover.rate=1.2 Com.alipay.sofa.rpc.aft.degrade.effective=ture Com.alipay.sofa.rpc.aft.degrade.least.weight=1 Com.alipay.sofa.rpc.aft.degrade.max.ip.count=2 Com.alipay.sofa.rpc.aft.regulation.effective=trueAs configured above, the fault tolerance function and degradation switch are enabled. When a node fails too many times, its weight is degraded, and during recovery, the weight will be restored.";

fn corrected_one_line() -> String {
    SEED_ONE_LINE.replace("=ture", "=true")
}

fn corrected_per_line() -> String {
    corrected_one_line().replace(' ', "\n")
}

fn read(text: &str) -> SofaProperties {
    match SofaProperties::from_properties(text) {
        Ok(properties) => properties,
        Err(error) => panic!("{text:?} was rejected: {error}"),
    }
}

fn error_of(text: &str) -> DocumentError {
    match SofaProperties::from_properties(text) {
        Ok(properties) => panic!("{text:?} was accepted as {properties:?}"),
        Err(error) => error,
    }
}

/// The error names `key` and `value` (as written), in the accessors and in the message.
fn assert_invalid(text: &str, key: &str, value: &str) -> DocumentError {
    let error = error_of(text);
    assert_eq!(error.field().unwrap(), key, "{text:?}: {error}");
    assert_eq!(
        error.config_error().unwrap().value(),
        value,
        "{text:?}: {error}"
    );
    assert!(!error.is_unknown_field(), "{text:?}: {error}");
    assert!(!error.config_error().unwrap().allowed().is_empty());
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "`{key}` = {value:?} (allowed: {})",
            error.config_error().unwrap().allowed()
        )),
        "{message}"
    );
    error
}

fn assert_seed_values(config: &WeightConfig) {
    assert!(config.regulation_effective());
    assert!(config.degrade_effective());
    assert_eq!(config.window(), Duration::from_secs(20));
    assert_eq!(config.min_calls(), 30);
    assert_eq!(config.exception_rate_multiple(), 6.0);
    assert_eq!(config.degrade_rate(), 0.5);
    assert_eq!(config.recover_rate(), 1.2);
    assert_eq!(config.least_weight(), 1.0);
    assert_eq!(config.max_degraded(), 2);
    assert_eq!(config.original_weight(), 100.0);
}

/// The builder's defaults with SOFARPC's exception kinds, which the reader starts from.
fn defaults() -> WeightConfig {
    WeightConfig::builder()
        .exceptions(&[FailureKind::Timeout, FailureKind::Overload])
        .build()
        .unwrap()
}

#[test]
fn corrected_seed_on_one_line_reads_the_seed_values() {
    let properties = read(&corrected_one_line());
    assert_seed_values(&properties.config());
    assert_eq!(properties.builder().build().unwrap(), properties.config());
    assert!(properties.ignored_keys().is_empty());
    let normalised: Vec<(&str, &str)> = properties
        .normalised_keys()
        .iter()
        .map(|(written, canonical)| (written.as_str(), *canonical))
        .collect();
    assert_eq!(normalised.len(), 9);
    for (written, canonical) in normalised {
        assert_eq!(written, format!("C{}", &canonical[1..]));
    }
}

#[test]
fn corrected_seed_one_pair_per_line_reads_the_same() {
    let per_line = corrected_per_line();
    assert_eq!(per_line.lines().count(), 9);
    assert_eq!(read(&per_line), read(&corrected_one_line()));
    let crlf = per_line.replace('\n', "\r\n");
    assert_eq!(read(&crlf), read(&per_line));
    let cr = per_line.replace('\n', "\r");
    assert_eq!(read(&cr), read(&per_line));
    let parsed: SofaProperties = per_line.parse().unwrap();
    assert_seed_values(&parsed.config());
}

#[test]
fn seed_as_written_rejects_ture() {
    let error = assert_invalid(
        SEED_ONE_LINE,
        "Com.alipay.sofa.rpc.aft.degrade.effective",
        "ture",
    );
    assert_eq!(error.line(), Some(1));
    assert_eq!(
        error.config_error().unwrap().allowed(),
        "true or false, in any letter case"
    );
    assert_eq!(
        error.to_string(),
        "invalid SOFARPC fault-tolerance properties on line 1: \
         `Com.alipay.sofa.rpc.aft.degrade.effective` = \"ture\" \
         (allowed: true or false, in any letter case)"
    );

    let per_line = SEED_ONE_LINE.replace(' ', "\n");
    let error = assert_invalid(
        &per_line,
        "Com.alipay.sofa.rpc.aft.degrade.effective",
        "ture",
    );
    assert_eq!(error.line(), Some(6));
}

#[test]
fn true_running_into_prose_is_rejected() {
    let text =
        corrected_one_line().replace("regulation.effective=true", "regulation.effective=trueAs");
    let error = assert_invalid(
        &text,
        "Com.alipay.sofa.rpc.aft.regulation.effective",
        "trueAs",
    );
    assert_eq!(error.line(), Some(1));

    // The seed's paragraph as a whole: the prose words are not `key=value` pairs, so the line
    // is one pair, as Java reads it, and its value is not a number.
    let error = error_of(SEED_WITH_PROSE);
    assert_eq!(
        error.field().unwrap(),
        "Com.alipay.sofa.rpc.aft.time.window"
    );
    assert!(error
        .config_error()
        .unwrap()
        .value()
        .starts_with("20 Com.alipay"));
    assert!(error
        .config_error()
        .unwrap()
        .value()
        .ends_with("will be restored."));
    let message = error.to_string();
    assert!(message.contains("…"), "{message}");
    assert!(message.len() < 400, "{message}");
}

/// Whether a configuration shows a key's effect.
type Check = fn(&WeightConfig) -> bool;

#[test]
fn every_key_sets_its_builder_setting() {
    let base = defaults();
    let cases: [(&str, &str, Check); 9] = [
        ("regulation.effective", "true", |c| c.regulation_effective()),
        ("degrade.effective", "TRUE", |c| c.degrade_effective()),
        ("time.window", "7", |c| c.window() == Duration::from_secs(7)),
        ("least.window.count", "+44", |c| c.min_calls() == 44),
        ("least.window.exception.rate.multiple", "2.5", |c| {
            c.exception_rate_multiple() == 2.5
        }),
        ("weight.degrade.rate", "1", |c| c.degrade_rate() == 1.0),
        ("weight.recover.rate", "1.05", |c| c.recover_rate() == 1.05),
        ("degrade.least.weight", "100", |c| c.least_weight() == 100.0),
        ("degrade.max.ip.count", "0", |c| c.max_degraded() == 0),
    ];
    for (suffix, value, check) in cases {
        let key = format!("{PREFIX}{suffix}");
        let properties = read(&format!("{key}={value}"));
        let config = properties.config();
        assert!(check(&config), "{key}={value}: {config:?}");
        assert!(
            !check(&base),
            "{key}: the default already satisfies the check"
        );
        assert!(properties.normalised_keys().is_empty());
        assert!(properties.ignored_keys().is_empty());
    }
    assert_eq!(Key::ALL.len(), cases.len());
}

#[test]
fn nothing_written_keeps_the_defaults_both_switches_off() {
    for text in [
        "",
        "\n\n",
        "# nothing\n! still nothing\n",
        "\u{feff}",
        "  \t \r\n",
    ] {
        let properties = read(text);
        assert_eq!(properties.config(), defaults(), "{text:?}");
        assert!(!properties.config().regulation_effective());
        assert!(!properties.config().degrade_effective());
        assert!(properties.ignored_keys().is_empty());
    }
}

#[test]
fn switches_accept_true_and_false_in_any_case_only() {
    for (value, on) in [
        ("true", true),
        ("TRUE", true),
        ("True", true),
        ("false", false),
        ("FALSE", false),
        ("fAlSe", false),
    ] {
        let config = read(&format!(
            "com.alipay.sofa.rpc.aft.regulation.effective=true\n\
             com.alipay.sofa.rpc.aft.degrade.effective={value}"
        ))
        .config();
        assert_eq!(config.degrade_effective(), on, "{value}");
    }
    for value in [
        "ture",
        "trueAs",
        "yes",
        "no",
        "1",
        "0",
        "on",
        "t",
        "truee",
        "tru\u{e9}",
    ] {
        for suffix in ["regulation.effective", "degrade.effective"] {
            let key = format!("{PREFIX}{suffix}");
            assert_invalid(&format!("{key}={value}"), &key, value);
        }
    }
    let key = "com.alipay.sofa.rpc.aft.regulation.effective";
    let error = assert_invalid(key, key, "");
    assert_eq!(error.line(), Some(1));
    assert_invalid(&format!("{key}=  "), key, "");
    assert_invalid(&format!("{key}:"), key, "");
}

#[test]
fn invalid_numbers_name_the_key_the_value_and_the_range() {
    let cases = [
        // Not numbers at all.
        ("time.window", "ten"),
        ("time.window", "20s"),
        ("least.window.count", "thirty"),
        ("least.window.exception.rate.multiple", "six"),
        ("weight.degrade.rate", "50%"),
        ("weight.degrade.rate", "0,5"),
        ("weight.recover.rate", "1.2d"),
        ("degrade.least.weight", "one"),
        ("degrade.max.ip.count", "two"),
        ("time.window", ""),
        // Negative.
        ("weight.degrade.rate", "-0.5"),
        ("weight.recover.rate", "-2"),
        ("least.window.exception.rate.multiple", "-6"),
        ("degrade.least.weight", "-1"),
        ("degrade.max.ip.count", "-1"),
        ("time.window", "-20"),
        ("least.window.count", "-30"),
        // Zero where at least one is needed.
        ("time.window", "0"),
        ("least.window.count", "0"),
        ("least.window.exception.rate.multiple", "0"),
        ("weight.degrade.rate", "0"),
        ("weight.degrade.rate", "-0"),
        ("degrade.least.weight", "0"),
        // Fractional integers, however written.
        ("time.window", "20.5"),
        ("time.window", "20.0"),
        ("time.window", "1e3"),
        ("least.window.count", "30.0"),
        ("degrade.max.ip.count", "2.5"),
        ("degrade.max.ip.count", "2.0"),
        // Out of range.
        ("weight.degrade.rate", "1.5"),
        ("weight.recover.rate", "1"),
        ("weight.recover.rate", "0.5"),
        ("degrade.least.weight", "100.5"),
        ("degrade.least.weight", "1000"),
        ("time.window", "18446744073709551616"),
        ("least.window.count", "99999999999999999999999"),
        // Not finite.
        ("weight.degrade.rate", "NaN"),
        ("weight.recover.rate", "inf"),
        ("weight.recover.rate", "1e400"),
        ("least.window.exception.rate.multiple", "Infinity"),
        ("degrade.least.weight", "nan"),
        // A value with a backslash escape, or several words.
        ("time.window", "2\\0"),
        ("time.window", "20 # seconds"),
        ("time.window", "20 seconds"),
        ("weight.degrade.rate", "0.5 0.6"),
    ];
    for (suffix, value) in cases {
        let key = format!("{PREFIX}{suffix}");
        let error = assert_invalid(&format!("{key}={value}"), &key, value);
        assert_eq!(error.line(), Some(1));
    }

    let error = error_of("com.alipay.sofa.rpc.aft.time.window=0");
    assert_eq!(
        error.config_error().unwrap().allowed(),
        "an integer from 1 to 18446744073709551615, in seconds"
    );
    let error = error_of("com.alipay.sofa.rpc.aft.degrade.least.weight=101");
    assert_eq!(
        error.config_error().unwrap().allowed(),
        "a number in (0, 100] (the original weight)"
    );
    let error = error_of("com.alipay.sofa.rpc.aft.weight.recover.rate=1");
    assert_eq!(
        error.config_error().unwrap().allowed(),
        "a finite number greater than 1"
    );
}

#[test]
fn extreme_in_range_values_are_read() {
    let config = read(&format!(
        "com.alipay.sofa.rpc.aft.time.window=18446744073709551615\n\
         com.alipay.sofa.rpc.aft.least.window.count=18446744073709551615\n\
         com.alipay.sofa.rpc.aft.least.window.exception.rate.multiple=1e-300\n\
         com.alipay.sofa.rpc.aft.weight.degrade.rate=1e-300\n\
         com.alipay.sofa.rpc.aft.weight.recover.rate=1e300\n\
         com.alipay.sofa.rpc.aft.degrade.least.weight=.5\n\
         com.alipay.sofa.rpc.aft.degrade.max.ip.count={}",
        usize::MAX
    ))
    .config();
    assert_eq!(config.window(), Duration::from_secs(u64::MAX));
    assert_eq!(config.min_calls(), u64::MAX);
    assert_eq!(config.least_weight(), 0.5);
    assert_eq!(config.recover_rate(), 1e300);
    assert_eq!(config.max_degraded(), usize::MAX);

    let config = read(
        "com.alipay.sofa.rpc.aft.time.window=1\n\
         com.alipay.sofa.rpc.aft.least.window.count=1\n\
         com.alipay.sofa.rpc.aft.weight.degrade.rate=1\n\
         com.alipay.sofa.rpc.aft.weight.recover.rate=1.0000001\n\
         com.alipay.sofa.rpc.aft.degrade.least.weight=100.0\n\
         com.alipay.sofa.rpc.aft.degrade.max.ip.count=007",
    )
    .config();
    assert_eq!(config.window(), Duration::from_secs(1));
    assert_eq!(config.max_degraded(), 7);
}

#[test]
fn unknown_keys_under_the_prefix_are_errors() {
    for key in [
        "com.alipay.sofa.rpc.aft.time.windows",
        "com.alipay.sofa.rpc.aft.timewindow",
        "com.alipay.sofa.rpc.aft.time-window",
        "com.alipay.sofa.rpc.aft.regulation.effective.x",
        "com.alipay.sofa.rpc.aft.",
        "COM.ALIPAY.SOFA.RPC.AFT.DEGRADE.MAX.IP",
    ] {
        let text = format!("com.alipay.sofa.rpc.aft.regulation.effective=true\n\n{key}=20\n");
        let error = error_of(&text);
        assert!(error.is_unknown_field(), "{key}: {error}");
        assert_eq!(error.field().unwrap(), key);
        assert_eq!(error.config_error().unwrap().value(), "20");
        assert_eq!(error.line(), Some(3));
        assert!(
            error
                .config_error()
                .unwrap()
                .allowed()
                .contains("time.window"),
            "{error}"
        );
        assert!(
            error
                .config_error()
                .unwrap()
                .allowed()
                .contains("degrade.max.ip.count"),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            format!(
                "invalid SOFARPC fault-tolerance properties on line 3: unknown key `{key}` (allowed: \
                 com.alipay.sofa.rpc.aft. followed by one of regulation.effective, \
                 degrade.effective, time.window, least.window.count, \
                 least.window.exception.rate.multiple, weight.degrade.rate, \
                 weight.recover.rate, degrade.least.weight, degrade.max.ip.count)"
            )
        );
    }
}

#[test]
fn other_keys_are_ignored_and_listed() {
    let properties = read(
        "spring.application.name=demo app\n\
         com.alipay.sofa.rpc.bolt.port=12200\n\
         com.alipay.sofa.rpc.aft.time.window=20\n\
         com.alipay.sofa.rpc.aft-time-window=30\n\
         com.alipay.sofa.rpc.aftRegulationEffective=true\n\
         sofa.boot.rpc.aft-regulation-effective=true\n\
         com.alipay.sofa.rpc.aft=whatever\n\
         logging.pattern=%d %m%n\n\
         spring.datasource.url=jdbc:mysql://db/app?a=b&c=d\n\
         com.alipay.sofa.rpc.aft.least.window.count=30\n",
    );
    assert_eq!(
        properties.ignored_keys(),
        [
            "spring.application.name",
            "com.alipay.sofa.rpc.bolt.port",
            "com.alipay.sofa.rpc.aft-time-window",
            "com.alipay.sofa.rpc.aftRegulationEffective",
            "sofa.boot.rpc.aft-regulation-effective",
            "com.alipay.sofa.rpc.aft",
            "logging.pattern",
            "spring.datasource.url",
        ]
    );
    let config = properties.config();
    assert_eq!(config.window(), Duration::from_secs(20));
    assert_eq!(config.min_calls(), 30);
    assert!(!config.regulation_effective());
    // Invalid values of other keys are not looked at.
    read("server.port=not a number\nfoo.enabled=ture\n");
}

#[test]
fn comments_blank_lines_and_continuations() {
    let properties = read(
        "\u{feff}# SOFARPC fault tolerance\n\
         \n\
         ! the global switch\n\
         \x20\x20\t# indented comment\n\
         com.alipay.sofa.rpc.aft.regulation.effective=true\n\
         \t \n\
         com.alipay.sofa.rpc.aft.time.window=2\\\n\
         \x20\x20\x200\n\
         # a comment line ending in a backslash does not continue \\\n\
         com.alipay.sofa.rpc.aft.least.window.count=30\n\
         com.alipay.sofa.rpc.aft.\\\n\
         \x20\x20degrade.max.ip.count=5\n\
         other.key=line one \\\n\
         \x20\x20com.alipay.sofa.rpc.aft.degrade.effective=true\n",
    );
    let config = properties.config();
    assert!(config.regulation_effective());
    assert_eq!(config.window(), Duration::from_secs(20));
    assert_eq!(config.min_calls(), 30);
    assert_eq!(config.max_degraded(), 5);
    // Continued into another key's value: not a pair of its own.
    assert!(!config.degrade_effective());
    assert_eq!(properties.ignored_keys(), ["other.key"]);
    // An even number of backslashes does not continue: the value keeps them.
    let error = error_of("com.alipay.sofa.rpc.aft.weight.degrade.rate=0.25\\\\\n");
    assert_eq!(error.config_error().unwrap().value(), "0.25\\\\");
    assert!(error.to_string().contains(r#"= "0.25\\\\" "#), "{error}");

    // Line numbers count comments, blank lines and continuations; an error on a continued
    // line names the line it starts on.
    let error = error_of(
        "# comment\n\ncom.alipay.sofa.rpc.aft.time.window=2\\\n  0\ncom.alipay.sofa.rpc.aft.least.window.count=\\\n  x",
    );
    assert_eq!(
        error.field().unwrap(),
        "com.alipay.sofa.rpc.aft.least.window.count"
    );
    assert_eq!(error.config_error().unwrap().value(), "x");
    assert_eq!(error.line(), Some(5));
}

#[test]
fn separator_forms() {
    for text in [
        "com.alipay.sofa.rpc.aft.time.window=20",
        "com.alipay.sofa.rpc.aft.time.window = 20",
        "com.alipay.sofa.rpc.aft.time.window: 20",
        "com.alipay.sofa.rpc.aft.time.window:20",
        "com.alipay.sofa.rpc.aft.time.window : 20",
        "com.alipay.sofa.rpc.aft.time.window 20",
        "\t com.alipay.sofa.rpc.aft.time.window\t=\t20 \t",
        "com.alipay.sofa.rpc.aft.time.window=20\r\n",
    ] {
        let config = read(text).config();
        assert_eq!(config.window(), Duration::from_secs(20), "{text:?}");
    }
    // Only one separator is skipped; the second is part of the value.
    assert_invalid(
        "com.alipay.sofa.rpc.aft.time.window = = 20",
        "com.alipay.sofa.rpc.aft.time.window",
        "= 20",
    );
    assert_invalid(
        "com.alipay.sofa.rpc.aft.time.window:=20",
        "com.alipay.sofa.rpc.aft.time.window",
        "=20",
    );
    // `key: value` pairs several to a line are not split: each pair needs `=`.
    assert_invalid(
        "com.alipay.sofa.rpc.aft.time.window:20 com.alipay.sofa.rpc.aft.least.window.count:30",
        "com.alipay.sofa.rpc.aft.time.window",
        "20 com.alipay.sofa.rpc.aft.least.window.count:30",
    );
}

#[test]
fn several_pairs_on_a_line() {
    let properties = read(
        "com.alipay.sofa.rpc.aft.time.window = 20  com.alipay.sofa.rpc.aft.least.window.count=30\t\
         spring.application.name=demo com.alipay.sofa.rpc.aft.regulation.effective=true\n\
         com.alipay.sofa.rpc.aft.degrade.effective=true spring.main.banner-mode=off",
    );
    let config = properties.config();
    assert_eq!(config.window(), Duration::from_secs(20));
    assert_eq!(config.min_calls(), 30);
    assert!(config.regulation_effective());
    assert!(config.degrade_effective());
    assert_eq!(
        properties.ignored_keys(),
        ["spring.application.name", "spring.main.banner-mode"]
    );
    // An error in a later pair still names its key and the line.
    let error = error_of(
        "# one\ncom.alipay.sofa.rpc.aft.time.window=20 com.alipay.sofa.rpc.aft.least.window.count=3.5",
    );
    assert_eq!(
        error.field().unwrap(),
        "com.alipay.sofa.rpc.aft.least.window.count"
    );
    assert_eq!(error.config_error().unwrap().value(), "3.5");
    assert_eq!(error.line(), Some(2));
    // A word that starts with `=` is not a pair, so the line is one pair.
    assert_invalid(
        "com.alipay.sofa.rpc.aft.time.window=20 =5",
        "com.alipay.sofa.rpc.aft.time.window",
        "20 =5",
    );
}

#[test]
fn a_line_led_by_another_key_is_one_pair() {
    // The later words are part of the logging pattern, not settings: degradation stays off.
    let properties =
        read("logging.pattern.console=%d com.alipay.sofa.rpc.aft.degrade.effective=true");
    assert!(!properties.config().degrade_effective());
    assert_eq!(properties.config(), defaults());
    assert_eq!(properties.ignored_keys(), ["logging.pattern.console"]);
    // Nor is an invalid value after another key looked at.
    read("logging.pattern.console=%d com.alipay.sofa.rpc.aft.time.window=0");
    read("server.port=8080 com.alipay.sofa.rpc.aft.time.windows=20");
    // A line led by a fault-tolerance key, in any letter case, still holds several pairs.
    let properties = read(
        "COM.alipay.sofa.rpc.aft.regulation.effective=true \
         com.alipay.sofa.rpc.aft.degrade.effective=true",
    );
    assert!(properties.config().regulation_effective());
    assert!(properties.config().degrade_effective());
}

#[test]
fn keys_are_matched_without_regard_to_case_and_reported() {
    let properties = read(
        "Com.alipay.sofa.rpc.aft.time.window=20\n\
         COM.ALIPAY.SOFA.RPC.AFT.LEAST.WINDOW.COUNT=30\n\
         com.alipay.sofa.rpc.aft.Degrade.Effective=true\n\
         com.alipay.sofa.rpc.aft.regulation.effective=true\n",
    );
    let config = properties.config();
    assert_eq!(config.window(), Duration::from_secs(20));
    assert_eq!(config.min_calls(), 30);
    assert!(config.degrade_effective());
    assert_eq!(
        properties.normalised_keys(),
        [
            (
                "Com.alipay.sofa.rpc.aft.time.window".to_owned(),
                "com.alipay.sofa.rpc.aft.time.window"
            ),
            (
                "COM.ALIPAY.SOFA.RPC.AFT.LEAST.WINDOW.COUNT".to_owned(),
                "com.alipay.sofa.rpc.aft.least.window.count"
            ),
            (
                "com.alipay.sofa.rpc.aft.Degrade.Effective".to_owned(),
                "com.alipay.sofa.rpc.aft.degrade.effective"
            ),
        ]
    );
    // Errors name the key as written.
    assert_invalid(
        "Com.alipay.sofa.rpc.aft.weight.degrade.rate=2",
        "Com.alipay.sofa.rpc.aft.weight.degrade.rate",
        "2",
    );
    // Only ASCII letter case is folded.
    let error = error_of("com.alipay.sofa.rpc.aft.tıme.window=20");
    assert!(error.is_unknown_field());
    assert_eq!(
        read("cöm.alipay.sofa.rpc.aft.time.window=20")
            .ignored_keys()
            .len(),
        1
    );
}

#[test]
fn the_last_value_of_a_key_wins() {
    let config = read(
        "com.alipay.sofa.rpc.aft.time.window=20\n\
         Com.alipay.sofa.rpc.aft.time.window=30\n\
         com.alipay.sofa.rpc.aft.time.window=40 com.alipay.sofa.rpc.aft.time.window=50",
    )
    .config();
    assert_eq!(config.window(), Duration::from_secs(50));
    // An invalid value is an error even when a later line would replace it.
    assert_invalid(
        "com.alipay.sofa.rpc.aft.time.window=0\ncom.alipay.sofa.rpc.aft.time.window=20",
        "com.alipay.sofa.rpc.aft.time.window",
        "0",
    );
}

#[test]
fn builder_adjusts_what_the_properties_do_not_set() {
    let properties = read(&corrected_per_line());
    assert_eq!(
        properties.config().exceptions(),
        crate::ExceptionKinds::of(&[FailureKind::Timeout, FailureKind::Overload]),
        "SOFARPC counts timeouts and server busy"
    );
    let with_transport = properties
        .builder()
        .exceptions(&[
            FailureKind::Timeout,
            FailureKind::Overload,
            FailureKind::Transport,
        ])
        .build()
        .unwrap();
    assert_seed_values(&with_transport);
    assert_ne!(
        with_transport.exceptions(),
        properties.config().exceptions()
    );
    // A change made on the builder is the builder's to validate.
    let error = properties
        .builder()
        .original_weight(0.5)
        .build()
        .unwrap_err();
    assert_eq!(error.field(), "least_weight");
}

#[test]
fn build_errors_are_named_by_the_property_key() {
    let mut written: [Option<Written>; 9] = Default::default();
    written[Key::LeastWeight as usize] = Some(Written {
        key: "Com.alipay.sofa.rpc.aft.degrade.least.weight".to_owned(),
        value: "150.0".to_owned(),
        line: 4,
    });
    let build = ConfigError::new("least_weight", 150.0, "a number in (0, 100]");
    let error = error::from_build(&build, &written);
    assert_eq!(
        error.field().unwrap(),
        "Com.alipay.sofa.rpc.aft.degrade.least.weight"
    );
    assert_eq!(error.config_error().unwrap().value(), "150.0");
    assert_eq!(error.line(), Some(4));
    assert_eq!(
        error.config_error().unwrap().allowed(),
        "a number in (0, 100]"
    );

    // A field no key set: the canonical key, the builder's value, no line.
    let build = ConfigError::new("degrade_rate", 0.05, "a number in (0, 0.01]");
    let error = error::from_build(&build, &written);
    assert_eq!(
        error.field().unwrap(),
        "com.alipay.sofa.rpc.aft.weight.degrade.rate"
    );
    assert_eq!(error.config_error().unwrap().value(), "0.05");
    assert_eq!(error.line(), None);
    assert_eq!(
        error.to_string(),
        "invalid SOFARPC fault-tolerance properties: \
         `com.alipay.sofa.rpc.aft.weight.degrade.rate` = \"0.05\" (allowed: a number in (0, 0.01])"
    );
    // A field without a key at all keeps the builder's name.
    let build = ConfigError::new("original_weight", 0, "a finite number greater than 0");
    assert_eq!(
        error::from_build(&build, &written).field().unwrap(),
        "original_weight"
    );

    // Every builder field named here exists: each key's invalid value makes the builder say
    // so under that name.
    assert_eq!(
        WeightConfig::builder()
            .degrade_rate(2.0)
            .build()
            .unwrap_err()
            .field(),
        Key::DegradeRate.builder_field()
    );
    assert_eq!(
        WeightConfig::builder()
            .least_weight(0.0)
            .build()
            .unwrap_err()
            .field(),
        Key::LeastWeight.builder_field()
    );
    assert_eq!(
        WeightConfig::builder()
            .min_calls(0)
            .build()
            .unwrap_err()
            .field(),
        Key::LeastWindowCount.builder_field()
    );
}

#[test]
fn long_and_odd_values_are_shown_safely() {
    let long = "x".repeat(500);
    let error = error_of(&format!("com.alipay.sofa.rpc.aft.time.window={long}"));
    assert_eq!(error.config_error().unwrap().value(), long);
    let message = error.to_string();
    // The quoted value is clipped to `MAX_SHOWN_CHARS` characters, its opening quote included.
    assert!(
        message.contains(&format!(
            "= \"{}… (allowed",
            "x".repeat(MAX_SHOWN_CHARS - 1)
        )),
        "{message}"
    );

    let error = error_of("com.alipay.sofa.rpc.aft.time.window=2\u{0}0\u{1b}[31m");
    let message = error.to_string();
    assert!(
        !message.contains('\u{0}') && !message.contains('\u{1b}'),
        "{message}"
    );
    let wide = "é".repeat(200);
    let error = error_of(&format!("com.alipay.sofa.rpc.aft.time.window={wide}"));
    assert!(error.to_string().contains('…'));
}

#[test]
fn long_keys_are_clipped_in_messages() {
    let key = format!("{PREFIX}{}", "k".repeat(130_000 - PREFIX.len()));
    assert_eq!(key.chars().count(), 130_000);
    let error = error_of(&format!("{key}=20"));
    assert!(error.is_unknown_field());
    assert_eq!(
        error.field().unwrap(),
        key,
        "the accessor returns the key whole"
    );
    // The key clipped to 80 characters, the nine known keys and the words around them.
    let message = error.to_string();
    assert!(
        message.chars().count() < 450,
        "{} chars",
        message.chars().count()
    );
    assert!(
        message.contains(&format!("`{}…`", &key[..MAX_SHOWN_CHARS])),
        "{message}"
    );
}

#[test]
fn keys_with_control_characters_are_escaped_in_messages() {
    for key in [
        format!("{PREFIX}time.window\nforged"),
        format!("{PREFIX}\u{1b}[31mtime.window"),
        format!("{PREFIX}a\u{1b}]0;title\u{7}b\rc"),
    ] {
        // A newline or carriage return would end the key's line in a text, so the errors are
        // made directly.
        let error = error::unknown_key(&key, "20", 1);
        let message = error.to_string();
        assert!(
            !message.contains('\n') && !message.contains('\r') && !message.contains('\u{1b}'),
            "{message:?}"
        );
        assert!(!message.chars().any(char::is_control), "{message:?}");
        assert!(message.contains(&format!("`{key:?}`")), "{message}");
        assert_eq!(error.field().unwrap(), key);
    }
    // Through the reader.
    let text = format!("{PREFIX}time.window\u{1b}[2J=20");
    let message = error_of(&text).to_string();
    assert!(!message.contains('\u{1b}'), "{message:?}");
    assert!(
        message.contains(r#"`"com.alipay.sofa.rpc.aft.time.window\u{1b}[2J"`"#),
        "{message}"
    );
    // The key of an invalid value is shown the same way.
    let error = error::invalid(
        &format!("{PREFIX}time.window\n"),
        "0",
        "at least 1".to_owned(),
        Some(1),
    );
    assert_eq!(
        error.to_string(),
        r#"invalid SOFARPC fault-tolerance properties on line 1: `"com.alipay.sofa.rpc.aft.time.window\n"` = "0" (allowed: at least 1)"#
    );
}

#[test]
fn errors_are_send_sync_and_box_into_dyn_error() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<DocumentError>();
    assert_send_sync::<SofaProperties>();

    fn load(text: &str) -> Result<WeightConfig, Box<dyn std::error::Error + Send + Sync>> {
        Ok(SofaProperties::from_properties(text)?.builder().build()?)
    }
    assert!(load(&corrected_one_line()).is_ok());
    let error = load(SEED_ONE_LINE).unwrap_err();
    assert!(error.to_string().contains("\"ture\""), "{error}");
}

#[test]
fn no_input_panics() {
    let one_line = corrected_one_line();
    let per_line = corrected_per_line();
    let samples = [
        one_line.as_str(),
        per_line.as_str(),
        SEED_WITH_PROSE,
        "a=1\\\n  b\r\n# c\\\n!d\n\u{feff}e : f",
    ];
    let replacements = [
        '=', ':', ' ', '\t', '\n', '\r', '\\', '#', '!', '.', '-', '+', '0', 'e', 'é', '\u{feff}',
    ];
    for sample in samples {
        for (index, current) in sample.char_indices() {
            if let Ok(properties) = SofaProperties::from_properties(&sample[..index]) {
                let _ = properties.builder().build();
            }
            for replacement in replacements {
                let mut mutated = String::with_capacity(sample.len() + 4);
                mutated.push_str(&sample[..index]);
                mutated.push(replacement);
                mutated.push_str(&sample[index + current.len_utf8()..]);
                match SofaProperties::from_properties(&mutated) {
                    Ok(properties) => {
                        let _ = properties.builder().build().unwrap();
                    }
                    Err(error) => {
                        let _ = error.to_string();
                    }
                }
            }
        }
    }

    // Pathological shapes stay linear and do not panic.
    for text in [
        "\\".repeat(100_001),
        "\\\n".repeat(50_000),
        "=".repeat(100_000),
        " a=b".repeat(50_000),
        format!(
            "com.alipay.sofa.rpc.aft.time.window={}",
            "9".repeat(100_000)
        ),
        format!("{PREFIX}{}", "\u{10ffff}".repeat(10)),
        "\r\r\n\n\r".repeat(10_000),
    ] {
        let _ = SofaProperties::from_properties(&text);
    }

    // A small deterministic generator over properties-ish tokens.
    let tokens = [
        "com.alipay.sofa.rpc.aft.",
        "Com.alipay.sofa.rpc.aft.",
        "time.window",
        "degrade.effective",
        "weight.degrade.rate",
        "degrade.max.ip.count",
        "least.weight",
        "=",
        ":",
        " ",
        "\n",
        "\r\n",
        "\\",
        "#",
        "!",
        "true",
        "ture",
        "0",
        "-1",
        "0.5",
        "1e999",
        "NaN",
        "é",
        "\u{feff}",
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
        match SofaProperties::from_properties(&text) {
            Ok(properties) => {
                let _ = properties.builder().build().unwrap();
            }
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
}
