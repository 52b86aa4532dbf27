//! Envoy's cluster `outlier_detection` (`envoy.config.cluster.v3.OutlierDetection`) in proto3
//! JSON, read into a [`DetectorConfig`].
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (fields, defaults, validation) lives on [`EnvoyOutlierDetection`]. The field table
//! is in `fields`, the error type in `error`; what is shared with the gRPC reader (the duration
//! grammar, paths, the error detail) is in `json_reader`.

mod error;
mod fields;

use std::time::Duration;

use serde_json::{Map, Value};
use tower_outlier_core::json::PathSegment;
use tower_outlier_core::ConfigError;

use crate::config::{DetectorBuilder, DetectorConfig};
use crate::json_reader::{self, child, element, parse_duration, written, Problem};

pub use self::error::EnvoyConfigError;
use self::fields::{Kind, Spec, BASE_EJECTION_TIME, FIELDS, MAX_EJECTION_TIME};

/// The two spellings of a Cluster's field that holds the message.
const WRAPPER_PROTO: &str = "outlier_detection";
const WRAPPER_JSON: &str = "outlierDetection";

const TOP_ALLOWED: &str = "a JSON object: an envoy.config.cluster.v3.OutlierDetection message, \
                           or a Cluster fragment {\"outlier_detection\": {...}}";
const MESSAGE_ALLOWED: &str = "a JSON object: an envoy.config.cluster.v3.OutlierDetection message";
const UNKNOWN_HINT: &str = "not a field of envoy.config.cluster.v3.OutlierDetection; fields are \
                            spelt in snake_case or lowerCamelCase, as base_ejection_time or \
                            baseEjectionTime";
const SIBLING_HINT: &str = "only outlier_detection is read from a Cluster fragment; give the \
                            OutlierDetection message alone or wrapped in {\"outlier_detection\": \
                            {...}}";
const COUNT_ALLOWED: &str =
    "a whole number from 0 to 4294967295: a JSON number or a string of decimal digits";
const PERCENT_ALLOWED: &str =
    "a whole number from 0 to 100: a JSON number or a string of decimal digits";
const POSITIVE_ALLOWED: &str = "a duration string from 0.001s to 315576000000s, such as \"10s\" \
                                or \"1.5s\" (Envoy counts whole milliseconds)";
const NON_NEGATIVE_ALLOWED: &str = "a duration string from 0s to 315576000000s, such as \"0s\" \
                                    or \"1.5s\" (Envoy counts whole milliseconds)";
const FLAG_ALLOWED: &str = "true or false (a JSON boolean, unquoted)";
const MONITORS_ALLOWED: &str = "a JSON array of TypedExtensionConfig objects (accepted with no \
                                effect: Envoy does not implement monitors)";

