//! SOFARPC's fault-tolerance properties (`com.alipay.sofa.rpc.aft.*`), read into a
//! [`WeightBuilder`] and a validated [`WeightConfig`].
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (syntax, keys, validation) lives on [`SofaProperties`], where rustdoc shows it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tower_outlier_core::text::{clip, name};
use tower_outlier_core::{ConfigError, FailureKind};

use crate::config::{WeightBuilder, WeightConfig};

/// The prefix of every fault-tolerance key, matched without regard to ASCII letter case.
const PREFIX: &str = "com.alipay.sofa.rpc.aft.";

/// How many fault-tolerance keys there are.
const KEY_COUNT: usize = 9;

/// SOFARPC's fault-tolerance properties, as written in a SOFABoot `application.properties`,
/// read into a weight-degradation configuration.
///
/// Read the text with [`from_properties`](Self::from_properties) (or [`str::parse`]), then take
/// the validated [`config`](Self::config), or the [`builder`](Self::builder) to adjust what the
/// properties cannot express (see [Not read](#not-read)). Reading starts from
/// [`WeightConfig::builder`]'s defaults, which are SOFARPC's own, **both switches off**: a key
/// that is not written keeps its default, so a text without `regulation.effective=true` yields a
/// policy that does nothing, as in SOFARPC.
///
/// | key: `com.alipay.sofa.rpc.aft.` + | builder setting | allowed | default |
/// |---|---|---|---|
/// | `regulation.effective` | [`regulation_effective`](WeightBuilder::regulation_effective) | `true` / `false` | **false** |
/// | `degrade.effective` | [`degrade_effective`](WeightBuilder::degrade_effective) | `true` / `false` | **false** |
/// | `time.window` | [`time_window`](WeightBuilder::time_window) | integer ≥ 1, in seconds | 10 s |
/// | `least.window.count` | [`least_window_count`](WeightBuilder::least_window_count) | integer ≥ 1 | 10 |
/// | `least.window.exception.rate.multiple` | [`exception_rate_multiple`](WeightBuilder::exception_rate_multiple) | finite number > 0 | 6 |
/// | `weight.degrade.rate` | [`degrade_rate`](WeightBuilder::degrade_rate) | number in (0, 1] | 0.05 |
/// | `weight.recover.rate` | [`recover_rate`](WeightBuilder::recover_rate) | finite number > 1 | 2 |
/// | `degrade.least.weight` | [`least_weight`](WeightBuilder::least_weight) | number in (0, 100] (the original weight) | 1 |
/// | `degrade.max.ip.count` | [`max_degraded`](WeightBuilder::max_degraded) | integer ≥ 0 | 2 |
///
/// # Syntax
///
/// The text is read as a Java `.properties` file, with one extension for the single-line form of
/// SOFARPC's documentation example:
///
/// * Lines end at `\n`, `\r\n` or `\r`; a leading byte-order mark is skipped. Blank lines and lines
///   whose first non-blank character is `#` or `!` are skipped. A line that ends in an odd number
///   of backslashes continues on the next line (the backslash is dropped, and so is the next
///   line's leading whitespace), as in Java.
/// * A pair is `key=value`, `key: value`, `key = value` or `key value`: the key ends at the first
///   `=`, `:` or whitespace (a character after a backslash does not end it), then whitespace, at
///   most one `=` or `:`, and whitespace are skipped. The value runs to the end of the line, with
///   trailing whitespace removed.
/// * **Several pairs on one line.** When a line's first key is under `com.alipay.sofa.rpc.aft.`
///   (in any letter case, see below), its value contains whitespace and *every* whitespace-
///   separated word after its first one contains `=` after at least one character, the line holds
///   several pairs: the value is its first word, and each later word is a pair of its own, read
///   as above. This is the form of the example
///   `Com.alipay.sofa.rpc.aft.time.window=20 Com.alipay.sofa.rpc.aft.least.window.count=30 …`.
///   Otherwise the value is the whole rest of the line, as Java reads it; since no value in this
///   key set contains whitespace, an inline comment (`time.window=20 # seconds`) or trailing
///   prose is then reported as an invalid value rather than dropped. A line whose first key is
///   another setting is always one pair, so
///   `logging.pattern.console=%d com.alipay.sofa.rpc.aft.degrade.effective=true` sets nothing
///   here.
/// * Escapes (`\n`, `\uXXXX`, `\=`) are not interpreted: keys are kept as written and a
///   backslash in a fault-tolerance value makes it invalid. None of these keys or values needs
///   one.
/// * When a key is given more than once, the last value wins, as in Java. Keys that differ only
///   in letter case (see below) are the same key.
///
/// # Keys
///
/// * Keys outside the `com.alipay.sofa.rpc.aft.` prefix are not read: an `application.properties`
///   holds many other settings. They are listed, as written and in the order read, by
///   [`ignored_keys`](Self::ignored_keys). This includes SOFABoot's relaxed-binding spellings
///   (`com.alipay.sofa.rpc.aft-time-window`, `com.alipay.sofa.rpc.aftTimeWindow`) and SOFABoot 4's
///   `sofa.boot.rpc.*` keys: only the dotted keys above are read.
/// * A key inside the prefix that is not one of the nine above is an **error** naming it
///   ([`PropertiesError::is_unknown_key`]): under this prefix an unknown key is almost always a
///   typo (`time.windows`), and ignoring it would silently keep a default.
/// * Keys are matched without regard to ASCII letter case. SOFARPC's documentation writes its
///   example with a capital `Com.alipay…`; the intent is unambiguous, so such a key is read, and
///   listed with its canonical spelling by [`normalised_keys`](Self::normalised_keys) so that the
///   caller can warn: a Java reader, whose keys are case-sensitive, would not see it.
///
/// # Values
///
/// Every value is validated while the text is read, and the first invalid one is an error
/// ([`PropertiesError`]) naming the key as written, the value as written, its line and the
/// allowed range. Nothing is silently coerced or defaulted:
///
/// * The switches accept exactly `true` or `false`, in any letter case. Anything else — the
///   example's own `ture`, `yes`, `1`, an empty value — is an error, where SOFABoot's
///   `Boolean.valueOf` would silently read `false`.
/// * Integer keys must be written as decimal integers: `20.5`, `20.0`, `1e3` and `-1` are
///   rejected rather than rounded. `time.window` is in seconds.
/// * The other keys are decimal numbers (Rust's `f64` syntax, such as `0.5`, `.5`, `6`, `1e-2`);
///   `NaN` and infinities are outside every range. SOFARPC declares `degrade.least.weight` an
///   integer; fractional least weights are accepted here since the weights are `f64`.
/// * An empty value (`com.alipay.sofa.rpc.aft.time.window=`) is an error, although SOFABoot
///   treats a blank value as "not set": omit or comment out the key to keep its default.
///
/// # Not read
///
/// SOFARPC's properties do not say which failures count, nor the original weight. As in SOFARPC,
/// only timeouts and overload ("server busy") count as exceptions, and every endpoint starts at
/// weight 100, SOFARPC's default provider weight. Adjust them on [`builder`](Self::builder), for
/// example to count transport errors too:
///
/// ```
/// use tower_outlier_core::FailureKind;
/// use tower_outlier_weight::SofaProperties;
///
/// let properties = SofaProperties::from_properties(
///     "com.alipay.sofa.rpc.aft.regulation.effective=true\n\
///      com.alipay.sofa.rpc.aft.degrade.effective=true\n",
/// )?;
/// let config = properties
///     .builder()
///     .exceptions(&[FailureKind::Timeout, FailureKind::Overload, FailureKind::Transport])
///     .build()?;
/// assert!(config.regulation_effective() && config.degrade_effective());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct SofaProperties {
    builder: WeightBuilder,
    config: WeightConfig,
    ignored: Vec<String>,
    normalised: Vec<(String, &'static str)>,
}

