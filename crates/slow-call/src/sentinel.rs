//! Alibaba Sentinel's circuit-breaking rules (`DegradeRule` JSON), read into [`BreakerConfig`]s.
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (fields, defaults, validation) lives on [`parse_degrade_rules`], where rustdoc shows
//! it.

use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value};
use tower_outlier_core::text::clip;
use tower_outlier_core::ConfigError;

use crate::config::{BreakerBuilder, BreakerConfig};

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
/// | `statIntervalMs` | [`stat_interval`](BreakerBuilder::stat_interval), in ms | integer 1 to 2³¹ − 1 | 1000 |
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
///   [`DegradeRule::ignored_fields`]. Field names are case-sensitive. When an object repeats a
///   field, the last value wins (serde_json's behaviour).
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
/// A [`RuleError`] for malformed JSON (with serde_json's message, line and column), a top level
/// that is not an array, an element that is not an object, or a field that is missing, of the wrong
/// JSON type or out of range. The last names the rule's position in the array (from 0, as in
/// `jq '.[2]'`), its resource when that was valid, the field as Sentinel spells it, the value as
/// written (JSON re-serialised, clipped at 80 characters; `(missing)` when absent) and the allowed
/// range. Fields are checked in the order `resource`, `regex`, `grade`, `count`, `timeWindow`,
/// `minRequestAmount`, `statIntervalMs`, `slowRatioThreshold`, and the first error is reported.
///
/// # Example
///
/// The seed's walk-through rule: a 1 s interval, at least 5 calls, every call slower than 500 ms,
/// then open for 10 s.
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
/// assert_eq!(config.stat_interval(), Duration::from_secs(1));
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
/// # Ok::<(), tower_outlier_slow_call::RuleError>(())
/// ```
pub fn parse_degrade_rules(json: &str) -> Result<Vec<DegradeRule>, RuleError> {
    // Config centers and editors on Windows sometimes prepend a BOM, which serde_json rejects.
    let json = json.strip_prefix('\u{feff}').unwrap_or(json);
    let document: Value = serde_json::from_str(json).map_err(RuleError::syntax)?;
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
        .stat_interval(Duration::from_millis(interval_ms))
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
        "stat_interval" => STAT_INTERVAL_MS,
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

/// Why Sentinel degrade rules could not be read: malformed JSON, a top level that is not an array,
/// an element that is not an object, or a field that is missing, of the wrong type or out of range
/// (which carries a [`ConfigError`] naming the field as Sentinel spells it).
///
/// ```
/// use tower_outlier_slow_call::parse_degrade_rules;
///
/// let error = parse_degrade_rules(
///     r#"[{ "resource": "/testD", "count": 500, "timeWindow": "10" }]"#,
/// )
/// .unwrap_err();
/// assert_eq!(error.index(), Some(0));
/// assert_eq!(error.resource(), Some("/testD"));
/// assert_eq!(error.field(), Some("timeWindow"));
/// assert_eq!(error.config_error().unwrap().value(), "\"10\"");
///
/// let error = parse_degrade_rules("[{ \"resource\": \"/testD\",\n \"count\" 500 }]").unwrap_err();
/// assert_eq!(error.field(), None);
/// assert_eq!(error.location(), Some((2, 10)));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RuleError {
    kind: ErrorKind,
}

#[derive(Clone, Debug, PartialEq)]
enum ErrorKind {
    /// Not JSON at all; serde_json's message, which ends with the line and column.
    Syntax {
        message: String,
        line: usize,
        column: usize,
    },
    /// JSON, but not an array.
    TopLevel { shown: String },
    /// An element of the array that is not an object.
    NotAnObject { index: usize, shown: String },
    /// A field of a rule that is missing, of the wrong type or out of range.
    Invalid {
        index: usize,
        resource: Option<String>,
        error: ConfigError,
    },
}

impl RuleError {
    fn syntax(error: serde_json::Error) -> Self {
        RuleError {
            kind: ErrorKind::Syntax {
                message: error.to_string(),
                line: error.line(),
                column: error.column(),
            },
        }
    }

