//! Latency outliers judged against their peers, as LinkedIn D2's relative strategy judges them:
//! every interval each endpoint's mean latency — its calls in flight counted at their age so far
//! — against the fleet's call-weighted mean. An endpoint at or above 1.3 times it is an outlier;
//! one back from an ejection must come down to 1.1 times to be healthy. No absolute threshold to
//! tune per service, and a fleet that slows down together judges nobody.
//!
//! * [`LatencyConfig`]: the rule's factors, minimums and recovery, with D2's defaults.
//! * [`LatencyPolicy`]: the detector, a fleet policy of the tower-outlier layer sharing its
//!   ejection budget.
//!
//! Users normally reach this crate through `tower-outlier` (feature `latency`).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod policy;

pub use config::{LatencyConfig, LatencyConfigBuilder};
pub use policy::{LatencyEndpoint, LatencyPolicy};
