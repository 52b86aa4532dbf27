//! What the Envoy and gRPC readers share: protobuf's JSON grammar for `google.protobuf.Duration`,
//! paths as written in the document, and what went wrong, before it becomes the readers'
//! [`DocumentError`].

use std::time::Duration;

use serde_json::{Map, Value};
pub(crate) use tower_outlier_core::json::written_path as written;
use tower_outlier_core::json::{self, show_path, ParseError, PathSegment};
use tower_outlier_core::text::clip;
use tower_outlier_core::{ConfigError, DocumentError};

/// The largest number of seconds a `google.protobuf.Duration` may hold, either sign: 10 000
/// years, as protobuf's JSON parsers and grpc-go's enforce.
pub(crate) const MAX_DURATION_SECONDS: u64 = 315_576_000_000;

/// Why a string is not a usable duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// Not `[-]<digits>[.<1 to 9 digits>]s`.
    Malformed,
    /// More than [`MAX_DURATION_SECONDS`].
    OutOfRange,
    /// Below zero.
    Negative,
}

/// Reads a duration as protobuf's JSON mapping writes it: an optional `-`, whole seconds in ASCII
/// digits, optionally `.` and one to nine digits of fraction, then `s` (`"10s"`, `"1.5s"`,
/// `"0.000000001s"`). That is the grammar protobuf's own parser accepts; grpc-go's is looser
/// (`".5s"`, `"+5s"`), which protobuf's parser, and so Envoy, refuses.
///
/// `"-0s"` is zero, not negative: protobuf stores it as zero seconds and zero nanoseconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let body = text.strip_suffix('s').ok_or(DurationError::Malformed)?;
    let (negative, body) = match body.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let (whole, fraction) = match body.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (body, None),
    };
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) {
        return Err(DurationError::Malformed);
    }
    let nanos = match fraction {
        None => 0,
        Some(fraction) if digits(fraction) && fraction.len() <= 9 => {
            let scale = 10_u32.pow(9 - fraction.len() as u32);
            // At most nine digits, so the value fits and the scaling stays below 10⁹.
            fraction
                .parse::<u32>()
                .map_err(|_| DurationError::Malformed)?
                * scale
        }
        Some(_) => return Err(DurationError::Malformed),
    };
    // Only digits are left, so the parse can fail only by overflowing, which is out of range too.
    let seconds = whole
        .parse::<u64>()
        .map_err(|_| DurationError::OutOfRange)?;
    if seconds > MAX_DURATION_SECONDS {
        return Err(DurationError::OutOfRange);
    }
    if negative && (seconds > 0 || nanos > 0) {
        return Err(DurationError::Negative);
    }
    Ok(Duration::new(seconds, nanos))
}

/// A JSON value as an error shows it: re-serialised (strings quoted, control characters escaped)
/// and clipped.
pub(crate) fn show_json(value: &Value) -> String {
    clip(value.to_string())
}

/// `path` extended by one key.
pub(crate) fn child(path: &[PathSegment], key: &str) -> Vec<PathSegment> {
    let mut path = path.to_vec();
    path.push(PathSegment::Key(key.to_owned()));
    path
}

/// `path` extended by one array position.
pub(crate) fn element(path: &[PathSegment], index: usize) -> Vec<PathSegment> {
    let mut path = path.to_vec();
    path.push(PathSegment::Index(index));
    path
}

/// What went wrong, as the readers find it: paths kept as segments until the error is made.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Problem {
    /// Not JSON at all; serde_json's message, which ends with the line and column.
    Syntax {
        message: String,
        line: usize,
        column: usize,
    },
    /// JSON, but the top level is not what the reader reads.
    TopLevel {
        shown: String,
        allowed: &'static str,
    },
    /// The key at the end of `path` is given twice in its object, or (with `alias`) is given
    /// under two spellings that name the same field.
    Duplicate {
        path: Vec<PathSegment>,
        field: String,
        alias: Option<String>,
    },
    /// A key the reader refuses, with why and what to write instead.
    Unknown {
        path: Vec<PathSegment>,
        field: String,
        hint: String,
    },
    /// A value of the wrong type or out of range; the error's field is `written(path)`.
    Invalid {
        path: Vec<PathSegment>,
        error: ConfigError,
    },
}

impl Problem {
    /// Malformed JSON, or a key given twice.
    pub(crate) fn from_parse(error: ParseError) -> Self {
        match error {
            ParseError::Syntax(error) => Problem::Syntax {
                message: error.to_string(),
                line: error.line(),
                column: error.column(),
            },
            ParseError::DuplicateKey(duplicate) => {
                let path = child(duplicate.path(), duplicate.key());
                Problem::Duplicate {
                    field: written(&path),
                    path,
                    alias: None,
                }
            }
        }
    }