    fn top_level(value: &Value) -> Self {
        RuleError {
            kind: ErrorKind::TopLevel {
                shown: show_json(value),
            },
        }
    }

    fn not_an_object(index: usize, value: &Value) -> Self {
        RuleError {
            kind: ErrorKind::NotAnObject {
                index,
                shown: show_json(value),
            },
        }
    }

    fn invalid(index: usize, resource: Option<String>, error: ConfigError) -> Self {
        RuleError {
            kind: ErrorKind::Invalid {
                index,
                resource,
                error,
            },
        }
    }

    /// The resource of the offending rule, when the rule has a valid one. `None` when `resource`
    /// itself is at fault, and for errors that are not about one rule.
    pub fn resource(&self) -> Option<&str> {
        match &self.kind {
            ErrorKind::Invalid { resource, .. } => resource.as_deref(),
            _ => None,
        }
    }

    /// The offending field, as Sentinel spells it (`timeWindow`). `None` when the text is not
    /// JSON, its top level is not an array, or an element is not an object.
    pub fn field(&self) -> Option<&str> {
        self.config_error().map(ConfigError::field)
    }

    /// The position of the offending rule in the array, from 0. `None` when the text is not JSON
    /// or its top level is not an array.
    pub fn index(&self) -> Option<usize> {
        match &self.kind {
            ErrorKind::NotAnObject { index, .. } | ErrorKind::Invalid { index, .. } => Some(*index),
            ErrorKind::Syntax { .. } | ErrorKind::TopLevel { .. } => None,
        }
    }

