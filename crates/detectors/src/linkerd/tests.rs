//! linkerd2's parser tests (`policy-controller/k8s/index/src/outbound/index.rs`), re-expressed.

use std::time::Duration;

use super::*;

const MODE: &str = ACCRUAL;
const MAX_FAILURES: &str = "balancer.linkerd.io/failure-accrual-consecutive-max-failures";
const MIN_PENALTY: &str = "balancer.linkerd.io/failure-accrual-consecutive-min-penalty";
const MAX_PENALTY: &str = "balancer.linkerd.io/failure-accrual-consecutive-max-penalty";
const JITTER: &str = "balancer.linkerd.io/failure-accrual-consecutive-jitter-ratio";
const THRESHOLD: &str = "balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold";
const WINDOW: &str = "balancer.alpha.linkerd.io/failure-accrual-success-rate-window";
const MIN_REQUESTS: &str = "balancer.alpha.linkerd.io/failure-accrual-success-rate-min-requests";

fn read(annotations: &[(&str, &str)]) -> LinkerdAnnotations {
    match LinkerdAnnotations::from_annotations(annotations.iter().copied()) {
        Ok(read) => read,
        Err(error) => panic!("{annotations:?} refused: {error}"),
    }
}

fn config(annotations: &[(&str, &str)]) -> DetectorConfig {
    read(annotations)
        .config()
        .cloned()
        .expect("failure accrual on")
}

fn refused(annotations: &[(&str, &str)]) -> DocumentError {
    match LinkerdAnnotations::from_annotations(annotations.iter().copied()) {
        Ok(read) => panic!("{annotations:?} accepted as {read:?}"),
        Err(error) => error,
    }
}

#[test]
fn durations_as_linkerd_parses_them() {
    for (text, expected) in [
        ("10s", Duration::from_secs(10)),
        ("500ms", Duration::from_millis(500)),
        ("5m", Duration::from_secs(300)),
        ("2h", Duration::from_secs(7200)),
        ("1d", Duration::from_secs(86_400)),
        ("0", Duration::ZERO),
        ("0s", Duration::ZERO),
        ("0ms", Duration::ZERO),
        (" 10s ", Duration::from_secs(10)),
    ] {
        assert_eq!(duration("k", text).unwrap(), expected, "{text}");
    }
    for text in [
        "0.5s",
        "0.0s",
        "0.5m",
        "5",
        "100",
        "999999999999999999d",
        "10x",
        "",
        "-5s",
        "-0.5s",
    ] {
        assert!(duration("k", text).is_err(), "{text}");
    }
}

#[test]
fn mode_unified_uses_success_rate_defaults() {
    let config = config(&[(MODE, "unified")]);
    assert_eq!(config.consecutive_5xx().threshold, 7);
    assert_eq!(config.base_ejection_time(), Duration::from_secs(1));
    assert_eq!(config.max_ejection_time(), Duration::from_secs(60));
    assert_eq!(config.backoff_jitter(), 0.5);
    assert_eq!(
        config.recent_success_rate(),
        Some(RecentSuccessRate {
            threshold: 0.8,
            window: Duration::from_secs(10),
            min_requests: 5,
        })
    );
}

#[test]
fn mode_unified_with_explicit_values_and_whitespace() {
    let config = config(&[
        (MODE, "unified"),
        (THRESHOLD, " 0.9 "),
        (WINDOW, "15s"),
        (MIN_REQUESTS, " 10 "),
        (MAX_FAILURES, "3"),
        (MIN_PENALTY, "2s"),
    ]);
    assert_eq!(config.consecutive_5xx().threshold, 3);
    assert_eq!(config.base_ejection_time(), Duration::from_secs(2));
    assert_eq!(
        config.recent_success_rate(),
        Some(RecentSuccessRate {
            threshold: 0.9,
            window: Duration::from_secs(15),
            min_requests: 10,
        })
    );
}

#[test]
fn mode_consecutive_unchanged_and_ignores_success_rate_keys() {
    let read = read(&[(MODE, "consecutive"), (THRESHOLD, "0.9")]);
    let config = read.config().unwrap();
    assert_eq!(config.consecutive_5xx().threshold, 7);
    assert_eq!(config.recent_success_rate(), None);
    assert_eq!(read.ignored(), [THRESHOLD.to_string()]);
}

#[test]
fn no_mode_is_no_failure_accrual() {
    // success_rate_keys_without_mode_returns_none; max-failures alone (default_failure_accrual).
    assert!(read(&[(THRESHOLD, "0.9")]).config().is_none());
    assert!(read(&[(MAX_FAILURES, "3")]).config().is_none());
    assert!(read(&[]).config().is_none());
}

#[test]
fn unknown_modes_and_booleans_are_refused() {
    for mode in ["true", "false", "ewma", ""] {
        assert_eq!(refused(&[(MODE, mode)]).field(), Some(MODE), "{mode}");
    }
}

