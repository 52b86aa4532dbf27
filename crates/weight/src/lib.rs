//! Weight degradation (SOFARPC fault tolerance) for tower-outlier.
//!
//! # Cargo features
//!
//! * `sofa` (on by default): `SofaProperties`, the reader of SOFARPC's fault-tolerance
//!   properties (`com.alipay.sofa.rpc.aft.*`, as in a SOFABoot `application.properties`), whose
//!   errors are `DocumentError`s (re-exported from `tower-outlier-core`). With
//!   `default-features = false`, configure weight degradation in code with
//!   [`WeightConfig::builder`].

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
#[cfg(feature = "sofa")]
mod dialect;
mod policy;
#[cfg(feature = "sofa")]
mod sofa;

pub use config::{ExceptionKinds, WeightBuilder, WeightConfig};
#[cfg(feature = "sofa")]
#[cfg_attr(docsrs, doc(cfg(feature = "sofa")))]
pub use dialect::Sofa;
pub use policy::{WeightEndpoint, WeightPolicy};
#[cfg(feature = "sofa")]
#[cfg_attr(docsrs, doc(cfg(feature = "sofa")))]
pub use sofa::SofaProperties;
#[cfg(feature = "sofa")]
#[cfg_attr(docsrs, doc(cfg(feature = "sofa")))]
pub use tower_outlier_core::DocumentError;
