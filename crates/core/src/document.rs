//! Why a configuration document could not be read: the error type every reader of the policy
//! crates returns.

use crate::error::ConfigError;

/// Why a configuration document could not be read: text that is not valid JSON, a top level (or
/// an entry) of the wrong kind, a key given twice, a key the reader refuses, or a value of the
/// wrong type or out of range (which carries a [`ConfigError`] naming the field's path as
/// written). Every reader of the policy crates returns it: Envoy's and gRPC's JSON, HSF's
/// configuration-center JSON, Sentinel's degrade rules, SOFARPC's properties.
///
/// Where the document is a list, the error names the entry at fault ([`entry`](Self::entry), and
/// the entry's own name, [`entry_name`](Self::entry_name), when it has a valid one); where it is
/// read line by line, the line ([`line`](Self::line)).
///
/// The accessors return names and values as written; the message ([`Display`](std::fmt::Display))
/// shows them clipped to 80 characters and, when they hold control characters, quoted and
/// escaped, so that a huge or hostile key can neither flood nor forge a log line. Readers build
/// it with the constructors below, each given the document's name for the message.
///
/// ```
/// use tower_outlier_core::{ConfigError, DocumentError};
///
/// let error = DocumentError::invalid(
///     "Envoy outlier_detection",
///     ConfigError::new("baseEjectionTime", "\"-1s\"", "a duration of 0s or more"),
///     "baseEjectionTime".into(),
/// );
/// assert_eq!(error.field(), Some("baseEjectionTime"));
/// assert_eq!(error.config_error().unwrap().value(), "\"-1s\"");
/// assert_eq!(
///     error.to_string(),
///     "invalid Envoy outlier_detection: `baseEjectionTime` = \"-1s\" (allowed: a duration of 0s or more)"
/// );
///
/// let error = DocumentError::syntax("gRPC outlier_detection_experimental config", "EOF".into(), 2, 14);
/// assert_eq!(error.location(), Some((2, 14)));
/// assert_eq!(error.field(), None);
///
/// // An entry of a list, named by its position and its own name.
/// let error = DocumentError::invalid(
///     "Sentinel degrade rule list",
///     ConfigError::new("count", "-1", "a JSON number of 0 or more"),
///     "count".into(),
/// )
/// .in_entry("Sentinel degrade rule", 2)
/// .entry_named("resource", "/orders");
/// assert_eq!((error.entry(), error.entry_name()), (Some(2), Some("/orders")));
/// assert_eq!(
///     error.to_string(),
///     "invalid Sentinel degrade rule #2 (resource \"/orders\"): `count` = -1 (allowed: a JSON number of 0 or more)"
/// );
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct DocumentError {
    // Boxed: an error is rare, and a `Result` carrying it stays two words wide.
    inner: Box<Inner>,
}

#[derive(Clone, Debug, PartialEq)]
struct Inner {
    document: &'static str,
    place: Place,
    problem: Problem,
}

/// Where in the document the problem is, beyond its field.
#[derive(Clone, Debug, PartialEq)]
enum Place {
    Document,
    /// An entry of a list document: how messages name one (`"Sentinel degrade rule"`), its
    /// position from 0, and its own name when it has a valid one (what the name is, as written,
    /// and as a message shows it).
    Entry {
        noun: &'static str,
        index: usize,
        name: Option<(&'static str, String, String)>,
    },
    /// A line of a document read line by line, from 1.
    Line(usize),
}

#[derive(Clone, Debug, PartialEq)]
enum Problem {
    Syntax {
        message: String,
        line: usize,
        column: usize,
    },
    Shape {
        what: &'static str,
        shown: String,
        allowed: String,
    },
    Duplicate {
        field: String,
        shown: String,
        alias: Option<String>,
        what: Option<&'static str>,
        found_in: Option<String>,
    },
    Unknown {
        field: String,
        shown: String,
        hint: String,
        what: Option<&'static str>,
        detail: Option<ConfigError>,
    },
    Invalid {
        error: ConfigError,
        shown: String,
        shown_value: Option<String>,
    },
}

impl DocumentError {
    /// The text is not valid JSON: the parser's `message` (which ends with the line and column),
    /// and the 1-based `line` and `column` it stopped at.
    pub fn syntax(document: &'static str, message: String, line: usize, column: usize) -> Self {
        Self::new(
            document,
            Problem::Syntax {
                message,
                line,
                column,
            },
        )
    }