    /// `value`, at `path`, is not `allowed`.
    pub(crate) fn invalid(
        path: Vec<PathSegment>,
        value: &Value,
        allowed: impl Into<String>,
    ) -> Self {
        Problem::Invalid {
            error: ConfigError::new(written(&path), show_json(value), allowed),
            path,
        }
    }

    pub(crate) fn unknown(path: Vec<PathSegment>, hint: impl Into<String>) -> Self {
        Problem::Unknown {
            field: written(&path),
            path,
            hint: hint.into(),
        }
    }

    /// The key at the end of `path` and `alias`, in the same object, name one field (only
    /// protobuf's JSON, which the Envoy reader reads, has two spellings per field).
    #[cfg(feature = "envoy")]
    pub(crate) fn alias(path: Vec<PathSegment>, alias: &str) -> Self {
        Problem::Duplicate {
            field: written(&path),
            path,
            alias: Some(alias.to_owned()),
        }
    }

    /// The error a reader returns, about `document` (`"Envoy outlier_detection"`).
    pub(crate) fn into_error(self, document: &'static str) -> DocumentError {
        match self {
            Problem::Syntax {
                message,
                line,
                column,
            } => DocumentError::syntax(document, message, line, column),
            Problem::TopLevel { shown, allowed } => {
                DocumentError::top_level(document, shown, allowed)
            }
            Problem::Duplicate { path, field, alias } => {
                let error = DocumentError::duplicate(document, field, show_path(&path));
                match alias {
                    Some(alias) => error.also_as(&alias),
                    None => error,
                }
            }
            Problem::Unknown { path, field, hint } => {
                DocumentError::unknown(document, field, show_path(&path), hint)
            }
            Problem::Invalid { path, error } => {
                DocumentError::invalid(document, error, show_path(&path))
            }
        }
    }
}

/// Parses `text` (a leading byte-order mark skipped) with every object checked for repeated keys.
pub(crate) fn parse(text: &str) -> Result<Value, Problem> {
    // Config centers and editors on Windows sometimes prepend a BOM, which serde_json rejects.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    json::parse(text).map_err(Problem::from_parse)
}

/// The object at `path`, or an error saying it must be `allowed`.
pub(crate) fn object<'v>(
    value: &'v Value,
    path: &[PathSegment],
    allowed: &'static str,
) -> Result<&'v Map<String, Value>, Problem> {
    match value {
        Value::Object(entries) => Ok(entries),
        other if path.is_empty() => Err(Problem::TopLevel {
            shown: show_json(other),
            allowed,
        }),
        other => Err(Problem::invalid(path.to_vec(), other, allowed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_follow_protobufs_grammar() {
        let ok = [
            ("10s", Duration::from_secs(10)),
            ("1.5s", Duration::from_millis(1500)),
            ("0.000000001s", Duration::from_nanos(1)),
            ("0.050s", Duration::from_millis(50)),
            ("-0s", Duration::ZERO),
            ("-0.000s", Duration::ZERO),
            ("007s", Duration::from_secs(7)),
            (
                "315576000000.999999999s",
                Duration::new(MAX_DURATION_SECONDS, 999_999_999),
            ),
        ];
        for (text, expected) in ok {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
        let malformed = [
            "",
            "s",
            "10",
            "10ms",
            "1m",
            " 1s",
            "1s ",
            "+1s",
            ".5s",
            "1.s",
            "1.5.0s",
            "1.0000000001s",
            "--1s",
            "1e3s",
            "١s",
            "0x1s",
            "-s",
            "1 s",
        ];
        for text in malformed {
            assert_eq!(
                parse_duration(text),
                Err(DurationError::Malformed),
                "{text:?}"
            );
        }
        assert_eq!(parse_duration("-1s"), Err(DurationError::Negative));
        assert_eq!(parse_duration("-0.5s"), Err(DurationError::Negative));
        assert_eq!(
            parse_duration("-0.000000001s"),
            Err(DurationError::Negative)
        );
        assert_eq!(
            parse_duration("315576000001s"),
            Err(DurationError::OutOfRange)
        );
        assert_eq!(
            parse_duration("-315576000001s"),
            Err(DurationError::OutOfRange)
        );
        assert_eq!(
            parse_duration("99999999999999999999999s"),
            Err(DurationError::OutOfRange)
        );
    }

    #[test]
    fn written_paths_keep_keys_as_given() {
        let path = element(&child(&[], "loadBalancingConfig"), 0);
        let path = child(&path, "a\nb");
        assert_eq!(written(&path), "loadBalancingConfig[0].a\nb");
        assert_eq!(show_path(&path), r#"loadBalancingConfig[0]."a\nb""#);
        assert_eq!(written(&[]), "");
    }
}
