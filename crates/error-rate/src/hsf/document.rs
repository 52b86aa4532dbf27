//! The configuration-center JSON as parsed, before validation: the top level and each block are
//! [`Node`]s, which keep every key they were given once and remember the first key they were
//! given twice.
//!
//! `serde_json::Value` cannot be used for the objects the reader interprets (the top level and
//! each block), because its map keeps only the last value of a repeated key: a `"DEFAULT"` block
//! given twice would silently lose the first one. Values inside a block are plain [`Value`]s,
//! whose repeats are not the reader's business. The detection is `tower_outlier_core::json`'s,
//! shared with the other configuration readers and tested there.

use serde_json::Value;
pub(super) use tower_outlier_core::json::Node;

/// The whole document: a top level of blocks, each a [`Node`] of values.
pub(super) type Document = Node<Node<Value>>;

/// Parses `text` as JSON; syntax errors are serde_json's, with its line and column. Keys given
/// twice are not errors here: they are recorded, and every value is still parsed, so malformed
/// JSON anywhere in the text is reported as such.
pub(super) fn parse(text: &str) -> Result<Document, serde_json::Error> {
    serde_json::from_str(text)
}