    /// The top level is not what the reader reads: `shown` as a message shows it, and what is
    /// allowed, in words.
    pub fn top_level(document: &'static str, shown: String, allowed: impl Into<String>) -> Self {
        Self::shape(document, "top level", shown, allowed)
    }

    /// A part of the document is not of the kind the reader reads: `what` names the part in a
    /// message (`"rule"`: "the rule is 5"), `shown` is the part as a message shows it, and
    /// `allowed` says what is, in words.
    pub fn shape(
        document: &'static str,
        what: &'static str,
        shown: String,
        allowed: impl Into<String>,
    ) -> Self {
        Self::new(
            document,
            Problem::Shape {
                what,
                shown,
                allowed: allowed.into(),
            },
        )
    }

    /// `field` (its path as written; `shown`, as a message shows it) is given more than once in
    /// its object.
    pub fn duplicate(document: &'static str, field: String, shown: String) -> Self {
        Self::new(
            document,
            Problem::Duplicate {
                field,
                shown,
                alias: None,
                what: None,
                found_in: None,
            },
        )
    }

    /// A duplicate given under a second spelling, `alias`, of the same field (protobuf's JSON
    /// has two per field). Only for a [`duplicate`](Self::duplicate): any other error is returned
    /// unchanged.
    pub fn also_as(mut self, alias: &str) -> Self {
        if let Problem::Duplicate { alias: slot, .. } = &mut self.inner.problem {
            *slot = Some(alias.to_owned());
        }
        self
    }

    /// A duplicate found in an object other than the one the field belongs to, as a message
    /// names that object (`` "`degrade.extra`" ``, `"the top-level object"`). The message shows
    /// `object` as it is: make any key in it safe first (`json::show_path` does). Only for a
    /// [`duplicate`](Self::duplicate): any other error is returned unchanged.
    pub fn found_in(mut self, object: String) -> Self {
        if let Problem::Duplicate { found_in, .. } = &mut self.inner.problem {
            *found_in = Some(object);
        }
        self
    }

    /// A duplicate or refused key whose message says what the key names (`"block"`: "block
    /// `DEFAULT` is given more than once"), where the document's keys name more than one kind of
    /// thing, or are not fields. Only for a [`duplicate`](Self::duplicate) or an
    /// [`unknown`](Self::unknown) key: any other error is returned unchanged.
    pub fn naming(mut self, what: &'static str) -> Self {
        if let Problem::Duplicate { what: slot, .. } | Problem::Unknown { what: slot, .. } =
            &mut self.inner.problem
        {
            *slot = Some(what)
        }
        self
    }

    /// `field` (its path as written; `shown`, as a message shows it) is a key the reader refuses,
    /// with `hint` saying why and what to write instead.
    pub fn unknown(document: &'static str, field: String, shown: String, hint: String) -> Self {
        Self::new(
            document,
            Problem::Unknown {
                field,
                shown,
                hint,
                what: None,
                detail: None,
            },
        )
    }

    /// A refused key with the value it was given and the keys allowed, as a
    /// [`ConfigError`] ([`config_error`](Self::config_error) returns it). Only for an
    /// [`unknown`](Self::unknown) key: any other error is returned unchanged.
    pub fn with_detail(mut self, error: ConfigError) -> Self {
        if let Problem::Unknown { detail, .. } = &mut self.inner.problem {
            *detail = Some(error);
        }
        self
    }

    /// A value of the wrong type or out of range: `error` names the field's path as written, and
    /// `shown` is that path as a message shows it.
    pub fn invalid(document: &'static str, error: ConfigError, shown: String) -> Self {
        Self::new(
            document,
            Problem::Invalid {
                error,
                shown,
                shown_value: None,
            },
        )
    }

    /// The value as a message shows it, where the [`ConfigError`] holds it as written and that
    /// is not safe to show (text read verbatim, rather than JSON re-serialised). Only for an
    /// [`invalid`](Self::invalid) value: any other error is returned unchanged.
    pub fn showing_value(mut self, shown: String) -> Self {
        if let Problem::Invalid { shown_value, .. } = &mut self.inner.problem {
            *shown_value = Some(shown);
        }
        self
    }

