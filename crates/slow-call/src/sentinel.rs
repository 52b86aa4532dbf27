//! Alibaba Sentinel's circuit-breaking rules (`DegradeRule` JSON), read into [`BreakerConfig`]s.
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (fields, defaults, validation) lives on [`parse_degrade_rules`], where rustdoc shows
//! it. [`RuleError`], the error type and its message, is in `error`.

mod error;

use std::time::Duration;

use serde_json::{Map, Value};
use tower_outlier_core::json;
use tower_outlier_core::text::clip;
use tower_outlier_core::ConfigError;

use crate::config::{BreakerBuilder, BreakerConfig};

pub use self::error::RuleError;

/// Sentinel keeps `grade`, `timeWindow`, `minRequestAmount` and `statIntervalMs` in Java `int`s,
/// so no Sentinel rule holds a larger value.
const JAVA_INT_MAX: u64 = i32::MAX as u64;

/// 2⁶⁴, the first whole `f64` that no `u64` holds.
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

/// How an absent field is shown in errors (a JSON value is never shown unquoted like this).
const MISSING: &str = "(missing)";

/// The fields this module reads.
const RESOURCE: &str = "resource";
const REGEX: &str = "regex";
const GRADE: &str = "grade";
const COUNT: &str = "count";
const TIME_WINDOW: &str = "timeWindow";
const MIN_REQUEST_AMOUNT: &str = "minRequestAmount";
const STAT_INTERVAL_MS: &str = "statIntervalMs";
const SLOW_RATIO_THRESHOLD: &str = "slowRatioThreshold";

/// Fields of Sentinel's `DegradeRule` and of its dashboard's `DegradeRuleEntity` that have no
/// effect on circuit breaking, in Sentinel either: accepted whatever their value, and not listed
/// by [`DegradeRule::ignored_fields`].
const BOOKKEEPING_FIELDS: [&str; 7] = [
    "id",
    "app",
    "ip",
    "port",
    "limitApp",
    "gmtCreate",
    "gmtModified",
];

/// The fields this module knows; `slowRatioThreshold` is read for grade 0 only.
const READ_FIELDS: [&str; 8] = [
    RESOURCE,
    REGEX,
    GRADE,
    COUNT,
    TIME_WINDOW,
    MIN_REQUEST_AMOUNT,
    STAT_INTERVAL_MS,
    SLOW_RATIO_THRESHOLD,
];

const RESOURCE_ALLOWED: &str = "a non-blank JSON string (required)";
const REGEX_ALLOWED: &str =
    "false, or the field absent (regular-expression resources are not supported)";
const GRADE_ALLOWED: &str = "0 (slow-call ratio, the default), 1 (error ratio) or 2 (error count)";
const SLOW_COUNT_ALLOWED: &str =
    "a JSON number of milliseconds (the max RT) from 0 to 18446744073709551615 (required)";
const RATIO_COUNT_ALLOWED: &str = "a JSON number in [0, 1] (the error ratio; required)";
const ERROR_COUNT_ALLOWED: &str =
    "a whole JSON number from 0 to 18446744073709551615 (the error count; required)";
const TIME_WINDOW_ALLOWED: &str = "a JSON integer from 1 to 2147483647, in seconds (required)";
const MIN_REQUEST_AMOUNT_ALLOWED: &str = "a JSON integer from 1 to 2147483647 (default 5)";
const STAT_INTERVAL_MS_ALLOWED: &str =
    "a JSON integer from 1 to 2147483647, in milliseconds (default 1000)";
const SLOW_RATIO_THRESHOLD_ALLOWED: &str = "a JSON number in [0, 1] (default 1.0)";

/// One Sentinel circuit-breaking rule: the resource it protects and the validated breaker
/// configuration it describes. Read with [`parse_degrade_rules`].
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub struct DegradeRule {
    resource: String,
    config: BreakerConfig,
    ignored_fields: Vec<String>,
}

impl DegradeRule {
    /// The resource the rule protects (Sentinel's `resource`), exactly as written: not trimmed,
    /// case-sensitive.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The breaker configuration the rule describes.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The rule's fields that were not understood and had no effect, in sorted order: misspelt
    /// fields (names are case-sensitive), fields of newer Sentinel versions, and fields of older
    /// ones that Sentinel 1.8 ignores too (`passCount`, `rtSlowRequestAmount`). Log them: a
    /// misspelt optional field (`minRequestamount`) silently keeps its default otherwise.
    ///
    /// Sentinel's bookkeeping fields (`id`, `app`, `ip`, `port`, `limitApp`, `gmtCreate`,
    /// `gmtModified`) are not listed, nor is `slowRatioThreshold` in a rule of grade 1 or 2.
    pub fn ignored_fields(&self) -> &[String] {
        &self.ignored_fields
    }

