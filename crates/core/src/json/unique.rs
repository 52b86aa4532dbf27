//! The visitor behind [`parse`](super::parse): a [`Value`] built with every object's keys checked.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::{DuplicateKey, PathSegment};

/// Reads one JSON value, recording the first repeated key read into `found`.
///
/// The path of the repeat is not tracked on the way down (that would copy every key read): the
/// object that finds the repeat records it with an empty path, and each level pushes its own
/// key or position as the parse returns through it, innermost first. [`parse`](super::parse)
/// reverses the path at the end.
pub(super) struct Unique<'a> {
    found: &'a mut Option<DuplicateKey>,
}

impl<'a> Unique<'a> {
    pub(super) fn new(found: &'a mut Option<DuplicateKey>) -> Self {
        Unique { found }
    }

    /// Reads one value nested at `segment`, adding `segment` to the path of a repeat found in it.
    fn nested<E>(
        &mut self,
        segment: impl FnOnce() -> PathSegment,
        read: impl FnOnce(Unique<'_>) -> Result<Option<Value>, E>,
    ) -> Result<Option<Value>, E> {
        let fresh = self.found.is_none();
        let value = read(Unique {
            found: &mut *self.found,
        })?;
        if fresh {
            if let Some(found) = self.found.as_mut() {
                found.path.push(segment());
            }
        }
        Ok(value)
    }
}

impl<'de> DeserializeSeed<'de> for Unique<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        // serde_json counts the nesting of `deserialize_any`, so deep input fails at its limit
        // instead of overflowing the stack.
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Unique<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            // Checked before the value is read, so that the first repeat in reading order wins.
            let repeated = object.contains_key(&key);
            if repeated && self.found.is_none() {
                *self.found = Some(DuplicateKey {
                    key: key.clone(),
                    path: Vec::new(),
                });
            }
            // The value is parsed either way, so that malformed JSON after a repeat is still
            // reported as malformed JSON. The first value of a repeated key is kept.
            let value = self.nested(
                || PathSegment::Key(key.clone()),
                |seed| map.next_value_seed(seed).map(Some),
            )?;
            if let (false, Some(value)) = (repeated, value) {
                object.insert(key, value);
            }
        }
        Ok(Value::Object(object))
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Value, A::Error> {
        let mut array = Vec::new();
        loop {
            let index = array.len();
            match self.nested(
                || PathSegment::Index(index),
                |seed| seq.next_element_seed(seed),
            )? {
                Some(value) => array.push(value),
                None => return Ok(Value::Array(array)),
            }
        }
    }

    // These are all the other calls serde_json's `deserialize_any` makes (without its
    // `arbitrary_precision` feature), answered as `Value`'s own visitor answers them.
    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        // serde_json rejects non-finite numbers while parsing, so this is never `null`.
        Ok(Value::from(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }
}