    /// The problem is in entry `index` (from 0) of a list document; `noun` names one entry in a
    /// message (`"Sentinel degrade rule"`: "invalid Sentinel degrade rule #2"). An error has one
    /// place: this replaces a line given before, and any entry name. Malformed JSON has its own
    /// line and column, and is returned unchanged.
    pub fn in_entry(mut self, noun: &'static str, index: usize) -> Self {
        if matches!(self.inner.problem, Problem::Syntax { .. }) {
            return self;
        }
        self.inner.place = Place::Entry {
            noun,
            index,
            name: None,
        };
        self
    }

    /// The entry's own name, `name`, and what that name is (`"resource"`), for an error
    /// [`in_entry`](Self::in_entry) (call that first: an error in no entry is returned
    /// unchanged); a message shows it quoted, clipped and escaped.
    pub fn entry_named(mut self, what: &'static str, name: &str) -> Self {
        if let Place::Entry { name: slot, .. } = &mut self.inner.place {
            let shown = crate::text::clip(format!("{name:?}"));
            *slot = Some((what, name.to_owned(), shown));
        }
        self
    }

    /// The problem is on `line` (from 1) of a document read line by line. An error has one
    /// place: this replaces an entry given before. Malformed JSON has its own line and column, and
    /// is returned unchanged.
    pub fn at_line(mut self, line: usize) -> Self {
        if matches!(self.inner.problem, Problem::Syntax { .. }) {
            return self;
        }
        self.inner.place = Place::Line(line);
        self
    }

    fn new(document: &'static str, problem: Problem) -> Self {
        DocumentError {
            inner: Box::new(Inner {
                document,
                place: Place::Document,
                problem,
            }),
        }
    }

    /// The document's name, as messages show it (`"Envoy outlier_detection"`).
    pub fn document(&self) -> &'static str {
        self.inner.document
    }

    /// The offending field or key as written, with the path to it when it is nested
    /// (`successRateEjection.enforcementPercentage`, `DEFAULT.qosEnabled`). `None` when the text
    /// is not JSON or a part of it is not of the kind the reader reads.
    pub fn field(&self) -> Option<&str> {
        match &self.inner.problem {
            Problem::Duplicate { field, .. } | Problem::Unknown { field, .. } => Some(field),
            Problem::Invalid { error, .. } => Some(error.field()),
            Problem::Syntax { .. } | Problem::Shape { .. } => None,
        }
    }

    /// The field, value (as written) and allowed range, when one value is at fault, or a refused
    /// key's value and the keys allowed when the reader gave them.
    pub fn config_error(&self) -> Option<&ConfigError> {
        match &self.inner.problem {
            Problem::Invalid { error, .. } => Some(error),
            Problem::Unknown { detail, .. } => detail.as_ref(),
            _ => None,
        }
    }

    /// Whether a key is given twice in one object, or one field under two spellings.
    pub fn is_duplicate(&self) -> bool {
        matches!(self.inner.problem, Problem::Duplicate { .. })
    }

    /// Whether a key is one the reader refuses (not a field of the document, or a spelling the
    /// system does not read).
    pub fn is_unknown_field(&self) -> bool {
        matches!(self.inner.problem, Problem::Unknown { .. })
    }

    /// Where malformed JSON went wrong, as the parser reports it: 1-based line and column.
    /// `None` for errors in well-formed JSON.
    pub fn location(&self) -> Option<(usize, usize)> {
        match &self.inner.problem {
            Problem::Syntax { line, column, .. } => Some((*line, *column)),
            _ => None,
        }
    }

    /// The 1-based line at fault: where malformed JSON went wrong, or the line of a document
    /// read line by line (for a continued line, the line it starts on). `None` when no line is
    /// named.
    pub fn line(&self) -> Option<usize> {
        match (&self.inner.problem, &self.inner.place) {
            (Problem::Syntax { line, .. }, _) | (_, Place::Line(line)) => Some(*line),
            _ => None,
        }
    }

    /// The position, from 0, of the entry at fault in a list document (a Sentinel rule).
    /// `None` when the problem is not in one entry.
    pub fn entry(&self) -> Option<usize> {
        match &self.inner.place {
            Place::Entry { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// The own name of the entry at fault, as written (a Sentinel rule's resource), when it has
    /// a valid one.
    pub fn entry_name(&self) -> Option<&str> {
        match &self.inner.place {
            Place::Entry {
                name: Some((_, name, _)),
                ..
            } => Some(name),
            _ => None,
        }
    }
}

mod show;

#[cfg(test)]
mod tests;
