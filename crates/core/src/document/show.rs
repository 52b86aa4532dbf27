//! How a [`DocumentError`] reads: its message, and a builder's error as one.

use std::error::Error;
use std::fmt;

use super::{DocumentError, Place, Problem};
use crate::error::ConfigError;
use crate::text::name;

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let document = self.inner.document;
        if let Problem::Syntax { message, .. } = &self.inner.problem {
            return write!(f, "{document} is not valid JSON: {message}");
        }
        match &self.inner.place {
            Place::Document => write!(f, "invalid {document}: ")?,
            Place::Line(line) => write!(f, "invalid {document} on line {line}: ")?,
            Place::Entry { noun, index, name } => {
                write!(f, "invalid {noun} #{index}")?;
                if let Some((what, _, shown)) = name {
                    write!(f, " ({what} {shown})")?;
                }
                f.write_str(": ")?;
            }
        }
        match &self.inner.problem {
            Problem::Syntax { .. } => Ok(()),
            Problem::Shape {
                what,
                shown,
                allowed,
            } => write!(f, "the {what} is {shown} (allowed: {allowed})"),
            Problem::Duplicate {
                shown,
                alias,
                what,
                found_in,
                ..
            } => {
                if let Some(what) = what {
                    write!(f, "{what} ")?;
                }
                write!(f, "`{shown}` is given more than once")?;
                if let Some(object) = found_in {
                    write!(f, " in {object}")?;
                }
                match alias {
                    Some(alias) => write!(f, " (also as `{}`)", name(alias)),
                    None => Ok(()),
                }
            }
            Problem::Unknown {
                shown, hint, what, ..
            } => write!(f, "unknown {} `{shown}` ({hint})", what.unwrap_or("field")),
            Problem::Invalid {
                shown,
                error,
                shown_value,
            } => write!(
                f,
                "`{shown}` = {} (allowed: {})",
                shown_value.as_deref().unwrap_or(error.value()),
                error.allowed()
            ),
        }
    }
}

// The detail is part of the message, so there is no separate source to report.
impl Error for DocumentError {}

impl From<ConfigError> for DocumentError {
    /// A builder's error as a reader's, so that `?` can mix a reader with the builders or
    /// resolvers its documents feed: its document is "configuration", and its message the
    /// [`ConfigError`]'s (field and value clipped).
    ///
    /// ```
    /// use tower_outlier_core::{ConfigError, DocumentError};
    ///
    /// let error = DocumentError::from(ConfigError::new("min_calls", 0, "at least 1"));
    /// assert_eq!(error.field(), Some("min_calls"));
    /// assert_eq!(error.to_string(), "invalid configuration: `min_calls` = 0 (allowed: at least 1)");
    /// ```
    fn from(error: ConfigError) -> Self {
        let shown = name(error.field());
        let value = crate::text::clip(error.value().to_owned());
        DocumentError::invalid("configuration", error, shown).showing_value(value)
    }
}
