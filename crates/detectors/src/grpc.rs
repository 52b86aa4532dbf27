//! gRPC's `outlier_detection_experimental` load-balancing config (proposal A50), read into a
//! [`DetectorConfig`].
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (fields, defaults, validation, where gRPC's implementations differ) lives on
//! [`GrpcOutlierDetection`]. The error type is in `error`; what is shared with the Envoy reader
//! (the duration grammar, paths, the error detail) is in `json_reader`.

use tower_outlier_core::DocumentError;

use crate::config::{DetectorBuilder, DetectorConfig};

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
/// the base (`max(base, max)` is used). Zero durations are accepted, as gRPC accepts them
/// (grpc-go's `AllFields_Zero` case): with a `baseEjectionTime` of zero an endpoint is ejected
/// and re-admitted on the same sweep, as grpc-go un-ejects it in the same run of its timer; an `interval` of zero, which makes grpc-go sweep back to back, sweeps every
/// millisecond here ([`DetectorConfig::running_interval`](crate::DetectorConfig::running_interval)).
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
    // The config's top-level fields given (not left out).
    given: Vec<&'static str>,
}

impl GrpcOutlierDetection {
    /// The fields this config leaves out whose value differs from `running`'s, each as a
    /// sentence naming the field and both values: gRPC replaces the whole
    /// `outlier_detection_experimental` config with each update, so a field left out takes its
    /// default, and an algorithm left out (`successRateEjection`, `failurePercentageEjection`)
    /// is off. A layer logs these as warnings when it applies the config.
    ///
    /// ```
    /// use tower_outlier_detectors::{DetectorConfig, GrpcOutlierDetection};
    ///
    /// let running = DetectorConfig::grpc().max_ejection_percent(50).build()?;
    /// let next = GrpcOutlierDetection::from_json(r#"{"interval": "5s"}"#)?;
    /// assert_eq!(
    ///     next.left_to_default(&running),
    ///     [
    ///         "`maxEjectionPercent` is not in the config: gRPC's default 10 replaces the running \
    ///          50 (a config replaces the whole outlier_detection_experimental, as in gRPC: give \
    ///          every field to keep)",
    ///         "`successRateEjection` is not in the config: its detector is off, where it runs \
    ///          now (a config replaces the whole outlier_detection_experimental, as in gRPC: give \
    ///          every field to keep)",
    ///     ],
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn left_to_default(&self, running: &DetectorConfig) -> Vec<String> {
        type Shown = fn(&DetectorConfig) -> String;
        let fields: [(&str, Shown); 6] = [
            ("interval", |c| format!("{}s", c.interval().as_secs_f64())),
            ("baseEjectionTime", |c| {
                format!("{}s", c.base_ejection_time().as_secs_f64())
            }),
            ("maxEjectionTime", |c| {
                format!("{}s", c.max_ejection_time().as_secs_f64())
            }),
            ("maxEjectionPercent", |c| {
                c.max_ejection_percent().to_string()
            }),
            ("successRateEjection", |c| {
                if c.success_rate().is_some() {
                    "on"
                } else {
                    "off"
                }
                .to_owned()
            }),
            ("failurePercentageEjection", |c| {
                if c.failure_percentage().is_some() {
                    "on"
                } else {
                    "off"
                }
                .to_owned()
            }),
        ];
        fields
            .iter()
            .filter(|(name, _)| !self.given.contains(name))
            .filter_map(|(name, shown)| {
                let (now, next) = (shown(running), shown(&self.config));
                (now != next).then(|| {
                    let what = if name.ends_with("Ejection") {
                        "its detector is off, where it runs now".to_owned()
                    } else {
                        format!("gRPC's default {next} replaces the running {now}")
                    };
                    format!(
                        "`{name}` is not in the config: {what} (a config replaces the whole \
                         outlier_detection_experimental, as in gRPC: give every field to keep)"
                    )
                })
            })
            .collect()
    }

    /// Reads an `outlier_detection_experimental` config, a `loadBalancingConfig` entry holding
    /// one, or a service config, and validates it.
    ///
    /// # Errors
    ///
    /// A [`DocumentError`] for malformed JSON (serde_json's message, with line and column), a
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
    /// The error's accessors:
    ///
    /// ```
    /// use tower_outlier_detectors::GrpcOutlierDetection;
    ///
    /// let error = GrpcOutlierDetection::from_json(
    ///     r#"{"successRateEjection": {"enforcementPercentage": 150}}"#,
    /// )
    /// .unwrap_err();
    /// assert_eq!(error.field(), Some("successRateEjection.enforcementPercentage"));
    /// assert_eq!(error.config_error().unwrap().value(), "150");
    ///
    /// let error = GrpcOutlierDetection::from_json(r#"{"base_ejection_time": "10s"}"#).unwrap_err();
    /// assert!(error.is_unknown_field());
    /// assert_eq!(error.field(), Some("base_ejection_time"));
    ///
    /// let error = GrpcOutlierDetection::from_json(r#"{"interval": "1s", "interval": "2s"}"#)
    ///     .unwrap_err();
    /// assert!(error.is_duplicate());
    /// assert_eq!(error.field(), Some("interval"));
    ///
    /// let error = GrpcOutlierDetection::from_json("{\n \"interval\": }").unwrap_err();
    /// assert_eq!(error.field(), None);
    /// assert_eq!(error.location(), Some((2, 14)));
    /// ```
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
    /// # Ok::<(), tower_outlier_core::DocumentError>(())
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
    /// # Ok::<(), tower_outlier_core::DocumentError>(())
    /// ```
    pub fn ignored_fields(&self) -> &[String] {
        &self.ignored_fields
    }
}

/// The document's name in error messages.
const DOCUMENT: &str = "gRPC outlier_detection_experimental config";

mod read;
use read::*;

#[cfg(test)]
mod tests;
