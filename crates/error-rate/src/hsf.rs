//! HSF's outlier-instance-removal configuration, read into [`ErrorRateConfig`]s.
//!
//! The module is private; its public items are re-exported from the crate root, so the user-facing
//! description (keys, precedence, validation) lives on [`HsfQosConfig`], where rustdoc shows it.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use tower_outlier_core::{ConfigError, DocumentError};

use crate::config::ErrorRateConfig;

mod document;
mod error;
mod keys;
mod read;

use document::Node;
use error::{qualified, show_json};
use keys::{Block, Key, Raw};

/// The name of the application-level block.
const APPLICATION_BLOCK: &str = "DEFAULT";

/// The prefix of the `-D` parameters this module reads.
const PROPERTY_PREFIX: &str = "hsf.qos.";

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
/// | `ipDimension` | — | [`ip_dimension`](crate::ErrorRateBuilder::ip_dimension) (see below) | `true` / `false` | false |
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
/// [`DocumentError::field`] still returns the key as written. Nothing is silently coerced or
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
/// # By host
///
/// `ipDimension: true` judges each endpoint on every call to its host (its IP), across the
/// services whose layers share hosts (`tower_outlier::OutlierDetectionLayer::share_hosts`), as
/// HSF counts by IP; a layer that shares no hosts judges each endpoint on its own calls as
/// before.
///
/// # Kept but without effect
///
/// `bizExceptionPredicateClassName` names a Java class, which Rust cannot load. The name is kept
/// ([`HsfQosConfig::biz_exception_predicate_class_name`]) so an application can map it to its
/// own classifier ([`tower_outlier_core::Classify`]); which results count as failures is decided
/// by the classifier given to the layer, not by this configuration.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(docsrs, doc(cfg(feature = "hsf")))]
pub struct HsfQosConfig {
    process: Block,
    application: Block,
    services: BTreeMap<String, Block>,
    ignored: Vec<String>,
}

impl HsfQosConfig {
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
    /// use tower_outlier_error_rate::HsfQosConfig;
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
    /// # Ok::<(), tower_outlier_error_rate::DocumentError>(())
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

    /// One line per [ignored key](Self::ignored_keys), for a log or a monitor, shown safely
    /// ([`tower_outlier_core::text::name`]) and with the key it is likely a misspelling of:
    ///
    /// ```
    /// use tower_outlier_error_rate::HsfQosConfig;
    ///
    /// let hsf = HsfQosConfig::from_json(r#"{ "DEFAULT": { "errorRateThreshhold": 0.1 } }"#)?;
    /// assert_eq!(
    ///     hsf.ignored_key_notes(),
    ///     ["unknown key `DEFAULT.errorRateThreshhold` ignored (did you mean `errorRateThreshold`?)"]
    /// );
    /// # Ok::<(), tower_outlier_error_rate::DocumentError>(())
    /// ```
    pub fn ignored_key_notes(&self) -> Vec<String> {
        self.ignored
            .iter()
            .map(|ignored| {
                let shown = tower_outlier_core::text::name(ignored);
                let suggestion = match ignored.strip_prefix("-D") {
                    Some(property) => {
                        tower_outlier_core::text::closest(property, Key::property_names())
                            .map(|known| format!("-D{known}"))
                    }
                    None => ignored.rsplit_once('.').and_then(|(_, key)| {
                        tower_outlier_core::text::closest(key, Key::json_names()).map(String::from)
                    }),
                };
                match suggestion {
                    Some(known) => {
                        format!("unknown key `{shown}` ignored (did you mean `{known}`?)")
                    }
                    None => format!("unknown key `{shown}` ignored"),
                }
            })
            .collect()
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
    /// It is in the service's configuration ([`ErrorRateConfig::ip_dimension`]): a layer that
    /// shares hosts (`tower_outlier::OutlierDetectionLayer::share_hosts`) then judges each
    /// endpoint on every call to its host, across the services sharing it.
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
        if let Some(by_host) = layers().find_map(|b| b.ip_dimension) {
            builder = builder.ip_dimension(by_host);
        }
        builder.build()
    }
}

impl FromStr for HsfQosConfig {
    type Err = DocumentError;

    /// The same as [`HsfQosConfig::from_json`].
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        HsfQosConfig::from_json(text)
    }
}

#[cfg(test)]
mod tests;
