//! The configuration documents a running layer can be given, one [`Dialect`] per system this
//! library follows: HSF's configuration-center JSON, Sentinel's degrade rules, SOFARPC's
//! properties, Envoy's `outlier_detection` and gRPC's `outlier_detection_experimental`. Each
//! replaces the layer's policy of its kind through [`RulesHandle::apply`](crate::RulesHandle::apply),
//! directly or from a source ([`RulesHandle::follow`](crate::RulesHandle::follow),
//! `watch_file` with the `file-source` feature, `watch_etcd` with the `etcd` feature).
//!
#![cfg_attr(feature = "hsf", doc = "```")]
#![cfg_attr(not(feature = "hsf"), doc = "```ignore")]
//! use tower_outlier::dialect::Hsf;
//! use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
//!
//! let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
//! let rules = layer.rules();
//! let hsf = Hsf::service("com.example.Orders:1.0.0");
//! rules.apply(&hsf, r#"{"DEFAULT": {"qosEnabled": true, "errorRateThreshold": 0.2}}"#)?;
//! // An invalid document is refused with its error; the rules in force stay.
//! assert!(rules.apply(&hsf, r#"{"DEFAULT": {"errorRateThreshold": 7}}"#).is_err());
//! assert_eq!(rules.version(), 1);
//! assert!(layer.monitor().snapshot().rules_error.unwrap().contains("errorRateThreshold"));
//! # Ok::<(), tower::BoxError>(())
//! ```

pub use crate::reconfigure::{Dialect, ReconfigureError};

#[cfg(any(
    feature = "hsf",
    feature = "sentinel",
    feature = "sofa",
    feature = "envoy",
    feature = "grpc-config"
))]
use {
    std::sync::Arc,
    tower_outlier_core::{BoxError, OutlierPolicy},
};

#[cfg(feature = "file-source")]
mod file;
#[cfg(feature = "file-source")]
#[cfg_attr(docsrs, doc(cfg(feature = "file-source")))]
pub use file::watch_file;

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use etcd::{etcd_connect_options, watch_etcd};
/// The `etcd_client` [`watch_etcd`] is built on, for its `ConnectOptions` (TLS, user, timeouts).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use etcd_client;

/// Adds the notes of a document's ignored keys to `notes`, or, for a strict dialect, refuses the
/// document with them.
#[cfg(any(feature = "hsf", feature = "sentinel"))]
fn keep_or_refuse(
    strict: bool,
    ignored: Vec<String>,
    notes: &mut Vec<String>,
) -> Result<(), BoxError> {
    if strict && !ignored.is_empty() {
        return Err(format!("refused as strict: {}", ignored.join("; ")).into());
    }
    notes.extend(ignored);
    Ok(())
}

/// HSF's configuration-center JSON for one service (`"service:version"`; its block wins key by
/// key over `DEFAULT`): replaces the layer's error-rate policy.
#[cfg(feature = "hsf")]
#[cfg_attr(docsrs, doc(cfg(feature = "hsf")))]
///
/// HSF ignores keys it does not know, and so does this dialect, noting each (with the key a
/// misspelt one likely meant) in the log and [`Snapshot::rules_notes`](crate::Snapshot), with a
/// note too when the document leaves detection off for the service (`qosEnabled` is off unless a
/// block sets it); [`strict`](Hsf::strict) refuses a document with an unknown key.
#[derive(Clone, Debug)]
pub struct Hsf {
    service: String,
    strict: bool,
}

#[cfg(feature = "hsf")]
impl Hsf {
    /// The dialect for `service_and_version`'s rules.
    pub fn service(service_and_version: impl Into<String>) -> Self {
        Hsf {
            service: service_and_version.into(),
            strict: false,
        }
    }

