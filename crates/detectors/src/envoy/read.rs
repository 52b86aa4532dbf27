//! Reading Envoy's proto3 JSON: the keys' limits and the reader of each field.

use std::time::Duration;

use serde_json::{Map, Value};
use tower_outlier_core::json::PathSegment;
use tower_outlier_core::ConfigError;

use crate::config::{DetectorBuilder, DetectorConfig};
use crate::json_reader::{self, child, element, parse_duration, written, Problem};

use super::*;

/// The two spellings of a Cluster's field that holds the message.
pub(super) const WRAPPER_PROTO: &str = "outlier_detection";
pub(super) const WRAPPER_JSON: &str = "outlierDetection";

pub(super) const TOP_ALLOWED: &str =
    "a JSON object: an envoy.config.cluster.v3.OutlierDetection message, \
                           or a Cluster fragment {\"outlier_detection\": {...}}";
pub(super) const MESSAGE_ALLOWED: &str =
    "a JSON object: an envoy.config.cluster.v3.OutlierDetection message";
pub(super) const UNKNOWN_HINT: &str =
    "not a field of envoy.config.cluster.v3.OutlierDetection; fields are \
                            spelt in snake_case or lowerCamelCase, as base_ejection_time or \
                            baseEjectionTime";
pub(super) const SIBLING_HINT: &str =
    "only outlier_detection is read from a Cluster fragment; give the \
                            OutlierDetection message alone or wrapped in {\"outlier_detection\": \
                            {...}}";
pub(super) const COUNT_ALLOWED: &str =
    "a whole number from 0 to 4294967295: a JSON number or a string of decimal digits";
pub(super) const PERCENT_ALLOWED: &str =
    "a whole number from 0 to 100: a JSON number or a string of decimal digits";
pub(super) const POSITIVE_ALLOWED: &str =
    "a duration string from 0.001s to 315576000000s, such as \"10s\" \
                                or \"1.5s\" (Envoy counts whole milliseconds)";
pub(super) const NON_NEGATIVE_ALLOWED: &str =
    "a duration string from 0s to 315576000000s, such as \"0s\" \
                                    or \"1.5s\" (Envoy counts whole milliseconds)";
pub(super) const FLAG_ALLOWED: &str = "true or false (a JSON boolean, unquoted)";
pub(super) const MONITORS_ALLOWED: &str =
    "a JSON array of TypedExtensionConfig objects (accepted with no \
                                effect: Envoy does not implement monitors)";

pub(super) fn read(text: &str) -> Result<EnvoyOutlierDetection, Problem> {
    let document = json_reader::parse(text)?;
    let top = json_reader::object(&document, &[], TOP_ALLOWED)?;
    let (message, prefix) = unwrap_cluster(top)?;
    let (builder, given) = read_message(message, &prefix)?;
    let config = builder
        .clone()
        .build()
        .map_err(|error| renamed(error, &prefix))?;
    Ok(EnvoyOutlierDetection {
        builder,
        config,
        given,
    })
}

/// The message and its path: the top level, or the value of a Cluster's `outlier_detection`.
pub(super) fn unwrap_cluster(
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
pub(super) struct Written {
    path: Vec<PathSegment>,
    value: Value,
    millis: Duration,
}

pub(super) fn read_message(
    message: &Map<String, Value>,
    prefix: &[PathSegment],
) -> Result<(DetectorBuilder, u32), Problem> {
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
    // The fields set (not left out, not null), one bit each in field order.
    let mut set = 0u32;
    for (index, (spec, entry)) in FIELDS.iter().zip(given).enumerate() {
        let Some((key, value)) = entry else { continue };
        if value.is_null() {
            continue;
        }
        set |= 1 << index;
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
    Ok((builder, set))
}

/// A `UInt32Value` at most `limit`: a JSON number without fraction, or a string of digits.
pub(super) fn count(
    value: &Value,
    path: &[PathSegment],
    allowed: &str,
    limit: u32,
) -> Result<u32, Problem> {
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
pub(super) fn millis(
    value: &Value,
    path: &[PathSegment],
    allowed: &str,
) -> Result<Duration, Problem> {
    let exact = value
        .as_str()
        .and_then(|text| parse_duration(text).ok())
        .ok_or_else(|| Problem::invalid(path.to_vec(), value, allowed))?;
    Ok(Duration::from_millis(
        exact.as_secs() * 1000 + u64::from(exact.subsec_millis()),
    ))
}

pub(super) fn flag(value: &Value, path: &[PathSegment]) -> Result<bool, Problem> {
    value
        .as_bool()
        .ok_or_else(|| Problem::invalid(path.to_vec(), value, FLAG_ALLOWED))
}

pub(super) fn monitors(value: &Value, path: &[PathSegment]) -> Result<(), Problem> {
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
pub(super) fn check_max_ejection_time(
    base: Option<&Written>,
    max: Option<&Written>,
) -> Result<(), Problem> {
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
pub(super) fn renamed(error: ConfigError, prefix: &[PathSegment]) -> Problem {
    let path = child(prefix, error.field());
    Problem::Invalid {
        error: ConfigError::new(written(&path), error.value(), error.allowed()),
        path,
    }
}