impl SofaProperties {
    /// Reads and validates SOFARPC fault-tolerance properties (see [`SofaProperties`] for the
    /// syntax, the keys and the allowed values).
    ///
    /// The seed's example, with its misspelt `ture` corrected to `true`, written on one line as
    /// in the seed (one pair per line reads the same):
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier_weight::SofaProperties;
    ///
    /// let properties = SofaProperties::from_properties(
    ///     "Com.alipay.sofa.rpc.aft.time.window=20 \
    ///      Com.alipay.sofa.rpc.aft.least.window.count=30 \
    ///      Com.alipay.sofa.rpc.aft.least.window.exception.rate.multiple=6 \
    ///      Com.alipay.sofa.rpc.aft.weight.degrade.rate=0.5 \
    ///      Com.alipay.sofa.rpc.aft.weight.recover.rate=1.2 \
    ///      Com.alipay.sofa.rpc.aft.degrade.effective=true \
    ///      Com.alipay.sofa.rpc.aft.degrade.least.weight=1 \
    ///      Com.alipay.sofa.rpc.aft.degrade.max.ip.count=2 \
    ///      Com.alipay.sofa.rpc.aft.regulation.effective=true",
    /// )?;
    /// let config = properties.config();
    /// assert!(config.regulation_effective());
    /// assert!(config.degrade_effective());
    /// assert_eq!(config.time_window(), Duration::from_secs(20));
    /// assert_eq!(config.least_window_count(), 30);
    /// assert_eq!(config.exception_rate_multiple(), 6.0);
    /// assert_eq!(config.degrade_rate(), 0.5);
    /// assert_eq!(config.recover_rate(), 1.2);
    /// assert_eq!(config.least_weight(), 1.0);
    /// assert_eq!(config.max_degraded(), 2);
    ///
    /// // The capitalised `Com.` is read, and reported so that it can be fixed.
    /// assert_eq!(properties.normalised_keys().len(), 9);
    /// assert_eq!(
    ///     properties.normalised_keys()[0],
    ///     (
    ///         "Com.alipay.sofa.rpc.aft.time.window".to_owned(),
    ///         "com.alipay.sofa.rpc.aft.time.window"
    ///     )
    /// );
    ///
    /// // As the seed writes it, `degrade.effective=ture` is an error, not a silent `false`.
    /// let error = SofaProperties::from_properties(
    ///     "Com.alipay.sofa.rpc.aft.time.window=20 \
    ///      Com.alipay.sofa.rpc.aft.degrade.effective=ture \
    ///      Com.alipay.sofa.rpc.aft.regulation.effective=true",
    /// )
    /// .unwrap_err();
    /// assert_eq!(error.key(), "Com.alipay.sofa.rpc.aft.degrade.effective");
    /// assert_eq!(error.value(), "ture");
    /// assert_eq!(error.line(), Some(1));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid SOFARPC fault-tolerance property on line 1: \
    ///      `Com.alipay.sofa.rpc.aft.degrade.effective` = \"ture\" \
    ///      (allowed: true or false, in any letter case)"
    /// );
    /// # Ok::<(), tower_outlier_weight::PropertiesError>(())
    /// ```
    pub fn from_properties(text: &str) -> Result<Self, PropertiesError> {
        // Editors on Windows sometimes prepend a byte-order mark.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        // SOFARPC's semantics for what the properties do not say: only timeouts and "server busy"
        // count as exceptions.
        let mut builder = WeightConfig::builder().exceptions(SOFARPC_EXCEPTIONS);
        let mut ignored = Vec::new();
        let mut normalised = Vec::new();
        let mut written: [Option<Written>; KEY_COUNT] = Default::default();
        for (line, logical) in logical_lines(text) {
            for (key_name, value) in pairs(&logical) {
                let key = match classify(key_name) {
                    Class::Outside => {
                        ignored.push(key_name.to_owned());
                        continue;
                    }
                    Class::Unknown => {
                        return Err(PropertiesError::unknown_key(key_name, value, line));
                    }
                    Class::Known(key) => key,
                };
                builder = key.apply(builder, value).ok_or_else(|| {
                    PropertiesError::invalid(key_name, value, key.allowed(), Some(line))
                })?;
                if key_name != key.name() {
                    normalised.push((key_name.to_owned(), key.name()));
                }
                written[key as usize] = Some(Written {
                    key: key_name.to_owned(),
                    value: value.to_owned(),
                    line,
                });
            }
        }
        // Every value was checked above; this only catches a range the builder checks and this
        // reader does not, reported under the property key rather than the builder's field.
        let config = builder
            .clone()
            .build()
            .map_err(|error| PropertiesError::from_build(&error, &written))?;
        Ok(SofaProperties {
            builder,
            config,
            ignored,
            normalised,
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> WeightConfig {
        self.config.clone()
    }

    /// A builder holding every value read, to adjust what the properties do not set
    /// ([`exceptions`](WeightBuilder::exceptions),
    /// [`original_weight`](WeightBuilder::original_weight)) before building. A change made here
    /// is validated by [`WeightBuilder::build`], whose errors name the builder's fields.
    pub fn builder(&self) -> WeightBuilder {
        self.builder.clone()
    }

    /// The keys outside `com.alipay.sofa.rpc.aft.`, as written and in the order read (a key given
    /// twice is listed twice). They had no effect; log them if the text is meant to hold only
    /// fault-tolerance settings, through [`tower_outlier_core::text::name`], which clips and
    /// escapes them as this reader's errors do.
    pub fn ignored_keys(&self) -> &[String] {
        &self.ignored
    }

    /// The fault-tolerance keys that were read although written in another letter case, as
    /// `(as written, canonical)` pairs in the order read — e.g.
    /// `("Com.alipay.sofa.rpc.aft.time.window", "com.alipay.sofa.rpc.aft.time.window")`. SOFARPC
    /// itself would not see these keys; log them so that they are fixed (the written ones through
    /// [`tower_outlier_core::text::name`]).
    pub fn normalised_keys(&self) -> &[(String, &'static str)] {
        &self.normalised
    }
}

impl FromStr for SofaProperties {
    type Err = PropertiesError;

    /// The same as [`SofaProperties::from_properties`].
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        SofaProperties::from_properties(text)
    }
}

/// Where a key's effective value came from, to name it if the builder rejects it.
#[derive(Clone, Debug, PartialEq)]
struct Written {
    key: String,
    value: String,
    line: usize,
}

/// The fault-tolerance keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    RegulationEffective,
    DegradeEffective,
    TimeWindow,
    LeastWindowCount,
    ExceptionRateMultiple,
    DegradeRate,
    RecoverRate,
    LeastWeight,
    MaxIpCount,
}

impl Key {
    const ALL: [Key; KEY_COUNT] = [
        Key::RegulationEffective,
        Key::DegradeEffective,
        Key::TimeWindow,
        Key::LeastWindowCount,
        Key::ExceptionRateMultiple,
        Key::DegradeRate,
        Key::RecoverRate,
        Key::LeastWeight,
        Key::MaxIpCount,
    ];

    /// The canonical key, as SOFARPC spells it.
    fn name(self) -> &'static str {
        match self {
            Key::RegulationEffective => "com.alipay.sofa.rpc.aft.regulation.effective",
            Key::DegradeEffective => "com.alipay.sofa.rpc.aft.degrade.effective",
            Key::TimeWindow => "com.alipay.sofa.rpc.aft.time.window",
            Key::LeastWindowCount => "com.alipay.sofa.rpc.aft.least.window.count",
            Key::ExceptionRateMultiple => {
                "com.alipay.sofa.rpc.aft.least.window.exception.rate.multiple"
            }
            Key::DegradeRate => "com.alipay.sofa.rpc.aft.weight.degrade.rate",
            Key::RecoverRate => "com.alipay.sofa.rpc.aft.weight.recover.rate",
            Key::LeastWeight => "com.alipay.sofa.rpc.aft.degrade.least.weight",
            Key::MaxIpCount => "com.alipay.sofa.rpc.aft.degrade.max.ip.count",
        }
    }

    /// The part after [`PREFIX`].
    fn suffix(self) -> &'static str {
        &self.name()[PREFIX.len()..]
    }

