//! Several policies judged as one: an endpoint is an outlier when any, all, or at least `k` of
//! them say so, out for the longest of their times.
//!
//! A layer given several policies (`with_policy`) ejects on the first that judges an endpoint an
//! outlier: that is [`ComposedPolicy::any_of`] with each member's own back-off. Composing them
//! into one policy adds the other rules (all of them must agree, or `k` of them), and Finagle's
//! timing: when several members judge the endpoint at once, the longest of their ejection times
//! wins.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{duration_to_nanos, Nanos};
use crate::error::ConfigError;
use crate::policy::{
    DynOutlierPolicy, EjectionBudget, EndpointPolicy, FleetMember, FleetPolicy, OutlierPolicy,
    RecoverySchedule, WhenAllOut,
};

/// The most members one composition holds (the members that judged an endpoint are kept as the
/// bits of one word).
const MAX_MEMBERS: usize = 64;

/// How many members must judge an endpoint an outlier for the composition to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// Any one of them (OR).
    Any,
    /// Every one of them (AND).
    All,
    /// At least this many of them (k of n).
    AtLeast(usize),
}

impl Agreement {
    fn needed(self, members: usize) -> usize {
        match self {
            Agreement::Any => 1,
            Agreement::All => members,
            Agreement::AtLeast(k) => k,
        }
    }
}

/// Policies judged as one ([`any_of`](Self::any_of), [`all_of`](Self::all_of),
/// [`at_least`](Self::at_least)).
///
/// * **Judgement.** An endpoint is an outlier when the [`Agreement`]'s number of members judge it
///   one at the same time (a member's judgement stands from the call or evaluation that made it
///   until the layer acts on it, the member's own state changes, or its next evaluation). The reason given is the first such member's (in the order they were
///   added), under that member's name, so events and metrics name the member; the snapshot shows
///   every member's counts and state under the composition
///   ([`EndpointPolicy::members`]).
/// * **Ejection time.** Each member that judged the endpoint an outlier when it was ejected
///   proposes its own time out (its own timing, such as a breaker's or an equal-jitter back-off,
///   or its recovery schedule after as many failed checks); the longest wins, as in Finagle's
///   `orElse`. After a failed recovery check the same members propose again, and the longest
///   wins again.
/// * **Calls.** Every member records every call. A member that asks for calls to decide gets the
///   most any member asks for; a passive trial needs the most calls any member needs, counted on
///   the member that saw the most.
/// * **Fleet members.** A member that judges endpoints against each other on a timer (a latency
///   rule, weights from load reports) is evaluated on its own interval.
/// * **Budget, all-out rule, trial.** The first member's budget and all-out rule that has one,
///   the longest trial period.
/// * **Readiness gates.** At most one member may gate readiness (a half-open breaker): two gates
///   would each hold calls the other never sees.
/// * **Limits.** A member judging on a timer asks for no calls: under [`all_of`](Self::all_of),
///   an endpoint the balancer starves (slow and failing, say) may never get the calls such a
///   member needs to judge it, and stays in, avoided by its load. The snapshot shows one level of
///   members: a composition nested in another shows as one member.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::{
///     ComposedPolicy, Description, EndpointPolicy, Judgement, Nanos, Observation,
///     OutlierPolicy, Reason, RecoverySchedule, Signal,
/// };
///
/// // A policy that judges every endpoint an outlier, out for `secs` seconds.
/// #[derive(Debug)]
/// struct Always(&'static str, u64);
/// #[derive(Debug)]
/// struct Judged(&'static str);
/// impl EndpointPolicy for Judged {
///     fn record(&self, _: &Observation, _: Nanos) -> Signal { Signal::None }
///     fn judge(&self, _: Nanos) -> Judgement {
///         Judgement::Outlier(Reason {
///             policy: self.0, measure: "always", value: 1.0, threshold: 0.0,
///             comparison: tower_outlier_core::Comparison::AtOrAbove,
///             counts: Default::default(),
///         })
///     }
///     fn describe(&self, _: Nanos) -> Description { Description::default() }
///     fn reset(&self) {}
/// }
/// impl OutlierPolicy for Always {
///     type Endpoint = Judged;
///     fn name(&self) -> &'static str { self.0 }
///     fn new_endpoint(&self) -> Judged { Judged(self.0) }
///     fn recovery(&self) -> RecoverySchedule {
///         RecoverySchedule::fixed(Duration::from_secs(self.1))
///     }
///     fn trial_period(&self) -> Duration { Duration::from_secs(1) }
/// }
///
/// let both = ComposedPolicy::all_of()
///     .member(Always("short", 5))
///     .member(Always("long", 30))
///     .build()?;
/// let endpoint = both.new_endpoint();
/// let Judgement::Outlier(reason) = endpoint.judge(0) else { unreachable!() };
/// assert_eq!(reason.policy, "short", "the first member's reason");
/// // Out for the longer of the two.
/// let timing = endpoint.own_timing().unwrap();
/// assert_eq!(timing.check_at(0), Some(30_000_000_000));
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
pub struct ComposedPolicy {
    name: &'static str,
    agreement: Agreement,
    members: Arc<[Arc<dyn DynOutlierPolicy>]>,
    // The members' recovery schedules, in order (each endpoint's state times its ejections by them).
    schedules: Arc<[RecoverySchedule]>,
    // The member whose states gate readiness, if one does.
    gate: Option<usize>,
    // Fleet members: each one's index, interval, and when it is next due (on the record's clock).
    fleet: Box<[FleetMemberDue]>,
}

