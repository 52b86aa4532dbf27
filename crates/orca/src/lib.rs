//! Endpoint weights from the load reports servers send with each call: ORCA's
//! `xds.data.orca.v3.OrcaLoadReport` in the `endpoint-load-metrics-bin` trailer, turned into
//! weights as gRPC's weighted round robin does (gRFC A58):
//! `qps / (utilization + eps / qps × error_utilization_penalty)`, used once an endpoint has
//! reported for the blackout period and until its reports are older than the expiration period.
//!
//! * [`LoadReport`]: the report, read from its header without allocating.
//! * [`OrcaPolicy`] and [`OrcaConfig`]: the weights as a fleet policy of the tower-outlier layer,
//!   which shares the balancer's draws among the endpoints by weight.
//!
//! Users normally reach this crate through `tower-outlier` (feature `orca`), whose gRPC
//! classifier hands each call's report to the policy.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod policy;
mod report;

pub use config::{OrcaConfig, OrcaConfigBuilder};
pub use policy::{OrcaEndpoint, OrcaPolicy};
pub use report::{LoadReport, LOAD_REPORT_HEADER};
