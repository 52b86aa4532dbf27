//! Envoy's cluster `outlier_detection` (`envoy.config.cluster.v3.OutlierDetection`) in proto3
//! JSON, read into a [`DetectorConfig`].
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (fields, defaults, validation) lives on [`EnvoyOutlierDetection`]. The field table
//! is in `fields`, the error type in `error`; what is shared with the gRPC reader (the duration
//! grammar, paths, the error detail) is in `json_reader`.

mod fields;
mod health_check;

use tower_outlier_core::DocumentError;

pub use self::health_check::EnvoyHealthCheck;

use crate::config::{DetectorBuilder, DetectorConfig};

use self::fields::{Kind, Spec, BASE_EJECTION_TIME, FIELDS, MAX_EJECTION_TIME};

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
/// * `successful_active_health_check_uneject_host` is accepted, as a boolean, and has no effect
///   here: it decides whether a successful *active* health check re-admits an ejected host. The
///   detectors time re-admission themselves, as Envoy does without health checks; a layer given
///   an active probe (`OutlierDetectionLayer::probe` in `tower-outlier`) re-admits an endpoint
///   when its probe succeeds, which is Envoy's default (`true`). `false` is not followed.
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
    // The fields the document set, one bit each in `FIELDS` order.
    given: u32,
}