    /// One line per [ignored field](Self::ignored_fields), for a log or a monitor, shown safely
    /// ([`tower_outlier_core::text::name`]) and with the field it is likely a misspelling of:
    ///
    /// ```
    /// use tower_outlier_slow_call::parse_degrade_rules;
    ///
    /// let rules = parse_degrade_rules(
    ///     r#"[{"resource": "orders", "grade": 0, "count": 50, "timeWindow": 10, "slowRatioThreshhold": 0.2}]"#,
    /// )?;
    /// assert_eq!(
    ///     rules[0].ignored_field_notes(),
    ///     ["unknown field `slowRatioThreshhold` of the rule for `orders` ignored (did you mean `slowRatioThreshold`?)"]
    /// );
    /// # Ok::<(), tower_outlier_slow_call::RuleError>(())
    /// ```
    pub fn ignored_field_notes(&self) -> Vec<String> {
        let resource = tower_outlier_core::text::name(&self.resource);
        self.ignored_fields
            .iter()
            .map(|field| {
                let shown = tower_outlier_core::text::name(field);
                let known = READ_FIELDS.iter().chain(&BOOKKEEPING_FIELDS).copied();
                match tower_outlier_core::text::closest(field, known) {
                    Some(known) => format!(
                        "unknown field `{shown}` of the rule for `{resource}` ignored (did you mean `{known}`?)"
                    ),
                    None => format!("unknown field `{shown}` of the rule for `{resource}` ignored"),
                }
            })
            .collect()
    }
}