    /// The field, value and allowed range, when one field is at fault.
    pub fn config_error(&self) -> Option<&ConfigError> {
        match &self.kind {
            ErrorKind::Invalid { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Where malformed JSON went wrong, as serde_json reports it: 1-based line and column.
    /// `None` for errors in well-formed JSON.
    pub fn location(&self) -> Option<(usize, usize)> {
        match &self.kind {
            ErrorKind::Syntax { line, column, .. } => Some((*line, *column)),
            _ => None,
        }
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Syntax { message, .. } => {
                write!(f, "Sentinel degrade rules are not valid JSON: {message}")
            }
            ErrorKind::TopLevel { shown } => write!(
                f,
                "invalid Sentinel degrade rules: the top level is {shown} (allowed: a JSON array \
                 of DegradeRule objects)"
            ),
            ErrorKind::NotAnObject { index, shown } => write!(
                f,
                "invalid Sentinel degrade rule #{index}: the rule is {shown} (allowed: a JSON \
                 object of DegradeRule fields)"
            ),
            ErrorKind::Invalid {
                index,
                resource,
                error,
            } => {
                write!(f, "invalid Sentinel degrade rule #{index}")?;
                if let Some(resource) = resource {
                    let shown = clip(Value::String(resource.clone()).to_string());
                    write!(f, " (resource {shown})")?;
                }
                write!(
                    f,
                    ": `{}` = {} (allowed: {})",
                    error.field(),
                    error.value(),
                    error.allowed()
                )
            }
        }
    }
}

// The detail is part of the message, so there is no separate source to report.
impl std::error::Error for RuleError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Strategy;
    use tower_outlier_core::text::MAX_SHOWN_CHARS;

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

    fn error_of(json: &str) -> RuleError {
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
    ) -> RuleError {
        let error = error_of(json);
        assert_eq!(error.index(), Some(index), "{json}: {error}");
        assert_eq!(error.resource(), resource, "{json}: {error}");
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
            .min_requests(5)
            .stat_interval(Duration::from_secs(1))
            .open_duration(Duration::from_secs(10))
            .build()
            .unwrap();
        assert_eq!(rule.config(), &expected);
        assert_eq!(rule.config().strategy(), slow(500, 1.0));
        assert_eq!(rule.config().min_requests(), 5);
        assert_eq!(rule.config().stat_interval(), Duration::from_secs(1));
        assert_eq!(
            rule.config().interval_shape(),
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
        assert_eq!(rules[1].config().min_requests(), 20);
        assert_eq!(rules[1].config().stat_interval(), Duration::from_secs(10));
        assert_eq!(rules[1].config().open_duration(), Duration::from_secs(30));

        assert_eq!(rules[2].resource(), "GET:/orders");
        assert_eq!(
            rules[2].config().strategy(),
            Strategy::ErrorCount { count: 3 }
        );
        assert_eq!(rules[2].config().min_requests(), 5);
        assert_eq!(rules[2].config().stat_interval(), Duration::from_secs(60));
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
        assert_eq!(rule.config().min_requests(), 5);
        assert_eq!(rule.config().stat_interval(), Duration::from_millis(1000));

        let ratio = parse_one(r#"[{"resource":"/r","grade":1,"count":0.5,"timeWindow":5}]"#);
        assert_eq!(ratio.config().min_requests(), 5);
        assert_eq!(ratio.config().stat_interval(), Duration::from_secs(1));
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
        assert_eq!(rule.config().min_requests(), 2_147_483_647);
        assert_eq!(
            rule.config().stat_interval(),
            Duration::from_millis(2_147_483_647)
        );

        let minimal = parse_one(&rule_with(
            r#""grade":2,"count":0,"timeWindow":1,"minRequestAmount":1,"statIntervalMs":1"#,
        ));
        assert_eq!(
            minimal.config().strategy(),
            Strategy::ErrorCount { count: 0 }
        );
        assert_eq!(minimal.config().stat_interval(), Duration::from_millis(1));

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
        assert_eq!(error.index(), Some(2));

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
        assert_eq!(error.resource(), Some(long.as_str()));
        let message = error.to_string();
        assert!(
            message.contains(&format!("\"{}…", "x".repeat(79))),
            "{message}"
        );
        assert!(message.len() < 300, "{message}");

        let error = error_of(r#"[{"resource":"a\nb","count":1,"timeWindow":0}]"#);
        assert_eq!(error.resource(), Some("a\nb"));
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
        assert_eq!(rule.config().min_requests(), 5);
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

        // Within one object, a repeated field keeps its last value.
        let rule = parse_one(&rule_with(r#""count":1,"timeWindow":0,"timeWindow":4"#));
        assert_eq!(rule.config().open_duration(), Duration::from_secs(4));
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
            assert_eq!(error.index(), None, "{json}");
            assert_eq!(error.field(), None);
            assert_eq!(error.resource(), None);
            assert_eq!(error.config_error(), None);
            assert_eq!(error.location(), None);
            let message = error.to_string();
            assert!(
                message.starts_with(&format!(
                    "invalid Sentinel degrade rules: the top level is {shown}"
                )),
                "{message}"
            );
            assert!(message.contains("allowed: a JSON array"), "{message}");
        }

        let error = error_of(r#"[{"resource":"/r","count":1,"timeWindow":1}, 5]"#);
        assert_eq!(error.index(), Some(1));
        assert_eq!(error.field(), None);
        assert_eq!(error.resource(), None);
        assert_eq!(error.config_error(), None);
        assert_eq!(
            error.to_string(),
            "invalid Sentinel degrade rule #1: the rule is 5 (allowed: a JSON object of \
             DegradeRule fields)"
        );
        for element in ["null", "[]", "\"/r\"", "true"] {
            let error = error_of(&format!("[{element}]"));
            assert_eq!(error.index(), Some(0), "{element}");
            assert!(error
                .to_string()
                .contains(&format!("the rule is {element} ")));
        }
    }

    #[test]
    fn malformed_json_reports_line_and_column() {
        let error = error_of("[\n  {\"resource\": \"/r\", \"count\" 1}\n]");
        assert_eq!(error.location(), Some((2, 30)));
        assert_eq!(error.index(), None);
        assert_eq!(error.field(), None);
        assert_eq!(error.config_error(), None);
        let message = error.to_string();
        assert!(
            message.starts_with("Sentinel degrade rules are not valid JSON: "),
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
            ("stat_interval", "statIntervalMs"),
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
        assert_send_sync::<RuleError>();
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
                                assert!(rule.config().min_requests() >= 1);
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
}
