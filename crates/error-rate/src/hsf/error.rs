//! The HSF reader's errors ([`DocumentError`]s), and how their messages show keys and values.

use serde_json::Value;
use tower_outlier_core::text::{clip, name};
use tower_outlier_core::{ConfigError, DocumentError};

/// The document's name, as messages show it.
pub(super) const DOCUMENT: &str = "HSF QoS configuration";

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

/// Not JSON at all: serde_json's message, which ends with the line and column.
pub(super) fn syntax(error: serde_json::Error) -> DocumentError {
    DocumentError::syntax(DOCUMENT, error.to_string(), error.line(), error.column())
}

/// JSON, but not an object.
pub(super) fn top_level(value: &Value) -> DocumentError {
    DocumentError::top_level(
        DOCUMENT,
        show_json(value),
        "a JSON object of blocks keyed \"DEFAULT\" or \"service:version\"",
    )
}

/// `block_name` given twice, or, with `key_name`, that key given twice in `block_name` (the
/// error's field is then qualified by the block).
pub(super) fn duplicate(block_name: &str, key_name: Option<&str>) -> DocumentError {
    match key_name {
        None => DocumentError::duplicate(DOCUMENT, block_name.to_owned(), name(block_name))
            .naming("block"),
        Some(key_name) => DocumentError::duplicate(
            DOCUMENT,
            format!("{block_name}.{key_name}"),
            qualified(block_name, key_name),
        )
        .naming("key"),
    }
}

/// A block or a value that is not what HSF expects; `shown_key` is the error's field made safe
/// for a message.
pub(super) fn invalid(error: ConfigError, shown_key: String) -> DocumentError {
    DocumentError::invalid(DOCUMENT, error, shown_key)
}
