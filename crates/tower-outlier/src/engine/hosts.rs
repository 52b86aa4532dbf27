//! HSF's ipDimension in the detector: what this adaptor ejects, the hosts it shares hold out;
//! what another adaptor sharing them ejects, this one ejects too, within its own rules.

use tokio::time::Instant;
use tower_outlier_core::{Comparison, EndpointPolicy, Reason, WindowCounts};

use super::{later, DiscoverKey, Ejector, Engine};
use crate::event::Readmission;
use crate::hosts::ByHost;

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// One state per policy for an endpoint on `host` (if this layer shares hosts and knows it),
    /// carried over from `previous` (new rules) where the policy can: a policy that judges by
    /// host (HSF's `ipDimension`) gets the host's state, shared with every endpoint on it in
    /// every layer sharing hosts under the same rules (the policy as it prints, configuration
    /// included); the others, the endpoint's own.
    pub(super) fn endpoint_states(
        &self,
        host: Option<&str>,
        previous: Option<&tower_outlier_core::EndpointRecord>,
    ) -> Box<[Box<dyn EndpointPolicy>]> {
        let now = self.settings.clock.now();
        self.settings
            .policies
            .iter()
            .enumerate()
            .map(|(index, policy)| {
                let before = previous.and_then(|r| r.policies().get(index));
                let make = || -> Box<dyn EndpointPolicy> {
                    match before {
                        // A host's state is carried over from what it wraps.
                        Some(state) => {
                            match (&**state as &dyn std::any::Any).downcast_ref::<ByHost>() {
                                Some(ByHost(inner)) => policy.new_endpoint_from(&**inner, now),
                                None => policy.new_endpoint_from(&**state, now),
                            }
                        }
                        None => policy.new_endpoint(),
                    }
                };
                match (host, &self.sharing) {
                    (Some(host), Some(sharing)) if policy.judges_by_host() => {
                        let rules = format!("{policy:?}");
                        Box::new(ByHost(
                            sharing.registry.host_state(host, &rules, index, make),
                        ))
                    }
                    _ => make(),
                }
            })
            .collect()
    }

    /// Whether `entry`'s state of the policy at `index` is its host's (HSF's ipDimension).
    pub(super) fn judged_by_host(&self, entry: &super::Entry<S>, index: usize) -> bool {
        entry
            .record()
            .policies()
            .get(index)
            .is_some_and(|state| (&**state as &dyn std::any::Any).is::<ByHost>())
    }

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