impl EnvoyOutlierDetection {
    /// Reads an Envoy `outlier_detection` message (or a Cluster fragment holding only it) from
    /// proto3 JSON and validates it.
    ///
    /// # Errors
    ///
    /// A [`DocumentError`] for malformed JSON (serde_json's message, with line and column),
    /// a key given twice anywhere in the text or a field given under both spellings, an unknown
    /// field, a value of the wrong JSON type or out of range, or a `max_ejection_time` below the
    /// base. It names the field as written, with its path (`outlierDetection.baseEjectionTime`),
    /// the value as written and the allowed range.
    ///
    /// Malformed JSON is reported first, then a repeated key (the first in reading order), then
    /// unknown fields and fields given twice (in the order of their names), then values in the
    /// proto's field order, then `max_ejection_time` against the base.
    ///
    /// The error's accessors:
    ///
    /// ```
    /// use tower_outlier_detectors::EnvoyOutlierDetection;
    ///
    /// let error = EnvoyOutlierDetection::from_json(r#"{"baseEjectionTime": "-1s"}"#).unwrap_err();
    /// assert_eq!(error.field(), Some("baseEjectionTime"));
    /// assert_eq!(error.config_error().unwrap().value(), r#""-1s""#);
    ///
    /// let error = EnvoyOutlierDetection::from_json(r#"{"outlier_detection": {"interval": 5}}"#)
    ///     .unwrap_err();
    /// assert_eq!(error.field(), Some("outlier_detection.interval"));
    ///
    /// let error = EnvoyOutlierDetection::from_json(r#"{"consecutive_5xx": 3, "consecutive5xx": 4}"#)
    ///     .unwrap_err();
    /// assert!(error.is_duplicate());
    /// assert_eq!(error.field(), Some("consecutive_5xx"));
    ///
    /// let error = EnvoyOutlierDetection::from_json(r#"{"consecutive_5xxx": 3}"#).unwrap_err();
    /// assert!(error.is_unknown_field());
    /// assert_eq!(error.field(), Some("consecutive_5xxx"));
    ///
    /// let error = EnvoyOutlierDetection::from_json("{\n \"interval\" \"10s\" }").unwrap_err();
    /// assert_eq!(error.field(), None);
    /// assert_eq!(error.location(), Some((2, 13)));
    /// ```
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
    pub fn from_json(text: &str) -> Result<Self, DocumentError> {
        read(text).map_err(|problem| problem.into_error(DOCUMENT))
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

impl EnvoyOutlierDetection {
    /// The fields this document leaves out (or sets to `null`) whose Envoy default differs from
    /// `running`'s value, each as a sentence naming the field and both values: Envoy replaces a
    /// cluster's whole `outlier_detection` with each update, so a field left out goes back to
    /// its default, not to what ran before. A layer logs these as warnings when it applies the
    /// document (`{"consecutive5xx": 2}` over a running `max_ejection_percent` of 50 puts the
    /// budget back to 10 %, which ejects nothing among fewer than ten endpoints).
    ///
    /// ```
    /// use tower_outlier_detectors::{DetectorConfig, EnvoyOutlierDetection};
    ///
    /// let running = DetectorConfig::envoy().max_ejection_percent(50).build()?;
    /// let next = EnvoyOutlierDetection::from_json(r#"{"consecutive5xx": 2}"#)?;
    /// assert_eq!(
    ///     next.left_to_default(&running),
    ///     ["`max_ejection_percent` is not in the document: Envoy's default 10 replaces the \
    ///       running 50 (a document replaces the whole outlier_detection, as in Envoy: give \
    ///       every field to keep)"],
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn left_to_default(&self, running: &DetectorConfig) -> Vec<String> {
        FIELDS
            .iter()
            .enumerate()
            .filter(|(index, _)| self.given & (1 << index) == 0)
            .filter_map(|(_, spec)| {
                let (now, next) = (
                    shown(spec.proto, running)?,
                    shown(spec.proto, &self.config)?,
                );
                (now != next).then(|| {
                    format!(
                        "`{}` is not in the document: Envoy's default {next} replaces the \
                         running {now} (a document replaces the whole outlier_detection, as in \
                         Envoy: give every field to keep)",
                        spec.proto
                    )
                })
            })
            .collect()
    }
}

/// A field's value in `config`, written as the document would write it; `None` for the fields
/// without effect.
fn shown(proto: &str, config: &DetectorConfig) -> Option<String> {
    let seconds = |d: std::time::Duration| format!("{}s", d.as_secs_f64());
    let success = config.success_rate();
    let failure = config.failure_percentage();
    Some(match proto {
        "consecutive_5xx" => config.consecutive_5xx().threshold.to_string(),
        "interval" => seconds(config.interval()),
        "base_ejection_time" => seconds(config.base_ejection_time()),
        "max_ejection_percent" => config.max_ejection_percent().to_string(),
        "enforcing_consecutive_5xx" => config.consecutive_5xx().enforcement.to_string(),
        "enforcing_success_rate" => success?.enforcement.to_string(),
        "success_rate_minimum_hosts" => success?.minimum_hosts.to_string(),
        "success_rate_request_volume" => success?.request_volume.to_string(),
        "success_rate_stdev_factor" => success?.stdev_factor.to_string(),
        "consecutive_gateway_failure" => config.consecutive_gateway_failure().threshold.to_string(),
        "enforcing_consecutive_gateway_failure" => {
            config.consecutive_gateway_failure().enforcement.to_string()
        }
        "split_external_local_origin_errors" => {
            config.split_external_local_origin_errors().to_string()
        }
        "consecutive_local_origin_failure" => config
            .consecutive_local_origin_failure()
            .threshold
            .to_string(),
        "enforcing_consecutive_local_origin_failure" => config
            .consecutive_local_origin_failure()
            .enforcement
            .to_string(),
        "enforcing_local_origin_success_rate" => success?.local_origin_enforcement.to_string(),
        "failure_percentage_threshold" => failure?.threshold.to_string(),
        "enforcing_failure_percentage" => failure?.enforcement.to_string(),
        "enforcing_failure_percentage_local_origin" => {
            failure?.local_origin_enforcement.to_string()
        }
        "failure_percentage_minimum_hosts" => failure?.minimum_hosts.to_string(),
        "failure_percentage_request_volume" => failure?.request_volume.to_string(),
        "max_ejection_time" => seconds(config.max_ejection_time()),
        "max_ejection_time_jitter" => seconds(config.max_ejection_time_jitter()),
        "always_eject_one_host" => config.always_eject_one_host.to_string(),
        _ => return None,
    })
}

/// The document's name in error messages.
const DOCUMENT: &str = "Envoy outlier_detection";

mod read;
use read::*;

#[cfg(test)]
mod tests;
