//! Latency outliers judged against their peers, by LinkedIn D2's relative rule on a robust
//! statistic: every interval each endpoint's p90 latency — read from a fixed-size sketch, its
//! calls in flight counted at their age so far — against the median of the endpoints' p90s. An
//! endpoint at or above 1.3 times it is an outlier; one back from an ejection must come down to
//! 1.1 times to be healthy. No absolute threshold to tune per service, one slow call does not
//! make an outlier, and a fleet that slows down together judges nobody.
//!
//! * [`LatencyConfig`]: the rule's factors, minimums and recovery, with D2's defaults.
//! * [`LatencyPolicy`]: the detector, a fleet policy of the tower-outlier layer sharing its
//!   ejection budget.
//!
//! Users normally reach this crate through `tower-outlier` (feature `latency`).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod policy;
mod sketch;

pub use config::{LatencyConfig, LatencyConfigBuilder};
pub use policy::{LatencyEndpoint, LatencyPolicy};
