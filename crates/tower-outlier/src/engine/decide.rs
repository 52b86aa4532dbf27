//! Deciding, apart from doing: what the engine makes of an endpoint is a [`Verdict`], found by
//! [`Engine::decide`], which reads and writes nothing (`apply.rs` carries it out). One decision
//! for every reason an endpoint goes out — an operator, its health service, the layer's checks
//! of it while it gets no traffic, its server's pushback, the rules, a host another adaptor
//! holds out — each through the same room rule
//! ([`Engine::room_for`] for the rules' own judgement, [`Engine::room_for_signal`] for the
//! others, which never take the last endpoint).

use std::time::Duration;

use tower_outlier_core::{Judgement, Nanos, Reason};

use super::{DiscoverKey, Engine, Entry};
use crate::controls::Override;
use crate::event::Refusal;

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
    Pushback { until: Nanos },
    /// Its health service says it is not serving: it comes back when the service says it is.
    Health,
    /// It failed `failed` active checks in a row while it got no traffic, at or above the
    /// cadence's unhealthy threshold: it comes back by its checks, as an ejected endpoint does.
    ActiveCheck { failed: u32, threshold: u32 },
}

/// What the engine makes of one endpoint, and what its record is told with it.
#[derive(Debug, PartialEq)]
pub(super) struct Verdict {
    pub(super) act: Act,
    pub(super) told: Told,
}

/// What is done with the endpoint.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Act {
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

/// What the endpoint's record is told with a verdict: the bounds the layer sets on what it keeps
/// of its server's signals, and how long the balancer is to avoid an endpoint kept in.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Told {
    /// The server's pushback may run at most to this (0: it is forgotten).
    pub(super) pushback_at_most: Option<Nanos>,
    /// The avoidance of an endpoint kept in ends, whatever set it (its server's pushback, its
    /// health service): an operator forced it in, or dry run changes no routing.
    pub(super) end_avoidance: bool,
    /// Its load is avoided until then (kept in while its server asked, or its health service
    /// says it is not serving).
    pub(super) avoid_until: Option<Nanos>,
}

