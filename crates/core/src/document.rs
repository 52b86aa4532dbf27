//! Why a configuration document could not be read: the error type the policy crates' readers
//! share.

use std::error::Error;
use std::fmt;

use crate::error::ConfigError;
use crate::text::name;

/// Why a configuration document could not be read: text that is not valid JSON, a top level of
/// the wrong kind, a key given twice, a key the reader refuses, or a value of the wrong type or
/// out of range (which carries a [`ConfigError`] naming the field's path as written).
///
/// The accessors return names as written; the message ([`Display`](fmt::Display)) shows them
/// clipped to 80 characters and, when they hold control characters, quoted and escaped, so that a
/// huge or hostile key can neither flood nor forge a log line. Readers build it with the
/// constructors below, each given the document's name for the message.
///
/// ```
/// use tower_outlier_core::{ConfigError, DocumentError};
///
/// let error = DocumentError::invalid(
///     "Envoy outlier_detection",
///     ConfigError::new("baseEjectionTime", "\"-1s\"", "a duration of 0s or more"),
///     "baseEjectionTime".into(),
/// );
/// assert_eq!(error.field(), Some("baseEjectionTime"));
/// assert_eq!(error.config_error().unwrap().value(), "\"-1s\"");
/// assert_eq!(
///     error.to_string(),
///     "invalid Envoy outlier_detection: `baseEjectionTime` = \"-1s\" (allowed: a duration of 0s or more)"
/// );
///
/// let error = DocumentError::syntax("gRPC outlier_detection_experimental config", "EOF".into(), 2, 14);
/// assert_eq!(error.location(), Some((2, 14)));
/// assert_eq!(error.field(), None);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct DocumentError {
    document: &'static str,
    problem: Problem,
}

#[derive(Clone, Debug, PartialEq)]
enum Problem {
    Syntax {
        message: String,
        line: usize,
        column: usize,
    },
    TopLevel {
        shown: String,
        allowed: String,
    },
    Duplicate {
        field: String,
        shown: String,
        alias: Option<String>,
    },
    Unknown {
        field: String,
        shown: String,
        hint: String,
    },
    Invalid {
        error: ConfigError,
        shown: String,
    },
}

impl DocumentError {
    /// The text is not valid JSON: the parser's `message` (which ends with the line and column),
    /// and the 1-based `line` and `column` it stopped at.
    pub fn syntax(document: &'static str, message: String, line: usize, column: usize) -> Self {
        Self::new(
            document,
            Problem::Syntax {
                message,
                line,
                column,
            },
        )
    }

    /// The top level is not what the reader reads: `shown` as a message shows it, and what is
    /// allowed, in words.
    pub fn top_level(document: &'static str, shown: String, allowed: impl Into<String>) -> Self {
        Self::new(
            document,
            Problem::TopLevel {
                shown,
                allowed: allowed.into(),
            },
        )
    }

    /// `field` (its path as written; `shown`, as a message shows it) is given more than once in
    /// its object.
    pub fn duplicate(document: &'static str, field: String, shown: String) -> Self {
        Self::new(
            document,
            Problem::Duplicate {
                field,
                shown,
                alias: None,
            },
        )
    }

    /// A duplicate given under a second spelling, `alias`, of the same field (protobuf's JSON
    /// has two per field).
    pub fn also_as(mut self, alias: &str) -> Self {
        if let Problem::Duplicate { alias: slot, .. } = &mut self.problem {
            *slot = Some(alias.to_owned());
        }
        self
    }

    /// `field` (its path as written; `shown`, as a message shows it) is a key the reader refuses,
    /// with `hint` saying why and what to write instead.
    pub fn unknown(document: &'static str, field: String, shown: String, hint: String) -> Self {
        Self::new(document, Problem::Unknown { field, shown, hint })
    }

    /// A value of the wrong type or out of range: `error` names the field's path as written, and
    /// `shown` is that path as a message shows it.
    pub fn invalid(document: &'static str, error: ConfigError, shown: String) -> Self {
        Self::new(document, Problem::Invalid { error, shown })
    }

    fn new(document: &'static str, problem: Problem) -> Self {
        DocumentError { document, problem }
    }

    /// The document's name, as messages show it (`"Envoy outlier_detection"`).
    pub fn document(&self) -> &'static str {
        self.document
    }

    /// The offending field as written, with the path to it when it is nested
    /// (`successRateEjection.enforcementPercentage`). `None` when the text is not JSON or its top
    /// level is not what the reader reads.
    pub fn field(&self) -> Option<&str> {
        match &self.problem {
            Problem::Duplicate { field, .. } | Problem::Unknown { field, .. } => Some(field),
            Problem::Invalid { error, .. } => Some(error.field()),
            Problem::Syntax { .. } | Problem::TopLevel { .. } => None,
        }
    }

    /// The field, value (as written, clipped) and allowed range, when one value is at fault.
    pub fn config_error(&self) -> Option<&ConfigError> {
        match &self.problem {
            Problem::Invalid { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether a key is given twice in one object, or one field under two spellings.
    pub fn is_duplicate(&self) -> bool {
        matches!(self.problem, Problem::Duplicate { .. })
    }

    /// Whether a key is one the reader refuses (not a field of the document, or a spelling the
    /// system does not read).
    pub fn is_unknown_field(&self) -> bool {
        matches!(self.problem, Problem::Unknown { .. })
    }

    /// Where malformed JSON went wrong, as the parser reports it: 1-based line and column.
    /// `None` for errors in well-formed JSON.
    pub fn location(&self) -> Option<(usize, usize)> {
        match &self.problem {
            Problem::Syntax { line, column, .. } => Some((*line, *column)),
            _ => None,
        }
    }
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let document = self.document;
        match &self.problem {
            Problem::Syntax { message, .. } => write!(f, "{document} is not valid JSON: {message}"),
            Problem::TopLevel { shown, allowed } => write!(
                f,
                "invalid {document}: the top level is {shown} (allowed: {allowed})"
            ),
            Problem::Duplicate { shown, alias, .. } => {
                write!(f, "invalid {document}: `{shown}` is given more than once")?;
                match alias {
                    Some(alias) => write!(f, " (also as `{}`)", name(alias)),
                    None => Ok(()),
                }
            }
            Problem::Unknown { shown, hint, .. } => {
                write!(f, "invalid {document}: unknown field `{shown}` ({hint})")
            }
            Problem::Invalid { shown, error } => write!(
                f,
                "invalid {document}: `{shown}` = {} (allowed: {})",
                error.value(),
                error.allowed()
            ),
        }
    }
}

// The detail is part of the message, so there is no separate source to report.
impl Error for DocumentError {}