struct FleetMemberDue {
    index: usize,
    every: Nanos,
    next: AtomicU64,
}

impl fmt::Debug for ComposedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComposedPolicy")
            .field("name", &self.name)
            .field("agreement", &self.agreement)
            .field("members", &self.members)
            .finish()
    }
}

/// Builds a [`ComposedPolicy`]: its members, in order, and its name.
#[derive(Debug)]
pub struct ComposedPolicyBuilder {
    name: &'static str,
    agreement: Agreement,
    members: Vec<Arc<dyn DynOutlierPolicy>>,
}

impl ComposedPolicy {
    /// An endpoint is an outlier when any member judges it one (named `"any-of"`).
    pub fn any_of() -> ComposedPolicyBuilder {
        ComposedPolicyBuilder::new("any-of", Agreement::Any)
    }

    /// An endpoint is an outlier when every member judges it one at once (named `"all-of"`).
    pub fn all_of() -> ComposedPolicyBuilder {
        ComposedPolicyBuilder::new("all-of", Agreement::All)
    }

    /// An endpoint is an outlier when at least `k` members judge it one at once (named
    /// `"k-of-n"`); `k` must lie in `1..=n`.
    pub fn at_least(k: usize) -> ComposedPolicyBuilder {
        ComposedPolicyBuilder::new("k-of-n", Agreement::AtLeast(k))
    }

    /// How many members must agree.
    pub fn agreement(&self) -> Agreement {
        self.agreement
    }

    /// The members, in order.
    pub fn members(&self) -> &[Arc<dyn DynOutlierPolicy>] {
        &self.members
    }
}

impl ComposedPolicyBuilder {
    fn new(name: &'static str, agreement: Agreement) -> Self {
        ComposedPolicyBuilder {
            name,
            agreement,
            members: Vec::new(),
        }
    }

    /// Adds a member.
    pub fn member<P: OutlierPolicy>(self, policy: P) -> Self {
        self.member_shared(<dyn DynOutlierPolicy>::from_policy(policy))
    }

    /// Adds a member a layer or another composition already holds.
    pub fn member_shared(mut self, policy: Arc<dyn DynOutlierPolicy>) -> Self {
        self.members.push(policy);
        self
    }

    /// The name the composition goes by in logs and snapshots (its members keep theirs).
    pub fn name(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// The composition; an error without members, with more than 64, with `k` outside `1..=n`,
    /// or with more than one member whose states gate readiness.
    pub fn build(self) -> Result<ComposedPolicy, ConfigError> {
        let n = self.members.len();
        if n == 0 {
            return Err(ConfigError::new("members", 0, "at least 1"));
        }
        if n > MAX_MEMBERS {
            return Err(ConfigError::new("members", n, "at most 64"));
        }
        if let Agreement::AtLeast(k) = self.agreement {
            if k == 0 || k > n {
                return Err(ConfigError::new(
                    "at_least",
                    k,
                    format!("1 to {n}, the members"),
                ));
            }
        }
        let gates: Vec<usize> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, member)| member.new_endpoint().gate().is_some())
            .map(|(index, _)| index)
            .collect();
        if gates.len() > 1 {
            return Err(ConfigError::new(
                "members",
                format!("{} that gate readiness", gates.len()),
                "at most 1 (a half-open breaker, say)",
            ));
        }
        let schedules: Arc<[RecoverySchedule]> =
            self.members.iter().map(|m| m.recovery()).collect();
        let fleet = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(index, member)| {
                let every = duration_to_nanos(member.fleet_interval()?).max(1);
                Some(FleetMemberDue {
                    index,
                    every,
                    next: AtomicU64::new(0),
                })
            })
            .collect();
        Ok(ComposedPolicy {
            name: self.name,
            agreement: self.agreement,
            members: self.members.into(),
            schedules,
            gate: gates.first().copied(),
            fleet,
        })
    }
}