impl Verdict {
    fn keep(told: Told) -> Verdict {
        Verdict {
            act: Act::Keep,
            told,
        }
    }
}

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// The verdict on `key` now (`rules`, sections 2–5, 7): an operator's override first, then
    /// what the endpoint's health service and its server say, then the policies (those that
    /// enforce before those in dry run), then a host another adaptor holds out. Each ejection is
    /// made if the room rule allows, otherwise refused. Reads the engine and the record; writes
    /// nothing (the engine's tests hold it to that).
    pub(super) fn decide(&self, key: &K) -> Verdict {
        let Some(entry) = self.entries.get(key) else {
            return Verdict::keep(Told::default());
        };
        let forced = if self.forced.is_empty() {
            None
        } else {
            self.forced.get(&entry.id).copied()
        };
        let shadow_out = entry.is_shadow_out();
        if !entry.standing().is_available() && !shadow_out {
            return Verdict::keep(Told::default());
        }
        if forced == Some(Override::ForcedOut) {
            let cause = Cause::Operator;
            let reason = super::controls::operator_reason();
            // One the balancer cannot pick (unready) takes nothing from it by going.
            let pickable = usize::from(!self.unready.contains(&entry.id));
            let act = if self.available().saturating_sub(pickable) >= 1 {
                Act::Eject { cause, reason }
            } else {
                Act::Refuse {
                    cause,
                    reason,
                    refusal: Refusal::LastEndpoint,
                }
            };
            return Verdict {
                act,
                told: Told::default(),
            };
        }
        let mut told = Told {
            // Neither an operator's force-in nor dry run lets the layer keep p2c away.
            end_avoidance: forced == Some(Override::ForcedIn) || self.controls.dry_run,
            ..Told::default()
        };
        let ruled = self.judged(entry).map(|(index, reason)| {
            let cause = Cause::Policy { index };
            if forced == Some(Override::ForcedIn) {
                return Act::Refuse {
                    cause,
                    reason,
                    refusal: Refusal::ForcedIn,
                };
            }
            // A host judged on every service's calls (HSF's ipDimension) may be judged on
            // another service's alone: as when it follows another service's host ejection, it
            // never takes this layer's last endpoint, whatever the layer does when all are out.
            let room = if self.judged_by_host(entry, index) {
                self.room_for_signal(self.is_dry(index))
            } else {
                self.room_for(self.is_dry(index))
            };
            match room {
                Ok(()) => Act::Eject { cause, reason },
                Err(refusal) => Act::Refuse {
                    cause,
                    reason,
                    refusal,
                },
            }
        });
        // The rules' own ejection comes before what a signal asks: a server that keeps asking
        // for a pause, or a drain, would otherwise have its failing endpoint back without a
        // check each time. Only an enforcing policy's: dry run changes no routing.
        let enforced = matches!(
            ruled,
            Some(Act::Eject { cause: Cause::Policy { index }, .. }) if !self.is_dry(index)
        );
        if let (true, Some(act)) = (enforced, &ruled) {
            return Verdict {
                act: act.clone(),
                told,
            };
        }
        if forced != Some(Override::ForcedIn) && !shadow_out {
            if let Some(act) = self.health_act(entry, &mut told) {
                return Verdict { act, told };
            }
            if let Some(act) = self.active_check_act(entry) {
                return Verdict { act, told };
            }
            if let Some(act) = self.pushback_act(entry, &mut told) {
                return Verdict { act, told };
            }
        }
        if let Some(act) = ruled {
            return Verdict { act, told };
        }
        let act = if forced.is_none() {
            self.host_act(entry).unwrap_or(Act::Keep)
        } else {
            Act::Keep
        };
        Verdict { act, told }
    }

    /// What is done with an endpoint whose health service says it is not serving, if it does:
    /// out within the budget and never the last; kept in, its load is avoided until it serves.
    fn health_act(&self, entry: &Entry<S>, told: &mut Told) -> Option<Act> {
        if !entry.record().is_not_serving() {
            return None;
        }
        let (cause, reason) = (Cause::Health, super::controls::health_reason());
        Some(match self.room_for_signal(self.controls.dry_run) {
            Ok(()) => Act::Eject { cause, reason },
            Err(refusal) => {
                if !self.controls.dry_run {
                    told.avoid_until = Some(Nanos::MAX);
                }
                Act::Refuse {
                    cause,
                    reason,
                    refusal,
                }
            }
        })
    }

    /// What is done with an endpoint that failed the unhealthy threshold of active checks while
    /// it got no traffic, if it did: out within the budget and never the last (as its server's
    /// own word); kept in, it is judged again at its next check, or by its calls.
    fn active_check_act(&self, entry: &Entry<S>) -> Option<Act> {
        let (failed, threshold) = self.idle_failures(entry.id)?;
        let cause = Cause::ActiveCheck { failed, threshold };
        let reason = super::controls::active_check_reason(failed, threshold);
        Some(match self.room_for_signal(self.controls.dry_run) {
            Ok(()) => Act::Eject { cause, reason },
            Err(refusal) => Act::Refuse {
                cause,
                reason,
                refusal,
            },
        })
    }

    /// The bound the layer's `max_pushback` sets on what the endpoint's server asked, and when
    /// the request as bounded runs to (if it is still ahead).
    fn bound_pushback(&self, entry: &Entry<S>, told: &mut Told) -> Option<(Nanos, Nanos)> {
        let record = entry.record();
        let now = record.clock().now();
        let cap = tower_outlier_core::duration_to_nanos(self.settings.max_pushback);
        if cap == 0 {
            // Ignored: and no load penalty either.
            told.pushback_at_most = Some(0);
            return None;
        }
        let at_most = now.saturating_add(cap);
        told.pushback_at_most = Some(at_most);
        let until = record.pushed_back_until(now)?.min(at_most);
        Some((now, until))
    }

    /// What is done with an endpoint whose server asked to be left alone, if it did and the time
    /// asked (bounded by the layer's `max_pushback`) is still ahead.
    fn pushback_act(&self, entry: &Entry<S>, told: &mut Told) -> Option<Act> {
        let (now, until) = self.bound_pushback(entry, told)?;
        if self.controls.dry_run {
            // Dry run changes nothing for real: no load penalty either, only what it reports.
            told.pushback_at_most = Some(0);
        }
        let cause = Cause::Pushback { until };
        let reason = super::controls::pushback_reason(Duration::from_nanos(until - now));
        Some(match self.room_for_signal(self.controls.dry_run) {
            Ok(()) => Act::Eject { cause, reason },
            Err(refusal) => {
                if !self.controls.dry_run {
                    // Kept in: p2c keeps away by its load for the time asked, as bounded.
                    told.avoid_until = Some(until);
                }
                Act::Refuse {
                    cause,
                    reason,
                    refusal,
                }
            }
        })
    }

    /// What is done with an endpoint on a host another adaptor holds out, if it is: ejected if
    /// there is room, else refused until there is. One out in dry run already is left as it is
    /// when this ejection would be dry run's too.
    fn host_act(&self, entry: &Entry<S>) -> Option<Act> {
        if !self.host_out_elsewhere(entry.id) {
            return None;
        }
        let dry = self.controls.dry_run;
        if entry.is_shadow_out() && dry {
            return None;
        }
        let (cause, reason) = (Cause::Host, super::hosts::host_reason());
        Some(match self.room_for_signal(dry) {
            Ok(()) => Act::Eject { cause, reason },
            Err(refusal) => Act::Refuse {
                cause,
                reason,
                refusal,
            },
        })
    }

    /// Endpoints the balancer can pick: in its set and ready.
    pub(super) fn available(&self) -> usize {
        self.entries.len() - self.ejected - self.unready.len()
    }

    /// Whether one more ejection is allowed now, or which rule refuses it (`rules`, section 3):
    /// never the balancer's last endpoint it can pick, and never past the budget. The one place
    /// the rule is written.
    pub(super) fn room(&self) -> Result<(), Refusal> {
        self.room_for(false)
    }

    /// [`room`](Self::room) for an ejection that is real, or (`dry`) that a policy in dry run
    /// would make: that one counts what dry run holds out as out, as an enforcing layer would
    /// have it, so a dry run makes the decisions the same rules would.
    pub(super) fn room_for(&self, dry: bool) -> Result<(), Refusal> {
        self.room_with(dry, self.settings.all_out.keeps_last())
    }

    /// [`room_for`](Self::room_for) for a signal that is not the rules' own judgement (a
    /// server's pushback, its health service, a host held out by another adaptor): never the last
    /// endpoint the balancer can pick, whatever [`WhenAllOut`](tower_outlier_core::WhenAllOut)
    /// says. Fail-fast and panic are for a fleet the rules judged broken; a fleet whose servers
    /// all asked for a pause, or all said they drain, keeps one to call (`rules`, section 3).
    pub(super) fn room_for_signal(&self, dry: bool) -> Result<(), Refusal> {
        self.room_with(dry, true)
    }

    fn room_with(&self, dry: bool, keep_last: bool) -> Result<(), Refusal> {
        let (out, available) = if dry {
            (
                self.ejected + self.shadow_out.len(),
                self.hypothetically_available(),
            )
        } else {
            (self.ejected, self.available())
        };
        if available <= 1 && keep_last {
            Err(Refusal::LastEndpoint)
        } else if out >= self.settings.budget.max_ejected(self.entries.len()) {
            Err(Refusal::Budget)
        } else {
            Ok(())
        }
    }

    /// Endpoints the balancer could pick were dry run's ejections real: in its set, ready, and
    /// not out in dry run.
    pub(super) fn hypothetically_available(&self) -> usize {
        let unready_in = self
            .unready
            .iter()
            .filter(|id| !self.shadow_out.contains(id))
            .count();
        self.entries.len() - self.ejected - self.shadow_out.len() - unready_in
    }

    /// The first policy that judges `entry` an outlier, and why. The policies that enforce are
    /// asked first; those in dry run only for an endpoint whose ejection they could report: not
    /// one out in dry run already, nor one on trial after a real ejection (a dry-run policy
    /// never fails a real trial).
    pub(super) fn judged(&self, entry: &Entry<S>) -> Option<(usize, Reason)> {
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
        let real_episode = entry.episode().is_some() && !entry.is_shadow();
        judge(false).or_else(|| {
            if entry.is_shadow_out() || real_episode {
                None
            } else {
                judge(true)
            }
        })
    }

    /// Whether an ejection for `cause` is one dry run only reports: a policy's in dry run, or a
    /// signal's in a layer-wide dry run; never an operator's.
    pub(super) fn cause_is_dry(&self, cause: Cause) -> bool {
        match cause {
            Cause::Policy { index } => self.is_dry(index),
            Cause::Host | Cause::Pushback { .. } | Cause::Health | Cause::ActiveCheck { .. } => {
                self.controls.dry_run
            }
            Cause::Operator => false,
        }
    }
}
