//! The reader's error type and its message.

use std::fmt;

use serde_json::Value;
use tower_outlier_core::text::clip;
use tower_outlier_core::ConfigError;

use super::show_json;

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
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
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
    pub(super) fn syntax(error: serde_json::Error) -> Self {
        RuleError {
            kind: ErrorKind::Syntax {
                message: error.to_string(),
                line: error.line(),
                column: error.column(),
            },
        }
    }

    pub(super) fn top_level(value: &Value) -> Self {
        RuleError {
            kind: ErrorKind::TopLevel {
                shown: show_json(value),
            },
        }
    }

    pub(super) fn not_an_object(index: usize, value: &Value) -> Self {
        RuleError {
            kind: ErrorKind::NotAnObject {
                index,
                shown: show_json(value),
            },
        }
    }

    pub(super) fn invalid(index: usize, resource: Option<String>, error: ConfigError) -> Self {
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