/// An Envoy cluster's `outlier_detection`, read from proto3 JSON into a validated
/// [`DetectorConfig`] of the [`Envoy`](crate::DetectorSemantics::Envoy) semantics.
///
/// Read it with [`from_json`](Self::from_json), then take the [`config`](Self::config), or the
/// [`builder`](Self::builder) to adjust before [`build`](DetectorBuilder::build). Every field of
/// `envoy.config.cluster.v3.OutlierDetection` (Envoy's
/// `api/envoy/config/cluster/v3/outlier_detection.proto`, fields 1 to 25) is understood; a field
/// left out, or `null`, keeps Envoy's default, which is [`DetectorConfig::envoy`]'s:
///
/// | field (`snake_case` / `lowerCamelCase`) | builder setting | allowed | Envoy default |
/// |---|---|---|---|
/// | `consecutive_5xx` | [`consecutive_5xx`](DetectorBuilder::consecutive_5xx) | 0 to 2³² − 1 | 5 |
/// | `interval` | [`interval`](DetectorBuilder::interval) | duration > 0 | 10s |
/// | `base_ejection_time` | [`base_ejection_time`](DetectorBuilder::base_ejection_time) | duration > 0 | 30s |
/// | `max_ejection_percent` | [`max_ejection_percent`](DetectorBuilder::max_ejection_percent) | 0 to 100 | 10 |
/// | `enforcing_consecutive_5xx` | [`enforcing_consecutive_5xx`](DetectorBuilder::enforcing_consecutive_5xx) | 0 to 100 | 100 |
/// | `enforcing_success_rate` | [`enforcing_success_rate`](DetectorBuilder::enforcing_success_rate) | 0 to 100 | 100 |
/// | `success_rate_minimum_hosts` | [`success_rate_minimum_hosts`](DetectorBuilder::success_rate_minimum_hosts) | 0 to 2³² − 1 | 5 |
/// | `success_rate_request_volume` | [`success_rate_request_volume`](DetectorBuilder::success_rate_request_volume) | 0 to 2³² − 1 | 100 |
/// | `success_rate_stdev_factor` | [`success_rate_stdev_factor`](DetectorBuilder::success_rate_stdev_factor) | 0 to 2³² − 1 | 1900 |
/// | `consecutive_gateway_failure` | [`consecutive_gateway_failure`](DetectorBuilder::consecutive_gateway_failure) | 0 to 2³² − 1 | 5 |
/// | `enforcing_consecutive_gateway_failure` | [`enforcing_consecutive_gateway_failure`](DetectorBuilder::enforcing_consecutive_gateway_failure) | 0 to 100 | **0** |
/// | `split_external_local_origin_errors` | [`split_external_local_origin_errors`](DetectorBuilder::split_external_local_origin_errors) | `true` / `false` | false |
/// | `consecutive_local_origin_failure` | [`consecutive_local_origin_failure`](DetectorBuilder::consecutive_local_origin_failure) | 0 to 2³² − 1 | 5 |
/// | `enforcing_consecutive_local_origin_failure` | [`enforcing_consecutive_local_origin_failure`](DetectorBuilder::enforcing_consecutive_local_origin_failure) | 0 to 100 | 100 |
/// | `enforcing_local_origin_success_rate` | [`enforcing_local_origin_success_rate`](DetectorBuilder::enforcing_local_origin_success_rate) | 0 to 100 | 100 |
/// | `failure_percentage_threshold` | [`failure_percentage_threshold`](DetectorBuilder::failure_percentage_threshold) | 0 to 100 | 85 |
/// | `enforcing_failure_percentage` | [`enforcing_failure_percentage`](DetectorBuilder::enforcing_failure_percentage) | 0 to 100 | **0** |
/// | `enforcing_failure_percentage_local_origin` | [`enforcing_failure_percentage_local_origin`](DetectorBuilder::enforcing_failure_percentage_local_origin) | 0 to 100 | 0 |
/// | `failure_percentage_minimum_hosts` | [`failure_percentage_minimum_hosts`](DetectorBuilder::failure_percentage_minimum_hosts) | 0 to 2³² − 1 | 5 |
/// | `failure_percentage_request_volume` | [`failure_percentage_request_volume`](DetectorBuilder::failure_percentage_request_volume) | 0 to 2³² − 1 | 50 |
/// | `max_ejection_time` | [`max_ejection_time`](DetectorBuilder::max_ejection_time) | duration ≥ `base_ejection_time` | max(300s, base) |
/// | `max_ejection_time_jitter` | [`max_ejection_time_jitter`](DetectorBuilder::max_ejection_time_jitter) | duration ≥ 0 | 0s |
/// | `always_eject_one_host` | [`always_eject_one_host`](DetectorBuilder::always_eject_one_host) | `true` / `false` | false |
/// | `successful_active_health_check_uneject_host` | — (accepted, no effect) | `true` / `false` | true |
/// | `monitors` | — (accepted, no effect) | array of objects | empty |
///
/// The success-rate and failure-percentage detectors are always present, as in Envoy; an
/// enforcement of 0 (the failure-percentage default) counts detections without ejecting.
///
/// # The JSON
///
/// The text is proto3 JSON, read as protobuf's JSON parser reads it (Envoy's, for static and xDS
/// configuration):
///
/// * **Field names** are accepted in both spellings, the proto's (`base_ejection_time`) and
///   lowerCamelCase (`baseEjectionTime`); they are case-sensitive. A field given under both is an
///   error, as a key given twice is (protobuf's parser rejects a field set twice).
/// * **Unknown fields are errors** naming the field, as protobuf's parser makes them by default
///   and Envoy does for its static configuration.
/// * **Counts and percentages** (`UInt32Value`) are JSON numbers with no fraction (`5`, and also
///   `5.0` or `5e0`), or strings of decimal digits (`"5"`), as proto3 JSON allows for integers.
/// * **Durations** are strings: `-`, digits, optionally `.` and one to nine digits, then `s`
///   (`"10s"`, `"1.5s"`, `"0.000000001s"`), at most 315 576 000 000 s (protobuf's range). Envoy
///   rejects negative durations in every field, and `interval`, `base_ejection_time` and
///   `max_ejection_time` must be greater than zero (`gt: {}` in the proto). **Envoy keeps whole
///   milliseconds** (it truncates each duration to milliseconds when it loads the cluster), so
///   the reader does too: `"1.5009s"` is 1.5 s, and a positive duration under 1 ms, which Envoy
///   would run as zero, is rejected.
/// * **Booleans** are `true` or `false`, unquoted.
/// * **`null`** for any field leaves it unset: it keeps its default.
/// * `max_ejection_time` below `base_ejection_time` (or below the default 30 s when the base is
///   not given) is an error, as Envoy refuses such a cluster.
///
/// The message may be given alone (`{"interval": "5s"}`) or as a Cluster fragment holding only
/// it (`{"outlier_detection": {"interval": "5s"}}`, or `outlierDetection`); in the fragment,
/// any other Cluster field is an unknown field, and `null` is rejected (a Cluster without
/// `outlier_detection` has no outlier detection at all, which no `DetectorConfig` describes).
///
/// # Fields without effect
///
/// * `successful_active_health_check_uneject_host` is accepted, as a boolean, and has no effect:
///   it decides whether a successful *active* health check re-admits an ejected host, and this
///   crate has no active health checking (re-admission is by time, as in Envoy without health
///   checks).
/// * `monitors` is accepted, as an array of objects (or `null`), and has no effect: the proto
///   marks it not implemented and Envoy ignores it too. Its entries are not validated further.
///
/// Envoy's runtime overrides (`outlier_detection.*` runtime keys) are not part of this message
/// and are not read.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(docsrs, doc(cfg(feature = "envoy")))]
pub struct EnvoyOutlierDetection {
    builder: DetectorBuilder,
    config: DetectorConfig,
}

