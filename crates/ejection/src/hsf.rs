//! HSF's outlier-instance-removal configuration, read into [`ErrorRateConfig`]s.
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (keys, precedence, validation) lives on [`HsfQosConfig`], where rustdoc shows it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;
use tower_outlier_core::text::{clip, name};
use tower_outlier_core::ConfigError;

use crate::config::ErrorRateConfig;

mod document;

use document::Node;

/// The name of the application-level block.
const APPLICATION_BLOCK: &str = "DEFAULT";

/// The prefix of the `-D` parameters this module reads.
const PROPERTY_PREFIX: &str = "hsf.qos.";

/// The longest window `timeWindowInSeconds` may set: the window is kept in nanoseconds in a `u64`,
/// so this is `(2⁶⁴ − 1) ns` in whole seconds, about 584 years.
const MAX_WINDOW_SECONDS: u64 = u64::MAX / 1_000_000_000;

/// HSF's outlier-instance-removal configuration: the `"DEFAULT"` and per-service blocks of the
/// configuration-center JSON, over the process-level `-D` parameters.
///
/// HSF keeps this configuration in the EDAS configuration center (Data ID `<App ID>.QOSCONFIG`,
/// group `HSF`) as a JSON object of blocks: the block `"DEFAULT"` is the application level, every
/// other key (`"service:version"`, e.g. `"com.foo.Service:1.0.0"`) is one service. HSF also reads
/// the same settings from `-D` JVM parameters. Read the JSON with [`from_json`](Self::from_json)
/// (or [`str::parse`]), add `-D` parameters with
/// [`with_process_properties`](Self::with_process_properties), and resolve a validated
/// [`ErrorRateConfig`] with [`application`](Self::application) or [`service`](Self::service).
/// `HsfQosConfig::default()` holds no block at all and resolves to HSF's built-in defaults, which
/// are disabled.
///
/// | JSON key | `-D` parameter | builder setting | allowed | HSF default |
/// |---|---|---|---|---|
/// | `qosEnabled` | `hsf.qos.enable` | [`enabled`](crate::ErrorRateBuilder::enabled) | `true` / `false` | **false** |
/// | `timeWindowInSeconds` | `hsf.qos.time.window.in.seconds` | [`window`](crate::ErrorRateBuilder::window) | integer 1 to 18 446 744 073 (s, about 584 years) | 10 s |
/// | `requestThreshold` | `hsf.qos.request.threshold` | [`min_calls`](crate::ErrorRateBuilder::min_calls) | integer ≥ 1 | 10 |
/// | `errorRateThreshold` | `hsf.qos.error.rate.threshold` | [`error_rate_threshold`](crate::ErrorRateBuilder::error_rate_threshold) | `[0, 1]` | 0.5 |
/// | `maxIsolationRate` | `hsf.qos.max.isolation.rate` | [`max_ejection_ratio`](crate::ErrorRateBuilder::max_ejection_ratio) | `[0, 1]` | 0.2 |
/// | `isolationTime` | `hsf.qos.isolation.time` | [`recovery_unit`](crate::ErrorRateBuilder::recovery_unit) | integer ≥ 1 (ms) | 60 000 ms |
/// | `maxIsolationTimeMultiple` | `hsf.qos.max.isolation.time.multiple` | [`max_recovery_multiple`](crate::ErrorRateBuilder::max_recovery_multiple) | integer 1 to 2³² − 1 | 60 |
/// | `bizExceptionPredicateClassName` | `hsf.qos.biz.exception.class.name` | kept, no effect (see below) | non-empty string | — |
/// | `ipDimension` | — | kept, no effect (see below) | `true` / `false` | — |
///
/// # Precedence
///
/// Each key is resolved on its own, from the first layer that sets it:
///
/// 1. the service's block (for [`HsfQosConfig::service`]),
/// 2. the `"DEFAULT"` block,
/// 3. the `-D` parameters given to [`HsfQosConfig::with_process_properties`],
/// 4. HSF's built-in defaults ([`ErrorRateConfig::hsf`]).
///
/// So a service block that sets only `errorRateThreshold` still takes every other key from
/// `"DEFAULT"`, and a `"DEFAULT"` block that omits `isolationTime` still gets it from `-D` or from
/// the built-in 60 s. This is HSF's documented precedence ("service-level configuration takes
/// precedence over application-level", "the configuration center takes precedence over -D
/// parameters"), applied key by key.
///
/// The one built-in default that differs from [`ErrorRateConfig::hsf`] is `qosEnabled`: HSF ships
/// with it `false`, so when no layer sets `qosEnabled` (or `-Dhsf.qos.enable`) the resolved
/// configuration is disabled, exactly as HSF would be. Write `"qosEnabled": true` to turn it on.
/// The ejection budget keeps HSF's rule: when `floor(n × maxIsolationRate)` is below one, one
/// instance may still be removed ([`BudgetFloor::One`](tower_outlier_core::BudgetFloor::One)).
///
/// # Values
///
/// Validation happens when the text is read, for every block, whether or not it is ever resolved.
/// An error names the key as written and qualified by its block (`DEFAULT.errorRateThreshold`,
/// `com.foo.Service:1.0.0.isolationTime`, `-Dhsf.qos.isolation.time`), the value as given (JSON
/// re-serialised, so `1e30` shows as `1e+30`) and the allowed range. In the message, names and
/// values longer than 80 characters are clipped, and names holding control characters (a newline,
/// a terminal escape) are quoted and escaped, so that no input can flood or forge a log line;
/// [`HsfConfigError::key`] still returns the key as written. Nothing is silently coerced or
/// defaulted:
///
/// * Numbers must be JSON numbers. A quoted number such as `"0.5"` is rejected with a type error,
///   although HSF's Java reader may coerce it: a config center entry whose numbers are strings was
///   usually written by hand or by a different tool, and reporting it costs one edit where a
///   silent coercion would hide the next, less lucky, mistake.
/// * Integer keys must be written as integers: `10.5`, `10.0` and `1e4` are rejected rather than
///   rounded or truncated.
/// * Booleans must be JSON `true` / `false`; `"true"` is rejected. `null` is rejected for every
///   key (omit the key to inherit it).
/// * A block that is not an object, a top level that is not an object, and malformed JSON are
///   errors; the last carries serde_json's message with its line and column.
/// * A block given twice at the top level, or a key given twice in one block, is an error naming
///   it (see [`from_json`](Self::from_json)).
///
/// Unknown keys (including misspelt ones — keys are case-sensitive) are ignored so that
/// configurations written for newer HSF versions still load, but they are listed by
/// [`HsfQosConfig::ignored_keys`] so they can be logged. Block names are not checked against the
/// `service:version` format: any key other than `"DEFAULT"` is a service, looked up by exact
/// string.
///
/// # Kept but without effect
///
/// * `ipDimension` is accepted and kept ([`HsfQosConfig::ip_dimension`]) but does nothing: this
///   crate always judges each endpoint (each address) on its own outcomes.
/// * `bizExceptionPredicateClassName` names a Java class, which Rust cannot load. The name is kept
///   ([`HsfQosConfig::biz_exception_predicate_class_name`]) so an application can map it to its
///   own classifier ([`tower_outlier_core::Classify`]); which results count as failures is decided
///   by the classifier given to the layer, not by this configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HsfQosConfig {
    process: Block,
    application: Block,
    services: BTreeMap<String, Block>,
    ignored: Vec<String>,
}

