//! Latency outliers judged against their peers, by LinkedIn D2's relative rule: every interval
//! each endpoint's latency statistic — read from a fixed-size sketch, its calls in flight counted
//! at their age so far — is set against the fleet's. An endpoint at or above 1.3 times it is an
//! outlier; one back from an ejection must come down to 1.1 times to be healthy. No absolute
//! threshold to tune per service, and a fleet that slows down together judges nobody.
//!
//! * [`LatencyConfig::recommended`]: each endpoint's p90 against the median of the endpoints'
//!   p90s, two intervals in a row: one slow call or a latency tail makes no outlier.
//! * [`LatencyConfig::d2`]: D2's rule as D2 states it: each endpoint's mean against the fleet's
//!   call-weighted mean, one interval: quicker, and one slow call can make an outlier.
//! * [`LatencyPolicy`]: the detector, a fleet policy of the tower-outlier layer sharing its
//!   ejection budget, ejecting or ([`LatencyConfigBuilder::down_weight`]) lowering weights.
//!
//! Users normally reach this crate through `tower-outlier` (feature `latency`).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod policy;
mod sketch;

pub use config::{FleetBar, LatencyConfig, LatencyConfigBuilder, LatencyStatistic};
pub use policy::{LatencyEndpoint, LatencyPolicy};
