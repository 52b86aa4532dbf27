//! The way back in: re-admission (on trial or without condition), the fresh service a
//! returning endpoint may get, and the budget's and the last endpoint's claims on the endpoints
//! out.

use tokio::time::Instant;

use super::{later, DiscoverKey, Ejector, Engine, Standing};
use crate::event::{Event, Readmission};

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Brings back an endpoint that is out: on trial until `trial_until`, or (`None`) available
    /// without condition.
    pub(super) fn readmit(
        &mut self,
        key: &K,
        trial_until: Option<Instant>,
        cause: Readmission,
        now: Instant,
    ) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if entry.standing().is_available() {
            return;
        }
        // Out only in dry run: the balancer has it already, and dry run reports its return.
        let shadow = entry.is_shadow();
        // In the set already while the fleet panics.
        let panicked_in = entry.in_set(self.panicking);
        if !shadow && !panicked_in {
            self.rebuild_if_due(key, now);
        }
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        // A signal's ejection (its server's pushback, its health service, its host held out
        // elsewhere) was no judgement of the rules: what they counted stands, and they judge the
        // endpoint again as it comes back. Only the rules' own (and an operator's, or the
        // budget's) start its history anew.
        let signalled = entry.ejected_by().is_some_and(Ejector::is_signal);
        if signalled {
            entry.record().forget_pushback();
        } else {
            entry.record().reset();
        }
        if self.refused.remove(&entry.id).is_some() {
            self.registry.refused(self.roster, entry.id, None);
        }
        let shared = entry.shared.clone();
        self.seed_rtt(&shared.record);
        if !shadow && !panicked_in {
            self.start_ramp(&shared.record);
            // Its evidence episodes start over, as a handle given anew to the balancer.
            shared.record.reset_evidence();
        }
        // Back in the balancer's set, unless dry run or panic had it there already.
        self.restand(key, |s| s.readmit(trial_until));
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        tracing::info!(
            target: "tower_outlier",
            endpoint = ?key,
            dry_run = shadow,
            cause = %cause,
            failed_checks = entry.failed_checks(),
            trial_until = ?trial_until.map(|at| at.saturating_duration_since(now)),
            "endpoint re-admitted"
        );
        let trial = trial_until.map(|at| at.saturating_duration_since(now));
        let id = entry.id;
        self.emit_for(id, shadow, |key| Event::Readmitted { key, cause, trial });
        self.publish(key, trial_until, None);
        self.report_states(key);
        self.retry_refused(now);
        // Back after a signal, its rules judge it on what they counted; back for another reason
        // while its health service says it is not serving, it goes out again.
        if self.entries.get(key).is_some_and(|e| {
            e.standing().is_available() && (signalled || e.record().is_not_serving())
        }) {
            self.consider(key, now);
        }
    }

    /// Makes `key`'s endpoint a fresh service if a call of it timed out or failed in transport
    /// since it was last rebuilt, joined or re-admitted, and the layer rebuilds services
    /// ([`rebuild`](crate::rebuild)). A rebuild that panics, or says `None`, keeps the service.
    pub(super) fn rebuild_if_due(&mut self, key: &K, now: Instant) {
        // Dry run makes nothing, even for an operator's endpoint coming back (an operator's
        // force-out is real in dry run): the endpoint keeps the service it has.
        if self.controls.dry_run {
            return;
        }
        let Some(rebuild) = self.rebuild.as_deref() else {
            return;
        };
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if !entry.record().take_connection_failed() {
            return;
        }
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rebuild.rebuild(key, &entry.service)
        }));
        match made {
            Ok(Some(fresh)) => {
                // The keeper checks the service it comes back with.
                if let Some(board) = &self.idle {
                    board.replace_service(entry.id, fresh.clone(), now);
                }
                entry.service = fresh;
                entry.replaced();
                self.rebuilt.push(key.clone());
                tracing::info!(target: "tower_outlier", endpoint = ?key, "endpoint's service rebuilt after connection failures: it returns with fresh connections");
            }
            Ok(None) => {}
            Err(panic) => {
                tracing::error!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    panic = tower_outlier_core::panic_message(&*panic),
                    "rebuilding an endpoint's service panicked: it keeps its service"
                );
                tower_outlier_core::drop_panic(panic);
            }
        }
    }

    /// The endpoints rebuilt since the last call, with their new services (for their health
    /// watches).
    pub(crate) fn take_rebuilt(&mut self) -> Vec<(K, S)> {
        if self.rebuilt.is_empty() {
            return Vec::new();
        }
        let keys = std::mem::take(&mut self.rebuilt);
        keys.into_iter()
            .filter_map(|key| {
                let service = self.entries.get(&key)?.service.clone();
                Some((key, service))
            })
            .collect()
    }

    /// Re-admits ejected endpoints while more are ejected than the budget allows, or none is
    /// available; the ones due soonest go first, and the ones an operator forced out last. Then
    /// the same for what dry run holds out, counted with the real ejections as an enforcing
    /// layer would count them (dry run takes back only its own).
    pub(super) fn enforce_budget(&mut self, now: Instant) {
        // Only a layer that keeps the last endpoint brings one back for want of any.
        let keeps_last = self.settings.all_out.keeps_last();
        'again: loop {
            let max = self.settings.budget.max_ejected(self.entries.len());
            let shadowed = self.shadow_out.len();
            // In order: the real set first, then what dry run holds out.
            // An operator's forced out never leaves the balancer nothing, whatever the choice.
            let wanted = [
                (
                    self.ejected > 0 && self.available() == 0,
                    Readmission::LastEndpoint,
                    false,
                ),
                (self.ejected > max, Readmission::BudgetShrank, false),
                (
                    keeps_last && shadowed > 0 && self.hypothetically_available() == 0,
                    Readmission::LastEndpoint,
                    true,
                ),
                (
                    shadowed > 0 && self.ejected + shadowed > max,
                    Readmission::BudgetShrank,
                    true,
                ),
            ];
            for (due, cause, shadow) in wanted {
                if !due {
                    continue;
                }
                let soonest = self
                    .entries
                    .iter()
                    .filter(|(_, e)| !e.standing().is_available() && e.is_shadow() == shadow)
                    // Forced out is over the budget by design; only no endpoint at all takes it
                    // back. When the rules took the last endpoint of a layer that fails fast,
                    // what a signal or an operator holds out comes back: only the rules' own
                    // ejections may leave the balancer nothing.
                    .filter(|(_, e)| {
                        let forced_out = matches!(e.standing(), Standing::HeldByOperator);
                        let by_signal = e.ejected_by().is_some_and(Ejector::is_signal);
                        match cause {
                            Readmission::LastEndpoint => keeps_last || forced_out || by_signal,
                            _ => !forced_out,
                        }
                    })
                    .min_by_key(|(_, e)| (readmission_order(e.standing()), e.id))
                    .map(|(k, _)| k.clone());
                // None to take back for this rule (forced out only): the next rule may have.
                let Some(key) = soonest else { continue };
                let mut forced_out = false;
                if let Some(entry) = self.entries.get(&key) {
                    forced_out = matches!(entry.standing(), Standing::HeldByOperator);
                    if matches!(entry.standing(), Standing::Probing) {
                        self.cancelled.push(entry.id);
                    }
                }
                let until = later(now, self.trial);
                self.readmit(&key, Some(until), cause, now);
                if forced_out {
                    // Still forced out: kept in as the last endpoint, out again once another is.
                    let verdict = self.decide(&key);
                    self.apply(&key, verdict, now);
                }
                continue 'again;
            }
            return;
        }
    }
}

/// The order in which the budget takes endpoints back: an abandoned probe's first, then the
/// soonest check, and an endpoint held out only for its host last.
fn readmission_order(status: Standing) -> (u8, Option<Instant>) {
    match status {
        Standing::Probing | Standing::Available | Standing::Trial { .. } => (0, None),
        Standing::Ejected { next_check } => (1, Some(next_check)),
        Standing::HeldForHost | Standing::HeldNotServing => (2, None),
        Standing::HeldByOperator => (3, None),
    }
}