impl OutlierPolicy for ComposedPolicy {
    type Endpoint = ComposedEndpoint;

    fn name(&self) -> &'static str {
        self.name
    }

    fn new_endpoint(&self) -> ComposedEndpoint {
        self.endpoint(self.members.iter().map(|m| m.new_endpoint()).collect())
    }

    fn new_endpoint_from(&self, previous: &ComposedEndpoint, now: Nanos) -> ComposedEndpoint {
        // Member by member, where the previous composition had one at the same place.
        let states = self
            .members
            .iter()
            .enumerate()
            .map(|(index, member)| match previous.states.get(index) {
                Some(state) => member.new_endpoint_from(&**state, now),
                None => member.new_endpoint(),
            })
            .collect();
        let next = self.endpoint(states);
        // The members that judged it an outlier still time its checks (it may be out now).
        if previous.states.len() == next.states.len() {
            next.judged
                .store(previous.judged.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        next
    }

    fn enabled(&self) -> bool {
        self.members.iter().any(|m| m.enabled())
    }

    fn recovery(&self) -> RecoverySchedule {
        // For the layer's probe timeout (one unit): the longest unit. The checks themselves are
        // timed by the endpoint's state, from the members that judged it.
        self.schedules
            .iter()
            .copied()
            .max_by_key(|schedule| schedule.unit())
            .unwrap_or_else(|| RecoverySchedule::fixed(Duration::from_secs(10)))
    }

    fn trial_period(&self) -> Duration {
        self.members
            .iter()
            .map(|m| m.trial_period())
            .max()
            .unwrap_or_default()
    }

    fn budget(&self) -> Option<EjectionBudget> {
        self.members.iter().find_map(|m| m.budget())
    }

    fn when_all_out(&self) -> Option<WhenAllOut> {
        self.members.iter().find_map(|m| m.when_all_out())
    }

    fn fleet(&self) -> Option<&dyn FleetPolicy<State = ComposedEndpoint>> {
        if self.fleet.is_empty() {
            None
        } else {
            Some(self)
        }
    }
}

impl ComposedPolicy {
    fn endpoint(&self, states: Box<[Box<dyn EndpointPolicy>]>) -> ComposedEndpoint {
        ComposedEndpoint {
            names: self.members.iter().map(|m| m.name()).collect(),
            needed: self.agreement.needed(self.members.len()),
            schedules: self.schedules.clone(),
            gate: self.gate,
            asks_calls: states.iter().any(|s| s.calls_needed().is_some()),
            judged: AtomicU64::new(0),
            states,
        }
    }
}

impl FleetPolicy for ComposedPolicy {
    type State = ComposedEndpoint;

    fn interval(&self) -> Duration {
        let every = self.fleet.iter().map(|due| due.every).min().unwrap_or(1);
        Duration::from_nanos(every)
    }

    fn started(&self, at: Nanos) {
        for due in self.fleet.iter() {
            due.next
                .store(at.saturating_add(due.every), Ordering::Relaxed);
            self.members[due.index].fleet_started(at);
        }
    }

    fn counts_in_flight(&self) -> bool {
        self.fleet
            .iter()
            .any(|due| self.members[due.index].fleet_counts_in_flight())
    }

    fn evaluate(&self, fleet: &[FleetMember<'_, ComposedEndpoint>], now: Nanos) {
        for due in self.fleet.iter() {
            // Each fleet member on its own interval: the composition's is the shortest.
            if due.next.load(Ordering::Relaxed) > now {
                continue;
            }
            due.next
                .store(now.saturating_add(due.every), Ordering::Relaxed);
            let members: Vec<FleetMember<'_, dyn EndpointPolicy>> = fleet
                .iter()
                .filter_map(|member| {
                    Some(FleetMember {
                        key: member.key,
                        state: &**member.state.states.get(due.index)?,
                        record: member.record,
                        available: member.available,
                        in_flight: member.in_flight,
                        waited: member.waited,
                    })
                })
                .collect();
            self.members[due.index].evaluate_fleet(&members, now);
        }
    }
}

mod endpoint;
pub use endpoint::ComposedEndpoint;

#[cfg(test)]
mod tests;