    /// The [`WeightBuilder`] field the key sets, as named in its [`ConfigError`]s.
    fn builder_field(self) -> &'static str {
        match self {
            Key::RegulationEffective => "regulation_effective",
            Key::DegradeEffective => "degrade_effective",
            Key::TimeWindow => "time_window",
            Key::LeastWindowCount => "least_window_count",
            Key::ExceptionRateMultiple => "exception_rate_multiple",
            Key::DegradeRate => "degrade_rate",
            Key::RecoverRate => "recover_rate",
            Key::LeastWeight => "least_weight",
            Key::MaxIpCount => "max_degraded",
        }
    }

    /// Sets the key from its value as written; `None` when the value is malformed or out of range.
    fn apply(self, builder: WeightBuilder, value: &str) -> Option<WeightBuilder> {
        Some(match self {
            Key::RegulationEffective => builder.regulation_effective(flag(value)?),
            Key::DegradeEffective => builder.degrade_effective(flag(value)?),
            Key::TimeWindow => builder.time_window(Duration::from_secs(integer(value, 1)?)),
            Key::LeastWindowCount => builder.least_window_count(integer(value, 1)?),
            Key::ExceptionRateMultiple => {
                builder.exception_rate_multiple(number(value, |m| m.is_finite() && m > 0.0)?)
            }
            Key::DegradeRate => builder.degrade_rate(number(value, |r| r > 0.0 && r <= 1.0)?),
            Key::RecoverRate => builder.recover_rate(number(value, |r| r.is_finite() && r > 1.0)?),
            Key::LeastWeight => {
                let original = original_weight();
                builder.least_weight(number(value, |w| w > 0.0 && w <= original)?)
            }
            Key::MaxIpCount => builder.max_degraded(usize::try_from(integer(value, 0)?).ok()?),
        })
    }

    /// The allowed values, in words.
    fn allowed(self) -> String {
        match self {
            Key::RegulationEffective | Key::DegradeEffective => {
                "true or false, in any letter case".to_owned()
            }
            Key::TimeWindow => format!("an integer from 1 to {}, in seconds", u64::MAX),
            Key::LeastWindowCount => format!("an integer from 1 to {}", u64::MAX),
            Key::ExceptionRateMultiple => "a finite number greater than 0".to_owned(),
            Key::DegradeRate => "a number in (0, 1]".to_owned(),
            Key::RecoverRate => "a finite number greater than 1".to_owned(),
            Key::LeastWeight => {
                format!(
                    "a number in (0, {}] (the original weight)",
                    original_weight()
                )
            }
            Key::MaxIpCount => format!("an integer from 0 to {}", usize::MAX),
        }
    }
}

