//! gRPC's `outlier_detection_experimental` load-balancing config (proposal A50), read into a
//! [`DetectorConfig`].
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (fields, defaults, validation, where gRPC's implementations differ) lives on
//! [`GrpcOutlierDetection`]. The error type is in `error`; what is shared with the Envoy reader
//! (the duration grammar, paths, the error detail) is in `json_reader`.

mod error;

use std::time::Duration;

use serde_json::{Map, Value};
use tower_outlier_core::json::PathSegment;
use tower_outlier_core::ConfigError;

use crate::config::{DetectorBuilder, DetectorConfig};
use crate::json_reader::{self, child, element, parse_duration, written, Problem};

pub use self::error::GrpcConfigError;

/// The policy's name in gRPC's registry and in `loadBalancingConfig`.
const POLICY: &str = "outlier_detection_experimental";
/// The service config's list of policies, the first one gRPC supports being used.
const LOAD_BALANCING_CONFIG: &str = "loadBalancingConfig";

const INTERVAL: &str = "interval";
const BASE_EJECTION_TIME: &str = "baseEjectionTime";
const MAX_EJECTION_TIME: &str = "maxEjectionTime";
const MAX_EJECTION_PERCENT: &str = "maxEjectionPercent";
const SUCCESS_RATE: &str = "successRateEjection";
const FAILURE_PERCENTAGE: &str = "failurePercentageEjection";
const CHILD_POLICY: &str = "childPolicy";
const STDEV_FACTOR: &str = "stdevFactor";
const THRESHOLD: &str = "threshold";
const ENFORCEMENT: &str = "enforcementPercentage";
const MINIMUM_HOSTS: &str = "minimumHosts";
const REQUEST_VOLUME: &str = "requestVolume";

const CONFIG_FIELDS: [&str; 7] = [
    INTERVAL,
    BASE_EJECTION_TIME,
    MAX_EJECTION_TIME,
    MAX_EJECTION_PERCENT,
    SUCCESS_RATE,
    FAILURE_PERCENTAGE,
    CHILD_POLICY,
];
const SUCCESS_RATE_FIELDS: [&str; 4] = [STDEV_FACTOR, ENFORCEMENT, MINIMUM_HOSTS, REQUEST_VOLUME];
const FAILURE_PERCENTAGE_FIELDS: [&str; 4] =
    [THRESHOLD, ENFORCEMENT, MINIMUM_HOSTS, REQUEST_VOLUME];

/// The JSON names grpc-go used for the enforcement percentages before it followed A50's
/// `enforcementPercentage`; gRPC now ignores them.
const SUCCESS_RATE_FORMER: [(&str, &str); 1] = [("enforcingSuccessRate", ENFORCEMENT)];
const FAILURE_PERCENTAGE_FORMER: [(&str, &str); 1] = [("enforcingFailurePercentage", ENFORCEMENT)];

const TOP_ALLOWED: &str = "a JSON object: the outlier_detection_experimental config, an \
                           {\"outlier_detection_experimental\": {...}} entry, or a service config \
                           with loadBalancingConfig";
const CONFIG_ALLOWED: &str = "a JSON object: the outlier_detection_experimental config";
const LIST_ALLOWED: &str = "a JSON array of {\"policy_name\": {config}} entries, one of them \
                            {\"outlier_detection_experimental\": {...}}";
const ENTRY_ALLOWED: &str = "a JSON object holding exactly one policy name and its config";
const ENTRY_HINT: &str = "a loadBalancingConfig entry holds outlier_detection_experimental alone";
const POSITIVE_ALLOWED: &str = "a duration string greater than 0s and at most 315576000000s, \
                                such as \"10s\" or \"0.050s\"";
const NON_NEGATIVE_ALLOWED: &str =
    "a duration string from 0s to 315576000000s, such as \"300s\" or \"0.050s\"";
const COUNT_ALLOWED: &str = "a JSON integer from 0 to 4294967295";
const PERCENT_ALLOWED: &str = "a JSON integer from 0 to 100";
const ALGORITHM_ALLOWED: &str = "a JSON object (present, the algorithm runs; absent, it does not)";
const CHILD_POLICY_ALLOWED: &str =
    "a non-empty JSON array of {\"policy_name\": {config}} objects, one key each";

/// gRPC's `outlier_detection_experimental` load-balancing policy config (proposal A50), read from
/// JSON into a validated [`DetectorConfig`] of the [`Grpc`](crate::DetectorSemantics::Grpc) semantics.
///
/// Read it with [`from_json`](Self::from_json), then take the [`config`](Self::config), or the
/// [`builder`](Self::builder) to adjust before [`build`](DetectorBuilder::build). The text may
/// be the policy's config itself, one `loadBalancingConfig` entry
/// (`{"outlier_detection_experimental": {...}}`), or a service config
/// (`{"loadBalancingConfig": [{"outlier_detection_experimental": {...}}]}`), from which the first
/// `outlier_detection_experimental` entry is read; the service config's other fields, and the
/// entries before that one, are not read (gRPC uses the first policy it supports, so an earlier
/// entry that your gRPC clients support replaces outlier detection there).
///
/// The base is [`DetectorConfig::grpc`]: no consecutive-failure detector, gRPC's ejection
/// budget and ejection times. A field left out keeps A50's default:
///
/// | field | builder setting | allowed | default (A50) |
/// |---|---|---|---|
/// | `interval` | [`interval`](DetectorBuilder::interval) | duration > 0 | 10s |
/// | `baseEjectionTime` | [`base_ejection_time`](DetectorBuilder::base_ejection_time) | duration > 0 | 30s |
/// | `maxEjectionTime` | [`max_ejection_time`](DetectorBuilder::max_ejection_time) (`max(base, max)` is used) | duration ≥ 0 | 300s |
/// | `maxEjectionPercent` | [`max_ejection_percent`](DetectorBuilder::max_ejection_percent) | 0 to 100 | 10 |
/// | `successRateEjection` | [`success_rate`](DetectorBuilder::success_rate): the detector runs only if present | object | absent |
/// | `successRateEjection.stdevFactor` | [`success_rate_stdev_factor`](DetectorBuilder::success_rate_stdev_factor) | 0 to 2³² − 1 | 1900 |
/// | `successRateEjection.enforcementPercentage` | [`enforcing_success_rate`](DetectorBuilder::enforcing_success_rate) | 0 to 100 | 100 |
/// | `successRateEjection.minimumHosts` | [`success_rate_minimum_hosts`](DetectorBuilder::success_rate_minimum_hosts) | 0 to 2³² − 1 | 5 |
/// | `successRateEjection.requestVolume` | [`success_rate_request_volume`](DetectorBuilder::success_rate_request_volume) | 0 to 2³² − 1 | 100 |
/// | `failurePercentageEjection` | [`failure_percentage`](DetectorBuilder::failure_percentage): the detector runs only if present | object | absent |
/// | `failurePercentageEjection.threshold` | [`failure_percentage_threshold`](DetectorBuilder::failure_percentage_threshold) | 0 to 100 | 85 |
/// | `failurePercentageEjection.enforcementPercentage` | [`enforcing_failure_percentage`](DetectorBuilder::enforcing_failure_percentage) | 0 to 100 | **100** |
/// | `failurePercentageEjection.minimumHosts` | [`failure_percentage_minimum_hosts`](DetectorBuilder::failure_percentage_minimum_hosts) | 0 to 2³² − 1 | 5 |
/// | `failurePercentageEjection.requestVolume` | [`failure_percentage_request_volume`](DetectorBuilder::failure_percentage_request_volume) | 0 to 2³² − 1 | 50 |
/// | `childPolicy` | — (accepted, no effect) | array of one-key objects | — |
///
/// With neither `successRateEjection` nor `failurePercentageEjection` the configuration ejects
/// nothing, as gRPC's "no-op" config (what gRPC's xDS client generates for a cluster without
/// outlier detection).
///
/// # Where gRPC's implementations differ
///
/// gRPC's implementations read this JSON with hand-written parsers that disagree on details.
/// Where they disagree, the reader refuses rather than guess, so that a config it accepts means
/// the same to every gRPC client:
///
/// * **The failure-percentage enforcement defaults to 100**, as A50 specifies; grpc-go
///   (`internal/xds/balancer/outlierdetection/config.go`) defaults it to 0, so there a
///   `failurePercentageEjection` without `enforcementPercentage` detects but never ejects.
///   Write `enforcementPercentage` to mean the same everywhere.
/// * **Field names are lowerCamelCase, exactly.** Another spelling of a known field
///   (`base_ejection_time`, `BaseEjectionTime`, `baseejectiontime`) is an error: gRPC's parsers
///   either ignore it (the default is used) or, in grpc-go's case-insensitive matching, read
///   it. So are the older grpc-go names `enforcingSuccessRate` and `enforcingFailurePercentage`,
///   which gRPC now ignores.
/// * **Other unknown fields are ignored**, as gRPC ignores them, and listed by
///   [`ignored_fields`](Self::ignored_fields): log them.
/// * **Counts and percentages are JSON integers** (`10`): `10.0` and `"10"` are refused, as grpc-go
///   refuses them.
/// * **Durations are protobuf's JSON strings**: digits, optionally `.` and one to nine digits,
///   then `s` (`"10s"`, `"0.050s"`), at most 315 576 000 000 s; grpc-go also takes `".5s"` and
///   `"+5s"`, which protobuf's own parser refuses.
/// * **`null` is refused** for every field (grpc-go refuses it for durations); leave a field out
///   for its default.
/// * **A key given twice anywhere in the text is an error**; gRPC's parsers keep the last value.
///
/// # Validation
///
/// As A50 and grpc-go's `ParseConfig`: negative durations are refused, and `maxEjectionPercent`,
/// `successRateEjection.enforcementPercentage`, `failurePercentageEjection.threshold` and
/// `failurePercentageEjection.enforcementPercentage` above 100. Like gRPC, the reader does not
/// limit `stdevFactor`, `minimumHosts` or `requestVolume`, and accepts a `maxEjectionTime` below
/// the base (`max(base, max)` is used). Unlike gRPC, it refuses an `interval` or
/// `baseEjectionTime` of zero: gRPC accepts them (a sweep timer re-armed at once; an ejection
/// ended at the next sweep), and the detector needs both positive.
///
/// `childPolicy`, when present, must be a non-empty array of objects with one key each, the
/// shape gRPC requires; the policies it names are not read and have no effect, since tower's
/// balancer, not a gRPC child policy, picks the endpoints. gRPC needs a child policy it has
/// registered, but checks that only when the config is applied, so the field may be left out
/// here.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub struct GrpcOutlierDetection {
    builder: DetectorBuilder,
    config: DetectorConfig,
    ignored_fields: Vec<String>,
}

