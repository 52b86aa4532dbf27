//! The policy trait: how a policy judges endpoints, and how several policies share one layer.
//!
//! An [`OutlierPolicy`] is configured once per layer. For every endpoint the layer asks it for an
//! [`EndpointPolicy`], the policy's per-endpoint state. On every finished call the endpoint's
//! response future hands the [`Observation`] to each of its endpoint policies
//! ([`EndpointPolicy::record`]): this is the hot path, so it must not lock or allocate. When a
//! record makes a cheap local check cross its threshold it returns [`Signal::Evaluate`], and the
//! layer wakes and asks [`EndpointPolicy::judge`] for a [`Judgement`] on the cold path. All policies'
//! ejections spend from one [`EjectionBudget`] and never take out the last available endpoint; the policy
//! that ejected an endpoint decides when it is checked again ([`OutlierPolicy::recovery`]).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::clock::{Clock, Nanos};
use crate::outcome::Observation;
use crate::window::{SharedWindow, WindowCounts};

/// A policy's configuration, shared by all endpoints of a layer.
///
/// The layer holds its policies as [`DynOutlierPolicy`], which every `OutlierPolicy` is; a
/// policy's own code sees only its own types.
pub trait OutlierPolicy: fmt::Debug + Send + Sync + 'static {
    /// The policy's state for one endpoint.
    type Endpoint: EndpointPolicy;

    /// A short name for logs and snapshots, such as `"error-rate"`.
    fn name(&self) -> &'static str;

    /// Fresh per-endpoint state for a newly discovered endpoint.
    fn new_endpoint(&self) -> Self::Endpoint;

    /// The state of an endpoint that already had `previous` under the configuration this one
    /// replaces (a reconfiguration of a running layer): whatever of its history the new rules can
    /// use. Asked when the previous state is of this policy's [`Endpoint`](Self::Endpoint) type
    /// (the policy replaced was of this type, or of another with the same state type); otherwise
    /// the endpoint starts afresh ([`new_endpoint`](Self::new_endpoint)). The default starts afresh. A state
    /// that gates readiness must not carry over a probe in flight: its answer goes to
    /// `previous`.
    fn new_endpoint_from(&self, previous: &Self::Endpoint, now: Nanos) -> Self::Endpoint {
        let _ = (previous, now);
        self.new_endpoint()
    }

    /// Whether the policy judges at all. A reconfiguration that turns a policy off re-admits the
    /// endpoints it had ejected. Default: on.
    fn enabled(&self) -> bool {
        true
    }

    /// When an endpoint this policy ejected is checked for recovery.
    fn recovery(&self) -> RecoverySchedule;

    /// How long a passively re-admitted endpoint stays on trial: if it is judged an outlier again
    /// within this time the failed check counts, otherwise the endpoint has recovered.
    fn trial_period(&self) -> Duration;

    /// The ejection budget this policy asks for, if it has an opinion. The layer uses the first
    /// policy's budget unless it is given one explicitly.
    fn budget(&self) -> Option<EjectionBudget> {
        None
    }

    /// What the layer does when this policy's system would leave no endpoint to pick, if it has
    /// an opinion. The layer uses the first policy's unless it is given one explicitly, and keeps
    /// the last endpoint when no policy says.
    fn when_all_out(&self) -> Option<WhenAllOut> {
        None
    }

    /// The capability to judge endpoints against each other on a timer (a service average), for
    /// a policy that implements [`FleetPolicy`]: return `Some(self)`. `None` (the default): the
    /// policy judges each endpoint on its own.
    fn fleet(&self) -> Option<&dyn FleetPolicy<State = Self::Endpoint>> {
        None
    }

    /// Whether an endpoint is judged on every call to its host, across the layers that share
    /// hosts (HSF's `ipDimension`): a layer that shares hosts then keeps one state of this
    /// policy per host, which its endpoints on that host and those of the other sharing layers
    /// record into and are judged by. Default: each endpoint on its own calls.
    fn judges_by_host(&self) -> bool {
        false
    }
}

/// A policy's state for one endpoint.
pub trait EndpointPolicy: std::any::Any + fmt::Debug + Send + Sync {
    /// Records one finished call. Called on the hot path: must not lock, allocate or block.
    ///
    /// Not called for the successes the endpoint's record counts itself in the state's
    /// [`shared_window`](Self::shared_window), if it has one (see [`SharedWindow`] for who counts
    /// what); every call that does come here is the state's to count.
    fn record(&self, observation: &Observation, now: Nanos) -> Signal;