impl EnvoyOutlierDetection {
    /// Reads an Envoy `outlier_detection` message (or a Cluster fragment holding only it) from
    /// proto3 JSON and validates it.
    ///
    /// # Errors
    ///
    /// An [`EnvoyConfigError`] for malformed JSON (serde_json's message, with line and column),
    /// a key given twice anywhere in the text or a field given under both spellings, an unknown
    /// field, a value of the wrong JSON type or out of range, or a `max_ejection_time` below the
    /// base. It names the field as written, with its path (`outlierDetection.baseEjectionTime`),
    /// the value as written and the allowed range.
    ///
    /// Malformed JSON is reported first, then a repeated key (the first in reading order), then
    /// unknown fields and fields given twice (in the order of their names), then values in the
    /// proto's field order, then `max_ejection_time` against the base.
    ///
    /// # Example
    ///
    /// The cluster example of Envoy's documentation (Peak EWMA load balancer), in JSON:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier_detectors::EnvoyOutlierDetection;
    ///
    /// let envoy = EnvoyOutlierDetection::from_json(
    ///     r#"{"outlier_detection": {"consecutive_5xx": 3, "interval": "30s", "base_ejection_time": "30s"}}"#,
    /// )?;
    /// let config = envoy.config();
    /// assert_eq!(config.consecutive_5xx().threshold, 3);
    /// assert_eq!(config.interval(), Duration::from_secs(30));
    /// assert_eq!(config.base_ejection_time(), Duration::from_secs(30));
    /// assert_eq!(config.max_ejection_time(), Duration::from_secs(300)); // Envoy's default
    ///
    /// // lowerCamelCase, quoted integers and a builder adjusted before building:
    /// let config = EnvoyOutlierDetection::from_json(
    ///     r#"{"consecutive5xx": "7", "maxEjectionPercent": 50}"#,
    /// )?
    /// .builder()
    /// .always_eject_one_host(true)
    /// .build()?;
    /// assert_eq!(config.consecutive_5xx().threshold, 7);
    /// assert_eq!(config.budget().max_ejected(1), 1);
    ///
    /// // Errors name the field as written, the value and the allowed range.
    /// let error = EnvoyOutlierDetection::from_json(r#"{"maxEjectionPercent": 101}"#).unwrap_err();
    /// assert_eq!(error.field(), Some("maxEjectionPercent"));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid Envoy outlier_detection: `maxEjectionPercent` = 101 (allowed: a whole number \
    ///      from 0 to 100: a JSON number or a string of decimal digits)"
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Self, EnvoyConfigError> {
        read(text).map_err(EnvoyConfigError::new)
    }