    /// Refuses a document with a key HSF does not know (the rules in force stay), where HSF
    /// would ignore it.
    ///
    /// ```
    /// use tower_outlier::dialect::Hsf;
    /// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
    ///
    /// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
    /// let typo = r#"{"DEFAULT": {"qosEnabled": true, "errorRateThreshhold": 0.1}}"#;
    /// let error = layer.rules().apply(&Hsf::service("Orders:1.0").strict(), typo).unwrap_err();
    /// assert!(error.to_string().contains("did you mean `errorRateThreshold`"));
    /// // Lenient, as HSF is: accepted, with a note.
    /// layer.rules().apply(&Hsf::service("Orders:1.0"), typo)?;
    /// assert_eq!(layer.monitor().snapshot().rules_notes.len(), 1);
    /// # Ok::<(), tower::BoxError>(())
    /// ```
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }
}

#[cfg(feature = "hsf")]
impl Dialect for Hsf {
    fn name(&self) -> &'static str {
        "HSF JSON"
    }

    fn policy_name(&self) -> &'static str {
        tower_outlier_error_rate::ErrorRatePolicy::NAME
    }

    fn parse(
        &self,
        text: &str,
        current: &dyn OutlierPolicy,
    ) -> Result<Arc<dyn OutlierPolicy>, BoxError> {
        self.parse_noting(text, current, &mut Vec::new())
    }

    fn parse_noting(
        &self,
        text: &str,
        _current: &dyn OutlierPolicy,
        notes: &mut Vec<String>,
    ) -> Result<Arc<dyn OutlierPolicy>, BoxError> {
        let hsf = tower_outlier_error_rate::HsfQosConfig::from_json(text)?;
        let config = hsf.service(&self.service)?;
        keep_or_refuse(self.strict, hsf.ignored_key_notes(), notes)?;
        if !config.enabled() {
            notes.push(format!(
                "detection is off for `{}`: `qosEnabled` is not true in its block or in `DEFAULT` (HSF's default is off)",
                tower_outlier_core::text::name(&self.service)
            ));
        }
        Ok(Arc::new(tower_outlier_error_rate::ErrorRatePolicy::new(
            config,
        )))
    }
}

/// Sentinel's `DegradeRule` JSON list: the first rule of one resource replaces the layer's
/// slow-call policy, keeping its state-change callbacks. As in Sentinel's reload, an endpoint
/// whose breaker follows an unchanged rule keeps the breaker and its state; a changed rule
/// starts fresh breakers. A list without a rule for the resource is refused (the rule in force
/// stays), where Sentinel would drop the breaker.
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
///
/// Sentinel ignores fields it does not know, and so does this dialect, noting each one of the
/// resource's rule (with the field a misspelt one likely meant) in the log and
/// [`Snapshot::rules_notes`](crate::Snapshot); [`strict`](Sentinel::strict) refuses the document
/// instead.
#[derive(Clone, Debug)]
pub struct Sentinel {
    resource: String,
    strict: bool,
}

#[cfg(feature = "sentinel")]
impl Sentinel {
    /// The dialect for `resource`'s rule.
    pub fn resource(resource: impl Into<String>) -> Self {
        Sentinel {
            resource: resource.into(),
            strict: false,
        }
    }

    /// Refuses a document whose rule for the resource has a field Sentinel does not know (the
    /// rule in force stays), where Sentinel would ignore it.
    ///
    /// ```
    /// use tower_outlier::dialect::Sentinel;
    /// use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
    /// use tower_outlier::OutlierDetectionLayer;
    ///
    /// let layer = OutlierDetectionLayer::new(SlowCallPolicy::new(BreakerConfig::slow_ratio(std::time::Duration::from_millis(50)).open_duration(std::time::Duration::from_secs(10)).build()?));
    /// let typo = r#"[{"resource": "orders", "grade": 0, "count": 50, "timeWindow": 10, "slowRatioThreshhold": 0.2}]"#;
    /// let error = layer.rules().apply(&Sentinel::resource("orders").strict(), typo).unwrap_err();
    /// assert!(error.to_string().contains("did you mean `slowRatioThreshold`"));
    /// # Ok::<(), tower::BoxError>(())
    /// ```
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }
}

