//! The Envoy reader's error type.

use std::fmt;

use tower_outlier_core::ConfigError;

use crate::json_reader::Problem;

/// Why an Envoy `outlier_detection` could not be read: malformed JSON, a key given twice (or one
/// field under both its spellings), an unknown field, or a value of the wrong type or out of
/// range (which carries a [`ConfigError`] naming the field as written).
///
/// The accessors return names as written; the message ([`Display`](fmt::Display)) shows them
/// clipped to 80 characters and, when they hold control characters, quoted and escaped.
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
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(docsrs, doc(cfg(feature = "envoy")))]
pub struct EnvoyConfigError {
    problem: Problem,
}

impl EnvoyConfigError {
    pub(super) fn new(problem: Problem) -> Self {
        EnvoyConfigError { problem }
    }

    /// The offending field as written, with the path to it when it is nested
    /// (`outlierDetection.baseEjectionTime`, `monitors[0].name`). For a field given under both
    /// its spellings, the snake_case one. `None` when the text is not JSON or its top level is not
    /// an object.
    pub fn field(&self) -> Option<&str> {
        self.problem.field()
    }

    /// The field, value (JSON as written, clipped) and allowed range, when one value is at fault.
    pub fn config_error(&self) -> Option<&ConfigError> {
        self.problem.config_error()
    }

    /// Whether a key is given twice in one object, or one field under both its spellings
    /// (`base_ejection_time` and `baseEjectionTime`).
    pub fn is_duplicate(&self) -> bool {
        self.problem.is_duplicate()
    }

    /// Whether a field is not one of `OutlierDetection`'s (or, in a Cluster fragment, a field
    /// beside `outlier_detection`).
    pub fn is_unknown_field(&self) -> bool {
        self.problem.is_unknown()
    }

    /// Where malformed JSON went wrong, as serde_json reports it: 1-based line and column.
    /// `None` for errors in well-formed JSON.
    pub fn location(&self) -> Option<(usize, usize)> {
        self.problem.location()
    }
}

impl fmt::Display for EnvoyConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.problem.describe(f, "Envoy outlier_detection")
    }
}

// The detail is part of the message, so there is no separate source to report.
impl std::error::Error for EnvoyConfigError {}