impl GrpcOutlierDetection {
    /// Reads an `outlier_detection_experimental` config, a `loadBalancingConfig` entry holding
    /// one, or a service config, and validates it.
    ///
    /// # Errors
    ///
    /// A [`GrpcConfigError`] for malformed JSON (serde_json's message, with line and column), a
    /// key given twice anywhere in the text, a misspelt field, a service config without an
    /// `outlier_detection_experimental` entry, or a value of the wrong JSON type or out of
    /// range. It names the field's path as written (`successRateEjection.enforcementPercentage`),
    /// the value as written and the allowed range.
    ///
    /// Malformed JSON is reported first, then a repeated key (the first in reading order), then
    /// the top-level fields' names and values (`interval`, `baseEjectionTime`,
    /// `maxEjectionTime`, `maxEjectionPercent`), then `successRateEjection`,
    /// `failurePercentageEjection` and `childPolicy`, each with its names before its values.
    ///
    /// # Example
    ///
    /// A service config as grpc-go's outlier-detection tests write it:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier_detectors::GrpcOutlierDetection;
    ///
    /// let grpc = GrpcOutlierDetection::from_json(
    ///     r#"{
    ///       "loadBalancingConfig": [{
    ///         "outlier_detection_experimental": {
    ///           "interval": "0.050s",
    ///           "baseEjectionTime": "0.100s",
    ///           "maxEjectionTime": "300s",
    ///           "maxEjectionPercent": 33,
    ///           "successRateEjection": {
    ///             "stdevFactor": 50,
    ///             "enforcementPercentage": 100,
    ///             "minimumHosts": 3,
    ///             "requestVolume": 5
    ///           },
    ///           "childPolicy": [{"round_robin": {}}]
    ///         }
    ///       }]
    ///     }"#,
    /// )?;
    /// let config = grpc.config();
    /// assert_eq!(config.interval(), Duration::from_millis(50));
    /// assert_eq!(config.base_ejection_time(), Duration::from_millis(100));
    /// assert_eq!(config.max_ejection_percent(), 33);
    /// assert_eq!(config.success_rate().unwrap().stdev_factor, 50);
    /// assert_eq!(config.failure_percentage(), None); // absent: not run
    /// assert!(grpc.ignored_fields().is_empty());
    ///
    /// // A config with neither algorithm ejects nothing.
    /// let noop = GrpcOutlierDetection::from_json(r#"{"interval": "10s"}"#)?.into_config();
    /// assert_eq!((noop.success_rate(), noop.failure_percentage()), (None, None));
    ///
    /// // Errors name the field's path as written, the value and the allowed range.
    /// let error = GrpcOutlierDetection::from_json(
    ///     r#"{"failurePercentageEjection": {"threshold": 101}}"#,
    /// )
    /// .unwrap_err();
    /// assert_eq!(error.field(), Some("failurePercentageEjection.threshold"));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid gRPC outlier_detection_experimental config: \
    ///      `failurePercentageEjection.threshold` = 101 (allowed: a JSON integer from 0 to 100)"
    /// );
    /// # Ok::<(), tower_outlier_detectors::GrpcConfigError>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Self, GrpcConfigError> {
        read(text).map_err(GrpcConfigError::new)
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
    /// (`max_ejection_percent`), not the document's keys.
    pub fn builder(&self) -> DetectorBuilder {
        self.builder.clone()
    }