const SOFARPC_EXCEPTIONS: &[FailureKind] = &[FailureKind::Timeout, FailureKind::Overload];

/// The weight every endpoint starts at. The properties cannot set it, so it is the builder's
/// default (SOFARPC's default provider weight, 100).
fn original_weight() -> f64 {
    // The defaults always build; the fallback only keeps this free of a panic path.
    WeightConfig::builder()
        .build()
        .map_or(100.0, |config| config.original_weight())
}

/// `true` / `false` in any letter case, as Java's `Boolean.valueOf` reads them; unlike it,
/// anything else is rejected instead of read as `false`.
fn flag(value: &str) -> Option<bool> {
    if value.eq_ignore_ascii_case("true") {
        Some(true)
    } else if value.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// A decimal integer of at least `min`; fractions, exponents and signs other than `+` are
/// rejected.
fn integer(value: &str, min: u64) -> Option<u64> {
    value.parse::<u64>().ok().filter(|n| *n >= min)
}

/// A decimal number accepted by `in_range` (which rejects NaN by comparing).
fn number(value: &str, in_range: impl Fn(f64) -> bool) -> Option<f64> {
    value.parse::<f64>().ok().filter(|n| in_range(*n))
}

/// What a key is to this reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Outside [`PREFIX`]: not read, listed.
    Outside,
    /// Inside [`PREFIX`] but not a known key: an error.
    Unknown,
    Known(Key),
}

