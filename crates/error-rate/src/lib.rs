//! Error-rate outlier ejection with the semantics of Alibaba EDAS and HSF "outlier instance
//! removal".
//!
//! * An endpoint is judged only once its window holds at least the minimum number of calls.
//! * It is an outlier when its error rate in the window is **strictly greater** than the threshold
//!   (6 failures in 10 calls at 50 % is ejected, 5 in 10 is not).
//! * At most `floor(n × max ratio)` endpoints are ejected at once; when that is below one, EDAS
//!   ejects none and HSF one ([`BudgetFloor`](tower_outlier_core::BudgetFloor)).
//! * The last available endpoint is never ejected (the layer enforces this for every policy).
//! * Recovery is checked one unit after ejection, each failed check one unit later than the last,
//!   capped at the max multiple; recovery resets the interval to one unit.
//!
//! Presets: [`ErrorRateConfig::hsf`], [`ErrorRateConfig::edas_spring_cloud`],
//! [`ErrorRateConfig::edas_dubbo_2_7`].
//!
#![cfg_attr(
    feature = "hsf",
    doc = "HSF's configuration-center JSON and `-D` parameters are read by [`HsfQosConfig`] \
           (cargo feature `hsf`, on by default)."
)]
#![cfg_attr(
    not(feature = "hsf"),
    doc = "HSF's configuration-center JSON and `-D` parameters are read by `HsfQosConfig`, \
           behind the cargo feature `hsf` (on by default, off in this build)."
)]
//!
//! ```
//! use tower_outlier_error_rate::{ErrorRateConfig, ErrorRatePolicy};
//!
//! let policy = ErrorRatePolicy::new(ErrorRateConfig::edas_spring_cloud().build()?);
//! # Ok::<(), tower_outlier_core::ConfigError>(())
//! ```
//!
//! # Cargo features
//!
//! * `hsf` (on by default): the HSF configuration reader, `HsfQosConfig`, whose errors are
//!   `DocumentError`s (re-exported from `tower-outlier-core`). It is what brings in `serde` and `serde_json`, directly and through the
//!   `json` feature of `tower-outlier-core` (JSON with repeated keys detected), which it turns
//!   on: with `default-features = false`, configure ejection in code with [`ErrorRateConfig`] and
//!   neither is compiled.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
#[cfg(feature = "hsf")]
mod dialect;
#[cfg(feature = "hsf")]
mod hsf;
mod policy;

pub use config::{ErrorRateBuilder, ErrorRateConfig};
#[cfg(feature = "hsf")]
#[cfg_attr(docsrs, doc(cfg(feature = "hsf")))]
pub use dialect::Hsf;
#[cfg(feature = "hsf")]
#[cfg_attr(docsrs, doc(cfg(feature = "hsf")))]
pub use hsf::HsfQosConfig;
pub use policy::{ErrorRateEndpoint, ErrorRatePolicy};
#[cfg(feature = "hsf")]
#[cfg_attr(docsrs, doc(cfg(feature = "hsf")))]
pub use tower_outlier_core::DocumentError;