#[cfg(feature = "sentinel")]
impl Dialect for Sentinel {
    fn name(&self) -> &'static str {
        "Sentinel degrade rules"
    }

    fn policy_name(&self) -> &'static str {
        tower_outlier_slow_call::SlowCallPolicy::NAME
    }

    fn parse(
        &self,
        text: &str,
        current: &dyn OutlierPolicy,
    ) -> Result<Arc<dyn OutlierPolicy>, BoxError> {
        self.parse_noting(text, current, &mut Vec::new())
    }

    fn parse_noting(
        &self,
        text: &str,
        current: &dyn OutlierPolicy,
        notes: &mut Vec<String>,
    ) -> Result<Arc<dyn OutlierPolicy>, BoxError> {
        use tower_outlier_slow_call::{parse_degrade_rules, SlowCallPolicy};
        let rules = parse_degrade_rules(text)?;
        let Some(rule) = rules.iter().find(|r| r.resource() == self.resource) else {
            return Err(format!("no degrade rule for resource `{}`", self.resource).into());
        };
        keep_or_refuse(self.strict, rule.ignored_field_notes(), notes)?;
        let policy = match current.as_any().downcast_ref::<SlowCallPolicy>() {
            Some(current) => current.with_config(rule.config().clone()),
            None => SlowCallPolicy::new(rule.config().clone()),
        };
        Ok(Arc::new(policy))
    }
}

/// SOFARPC's `com.alipay.sofa.rpc.aft.*` properties: replace the layer's weight policy.
#[cfg(feature = "sofa")]
#[cfg_attr(docsrs, doc(cfg(feature = "sofa")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Sofa;

#[cfg(feature = "sofa")]
impl Dialect for Sofa {
    fn name(&self) -> &'static str {
        "SOFARPC properties"
    }

    fn policy_name(&self) -> &'static str {
        tower_outlier_weight::WeightPolicy::NAME
    }

    fn parse(
        &self,
        text: &str,
        _current: &dyn OutlierPolicy,
    ) -> Result<Arc<dyn OutlierPolicy>, BoxError> {
        let config = tower_outlier_weight::SofaProperties::from_properties(text)?.config();
        Ok(Arc::new(tower_outlier_weight::WeightPolicy::new(config)))
    }
}

/// Envoy's cluster `outlier_detection` in proto3 JSON: replaces the layer's `envoy` detector
/// policy, keeping its counters and dice.
#[cfg(feature = "envoy")]
#[cfg_attr(docsrs, doc(cfg(feature = "envoy")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Envoy;

#[cfg(feature = "envoy")]
impl Dialect for Envoy {
    fn name(&self) -> &'static str {
        "Envoy outlier_detection"
    }

    fn policy_name(&self) -> &'static str {
        tower_outlier_detectors::DetectorSemantics::Envoy.policy_name()
    }

    fn parse(
        &self,
        text: &str,
        current: &dyn OutlierPolicy,
    ) -> Result<Arc<dyn OutlierPolicy>, BoxError> {
        let config = tower_outlier_detectors::EnvoyOutlierDetection::from_json(text)?.into_config();
        Ok(detectors(config, current))
    }
}

/// gRPC's `outlier_detection_experimental` configuration: replaces the layer's `grpc` detector
/// policy, keeping its counters and dice.
#[cfg(feature = "grpc-config")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc-config")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Grpc;

#[cfg(feature = "grpc-config")]
impl Dialect for Grpc {
    fn name(&self) -> &'static str {
        "gRPC outlier_detection_experimental"
    }

    fn policy_name(&self) -> &'static str {
        tower_outlier_detectors::DetectorSemantics::Grpc.policy_name()
    }

    fn parse(
        &self,
        text: &str,
        current: &dyn OutlierPolicy,
    ) -> Result<Arc<dyn OutlierPolicy>, BoxError> {
        let config = tower_outlier_detectors::GrpcOutlierDetection::from_json(text)?.into_config();
        Ok(detectors(config, current))
    }
}

#[cfg(any(feature = "envoy", feature = "grpc-config"))]
fn detectors(
    config: tower_outlier_detectors::DetectorConfig,
    current: &dyn OutlierPolicy,
) -> Arc<dyn OutlierPolicy> {
    use tower_outlier_detectors::DetectorPolicy;
    match current.as_any().downcast_ref::<DetectorPolicy>() {
        Some(current) => Arc::new(current.with_config(config)),
        None => Arc::new(DetectorPolicy::new(config)),
    }
}
