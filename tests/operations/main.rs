//! What operators see and change: Prometheus and standard metrics, tracing, the file source and
//! the admin component (in a headless browser).

#[path = "../support/mod.rs"]
mod support;

mod admin_component;
mod admin_copies;
mod admin_readers;
mod control_cost;
mod file_source;
mod metrics;
mod observability;
mod standard_metrics;
