//! The keys HSF understands, their JSON and `-D` names, their allowed ranges, and how a value is
//! parsed and stored in a block.

use serde_json::Value;

use super::error::show_json;

/// The longest window `timeWindowInSeconds` may set: the window is kept in nanoseconds in a `u64`,
/// so this is `(2⁶⁴ − 1) ns` in whole seconds, about 584 years.
const MAX_WINDOW_SECONDS: u64 = u64::MAX / 1_000_000_000;

/// One block's keys; `None` means "not set here, look in the next layer".
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Block {
    pub(super) error_rate_threshold: Option<f64>,
    pub(super) isolation_time_millis: Option<u64>,
    pub(super) max_isolation_rate: Option<f64>,
    pub(super) max_isolation_time_multiple: Option<u32>,
    pub(super) qos_enabled: Option<bool>,
    pub(super) request_threshold: Option<u64>,
    pub(super) time_window_in_seconds: Option<u64>,
    pub(super) ip_dimension: Option<bool>,
    pub(super) biz_exception_predicate_class_name: Option<String>,
}

impl Block {
    /// Sets `key` from `raw`; `false` when the value is of the wrong type or out of range.
    pub(super) fn apply(&mut self, key: Key, raw: Raw<'_>) -> bool {
        match key {
            Key::ErrorRateThreshold => store(&mut self.error_rate_threshold, raw.ratio()),
            Key::IsolationTime => store(&mut self.isolation_time_millis, raw.integer(u64::MAX)),
            Key::MaxIsolationRate => store(&mut self.max_isolation_rate, raw.ratio()),
            Key::MaxIsolationTimeMultiple => store(
                &mut self.max_isolation_time_multiple,
                raw.integer(u64::from(u32::MAX))
                    .and_then(|n| u32::try_from(n).ok()),
            ),
            Key::QosEnabled => store(&mut self.qos_enabled, raw.flag()),
            Key::RequestThreshold => store(&mut self.request_threshold, raw.integer(u64::MAX)),
            Key::TimeWindowInSeconds => store(
                &mut self.time_window_in_seconds,
                raw.integer(MAX_WINDOW_SECONDS),
            ),
            Key::IpDimension => store(&mut self.ip_dimension, raw.flag()),
            Key::BizExceptionPredicateClassName => store(
                &mut self.biz_exception_predicate_class_name,
                raw.class_name(),
            ),
        }
    }
}

fn store<T>(slot: &mut Option<T>, value: Option<T>) -> bool {
    match value {
        Some(value) => {
            *slot = Some(value);
            true
        }
        None => false,
    }
}

/// The keys HSF understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Key {
    ErrorRateThreshold,
    IsolationTime,
    MaxIsolationRate,
    MaxIsolationTimeMultiple,
    QosEnabled,
    RequestThreshold,
    TimeWindowInSeconds,
    IpDimension,
    BizExceptionPredicateClassName,
}

impl Key {
    const ALL: [Key; 9] = [
        Key::ErrorRateThreshold,
        Key::IsolationTime,
        Key::MaxIsolationRate,
        Key::MaxIsolationTimeMultiple,
        Key::QosEnabled,
        Key::RequestThreshold,
        Key::TimeWindowInSeconds,
        Key::IpDimension,
        Key::BizExceptionPredicateClassName,
    ];