    /// The fields that were read but not understood, with their path as written
    /// (`successRateEjection.someNewField`), in the order they were read (each object's keys
    /// sorted). They had no effect, as in gRPC; log them. They are as written, neither clipped
    /// nor escaped: to log names from an untrusted source, show each through
    /// [`tower_outlier_core::text::name`].
    ///
    /// ```
    /// use tower_outlier_detectors::GrpcOutlierDetection;
    ///
    /// let grpc = GrpcOutlierDetection::from_json(
    ///     r#"{"interval": "10s", "successRateEjection": {"requestVolumes": 5}}"#,
    /// )?;
    /// assert_eq!(grpc.ignored_fields(), ["successRateEjection.requestVolumes"]);
    /// # Ok::<(), tower_outlier_detectors::GrpcConfigError>(())
    /// ```
    pub fn ignored_fields(&self) -> &[String] {
        &self.ignored_fields
    }
}

fn read(text: &str) -> Result<GrpcOutlierDetection, Problem> {
    let document = json_reader::parse(text)?;
    let top = json_reader::object(&document, &[], TOP_ALLOWED)?;
    let (value, prefix) = locate(&document, top)?;
    let config = json_reader::object(value, &prefix, CONFIG_ALLOWED)?;
    let mut ignored_fields = Vec::new();
    let builder = read_config(config, &prefix, &mut ignored_fields)?;
    let config = builder
        .clone()
        .build()
        .map_err(|error| renamed(error, &prefix))?;
    Ok(GrpcOutlierDetection {
        builder,
        config,
        ignored_fields,
    })
}