fn classify(key: &str) -> Class {
    match key.get(..PREFIX.len()) {
        Some(head) if head.eq_ignore_ascii_case(PREFIX) => {
            let suffix = &key[PREFIX.len()..];
            Key::ALL
                .into_iter()
                .find(|known| known.suffix().eq_ignore_ascii_case(suffix))
                .map_or(Class::Unknown, Class::Known)
        }
        _ => Class::Outside,
    }
}

/// The logical lines worth reading, with the 1-based number of the line each starts on: comments
/// and blank lines skipped, leading whitespace removed, continuation lines joined.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
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
/// [`PREFIX`] and every word of its value after the first is itself a `key=value` pair.
fn pairs(line: &str) -> Vec<(&str, &str)> {
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

/// Why SOFARPC fault-tolerance properties could not be read: a value that is malformed or out of
/// range, or an unknown key under `com.alipay.sofa.rpc.aft.`.
///
/// The error names the key and the value as written, the line they are on and what is allowed.
/// The accessors return the key and the value whole; the message shows them as
/// [`tower_outlier_core::text`] does, cut to
/// [`MAX_SHOWN_CHARS`](tower_outlier_core::text::MAX_SHOWN_CHARS) characters and with control
/// characters escaped (the value always quoted, the key quoted when it holds one), so that a huge
/// or hostile key cannot flood or forge a log line:
///
/// ```
/// use tower_outlier_weight::SofaProperties;
///
/// let error = SofaProperties::from_properties(
///     "# fault tolerance\n\
///      com.alipay.sofa.rpc.aft.regulation.effective=true\n\
///      com.alipay.sofa.rpc.aft.weight.degrade.rate=-0.5\n",
/// )
/// .unwrap_err();
/// assert_eq!(error.key(), "com.alipay.sofa.rpc.aft.weight.degrade.rate");
/// assert_eq!(error.value(), "-0.5");
/// assert_eq!(error.line(), Some(3));
/// assert_eq!(error.allowed(), "a number in (0, 1]");
/// assert!(!error.is_unknown_key());
///
/// let error = SofaProperties::from_properties("com.alipay.sofa.rpc.aft.time.windows=20")
///     .unwrap_err();
/// assert!(error.is_unknown_key());
/// assert_eq!(error.key(), "com.alipay.sofa.rpc.aft.time.windows");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct PropertiesError {
    detail: ConfigError,
    line: Option<usize>,
    unknown_key: bool,
}