    /// The validated configuration.
    pub fn config(&self) -> &DetectorConfig {
        &self.config
    }

    /// The validated configuration, by value.
    pub fn into_config(self) -> DetectorConfig {
        self.config
    }

    /// The builder the configuration was built from, to adjust before
    /// [`build`](DetectorBuilder::build); its errors name the builder's settings
    /// (`max_ejection_time`), not the document's keys.
    pub fn builder(&self) -> DetectorBuilder {
        self.builder.clone()
    }
}

fn read(text: &str) -> Result<EnvoyOutlierDetection, Problem> {
    let document = json_reader::parse(text)?;
    let top = json_reader::object(&document, &[], TOP_ALLOWED)?;
    let (message, prefix) = unwrap_cluster(top)?;
    let builder = read_message(message, &prefix)?;
    let config = builder
        .clone()
        .build()
        .map_err(|error| renamed(error, &prefix))?;
    Ok(EnvoyOutlierDetection { builder, config })
}

/// The message and its path: the top level, or the value of a Cluster's `outlier_detection`.
fn unwrap_cluster(
    top: &Map<String, Value>,
) -> Result<(&Map<String, Value>, Vec<PathSegment>), Problem> {
    let wrapper = match (
        top.contains_key(WRAPPER_PROTO),
        top.contains_key(WRAPPER_JSON),
    ) {
        (false, false) => return Ok((top, Vec::new())),
        (true, true) => return Err(Problem::alias(child(&[], WRAPPER_PROTO), WRAPPER_JSON)),
        (true, false) => WRAPPER_PROTO,
        (false, true) => WRAPPER_JSON,
    };
    if let Some(sibling) = top.keys().find(|key| *key != wrapper) {
        return Err(Problem::unknown(child(&[], sibling), SIBLING_HINT));
    }
    let prefix = child(&[], wrapper);
    let message = json_reader::object(&top[wrapper], &prefix, MESSAGE_ALLOWED)?;
    Ok((message, prefix))
}

/// A duration as given and as Envoy keeps it, with where it was written.
struct Written {
    path: Vec<PathSegment>,
    value: Value,
    millis: Duration,
}

fn read_message(
    message: &Map<String, Value>,
    prefix: &[PathSegment],
) -> Result<DetectorBuilder, Problem> {
    // First every key is matched to its field, so that a misspelt or doubled field is reported
    // before any value.
    let mut given: Vec<Option<(&str, &Value)>> = vec![None; FIELDS.len()];
    for (key, value) in message {
        let Some(index) = Spec::position(key) else {
            return Err(Problem::unknown(child(prefix, key), UNKNOWN_HINT));
        };
        if given[index].is_some() {
            // Both spellings were given (a key repeated verbatim fails earlier, when parsing).
            let spec = &FIELDS[index];
            return Err(Problem::alias(child(prefix, spec.proto), spec.json));
        }
        given[index] = Some((key, value));
    }

    let mut builder = DetectorConfig::envoy();
    let mut base = None;
    let mut max = None;
    for (spec, entry) in FIELDS.iter().zip(given) {
        let Some((key, value)) = entry else { continue };
        if value.is_null() {
            continue;
        }
        let path = child(prefix, key);
        builder = match spec.kind {
            Kind::Count(apply) => apply(builder, count(value, &path, COUNT_ALLOWED, u32::MAX)?),
            Kind::Percent(apply) => apply(builder, count(value, &path, PERCENT_ALLOWED, 100)?),
            Kind::Positive(apply) => {
                let millis = millis(value, &path, POSITIVE_ALLOWED)?;
                if millis.is_zero() {
                    return Err(Problem::invalid(path, value, POSITIVE_ALLOWED));
                }
                let written = Some(Written {
                    path,
                    value: value.clone(),
                    millis,
                });
                match spec.proto {
                    BASE_EJECTION_TIME => base = written,
                    MAX_EJECTION_TIME => max = written,
                    _ => {}
                }
                apply(builder, millis)
            }
            Kind::NonNegative(apply) => apply(builder, millis(value, &path, NON_NEGATIVE_ALLOWED)?),
            Kind::Flag(apply) => apply(builder, flag(value, &path)?),
            Kind::UnusedFlag => {
                flag(value, &path)?;
                builder
            }
            Kind::Monitors => {
                monitors(value, &path)?;
                builder
            }
        };
    }
    check_max_ejection_time(base.as_ref(), max.as_ref())?;
    Ok(builder)
}

