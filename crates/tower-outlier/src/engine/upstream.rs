//! Upstream changes (`rules`, section 8): the upstream is authoritative. A new endpoint joins
//! available, its latency estimate seeded from the fleet's; a key inserted again keeps its
//! history with the new service; a removed endpoint is forgotten, whatever it was doing.

use std::sync::Arc;

use tokio::time::Instant;
use tower_outlier_core::EndpointRecord;

use super::{policy_states, DiscoverKey, Engine, Entry, Reported, Standing};
use crate::event::{EndpointKey, Event};
use crate::monitor::Tracked;
use crate::shared::Shared;

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// The upstream inserted `key` with `service`.
    pub(crate) fn insert(&mut self, key: K, service: S, now: Instant) {
        if let Some(entry) = self.entries.get_mut(&key) {
            if let Some(board) = &self.idle {
                board.replace_service(entry.id, service.clone(), now);
            }
            entry.service = service;
            entry.replaced();
            self.sync_member(&key);
            tracing::debug!(target: "tower_outlier", endpoint = ?key, "upstream replaced the service");
            return;
        }
        let host = self.sharing.as_ref().and_then(|s| s.host_of.host(&key));
        let states = self.endpoint_states(host.as_deref(), None);
        let settings = &self.settings;
        let mut record = EndpointRecord::new(settings.clock.clone(), states, self.notifier.clone());
        if !settings.degraded_hold.is_zero() {
            record.watch_degraded(settings.degraded_hold);
        }
        let slot = self.entries.vacant_slot();
        record.set_signal_slot(self.signals.assign(slot));
        let shared = Shared::new(record);
        let weak = Arc::downgrade(&shared);
        // The monitor holds the typed key, for its snapshots and the events about the endpoint.
        let typed = EndpointKey::new(&key);
        let id = self.registry.insert(self.roster, Tracked::new(typed, weak));
        if let (Some(sharing), Some(host)) = (&mut self.sharing, host) {
            sharing.hosts.insert(id, host.into_boxed_str());
        }
        self.seed_rtt(&shared.record);
        // Joining a fleet that serves already: ramped up (the first endpoints do not ramp).
        if self.fleet_serves() {
            self.start_ramp(&shared.record);
        }
        let held_out = self.host_out_elsewhere(id);
        let states = policy_states(&shared.record);
        if *states != *self.usual_report.states {
            // New rules may start endpoints in other states: the newest is the best guess.
            self.usual_report = Arc::new(Reported {
                weight: 1.0,
                states,
            });
        }
        // The states it starts in are no change to report.
        let entry = Entry::new(slot, service, shared, id, self.usual_report.clone());
        self.entries.insert(key.clone(), entry);
        self.sync_member(&key);
        if let (Some(board), Some(entry)) = (&self.idle, self.entries.get(&key)) {
            board.enroll(
                id,
                key.clone(),
                entry.service.clone(),
                entry.shared.clone(),
                now,
            );
        }
        // An operator's override waiting for this key.
        if !self.controls.overrides.is_empty() {
            self.override_joined(&key, now);
        }
        // A larger set may have room for an ejection that was refused.
        self.retry_refused(now);
        // Joining on a host another service holds out.
        if held_out {
            self.mirror(&key, now);
        }
    }

    /// The upstream removed `key`.
    pub(crate) fn remove(&mut self, key: &K, now: Instant) {
        let Some(entry) = self.entries.get(key) else {
            tracing::debug!(target: "tower_outlier", endpoint = ?key, "upstream removed an unknown endpoint");
            return;
        };
        let (status, id) = (entry.standing(), entry.id);
        if matches!(status, Standing::Probing) {
            self.cancelled.push(id);
        }
        if self.avoided.forget(key).is_some() {
            // A check in flight, if any, is given up with it.
            self.cancelled.push(id | super::avoided::CHECK_TAG);
        }
        if let Some(board) = &self.idle {
            board.forget(id);
        }
        // Out of the counts, the shared host and the balancer's set.
        self.restand(key, |s| s.leave());
        let Some(entry) = self.entries.remove(key) else {
            return;
        };
        let tracked = self.registry.remove(self.roster, entry.id);
        self.refused.remove(&entry.id);
        self.mirror_refused.remove(&entry.id);
        self.unready.remove(&entry.id);
        self.forced.remove(&entry.id);
        if let Some(sharing) = &mut self.sharing {
            sharing.hosts.remove(&entry.id);
        }
        // Once the engine's state is complete: a callback reading a snapshot sees the removal.
        if let Some(tracked) = tracked {
            let status = status.public();
            self.registry.events.emit(|| Event::Removed {
                key: tracked.key,
                status,
            });
        }
        self.enforce_budget(now);
        self.retry_refused(now);
    }

    /// Starts `record`'s slow start, if the layer has one, in a set of the available endpoints
    /// and this one.
    pub(super) fn start_ramp(&self, record: &EndpointRecord) {
        if let Some(ramp) = self.settings.slow_start {
            let now = record.clock().now();
            record.start_ramp(ramp, self.available() + 1, now);
        }
    }

    /// Whether the fleet has served: an available endpoint served a call (among a sample, as in
    /// [`seed_rtt`](Self::seed_rtt)) at an insert since the layer started. Endpoints that join
    /// then are new to a serving fleet. Once it has, it has: newcomers not yet served would
    /// otherwise crowd the ones that have out of the sample.
    fn fleet_serves(&mut self) -> bool {
        const SAMPLE: usize = 32;
        if self.settings.slow_start.is_none() {
            return false;
        }
        if !self.fleet_served {
            self.fleet_served = self
                .entries
                .values()
                .filter(|e| e.standing().is_available())
                .take(SAMPLE)
                .any(|e| e.record().has_served());
        }
        self.fleet_served
    }

    /// Starts `endpoint`'s latency estimate at the mean of the available endpoints', so it
    /// competes for traffic on equal terms: the samples from before its ejection (or none at all)
    /// would otherwise starve it, and a passive trial needs traffic to judge. A sample of the
    /// fleet is enough for a starting point and keeps inserting n endpoints linear in n.
    pub(super) fn seed_rtt(&self, record: &EndpointRecord) {
        const SAMPLE: usize = 32;
        let now = record.clock().now();
        let (sum, count) = self
            .entries
            .values()
            .filter(|e| e.standing().is_available() && !std::ptr::eq(e.record(), record))
            .take(SAMPLE)
            .map(|e| e.record().rtt_estimate(now))
            .fold((0.0, 0usize), |(sum, n), rtt| (sum + rtt, n + 1));
        if count > 0 {
            record.seed_rtt(sum / count as f64, now);
        }
    }
}
