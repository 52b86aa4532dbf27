//! The operator's controls in the detector: dry run switched on and off, overrides of single
//! endpoints, back-off resets. Applied when published, on the adaptor's task like new rules.

use tokio::time::Instant;
use tower_outlier_core::{Comparison, Reason, WindowCounts};

use super::{DiscoverKey, Ejector, Engine, Standing};
use crate::controls::{OperatorAction, Override};
use crate::event::{Event, Readmission};

pub(super) use crate::event::{
    ACTIVE_CHECK_POLICY as ACTIVE_CHECK, HEALTH_POLICY as HEALTH, OPERATOR_POLICY as OPERATOR,
    PUSHBACK_POLICY as PUSHBACK,
};

/// Why an endpoint whose server asked to be left alone is out: the time asked (capped), in
/// seconds, as the measure's value.
pub(super) fn pushback_reason(wait: std::time::Duration) -> Reason {
    Reason {
        policy: PUSHBACK,
        measure: "server asked to wait (seconds)",
        value: wait.as_secs_f64(),
        threshold: 0.0,
        comparison: Comparison::Said,
        counts: WindowCounts::default(),
    }
}

/// Why an endpoint whose health service says it is not serving is out.
pub(super) fn health_reason() -> Reason {
    Reason {
        policy: HEALTH,
        measure: "health service says not serving",
        value: 1.0,
        threshold: 0.0,
        comparison: Comparison::Said,
        counts: WindowCounts::default(),
    }
}

/// Why an endpoint in service that failed `failed` active checks in a row is out, against the
/// cadence's unhealthy threshold.
pub(super) fn active_check_reason(failed: u32, threshold: u32) -> Reason {
    Reason {
        policy: ACTIVE_CHECK,
        measure: "failed active checks in a row",
        value: f64::from(failed),
        threshold: f64::from(threshold),
        comparison: Comparison::AtOrAbove,
        counts: WindowCounts::default(),
    }
}