    /// Judges the endpoint now. Cold path: called when a record signalled, or on a timer.
    fn judge(&self, now: Nanos) -> Judgement;

    /// What this state shows of the endpoint now: its window's counts, its state in the words of
    /// the system it follows, its weight. Cold path: snapshots, metrics, the end of a trial.
    fn describe(&self, now: Nanos) -> Description;

    /// Forgets the recorded history: the endpoint is re-admitted and is judged only on what
    /// happens from now on.
    fn reset(&self);

    /// The capability to ask for calls, for a policy that needs a number of them to decide
    /// (see [`CallsNeeded`]). `None`, the default: the policy judges on whatever calls come.
    fn calls_needed(&self) -> Option<&dyn CallsNeeded> {
        None
    }

    /// The capability to time its own ejections, for a policy that holds an endpoint out on a
    /// clock of its own, as a breaker does (see [`OwnTiming`]). `None`, the default: the
    /// policy's [`RecoverySchedule`] decides.
    fn own_timing(&self) -> Option<&dyn OwnTiming> {
        None
    }

    /// A window this state shares with the endpoint's record, so that the record counts a
    /// success in it directly, without calling [`record`](Self::record), while the state is not
    /// [`watching`](SharedWindow::watching) (see [`SharedWindow`] for who counts what). `None`,
    /// the default: every call goes to `record`. Asked once, when the record is created.
    ///
    /// A success the record counts itself never reaches the state, so it cannot signal: a state
    /// must be watching whenever a success could matter to it.
    fn shared_window(&self) -> Option<Arc<SharedWindow>> {
        None
    }

    /// The capability to gate the endpoint's readiness, for a policy that admits its own probe
    /// through real traffic (a half-open breaker lets exactly one call through). `None`, the
    /// default: the policy never holds a call back. Asked once, when the endpoint is created.
    fn gate(&self) -> Option<&dyn ProbeGate> {
        None
    }

    /// Whether the state hears what the endpoint's server says of itself ([`hear`](Self::hear)).
    /// `false`, the default: it is never told. Asked once, when the record is created; a layer
    /// none of whose states hear reads no load report from responses.
    fn hears(&self) -> bool {
        false
    }

    /// What the endpoint's server said at `now`, for a state that [`hears`](Self::hears) (a
    /// policy weighting endpoints by their load reports). Cold path for most signals; a load
    /// report may come with every call, and must then be read without locking or allocating.
    fn hear(&self, signal: &crate::ServerSignal<'_>, now: Nanos) {
        let _ = (signal, now);
    }

    /// What each member shows of the endpoint, for a state made of other policies' states
    /// ([`ComposedPolicy`](crate::ComposedPolicy)): their names and descriptions, in order.
    /// Empty (the default) for any other. Cold path: snapshots.
    fn members(&self, now: Nanos) -> Vec<(&'static str, Description)> {
        let _ = now;
        Vec::new()
    }
}

/// What a policy that needs a number of calls to decide adds to [`EndpointPolicy`] (see
/// [`EndpointPolicy::calls_needed`]).
pub trait CallsNeeded: Send + Sync {
    /// How many more calls this policy needs before it can judge an endpoint that already looks
    /// like an outlier (every call so far failed, say) but whose window is short of the minimum.
    /// 0 when it does not look like an outlier or has the calls it needs.
    ///
    /// A balancer that prefers fast endpoints starves one whose calls time out, so without help
    /// its window never reaches the minimum and it is never judged. The endpoint's `Load` reports
    /// itself idle until this many calls are in flight, which sends it exactly the calls needed
    /// for a judgement and no more. Asked only while the endpoint's last call failed (cold path).
    fn calls_wanted(&self, now: Nanos) -> u64;

    /// How many calls a passive trial of an endpoint this policy ejected must see before it can
    /// pass: a re-admitted endpoint that received fewer has shown nothing, so its trial goes on.
    /// The layer adds up the counts [`EndpointPolicy::describe`] shows at the end of each trial
    /// period. 0 (the default) for policies that decide recovery in their own way.
    fn trial_calls(&self) -> u64 {
        0
    }
}

