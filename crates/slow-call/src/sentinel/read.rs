//! Reading one Sentinel rule: the keys, their limits, and the reader of each field.

use std::time::Duration;

use serde_json::{Map, Value};
use tower_outlier_core::text::clip;
use tower_outlier_core::ConfigError;

use crate::config::{BreakerBuilder, BreakerConfig};

use super::*;

/// Sentinel keeps `grade`, `timeWindow`, `minRequestAmount` and `statIntervalMs` in Java `int`s,
/// so no Sentinel rule holds a larger value.
pub(super) const JAVA_INT_MAX: u64 = i32::MAX as u64;

/// 2⁶⁴, the first whole `f64` that no `u64` holds.
pub(super) const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

/// How an absent field is shown in errors (a JSON value is never shown unquoted like this).
pub(super) const MISSING: &str = "(missing)";

/// The fields this module reads.
pub(super) const RESOURCE: &str = "resource";
pub(super) const REGEX: &str = "regex";
pub(super) const GRADE: &str = "grade";
pub(super) const COUNT: &str = "count";
pub(super) const TIME_WINDOW: &str = "timeWindow";
pub(super) const MIN_REQUEST_AMOUNT: &str = "minRequestAmount";
pub(super) const STAT_INTERVAL_MS: &str = "statIntervalMs";
pub(super) const SLOW_RATIO_THRESHOLD: &str = "slowRatioThreshold";

/// Fields of Sentinel's `DegradeRule` and of its dashboard's `DegradeRuleEntity` that have no
/// effect on circuit breaking, in Sentinel either: accepted whatever their value, and not listed
/// by [`DegradeRule::ignored_fields`].
pub(super) const BOOKKEEPING_FIELDS: [&str; 7] = [
    "id",
    "app",
    "ip",
    "port",
    "limitApp",
    "gmtCreate",
    "gmtModified",
];

/// The fields this module knows; `slowRatioThreshold` is read for grade 0 only.
pub(super) const READ_FIELDS: [&str; 8] = [
    RESOURCE,
    REGEX,
    GRADE,
    COUNT,
    TIME_WINDOW,
    MIN_REQUEST_AMOUNT,
    STAT_INTERVAL_MS,
    SLOW_RATIO_THRESHOLD,
];

pub(super) const RESOURCE_ALLOWED: &str = "a non-blank JSON string (required)";
pub(super) const REGEX_ALLOWED: &str =
    "false, or the field absent (regular-expression resources are not supported)";
pub(super) const GRADE_ALLOWED: &str =
    "0 (slow-call ratio, the default), 1 (error ratio) or 2 (error count)";
pub(super) const SLOW_COUNT_ALLOWED: &str =
    "a JSON number of milliseconds (the max RT) from 0 to 18446744073709551615 (required)";
pub(super) const RATIO_COUNT_ALLOWED: &str = "a JSON number in [0, 1] (the error ratio; required)";
pub(super) const ERROR_COUNT_ALLOWED: &str =
    "a whole JSON number from 0 to 18446744073709551615 (the error count; required)";
pub(super) const TIME_WINDOW_ALLOWED: &str =
    "a JSON integer from 1 to 2147483647, in seconds (required)";
pub(super) const MIN_REQUEST_AMOUNT_ALLOWED: &str =
    "a JSON integer from 1 to 2147483647 (default 5)";
pub(super) const STAT_INTERVAL_MS_ALLOWED: &str =
    "a JSON integer from 1 to 2147483647, in milliseconds (default 1000)";
pub(super) const SLOW_RATIO_THRESHOLD_ALLOWED: &str = "a JSON number in [0, 1] (default 1.0)";

/// The strategy a rule's `grade` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Grade {
    SlowRatio,
    ErrorRatio,
    ErrorCount,
}

pub(super) fn read_rule(index: usize, element: &Value) -> Result<DegradeRule, DocumentError> {
    let fields = match element {
        Value::Object(fields) => fields,
        other => return Err(super::error::not_an_object(index, other)),
    };
    let resource =
        read_resource(fields).map_err(|error| super::error::invalid(index, None, error))?;
    let config = read_config(fields)
        .map_err(|error| super::error::invalid(index, Some(&resource), error))?;
    let mut ignored_fields: Vec<String> = fields
        .keys()
        .filter(|name| {
            !READ_FIELDS.contains(&name.as_str()) && !BOOKKEEPING_FIELDS.contains(&name.as_str())
        })
        .cloned()
        .collect();
    ignored_fields.sort();
    Ok(DegradeRule {
        resource,
        config,
        ignored_fields,
    })
}

pub(super) fn read_resource(fields: &Map<String, Value>) -> Result<String, ConfigError> {
    match fields.get(RESOURCE) {
        // Sentinel's `StringUtil.isBlank`: a name of only whitespace is no name.
        Some(Value::String(name)) if !name.trim().is_empty() => Ok(name.clone()),
        other => Err(invalid(RESOURCE, other, RESOURCE_ALLOWED)),
    }
}

