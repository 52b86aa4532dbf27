//! SOFARPC's fault-tolerance properties (`com.alipay.sofa.rpc.aft.*`), read into a
//! [`WeightBuilder`] and a validated [`WeightConfig`].
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (syntax, keys, validation) lives on [`SofaProperties`], where rustdoc shows it.
//!
//! * [`keys`]: the fault-tolerance keys and how their values are parsed and checked;
//! * [`syntax`]: the `.properties` syntax, from text to `(key, value)` pairs;
//! * [`error`]: the reader's errors, [`DocumentError`]s.

mod error;
mod keys;
mod syntax;

use std::str::FromStr;

use tower_outlier_core::DocumentError;

use crate::config::{WeightBuilder, WeightConfig};

use self::keys::{classify, Class, KEY_COUNT, SOFARPC_EXCEPTIONS};
use self::syntax::{logical_lines, pairs};

// The tests read these through `use super::*`.
#[cfg(test)]
use self::keys::{Key, PREFIX};
#[cfg(test)]
use std::time::Duration;
#[cfg(test)]
use tower_outlier_core::ConfigError;

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
/// | `time.window` | [`interval`](WeightBuilder::interval) | integer ≥ 1, in seconds | 10 s |
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
///   ([`DocumentError::is_unknown_field`]): under this prefix an unknown key is almost always a
///   typo (`time.windows`), and ignoring it would silently keep a default.
/// * Keys are matched without regard to ASCII letter case. SOFARPC's documentation writes its
///   example with a capital `Com.alipay…`; the intent is unambiguous, so such a key is read, and
///   listed with its canonical spelling by [`normalised_keys`](Self::normalised_keys) so that the
///   caller can warn: a Java reader, whose keys are case-sensitive, would not see it.
///
/// # Values
///
/// Every value is validated while the text is read, and the first invalid one is an error
/// (a [`DocumentError`]) naming the key as written, the value as written, its line and the
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
#[cfg_attr(docsrs, doc(cfg(feature = "sofa")))]
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
    /// The example from SOFARPC's fault-tolerance documentation, with its misspelt `ture`
    /// corrected to `true`, written on one line as the documentation writes it (one pair per line
    /// reads the same):
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
    /// assert_eq!(config.interval(), Duration::from_secs(20));
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
    /// // As SOFARPC's documentation writes it, `degrade.effective=ture` is an error, not a silent
    /// // `false`.
    /// let error = SofaProperties::from_properties(
    ///     "Com.alipay.sofa.rpc.aft.time.window=20 \
    ///      Com.alipay.sofa.rpc.aft.degrade.effective=ture \
    ///      Com.alipay.sofa.rpc.aft.regulation.effective=true",
    /// )
    /// .unwrap_err();
    /// assert_eq!(error.field(), Some("Com.alipay.sofa.rpc.aft.degrade.effective"));
    /// assert_eq!(error.config_error().unwrap().value(), "ture");
    /// assert_eq!(error.line(), Some(1));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid SOFARPC fault-tolerance properties on line 1: \
    ///      `Com.alipay.sofa.rpc.aft.degrade.effective` = \"ture\" \
    ///      (allowed: true or false, in any letter case)"
    /// );
    /// # Ok::<(), tower_outlier_weight::DocumentError>(())
    /// ```
    pub fn from_properties(text: &str) -> Result<Self, DocumentError> {
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
                        return Err(error::unknown_key(key_name, value, line));
                    }
                    Class::Known(key) => key,
                };
                builder = key
                    .apply(builder, value)
                    .ok_or_else(|| error::invalid(key_name, value, key.allowed(), Some(line)))?;
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
            .map_err(|error| error::from_build(&error, &written))?;
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
    type Err = DocumentError;

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

#[cfg(test)]
mod tests;
