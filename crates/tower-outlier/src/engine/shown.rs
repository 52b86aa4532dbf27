//! What the monitor and the events show of an endpoint: its status, next check and reason,
//! and its policies' states as they change.

use tokio::time::Instant;
use tower_outlier_core::Reason;

use crate::event::{EndpointKey, Event};
use crate::monitor::Placement;

use super::*;

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Reports the policy states of `key`'s endpoint that changed since last reported.
    pub(super) fn report_states(&mut self, key: &K) {
        if !self.registry.events.listened() {
            return;
        }
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let now_states = policy_states(entry.record());
        if *now_states == *entry.reported_states() {
            return;
        }
        let state =
            |states: &[Option<&'static str>], index: usize| states.get(index).copied().flatten();
        for (index, &policy) in self.names.iter().enumerate() {
            let (from, to) = (
                state(entry.reported_states(), index),
                state(&now_states, index),
            );
            if from != to {
                self.registry
                    .emit_about(self.roster, entry.id, |key| Event::PolicyStateChanged {
                        key,
                        policy,
                        from,
                        to,
                    });
            }
        }
        entry.set_reported(&self.usual_report, |reported| reported.states = now_states);
    }

    pub(super) fn publish(&self, key: &K, next_check: Option<Instant>, reason: Option<Reason>) {
        if let Some(entry) = self.entries.get(key) {
            let placed = Placement {
                status: entry.standing().public(),
                dry_run: entry.is_shadow(),
                next_check,
                failed_checks: entry.failed_checks(),
            };
            self.registry.publish(self.roster, entry.id, placed, reason);
        }
    }

    /// Sends the event `make` builds about endpoint `id`, as what dry run would do if `shadow`.
    pub(super) fn emit_for(&self, id: u64, shadow: bool, make: impl FnOnce(EndpointKey) -> Event) {
        self.registry.emit_about(self.roster, id, |key| {
            let event = make(key);
            if shadow {
                Event::DryRun(Box::new(event))
            } else {
                event
            }
        });
    }
}

/// An endpoint's weight and policy states as events last reported them.
#[derive(Clone, PartialEq)]
pub(super) struct Reported {
    pub(super) weight: f64,
    // As [`policy_states`] gives them.
    pub(super) states: Box<[Option<&'static str>]>,
}

impl<S> Entry<S> {
    pub(super) fn reported_weight(&self) -> f64 {
        self.reported.weight
    }

    pub(super) fn reported_states(&self) -> &[Option<&'static str>] {
        &self.reported.states
    }

    /// Notes what an event reported (or, for states, would have had anybody listened), back in
    /// the shared `usual` report if it comes to that.
    pub(super) fn set_reported(&mut self, usual: &Arc<Reported>, note: impl FnOnce(&mut Reported)) {
        note(Arc::make_mut(&mut self.reported));
        if *self.reported == **usual {
            self.reported = usual.clone();
        }
    }
}
