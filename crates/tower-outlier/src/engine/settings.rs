//! What an engine runs by: the policies and budget of one version of the rules, and the
//! schedules derived from them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_outlier_core::{
    duration_to_nanos, BudgetFloor, Clock, DynOutlierPolicy, EjectionBudget, SlowStart, WhenAllOut,
};

use super::later;
use crate::hosts::{HostOf, HostRegistry};
use crate::probe::ProbeCadence;
use crate::reconfigure::RulesCell;

/// The longest a server's pushback keeps its endpoint out by default: linkerd's cap.
pub(crate) const DEFAULT_MAX_PUSHBACK: Duration = Duration::from_secs(300);

/// The budget of a layer given none whose rules bring none: EDAS's 20 %, at least one.
pub(crate) const DEFAULT_BUDGET: EjectionBudget =
    match EjectionBudget::const_new(0.2, BudgetFloor::One) {
        Some(b) => b,
        None => unreachable!(),
    };

pub(crate) struct Settings {
    pub(crate) policies: Arc<[Arc<dyn DynOutlierPolicy>]>,
    pub(crate) budget: EjectionBudget,
    // The budget the layer was given, if any: otherwise each version of the rules brings its own.
    pub(crate) explicit_budget: Option<EjectionBudget>,
    // What the layer does when the rules would leave no endpoint to pick, and the choice the
    // layer was given, if any (otherwise the first policy's that has one).
    pub(crate) all_out: WhenAllOut,
    pub(crate) explicit_all_out: Option<WhenAllOut>,
    // The longest a server's pushback keeps its endpoint out (zero: pushback is ignored).
    pub(crate) max_pushback: Duration,
    // How a joining or re-admitted endpoint's share ramps up, if it does (set by the layer).
    pub(crate) slow_start: Option<SlowStart>,
    // How long a server's word that its endpoint is degraded holds (zero: not read; set by the
    // layer).
    pub(crate) degraded_hold: Duration,
    // When the active probe's checks run (set by the layer).
    pub(crate) cadence: ProbeCadence,
    pub(crate) clock: Clock,
    pub(crate) rules: Arc<RulesCell>,
    // The version of the rules these settings hold.
    pub(crate) version: u64,
    // HSF's ipDimension: the registry of hosts this layer shares, and how keys map to hosts.
    pub(crate) hosts: Option<(HostRegistry, HostOf)>,
}

impl Settings {
    /// The settings for the newest rules of `cell`.
    pub(crate) fn new(
        cell: &Arc<RulesCell>,
        explicit_budget: Option<EjectionBudget>,
        explicit_all_out: Option<WhenAllOut>,
        max_pushback: Duration,
        clock: Clock,
        hosts: Option<(HostRegistry, HostOf)>,
    ) -> Self {
        let rules = cell.current();
        let budget = explicit_budget.unwrap_or_else(|| {
            rules
                .policies
                .iter()
                .find_map(|p| p.budget())
                .unwrap_or(DEFAULT_BUDGET)
        });
        let all_out = explicit_all_out.unwrap_or_else(|| {
            rules
                .policies
                .iter()
                .find_map(|p| p.when_all_out())
                .unwrap_or_default()
        });
        Settings {
            policies: rules.policies.clone(),
            budget,
            explicit_budget,
            all_out,
            explicit_all_out,
            max_pushback,
            slow_start: None,
            degraded_hold: Duration::ZERO,
            cadence: ProbeCadence::new(),
            clock,
            rules: cell.clone(),
            version: rules.version,
            hosts,
        }
    }
}

/// The longest trial period of `policies`, at least a millisecond: a zero trial would extend
/// itself without end in one poll.
pub(super) fn trial_period(policies: &[Arc<dyn DynOutlierPolicy>]) -> Duration {
    policies
        .iter()
        .map(|p| p.trial_period())
        .max()
        .unwrap_or(Duration::from_secs(10))
        .max(Duration::from_millis(1))
}

/// The fleet evaluations of `policies`: a policy whose interval is unchanged from `previous`
/// keeps its next evaluation, any other starts a full interval after `now` (`now_nanos` on the
/// layer's clock), and is told so ([`FleetPolicy::started`](tower_outlier_core::FleetPolicy::started)).
pub(super) fn fleet_schedules(
    policies: &[Arc<dyn DynOutlierPolicy>],
    now: Instant,
    now_nanos: tower_outlier_core::Nanos,
    previous: &[FleetSchedule],
) -> Vec<FleetSchedule> {
    policies
        .iter()
        .enumerate()
        .filter_map(|(policy, p)| {
            let every = p.fleet_interval()?;
            if every.is_zero() {
                return None;
            }
            let next = match previous
                .iter()
                .find(|s| s.policy == policy && s.every == every)
            {
                Some(kept) => {
                    // The policy may be a new one under the same interval: it is told where the
                    // kept series stands (its last evaluation, or its start).
                    let last = kept.next.checked_sub(every).unwrap_or(now);
                    let ago = now.saturating_duration_since(last);
                    p.fleet_started(now_nanos.saturating_sub(duration_to_nanos(ago)));
                    kept.next
                }
                None => {
                    p.fleet_started(now_nanos);
                    later(now, every)
                }
            };
            Some(FleetSchedule {
                policy,
                every,
                next,
            })
        })
        .collect()
}

#[derive(Clone, Copy)]
pub(super) struct FleetSchedule {
    pub(super) policy: usize,
    pub(super) every: Duration,
    pub(super) next: Instant,
}
