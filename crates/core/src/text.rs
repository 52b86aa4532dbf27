//! How configuration readers show what they read in errors: clipped, and with control characters
//! escaped, so a 100 KB key or a key holding a newline or a terminal escape cannot flood or forge
//! log lines.

/// The most characters of a value or name an error shows; longer ones end in `…`.
pub const MAX_SHOWN_CHARS: usize = 80;

/// `shown`, cut to [`MAX_SHOWN_CHARS`] characters plus `…` when longer.
///
/// ```
/// use tower_outlier_core::text::{clip, MAX_SHOWN_CHARS};
///
/// assert_eq!(clip("short".to_string()), "short");
/// assert_eq!(clip("x".repeat(1000)).chars().count(), MAX_SHOWN_CHARS + 1);
/// ```
pub fn clip(shown: String) -> String {
    if shown.chars().count() <= MAX_SHOWN_CHARS {
        shown
    } else {
        let mut clipped: String = shown.chars().take(MAX_SHOWN_CHARS).collect();
        clipped.push('…');
        clipped
    }
}

/// A name read from configuration (a key, a block, a property), as an error shows it: unchanged
/// when it is printable, otherwise quoted with every character that could break or forge a log
/// line escaped (control characters, line and paragraph separators, bidirectional overrides);
/// clipped either way.
///
/// ```
/// use tower_outlier_core::text::name;
///
/// assert_eq!(name("timeWindowInSeconds"), "timeWindowInSeconds");
/// assert_eq!(name("evil\nkey"), r#""evil\nkey""#);
/// assert_eq!(name("\u{1b}[31mred"), r#""\u{1b}[31mred""#);
/// assert_eq!(name("a\u{2028}b\u{202e}c"), r#""a\u{2028}b\u{202e}c""#);
/// ```
pub fn name(raw: &str) -> String {
    let plain = |c: char| matches!(c, '"' | '\'' | '\\') || c.escape_debug().count() == 1;
    if !raw.chars().all(plain) {
        clip(format!("{raw:?}"))
    } else {
        clip(raw.to_string())
    }
}

/// The name of `known` closest to `unknown` when it is close enough to be a misspelling of it
/// (at most one edit per four characters, and at least one: `errorRateThreshhold` →
/// `errorRateThreshold`), for a "did you mean" note; `None` when nothing is that close.
///
/// ```
/// use tower_outlier_core::text::closest;
///
/// let known = ["errorRateThreshold", "qosEnabled", "timeWindowInSeconds"];
/// assert_eq!(closest("errorRateThreshhold", known), Some("errorRateThreshold"));
/// assert_eq!(closest("qosenabled", known), Some("qosEnabled"));
/// assert_eq!(closest("somethingElse", known), None);
/// ```
pub fn closest<'a>(unknown: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    // Names are short (tens of characters); longer input is no misspelling of one.
    if unknown.chars().count() > 128 {
        return None;
    }
    let allowed = (unknown.chars().count() / 4).max(1);
    known
        .into_iter()
        .map(|name| (edit_distance(unknown, name), name))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// Levenshtein distance, ASCII letters compared without case (a wrong case is one edit less
/// than a wrong letter would be: none).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().map(|c| c.to_ascii_lowercase()).collect();
    let b: Vec<char> = b.chars().map(|c| c.to_ascii_lowercase()).collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        current[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}
