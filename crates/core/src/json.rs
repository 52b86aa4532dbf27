//! JSON for configuration readers, with keys given twice detected (cargo feature `json`).
//!
//! serde_json, like most JSON parsers, keeps the last value of a key an object repeats and drops
//! the others without a word. A configuration reader that does the same silently loses
//! configuration: `{"count": 100, "count": 200}` is read as 200, and a block given twice loses
//! every key of its first copy. This module reads JSON with serde_json's grammar, messages and
//! limits (line and column of a syntax error, the nesting limit of 128) but reports repeats:
//!
//! * [`parse`] reads the whole text into a [`serde_json::Value`] and fails with
//!   [`ParseError::DuplicateKey`] if any object, at any depth, holds a key twice. The error names
//!   the first such key in reading order and where its object is ([`DuplicateKey::path`]).
//! * [`Node`] checks chosen levels only: a `Node<Node<Value>>` reads an object of objects and
//!   records, for the top level and for each of its objects, the first key given twice, while the
//!   values below are plain [`Value`]s whose repeats are not checked. Deserialise it with
//!   `serde_json::from_str`; the reader decides what a repeat means and in which order it reports
//!   it among its other errors.
//!
//! Either way malformed JSON anywhere in the text is reported as malformed, even after a repeated
//! key: every value is parsed to the end of the text.
//!
//! ```
//! use tower_outlier_core::json::{self, ParseError, PathSegment};
//!
//! let value = json::parse(r#"[{"resource": "a", "count": 100}]"#)?;
//! assert_eq!(value[0]["count"], 100);
//!
//! let Err(ParseError::DuplicateKey(duplicate)) =
//!     json::parse(r#"[{"resource": "a", "count": 100, "count": 200}]"#)
//! else {
//!     panic!("the repeat was not reported");
//! };
//! assert_eq!(duplicate.key(), "count");
//! assert_eq!(duplicate.path(), [PathSegment::Index(0)]);
//! assert_eq!(
//!     duplicate.to_string(),
//!     "key `count` is given more than once in the object at `[0]`"
//! );
//! # Ok::<(), ParseError>(())
//! ```

use std::fmt;

use serde::de::DeserializeSeed;
use serde_json::Value;

use crate::text::{clip, name};

mod node;
mod unique;

pub use node::Node;

/// Parses `text` as one JSON value, as `serde_json::from_str::<Value>` does, except that an object
/// holding a key more than once, at any depth, is an error.
///
/// Malformed JSON is reported before a repeated key, wherever each is; of several repeated keys,
/// the first one read (the first key whose second occurrence comes earliest in the text) is
/// reported. Leading and trailing whitespace is allowed, anything else after the value is not. A
/// leading byte-order mark is malformed JSON here, as for serde_json; readers that accept one
/// strip it first.
///
/// # Errors
///
/// [`ParseError::Syntax`] for text that is not one JSON value (serde_json's error, with its line
/// and column), [`ParseError::DuplicateKey`] for well-formed JSON in which an object repeats a
/// key.
pub fn parse(text: &str) -> Result<Value, ParseError> {
    let mut duplicate = None;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = unique::Unique::new(&mut duplicate)
        .deserialize(&mut deserializer)
        .map_err(ParseError::Syntax)?;
    deserializer.end().map_err(ParseError::Syntax)?;
    match duplicate {
        None => Ok(value),
        Some(mut duplicate) => {
            // The path was collected innermost first, as the parse returned from each level.
            duplicate.path.reverse();
            Err(ParseError::DuplicateKey(duplicate))
        }
    }
}

/// Why [`parse`] refused its text.
#[derive(Debug)]
pub enum ParseError {
    /// The text is not one JSON value: serde_json's error, whose message ends with the line and
    /// column ([`serde_json::Error::line`], [`serde_json::Error::column`]).
    Syntax(serde_json::Error),
    /// The text is JSON, but an object in it holds a key more than once.
    DuplicateKey(DuplicateKey),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Syntax(error) => write!(f, "not valid JSON: {error}"),
            ParseError::DuplicateKey(duplicate) => write!(f, "{duplicate}"),
        }
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ParseError::Syntax(error) => Some(error),
            ParseError::DuplicateKey(_) => None,
        }
    }
}

/// A key that an object holds more than once, and where that object is.
///
/// The accessors return the key and the path as written; the message ([`Display`](fmt::Display))
/// shows them through [`text::name`](crate::text::name) (clipped, and quoted and escaped when
/// they hold characters that could break a log line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuplicateKey {
    key: String,
    /// From the top level down; collected in reverse while parsing.
    path: Vec<PathSegment>,
}

impl DuplicateKey {
    /// The repeated key, as written (JSON escapes resolved).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Where the object holding the repeated key is: the keys and array positions leading to it
    /// from the top level, outermost first. Empty when the top-level object repeats the key.
    pub fn path(&self) -> &[PathSegment] {
        &self.path
    }
}

impl fmt::Display for DuplicateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key `{}` is given more than once in ", name(&self.key))?;
        if self.path.is_empty() {
            f.write_str("the top-level object")
        } else {
            write!(f, "the object at `{}`", show_path(&self.path))
        }
    }
}

/// One step of a [`DuplicateKey::path`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathSegment {
    /// The value of this key of an object.
    Key(String),
    /// The element at this position of an array, from 0.
    Index(usize),
}

/// A path as error accessors return it: keys exactly as written, joined by `.`, positions in
/// brackets (`rules[0].count`). Unlike [`show_path`] nothing is escaped or clipped, so it can be
/// compared with the document's keys.
pub fn written_path(path: &[PathSegment]) -> String {
    let mut text = String::new();
    for segment in path {
        match segment {
            PathSegment::Key(key) => {
                if !text.is_empty() {
                    text.push('.');
                }
                text.push_str(key);
            }
            PathSegment::Index(index) => {
                text.push('[');
                text.push_str(&index.to_string());
                text.push(']');
            }
        }
    }
    text
}

/// A path as an error message shows it, in the style of jq without the leading dot: keys joined
/// by `.`, array positions in brackets (`[0].limits.per_host`, `rules[2]`). Each key goes through
/// [`text::name`](crate::text::name), and the whole is clipped, so neither a long key nor a deep
/// path can flood a log line. An empty path shows as an empty string.
///
/// ```
/// use tower_outlier_core::json::{show_path, PathSegment};
///
/// let path = [
///     PathSegment::Index(2),
///     PathSegment::Key("extra".to_owned()),
///     PathSegment::Key("evil\nkey".to_owned()),
/// ];
/// assert_eq!(show_path(&path), r#"[2].extra."evil\nkey""#);
/// ```
pub fn show_path(path: &[PathSegment]) -> String {
    let mut shown = String::new();
    for segment in path {
        // Deep paths stop growing once they are longer than an error shows anyway.
        if shown.chars().count() > crate::text::MAX_SHOWN_CHARS {
            break;
        }
        match segment {
            PathSegment::Key(key) => {
                if !shown.is_empty() {
                    shown.push('.');
                }
                shown.push_str(&name(key));
            }
            PathSegment::Index(index) => {
                shown.push('[');
                shown.push_str(&index.to_string());
                shown.push(']');
            }
        }
    }
    clip(shown)
}

#[cfg(test)]
mod tests;
