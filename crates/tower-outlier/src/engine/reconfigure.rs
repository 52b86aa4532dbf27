//! Applying new rules to a running detector: every endpoint moves to the new policies with what
//! they can use of its history, and is judged by them at once.

use std::sync::Arc;

use tokio::time::Instant;

use super::{fleet_schedules, trial_period, DiscoverKey, Ejector, Engine, Settings, Standing};
use crate::event::Readmission;
use crate::shared::Shared;

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Applies the newest rules of the layer, if they are newer than the ones in force.
    ///
    /// Each endpoint gets a new record whose states the new policies make from its old ones
    /// ([`OutlierPolicy::new_endpoint_from`](tower_outlier_core::OutlierPolicy::new_endpoint_from)); endpoints
    /// in the balancer's set are re-inserted with it (calls in flight finish on the old record and
    /// are not counted). Ejected endpoints stay out until their check, as scheduled. Endpoints a
    /// policy turned off had ejected come back on trial; then every endpoint in the set is judged
    /// by the new rules, so a lower threshold ejects at once.
    pub(super) fn reconfigure(&mut self, now: Instant) {
        let cell = self.settings.rules.clone();
        if cell.version() == self.settings.version {
            return;
        }
        let mut settings = Settings::new(
            &cell,
            self.settings.explicit_budget,
            self.settings.explicit_all_out,
            self.settings.max_pushback,
            self.settings.clock.clone(),
            self.settings.hosts.clone(),
        );
        settings.slow_start = self.settings.slow_start;
        settings.degraded_hold = self.settings.degraded_hold;
        settings.cadence = self.settings.cadence.clone();
        let settings = Arc::new(settings);
        let policies = settings.policies.clone();
        // The handle replaces policies slot by slot, and a layer's cell is never shared by a
        // layer with other policies (`with_policy` makes a new one).
        debug_assert_eq!(policies.len(), self.settings.policies.len());
        self.trial = trial_period(&policies);
        self.fleet = fleet_schedules(&policies, now, settings.clock.now(), &self.fleet);
        self.names = policies.iter().map(|p| p.name()).collect();
        self.settings = settings;
        // Before its consequences (the ejections the new rules make below).
        self.registry.rules_applied(self.settings.version);
        let mut records = Vec::with_capacity(self.entries.len());
        // The records being replaced stay alive until the monitor points at their successors:
        // an ejected endpoint's is held by its entry alone, and a snapshot taken in between
        // would miss it.
        let mut replaced = Vec::with_capacity(self.entries.len());
        for key in self.keys_where(|_| true) {
            let Some(entry) = self.entries.get(&key) else {
                continue;
            };
            let host = self
                .sharing
                .as_ref()
                .and_then(|s| s.hosts.get(&entry.id).cloned());
            let states = self.endpoint_states(host.as_deref(), Some(entry.record()));
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            let record = entry.record().successor_with(states);
            let shared = Shared::new(record);
            let weak = Arc::downgrade(&shared);
            records.push((entry.id, weak));
            if let Some(board) = &self.idle {
                board.replace_record(entry.id, shared.clone());
            }
            replaced.push(std::mem::replace(&mut entry.shared, shared));
            entry.replaced();
            self.sync_member(&key);
        }
        self.registry
            .reconfigure(self.roster, self.names.clone(), records);
        drop(replaced);
        // Endpoints held out for their host come back with the host instead.
        let switched_off = self.keys_where(|e| {
            !e.standing().is_available()
                && e.ejected_by()
                    .and_then(Ejector::policy)
                    .and_then(|index| policies.get(index))
                    .is_some_and(|p| !p.enabled())
        });
        for key in switched_off {
            let until = super::later(now, self.trial);
            if let Some(entry) = self.entries.get(&key) {
                if matches!(entry.standing(), Standing::Probing) {
                    self.cancelled.push(entry.id);
                }
            }
            self.readmit(&key, Some(until), Readmission::PolicyOff, now);
        }
        self.enforce_budget(now);
        for key in self.keys_where(|e| e.in_balancer()) {
            self.consider(&key, now);
        }
        self.retry_refused(now);
        tracing::info!(
            target: "tower_outlier",
            version = self.settings.version,
            endpoints = self.entries.len(),
            "new rules in force"
        );
    }
}