/// Why an endpoint forced out is out.
pub(super) fn operator_reason() -> Reason {
    Reason {
        policy: OPERATOR,
        measure: "forced out by an operator",
        value: 1.0,
        threshold: 1.0,
        comparison: Comparison::Said,
        counts: WindowCounts::default(),
    }
}

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Applies the newest controls of the layer, if they changed since last applied: the dry
    /// run's modes first, then the overrides and resets; then every endpoint in the balancer's
    /// set is judged under them.
    pub(super) fn apply_controls(&mut self, now: Instant) {
        let cell = self.settings.rules.clone();
        if cell.controls_version() == self.controls_version {
            return;
        }
        let (controls, version) = cell.controls();
        let previous = std::mem::replace(&mut self.controls, controls);
        self.controls_version = version;
        let modes_changed = previous.dry_run != self.controls.dry_run
            || previous.dry_policies != self.controls.dry_policies;
        if modes_changed {
            let names: Vec<&'static str> = self
                .controls
                .dry_policies
                .iter()
                .filter_map(|&slot| self.names.get(slot).copied())
                .collect();
            tracing::info!(
                target: "tower_outlier",
                dry_run = self.controls.dry_run,
                policies = ?names,
                "dry run in force"
            );
            self.registry.dry_run(self.controls.dry_run, names);
            self.switch_modes(now);
        }
        // A reset alone changes no verdict; new overrides change those of their endpoints, new
        // modes every one (at 100 000 endpoints, judging them all is the cost of a mode change).
        let overridden = if previous.overrides == self.controls.overrides {
            Vec::new()
        } else {
            self.sync_overrides(now)
        };
        self.apply_resets();
        self.enforce_budget(now);
        let judged = if modes_changed {
            self.keys_where(|e| e.in_balancer())
        } else {
            overridden
        };
        for key in judged {
            self.consider(&key, now);
        }
        self.retry_refused(now);
    }

    /// Moves each ejection to the mode its ejector is now in: a real one whose policy went into
    /// dry run comes back into the balancer's set and goes on as what dry run reports; one dry
    /// run held out whose policy enforces again is forgotten, with the endpoint's history (as a
    /// re-admission forgets it), so nothing is ejected on a verdict it may have outgrown.
    fn switch_modes(&mut self, now: Instant) {
        let _ = now;
        for key in self.keys_where(|e| e.episode().is_some()) {
            let Some(entry) = self.entries.get(&key) else {
                continue;
            };
            let dry = match entry.ejected_by() {
                Some(Ejector::Policy(index)) => self.is_dry(index),
                Some(signal) if signal.is_signal() => self.controls.dry_run,
                Some(_) | None => continue,
            };
            let (id, shadow, out) = (
                entry.id,
                entry.is_shadow(),
                !entry.standing().is_available(),
            );
            let probing = matches!(entry.standing(), Standing::Probing);
            if dry == shadow {
                continue;
            }
            if dry {
                // Real until now: it comes back into the balancer's set, its host no longer
                // held out by it.
                self.restand(&key, |s| {
                    if let Some(episode) = s.episode() {
                        episode.shadow = true;
                    }
                });
                if out {
                    tracing::info!(target: "tower_outlier", endpoint = ?key, "dry run: ejected endpoint back in the balancer's set");
                    self.registry
                        .emit_about(self.roster, id, |key| Event::Readmitted {
                            key,
                            cause: Readmission::DryRun,
                            trial: None,
                        });
                }
                let next = self.entries.get(&key).and_then(|e| e.standing().deadline());
                self.publish(&key, next, None);
            } else {
                // Dry run's until now: forgotten.
                if probing {
                    self.cancelled.push(id);
                }
                if let Some(entry) = self.entries.get(&key) {
                    entry.record().reset();
                }
                self.restand(&key, |s| s.end_episode());
                if self.refused.remove(&id).is_some() {
                    self.registry.refused(self.roster, id, None);
                }
                // A host another service holds out is held out here again, for real.
                self.mirror_pending = true;
                tracing::info!(target: "tower_outlier", endpoint = ?key, "dry run over: what it would have ejected is forgotten");
                self.publish(&key, None, None);
            }
        }
    }

    /// Brings the overrides by endpoint in line with the published ones; the keys whose override
    /// changed.
    fn sync_overrides(&mut self, now: Instant) -> Vec<K> {
        let mut changed = Vec::new();
        if self.controls.overrides.is_empty() && self.forced.is_empty() {
            return changed;
        }
        let overrides = self.controls.overrides.clone();
        // Every key is formatted to be matched: the cost of a change of the overrides, paid once.
        for key in self.keys_where(|_| true) {
            let Some(entry) = self.entries.get(&key) else {
                continue;
            };
            let wanted = overrides.get(format!("{key:?}").as_str()).copied();
            let held = self.forced.get(&entry.id).copied();
            if wanted != held {
                self.set_override(&key, held, wanted, now);
                changed.push(key);
            }
        }
        changed
    }

    /// A new endpoint whose key has an override.
    pub(super) fn override_joined(&mut self, key: &K, now: Instant) {
        let wanted = self
            .controls
            .overrides
            .get(format!("{key:?}").as_str())
            .copied();
        if wanted.is_some() {
            self.set_override(key, None, wanted, now);
        }
    }

    /// Moves `key`'s endpoint from override `held` to `wanted`.
    fn set_override(
        &mut self,
        key: &K,
        held: Option<Override>,
        wanted: Option<Override>,
        now: Instant,
    ) {
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        let id = entry.id;
        match wanted {
            Some(value) => {
                self.forced.insert(id, value);
            }
            None => {
                self.forced.remove(&id);
            }
        }
        self.registry.overridden(self.roster, id, wanted);
        if self.refused.remove(&id).is_some() {
            self.registry.refused(self.roster, id, None);
        }
        let action = match wanted {
            Some(Override::ForcedOut) => OperatorAction::ForceOut,
            Some(Override::ForcedIn) => OperatorAction::ForceIn,
            None => OperatorAction::Release,
        };
        tracing::warn!(target: "tower_outlier", endpoint = ?key, action = %action, "operator override in force");
        self.registry
            .emit_about(self.roster, id, |key| Event::Operator { key, action });
        match wanted {
            Some(Override::ForcedOut) => {
                let Some(entry) = self.entries.get(key) else {
                    return;
                };
                if entry.is_out() {
                    // Out already for real: held there, without a check, until released (no
                    // longer holding its host out; out of the set even while the fleet panics).
                    if matches!(entry.standing(), Standing::Probing) {
                        self.cancelled.push(id);
                    }
                    self.restand(key, |s| {
                        if let Some(episode) = s.episode() {
                            episode.ejected_by = Ejector::Operator;
                            episode.schedule = None;
                        }
                        s.set_stage(Standing::HeldByOperator);
                    });
                    self.publish(key, None, Some(operator_reason()));
                } else {
                    let verdict = self.decide(key);
                    self.apply(key, verdict, now);
                }
            }
            Some(Override::ForcedIn) => {
                let Some(entry) = self.entries.get(key) else {
                    return;
                };
                if !entry.standing().is_available() {
                    if matches!(entry.standing(), Standing::Probing) {
                        // Its answer no longer matters: abandoned, as the budget abandons one.
                        self.cancelled.push(id);
                    }
                    self.readmit(key, None, Readmission::Operator, now);
                }
            }
            None => {
                let forced_out = held == Some(Override::ForcedOut)
                    && self
                        .entries
                        .get(key)
                        .is_some_and(|e| matches!(e.standing(), Standing::HeldByOperator));
                if forced_out {
                    self.readmit(key, None, Readmission::Operator, now);
                    // Its host may be held out by another service meanwhile.
                    self.mirror_pending = true;
                }
            }
        }
    }

    /// Applies the back-off resets not applied yet to the endpoints they name.
    fn apply_resets(&mut self) {
        let resets = &self.controls.resets;
        if resets.asked == self.resets_seen {
            return;
        }
        let pending: Vec<Box<str>> = resets.after(self.resets_seen).map(Box::from).collect();
        self.resets_seen = resets.asked;
        let mut named: std::collections::HashMap<Box<str>, K> = self
            .keys_where(|_| true)
            .into_iter()
            .map(|key| (format!("{key:?}").into_boxed_str(), key))
            .collect();
        for text in pending {
            let Some(key) = named.remove(&text) else {
                continue;
            };
            self.restand(&key, |s| {
                if let Some(episode) = s.episode() {
                    episode.failed_checks = 0;
                }
            });
            let Some(entry) = self.entries.get(&key) else {
                continue;
            };
            for policy in entry.record().policies().iter() {
                if let Some(timing) = policy.own_timing() {
                    timing.reset_backoff();
                }
            }
            let id = entry.id;
            tracing::warn!(target: "tower_outlier", endpoint = ?key, "operator reset the endpoint's back-off");
            let next = entry.standing().deadline();
            self.publish(&key, next, None);
            self.registry
                .emit_about(self.roster, id, |key| Event::Operator {
                    key,
                    action: OperatorAction::ResetBackoff,
                });
        }
    }
}