    fn json_name(self) -> &'static str {
        match self {
            Key::ErrorRateThreshold => "errorRateThreshold",
            Key::IsolationTime => "isolationTime",
            Key::MaxIsolationRate => "maxIsolationRate",
            Key::MaxIsolationTimeMultiple => "maxIsolationTimeMultiple",
            Key::QosEnabled => "qosEnabled",
            Key::RequestThreshold => "requestThreshold",
            Key::TimeWindowInSeconds => "timeWindowInSeconds",
            Key::IpDimension => "ipDimension",
            Key::BizExceptionPredicateClassName => "bizExceptionPredicateClassName",
        }
    }

    fn property_name(self) -> Option<&'static str> {
        match self {
            Key::ErrorRateThreshold => Some("hsf.qos.error.rate.threshold"),
            Key::IsolationTime => Some("hsf.qos.isolation.time"),
            Key::MaxIsolationRate => Some("hsf.qos.max.isolation.rate"),
            Key::MaxIsolationTimeMultiple => Some("hsf.qos.max.isolation.time.multiple"),
            Key::QosEnabled => Some("hsf.qos.enable"),
            Key::RequestThreshold => Some("hsf.qos.request.threshold"),
            Key::TimeWindowInSeconds => Some("hsf.qos.time.window.in.seconds"),
            // HSF documents no -D parameter for ipDimension.
            Key::IpDimension => None,
            Key::BizExceptionPredicateClassName => Some("hsf.qos.biz.exception.class.name"),
        }
    }

    pub(super) fn json_names() -> impl Iterator<Item = &'static str> {
        Key::ALL.into_iter().map(Key::json_name)
    }

    pub(super) fn property_names() -> impl Iterator<Item = &'static str> {
        Key::ALL.into_iter().filter_map(Key::property_name)
    }

    pub(super) fn from_json(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|key| key.json_name() == name)
    }

    pub(super) fn from_property(name: &str) -> Option<Key> {
        Key::ALL
            .into_iter()
            .find(|key| key.property_name() == Some(name))
    }

    /// The allowed values in words; JSON wording names the JSON type, since a value of the wrong
    /// type is the likelier mistake there.
    pub(super) fn allowed(self, raw: Raw<'_>) -> String {
        let json = matches!(raw, Raw::Json(_));
        let integer = |max: u64, unit: &str| {
            let kind = if json { "a JSON integer" } else { "an integer" };
            format!("{kind} from 1 to {max}{unit}")
        };
        match self {
            Key::ErrorRateThreshold | Key::MaxIsolationRate if json => {
                "a JSON number in [0, 1]".to_owned()
            }
            Key::ErrorRateThreshold | Key::MaxIsolationRate => "a number in [0, 1]".to_owned(),
            Key::IsolationTime => integer(u64::MAX, ", in milliseconds"),
            Key::MaxIsolationTimeMultiple => integer(u64::from(u32::MAX), ""),
            Key::RequestThreshold => integer(u64::MAX, ""),
            Key::TimeWindowInSeconds => integer(MAX_WINDOW_SECONDS, ", in seconds"),
            Key::QosEnabled | Key::IpDimension if json => {
                "true or false (a JSON boolean, unquoted)".to_owned()
            }
            Key::QosEnabled | Key::IpDimension => "true or false".to_owned(),
            Key::BizExceptionPredicateClassName if json => {
                "a non-empty JSON string (a Java class name)".to_owned()
            }
            Key::BizExceptionPredicateClassName => "a non-empty Java class name".to_owned(),
        }
    }
}

/// A value as read: a JSON value from the config center, or a `-D` string.
#[derive(Clone, Copy, Debug)]
pub(super) enum Raw<'a> {
    Json(&'a Value),
    Text(&'a str),
}

impl Raw<'_> {
    fn ratio(self) -> Option<f64> {
        let value = match self {
            // `as_f64` is `None` for every non-number, which is what rejects `"0.5"`.
            Raw::Json(value) => value.as_f64(),
            Raw::Text(text) => text.trim().parse::<f64>().ok(),
        };
        value.filter(|ratio| ratio.is_finite() && (0.0..=1.0).contains(ratio))
    }

    fn integer(self, max: u64) -> Option<u64> {
        let value = match self {
            // `as_u64` is `None` for negative numbers and for anything written with a fraction or
            // an exponent, so `10.5` and `1e4` are rejected rather than rounded.
            Raw::Json(value) => value.as_u64(),
            Raw::Text(text) => text.trim().parse::<u64>().ok(),
        };
        value.filter(|n| (1..=max).contains(n))
    }

    fn flag(self) -> Option<bool> {
        match self {
            Raw::Json(value) => value.as_bool(),
            // Java's Boolean.parseBoolean ignores case; unlike it, anything but true/false is an
            // error here instead of a silent `false`.
            Raw::Text(text) => {
                let text = text.trim();
                if text.eq_ignore_ascii_case("true") {
                    Some(true)
                } else if text.eq_ignore_ascii_case("false") {
                    Some(false)
                } else {
                    None
                }
            }
        }
    }

    fn class_name(self) -> Option<String> {
        let name = match self {
            Raw::Json(value) => value.as_str()?,
            Raw::Text(text) => text.trim(),
        };
        (!name.trim().is_empty()).then(|| name.to_owned())
    }

    /// The value as it will appear in an error: JSON as written (strings quoted and escaped, so a
    /// quoted number is visibly a string and control characters cannot break the log line).
    pub(super) fn show(self) -> String {
        match self {
            Raw::Json(value) => show_json(value),
            Raw::Text(text) => show_json(&Value::String(text.to_owned())),
        }
    }
}