#[test]
fn unified_threshold_out_of_range_rejected() {
    for threshold in ["-0.1", "1.5", "NaN", "high"] {
        let error = refused(&[(MODE, "unified"), (THRESHOLD, threshold)]);
        assert_eq!(error.field(), Some(THRESHOLD), "{threshold}");
    }
    assert!(read(&[(MODE, "unified"), (THRESHOLD, "0.0")])
        .config()
        .is_some());
}

#[test]
fn windows_and_minimums_as_linkerd_limits_them() {
    assert_eq!(
        refused(&[(MODE, "unified"), (WINDOW, "0s")]).field(),
        Some(WINDOW)
    );
    let error = refused(&[(MODE, "unified"), (WINDOW, "9ms")]);
    assert!(error.to_string().contains("10ms"), "{error}");
    for window in ["10ms", "500ms"] {
        assert!(read(&[(MODE, "unified"), (WINDOW, window)])
            .config()
            .is_some());
    }
    assert!(read(&[(MODE, "unified"), (MIN_REQUESTS, "0")])
        .config()
        .is_some());
    assert!(read(&[(MODE, "unified"), (MIN_REQUESTS, "1000000")])
        .config()
        .is_some());
    let error = refused(&[(MODE, "unified"), (MIN_REQUESTS, "1000001")]);
    assert!(error.to_string().contains("1000000"), "{error}");
    // A threshold of 0 turns the rate off: its window and minimum are not limited.
    let config = config(&[(MODE, "unified"), (THRESHOLD, "0"), (WINDOW, "5ms")]);
    assert_eq!(
        config.recent_success_rate().unwrap().window,
        Duration::from_millis(5)
    );
    assert!(read(&[
        (MODE, "unified"),
        (THRESHOLD, "0"),
        (MIN_REQUESTS, "2000000")
    ])
    .config()
    .is_some());
}

#[test]
fn unified_unknown_success_rate_key_ignored() {
    let typo = "balancer.alpha.linkerd.io/failure-accrual-success-rate-thresold";
    let read = read(&[(MODE, "unified"), (typo, "0.99")]);
    assert_eq!(
        read.config()
            .unwrap()
            .recent_success_rate()
            .unwrap()
            .threshold,
        0.8
    );
    assert_eq!(read.ignored(), [typo.to_string()]);
}

#[test]
fn unified_both_dimensions_disabled_parses() {
    let config = config(&[(MODE, "unified"), (THRESHOLD, "0"), (MAX_FAILURES, "0")]);
    assert_eq!(config.consecutive_5xx().threshold, 0);
    assert_eq!(config.recent_success_rate().unwrap().threshold, 0.0);
}

#[test]
fn penalties_and_jitter_are_checked() {
    let error = refused(&[
        (MODE, "consecutive"),
        (MIN_PENALTY, "2m"),
        (MAX_PENALTY, "1m"),
    ]);
    assert_eq!(error.field(), Some(MIN_PENALTY));
    assert_eq!(
        refused(&[(MODE, "consecutive"), (MAX_PENALTY, "0")]).field(),
        Some(MAX_PENALTY)
    );
    for jitter in ["-0.1", "100.5", "x"] {
        assert_eq!(
            refused(&[(MODE, "consecutive"), (JITTER, jitter)]).field(),
            Some(JITTER)
        );
    }
    let read = config(&[
        (MODE, "consecutive"),
        (JITTER, "1.0"),
        (MAX_FAILURES, " 8 "),
    ]);
    assert_eq!(read.backoff_jitter(), 1.0);
    assert_eq!(read.consecutive_5xx().threshold, 8);
    // consecutive with all keys (linkerd's API test): 8, 10s, 10m, 1.0.
    let read = config(&[
        (MODE, "consecutive"),
        (MAX_FAILURES, "8"),
        (MIN_PENALTY, "10s"),
        (MAX_PENALTY, "10m"),
        (JITTER, "1.0"),
    ]);
    assert_eq!(read.base_ejection_time(), Duration::from_secs(10));
    assert_eq!(read.max_ejection_time(), Duration::from_secs(600));
}

#[test]
fn honor_retry_after_is_a_go_boolean() {
    let honor = "balancer.alpha.linkerd.io/failure-accrual-honor-retry-after";
    for (text, expected) in [
        ("true", true),
        (" true ", true),
        ("T", true),
        ("1", true),
        ("false", false),
        ("F", false),
        ("0", false),
    ] {
        assert_eq!(
            read(&[(honor, text)]).honor_retry_after(),
            expected,
            "{text}"
        );
    }
    assert!(!read(&[]).honor_retry_after());
    for text in ["sometimes", "yes", ""] {
        let error = refused(&[(honor, text)]);
        assert_eq!(error.field(), Some(honor));
    }
}

#[test]
fn odd_values_are_shown_escaped() {
    let error = refused(&[(MODE, "evil\nmode")]);
    assert!(!error.to_string().contains('\n'), "{error}");
}