impl PropertiesError {
    fn invalid(key: &str, value: &str, allowed: String, line: Option<usize>) -> Self {
        PropertiesError {
            detail: ConfigError::new(key, value, allowed),
            line,
            unknown_key: false,
        }
    }

    fn unknown_key(key: &str, value: &str, line: usize) -> Self {
        let known: Vec<&str> = Key::ALL.into_iter().map(Key::suffix).collect();
        let allowed = format!("{PREFIX} followed by one of {}", known.join(", "));
        PropertiesError {
            detail: ConfigError::new(key, value, allowed),
            line: Some(line),
            unknown_key: true,
        }
    }

    /// A [`WeightBuilder::build`] error, named by the property key that set the field.
    fn from_build(error: &ConfigError, written: &[Option<Written>; KEY_COUNT]) -> Self {
        let key = Key::ALL
            .into_iter()
            .find(|key| key.builder_field() == error.field());
        match key.and_then(|key| written[key as usize].as_ref()) {
            Some(written) => PropertiesError::invalid(
                &written.key,
                &written.value,
                error.allowed().to_owned(),
                Some(written.line),
            ),
            // A default the builder rejects: no line to point at.
            None => PropertiesError::invalid(
                key.map_or(error.field(), |key| key.name()),
                error.value(),
                error.allowed().to_owned(),
                None,
            ),
        }
    }

    /// The offending key, as written (`Com.alipay.sofa.rpc.aft.degrade.effective`).
    pub fn key(&self) -> &str {
        self.detail.field()
    }

    /// The offending value, as written (after the surrounding whitespace is removed); empty when
    /// the key has no value.
    pub fn value(&self) -> &str {
        self.detail.value()
    }

    /// The 1-based line the key is on (for a continued line, the line it starts on). `None` only
    /// when no line of the text is at fault.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// What is allowed, in words: the value's range, or for an unknown key the known keys.
    pub fn allowed(&self) -> &str {
        self.detail.allowed()
    }

    /// Whether the key itself is at fault: under `com.alipay.sofa.rpc.aft.` but not a
    /// fault-tolerance key (most likely misspelt).
    pub fn is_unknown_key(&self) -> bool {
        self.unknown_key
    }
}

impl fmt::Display for PropertiesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unknown_key {
            f.write_str("unknown SOFARPC fault-tolerance key")?;
        } else {
            f.write_str("invalid SOFARPC fault-tolerance property")?;
        }
        if let Some(line) = self.line {
            write!(f, " on line {line}")?;
        }
        write!(f, ": `{}`", name(self.key()))?;
        if !self.unknown_key {
            write!(f, " = {}", clip(format!("{:?}", self.value())))?;
        }
        write!(f, " (allowed: {})", self.allowed())
    }
}

// The detail is part of the message, so there is no separate source to report.
impl std::error::Error for PropertiesError {}

#[cfg(test)]
mod tests;