/// What a policy that times its own ejections adds to [`EndpointPolicy`] (see
/// [`EndpointPolicy::own_timing`]).
pub trait OwnTiming: Send + Sync {
    /// When the endpoint may next be checked, if this state decides it itself: a breaker knows
    /// when its open duration ends, and the layer's recovery check should come then, not one
    /// schedule step after the ejection (which may have come later, when the budget allowed).
    /// Asked exactly once each time this policy ejects the endpoint, at `now`, so a policy that
    /// counts ejections (a growing ejection time) may count here. `None`: the policy's
    /// [`RecoverySchedule`] decides.
    fn check_at(&self, now: Nanos) -> Option<Nanos>;

    /// [`check_at`](Self::check_at) for an ejection after `failed_checks` failed recovery checks
    /// in a row (a relapse on trial), which the layer asks instead: for a state that times its
    /// ejections from its members' schedules ([`ComposedPolicy`](crate::ComposedPolicy)). The
    /// default ignores the count.
    fn check_at_after(&self, failed_checks: u32, now: Nanos) -> Option<Nanos> {
        let _ = failed_checks;
        self.check_at(now)
    }

    /// When the endpoint may next be checked after its recovery check (a probe) failed, the
    /// `failed_checks`-th in a row, if this state decides it itself. `None` (the default): the
    /// ejecting policy's [`RecoverySchedule`] decides.
    fn check_after_failed_probe(&self, failed_checks: u32, now: Nanos) -> Option<Nanos> {
        let _ = (failed_checks, now);
        None
    }

    /// The layer judged the endpoint an outlier (by this policy or another) but kept it in
    /// rotation: the budget was spent, or it is the last endpoint. A state holding calls back
    /// until the layer acts releases them here. Cold path; the default does nothing.
    fn ejection_refused(&self, now: Nanos) {
        let _ = now;
    }

    /// An operator reset the endpoint's back-off: a policy that lengthens its ejections with
    /// each one (an ejection multiplier) starts again from its base time. Cold path; the default
    /// does nothing.
    fn reset_backoff(&self) {}
}

/// What a policy's state shows of its endpoint ([`EndpointPolicy::describe`]).
///
/// ```
/// use tower_outlier_core::{Description, WindowCounts};
///
/// let shown = Description {
///     counts: WindowCounts { calls: 10, failures: 6, slow: 0 },
///     state: Some("OPEN"),
///     ..Description::default()
/// };
/// assert_eq!(shown.weight, None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Description {
    /// The counts the policy's window holds now.
    pub counts: WindowCounts,
    /// The state the policy holds the endpoint in, in the words of the system it follows (a
    /// breaker's `"CLOSED"`, `"OPEN"`, `"HALF_OPEN"`); `None` for policies without such a state.
    pub state: Option<&'static str>,
    /// The endpoint's weight, for a policy that weights endpoints.
    pub weight: Option<Weighting>,
    /// What the policy judges the endpoint on now, when that is not the counts' failure rate (a
    /// streak of failures): so a page shows the value the rule compares, not a rate the rule
    /// never reads.
    pub judged: Option<Judged>,
}

/// The value a policy compares with its threshold for one endpoint, now: a streak's length
/// against the streak that ejects.
///
/// ```
/// use tower_outlier_core::Judged;
///
/// let streak = Judged { measure: "consecutive failures", value: 2.0, threshold: 3.0 };
/// assert_eq!(streak.to_string(), "consecutive failures 2 (ejects at 3)");
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Judged {
    /// What is measured, in the words of the policy's reasons (`Reason::measure`).
    pub measure: &'static str,
    /// Its value now.
    pub value: f64,
    /// The value at which the rule acts.
    pub threshold: f64,
}

impl fmt::Display for Judged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (ejects at {})",
            self.measure,
            Shown(self.value),
            Shown(self.threshold)
        )
    }
}

/// An endpoint's weight as a weighting policy holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Weighting {
    /// The absolute weight (the policy's full weight when the endpoint is not degraded).
    pub weight: f64,
    /// Whether the policy has degraded the endpoint's weight.
    pub degraded: bool,
}

