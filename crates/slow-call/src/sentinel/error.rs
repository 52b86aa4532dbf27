//! The reader's errors ([`DocumentError`]s): what each kind of problem says.

use serde_json::Value;
use tower_outlier_core::json::{show_path, written_path, ParseError, PathSegment};
use tower_outlier_core::text::name;
use tower_outlier_core::{ConfigError, DocumentError};

use super::show_json;

/// The document's name, as messages show it.
const DOCUMENT: &str = "Sentinel degrade rule list";

/// One entry's name, as messages show it ("invalid Sentinel degrade rule #2").
const RULE: &str = "Sentinel degrade rule";

/// Not JSON at all: serde_json's message, which ends with the line and column.
pub(super) fn syntax(error: serde_json::Error) -> DocumentError {
    DocumentError::syntax(DOCUMENT, error.to_string(), error.line(), error.column())
}

/// Malformed JSON, or a key given twice: in a rule (its field), inside a rule (at a path within
/// it), or outside any rule.
pub(super) fn from_parse(error: ParseError) -> DocumentError {
    let duplicate = match error {
        ParseError::Syntax(error) => return syntax(error),
        ParseError::DuplicateKey(duplicate) => duplicate,
    };
    let key = duplicate.key();
    // The field is the key's path as written: from its rule when it is in one, else from the top.
    let duplicate_at = |within: &[PathSegment]| {
        let mut path = within.to_vec();
        path.push(PathSegment::Key(key.to_owned()));
        DocumentError::duplicate(DOCUMENT, written_path(&path), name(key)).naming("key")
    };
    // A path that starts at a position in the array starts at a rule.
    match duplicate.path() {
        [PathSegment::Index(index)] => {
            DocumentError::duplicate(DOCUMENT, key.to_owned(), name(key))
                .naming("field")
                .in_entry(RULE, *index)
        }
        [PathSegment::Index(index), within @ ..] => duplicate_at(within)
            .found_in(format!("`{}`", show_path(within)))
            .in_entry(RULE, *index),
        [] => duplicate_at(&[]).found_in("the top-level object".to_owned()),
        within => duplicate_at(within).found_in(format!("`{}`", show_path(within))),
    }
}

/// JSON, but not an array.
pub(super) fn top_level(value: &Value) -> DocumentError {
    DocumentError::top_level(
        DOCUMENT,
        show_json(value),
        "a JSON array of DegradeRule objects",
    )
}

/// An element of the array that is not an object.
pub(super) fn not_an_object(index: usize, value: &Value) -> DocumentError {
    DocumentError::shape(
        DOCUMENT,
        "rule",
        show_json(value),
        "a JSON object of DegradeRule fields",
    )
    .in_entry(RULE, index)
}

/// A field of rule `index` that is missing, of the wrong type or out of range; `resource` is the
/// rule's, when it has a valid one.
pub(super) fn invalid(index: usize, resource: Option<&str>, error: ConfigError) -> DocumentError {
    let shown = name(error.field());
    let error = DocumentError::invalid(DOCUMENT, error, shown).in_entry(RULE, index);
    match resource {
        Some(resource) => error.entry_named("resource", resource),
        None => error,
    }
}
