//! The configuration documents a running layer can be given, one [`Dialect`] per system this
//! library follows, each defined by the policy crate it configures: HSF's configuration-center
//! JSON, Sentinel's degrade rules, SOFARPC's properties, Envoy's `outlier_detection` and gRPC's
//! `outlier_detection_experimental`. Each replaces the layer's policy of its kind through [`RulesHandle::apply`](crate::RulesHandle::apply),
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

pub use crate::reconfigure::ReconfigureError;
pub use tower_outlier_core::dialect::{note_or_refuse, Dialect};

#[cfg(feature = "envoy")]
#[cfg_attr(docsrs, doc(cfg(feature = "envoy")))]
pub use tower_outlier_detectors::Envoy;
#[cfg(feature = "grpc-config")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc-config")))]
pub use tower_outlier_detectors::Grpc;
#[cfg(feature = "hsf")]
#[cfg_attr(docsrs, doc(cfg(feature = "hsf")))]
pub use tower_outlier_error_rate::Hsf;
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use tower_outlier_slow_call::Sentinel;
#[cfg(feature = "sofa")]
#[cfg_attr(docsrs, doc(cfg(feature = "sofa")))]
pub use tower_outlier_weight::Sofa;

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
