//! Weight degradation (SOFARPC fault tolerance) for tower-outlier.
//!
//! # Cargo features
//!
//! * `sofa` (on by default): the SOFARPC properties reader, `SofaProperties`, and its error,
//!   `PropertiesError`, which read SOFARPC's fault-tolerance properties
//!   (`com.alipay.sofa.rpc.aft.*`, as in a SOFABoot `application.properties`). With
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
pub use sofa::{PropertiesError, SofaProperties};
