//! The outlier detectors of Envoy, gRPC (proposal A50) and linkerd2-proxy, as a policy of
//! `tower_outlier::OutlierDetectionLayer`.
//!
//! [`DetectorPolicy`] runs, per endpoint:
//!
//! * **consecutive failures**, judged on every call and acting at exactly the N-th failure in a
//!   row: any failure ("5xx"), gateway failures (502, 503, 504, refused connections and
//!   timeouts), and — with `split_external_local_origin_errors` — local-origin failures (errors
//!   raised before any response) on their own;
//! * **success rate** on every interval: among endpoints with the request volume, when there are
//!   enough of them, those below `mean − factor × stdev` (Envoy's and gRPC's rule) or below
//!   `median − factor × max(1.4826 × MAD, floor)` ([`SuccessRateRule::Robust`], which still
//!   ejects when two of five endpoints are fully down and never ejects a tight healthy fleet);
//! * **failure percentage** on every interval: at or above the threshold (Envoy), above it (gRPC);
//!
//! each with its enforcement percentage (seedable dice: [`DetectorPolicy::seeded`]), and
//! [`DetectorStats`] counting what each detected and enforced. How long an ejection lasts, how its
//! multiplier grows and decays, and how many endpoints may be out at once follow the
//! [`DetectorSemantics`]; the layer applies the budget and never ejects the last endpoint.
//!
//! | preset | detectors | ejection time | budget |
//! |---|---|---|---|
//! | [`DetectorConfig::recommended`] (this library's) | 3 consecutive failures of any kind, or a success rate below 0.8 over the last 10 s | back-off 1 s to 5 s, jitter 0.5, then the layer's probe or one real request | half the fleet, always one from two endpoints |
//! | [`DetectorConfig::envoy`] | consecutive 5xx (5), gateway (5, not enforced), success rate; failure percentage not enforced | 30 s × multiplier, at most 300 s | 10 %, `(ejected + 1) / n` |
//! | [`DetectorConfig::grpc`] | success rate | 30 s × multiplier, at most 300 s | 10 %, checked before each ejection |
//! | [`DetectorConfig::linkerd`] | 7 consecutive failures, or a success rate below 0.8 over the last 10 s ([`RecentSuccessRate`]) | back-off 1 s to 60 s, jitter 0.5, then one real request as the probe | none |
//! | [`DetectorConfig::linkerd_consecutive`] | 7 consecutive failures | as linkerd | none |
//!
//! [`LinkerdAnnotations`] reads linkerd's failure-accrual annotations (no feature needed).
//!
//! ```
//! use tower_outlier_core::OutlierPolicy;
//! use tower_outlier_detectors::{DetectorConfig, DetectorPolicy, SuccessRateRule};
//!
//! let policy = DetectorPolicy::new(
//!     DetectorConfig::envoy()
//!         .split_external_local_origin_errors(true)
//!         .success_rate_rule(SuccessRateRule::robust())
//!         .max_ejection_percent(50)
//!         .build()?,
//! );
//! assert_eq!(policy.budget().unwrap().max_ejected(5), 2);
//! # Ok::<(), tower_outlier_core::ConfigError>(())
//! ```
//!
//! # Cargo features
//!
//! * `envoy` (on by default): `EnvoyOutlierDetection`, which reads Envoy's cluster
//!   `outlier_detection` in proto3 JSON.
//! * `grpc` (on by default): `GrpcOutlierDetection`, which reads gRPC's
//!   `outlier_detection_experimental` load-balancing configuration.
//!
//! Both bring in `serde_json`; with `default-features = false`, configure the detectors in code.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod detector;
#[cfg(any(feature = "envoy", feature = "grpc"))]
mod dialect;
mod endpoint;
mod enforcement;
#[cfg(feature = "envoy")]
mod envoy;
#[cfg(feature = "grpc")]
mod grpc;
#[cfg(any(feature = "envoy", feature = "grpc"))]
mod json_reader;
mod linkerd;
mod policy;
mod statistics;

pub use config::{
    Consecutive, DetectorBuilder, DetectorConfig, DetectorSemantics, FailurePercentage,
    RecentSuccessRate, SuccessRate, SuccessRateRule,
};
pub use detector::{Detector, DetectorStats};
#[cfg(feature = "envoy")]
#[cfg_attr(docsrs, doc(cfg(feature = "envoy")))]
pub use dialect::Envoy;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub use dialect::Grpc;
pub use endpoint::DetectorEndpoint;
#[cfg(feature = "envoy")]
#[cfg_attr(docsrs, doc(cfg(feature = "envoy")))]
pub use envoy::{EnvoyHealthCheck, EnvoyOutlierDetection};
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub use grpc::GrpcOutlierDetection;
pub use linkerd::LinkerdAnnotations;
pub use policy::DetectorPolicy;
/// The readers' error type.
#[cfg(any(feature = "envoy", feature = "grpc"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "envoy", feature = "grpc"))))]
pub use tower_outlier_core::DocumentError;

#[cfg(test)]
mod tests;
