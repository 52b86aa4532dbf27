//! For policy authors: the traits a policy implements and the per-endpoint machinery it works
//! with. Users who configure the policies this crate ships need none of it.
//!
//! An [`OutlierPolicy`] is configured once per layer and gives every endpoint its own
//! [`EndpointPolicy`] state. Each finished call reaches that state through
//! [`EndpointPolicy::record`] (the hot path: no lock, no allocation); a record that may have
//! crossed a threshold returns [`Signal::Evaluate`], and the layer asks
//! [`EndpointPolicy::judge`] for a [`Judgement`]. Every ejection spends from one
//! [`EjectionBudget`] and never takes out the last available endpoint; the policy that
//! ejected an endpoint decides when it is checked again ([`OutlierPolicy::recovery`]).

pub use tower_outlier_core::text;
pub use tower_outlier_core::{
    check_nonzero_duration, check_ratio, duration_to_nanos, Admit, BudgetFloor, CallsNeeded, Clock,
    Comparison, Description, DynOutlierPolicy, EjectionBudget, EndpointPolicy, EndpointRecord,
    FleetMember, FleetPolicy, Judged, Judgement, Lock, LockGuard, Nanos, Notifier, Observation,
    OutlierPolicy, OwnTiming, ProbeGate, ProbePermits, Reason, RecoverySchedule, SharedWindow,
    Signal, Weighting, Window, WindowCounts, WindowShape, RTT_DECAY,
};
