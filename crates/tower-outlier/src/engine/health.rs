//! What an endpoint's health service says (`rules`, section 7): not serving takes it out at once,
//! within the budget and never the last; serving brings it back, without a trial.

use tokio::time::Instant;

use super::{DiscoverKey, Engine, Standing};
use crate::event::Readmission;
use crate::probe::Health;

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// `key`'s health service says `health`.
    pub(crate) fn health(&mut self, key: &K, health: Health, now: Instant) {
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        let not_serving = health != Health::Serving;
        let record = entry.record();
        let signal = tower_outlier_core::ServerSignal::Serving(!not_serving);
        if !record.hear(signal, record.clock().now()) {
            return;
        }
        tracing::info!(target: "tower_outlier", endpoint = ?key, ?health, "the endpoint's health service changed its word");
        if not_serving {
            self.consider(key, now);
            return;
        }
        record.end_open_avoidance();
        if matches!(entry.standing(), Standing::HeldNotServing) {
            self.readmit(key, None, Readmission::Serving, now);
        } else {
            // Kept in while not serving: the refusal ends.
            self.consider(key, now);
        }
    }
}
