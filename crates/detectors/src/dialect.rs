//! Envoy's and gRPC's outlier-detection configuration as [`Dialect`]s of the detector policy.

use tower_outlier_core::dialect::Dialect;
use tower_outlier_core::BoxError;

#[cfg(feature = "envoy")]
use crate::EnvoyOutlierDetection;
#[cfg(feature = "grpc")]
use crate::GrpcOutlierDetection;
use crate::{DetectorPolicy, DetectorSemantics};

/// Envoy's cluster `outlier_detection` in proto3 JSON: replaces a layer's `envoy` detector
/// policy, keeping its counters and dice.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::dialect::Dialect;
/// use tower_outlier_detectors::{DetectorConfig, DetectorPolicy, Envoy};
///
/// let current = DetectorPolicy::new(DetectorConfig::envoy().build()?);
/// let next = Envoy.parse(r#"{"interval": "5s", "consecutive5xx": 3}"#, &current, &mut Vec::new())?;
/// assert_eq!(next.config().interval(), Duration::from_secs(5));
/// assert_eq!(next.config().consecutive_5xx().threshold, 3);
/// # Ok::<(), tower_outlier_core::BoxError>(())
/// ```
#[cfg(feature = "envoy")]
#[cfg_attr(docsrs, doc(cfg(feature = "envoy")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Envoy;

#[cfg(feature = "envoy")]
impl Dialect for Envoy {
    type Policy = DetectorPolicy;

    fn name(&self) -> &'static str {
        "Envoy outlier_detection"
    }

    fn policy_name(&self) -> &'static str {
        DetectorSemantics::Envoy.policy_name()
    }

    fn parse(
        &self,
        text: &str,
        current: &DetectorPolicy,
        notes: &mut Vec<String>,
    ) -> Result<DetectorPolicy, BoxError> {
        let document = EnvoyOutlierDetection::from_json(text)?;
        notes.extend(document.left_to_default(current.config()));
        Ok(current.with_config(document.into_config()))
    }
}

/// gRPC's `outlier_detection_experimental` configuration: replaces a layer's `grpc` detector
/// policy, keeping its counters and dice.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::dialect::Dialect;
/// use tower_outlier_detectors::{DetectorConfig, DetectorPolicy, Grpc};
///
/// let current = DetectorPolicy::new(DetectorConfig::grpc().build()?);
/// let next = Grpc.parse(r#"{"interval": "2s", "maxEjectionPercent": 20}"#, &current, &mut Vec::new())?;
/// assert_eq!(next.config().interval(), Duration::from_secs(2));
/// assert_eq!(next.config().max_ejection_percent(), 20);
/// # Ok::<(), tower_outlier_core::BoxError>(())
/// ```
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Grpc;

#[cfg(feature = "grpc")]
impl Dialect for Grpc {
    type Policy = DetectorPolicy;

    fn name(&self) -> &'static str {
        "gRPC outlier_detection_experimental"
    }

    fn policy_name(&self) -> &'static str {
        DetectorSemantics::Grpc.policy_name()
    }

    fn parse(
        &self,
        text: &str,
        current: &DetectorPolicy,
        notes: &mut Vec<String>,
    ) -> Result<DetectorPolicy, BoxError> {
        let document = GrpcOutlierDetection::from_json(text)?;
        notes.extend(document.left_to_default(current.config()));
        Ok(current.with_config(document.into_config()))
    }
}
