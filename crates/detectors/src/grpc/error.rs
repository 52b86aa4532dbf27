//! The gRPC reader's error type.

use std::fmt;

use tower_outlier_core::ConfigError;

use crate::json_reader::Problem;

/// Why a gRPC `outlier_detection_experimental` config could not be read: malformed JSON, a key
/// given twice, a field spelt in a way gRPC does not read, a missing policy, or a value of the
/// wrong type or out of range (which carries a [`ConfigError`] naming the field's path as
/// written).
///
/// The accessors return names as written; the message ([`Display`](fmt::Display)) shows them
/// clipped to 80 characters and, when they hold control characters, quoted and escaped.
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
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub struct GrpcConfigError {
    problem: Problem,
}

impl GrpcConfigError {
    pub(super) fn new(problem: Problem) -> Self {
        GrpcConfigError { problem }
    }

    /// The offending field as written, with the path to it
    /// (`successRateEjection.enforcementPercentage`,
    /// `loadBalancingConfig[0].outlier_detection_experimental.interval`). `None` when the text is
    /// not JSON or its top level is not an object.
    pub fn field(&self) -> Option<&str> {
        self.problem.field()
    }

    /// The field, value (JSON as written, clipped) and allowed range, when one value is at fault.
    pub fn config_error(&self) -> Option<&ConfigError> {
        self.problem.config_error()
    }

    /// Whether a key is given twice in one object.
    pub fn is_duplicate(&self) -> bool {
        self.problem.is_duplicate()
    }

    /// Whether a key is another spelling of a field that gRPC reads under one spelling only
    /// (`base_ejection_time`, `Interval`, the older `enforcingSuccessRate`), or sits beside the
    /// policy in a `loadBalancingConfig` entry.
    pub fn is_unknown_field(&self) -> bool {
        self.problem.is_unknown()
    }

    /// Where malformed JSON went wrong, as serde_json reports it: 1-based line and column.
    /// `None` for errors in well-formed JSON.
    pub fn location(&self) -> Option<(usize, usize)> {
        self.problem.location()
    }
}

impl fmt::Display for GrpcConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.problem
            .describe(f, "gRPC outlier_detection_experimental config")
    }
}

// The detail is part of the message, so there is no separate source to report.
impl std::error::Error for GrpcConfigError {}
