//! A circuit breaker with the degrade semantics of Alibaba Sentinel — slow-call ratio, error ratio
//! and error count — usable per endpoint inside `tower_outlier::OutlierDetectionLayer`
//! ([`SlowCallPolicy`]) or on its own around any `Service` ([`CircuitBreakerLayer`]).
//!
//! * A call is slow when its latency is **strictly greater** than the max RT.
//! * In CLOSED, after each completion: below the minimum requests in the statistics interval
//!   nothing happens; otherwise the breaker opens when the measure is strictly greater than its
//!   threshold, or, for the slow-call ratio at 1.0, when every call was slow.
//! * OPEN rejects calls until the open duration has passed; then exactly one call is the
//!   HALF_OPEN probe, even under concurrent callers, and its completion alone decides: slow or
//!   failed re-opens for another open duration, otherwise the breaker closes and the statistics
//!   restart.
//! * Observers ([`CircuitBreakerLayer::on_state_change`], [`SlowCallPolicy::on_state_change`]) and
//!   `tracing` events (`target: "tower_outlier::breaker"`) receive every change with the value
//!   that triggered it, on a thread of their own, never on the task whose call changed the state
//!   ([`wait_for_state_observers`] waits for them).
#![cfg_attr(
    feature = "sentinel",
    doc = "* Sentinel's `DegradeRule` JSON loads with [`parse_degrade_rules`] (cargo feature \
           `sentinel`, on by default)."
)]
#![cfg_attr(
    not(feature = "sentinel"),
    doc = "* Sentinel's `DegradeRule` JSON loads with `parse_degrade_rules`, behind the cargo \
           feature `sentinel` (on by default, off in this build)."
)]
//!
//! The statistics interval is the core crate's lock-free bucketed window; with one bucket (the
//! default) it behaves exactly like Sentinel's `statIntervalMs`.
//!
//! # Cargo features
//!
//! * `sentinel` (on by default): the Sentinel `DegradeRule` JSON reader, `parse_degrade_rules`,
//!   with its `DegradeRule`; its errors are `DocumentError`s (re-exported from
//!   `tower-outlier-core`). It is what brings in `serde` and `serde_json`,
//!   directly and through the `json` feature of `tower-outlier-core` (JSON with repeated keys
//!   detected), which it turns on: with `default-features = false`, configure breakers in code
//!   with [`BreakerConfig`] and neither is compiled.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod breaker;
mod classify;
mod config;
#[cfg(feature = "sentinel")]
mod dialect;
mod error;
mod future;
mod layer;
mod policy;
#[cfg(feature = "sentinel")]
mod sentinel;
mod service;
mod shared;

pub use breaker::{state_observers_told, wait_for_state_observers};
pub use breaker::{Admission, Breaker, Observer, State, StateChange};
pub use classify::{BreakerClassifier, PendingCall};
pub use config::{BreakerBuilder, BreakerConfig, Strategy};
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use dialect::Sentinel;
pub use error::BrokenCircuit;
pub use future::ResponseFuture;
pub use layer::CircuitBreakerLayer;
pub use policy::{SlowCallEndpoint, SlowCallPolicy};
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use sentinel::{parse_degrade_rules, DegradeRule};
pub use service::CircuitBreaker;
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use tower_outlier_core::DocumentError;
