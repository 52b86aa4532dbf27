//! Reading gRPC's service config: the keys, their limits and the readers of each field.

use std::time::Duration;

use serde_json::{Map, Value};
use tower_outlier_core::json::PathSegment;
use tower_outlier_core::ConfigError;

use crate::config::{DetectorBuilder, DetectorConfig};
use crate::json_reader::{self, child, element, parse_duration, written, Problem};

use super::*;

/// The policy's name in gRPC's registry and in `loadBalancingConfig`.
pub(super) const POLICY: &str = "outlier_detection_experimental";
/// The service config's list of policies, the first one gRPC supports being used.
pub(super) const LOAD_BALANCING_CONFIG: &str = "loadBalancingConfig";

pub(super) const INTERVAL: &str = "interval";
pub(super) const BASE_EJECTION_TIME: &str = "baseEjectionTime";
pub(super) const MAX_EJECTION_TIME: &str = "maxEjectionTime";
pub(super) const MAX_EJECTION_PERCENT: &str = "maxEjectionPercent";
pub(super) const SUCCESS_RATE: &str = "successRateEjection";
pub(super) const FAILURE_PERCENTAGE: &str = "failurePercentageEjection";
pub(super) const CHILD_POLICY: &str = "childPolicy";
pub(super) const STDEV_FACTOR: &str = "stdevFactor";
pub(super) const THRESHOLD: &str = "threshold";
pub(super) const ENFORCEMENT: &str = "enforcementPercentage";
pub(super) const MINIMUM_HOSTS: &str = "minimumHosts";
pub(super) const REQUEST_VOLUME: &str = "requestVolume";

pub(super) const CONFIG_FIELDS: [&str; 7] = [
    INTERVAL,
    BASE_EJECTION_TIME,
    MAX_EJECTION_TIME,
    MAX_EJECTION_PERCENT,
    SUCCESS_RATE,
    FAILURE_PERCENTAGE,
    CHILD_POLICY,
];
pub(super) const SUCCESS_RATE_FIELDS: [&str; 4] =
    [STDEV_FACTOR, ENFORCEMENT, MINIMUM_HOSTS, REQUEST_VOLUME];
pub(super) const FAILURE_PERCENTAGE_FIELDS: [&str; 4] =
    [THRESHOLD, ENFORCEMENT, MINIMUM_HOSTS, REQUEST_VOLUME];

/// The JSON names grpc-go used for the enforcement percentages before it followed A50's
/// `enforcementPercentage`; gRPC now ignores them.
pub(super) const SUCCESS_RATE_FORMER: [(&str, &str); 1] = [("enforcingSuccessRate", ENFORCEMENT)];
pub(super) const FAILURE_PERCENTAGE_FORMER: [(&str, &str); 1] =
    [("enforcingFailurePercentage", ENFORCEMENT)];

pub(super) const TOP_ALLOWED: &str =
    "a JSON object: the outlier_detection_experimental config, an \
                           {\"outlier_detection_experimental\": {...}} entry, or a service config \
                           with loadBalancingConfig";
pub(super) const CONFIG_ALLOWED: &str = "a JSON object: the outlier_detection_experimental config";
pub(super) const LIST_ALLOWED: &str =
    "a JSON array of {\"policy_name\": {config}} entries, one of them \
                            {\"outlier_detection_experimental\": {...}}";
pub(super) const ENTRY_ALLOWED: &str =
    "a JSON object holding exactly one policy name and its config";
pub(super) const ENTRY_HINT: &str =
    "a loadBalancingConfig entry holds outlier_detection_experimental alone";
pub(super) const POSITIVE_ALLOWED: &str =
    "a duration string greater than 0s and at most 315576000000s, \
                                such as \"10s\" or \"0.050s\"";
pub(super) const NON_NEGATIVE_ALLOWED: &str =
    "a duration string from 0s to 315576000000s, such as \"300s\" or \"0.050s\"";
pub(super) const COUNT_ALLOWED: &str = "a JSON integer from 0 to 4294967295";
pub(super) const PERCENT_ALLOWED: &str = "a JSON integer from 0 to 100";
pub(super) const ALGORITHM_ALLOWED: &str =
    "a JSON object (present, the algorithm runs; absent, it does not)";
pub(super) const CHILD_POLICY_ALLOWED: &str =
    "a non-empty JSON array of {\"policy_name\": {config}} objects, one key each";