/// A readiness gate: what a policy that probes through real traffic adds to [`EndpointPolicy`]
/// (see [`EndpointPolicy::gate`]).
pub trait ProbeGate: Send + Sync {
    /// Asked by the endpoint's `poll_ready` before every call.
    ///
    /// `armed` says whether this endpoint handle already holds this gate's probe permit (from an
    /// earlier `Ready(Admit::Probe)` whose call has not been made yet). Return
    /// `Ready(Admit::Probe)` to hand the next call the single probe permit, `Ready(Admit::Call)`
    /// for an ordinary call, or `Pending` (with `cx`'s waker registered) while another probe is in
    /// flight.
    ///
    /// `clock` is there to read only when the answer depends on the time: this runs before every
    /// call, and most states do not need it.
    fn poll_admit(&self, armed: bool, clock: &Clock, cx: &mut Context<'_>) -> Poll<Admit>;

    /// Records the completion of the call that held this gate's probe permit, instead of
    /// [`EndpointPolicy::record`]. Hot path: no lock, no allocation.
    fn record_probe(&self, observation: &Observation, now: Nanos) -> Signal;

    /// The probe permit was given up without a completed call (the future or the endpoint handle
    /// was dropped).
    fn probe_cancelled(&self, now: Nanos);
}

/// What a readiness gate grants the next call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// An ordinary call.
    Call,
    /// The gate's single probe: its completion goes to [`ProbeGate::record_probe`].
    Probe,
}

/// What a record asks of the layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Nothing to do.
    None,
    /// A threshold may have been crossed: wake the layer so it judges this endpoint now.
    Evaluate,
}

/// A policy's judgement of one endpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum Judgement {
    /// Not an outlier (or not enough data to say).
    Healthy,
    /// An outlier that should be ejected.
    Outlier(Reason),
}

/// Why a policy judged an endpoint an outlier.
///
/// ```
/// use tower_outlier_core::{Comparison, Reason, WindowCounts};
///
/// let streak = Reason {
///     policy: "recommended",
///     measure: "consecutive 5xx",
///     value: 3.0,
///     threshold: 3.0,
///     comparison: Comparison::AtOrAbove,
///     counts: WindowCounts { calls: 3, failures: 3, slow: 0 },
/// };
/// assert_eq!(
///     streak.to_string(),
///     "consecutive 5xx 3, at or above its threshold 3 (3 calls: 3 failed, 0 slow)"
/// );
/// ```
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Reason {
    /// The policy's name.
    pub policy: &'static str,
    /// What was measured, in words (`"error rate"`).
    pub measure: &'static str,
    /// The measured value (for example 0.6).
    pub value: f64,
    /// The threshold it was compared with (for example 0.5).
    pub threshold: f64,
    /// How the value was compared with the threshold: the rule, in the words shown.
    pub comparison: Comparison,
    /// The window's counts at the time of the judgement.
    pub counts: WindowCounts,
}

/// How a [`Reason`]'s value crossed its threshold: each rule says it as its system does (EDAS's
/// error rate is strictly above its threshold, Envoy's failure percentage at or above, a success
/// rate below). [`Said`](Self::Said) is a reason with no measure: a server's, an operator's or a
/// probe's word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Comparison {
    /// The value is strictly above the threshold.
    Above,
    /// The value is at or above the threshold.
    AtOrAbove,
    /// The value is strictly below the threshold.
    Below,
    /// The value is at or below the threshold.
    AtOrBelow,
    /// No measure was compared: the reason is what someone said.
    Said,
}

impl Comparison {
    /// The words between the value and the threshold (`"at or above"`).
    pub fn words(self) -> &'static str {
        match self {
            Comparison::Above => "above",
            Comparison::AtOrAbove => "at or above",
            Comparison::Below => "below",
            Comparison::AtOrBelow => "at or below",
            Comparison::Said => "said",
        }
    }
}

/// A number as a reason shows it: whole numbers (a streak, a count) without decimals.
struct Shown(f64);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.fract() == 0.0 && self.0.abs() < 1e15 {
            write!(f, "{}", self.0 as i64)
        } else {
            write!(f, "{:.3}", self.0)
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.comparison == Comparison::Said {
            // A value of its own (the seconds a server asked for) follows its words.
            f.write_str(self.measure)?;
            if self.value != 1.0 {
                write!(f, " {}", Shown(self.value))?;
            }
            return Ok(());
        }
        write!(
            f,
            "{} {}, {} its threshold {} ({} calls: {} failed, {} slow)",
            self.measure,
            Shown(self.value),
            self.comparison.words(),
            Shown(self.threshold),
            self.counts.calls,
            self.counts.failures,
            self.counts.slow
        )
    }
}

mod budget;
pub use budget::*;

mod fleet;
pub use fleet::*;

mod erased;
pub use erased::DynOutlierPolicy;

#[cfg(test)]
mod tests;