/// Reads a JSON array of Alibaba Sentinel `DegradeRule`s (circuit-breaking rules), as Sentinel's
/// dashboard and its config-center data sources (Nacos, Apollo, ZooKeeper, a file) store them,
/// into one validated [`DegradeRule`] per element, in order.
///
/// | field | builder setting | allowed | Sentinel default |
/// |---|---|---|---|
/// | `resource` | [`DegradeRule::resource`] | non-blank string | required |
/// | `grade` | the strategy: [`slow_ratio`](BreakerConfig::slow_ratio) (0), [`error_ratio`](BreakerConfig::error_ratio) (1), [`error_count`](BreakerConfig::error_count) (2) | `0`, `1`, `2` | 0 |
/// | `count` | grade 0: the max RT, in ms | number ≥ 0 | required |
/// | | grade 1: the error ratio | number in `[0, 1]` | required |
/// | | grade 2: the error count | whole number ≥ 0 | required |
/// | `timeWindow` | [`open_duration`](BreakerBuilder::open_duration), in seconds | integer 1 to 2³¹ − 1 | required |
/// | `minRequestAmount` | [`min_requests`](BreakerBuilder::min_requests) | integer 1 to 2³¹ − 1 | 5 |
/// | `statIntervalMs` | [`window`](BreakerBuilder::window), in ms | integer 1 to 2³¹ − 1 | 1000 |
/// | `slowRatioThreshold` | [`ratio`](BreakerBuilder::ratio) (grade 0 only) | number in `[0, 1]` | 1.0 |
/// | `regex` | — | `false` | false |
///
/// The statistics interval has one bucket, as in Sentinel: the counts restart at every interval
/// boundary.
///
/// # Decisions
///
/// * **The max RT is rounded to whole milliseconds**, half up, as Sentinel's
///   `ResponseTimeCircuitBreaker` does (`Math.round(count)`): `500.5` is 501 ms, `500.4` is
///   500 ms. So a rule trips at the same latency here as in a Java service that loads it.
/// * **The error count must be a whole number**: `3` and `3.0` (the dashboard stores `count` as a
///   Java `double`, so `3.0` is common) are 3; `2.5` is rejected rather than rounded.
/// * **Integer fields must be JSON integers**: `10.0`, `1e1` and `"10"` are rejected for
///   `timeWindow`, `minRequestAmount`, `statIntervalMs` and `grade`. Their upper bound is Java's
///   `int`, which is where Sentinel keeps them. (Sentinel computes the open duration as
///   `timeWindow * 1000` in an `int`, which overflows above 2 147 483 s; here the whole range is
///   honoured.)
/// * **Nothing is coerced or defaulted silently**: numbers must be JSON numbers (`"500"` is
///   rejected, although Sentinel's JSON reader may coerce it), and `null` is rejected for every
///   field this function reads — omit an optional field to get its default.
/// * **`slowRatioThreshold` only counts for grade 0.** In a rule of grade 1 or 2 it is ignored,
///   whatever its value, as Sentinel ignores it.
/// * **`regex: true` is rejected**: Sentinel then treats `resource` as a Java regular expression
///   matched against resource names, which this crate does not do; taking the pattern as a plain
///   name would silently protect nothing. `regex: false` is accepted.
/// * **Other fields are accepted and ignored.** `id`, `app`, `ip`, `port`, `limitApp`,
///   `gmtCreate` and `gmtModified` (dashboard bookkeeping; `limitApp` has no effect on circuit
///   breaking in Sentinel either) may hold anything, `null` included. Unknown fields are ignored
///   too, so that rules written by newer Sentinel versions still load, but they are listed by
///   [`DegradeRule::ignored_fields`]. Field names are case-sensitive.
/// * **A key given twice is an error**, in a rule (`{"count": 100, "count": 200}`, even with
///   equal values) or in any other object of the text (say, inside an unknown field's value).
///   Sentinel's JSON reader, like most, silently keeps the last value, so which one a Java
///   service loads is a guess; a misedited rule is better reported than half applied. The error
///   names the key and the rule (or where the object is, when not directly in a rule).
/// * **Several rules for one resource are all kept, in order**, as Sentinel applies every rule of
///   a resource (e.g. a slow-call rule and an error-count rule); identical rules are kept too.
/// * **One invalid rule fails the whole array.** Sentinel's `DegradeRuleManager` skips an invalid
///   rule with a log line and loads the others; here the caller learns of it and can keep the
///   rules it had, instead of silently losing the protection the broken rule was meant to give.
///   Sentinel's own validity conditions (`DegradeRuleManager.isValidRule`) are all enforced.
/// * An empty array is valid and yields no rules. A leading byte-order mark is skipped.
///
/// # Errors
///
/// A [`RuleError`] for malformed JSON (with serde_json's message, line and column), a key given
/// twice in an object ([`RuleError::is_duplicate`]), a top level that is not an array, an element
/// that is not an object, or a field that is missing, of the wrong JSON type or out of range. The
/// last names the rule's position in the array (from 0, as in `jq '.[2]'`), its resource when that
/// was valid, the field as Sentinel spells it, the value as written (JSON re-serialised, clipped at
/// 80 characters; `(missing)` when absent) and the allowed range. A repeated key is named with the
/// rule it is in (clipped, and escaped when it holds control characters).
///
/// Malformed JSON anywhere in the text is reported first, then the first repeated key in reading
/// order, then the rules in order. Within a rule, fields are checked in the order `resource`,
/// `regex`, `grade`, `count`, `timeWindow`, `minRequestAmount`, `statIntervalMs`,
/// `slowRatioThreshold`, and the first error is reported.
///
/// # Example
///
/// A rule as Sentinel's dashboard stores it for a slow-call breaker: a 1 s interval, at least 5
/// calls, every call slower than 500 ms, then open for 10 s.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_slow_call::{parse_degrade_rules, Strategy};
///
/// let rules = parse_degrade_rules(
///     r#"[{ "resource": "/testD", "limitApp": "default", "grade": 0, "count": 500,
///           "timeWindow": 10, "minRequestAmount": 5, "statIntervalMs": 1000,
///           "slowRatioThreshold": 1.0 }]"#,
/// )?;
/// assert_eq!(rules.len(), 1);
/// assert_eq!(rules[0].resource(), "/testD");
/// let config = rules[0].config();
/// assert_eq!(
///     config.strategy(),
///     Strategy::SlowRatio { max_rt: Duration::from_millis(500), ratio: 1.0 }
/// );
/// assert_eq!(config.min_requests(), 5);
/// assert_eq!(config.window(), Duration::from_secs(1));
/// assert_eq!(config.open_duration(), Duration::from_secs(10));
///
/// // An invalid rule is an error naming its position, resource, field, value and allowed range.
/// let error = parse_degrade_rules(
///     r#"[{ "resource": "/testD", "count": 500, "timeWindow": 10 },
///         { "resource": "/testE", "grade": 2, "count": 3, "timeWindow": 10 },
///         { "resource": "GET:/orders", "grade": 1, "count": 0.5, "timeWindow": 0 }]"#,
/// )
/// .unwrap_err();
/// assert_eq!(error.index(), Some(2));
/// assert_eq!(error.resource(), Some("GET:/orders"));
/// assert_eq!(error.field(), Some("timeWindow"));
/// assert_eq!(
///     error.to_string(),
///     "invalid Sentinel degrade rule #2 (resource \"GET:/orders\"): `timeWindow` = 0 \
///      (allowed: a JSON integer from 1 to 2147483647, in seconds (required))"
/// );
///
/// // So is a field given twice (a plain JSON reader would keep the last value).
/// let error = parse_degrade_rules(
///     r#"[{ "resource": "/testD", "count": 100, "count": 200, "timeWindow": 10 }]"#,
/// )
/// .unwrap_err();
/// assert!(error.is_duplicate());
/// assert_eq!(error.index(), Some(0));
/// assert_eq!(error.field(), Some("count"));
/// assert_eq!(
///     error.to_string(),
///     "invalid Sentinel degrade rule #0: field `count` is given more than once"
/// );
/// # Ok::<(), tower_outlier_slow_call::RuleError>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub fn parse_degrade_rules(json: &str) -> Result<Vec<DegradeRule>, RuleError> {
    // Config centers and editors on Windows sometimes prepend a BOM, which serde_json rejects.
    let json = json.strip_prefix('\u{feff}').unwrap_or(json);
    let document = json::parse(json).map_err(RuleError::from_parse)?;
    let elements = match &document {
        Value::Array(elements) => elements,
        other => return Err(RuleError::top_level(other)),
    };
    elements
        .iter()
        .enumerate()
        .map(|(index, element)| read_rule(index, element))
        .collect()
}

