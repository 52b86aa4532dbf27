//! Client-side outlier detection for [tower](https://docs.rs/tower): find the endpoints of a
//! load-balanced set that fail, take them out of rotation, check them, and bring them back.
//!
//! [`OutlierDetectionLayer`] wraps a `tower::discover` stream. Each discovered service becomes an
//! [`OutlierEndpoint`](discover::OutlierEndpoint) whose response futures classify and record every call (lock-free, with its
//! latency); the layer's output is a discover stream without the ejected endpoints, ready for
//! `tower::balance::p2c::Balance`. [`OutlierEndpoint`](discover::OutlierEndpoint) implements `tower::load::Load`, so p2c prefers
//! fast, idle endpoints.
//!
//! Policies (each its own crate, re-exported behind a feature; see [Cargo features](#cargo-features)):
//! the detectors of Envoy, gRPC (A50) and linkerd2-proxy with the recommended preset
//! (`DetectorPolicy`, `DetectorConfig::recommended()`, on by default), error-rate ejection with
//! EDAS / HSF semantics (`ErrorRatePolicy`), the slow-call ratio breaker with Sentinel semantics
//! (`slow_call`, per endpoint or as the standalone `CircuitBreakerLayer`), weight degradation
//! with SOFARPC semantics (`weight`), latency outliers (`latency`), ORCA weights (`orca`) and
//! Finagle's failure accrual (`finagle`). Several compose through
//! [`OutlierDetectionLayer::with_policy`], sharing one budget.
//!
//! What counts as a failure is the classifier's choice ([`NetworkErrors`], [`ServerErrors`],
//! [`classify::predicate`], [`classify::classify_fn`]); how an ejected endpoint is checked is the
//! probe's ([`probe::PassiveTrial`], [`probe::request_probe`], [`probe::probe_fn`]). A
//! [`Monitor`] shows what the layer decided.
//!
#![cfg_attr(feature = "error-rate", doc = "```")]
#![cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
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
//! Every rule the layer follows — when an endpoint is judged and ejected, the budget, recovery
//! checks and trials, the breaker, the weights, how the load steers the balancer, and the
//! invariants — is stated once, in [`rules`]. Writing a policy of your own starts at [`policy`].
//!
//! # Cargo features
//!
//! On by default: only `detectors`, what a user of `DetectorConfig::recommended()` needs (as
//! tower, tower-http and hyper-util, ask for the rest by name). Each feature once:
//!
//! | feature | what it brings |
//! |---|---|
//! | `detectors` (default) | `detectors`: Envoy's, gRPC's and linkerd's detectors, `DetectorPolicy` and `DetectorConfig` (with `recommended()`) at the root |
//! | `error-rate` | error-rate ejection with EDAS / HSF semantics: `ErrorRatePolicy`, `ErrorRateConfig` |
//! | `slow-call` | `slow_call`: the slow-call ratio breaker (Sentinel), per endpoint and standalone |
//! | `weight` | `weight`: weight degradation (SOFARPC) |
//! | `latency` | `latency::LatencyPolicy`: latency outliers judged against their peers (LinkedIn D2's relative rule) |
//! | `finagle` | `finagle`: Finagle's failure accrual (consecutive failures, success rate) |
//! | `orca` | `orca::OrcaPolicy`: endpoint weights from servers' ORCA load reports (gRFC A58), read from each call's trailers |
//! | `envoy` | Envoy's `outlier_detection` and `HealthCheck` JSON (`detectors::EnvoyOutlierDetection`, `detectors::EnvoyHealthCheck`); turns on `detectors`, brings serde_json |
//! | `grpc-config` | gRPC's `outlier_detection_experimental` JSON (`detectors::GrpcOutlierDetection`); turns on `detectors`, brings serde_json |
//! | `hsf` | HSF's configuration-center JSON (`error_rate::HsfQosConfig`); turns on `error-rate`, brings serde_json |
//! | `sentinel` | Sentinel's `DegradeRule` JSON (`slow_call::parse_degrade_rules`); turns on `slow-call`, brings serde_json |
//! | `sofa` | SOFARPC's fault-tolerance properties (`weight::SofaProperties`); turns on `weight` |
//! | `file-source` | `dialect::watch_file`: a configuration file followed as Kubernetes mounts a ConfigMap (notify) |
//! | `etcd` | `dialect::watch_etcd`: rules from a key in etcd (etcd-client; its build needs `protoc`) |
//! | `prometheus` | `metrics`: the layer's decisions on prometheus-client |
//! | `standard-metrics` | `standard_metrics`: gRPC's A91 outlier-detection metrics on the `metrics` facade |
//! | `admin` | `admin::Admin`: an admin page, JSON and server-sent events to mount in axum or hyper; turns on `serde` |
//! | `serde` | `serde::Serialize` for snapshots |
//! | `tower-http` | a `tower_http` response classifier as the layer's classifier |
//! | `hyper-client` | `hyper_client::PinnedClient`: a hyper-util client pinned to one address, the discover item of an HTTP fleet; turns on `hyper-io` |
//! | `hyper-io` | the connections a `connection::ConnectionWatch` hands out are hyper's IO, for hyper-util's client and tonic's `Endpoint::connect_with_connector` |
//! | `h2` | an HTTP/2 connection the client's own h2 closed with a GOAWAY `ENHANCE_YOUR_CALM` is the caller's failure, not the endpoint's (`classify::error_outcome`) |
//! | `tonic` | `From` between `grpc::Code` and `tonic::Code`; turns on `h2` |
//! | `grpc-health` | `grpc_health::GrpcHealth`: gRPC health checking (`grpc.health.v1`) as the probe; turns on `tonic` |

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
pub mod connection;
pub mod controls;
mod deadlines;
pub mod degraded;
pub mod dialect;
pub mod discover;
mod endpoint;
mod engine;
mod envoy_log;
mod event;
pub mod events {
    //! What the layer decides, as typed events for programs: ejections, refusals,
    //! re-admissions, probes, weights, rules. Subscribe through the [`Monitor`](crate::Monitor);
    //! [`EnvoyEventLog`] writes them as Envoy's outlier detection event log.
    pub use crate::envoy_log::EnvoyEventLog;
    pub use crate::event::*;
}
pub mod fail_fast;
pub mod future;
pub mod grpc;
#[cfg(feature = "grpc-health")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc-health")))]
pub mod grpc_health;
pub mod hosts;
#[cfg(feature = "hyper-client")]
#[cfg_attr(docsrs, doc(cfg(feature = "hyper-client")))]
pub mod hyper_client;
mod layer;
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub mod metrics;
pub mod monitor;
pub mod policy;
pub mod probe;
pub mod pushback;
pub mod rebuild;
mod reconfigure;
mod response;
pub mod rules;
mod shared;
#[cfg(feature = "standard-metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "standard-metrics")))]
pub mod standard_metrics;
mod status;
#[cfg(feature = "tower-http")]
pub mod tower_http_classifier;