impl HsfQosConfig {
    /// Reads and validates the configuration-center JSON.
    ///
    /// The top level must be an object; its key `"DEFAULT"` is the application level and every
    /// other key a service (`"service:version"`). Every block is validated here; an invalid value
    /// is an error naming the qualified key (`DEFAULT.errorRateThreshold`), the value and the
    /// allowed range. A leading byte-order mark is skipped.
    ///
    /// Names must be unique where this reader interprets them: a block name given twice at the
    /// top level, or a key given twice within one block, is an error naming it (`DEFAULT`,
    /// `DEFAULT.qosEnabled`), even when both values are equal. Plain JSON parsers keep the last
    /// value silently, which for a repeated block would drop every key of the first one. Inside
    /// the values themselves (say, an unknown key holding an object) repeats are not checked.
    /// Malformed JSON is reported before a duplicate; otherwise errors come in the order of the
    /// blocks' names: a duplicate block first, then, block by block, a duplicate key and then
    /// the values.
    ///
    /// The application-level example from HSF's documentation:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier_ejection::HsfQosConfig;
    ///
    /// let hsf = HsfQosConfig::from_json(
    ///     r#"{ "DEFAULT": { "errorRateThreshold":0.5, "isolationTime":60000, "maxIsolationRate":0.2, "maxIsolationTimeMultiple":15, "qosEnabled":true, "requestThreshold":20, "timeWindowInSeconds":10, "ipDimension":true } }"#,
    /// )?;
    /// let config = hsf.application()?;
    /// assert!(config.enabled());
    /// assert_eq!(config.error_rate_threshold(), 0.5);
    /// assert_eq!(config.recovery().unit(), Duration::from_millis(60_000));
    /// assert_eq!(config.budget().max_ratio(), 0.2);
    /// assert_eq!(config.recovery().max_multiple(), 15);
    /// assert_eq!(config.min_calls(), 20);
    /// assert_eq!(config.window(), Duration::from_secs(10));
    /// assert_eq!(hsf.ip_dimension("DEFAULT"), Some(true));
    ///
    /// // Invalid values are errors that name the key, the value and the allowed range.
    /// let error = HsfQosConfig::from_json(r#"{ "DEFAULT": { "errorRateThreshold": 1.5 } }"#)
    ///     .unwrap_err();
    /// assert_eq!(error.key(), Some("DEFAULT.errorRateThreshold"));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid HSF QoS configuration: `DEFAULT.errorRateThreshold` = 1.5 \
    ///      (allowed: a JSON number in [0, 1])"
    /// );
    ///
    /// // So is a block given twice (a plain JSON parser would drop the first one).
    /// let error = HsfQosConfig::from_json(
    ///     r#"{ "DEFAULT": { "qosEnabled": true }, "DEFAULT": { "timeWindowInSeconds": 5 } }"#,
    /// )
    /// .unwrap_err();
    /// assert_eq!(error.key(), Some("DEFAULT"));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid HSF QoS configuration: block `DEFAULT` is given more than once"
    /// );
    /// # Ok::<(), tower_outlier_ejection::HsfConfigError>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Self, HsfConfigError> {
        // Config centers and editors on Windows sometimes prepend a BOM, which serde_json rejects.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let document = document::parse(text).map_err(HsfConfigError::syntax)?;
        let blocks = match document {
            Node::Object {
                duplicate: Some(block_name),
                ..
            } => return Err(HsfConfigError::duplicate(&block_name, None)),
            Node::Object { entries, .. } => entries,
            Node::Other(other) => return Err(HsfConfigError::top_level(&other)),
        };
        let mut config = HsfQosConfig::default();
        for (block_name, block) in &blocks {
            let entries = match block {
                Node::Object {
                    duplicate: Some(key_name),
                    ..
                } => return Err(HsfConfigError::duplicate(block_name, Some(key_name))),
                Node::Object { entries, .. } => entries,
                Node::Other(other) => {
                    return Err(HsfConfigError::invalid(
                        ConfigError::new(
                            block_name.as_str(),
                            show_json(other),
                            "a JSON object of QoS keys",
                        ),
                        name(block_name),
                    ))
                }
            };
            let target = if block_name == APPLICATION_BLOCK {
                &mut config.application
            } else {
                config.services.entry(block_name.clone()).or_default()
            };
            for (key_name, value) in entries {
                let raw = Raw::Json(value);
                match Key::from_json(key_name) {
                    Some(key) => {
                        if !target.apply(key, raw) {
                            return Err(HsfConfigError::invalid(
                                ConfigError::new(key_name.as_str(), raw.show(), key.allowed(raw))
                                    .within(block_name),
                                qualified(block_name, key_name),
                            ));
                        }
                    }
                    None => config.ignored.push(format!("{block_name}.{key_name}")),
                }
            }
        }
        Ok(config)
    }

    /// Adds HSF's process-level `-D` parameters, as `(name, value)` string pairs, as the layer
    /// below `"DEFAULT"`: service > `"DEFAULT"` > `-D` > built-in, key by key.
    ///
    /// Names may be given with or without the `-D` (`hsf.qos.enable` or `-Dhsf.qos.enable`).
    /// Names outside `hsf.qos.` are skipped silently, so the whole set of system properties can be
    /// passed; unknown `hsf.qos.*` names are skipped and listed by
    /// [`ignored_keys`](Self::ignored_keys) as `-Dname`. Values are parsed as HSF's Java side
    /// would, with surrounding whitespace trimmed: `true` / `false` in any letter case for
    /// `hsf.qos.enable`, decimal numbers for the rest. An invalid value is an error naming
    /// `-Dname`, the value and the allowed range. As on a JVM command line, a name given twice
    /// keeps its last value, and so does a name given again in a later call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier_ejection::HsfQosConfig;
    ///
    /// let properties = [
    ///     ("hsf.qos.enable", "true"),
    ///     ("hsf.qos.isolation.time", "30000"),
    ///     ("hsf.qos.request.threshold", "50"),
    ///     ("java.version", "17"), // not an `hsf.qos.` parameter: skipped
    /// ];
    ///
    /// // Only -D parameters:
    /// let config = HsfQosConfig::default()
    ///     .with_process_properties(properties)?
    ///     .application()?;
    /// assert!(config.enabled());
    /// assert_eq!(config.recovery().unit(), Duration::from_secs(30));
    /// assert_eq!(config.min_calls(), 50);
    ///
    /// // HSF's documented application-level example overrides them where it sets the same key.
    /// let config = HsfQosConfig::from_json(
    ///     r#"{ "DEFAULT": { "errorRateThreshold":0.5, "isolationTime":60000, "maxIsolationRate":0.2, "maxIsolationTimeMultiple":15, "qosEnabled":true, "requestThreshold":20, "timeWindowInSeconds":10, "ipDimension":true } }"#,
    /// )?
    /// .with_process_properties(properties)?
    /// .application()?;
    /// assert_eq!(config.recovery().unit(), Duration::from_secs(60));
    /// assert_eq!(config.min_calls(), 20);
    ///
    /// let error = HsfQosConfig::default()
    ///     .with_process_properties([("hsf.qos.isolation.time", "0")])
    ///     .unwrap_err();
    /// assert_eq!(error.key(), Some("-Dhsf.qos.isolation.time"));
    /// # Ok::<(), tower_outlier_ejection::HsfConfigError>(())
    /// ```
    pub fn with_process_properties<'a>(
        mut self,
        properties: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, HsfConfigError> {
        for (name, value) in properties {
            let name = name.trim();
            let name = name.strip_prefix("-D").unwrap_or(name);
            if !name.starts_with(PROPERTY_PREFIX) {
                continue;
            }
            let shown_name = format!("-D{name}");
            let raw = Raw::Text(value);
            match Key::from_property(name) {
                Some(key) => {
                    if !self.process.apply(key, raw) {
                        return Err(
                            ConfigError::new(shown_name, raw.show(), key.allowed(raw)).into()
                        );
                    }
                }
                None => {
                    if !self.ignored.contains(&shown_name) {
                        self.ignored.push(shown_name);
                    }
                }
            }
        }
        Ok(self)
    }

    /// The application-level configuration: `"DEFAULT"` over the `-D` parameters over HSF's
    /// built-in defaults, key by key. Disabled unless some layer sets `qosEnabled`
    /// (`hsf.qos.enable`) to `true`.
    ///
    /// The values were validated when they were read, so this fails only if they cannot be
    /// combined into a configuration, which no combination of in-range values does today.
    pub fn application(&self) -> Result<ErrorRateConfig, ConfigError> {
        self.resolve(None)
    }

    /// The configuration of one service (`"service:version"`, matched exactly): its block over
    /// `"DEFAULT"` over the `-D` parameters over HSF's built-in defaults, key by key. A service
    /// without a block of its own gets the [application-level](Self::application) configuration.
    ///
    /// The service-level example from HSF's documentation:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier_ejection::HsfQosConfig;
    ///
    /// let hsf = HsfQosConfig::from_json(
    ///     r#"{ "DEFAULT": { "errorRateThreshold":0.5, "isolationTime":60000, "maxIsolationRate":0.2, "maxIsolationTimeMultiple":15, "qosEnabled":true, "requestThreshold":20, "timeWindowInSeconds":10 }, "service:version": { "errorRateThreshold":0.5, "isolationTime":60000, "maxIsolationRate":0.2, "maxIsolationTimeMultiple":15, "qosEnabled":true, "requestThreshold":20, "timeWindowInSeconds":10 } }"#,
    /// )?;
    /// assert_eq!(hsf.services().collect::<Vec<_>>(), ["service:version"]);
    /// let config = hsf.service("service:version")?;
    /// assert!(config.enabled());
    /// assert_eq!(config.error_rate_threshold(), 0.5);
    /// assert_eq!(config.window(), Duration::from_secs(10));
    ///
    /// // A service block wins key by key; the keys it omits come from "DEFAULT".
    /// let hsf = HsfQosConfig::from_json(
    ///     r#"{ "DEFAULT": { "qosEnabled": true, "requestThreshold": 20 },
    ///          "com.foo.Service:1.0.0": { "errorRateThreshold": 0.3 } }"#,
    /// )?;
    /// let config = hsf.service("com.foo.Service:1.0.0")?;
    /// assert_eq!(config.error_rate_threshold(), 0.3);
    /// assert_eq!(config.min_calls(), 20);
    /// assert!(config.enabled());
    /// assert_eq!(hsf.service("com.bar.Other:1.0.0")?, hsf.application()?);
    /// # Ok::<(), tower_outlier_ejection::HsfConfigError>(())
    /// ```
    pub fn service(&self, service_and_version: &str) -> Result<ErrorRateConfig, ConfigError> {
        self.resolve(self.services.get(service_and_version))
    }

    /// The services that have a block of their own, in sorted order.
    pub fn services(&self) -> impl Iterator<Item = &str> + '_ {
        self.services.keys().map(String::as_str)
    }

    /// The keys that were read but not understood, qualified as in errors
    /// (`DEFAULT.someNewKey`, `-Dhsf.qos.some.new.key`), in the order they were read (blocks in
    /// sorted order, then `-D` parameters). They had no effect; log them, since a misspelt key
    /// lands here too. They are as written, neither clipped nor escaped: to log names from an
    /// untrusted source, show each through [`tower_outlier_core::text::name`].
    pub fn ignored_keys(&self) -> &[String] {
        &self.ignored
    }

    /// The `bizExceptionPredicateClassName` (`-Dhsf.qos.biz.exception.class.name`) in effect for
    /// a service, resolved like the other keys; pass `"DEFAULT"` (or any service without a block)
    /// for the application level.
    ///
    /// Only the name is kept: Rust cannot load a Java class, so which results are failures is
    /// decided by the classifier given to the layer. An application can use this name to pick
    /// its classifier.
    pub fn biz_exception_predicate_class_name(&self, service_and_version: &str) -> Option<&str> {
        self.layers(self.services.get(service_and_version))
            .find_map(|block| block.biz_exception_predicate_class_name.as_deref())
    }

    /// The `ipDimension` in effect for a service, resolved like the other keys; pass `"DEFAULT"`
    /// (or any service without a block) for the application level.
    ///
    /// It is kept only so it can be inspected: it has no effect, since this crate always judges
    /// each endpoint (each address) on its own outcomes.
    pub fn ip_dimension(&self, service_and_version: &str) -> Option<bool> {
        self.layers(self.services.get(service_and_version))
            .find_map(|block| block.ip_dimension)
    }

    /// The layers a key is looked up in, highest precedence first.
    fn layers<'s>(&'s self, service: Option<&'s Block>) -> impl Iterator<Item = &'s Block> + 's {
        service
            .into_iter()
            .chain([&self.application, &self.process])
    }

    fn resolve(&self, service: Option<&Block>) -> Result<ErrorRateConfig, ConfigError> {
        let layers = || self.layers(service);
        // HSF's own default for qosEnabled is false, unlike the `hsf()` preset.
        let enabled = layers().find_map(|b| b.qos_enabled).unwrap_or(false);
        let mut builder = ErrorRateConfig::hsf().enabled(enabled);
        if let Some(ratio) = layers().find_map(|b| b.error_rate_threshold) {
            builder = builder.error_rate_threshold(ratio);
        }
        if let Some(ratio) = layers().find_map(|b| b.max_isolation_rate) {
            builder = builder.max_ejection_ratio(ratio);
        }
        if let Some(millis) = layers().find_map(|b| b.isolation_time_millis) {
            builder = builder.recovery_unit(Duration::from_millis(millis));
        }
        if let Some(multiple) = layers().find_map(|b| b.max_isolation_time_multiple) {
            builder = builder.max_recovery_multiple(multiple);
        }
        if let Some(calls) = layers().find_map(|b| b.request_threshold) {
            builder = builder.min_calls(calls);
        }
        if let Some(seconds) = layers().find_map(|b| b.time_window_in_seconds) {
            builder = builder.window(Duration::from_secs(seconds));
        }
        builder.build()
    }
}

