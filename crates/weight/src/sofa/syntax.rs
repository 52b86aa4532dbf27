//! The `.properties` syntax: physical and logical lines, comments, continuations and
//! `key=value` pairs, several to a line when SOFARPC's single-line form is used.

use super::keys::{classify, Class};

/// The logical lines worth reading, with the 1-based number of the line each starts on: comments
/// and blank lines skipped, leading whitespace removed, continuation lines joined.
pub(super) fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let physical = physical_lines(text);
    let mut logical = Vec::new();
    let mut next = 0;
    while next < physical.len() {
        let number = next + 1;
        let first = physical[next].trim_start();
        next += 1;
        // Only a line's first physical line can be a comment, as in Java.
        if first.is_empty() || first.starts_with('#') || first.starts_with('!') {
            continue;
        }
        let mut line = String::new();
        let mut piece = first;
        while continues(piece) && next < physical.len() {
            line.push_str(&piece[..piece.len() - 1]);
            piece = physical[next].trim_start();
            next += 1;
        }
        line.push_str(piece);
        logical.push((number, line));
    }
    logical
}

/// The text split at `\n`, `\r\n` and `\r`; a final terminator does not start another line.
fn physical_lines(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut lines = Vec::new();
    let mut start = 0;
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'\n' => {
                lines.push(&text[start..at]);
                at += 1;
                start = at;
            }
            b'\r' => {
                lines.push(&text[start..at]);
                at += if bytes.get(at + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                start = at;
            }
            _ => at += 1,
        }
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

/// Whether a line ends in an odd number of backslashes, so continues on the next line.
fn continues(line: &str) -> bool {
    line.bytes().rev().take_while(|b| *b == b'\\').count() % 2 == 1
}

/// The `(key, value)` pairs of a logical line: one, or several when the line's own key is under
/// [`PREFIX`](super::keys::PREFIX) and every word of its value after the first is itself a
/// `key=value` pair.
pub(super) fn pairs(line: &str) -> Vec<(&str, &str)> {
    let (key, value) = split_pair(line);
    if classify(key) == Class::Outside {
        // Another setting's value may hold `key=value` words (a log pattern, a URL, a command
        // line); they are that value, not settings of their own.
        return vec![(key, value)];
    }
    let mut words = value.split_whitespace();
    let first = words.next().unwrap_or("");
    let rest: Vec<&str> = words.collect();
    let all_pairs = rest
        .iter()
        .all(|word| word.find('=').is_some_and(|at| at > 0));
    if rest.is_empty() || !all_pairs {
        return vec![(key, value)];
    }
    let mut pairs = Vec::with_capacity(rest.len() + 1);
    pairs.push((key, first));
    pairs.extend(rest.into_iter().map(split_pair));
    pairs
}

/// Splits a line Java's way: the key ends at the first `=`, `:` or whitespace not preceded by a
/// backslash; then whitespace, at most one `=` or `:`, and whitespace are skipped. Trailing
/// whitespace is removed from the value.
fn split_pair(line: &str) -> (&str, &str) {
    let mut key_end = line.len();
    let mut escaped = false;
    for (at, c) in line.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '=' || c == ':' || c.is_whitespace() {
            key_end = at;
            break;
        }
    }
    let rest = line[key_end..].trim_start();
    let rest = rest.strip_prefix(['=', ':']).map_or(rest, str::trim_start);
    (&line[..key_end], rest.trim_end())
}
