//! The configuration-center JSON as parsed, before validation: objects keep every key they were
//! given once and remember the first key they were given twice.
//!
//! `serde_json::Value` cannot be used for the objects the reader interprets (the top level and
//! each block), because its map keeps only the last value of a repeated key: a `"DEFAULT"` block
//! given twice would silently lose the first one. Values inside a block are plain [`Value`]s.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::SeqAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// A JSON value whose objects are read with duplicate detection, their entries held as `T`.
#[derive(Debug)]
pub(super) enum Node<T> {
    /// A JSON object: its entries by key (sorted), and the first key that appeared more than once.
    Object {
        entries: BTreeMap<String, T>,
        duplicate: Option<String>,
    },
    /// Any other JSON value.
    Other(Value),
}

/// The whole document: a top level of blocks, each a [`Node`] of values.
pub(super) type Document = Node<Node<Value>>;

/// Parses `text` as JSON; syntax errors are serde_json's, with its line and column. Keys given
/// twice are not errors here: they are recorded, and every value is still parsed, so malformed
/// JSON anywhere in the text is reported as such.
pub(super) fn parse(text: &str) -> Result<Document, serde_json::Error> {
    serde_json::from_str(text)
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Node<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor(PhantomData))
    }
}

struct NodeVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for NodeVisitor<T> {
    type Value = Node<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = BTreeMap::new();
        let mut duplicate = None;
        while let Some(key) = map.next_key::<String>()? {
            // The value is parsed either way, so that malformed JSON after a duplicate is still
            // reported as malformed JSON.
            let value = map.next_value::<T>()?;
            match entries.entry(key) {
                Entry::Vacant(slot) => {
                    slot.insert(value);
                }
                Entry::Occupied(slot) => {
                    duplicate.get_or_insert_with(|| slot.key().clone());
                }
            }
        }
        Ok(Node::Object { entries, duplicate })
    }

    // Everything else is an ordinary JSON value. These are all the calls serde_json's
    // `deserialize_any` makes (without its `arbitrary_precision` feature).
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Value::deserialize(SeqAccessDeserializer::new(seq)).map(Node::Other)
    }

    fn visit_bool<E>(self, value: bool) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::Bool(value)))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::from(value)))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::from(value)))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Self::Value, E> {
        // serde_json rejects non-finite numbers while parsing, so this is never `null`.
        Ok(Node::Other(Value::from(value)))
    }

    fn visit_str<E>(self, value: &str) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::String(value.to_owned())))
    }

    fn visit_string<E>(self, value: String) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::String(value)))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        Value::deserialize(deserializer).map(Node::Other)
    }
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
