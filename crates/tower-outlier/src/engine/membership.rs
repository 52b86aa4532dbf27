//! The balancer's set, written in one place: whether an endpoint is in it follows from its
//! standing, the fleet's mode (panic) and the upstream, never from the code that changed one of
//! them. Every change of those ends in [`Engine::sync_member`], which compares what the balancer
//! should have with what it was last given and hands it the difference.

use tower::discover::Change;

use super::entry::Given;
use super::{DiscoverKey, Engine};

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Brings the balancer's set in line for `key`: gives it the endpoint if it should have it
    /// and lacks it (or holds a stale handle), takes it back if it should not have it. The only
    /// code that writes a [`Change`] for the balancer.
    pub(super) fn sync_member(&mut self, key: &K) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let wanted = entry.in_set(self.panicking);
        let change = match (wanted, entry.given) {
            (true, Given::Current) | (false, Given::Nothing) => return,
            (true, Given::Nothing | Given::Stale) => {
                entry.given = Given::Current;
                Change::Insert(key.clone(), entry.endpoint())
            }
            (false, Given::Current | Given::Stale) => {
                entry.given = Given::Nothing;
                Change::Remove(key.clone())
            }
        };
        self.queue.push_back(change);
    }
}
