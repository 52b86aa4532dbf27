//! The reader's errors ([`DocumentError`]s): a value malformed or out of range, or an unknown
//! key under `com.alipay.sofa.rpc.aft.`, each named by the key and value as written and the line.

use tower_outlier_core::text::{clip, name};
use tower_outlier_core::{ConfigError, DocumentError};

use super::keys::{Key, KEY_COUNT, PREFIX};
use super::Written;

/// The document's name, as messages show it.
const DOCUMENT: &str = "SOFARPC fault-tolerance properties";

/// `key` = `value` (as written) is not allowed; `line` is where it is written, `None` for a
/// default the builder rejects.
pub(super) fn invalid(
    key: &str,
    value: &str,
    allowed: String,
    line: Option<usize>,
) -> DocumentError {
    // Values are read verbatim: the message quotes and escapes them.
    let error = DocumentError::invalid(DOCUMENT, ConfigError::new(key, value, allowed), name(key))
        .showing_value(clip(format!("{value:?}")));
    match line {
        Some(line) => error.at_line(line),
        None => error,
    }
}

/// `key` is under the prefix but not a fault-tolerance key (most likely misspelt).
pub(super) fn unknown_key(key: &str, value: &str, line: usize) -> DocumentError {
    let known: Vec<&str> = Key::ALL.into_iter().map(Key::suffix).collect();
    let allowed = format!("{PREFIX} followed by one of {}", known.join(", "));
    DocumentError::unknown(
        DOCUMENT,
        key.to_owned(),
        name(key),
        format!("allowed: {allowed}"),
    )
    .naming("key")
    .with_detail(ConfigError::new(key, value, allowed))
    .at_line(line)
}

/// A [`WeightBuilder::build`](crate::WeightBuilder::build) error, named by the property key
/// that set the field.
pub(super) fn from_build(
    error: &ConfigError,
    written: &[Option<Written>; KEY_COUNT],
) -> DocumentError {
    let key = Key::ALL
        .into_iter()
        .find(|key| key.builder_field() == error.field());
    match key.and_then(|key| written[key as usize].as_ref()) {
        Some(written) => invalid(
            &written.key,
            &written.value,
            error.allowed().to_owned(),
            Some(written.line),
        ),
        // A default the builder rejects: no line to point at.
        None => invalid(
            key.map_or(error.field(), |key| key.name()),
            error.value(),
            error.allowed().to_owned(),
            None,
        ),
    }
}
