//! Client-side outlier detection for [tower](https://docs.rs/tower): find the endpoints of a
//! load-balanced set that fail, take them out of rotation, check them, and bring them back.
//!
//! [`OutlierDetectionLayer`] wraps a `tower::discover` stream. Each discovered service becomes an
//! [`Endpoint`] whose response futures classify and record every call (lock-free, with its
//! latency); the layer's output is a discover stream without the ejected endpoints, ready for
//! `tower::balance::p2c::Balance`. [`Endpoint`] implements `tower::load::Load`, so p2c prefers
//! fast, idle endpoints.
//!
//! Policies (each its own crate, re-exported behind a feature):
//! * `ejection` (default): error-rate ejection with EDAS / HSF semantics —
//!   [`ErrorRatePolicy`], [`ErrorRateConfig`], [`HsfQosConfig`].
//! * `slow-call` (default): the slow-call ratio breaker with Sentinel semantics, in [`slow_call`]:
//!   `SlowCallPolicy` per endpoint (composes with error-rate ejection through
//!   [`OutlierDetectionLayer::with_policy`], sharing one budget) and the standalone
//!   `CircuitBreakerLayer`.
//! * `weight` (default): weight degradation with SOFARPC semantics, in [`weight`]: `WeightPolicy`
//!   evaluated once per window against the service average; the weight divides each endpoint's
//!   load.
//!
//! What counts as a failure is the classifier's choice ([`NetworkErrors`], [`ServerErrors`],
//! [`classify::predicate`], [`classify::classify_fn`]); how an ejected endpoint is checked is the
//! probe's ([`probe::PassiveTrial`], [`probe::request_probe`], [`probe::probe_fn`]). A
//! [`Monitor`] shows what the layer decided.
//!
//! ```
//! use std::convert::Infallible;
//! use tower::balance::p2c::Balance;
//! use tower::discover::ServiceList;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let services = (0..4).map(|i| service_fn(move |_: ()| async move { Ok::<_, Infallible>(i) }));
//! let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
//! let balancer = Balance::new(layer.layer(ServiceList::new(services)));
//! let answer = balancer.oneshot(()).await?;
//! assert!(answer < 4);
//! # Ok(()) }
//! ```
//!
//! Invariants the layer keeps: the last available endpoint is never ejected; ejections never
//! exceed the budget; no request is routed to an ejected endpoint; idle means `Pending` with a
//! timer or waker registered; recording takes no lock and allocates nothing; the upstream is
//! authoritative; time comes from tokio (or the [`Clock`] you choose); bad configuration is a
//! [`ConfigError`].

mod deadlines;
mod discover;
mod endpoint;
mod engine;
mod future;
pub mod grpc;
mod layer;
mod monitor;
pub mod probe;
pub mod response;
#[cfg(feature = "tower-http")]
pub mod tower_http;

pub use discover::OutlierDetection;
pub use endpoint::{Cost, Endpoint};
pub use future::ResponseFuture;
pub use layer::OutlierDetectionLayer;
pub use monitor::{EndpointSnapshot, EndpointStatus, Monitor, PolicyWindow, Snapshot};

pub use tower_outlier_core::{
    classify, Admit, AsAny, Budget, BudgetFloor, Classify, Clock, ConfigError, EndpointPolicy,
    EndpointRecord, FailureKind, FleetMember, Judgement, NetworkErrors, Notifier, Observation,
    Outcome, Policy, Reason, RecoverySchedule, ServerErrors, Signal, Window, WindowCounts,
};

/// The slow-call ratio circuit breaker (Sentinel semantics): [`SlowCallPolicy`](slow_call::SlowCallPolicy)
/// per endpoint in this layer, or [`CircuitBreakerLayer`](slow_call::CircuitBreakerLayer) around
/// any service.
#[cfg(feature = "slow-call")]
pub use tower_outlier_slow_call as slow_call;

/// Weight degradation (SOFARPC semantics): [`WeightPolicy`](weight::WeightPolicy) lowers the
/// weight of endpoints whose exception rate is a multiple of the service average and restores it
/// when they are healthy; the weight divides the endpoint's load.
#[cfg(feature = "weight")]
pub use tower_outlier_weight as weight;

#[cfg(feature = "ejection")]
pub use tower_outlier_ejection::{
    ErrorRateBuilder, ErrorRateConfig, ErrorRateEndpoint, ErrorRatePolicy, HsfConfigError,
    HsfQosConfig,
};
