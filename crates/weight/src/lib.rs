//! Weight degradation (SOFARPC fault tolerance) for tower-outlier.

mod config;
mod policy;
mod sofa;

pub use config::{ExceptionKinds, WeightBuilder, WeightConfig};
pub use policy::{WeightEndpoint, WeightPolicy};
pub use sofa::{PropertiesError, SofaProperties};
