//! HSF's ipDimension in the detector: what this adaptor ejects, the hosts it shares hold out;
//! what another adaptor sharing them ejects, this one ejects too, within its own rules.

use tokio::time::Instant;
use tower_outlier_core::{Comparison, Reason, WindowCounts};

use super::{later, DiscoverKey, Ejector, Engine};
use crate::event::Readmission;

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Whether another adaptor sharing the host of endpoint `id` holds it out.
    pub(super) fn host_out_elsewhere(&self, id: u64) -> bool {
        self.sharing.as_ref().is_some_and(|sharing| {
            sharing
                .hosts
                .get(&id)
                .is_some_and(|host| sharing.registry.ejected_elsewhere(sharing.member, host))
        })
    }

    /// Follows the other adaptors sharing hosts with this one, if they changed anything (or an
    /// ejection refused for want of room may now fit): ejects the endpoints on a host another one
    /// holds out (within this layer's budget, never its last endpoint), and re-admits on trial
    /// those held out for a host that is back. Cheap when there is nothing to do: run on every
    /// poll.
    pub(super) fn sync_hosts(&mut self, now: Instant) {
        let retry = self.mirror_pending && self.room().is_ok();
        let Some(sharing) = &mut self.sharing else {
            return;
        };
        let version = sharing.registry.version();
        if version == sharing.seen && !retry {
            return;
        }
        sharing.seen = version;
        self.mirror_pending = false;
        let back = self.keys_where(|e| {
            e.ejected_by() == Some(Ejector::Host) && !self.host_out_elsewhere(e.id)
        });
        for key in back {
            let until = later(now, self.trial);
            self.readmit(&key, Some(until), Readmission::HostBack, now);
        }
        // A refusal is said once per outage of the host: one that is back ends it.
        let host_back: Vec<u64> = self
            .mirror_refused
            .iter()
            .copied()
            .filter(|&id| !self.host_out_elsewhere(id))
            .collect();
        for id in host_back {
            self.mirror_refused.remove(&id);
        }
        let held_out = self.keys_where(|e| {
            (e.standing().is_available() || e.is_shadow_out()) && self.host_out_elsewhere(e.id)
        });
        for key in held_out {
            self.mirror(&key, now);
        }
    }

    /// Ejects `key` because another adaptor holds its host out, if this layer's rules allow.
    pub(super) fn mirror(&mut self, key: &K, now: Instant) {
        let verdict = self.decide(key);
        self.apply(key, verdict, now);
    }
}

/// Why an endpoint held out for its host is out.
pub(super) fn host_reason() -> Reason {
    Reason {
        policy: "hosts",
        measure: "host ejected in another service",
        value: 1.0,
        threshold: 1.0,
        comparison: Comparison::Said,
        counts: WindowCounts::default(),
    }
}