/// A `UInt32Value` at most `limit`: a JSON number without fraction, or a string of digits.
fn count(value: &Value, path: &[PathSegment], allowed: &str, limit: u32) -> Result<u32, Problem> {
    let read = match value {
        Value::Number(number) => match number.as_u64() {
            Some(whole) => u32::try_from(whole).ok(),
            // `5.0` and `5e0` are whole numbers too; the bounds keep the cast exact.
            None => number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(f))
                .map(|f| f as u32),
        },
        // Only ASCII digits, as proto3 JSON writes them (protobuf's parser refuses spaces and
        // exponents in quoted integers as well).
        Value::String(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            text.parse().ok()
        }
        _ => None,
    };
    read.filter(|n| *n <= limit)
        .ok_or_else(|| Problem::invalid(path.to_vec(), value, allowed))
}

/// A `Duration` string, truncated to whole milliseconds as Envoy keeps it.
fn millis(value: &Value, path: &[PathSegment], allowed: &str) -> Result<Duration, Problem> {
    let exact = value
        .as_str()
        .and_then(|text| parse_duration(text).ok())
        .ok_or_else(|| Problem::invalid(path.to_vec(), value, allowed))?;
    Ok(Duration::from_millis(
        exact.as_secs() * 1000 + u64::from(exact.subsec_millis()),
    ))
}

fn flag(value: &Value, path: &[PathSegment]) -> Result<bool, Problem> {
    value
        .as_bool()
        .ok_or_else(|| Problem::invalid(path.to_vec(), value, FLAG_ALLOWED))
}

fn monitors(value: &Value, path: &[PathSegment]) -> Result<(), Problem> {
    let Value::Array(entries) = value else {
        return Err(Problem::invalid(path.to_vec(), value, MONITORS_ALLOWED));
    };
    for (index, entry) in entries.iter().enumerate() {
        if !entry.is_object() {
            return Err(Problem::invalid(
                element(path, index),
                entry,
                MONITORS_ALLOWED,
            ));
        }
    }
    Ok(())
}

/// Envoy refuses a cluster whose `max_ejection_time` is below its base (in whole milliseconds).
fn check_max_ejection_time(base: Option<&Written>, max: Option<&Written>) -> Result<(), Problem> {
    let Some(max) = max else { return Ok(()) };
    let (base_millis, base_name) = match base {
        Some(base) => (base.millis, format!("`{}`", written(&base.path))),
        None => (
            Duration::from_secs(30),
            "base_ejection_time (default)".to_owned(),
        ),
    };
    if max.millis >= base_millis {
        return Ok(());
    }
    Err(Problem::invalid(
        max.path.clone(),
        &max.value,
        format!("a duration string of at least {base_name}, {base_millis:?}"),
    ))
}

/// A builder error under the document's key, with `prefix`. Every value the builder checks is
/// checked above, so this only happens if the builder grows a rule the reader does not know.
fn renamed(error: ConfigError, prefix: &[PathSegment]) -> Problem {
    let path = child(prefix, error.field());
    Problem::Invalid {
        error: ConfigError::new(written(&path), error.value(), error.allowed()),
        path,
    }
}

#[cfg(test)]
mod tests;
