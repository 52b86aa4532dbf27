//! Doing what was decided: [`Engine::apply`] carries out a [`Verdict`] — what the record is
//! told, the refusal noted or the ejection made (its standing through
//! [`Engine::restand`](super::Engine::restand), which keeps the counts, the shared host and the
//! balancer's set in line), the monitor, events and logs. The way back in is
//! [`Engine::readmit`](super::Engine::readmit).

use std::time::Duration;

use tokio::time::Instant;
use tower_outlier_core::{Reason, RecoverySchedule};

use super::decide::{Act, Cause, Told, Verdict};
use super::{later, DiscoverKey, Ejector, Engine, Standing};
use crate::event::{Event, Refusal};

/// The base time between the checks of an endpoint taken out by its active checks, where the
/// cadence sets none: an avoided endpoint's.
const ACTIVE_CHECK_INTERVAL: Duration = super::avoided::CHECK_INTERVAL;

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Carries out `verdict` on `key`.
    pub(super) fn apply(&mut self, key: &K, verdict: Verdict, now: Instant) {
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        tell(entry.record(), verdict.told);
        let verdict = verdict.act;
        let id = entry.id;
        // Judged an outlier during its trial: a failed recovery check, whether or not the rules
        // let it be ejected again.
        let policy_judged = matches!(
            verdict,
            Act::Refuse {
                cause: Cause::Policy { .. },
                ..
            } | Act::Eject {
                cause: Cause::Policy { .. },
                ..
            }
        );
        let trial_breach = if policy_judged && matches!(entry.standing(), Standing::Trial { .. }) {
            self.restand(key, |s| s.episode().and_then(|e| e.breach_trial()))
                .flatten()
        } else {
            None
        };
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        let shadow = entry.is_shadow();
        if let Some(failed_checks) = trial_breach {
            self.emit_for(id, shadow, |key| Event::TrialFailed { key, failed_checks });
        }
        match verdict {
            Act::Keep => {
                if self.refused.remove(&id).is_some() {
                    self.registry.refused(self.roster, id, None);
                }
            }
            Act::Refuse {
                cause:
                    cause @ (Cause::Policy { .. }
                    | Cause::Operator
                    | Cause::Pushback { .. }
                    | Cause::Health
                    | Cause::ActiveCheck { .. }),
                reason,
                refusal,
            } => {
                let dry = self.cause_is_dry(cause);
                self.refuse(key, id, reason, refusal, trial_breach.is_some(), dry);
            }
            Act::Refuse {
                cause: Cause::Host,
                reason,
                refusal,
            } => self.refuse_for_host(key, id, reason, refusal),
            Act::Eject { cause, reason } => {
                self.eject(key, id, cause, reason, now);
                // The rules took the last endpoint (failing fast): one a signal or an operator
                // holds out comes back, as neither may leave the balancer nothing.
                if self.available() == 0 {
                    self.enforce_budget(now);
                }
            }
        }
    }

    /// A policy's outlier kept in: the policies are told (a breaker that would open stays
    /// closed), the monitor shows why, and the refusal is logged and emitted once per episode.
    fn refuse(
        &mut self,
        key: &K,
        id: u64,
        reason: Reason,
        refusal: Refusal,
        trial_breach: bool,
        dry: bool,
    ) {
        let n = self.entries.len();
        let max = self.settings.budget.max_ejected(n);
        let ratio = self.settings.budget.max_ratio() * 100.0;
        let why = match refusal {
            Refusal::LastEndpoint if reason.policy == super::controls::OPERATOR => {
                "forced out by an operator, kept in: last available endpoint".to_owned()
            }
            Refusal::LastEndpoint => "last available endpoint".to_owned(),
            Refusal::ForcedIn => "forced in by an operator".to_owned(),
            _ if max == 0 => format!("ejection budget of 0 for {n} endpoints at {ratio:.0} %"),
            _ => format!("ejection budget of {max} for {n} endpoints at {ratio:.0} % is spent"),
        };
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        let record = entry.record();
        let recorded_now = record.clock().now();
        // A policy's verdict: the policies learn it was kept in (not for an operator's or a
        // server's request, which no policy made).
        let policies_judged = reason.policy != super::controls::OPERATOR
            && reason.policy != super::controls::PUSHBACK
            && reason.policy != super::controls::HEALTH
            && reason.policy != super::controls::ACTIVE_CHECK;
        for timing in record
            .policies()
            .iter()
            .filter_map(|state| state.own_timing())
            .filter(|_| policies_judged)
        {
            timing.ejection_refused(recorded_now);
        }
        let first = !self.refused.contains_key(&id);
        if first {
            tracing::info!(
                target: "tower_outlier",
                endpoint = ?key,
                reason = %reason,
                measure = reason.measure,
                value = reason.value,
                ejected = self.ejected,
                budget = max,
                endpoints = n,
                "ejection refused: {why}"
            );
        }
        // Said again when the cause changes (the budget, then the last endpoint).
        let shown = if dry { format!("dry run: {why}") } else { why };
        self.registry.refused(self.roster, id, Some(shown));
        if first {
            let event_reason = reason.clone();
            self.emit_for(id, dry, |key| Event::EjectionRefused {
                key,
                reason: event_reason,
                refusal,
            });
            self.refused.insert(id, key.clone());
        }
        if trial_breach {
            let trial_until = entry.standing().deadline();
            self.publish(key, trial_until, Some(reason));
        }
    }

    /// An endpoint on a host held out elsewhere, kept in until there is room here: emitted once
    /// per outage of the host, retried when room appears.
    fn refuse_for_host(&mut self, key: &K, id: u64, reason: Reason, refusal: Refusal) {
        self.mirror_pending = true;
        if !self.mirror_refused.insert(id) {
            return;
        }
        tracing::info!(
            target: "tower_outlier",
            endpoint = ?key,
            host = ?self.sharing.as_ref().and_then(|s| s.hosts.get(&id)),
            ejected = self.ejected,
            budget = self.settings.budget.max_ejected(self.entries.len()),
            "host ejected in another service, kept in until there is room to eject here"
        );
        self.registry
            .emit_about(self.roster, id, |key| Event::EjectionRefused {
                key,
                reason,
                refusal,
            });
    }

    /// Takes `key` out of the balancer's set for `cause`, or, for a policy in dry run, holds it
    /// out only as the rules would (it stays in the set).
    fn eject(&mut self, key: &K, id: u64, cause: Cause, reason: Reason, now: Instant) {
        let shadow = self.cause_is_dry(cause);
        if self.refused.remove(&id).is_some() {
            self.registry.refused(self.roster, id, None);
        }
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        // Out in dry run until now: that ejection ends here, for one that is real.
        let was_shadow_out = entry.is_shadow_out();
        if was_shadow_out && matches!(entry.standing(), Standing::Probing) {
            self.cancelled.push(id);
        }
        // Counted after a trial's breach: the check after a failed one comes later.
        let failed_checks = entry.failed_checks();
        let (ejector, next_check, delay) = match cause {
            Cause::Policy { index } => {
                // The ejecting state's own deadline, when it has one, owns the timing of the
                // check; otherwise the policy's recovery schedule.
                let record = entry.record();
                let recorded_now = record.clock().now();
                let timing = record.policies().get(index).and_then(|p| p.own_timing());
                // A policy that times its own ejections (the detectors, Finagle's) has its own
                // jitter settings: the cadence adds none by default.
                let policy_delay =
                    match timing.and_then(|t| t.check_at_after(failed_checks, recorded_now)) {
                        Some(at) => (Duration::from_nanos(at.saturating_sub(recorded_now)), true),
                        None => (
                            self.settings.policies[index]
                                .recovery()
                                .delay(failed_checks),
                            timing.is_some(),
                        ),
                    };
                let delay = self.first_check_after(policy_delay, failed_checks);
                if shadow {
                    // Kept in the set: a state of another policy holding calls back until the
                    // layer acts (linkerd's breaker after a failed probe) must serve them.
                    for (other, policy) in record.policies().iter().enumerate() {
                        if other != index {
                            if let Some(timing) = policy.own_timing() {
                                timing.ejection_refused(recorded_now);
                            }
                        }
                    }
                }
                (Ejector::Policy(index), Some(later(now, delay)), Some(delay))
            }
            // No check of its own: it comes back when its host does.
            Cause::Host => (Ejector::Host, None, None),
            // No check either: it comes back when released.
            Cause::Operator => (Ejector::Operator, None, None),
            // No check either: it comes back when its health service says it serves.
            Cause::Health => (Ejector::Health, None, None),
            // Checked again as the cadence times an ejected endpoint's checks: its first check,
            // then its interval (2 s each by default, as an avoided endpoint's).
            Cause::ActiveCheck { .. } => {
                let delay = self.first_check_after((ACTIVE_CHECK_INTERVAL, false), 0);
                (Ejector::ActiveCheck, Some(later(now, delay)), Some(delay))
            }
            // Back when the time the server asked for is up.
            Cause::Pushback { until } => {
                let recorded_now = entry.record().clock().now();
                let delay = Duration::from_nanos(until.saturating_sub(recorded_now));
                (Ejector::Pushback, Some(later(now, delay)), Some(delay))
            }
        };
        let schedule = match cause {
            Cause::Policy { index } => Some(self.settings.policies[index].recovery()),
            Cause::ActiveCheck { .. } => Some(RecoverySchedule::fixed(ACTIVE_CHECK_INTERVAL)),
            _ => None,
        };
        // Out of the balancer's set unless dry run or panic keeps it in (and for real, its
        // readiness no longer counts); counted, its host held out.
        self.restand(key, |s| {
            let episode = s.eject(ejector, next_check, shadow);
            if schedule.is_some() {
                episode.schedule = schedule;
            }
        });
        match cause {
            Cause::Policy { .. } if shadow => {
                tracing::info!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    policy = reason.policy,
                    reason = %reason,
                    measure = reason.measure,
                    value = reason.value,
                    failed_checks,
                    next_check_in = ?delay.unwrap_or_default(),
                    "dry run: endpoint would be ejected; it stays in the balancer's set"
                );
            }
            Cause::Policy { .. } => {
                tracing::warn!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    policy = reason.policy,
                    reason = %reason,
                    measure = reason.measure,
                    value = reason.value,
                    failed_checks,
                    next_check_in = ?delay.unwrap_or_default(),
                    "endpoint ejected"
                );
            }
            Cause::Host => {
                self.mirror_refused.remove(&id);
                tracing::warn!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    host = ?self.sharing.as_ref().and_then(|s| s.hosts.get(&id)),
                    dry_run = shadow,
                    "endpoint ejected: its host is ejected in another service"
                );
            }
            Cause::Operator => {
                tracing::warn!(target: "tower_outlier", endpoint = ?key, "endpoint forced out by an operator");
            }
            Cause::Health => {
                tracing::info!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    dry_run = shadow,
                    "endpoint out: its health service says it is not serving"
                );
            }
            Cause::ActiveCheck { failed, threshold } => {
                tracing::warn!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    failed,
                    unhealthy_threshold = threshold,
                    next_check_in = ?delay.unwrap_or_default(),
                    dry_run = shadow,
                    "endpoint out: it failed its active checks while it got no traffic"
                );
            }
            Cause::Pushback { .. } => {
                tracing::info!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    next_check_in = ?delay.unwrap_or_default(),
                    dry_run = shadow,
                    "endpoint out: its server asked to be left alone"
                );
            }
        }
        let shown_check = next_check;
        let event_reason = reason.clone();
        self.publish(key, shown_check, Some(reason));
        // After the monitor shows it: a callback reading a snapshot sees the ejection.
        self.emit_for(id, shadow, |key| Event::Ejected {
            key,
            reason: event_reason,
            next_check_in: delay,
        });
    }
}

/// Tells `record` what came with a verdict.
fn tell(record: &tower_outlier_core::EndpointRecord, told: Told) {
    if told.end_avoidance {
        record.end_avoidance();
    }
    if let Some(at_most) = told.pushback_at_most {
        record.cap_pushback(at_most);
    }
    if let Some(until) = told.avoid_until {
        record.avoid_until(until);
    }
}