pub mod classify {
    //! What counts as a failure, and when it is known.
    //!
    //! A [`Classify`] turns one call's result into an [`Outcome`]: success, or a failure of a
    //! [`FailureKind`]. [`NetworkErrors`] (the default, EDAS's "network exceptions") counts every
    //! error but the caller's own refusals, which are [`Outcome::NotSent`] ([`error_outcome`]:
    //! `tower::load_shed`'s `Overloaded`, the fail-fast guard's [`NoEndpointAvailable`], with
    //! the `h2` feature the client's own HTTP/2 GOAWAY);
    //! [`ServerErrors`] (EDAS's "network exceptions + HTTP 5xx") also counts 5xx
    //! responses; [`predicate`] (HSF's `bizExceptionPredicateClassName`) and [`classify_fn`]
    //! take your own rule. A call whose response future is dropped first is cancelled: neither.
    //!
    //! Classifiers that can only decide later — at the end of a response body, as gRPC's status
    //! in trailers — implement [`ResponseClassifier`] and record through a [`Recorder`];
    //! [`Immediate`] adapts a [`Classify`] to it (the layer does this for you).
    pub use crate::response::{Immediate, Recorder, ResponseClassifier};
    pub use tower_outlier_core::classify::*;
    pub use tower_outlier_core::{FailureKind, Observation, Outcome};
}

