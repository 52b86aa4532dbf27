//! The reader's error type and its message.

use std::fmt;

use tower_outlier_core::text::{clip, name};
use tower_outlier_core::ConfigError;

use super::keys::{Key, KEY_COUNT, PREFIX};
use super::Written;

/// Why SOFARPC fault-tolerance properties could not be read: a value that is malformed or out of
/// range, or an unknown key under `com.alipay.sofa.rpc.aft.`.
///
/// The error names the key and the value as written, the line they are on and what is allowed.
/// The accessors return the key and the value whole; the message shows them as
/// [`tower_outlier_core::text`] does, cut to
/// [`MAX_SHOWN_CHARS`](tower_outlier_core::text::MAX_SHOWN_CHARS) characters and with control
/// characters escaped (the value always quoted, the key quoted when it holds one), so that a huge
/// or hostile key cannot flood or forge a log line:
///
/// ```
/// use tower_outlier_weight::SofaProperties;
///
/// let error = SofaProperties::from_properties(
///     "# fault tolerance\n\
///      com.alipay.sofa.rpc.aft.regulation.effective=true\n\
///      com.alipay.sofa.rpc.aft.weight.degrade.rate=-0.5\n",
/// )
/// .unwrap_err();
/// assert_eq!(error.key(), "com.alipay.sofa.rpc.aft.weight.degrade.rate");
/// assert_eq!(error.value(), "-0.5");
/// assert_eq!(error.line(), Some(3));
/// assert_eq!(error.allowed(), "a number in (0, 1]");
/// assert!(!error.is_unknown_key());
///
/// let error = SofaProperties::from_properties("com.alipay.sofa.rpc.aft.time.windows=20")
///     .unwrap_err();
/// assert!(error.is_unknown_key());
/// assert_eq!(error.key(), "com.alipay.sofa.rpc.aft.time.windows");
/// ```
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(docsrs, doc(cfg(feature = "sofa")))]
pub struct PropertiesError {
    detail: ConfigError,
    line: Option<usize>,
    unknown_key: bool,
}

impl PropertiesError {
    pub(super) fn invalid(key: &str, value: &str, allowed: String, line: Option<usize>) -> Self {
        PropertiesError {
            detail: ConfigError::new(key, value, allowed),
            line,
            unknown_key: false,
        }
    }

    pub(super) fn unknown_key(key: &str, value: &str, line: usize) -> Self {
        let known: Vec<&str> = Key::ALL.into_iter().map(Key::suffix).collect();
        let allowed = format!("{PREFIX} followed by one of {}", known.join(", "));
        PropertiesError {
            detail: ConfigError::new(key, value, allowed),
            line: Some(line),
            unknown_key: true,
        }
    }

    /// A [`WeightBuilder::build`](crate::WeightBuilder::build) error, named by the property key
    /// that set the field.
    pub(super) fn from_build(error: &ConfigError, written: &[Option<Written>; KEY_COUNT]) -> Self {
        let key = Key::ALL
            .into_iter()
            .find(|key| key.builder_field() == error.field());
        match key.and_then(|key| written[key as usize].as_ref()) {
            Some(written) => PropertiesError::invalid(
                &written.key,
                &written.value,
                error.allowed().to_owned(),
                Some(written.line),
            ),
            // A default the builder rejects: no line to point at.
            None => PropertiesError::invalid(
                key.map_or(error.field(), |key| key.name()),
                error.value(),
                error.allowed().to_owned(),
                None,
            ),
        }
    }

    /// The offending key, as written (`Com.alipay.sofa.rpc.aft.degrade.effective`).
    pub fn key(&self) -> &str {
        self.detail.field()
    }

    /// The offending value, as written (after the surrounding whitespace is removed); empty when
    /// the key has no value.
    pub fn value(&self) -> &str {
        self.detail.value()
    }

    /// The 1-based line the key is on (for a continued line, the line it starts on). `None` only
    /// when no line of the text is at fault.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// What is allowed, in words: the value's range, or for an unknown key the known keys.
    pub fn allowed(&self) -> &str {
        self.detail.allowed()
    }

    /// Whether the key itself is at fault: under `com.alipay.sofa.rpc.aft.` but not a
    /// fault-tolerance key (most likely misspelt).
    pub fn is_unknown_key(&self) -> bool {
        self.unknown_key
    }
}

impl fmt::Display for PropertiesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unknown_key {
            f.write_str("unknown SOFARPC fault-tolerance key")?;
        } else {
            f.write_str("invalid SOFARPC fault-tolerance property")?;
        }
        if let Some(line) = self.line {
            write!(f, " on line {line}")?;
        }
        write!(f, ": `{}`", name(self.key()))?;
        if !self.unknown_key {
            write!(f, " = {}", clip(format!("{:?}", self.value())))?;
        }
        write!(f, " (allowed: {})", self.allowed())
    }
}

// The detail is part of the message, so there is no separate source to report.
impl std::error::Error for PropertiesError {}