pub(super) fn read_config(fields: &Map<String, Value>) -> Result<BreakerConfig, ConfigError> {
    match fields.get(REGEX) {
        None | Some(Value::Bool(false)) => {}
        other => return Err(invalid(REGEX, other, REGEX_ALLOWED)),
    }

    let grade = match fields.get(GRADE) {
        None => Grade::SlowRatio,
        Some(value) => match value.as_u64() {
            Some(0) => Grade::SlowRatio,
            Some(1) => Grade::ErrorRatio,
            Some(2) => Grade::ErrorCount,
            _ => return Err(invalid(GRADE, Some(value), GRADE_ALLOWED)),
        },
    };

    let count = fields.get(COUNT);
    let builder: BreakerBuilder = match grade {
        Grade::SlowRatio => {
            let millis = count
                .and_then(whole_millis)
                .ok_or_else(|| invalid(COUNT, count, SLOW_COUNT_ALLOWED))?;
            let ratio = match fields.get(SLOW_RATIO_THRESHOLD) {
                None => 1.0,
                Some(value) => value
                    .as_f64()
                    .filter(|ratio| (0.0..=1.0).contains(ratio))
                    .ok_or_else(|| {
                        invalid(
                            SLOW_RATIO_THRESHOLD,
                            Some(value),
                            SLOW_RATIO_THRESHOLD_ALLOWED,
                        )
                    })?,
            };
            BreakerConfig::slow_ratio(Duration::from_millis(millis)).ratio(ratio)
        }
        Grade::ErrorRatio => {
            // `as_f64` is `None` for every non-number, which is what rejects `"0.5"`.
            let ratio = count
                .and_then(Value::as_f64)
                .filter(|ratio| (0.0..=1.0).contains(ratio))
                .ok_or_else(|| invalid(COUNT, count, RATIO_COUNT_ALLOWED))?;
            BreakerConfig::error_ratio(ratio)
        }
        Grade::ErrorCount => {
            let errors = count
                .and_then(whole_number)
                .ok_or_else(|| invalid(COUNT, count, ERROR_COUNT_ALLOWED))?;
            BreakerConfig::error_count(errors)
        }
    };

    let seconds = java_int(fields, TIME_WINDOW, None, TIME_WINDOW_ALLOWED)?;
    let min_requests = java_int(
        fields,
        MIN_REQUEST_AMOUNT,
        Some(5),
        MIN_REQUEST_AMOUNT_ALLOWED,
    )?;
    let interval_ms = java_int(
        fields,
        STAT_INTERVAL_MS,
        Some(1000),
        STAT_INTERVAL_MS_ALLOWED,
    )?;

    builder
        .min_calls(min_requests)
        .window(Duration::from_millis(interval_ms))
        .open_duration(Duration::from_secs(seconds))
        .build()
        // Every value was checked above, so this only happens if the builder grows a rule the
        // checks above do not know; the error is still reported under Sentinel's names.
        .map_err(sentinel_names)
}

/// A positive integer field held in a Java `int` by Sentinel: `default` when absent (`None` for a
/// required field).
pub(super) fn java_int(
    fields: &Map<String, Value>,
    name: &'static str,
    default: Option<u64>,
    allowed: &str,
) -> Result<u64, ConfigError> {
    match fields.get(name) {
        None => default.ok_or_else(|| invalid(name, None, allowed)),
        // `as_u64` is `None` for negative numbers and for anything written with a fraction or an
        // exponent, so `10.5`, `10.0` and `1e1` are rejected rather than rounded.
        Some(value) => value
            .as_u64()
            .filter(|n| (1..=JAVA_INT_MAX).contains(n))
            .ok_or_else(|| invalid(name, Some(value), allowed)),
    }
}

/// A grade-0 `count` (a Java `double` of milliseconds) rounded as Sentinel's `Math.round` rounds
/// it: half up. `None` if negative, not a number, or beyond `u64` milliseconds.
pub(super) fn whole_millis(value: &Value) -> Option<u64> {
    if let Some(millis) = value.as_u64() {
        return Some(millis);
    }
    let millis = value.as_f64()?;
    // JSON has no NaN or infinity, and serde_json refuses numbers beyond f64; the checks still
    // keep the conversion below exact whatever the input.
    if !millis.is_finite() || millis < 0.0 {
        return None;
    }
    // For non-negative numbers `f64::round` (half away from zero) is Java's `Math.round`.
    let rounded = millis.round();
    (rounded < TWO_POW_64).then_some(rounded as u64)
}

/// A grade-2 `count`: a whole, non-negative number, written as an integer or as a `double` with no
/// fraction (`3.0`).
pub(super) fn whole_number(value: &Value) -> Option<u64> {
    if let Some(count) = value.as_u64() {
        return Some(count);
    }
    let count = value.as_f64()?;
    (count.is_finite() && count >= 0.0 && count.fract() == 0.0 && count < TWO_POW_64)
        .then_some(count as u64)
}

/// An error for `field`, which holds `value` (`None` when absent) but must be `allowed`.
pub(super) fn invalid(field: &str, value: Option<&Value>, allowed: &str) -> ConfigError {
    let shown = match value {
        Some(value) => show_json(value),
        None => MISSING.to_owned(),
    };
    ConfigError::new(field, shown, allowed)
}

/// Renames the builder's field names to the Sentinel fields they were read from.
pub(super) fn sentinel_names(error: ConfigError) -> ConfigError {
    let field = match error.field() {
        "slow_ratio_threshold" => SLOW_RATIO_THRESHOLD,
        "error_ratio" => COUNT,
        "min_requests" => MIN_REQUEST_AMOUNT,
        "window" => STAT_INTERVAL_MS,
        "open_duration" => TIME_WINDOW,
        _ => return error,
    };
    ConfigError::new(field, error.value(), error.allowed())
}

/// The value as it will appear in an error: JSON as written (strings quoted and escaped, so a
/// quoted number is visibly a string and control characters cannot break the log line), clipped.
pub(super) fn show_json(value: &Value) -> String {
    clip(value.to_string())
}