pub(super) fn read(text: &str) -> Result<GrpcOutlierDetection, Problem> {
    let document = json_reader::parse(text)?;
    let top = json_reader::object(&document, &[], TOP_ALLOWED)?;
    let (value, prefix) = locate(&document, top)?;
    let config = json_reader::object(value, &prefix, CONFIG_ALLOWED)?;
    let config_fields = config;
    let mut ignored_fields = Vec::new();
    let builder = read_config(config, &prefix, &mut ignored_fields)?;
    let config = builder
        .clone()
        .build()
        .map_err(|error| renamed(error, &prefix))?;
    // The top-level fields given, for the notes on what a config leaves to its defaults.
    let given = CONFIG_FIELDS
        .iter()
        .copied()
        .filter(|field| config_fields.get(*field).is_some_and(|v| !v.is_null()))
        .collect();
    Ok(GrpcOutlierDetection {
        builder,
        config,
        ignored_fields,
        given,
    })
}

/// The policy's config and its path, in whichever of the three forms the text is; `top` is
/// `document`'s object.
pub(super) fn locate<'v>(
    document: &'v Value,
    top: &'v Map<String, Value>,
) -> Result<(&'v Value, Vec<PathSegment>), Problem> {
    if let Some(list) = top.get(LOAD_BALANCING_CONFIG) {
        let path = child(&[], LOAD_BALANCING_CONFIG);
        let Value::Array(entries) = list else {
            return Err(Problem::invalid(path, list, LIST_ALLOWED));
        };
        for (index, entry) in entries.iter().enumerate() {
            let entry_path = element(&path, index);
            match entry {
                Value::Object(policy) if policy.len() == 1 => {
                    if let Some(config) = policy.get(POLICY) {
                        return Ok((config, child(&entry_path, POLICY)));
                    }
                }
                other => return Err(Problem::invalid(entry_path, other, ENTRY_ALLOWED)),
            }
        }
        return Err(Problem::invalid(path, list, LIST_ALLOWED));
    }
    if let Some(config) = top.get(POLICY) {
        if let Some(sibling) = top.keys().find(|key| *key != POLICY) {
            return Err(Problem::unknown(child(&[], sibling), ENTRY_HINT));
        }
        return Ok((config, child(&[], POLICY)));
    }
    Ok((document, Vec::new()))
}

pub(super) fn read_config(
    config: &Map<String, Value>,
    prefix: &[PathSegment],
    ignored: &mut Vec<String>,
) -> Result<DetectorBuilder, Problem> {
    check_names(config, prefix, &CONFIG_FIELDS, &[], ignored)?;
    let mut builder = DetectorConfig::grpc();
    if let Some(value) = config.get(INTERVAL) {
        builder = builder.interval(duration(value, &child(prefix, INTERVAL), false)?);
    }
    if let Some(value) = config.get(BASE_EJECTION_TIME) {
        let path = child(prefix, BASE_EJECTION_TIME);
        builder = builder.base_ejection_time(duration(value, &path, false)?);
    }
    if let Some(value) = config.get(MAX_EJECTION_TIME) {
        let path = child(prefix, MAX_EJECTION_TIME);
        builder = builder.max_ejection_time(duration(value, &path, false)?);
    }
    if let Some(value) = config.get(MAX_EJECTION_PERCENT) {
        let path = child(prefix, MAX_EJECTION_PERCENT);
        builder = builder.max_ejection_percent(integer(value, &path, 100)?);
    }
    builder = match config.get(SUCCESS_RATE) {
        None => builder.success_rate(None),
        Some(value) => {
            let path = child(prefix, SUCCESS_RATE);
            let fields = json_reader::object(value, &path, ALGORITHM_ALLOWED)?;
            check_names(
                fields,
                &path,
                &SUCCESS_RATE_FIELDS,
                &SUCCESS_RATE_FORMER,
                ignored,
            )?;
            let get = |name, limit, default| optional(fields, &path, name, limit, default);
            builder
                .success_rate_stdev_factor(get(STDEV_FACTOR, u32::MAX, 1900)?)
                .enforcing_success_rate(get(ENFORCEMENT, 100, 100)?)
                .success_rate_minimum_hosts(get(MINIMUM_HOSTS, u32::MAX, 5)?)
                .success_rate_request_volume(get(REQUEST_VOLUME, u32::MAX, 100)?)
        }
    };
    builder = match config.get(FAILURE_PERCENTAGE) {
        None => builder.failure_percentage(None),
        Some(value) => {
            let path = child(prefix, FAILURE_PERCENTAGE);
            let fields = json_reader::object(value, &path, ALGORITHM_ALLOWED)?;
            check_names(
                fields,
                &path,
                &FAILURE_PERCENTAGE_FIELDS,
                &FAILURE_PERCENTAGE_FORMER,
                ignored,
            )?;
            let get = |name, limit, default| optional(fields, &path, name, limit, default);
            builder
                .failure_percentage_threshold(get(THRESHOLD, 100, 85)?)
                // A50's default; grpc-go's is 0 (see the type's documentation).
                .enforcing_failure_percentage(get(ENFORCEMENT, 100, 100)?)
                .failure_percentage_minimum_hosts(get(MINIMUM_HOSTS, u32::MAX, 5)?)
                .failure_percentage_request_volume(get(REQUEST_VOLUME, u32::MAX, 50)?)
        }
    };
    if let Some(value) = config.get(CHILD_POLICY) {
        child_policy(value, &child(prefix, CHILD_POLICY))?;
    }
    Ok(builder)
}

