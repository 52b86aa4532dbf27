//! The configuration-center JSON as parsed, before validation: the top level and each block are
//! [`Node`]s, which keep every key they were given once and remember the first key they were
//! given twice.
//!
//! `serde_json::Value` cannot be used for the objects the reader interprets (the top level and
//! each block), because its map keeps only the last value of a repeated key: a `"DEFAULT"` block
//! given twice would silently lose the first one. Values inside a block are plain [`Value`]s,
//! whose repeats are not the reader's business. The detection is `tower_outlier_core::json`'s,
//! shared with the other configuration readers.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_objects_read_as_serde_json_reads_them() {
        for text in [
            "null",
            "true",
            "-3",
            "18446744073709551615",
            "0.5",
            "1e+30",
            r#""a\nb""#,
            r#"[1, {"a": 1, "a": 2}, [null]]"#,
        ] {
            let expected: Value = serde_json::from_str(text).unwrap();
            match parse(text).unwrap() {
                Node::Other(value) => assert_eq!(value, expected, "{text}"),
                Node::Object { .. } => panic!("{text} read as an object"),
            }
        }
    }

    #[test]
    fn objects_record_their_first_duplicate_key() {
        let document =
            parse(r#"{"b": {"x": 1, "y": 2, "x": 3, "y": 4}, "a": 1, "b": {}, "a": 2}"#).unwrap();
        let Node::Object { entries, duplicate } = document else {
            panic!("not an object");
        };
        assert_eq!(duplicate.as_deref(), Some("b"));
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["a", "b"]);
        // The first value of a repeated key is kept.
        assert!(matches!(&entries["a"], Node::Other(value) if *value == 1));
        let Node::Object { entries, duplicate } = &entries["b"] else {
            panic!("not an object");
        };
        assert_eq!(duplicate.as_deref(), Some("x"));
        assert_eq!(entries["x"], 1);
        assert_eq!(entries["y"], 2);
    }

    #[test]
    fn malformed_json_after_a_duplicate_is_still_a_syntax_error() {
        assert!(parse(r#"{"a": {}, "a": {"x": 1e400}}"#).is_err());
        assert!(parse(r#"{"a": {}, "a": {"x": }}"#).is_err());
    }
}
