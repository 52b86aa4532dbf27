//! The fault-tolerance keys: their names, the builder setting each sets, and how each value is
//! parsed and checked.

use std::time::Duration;

use tower_outlier_core::FailureKind;

use crate::config::{WeightBuilder, WeightConfig};

/// The prefix of every fault-tolerance key, matched without regard to ASCII letter case.
pub(super) const PREFIX: &str = "com.alipay.sofa.rpc.aft.";

/// How many fault-tolerance keys there are.
pub(super) const KEY_COUNT: usize = 9;

/// The fault-tolerance keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Key {
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
    pub(super) const ALL: [Key; KEY_COUNT] = [
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
    pub(super) fn name(self) -> &'static str {
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
    pub(super) fn suffix(self) -> &'static str {
        &self.name()[PREFIX.len()..]
    }

    /// The [`WeightBuilder`] field the key sets, as named in its
    /// [`ConfigError`](tower_outlier_core::ConfigError)s.
    pub(super) fn builder_field(self) -> &'static str {
        match self {
            Key::RegulationEffective => "regulation_effective",
            Key::DegradeEffective => "degrade_effective",
            Key::TimeWindow => "interval",
            Key::LeastWindowCount => "least_window_count",
            Key::ExceptionRateMultiple => "exception_rate_multiple",
            Key::DegradeRate => "degrade_rate",
            Key::RecoverRate => "recover_rate",
            Key::LeastWeight => "least_weight",
            Key::MaxIpCount => "max_degraded",
        }
    }

    /// Sets the key from its value as written; `None` when the value is malformed or out of range.
    pub(super) fn apply(self, builder: WeightBuilder, value: &str) -> Option<WeightBuilder> {
        Some(match self {
            Key::RegulationEffective => builder.regulation_effective(flag(value)?),
            Key::DegradeEffective => builder.degrade_effective(flag(value)?),
            Key::TimeWindow => builder.window(Duration::from_secs(integer(value, 1)?)),
            Key::LeastWindowCount => builder.min_calls(integer(value, 1)?),
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
    pub(super) fn allowed(self) -> String {
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

/// What counts as an exception, which the properties cannot say: timeouts and overload ("server
/// busy"), as in SOFARPC.
pub(super) const SOFARPC_EXCEPTIONS: &[FailureKind] =
    &[FailureKind::Timeout, FailureKind::Overload];

/// The weight every endpoint starts at. The properties cannot set it, so it is the builder's
/// default (SOFARPC's default provider weight, 100).
pub(super) fn original_weight() -> f64 {
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
pub(super) enum Class {
    /// Outside [`PREFIX`]: not read, listed.
    Outside,
    /// Inside [`PREFIX`] but not a known key: an error.
    Unknown,
    Known(Key),
}

/// Where `key` stands: outside the prefix, a known key (in any letter case), or unknown.
pub(super) fn classify(key: &str) -> Class {
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