/// The strategy a rule's `grade` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Grade {
    SlowRatio,
    ErrorRatio,
    ErrorCount,
}

fn read_rule(index: usize, element: &Value) -> Result<DegradeRule, RuleError> {
    let fields = match element {
        Value::Object(fields) => fields,
        other => return Err(RuleError::not_an_object(index, other)),
    };
    let resource = read_resource(fields).map_err(|error| RuleError::invalid(index, None, error))?;
    let config = read_config(fields)
        .map_err(|error| RuleError::invalid(index, Some(resource.clone()), error))?;
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

fn read_resource(fields: &Map<String, Value>) -> Result<String, ConfigError> {
    match fields.get(RESOURCE) {
        // Sentinel's `StringUtil.isBlank`: a name of only whitespace is no name.
        Some(Value::String(name)) if !name.trim().is_empty() => Ok(name.clone()),
        other => Err(invalid(RESOURCE, other, RESOURCE_ALLOWED)),
    }
}

fn read_config(fields: &Map<String, Value>) -> Result<BreakerConfig, ConfigError> {
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
        .min_requests(min_requests)
        .window(Duration::from_millis(interval_ms))
        .open_duration(Duration::from_secs(seconds))
        .build()
        // Every value was checked above, so this only happens if the builder grows a rule the
        // checks above do not know; the error is still reported under Sentinel's names.
        .map_err(sentinel_names)
}

/// A positive integer field held in a Java `int` by Sentinel: `default` when absent (`None` for a
/// required field).
fn java_int(
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
fn whole_millis(value: &Value) -> Option<u64> {
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
fn whole_number(value: &Value) -> Option<u64> {
    if let Some(count) = value.as_u64() {
        return Some(count);
    }
    let count = value.as_f64()?;
    (count.is_finite() && count >= 0.0 && count.fract() == 0.0 && count < TWO_POW_64)
        .then_some(count as u64)
}

/// An error for `field`, which holds `value` (`None` when absent) but must be `allowed`.
fn invalid(field: &str, value: Option<&Value>, allowed: &str) -> ConfigError {
    let shown = match value {
        Some(value) => show_json(value),
        None => MISSING.to_owned(),
    };
    ConfigError::new(field, shown, allowed)
}

/// Renames the builder's field names to the Sentinel fields they were read from.
fn sentinel_names(error: ConfigError) -> ConfigError {
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
fn show_json(value: &Value) -> String {
    clip(value.to_string())
}

#[cfg(test)]
mod tests;
