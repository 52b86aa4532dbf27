//! Alibaba Sentinel's circuit-breaking rules (`DegradeRule` JSON), read into [`BreakerConfig`]s.
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (fields, defaults, validation) lives on [`parse_degrade_rules`], where rustdoc shows
//! it. `error` builds its errors, [`DocumentError`]s.

mod error;

use serde_json::Value;
use tower_outlier_core::{json, DocumentError};

use crate::config::BreakerConfig;

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
    /// # Ok::<(), tower_outlier_slow_call::DocumentError>(())
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
/// | `timeWindow` | [`open_duration`](crate::BreakerBuilder::open_duration), in seconds | integer 1 to 2³¹ − 1 | required |
/// | `minRequestAmount` | [`min_requests`](crate::BreakerBuilder::min_requests) | integer 1 to 2³¹ − 1 | 5 |
/// | `statIntervalMs` | [`window`](crate::BreakerBuilder::window), in ms | integer 1 to 2³¹ − 1 | 1000 |
/// | `slowRatioThreshold` | [`ratio`](crate::BreakerBuilder::ratio) (grade 0 only) | number in `[0, 1]` | 1.0 |
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
/// A [`DocumentError`] for malformed JSON (with serde_json's message, line and column), a key given
/// twice in an object ([`DocumentError::is_duplicate`]), a top level that is not an array, an element
/// that is not an object, or a field that is missing, of the wrong JSON type or out of range. The
/// last names the rule's position in the array ([`DocumentError::entry`], from 0, as in
/// `jq '.[2]'`), its resource when that was valid ([`DocumentError::entry_name`]), the field as Sentinel spells it, the value as written (JSON re-serialised, clipped at
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
/// assert_eq!(error.entry(), Some(2));
/// assert_eq!(error.entry_name(), Some("GET:/orders"));
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
/// assert_eq!(error.entry(), Some(0));
/// assert_eq!(error.field(), Some("count"));
/// assert_eq!(
///     error.to_string(),
///     "invalid Sentinel degrade rule #0: field `count` is given more than once"
/// );
/// # Ok::<(), tower_outlier_slow_call::DocumentError>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub fn parse_degrade_rules(json: &str) -> Result<Vec<DegradeRule>, DocumentError> {
    // Config centers and editors on Windows sometimes prepend a BOM, which serde_json rejects.
    let json = json.strip_prefix('\u{feff}').unwrap_or(json);
    let document = json::parse(json).map_err(error::from_parse)?;
    let elements = match &document {
        Value::Array(elements) => elements,
        other => return Err(error::top_level(other)),
    };
    elements
        .iter()
        .enumerate()
        .map(|(index, element)| read_rule(index, element))
        .collect()
}

mod read;
use read::*;

#[cfg(test)]
mod tests;
