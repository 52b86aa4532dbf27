//! Typed configuration errors.

use std::fmt;

/// A configuration value outside its allowed range.
///
/// The message names the field, the value that was given and the range that is allowed, so a
/// misconfiguration read from a config center can be fixed from the log line alone.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    field: String,
    value: String,
    allowed: String,
}

impl ConfigError {
    /// A new error for `field`, which was given `value` but must lie in `allowed`.
    pub fn new(
        field: impl Into<String>,
        value: impl fmt::Display,
        allowed: impl Into<String>,
    ) -> Self {
        ConfigError {
            field: field.into(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }

    /// The name of the offending field (for configuration read from text, the key as written).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The offending value, as given.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The allowed range, in words.
    pub fn allowed(&self) -> &str {
        &self.allowed
    }

    /// The same error with the field name placed under `prefix` (`prefix.field`).
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = format!("{prefix}.{}", self.field);
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration: `{}` = {} (allowed: {})",
            self.field, self.value, self.allowed
        )
    }
}

impl std::error::Error for ConfigError {}

/// Checks that a ratio lies in `[0, 1]` and is a number.
pub fn check_ratio(field: &str, value: f64) -> Result<f64, ConfigError> {
    if value.is_finite() && (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::new(field, value, "a number in [0, 1]"))
    }
}

/// Checks that a duration is not zero.
pub fn check_nonzero_duration(
    field: &str,
    value: std::time::Duration,
) -> Result<std::time::Duration, ConfigError> {
    if value.is_zero() {
        Err(ConfigError::new(
            field,
            format_args!("{value:?}"),
            "greater than 0",
        ))
    } else {
        Ok(value)
    }
}
