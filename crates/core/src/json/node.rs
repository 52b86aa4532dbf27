//! [`Node`]: objects read with their first repeated key recorded, at the levels a type names.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::SeqAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// A JSON value whose objects are read with duplicate detection, their entries held as `T`.
///
/// `serde_json::Value` cannot stand for an object whose repeated keys matter, because its map
/// keeps only the last value of a repeated key. A `Node` object keeps the **first** value of every
/// key and remembers the first key that came again. Nest it to check more levels: a
/// `Node<Node<Value>>` checks the top-level object and each object directly in it, and reads
/// everything deeper (and every array) as a plain [`Value`], repeats unchecked.
///
/// Deserialise it with serde_json (`serde_json::from_str::<Node<Value>>`), whose syntax errors,
/// line and column and nesting limit apply unchanged. A repeat is not an error while parsing: the
/// rest of the text is still parsed, so malformed JSON after a repeated key is reported as
/// malformed JSON, and the reader decides how to report the repeat.
///
/// ```
/// use serde_json::Value;
/// use tower_outlier_core::json::Node;
///
/// let text = r#"{"DEFAULT": {"on": true, "on": false}, "svc": {"a": {"x": 1, "x": 2}}}"#;
/// let Node::Object { entries, duplicate } = serde_json::from_str::<Node<Node<Value>>>(text)?
/// else {
///     panic!("not an object");
/// };
/// assert_eq!(duplicate, None);
/// let Node::Object { entries: block, duplicate } = &entries["DEFAULT"] else {
///     panic!("not an object");
/// };
/// assert_eq!(duplicate.as_deref(), Some("on"));
/// assert_eq!(block["on"], true); // the first value is kept
/// // Below the levels the type names, values are plain `Value`s (the last `x` wins).
/// let Node::Object { entries: block, duplicate: None } = &entries["svc"] else {
///     panic!("not an object without repeats");
/// };
/// assert_eq!(block["a"]["x"], 2);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Node<T> {
    /// A JSON object: its entries by key (sorted; the first value of a repeated key), and the
    /// first key that appeared more than once.
    Object {
        /// Every key the object holds, with the first value given for it.
        entries: BTreeMap<String, T>,
        /// The first key whose second occurrence was read, if any key was repeated.
        duplicate: Option<String>,
    },
    /// Any other JSON value (`null`, a boolean, a number, a string or an array).
    Other(Value),
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