pub use classify::{NetworkErrors, ServerErrors};
pub use discover::DiscoverErrors;
pub use layer::OutlierDetectionLayer;
pub use monitor::{EndpointSnapshot, EndpointStatus, Monitor, Snapshot};
pub use reconfigure::RulesHandle;
pub use tower_outlier_core::{
    Agreement, Clock, ComposedPolicy, ComposedPolicyBuilder, ConfigError, SlowStart,
    SlowStartBuilder, WhenAllOut,
};

/// Latency outliers judged against their peers (LinkedIn D2's relative rule): everything of the
/// `tower-outlier-latency` crate. Add [`LatencyPolicy`](latency::LatencyPolicy) to a layer.
#[cfg(feature = "latency")]
#[cfg_attr(docsrs, doc(cfg(feature = "latency")))]
pub use tower_outlier_latency as latency;

/// Finagle's failure accrual: everything of the `tower-outlier-finagle` crate. Its default
/// hybrid, [`finagle::finagle`], is a policy for [`OutlierDetectionLayer::new`].
#[cfg(feature = "finagle")]
#[cfg_attr(docsrs, doc(cfg(feature = "finagle")))]
pub use tower_outlier_finagle as finagle;

/// Endpoint weights from servers' ORCA load reports (gRPC's weighted round robin, gRFC A58):
/// everything of the `tower-outlier-orca` crate. Add [`OrcaPolicy`](orca::OrcaPolicy) with
/// [`OutlierDetectionLayer::with_policy`] and classify with [`GrpcErrors`](grpc::GrpcErrors),
/// which reads each call's report from its trailers.
#[cfg(feature = "orca")]
#[cfg_attr(docsrs, doc(cfg(feature = "orca")))]
pub use tower_outlier_orca as orca;

/// Error-rate ejection (EDAS and HSF semantics): everything of the `tower-outlier-error-rate`
/// crate; the policy, its configuration and the HSF reader are also at this crate's root.
#[cfg(feature = "error-rate")]
#[cfg_attr(docsrs, doc(cfg(feature = "error-rate")))]
pub use tower_outlier_error_rate as error_rate;

/// The slow-call ratio circuit breaker (Sentinel semantics): [`SlowCallPolicy`](slow_call::SlowCallPolicy)
/// per endpoint in this layer, or [`CircuitBreakerLayer`](slow_call::CircuitBreakerLayer) around
/// any service.
#[cfg(feature = "slow-call")]
#[cfg_attr(docsrs, doc(cfg(feature = "slow-call")))]
pub use tower_outlier_slow_call as slow_call;

/// Weight degradation (SOFARPC semantics): [`WeightPolicy`](weight::WeightPolicy) lowers the
/// weight of endpoints whose exception rate is a multiple of the service average and restores it
/// when they are healthy; the weight divides the endpoint's load.
#[cfg(feature = "weight")]
#[cfg_attr(docsrs, doc(cfg(feature = "weight")))]
pub use tower_outlier_weight as weight;

/// The detectors of Envoy, gRPC (A50) and linkerd2-proxy:
/// [`DetectorPolicy`] with the presets of [`DetectorConfig`].
#[cfg(feature = "detectors")]
#[cfg_attr(docsrs, doc(cfg(feature = "detectors")))]
pub use tower_outlier_detectors as detectors;

#[cfg(feature = "detectors")]
#[cfg_attr(docsrs, doc(cfg(feature = "detectors")))]
pub use tower_outlier_detectors::{DetectorConfig, DetectorPolicy};

#[cfg(feature = "error-rate")]
#[cfg_attr(docsrs, doc(cfg(feature = "error-rate")))]
pub use tower_outlier_error_rate::{ErrorRateConfig, ErrorRatePolicy};
