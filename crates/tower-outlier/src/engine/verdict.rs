//! Deciding and doing, apart: what the engine makes of an endpoint is a [`Verdict`], found by a
//! function that changes nothing ([`Engine::decide`] for the policies' judgement,
//! [`Engine::decide_for_host`] for a host another adaptor holds out), and carried out by the one
//! function that has effects ([`Engine::apply`]): the balancer's change, deadlines, the monitor,
//! events, shared hosts and logs. Every ejection and every refusal goes through them; the way
//! back in is [`Engine::readmit`](super::Engine::readmit).

use std::time::Duration;

use tokio::time::Instant;
use tower_outlier_core::{Judgement, Reason};

use super::{later, DiscoverKey, Ejector, Engine, Stage, Status};
use crate::controls::Override;
use crate::events::{Event, Refusal};

/// What ejects an endpoint, or would.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Cause {
    /// The layer's policy at this index judged it (`rules`, sections 2–5).
    Policy { index: usize },
    /// Another adaptor sharing its host holds the host out (HSF's ipDimension): it comes back
    /// when the host does.
    Host,
    /// An operator forced it out: it comes back when released.
    Operator,
    /// Its server asked to be left alone (`Retry-After`, gRPC's pushback) until `until`, on the
    /// record's clock: it comes back, without a trial, when the time asked is up.
    Pushback { until: tower_outlier_core::Nanos },
    /// Its health service says it is not serving: it comes back when the service says it is.
    Health,
}

