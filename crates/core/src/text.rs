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