impl FromStr for HsfQosConfig {
    type Err = HsfConfigError;

    /// The same as [`HsfQosConfig::from_json`].
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        HsfQosConfig::from_json(text)
    }
}

/// One block's keys; `None` means "not set here, look in the next layer".
#[derive(Clone, Debug, Default, PartialEq)]
struct Block {
    error_rate_threshold: Option<f64>,
    isolation_time_millis: Option<u64>,
    max_isolation_rate: Option<f64>,
    max_isolation_time_multiple: Option<u32>,
    qos_enabled: Option<bool>,
    request_threshold: Option<u64>,
    time_window_in_seconds: Option<u64>,
    ip_dimension: Option<bool>,
    biz_exception_predicate_class_name: Option<String>,
}

impl Block {
    /// Sets `key` from `raw`; `false` when the value is of the wrong type or out of range.
    fn apply(&mut self, key: Key, raw: Raw<'_>) -> bool {
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
enum Key {
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

    fn from_json(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|key| key.json_name() == name)
    }

    fn from_property(name: &str) -> Option<Key> {
        Key::ALL
            .into_iter()
            .find(|key| key.property_name() == Some(name))
    }

    /// The allowed values in words; JSON wording names the JSON type, since a value of the wrong
    /// type is the likelier mistake there.
    fn allowed(self, raw: Raw<'_>) -> String {
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
enum Raw<'a> {
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
    fn show(self) -> String {
        match self {
            Raw::Json(value) => show_json(value),
            Raw::Text(text) => show_json(&Value::String(text.to_owned())),
        }
    }
}

/// A JSON value as an error shows it: re-serialised (so strings are quoted and their control
/// characters escaped) and clipped.
fn show_json(value: &Value) -> String {
    clip(value.to_string())
}

/// A key qualified by its block, as an error message shows it: each part clipped and, when it
/// holds control characters, quoted and escaped.
fn qualified(block_name: &str, key_name: &str) -> String {
    format!("{}.{}", name(block_name), name(key_name))
}

/// Why HSF configuration could not be read: malformed JSON, a top level that is not an object, a
/// block or key given twice, or a value of the wrong type or out of range (which carries a
/// [`ConfigError`] naming the qualified key).
///
/// The accessors return names as written; the message ([`Display`](fmt::Display)) shows them
/// clipped to 80 characters and, when they hold control characters, quoted and escaped.
///
/// ```
/// use tower_outlier_ejection::HsfQosConfig;
///
/// let error = HsfQosConfig::from_json(r#"{ "svc:1.0": { "qosEnabled": "true" } }"#).unwrap_err();
/// assert_eq!(error.key(), Some("svc:1.0.qosEnabled"));
/// let detail = error.config_error().unwrap();
/// assert_eq!(detail.value(), "\"true\"");
/// assert_eq!(detail.allowed(), "true or false (a JSON boolean, unquoted)");
///
/// let error = HsfQosConfig::from_json("{ \"DEFAULT\": {\n \"qosEnabled\" true } }").unwrap_err();
/// assert_eq!(error.key(), None);
/// assert_eq!(error.location(), Some((2, 15)));
///
/// let error =
///     HsfQosConfig::from_json(r#"{ "svc:1.0": { "qosEnabled": true, "qosEnabled": false } }"#)
///         .unwrap_err();
/// assert!(error.is_duplicate());
/// assert_eq!(error.key(), Some("svc:1.0.qosEnabled"));
/// assert_eq!(error.config_error(), None);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct HsfConfigError {
    kind: ErrorKind,
}

#[derive(Clone, Debug, PartialEq)]
enum ErrorKind {
    /// Not JSON at all; serde_json's message, which ends with the line and column.
    Syntax {
        message: String,
        line: usize,
        column: usize,
    },
    /// JSON, but not an object.
    TopLevel { shown: String },
    /// A block given twice at the top level (`key` is the block's name), or a key given twice in
    /// one block (`key` is qualified by the block). `shown` is `key` made safe for a message.
    Duplicate {
        key: String,
        shown: String,
        block: bool,
    },
    /// A block or a value that is not what HSF expects; `shown_key` is the error's field made
    /// safe for a message.
    Invalid {
        error: ConfigError,
        shown_key: String,
    },
}

impl HsfConfigError {
    fn syntax(error: serde_json::Error) -> Self {
        HsfConfigError {
            kind: ErrorKind::Syntax {
                message: error.to_string(),
                line: error.line(),
                column: error.column(),
            },
        }
    }