/// Letters only, lower case: `base_ejection_time`, `BaseEjectionTime` and `baseEjectionTime`
/// all become `baseejectiontime`.
pub(super) fn folded(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Refuses other spellings of `known` fields and the `former` names; lists the rest in `ignored`.
pub(super) fn check_names(
    object: &Map<String, Value>,
    path: &[PathSegment],
    known: &[&str],
    former: &[(&str, &str)],
    ignored: &mut Vec<String>,
) -> Result<(), Problem> {
    for key in object.keys() {
        if known.contains(&key.as_str()) {
            continue;
        }
        let folded_key = folded(key);
        if let Some(field) = known.iter().find(|field| folded(field) == folded_key) {
            return Err(Problem::unknown(
                child(path, key),
                format!(
                    "gRPC reads this field only as `{field}`; other spellings are ignored, or \
                     read by grpc-go alone"
                ),
            ));
        }
        if let Some((_, current)) = former.iter().find(|(old, _)| folded(old) == folded_key) {
            return Err(Problem::unknown(
                child(path, key),
                format!("an older grpc-go name, which gRPC now ignores; write `{current}`"),
            ));
        }
        ignored.push(written(&child(path, key)));
    }
    Ok(())
}

/// A `Duration` string; zero refused when `positive`.
pub(super) fn duration(
    value: &Value,
    path: &[PathSegment],
    positive: bool,
) -> Result<Duration, Problem> {
    let allowed = if positive {
        POSITIVE_ALLOWED
    } else {
        NON_NEGATIVE_ALLOWED
    };
    value
        .as_str()
        .and_then(|text| parse_duration(text).ok())
        .filter(|duration| !(positive && duration.is_zero()))
        .ok_or_else(|| Problem::invalid(path.to_vec(), value, allowed))
}

/// A JSON integer literal from 0 to `limit` (`serde_json` keeps `10.0` and `1e1` as floats,
/// which have no `u64`).
pub(super) fn integer(value: &Value, path: &[PathSegment], limit: u32) -> Result<u32, Problem> {
    let allowed = if limit == 100 {
        PERCENT_ALLOWED
    } else {
        COUNT_ALLOWED
    };
    value
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n <= limit)
        .ok_or_else(|| Problem::invalid(path.to_vec(), value, allowed))
}

/// The integer `name` of an algorithm's object, or its `default` when absent.
pub(super) fn optional(
    fields: &Map<String, Value>,
    path: &[PathSegment],
    name: &str,
    limit: u32,
    default: u32,
) -> Result<u32, Problem> {
    match fields.get(name) {
        None => Ok(default),
        Some(value) => integer(value, &child(path, name), limit),
    }
}

pub(super) fn child_policy(value: &Value, path: &[PathSegment]) -> Result<(), Problem> {
    match value {
        Value::Array(entries) if !entries.is_empty() => {
            for (index, entry) in entries.iter().enumerate() {
                if !matches!(entry, Value::Object(policy) if policy.len() == 1) {
                    return Err(Problem::invalid(
                        element(path, index),
                        entry,
                        CHILD_POLICY_ALLOWED,
                    ));
                }
            }
            Ok(())
        }
        other => Err(Problem::invalid(path.to_vec(), other, CHILD_POLICY_ALLOWED)),
    }
}

/// A builder error under `prefix`. Every value the builder checks is checked above, so this only
/// happens if the builder grows a rule the reader does not know.
pub(super) fn renamed(error: ConfigError, prefix: &[PathSegment]) -> Problem {
    let path = child(prefix, error.field());
    Problem::Invalid {
        error: ConfigError::new(written(&path), error.value(), error.allowed()),
        path,
    }
}
