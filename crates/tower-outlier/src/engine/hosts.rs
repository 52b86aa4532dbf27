//! HSF's ipDimension in the detector: what this adaptor ejects, the hosts it shares hold out;
//! what another adaptor sharing them ejects, this one ejects too, within its own rules.

use std::fmt;
use std::hash::Hash;

use tokio::time::Instant;
use tower::discover::Change;
use tower_outlier_core::{Reason, WindowCounts};

use super::{later, Ejector, Engine, Status};
use crate::events::{Event, Readmission, Refusal};

/// How far away the check of an endpoint held out for its host is: it comes back when the host
/// does, not on a schedule of its own.
const UNTIL_THE_HOST_RETURNS: std::time::Duration =
    std::time::Duration::from_secs(30 * 365 * 24 * 3600);

impl<K, S, C> Engine<K, S, C>
where
    K: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    S: Clone,
    C: Clone + Send + Sync + 'static,
{
    /// Tells the registry this adaptor holds `host` out, or no longer does.
    pub(super) fn share_host(&self, host: Option<&str>, out: bool) {
        if let (Some(sharing), Some(host)) = (&self.sharing, host) {
            sharing.registry.set(sharing.member, host, out);
        }
    }

    /// Follows the other adaptors sharing hosts with this one, if they changed anything (or an
    /// ejection refused for want of room may now fit): ejects the endpoints on a host another one
    /// holds out (within this layer's budget, never its last endpoint), and re-admits on trial
    /// those held out for a host that is back. Cheap when there is nothing to do: run on every
    /// poll.
    pub(crate) fn sync_hosts(&mut self, now: Instant) {
        let max = self.settings.budget.max_ejected(self.entries.len());
        let room = self.available() > 1 && self.ejected < max;
        let retry = self.mirror_pending && room;
        let Some(sharing) = &mut self.sharing else {
            return;
        };
        let version = sharing.registry.version();
        if version == sharing.seen && !retry {
            return;
        }
        sharing.seen = version;
        self.mirror_pending = false;
        let (registry, member) = (sharing.registry.clone(), sharing.member);
        let elsewhere = |host: &Option<String>| {
            host.as_deref()
                .is_some_and(|host| registry.ejected_elsewhere(member, host))
        };
        let back = self.keys_where(|e| e.ejected_by == Ejector::Host && !elsewhere(&e.host));
        for key in back {
            let until = later(now, self.trial);
            self.readmit(&key, Status::Trial { until }, Readmission::HostBack, now);
        }
        let held_out = self.keys_where(|e| e.status.is_available() && elsewhere(&e.host));
        for key in held_out {
            self.mirror(&key, now);
        }
    }

    /// Ejects `key` because another adaptor holds its host out, if this layer's rules allow.
    pub(super) fn mirror(&mut self, key: &K, now: Instant) {
        let max = self.settings.budget.max_ejected(self.entries.len());
        let (available, ejected) = (self.available(), self.ejected);
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if available <= 1 || ejected >= max {
            self.mirror_pending = true;
            if !entry.mirror_refused {
                entry.mirror_refused = true;
                let refusal = if available <= 1 {
                    Refusal::LastEndpoint
                } else {
                    Refusal::Budget
                };
                let name = entry.name.clone();
                self.registry.events.emit(|| Event::EjectionRefused {
                    key: name,
                    reason: host_reason(),
                    refusal,
                });
            }
            tracing::info!(
                target: "tower_outlier",
                endpoint = ?key,
                host = ?entry.host,
                ejected,
                budget = max,
                "host ejected in another service, kept in until there is room to eject here"
            );
            return;
        }
        let next_check = later(now, UNTIL_THE_HOST_RETURNS);
        entry.set_status(Status::Ejected { next_check }, &mut self.deadlines);
        entry.ejected_by = Ejector::Host;
        entry.mirror_refused = false;
        self.refused -= usize::from(entry.refused);
        entry.refused = false;
        self.ejected += 1;
        tracing::warn!(
            target: "tower_outlier",
            endpoint = ?key,
            host = ?entry.host,
            "endpoint ejected: its host is ejected in another service"
        );
        let reason = host_reason();
        let (name, event_reason) = (entry.name.clone(), reason.clone());
        self.publish(key, None, Some(reason));
        self.queue.push_back(Change::Remove(key.clone()));
        self.registry.events.emit(|| Event::Ejected {
            key: name,
            reason: event_reason,
            next_check_in: None,
        });
    }
}

fn host_reason() -> Reason {
    Reason {
        policy: "hosts",
        measure: "host ejected in another service",
        value: 1.0,
        threshold: 1.0,
        counts: WindowCounts::default(),
    }
}