    fn top_level(value: &Value) -> Self {
        HsfConfigError {
            kind: ErrorKind::TopLevel {
                shown: show_json(value),
            },
        }
    }

    /// `block_name` given twice, or, with `key_name`, that key given twice in `block_name`.
    fn duplicate(block_name: &str, key_name: Option<&str>) -> Self {
        let (key, shown) = match key_name {
            None => (block_name.to_owned(), name(block_name)),
            Some(key_name) => (
                format!("{block_name}.{key_name}"),
                qualified(block_name, key_name),
            ),
        };
        HsfConfigError {
            kind: ErrorKind::Duplicate {
                key,
                shown,
                block: key_name.is_none(),
            },
        }
    }

    /// `error`, whose field the message shows as `shown_key`.
    fn invalid(error: ConfigError, shown_key: String) -> Self {
        HsfConfigError {
            kind: ErrorKind::Invalid { error, shown_key },
        }
    }

    /// The offending key as written, qualified by its block (`DEFAULT.errorRateThreshold`,
    /// `svc:1.0.isolationTime`), or the block's name when the block itself is not an object or is
    /// given twice, or the `-D` parameter (`-Dhsf.qos.isolation.time`). `None` when the text is
    /// not JSON or its top level is not an object.
    pub fn key(&self) -> Option<&str> {
        match &self.kind {
            ErrorKind::Invalid { error, .. } => Some(error.field()),
            ErrorKind::Duplicate { key, .. } => Some(key),
            ErrorKind::Syntax { .. } | ErrorKind::TopLevel { .. } => None,
        }
    }

