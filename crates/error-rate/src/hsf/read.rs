//! Reading HSF's configuration: the configuration center's JSON and the `-D` parameters.

use tower_outlier_core::text::name;
use tower_outlier_core::ConfigError;

use super::*;

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
    /// use tower_outlier_error_rate::HsfQosConfig;
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
    /// assert_eq!(error.field(), Some("DEFAULT.errorRateThreshold"));
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
    /// assert_eq!(error.field(), Some("DEFAULT"));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid HSF QoS configuration: block `DEFAULT` is given more than once"
    /// );
    /// # Ok::<(), tower_outlier_error_rate::DocumentError>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Self, DocumentError> {
        // Config centers and editors on Windows sometimes prepend a BOM, which serde_json rejects.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let document = document::parse(text).map_err(error::syntax)?;
        let blocks = match document {
            Node::Object {
                duplicate: Some(block_name),
                ..
            } => return Err(error::duplicate(&block_name, None)),
            Node::Object { entries, .. } => entries,
            Node::Other(other) => return Err(error::top_level(&other)),
        };
        let mut config = HsfQosConfig::default();
        for (block_name, block) in &blocks {
            let entries = match block {
                Node::Object {
                    duplicate: Some(key_name),
                    ..
                } => return Err(error::duplicate(block_name, Some(key_name))),
                Node::Object { entries, .. } => entries,
                Node::Other(other) => {
                    return Err(error::invalid(
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
                            return Err(error::invalid(
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
    /// use tower_outlier_error_rate::HsfQosConfig;
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
    /// assert_eq!(error.field(), Some("-Dhsf.qos.isolation.time"));
    /// # Ok::<(), tower_outlier_error_rate::DocumentError>(())
    /// ```
    pub fn with_process_properties<'a>(
        mut self,
        properties: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, DocumentError> {
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
                        let shown = tower_outlier_core::text::name(&shown_name);
                        return Err(error::invalid(
                            ConfigError::new(shown_name, raw.show(), key.allowed(raw)),
                            shown,
                        ));
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
}