/// The policy's config and its path, in whichever of the three forms the text is; `top` is
/// `document`'s object.
fn locate<'v>(
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

fn read_config(
    config: &Map<String, Value>,
    prefix: &[PathSegment],
    ignored: &mut Vec<String>,
) -> Result<DetectorBuilder, Problem> {
    check_names(config, prefix, &CONFIG_FIELDS, &[], ignored)?;
    let mut builder = DetectorConfig::grpc();
    if let Some(value) = config.get(INTERVAL) {
        builder = builder.interval(duration(value, &child(prefix, INTERVAL), true)?);
    }
    if let Some(value) = config.get(BASE_EJECTION_TIME) {
        let path = child(prefix, BASE_EJECTION_TIME);
        builder = builder.base_ejection_time(duration(value, &path, true)?);
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
fn folded(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Refuses other spellings of `known` fields and the `former` names; lists the rest in `ignored`.
fn check_names(
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
fn duration(value: &Value, path: &[PathSegment], positive: bool) -> Result<Duration, Problem> {
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
fn integer(value: &Value, path: &[PathSegment], limit: u32) -> Result<u32, Problem> {
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
fn optional(
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

fn child_policy(value: &Value, path: &[PathSegment]) -> Result<(), Problem> {
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
fn renamed(error: ConfigError, prefix: &[PathSegment]) -> Problem {
    let path = child(prefix, error.field());
    Problem::Invalid {
        error: ConfigError::new(written(&path), error.value(), error.allowed()),
        path,
    }
}

#[cfg(test)]
mod tests;