/// What the engine makes of one endpoint.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// Not an outlier, or not in the balancer's set: nothing to do (a refusal noted before ends).
    Keep,
    /// An outlier the rules keep in (`rules`, section 3).
    Refuse {
        cause: Cause,
        reason: Reason,
        refusal: Refusal,
    },
    /// An outlier to take out.
    Eject { cause: Cause, reason: Reason },
}

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// The policies' verdict on `key` now (`rules`, sections 2–5): an available endpoint a
    /// policy judges an outlier is ejected if [`room`](Self::room) allows, otherwise refused. The
    /// policies that enforce are asked before those in dry run; an endpoint out only in dry run
    /// is judged by the enforcing ones. An operator's override comes before the rules.
    pub(super) fn decide(&self, key: &K) -> Verdict {
        let Some(entry) = self.entries.get(key) else {
            return Verdict::Keep;
        };
        let forced = if self.forced.is_empty() {
            None
        } else {
            self.forced.get(&entry.id).copied()
        };
        let shadow_out = entry.is_shadow_out();
        if !entry.status().is_available() && !shadow_out {
            return Verdict::Keep;
        }
        if forced == Some(Override::ForcedOut) {
            let cause = Cause::Operator;
            let reason = super::controls::operator_reason();
            // One the balancer cannot pick (unready) takes nothing from it by going.
            let pickable = usize::from(!self.unready.contains(&entry.id));
            return if self.available().saturating_sub(pickable) >= 1 {
                Verdict::Eject { cause, reason }
            } else {
                Verdict::Refuse {
                    cause,
                    reason,
                    refusal: Refusal::LastEndpoint,
                }
            };
        }
        if forced == Some(Override::ForcedIn) || self.controls.dry_run {
            // Neither an operator's force-in nor dry run lets the layer keep p2c away.
            entry.record().end_open_avoidance();
        }
        if forced != Some(Override::ForcedIn) && !shadow_out {
            if let Some(verdict) = self.health_verdict(entry) {
                return verdict;
            }
            if let Some(verdict) = self.pushback_verdict(entry) {
                return verdict;
            }
        }
        let Some((index, reason)) = self.judged(entry) else {
            return Verdict::Keep;
        };
        let cause = Cause::Policy { index };
        if forced == Some(Override::ForcedIn) {
            return Verdict::Refuse {
                cause,
                reason,
                refusal: Refusal::ForcedIn,
            };
        }
        match self.room_for(self.is_dry(index)) {
            Ok(()) => Verdict::Eject { cause, reason },
            Err(refusal) => Verdict::Refuse {
                cause,
                reason,
                refusal,
            },
        }
    }

    /// The verdict on an endpoint whose health service says it is not serving, if it does: out
    /// within the budget and never the last; kept in, its load is avoided until it serves.
    fn health_verdict(&self, entry: &super::Entry<S>) -> Option<Verdict> {
        let record = entry.record();
        if !record.is_not_serving() {
            return None;
        }
        let (cause, reason) = (Cause::Health, super::controls::health_reason());
        Some(match self.room_for_signal(self.controls.dry_run) {
            Ok(()) => Verdict::Eject { cause, reason },
            Err(refusal) => {
                if !self.controls.dry_run {
                    record.avoid_until(tower_outlier_core::Nanos::MAX);
                }
                Verdict::Refuse {
                    cause,
                    reason,
                    refusal,
                }
            }
        })
    }

    /// The verdict on an endpoint whose server asked to be left alone, if it did and the time
    /// asked (capped by the layer's `max_pushback`) is still ahead.
    fn pushback_verdict(&self, entry: &super::Entry<S>) -> Option<Verdict> {
        let record = entry.record();
        let now = record.clock().now();
        let cap = tower_outlier_core::duration_to_nanos(self.settings.max_pushback);
        if cap == 0 {
            // Ignored: and no load penalty either.
            record.cap_pushback(0);
            return None;
        }
        record.cap_pushback(now.saturating_add(cap));
        let until = record.pushed_back_until(now)?;
        if self.controls.dry_run {
            // Dry run changes nothing for real: no load penalty either, only what it reports.
            record.cap_pushback(0);
        }
        let cause = Cause::Pushback { until };
        let reason = super::controls::pushback_reason(Duration::from_nanos(until - now));
        Some(match self.room_for_signal(self.controls.dry_run) {
            Ok(()) => Verdict::Eject { cause, reason },
            Err(refusal) => {
                if !self.controls.dry_run {
                    // Kept in: p2c keeps away by its load for the time asked, as capped.
                    record.avoid_until(until);
                }
                Verdict::Refuse {
                    cause,
                    reason,
                    refusal,
                }
            }
        })
    }

    /// The first policy that judges `entry` an outlier, and why. The policies that enforce are
    /// asked first; those in dry run only for an endpoint whose ejection they could report: not
    /// one out in dry run already, nor one on trial after a real ejection (a dry-run policy
    /// never fails a real trial).
    pub(super) fn judged(&self, entry: &super::Entry<S>) -> Option<(usize, Reason)> {
        let record = entry.record();
        let now = record.clock().now();
        if !self.controls.any_dry() {
            return record.judge(now);
        }
        let judge = |dry: bool| {
            record
                .policies()
                .iter()
                .enumerate()
                .filter(|(index, _)| self.is_dry(*index) == dry)
                .find_map(|(index, policy)| match policy.judge(now) {
                    Judgement::Outlier(reason) => Some((index, reason)),
                    Judgement::Healthy => None,
                })
        };
        let real_episode = entry.episode.is_some() && !entry.is_shadow();
        judge(false).or_else(|| {
            if entry.is_shadow_out() || real_episode {
                None
            } else {
                judge(true)
            }
        })
    }

    /// The verdict on `key`, available and on a host another adaptor holds out: ejected if
    /// [`room`](Self::room) allows, else refused until there is room.
    pub(super) fn decide_for_host(&self, key: &K) -> Verdict {
        let Some(entry) = self.entries.get(key) else {
            return Verdict::Keep;
        };
        // Out already (ejected, forced out, or in dry run when that is what this would be), or
        // forced in: the host's ejection changes nothing.
        let dry = self.controls.dry_run;
        let candidate = entry.status().is_available() || (entry.is_shadow_out() && !dry);
        if !candidate || self.forced.contains_key(&entry.id) {
            return Verdict::Keep;
        }
        let reason = super::hosts::host_reason();
        match self.room_for_signal(self.controls.dry_run) {
            Ok(()) => Verdict::Eject {
                cause: Cause::Host,
                reason,
            },
            Err(refusal) => Verdict::Refuse {
                cause: Cause::Host,
                reason,
                refusal,
            },
        }
    }

    /// Whether an ejection for `cause` is one dry run only reports: a policy's in dry run, or a
    /// host's in a layer-wide dry run; never an operator's.
    pub(super) fn cause_is_dry(&self, cause: Cause) -> bool {
        match cause {
            Cause::Policy { index } => self.is_dry(index),
            Cause::Host | Cause::Pushback { .. } | Cause::Health => self.controls.dry_run,
            Cause::Operator => false,
        }
    }

    /// Carries out `verdict` on `key`.
    pub(super) fn apply(&mut self, key: &K, verdict: Verdict, now: Instant) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let id = entry.id;
        // Judged an outlier during its trial: a failed recovery check, whether or not the rules
        // let it be ejected again.
        let trial_breach = match (&verdict, entry.episode.as_deref_mut()) {
            (
                Verdict::Refuse {
                    cause: Cause::Policy { .. },
                    ..
                }
                | Verdict::Eject {
                    cause: Cause::Policy { .. },
                    ..
                },
                Some(episode),
            ) if matches!(episode.stage, Stage::Trial { .. }) => episode.breach_trial(),
            _ => None,
        };
        let shadow = entry.is_shadow();
        if let Some(failed_checks) = trial_breach {
            self.emit_for(id, shadow, |key| Event::TrialFailed { key, failed_checks });
        }
        match verdict {
            Verdict::Keep => {
                if self.refused.remove(&id).is_some() {
                    self.registry.refused(self.roster, id, None);
                }
            }
            Verdict::Refuse {
                cause:
                    cause @ (Cause::Policy { .. }
                    | Cause::Operator
                    | Cause::Pushback { .. }
                    | Cause::Health),
                reason,
                refusal,
            } => {
                let dry = self.cause_is_dry(cause);
                self.refuse(key, id, reason, refusal, trial_breach.is_some(), dry);
            }
            Verdict::Refuse {
                cause: Cause::Host,
                reason,
                refusal,
            } => self.refuse_for_host(key, id, reason, refusal),
            Verdict::Eject { cause, reason } => self.eject(key, id, cause, reason, now),
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
            && reason.policy != super::controls::HEALTH;
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
                error_rate = reason.value,
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
            let trial_until = entry.status().deadline();
            self.publish(key, trial_until, Some(reason));
        }
    }

    /// An endpoint on a host held out elsewhere, kept in until there is room here: emitted once
    /// per outage of the host, retried when room appears.
    fn refuse_for_host(&mut self, key: &K, id: u64, reason: Reason, refusal: Refusal) {
        self.mirror_pending = true;
        if self.mirror_refused.insert(id) {
            self.registry
                .emit_about(self.roster, id, |key| Event::EjectionRefused {
                    key,
                    reason,
                    refusal,
                });
        }
        tracing::info!(
            target: "tower_outlier",
            endpoint = ?key,
            host = ?self.sharing.as_ref().and_then(|s| s.hosts.get(&id)),
            ejected = self.ejected,
            budget = self.settings.budget.max_ejected(self.entries.len()),
            "host ejected in another service, kept in until there is room to eject here"
        );
    }

    /// Takes `key` out of the balancer's set for `cause`, or, for a policy in dry run, holds it
    /// out only as the rules would (it stays in the set).
    fn eject(&mut self, key: &K, id: u64, cause: Cause, reason: Reason, now: Instant) {
        let shadow = self.cause_is_dry(cause);
        if self.refused.remove(&id).is_some() {
            self.registry.refused(self.roster, id, None);
        }
        // Out in dry run, it stays in the set, where its readiness still counts.
        if !shadow && self.unready.remove(&id) {
            self.registry.unready(self.roster, id, false);
        }
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        // Out in dry run until now: that ejection ends here, for one that is real.
        let was_shadow_out = entry.is_shadow_out();
        if was_shadow_out && matches!(entry.status(), Status::Probing) {
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
                let delay = match record
                    .policies()
                    .get(index)
                    .and_then(|p| p.own_timing()?.check_at_after(failed_checks, recorded_now))
                {
                    Some(at) => Duration::from_nanos(at.saturating_sub(recorded_now)),
                    None => self.settings.policies[index]
                        .recovery()
                        .delay(failed_checks),
                };
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
            // Back when the time the server asked for is up.
            Cause::Pushback { until } => {
                let recorded_now = entry.record().clock().now();
                let delay = Duration::from_nanos(until.saturating_sub(recorded_now));
                (Ejector::Pushback, Some(later(now, delay)), Some(delay))
            }
        };
        let episode = entry.eject(key, ejector, next_check, shadow, &mut self.deadlines);
        if let Cause::Policy { index, .. } = cause {
            episode.schedule = Some(self.settings.policies[index].recovery());
        }
        if was_shadow_out {
            self.shadow_out.remove(&id);
        }
        if shadow {
            self.shadow_out.insert(id);
        } else {
            self.ejected += 1;
        }
        match cause {
            Cause::Policy { .. } if shadow => {
                tracing::info!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    policy = reason.policy,
                    reason = %reason,
                    error_rate = reason.value,
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
                    error_rate = reason.value,
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
        // While the fleet panics the balancer keeps every endpoint, but an operator's.
        self.sync_member(key);
        if let (Cause::Policy { .. }, false) = (cause, shadow) {
            self.share_host(id, true);
        }
        // After the monitor shows it: a callback reading a snapshot sees the ejection.
        self.emit_for(id, shadow, |key| Event::Ejected {
            key,
            reason: event_reason,
            next_check_in: delay,
        });
    }
}
