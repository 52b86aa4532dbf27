//! The shared vocabulary of the tower-outlier crate family.
//!
//! * [`Outcome`], [`FailureKind`] and [`Observation`]: what a finished call looked like.
//! * [`Classify`] and its presets ([`NetworkErrors`], [`ServerErrors`], [`classify::predicate`],
//!   [`classify::classify_fn`]): which results count as failures.
//! * [`Window`]: a lock-free, time-bucketed sliding window of call counts.
//! * [`Clock`]: the deliberate choice of time source for the hot path.
//! * [`OutlierPolicy`], [`EndpointPolicy`], [`Judgement`]: how policies judge endpoints, and the shared
//!   [`EjectionBudget`] and [`RecoverySchedule`] they eject and recover by; [`ComposedPolicy`]:
//!   several policies as one, combined by any, all or k of n.
//! * [`EndpointRecord`]: the per-endpoint state the layer and the response futures share.
//! * [`ConfigError`]: a configuration value outside its range, named; [`text`]: how
//!   configuration readers show names and values in errors.
//!
//! Users normally depend on the `tower-outlier` crate, which re-exports what they need.
//!
//! This crate reads time from tokio (see [`Clock`]): the window and the clock have to agree on
//! one time source, and tests need tokio's paused clock.
//!
//! # Cargo features
//!
#![cfg_attr(
    feature = "json",
    doc = "* `json` (off by default): [`json`], JSON read with keys given twice detected, for \
           the policy crates' configuration readers. It is the only user of `serde` and \
           `serde_json`."
)]
#![cfg_attr(
    not(feature = "json"),
    doc = "* `json` (off by default, off in this build): `json`, JSON read with keys given twice \
           detected, for the policy crates' configuration readers. It is the only user of \
           `serde` and `serde_json`."
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod classify;
mod clock;
mod compose;
pub mod dialect;
mod dice;
mod document;
mod error;
#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
pub mod json;
pub mod lanes;
mod lock;
mod outcome;
mod policy;
mod record;
mod signal;
mod slow_start;
mod sync;
pub mod text;
mod user_code;
mod window;

pub use classify::{Classify, NetworkErrors, ServerErrors};
pub use clock::{duration_to_nanos, Clock, Nanos};
pub use compose::{Agreement, ComposedEndpoint, ComposedPolicy, ComposedPolicyBuilder};
pub use dice::Dice;
pub use document::DocumentError;
pub use error::{check_nonzero_duration, check_ratio, ConfigError};
pub use lock::{Lock, LockGuard};
pub use outcome::{FailureKind, Observation, Outcome};
pub use policy::{
    Admit, BudgetFloor, CallsNeeded, Comparison, Description, DynOutlierPolicy, EjectionBudget,
    EndpointPolicy, FleetMember, FleetPolicy, Judged, Judgement, OutlierPolicy, OwnTiming,
    ProbeGate, Reason, RecoverySchedule, Signal, Weighting, WhenAllOut,
};
pub use record::{
    store_if_changed, EndpointRecord, Notifier, ProbePermits, SignalChunk, SignalSlot, RTT_DECAY,
    STALE_ESTIMATE,
};
/// The boxed error type of tower middleware (`tower::BoxError`).
pub use signal::{ServerSignal, LOAD_REPORT_HEADER};
pub use slow_start::{SlowStart, SlowStartBuilder};
pub use tower::BoxError;
pub use user_code::{drop_panic, panic_message};
pub use window::{SharedWindow, Window, WindowCounts, WindowShape};
