//! The error type of the HSF reader, and how its messages show keys and values.

use std::fmt;

use serde_json::Value;
use tower_outlier_core::text::{clip, name};
use tower_outlier_core::ConfigError;

/// A JSON value as an error shows it: re-serialised (so strings are quoted and their control
/// characters escaped) and clipped.
pub(super) fn show_json(value: &Value) -> String {
    clip(value.to_string())
}

/// A key qualified by its block, as an error message shows it: each part clipped and, when it
/// holds control characters, quoted and escaped.
pub(super) fn qualified(block_name: &str, key_name: &str) -> String {
    format!("{}.{}", name(block_name), name(key_name))
}

/// Why HSF configuration could not be read: malformed JSON, a top level that is not an object, a
/// block or key given twice, or a value of the wrong type or out of range (which carries a
/// [`ConfigError`] naming the qualified key).
///
/// The accessors return names as written; the message ([`Display`](fmt::Display)) shows them
/// clipped to 80 characters and, when they hold control characters, quoted and escaped.
///
/// ```
/// use tower_outlier_error_rate::HsfQosConfig;
///
/// let error = HsfQosConfig::from_json(r#"{ "svc:1.0": { "qosEnabled": "true" } }"#).unwrap_err();
/// assert_eq!(error.key(), Some("svc:1.0.qosEnabled"));
/// let detail = error.config_error().unwrap();
/// assert_eq!(detail.value(), "\"true\"");
/// assert_eq!(detail.allowed(), "true or false (a JSON boolean, unquoted)");
///
/// let error = HsfQosConfig::from_json("{ \"DEFAULT\": {\n \"qosEnabled\" true } }").unwrap_err();
/// assert_eq!(error.key(), None);
/// assert_eq!(error.location(), Some((2, 15)));
///
/// let error =
///     HsfQosConfig::from_json(r#"{ "svc:1.0": { "qosEnabled": true, "qosEnabled": false } }"#)
///         .unwrap_err();
/// assert!(error.is_duplicate());
/// assert_eq!(error.key(), Some("svc:1.0.qosEnabled"));
/// assert_eq!(error.config_error(), None);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(docsrs, doc(cfg(feature = "hsf")))]
pub struct HsfConfigError {
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
    /// JSON, but not an object.
    TopLevel { shown: String },
    /// A block given twice at the top level (`key` is the block's name), or a key given twice in
    /// one block (`key` is qualified by the block). `shown` is `key` made safe for a message.
    Duplicate {
        key: String,
        shown: String,
        block: bool,
    },
    /// A block or a value that is not what HSF expects; `shown_key` is the error's field made
    /// safe for a message.
    Invalid {
        error: ConfigError,
        shown_key: String,
    },
}

impl HsfConfigError {
    pub(super) fn syntax(error: serde_json::Error) -> Self {
        HsfConfigError {
            kind: ErrorKind::Syntax {
                message: error.to_string(),
                line: error.line(),
                column: error.column(),
            },
        }
    }

    pub(super) fn top_level(value: &Value) -> Self {
        HsfConfigError {
            kind: ErrorKind::TopLevel {
                shown: show_json(value),
            },
        }
    }

    /// `block_name` given twice, or, with `key_name`, that key given twice in `block_name`.
    pub(super) fn duplicate(block_name: &str, key_name: Option<&str>) -> Self {
        let (key, shown) = match key_name {
            None => (block_name.to_owned(), name(block_name)),
            Some(key_name) => (
                format!("{block_name}.{key_name}"),
                qualified(block_name, key_name),
            ),
        };
        HsfConfigError {
            kind: ErrorKind::Duplicate {
                key,
                shown,
                block: key_name.is_none(),
            },
        }
    }

    /// `error`, whose field the message shows as `shown_key`.
    pub(super) fn invalid(error: ConfigError, shown_key: String) -> Self {
        HsfConfigError {
            kind: ErrorKind::Invalid { error, shown_key },
        }
    }

    /// The offending key as written, qualified by its block (`DEFAULT.errorRateThreshold`,
    /// `svc:1.0.isolationTime`), or the block's name when the block itself is not an object or is
    /// given twice, or the `-D` parameter (`-Dhsf.qos.isolation.time`). `None` when the text is
    /// not JSON or its top level is not an object.
    pub fn key(&self) -> Option<&str> {
        match &self.kind {
            ErrorKind::Invalid { error, .. } => Some(error.field()),
            ErrorKind::Duplicate { key, .. } => Some(key),
            ErrorKind::Syntax { .. } | ErrorKind::TopLevel { .. } => None,
        }
    }

    /// The key, value and allowed range, when one value (or block) is at fault.
    pub fn config_error(&self) -> Option<&ConfigError> {
        match &self.kind {
            ErrorKind::Invalid { error, .. } => Some(error),
            ErrorKind::Syntax { .. } | ErrorKind::TopLevel { .. } | ErrorKind::Duplicate { .. } => {
                None
            }
        }
    }

    /// Whether the error is a block or a key given more than once; [`key`](Self::key) names it.
    pub fn is_duplicate(&self) -> bool {
        matches!(self.kind, ErrorKind::Duplicate { .. })
    }

    /// Where malformed JSON went wrong, as serde_json reports it: 1-based line and column.
    /// `None` for errors in well-formed JSON.
    pub fn location(&self) -> Option<(usize, usize)> {
        match &self.kind {
            ErrorKind::Syntax { line, column, .. } => Some((*line, *column)),
            ErrorKind::TopLevel { .. }
            | ErrorKind::Duplicate { .. }
            | ErrorKind::Invalid { .. } => None,
        }
    }
}

impl From<ConfigError> for HsfConfigError {
    /// Wraps a configuration error, so that `?` can mix
    /// [`HsfQosConfig::from_json`](crate::HsfQosConfig::from_json) with
    /// [`HsfQosConfig::application`](crate::HsfQosConfig::application) and
    /// [`HsfQosConfig::service`](crate::HsfQosConfig::service).
    fn from(error: ConfigError) -> Self {
        let shown_key = name(error.field());
        HsfConfigError::invalid(error, shown_key)
    }
}

impl fmt::Display for HsfConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Syntax { message, .. } => {
                write!(f, "HSF QoS configuration is not valid JSON: {message}")
            }
            ErrorKind::TopLevel { shown } => write!(
                f,
                "invalid HSF QoS configuration: the top level is {shown} (allowed: a JSON object \
                 of blocks keyed \"DEFAULT\" or \"service:version\")"
            ),
            ErrorKind::Duplicate { shown, block, .. } => write!(
                f,
                "invalid HSF QoS configuration: {} `{shown}` is given more than once",
                if *block { "block" } else { "key" }
            ),
            ErrorKind::Invalid { error, shown_key } => write!(
                f,
                "invalid HSF QoS configuration: `{shown_key}` = {} (allowed: {})",
                error.value(),
                error.allowed()
            ),
        }
    }
}

// The detail is part of the message, so there is no separate source to report.
impl std::error::Error for HsfConfigError {}
