//! Weight degradation (SOFARPC fault tolerance) for tower-outlier.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

mod config;
mod policy;
mod sofa;

pub use config::{ExceptionKinds, WeightBuilder, WeightConfig};
pub use policy::{WeightEndpoint, WeightPolicy};
pub use sofa::{PropertiesError, SofaProperties};
