//! The reader's error type and its message.

use std::fmt;

use serde_json::Value;
use tower_outlier_core::json::{show_path, ParseError, PathSegment};
use tower_outlier_core::text::{clip, name};
use tower_outlier_core::ConfigError;

use super::show_json;

/// Why Sentinel degrade rules could not be read: malformed JSON, a key given twice in an object, a
/// top level that is not an array, an element that is not an object, or a field that is missing,
/// of the wrong type or out of range (which carries a [`ConfigError`] naming the field as Sentinel
/// spells it).
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
///
/// let error = parse_degrade_rules(
///     r#"[{ "resource": "/testD", "count": 500, "timeWindow": 10, "timeWindow": 10 }]"#,
/// )
/// .unwrap_err();
/// assert!(error.is_duplicate());
/// assert_eq!(error.index(), Some(0));
/// assert_eq!(error.field(), Some("timeWindow"));
/// assert_eq!(error.config_error(), None);
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
    /// An object holding `key` more than once: a rule (`index`, with `within` empty), an object
    /// inside rule `index` at the path `within`, or an object outside any rule (`index` `None`;
    /// `within` from the top level).
    Duplicate {
        index: Option<usize>,
        key: String,
        within: Vec<PathSegment>,
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

    /// Malformed JSON, or a key given twice.
    pub(super) fn from_parse(error: ParseError) -> Self {
        let duplicate = match error {
            ParseError::Syntax(error) => return RuleError::syntax(error),
            ParseError::DuplicateKey(duplicate) => duplicate,
        };
        // A path that starts at a position in the array starts at a rule.
        let (index, within) = match duplicate.path() {
            [PathSegment::Index(index), within @ ..] => (Some(*index), within.to_vec()),
            within => (None, within.to_vec()),
        };
        RuleError {
            kind: ErrorKind::Duplicate {
                index,
                key: duplicate.key().to_owned(),
                within,
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
    /// itself is at fault, for errors that are not about one rule, and for keys given twice
    /// (which are found while the text is parsed, before any rule is read).
    pub fn resource(&self) -> Option<&str> {
        match &self.kind {
            ErrorKind::Invalid { resource, .. } => resource.as_deref(),
            _ => None,
        }
    }

    /// The offending field, as Sentinel spells it (`timeWindow`), or as written when a rule gives
    /// it twice. `None` when the text is not JSON, its top level is not an array, an element is
    /// not an object, or a key is given twice in an object other than a rule itself.
    pub fn field(&self) -> Option<&str> {
        match &self.kind {
            ErrorKind::Duplicate {
                index: Some(_),
                key,
                within,
            } if within.is_empty() => Some(key),
            _ => self.config_error().map(ConfigError::field),
        }
    }

    /// The position of the offending rule in the array, from 0. `None` when the text is not JSON
    /// or its top level is not an array.
    pub fn index(&self) -> Option<usize> {
        match &self.kind {
            ErrorKind::NotAnObject { index, .. } | ErrorKind::Invalid { index, .. } => Some(*index),
            ErrorKind::Duplicate { index, .. } => *index,
            ErrorKind::Syntax { .. } | ErrorKind::TopLevel { .. } => None,
        }
    }

    /// Whether the error is a key given more than once in an object: [`field`](Self::field)
    /// names it when the object is a rule, the message names it always.
    pub fn is_duplicate(&self) -> bool {
        matches!(self.kind, ErrorKind::Duplicate { .. })
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
            ErrorKind::Duplicate { index, key, within } => {
                match index {
                    Some(index) => write!(f, "invalid Sentinel degrade rule #{index}: ")?,
                    None => f.write_str("invalid Sentinel degrade rules: ")?,
                }
                let key = name(key);
                match (index, within.is_empty()) {
                    (Some(_), true) => write!(f, "field `{key}` is given more than once"),
                    (None, true) => write!(
                        f,
                        "key `{key}` is given more than once in the top-level object"
                    ),
                    (_, false) => write!(
                        f,
                        "key `{key}` is given more than once in `{}`",
                        show_path(within)
                    ),
                }
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