    /// The key, value and allowed range, when one value (or block) is at fault.
    pub fn config_error(&self) -> Option<&ConfigError> {
        match &self.kind {
            ErrorKind::Invalid { error, .. } => Some(error),
            ErrorKind::Syntax { .. } | ErrorKind::TopLevel { .. } | ErrorKind::Duplicate { .. } => {
                None
            }
        }
    }

    /// Whether the error is a block or a key given more than once; [`key`](Self::key) names it.
    pub fn is_duplicate(&self) -> bool {
        matches!(self.kind, ErrorKind::Duplicate { .. })
    }

    /// Where malformed JSON went wrong, as serde_json reports it: 1-based line and column.
    /// `None` for errors in well-formed JSON.
    pub fn location(&self) -> Option<(usize, usize)> {
        match &self.kind {
            ErrorKind::Syntax { line, column, .. } => Some((*line, *column)),
            ErrorKind::TopLevel { .. }
            | ErrorKind::Duplicate { .. }
            | ErrorKind::Invalid { .. } => None,
        }
    }
}

impl From<ConfigError> for HsfConfigError {
    /// Wraps a configuration error, so that `?` can mix [`HsfQosConfig::from_json`] with
    /// [`HsfQosConfig::application`] and [`HsfQosConfig::service`].
    fn from(error: ConfigError) -> Self {
        let shown_key = name(error.field());
        HsfConfigError::invalid(error, shown_key)
    }
}

impl fmt::Display for HsfConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Syntax { message, .. } => {
                write!(f, "HSF QoS configuration is not valid JSON: {message}")
            }
            ErrorKind::TopLevel { shown } => write!(
                f,
                "invalid HSF QoS configuration: the top level is {shown} (allowed: a JSON object \
                 of blocks keyed \"DEFAULT\" or \"service:version\")"
            ),
            ErrorKind::Duplicate { shown, block, .. } => write!(
                f,
                "invalid HSF QoS configuration: {} `{shown}` is given more than once",
                if *block { "block" } else { "key" }
            ),
            ErrorKind::Invalid { error, shown_key } => write!(
                f,
                "invalid HSF QoS configuration: `{shown_key}` = {} (allowed: {})",
                error.value(),
                error.allowed()
            ),
        }
    }
}

// The detail is part of the message, so there is no separate source to report.
impl std::error::Error for HsfConfigError {}

#[cfg(test)]
mod tests;
