//! One endpoint as the engine holds it, and where it stands: its handle's parts, the ejection
//! episode it is in, and what the balancer was last given of it.
//!
//! Standing is written in one place, [`Engine::restand`]: a change of it is a closure given a
//! [`Restanding`] (the episode is private to this module, so nothing else can write it), after
//! which what follows from standing is brought in line — the counts of endpoints out, the
//! readiness kept for endpoints in the set ([`Engine::sync_unready`]), the host this adaptor holds
//! out, and the balancer's set, whose one writer is [`Engine::sync_member`].

use std::sync::Arc;

use tokio::time::Instant;
use tower_outlier_core::{EndpointRecord, RecoverySchedule};

use tower::discover::Change;

use super::{DiscoverKey, Ejector, Engine, Reported};
use crate::deadlines::Deadlines;
use crate::endpoint::EndpointParts;
use crate::monitor::EndpointStatus;
use crate::shared::Shared;

pub(super) struct Entry<S> {
    // Its slot on the signal board.
    pub(super) slot: u32,
    // What the balancer was last given of it (`membership.rs`): written only there.
    given: Given,
    // The upstream removed it: out of the balancer's set whatever its standing.
    leaving: bool,
    // What a handle for the balancer is made of ([`Entry::endpoint`]): the layer's own handle
    // would never call, so it keeps no handle's per-call state (a lane, draws, permits).
    pub(super) service: S,
    pub(super) shared: Arc<Shared>,
    pub(super) id: u64,
    // The ejection the endpoint is out for, or on trial after. Most endpoints are available
    // most of the time, so what only an ejection needs is held only while one lasts. Written
    // only through [`Engine::restand`].
    episode: Option<Box<Episode>>,
    // What events last reported of the endpoint: mostly the engine's `usual_report`, shared.
    pub(super) reported: Arc<Reported>,
}

/// What the balancer was last given of an endpoint, by the one writer of its set
/// ([`Engine::sync_member`](super::Engine::sync_member)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Given {
    /// Nothing: the endpoint is not in the balancer's set.
    Nothing,
    /// A handle made of the endpoint's current service and record.
    Current,
    /// A handle made of a service or record since replaced (an upstream re-insert, new rules, a
    /// rebuilt service): to be replaced in turn while the endpoint stays in the set.
    Stale,
}

/// An ejection and the recovery after it: from the ejection until the endpoint is available
/// again without condition (its trial passed or a probe succeeded). An endpoint ejected again
/// during its trial stays in the same episode, its failed checks with it.
pub(super) struct Episode {
    // Moved only by [`Restanding::set_stage`], which schedules its deadline.
    stage: Standing,
    // Recovery checks failed in a row.
    pub(super) failed_checks: u32,
    // Active checks passed in a row since the last that failed (toward the cadence's healthy
    // threshold).
    pub(super) passed_checks: u32,
    // The ejecting policy's, for the intervals between checks (none for a host's ejection).
    pub(super) schedule: Option<RecoverySchedule>,
    // The policy that ejected the endpoint: its window decides whether a trial saw enough calls.
    pub(super) ejected_by: Ejector,
    // This trial already counted as a failed check (the endpoint breached during it, even if the
    // budget kept it in): one re-admission, one check, however long the budget keeps it on trial.
    pub(super) trial_breached: bool,
    // Calls the ejecting policy's window held at the end of each period of this trial so far.
    pub(super) trial_calls: u64,
    // What the rules would do, in dry run: the endpoint never left the balancer's set.
    pub(super) shadow: bool,
}

impl Episode {
    /// Counts a breach of this trial as a failed recovery check, once per trial: the failed
    /// checks in a row when this is the trial's first breach.
    pub(super) fn breach_trial(&mut self) -> Option<u32> {
        if self.trial_breached {
            return None;
        }
        self.failed_checks = self.failed_checks.saturating_add(1);
        self.passed_checks = 0;
        self.trial_breached = true;
        Some(self.failed_checks)
    }

    /// Where the endpoint is in this episode.
    pub(super) fn stage(&self) -> Standing {
        self.stage
    }

    /// Moves on to `stage`, scheduling its deadline for entry `id` (under `key`) if it has one.
    /// Every move goes through here, so no deadline is ever missing from the heap.
    fn set_stage<K: Clone>(
        &mut self,
        stage: Standing,
        key: &K,
        id: u64,
        deadlines: &mut Deadlines<K>,
    ) {
        if let Some(at) = stage.deadline() {
            deadlines.push(at, key.clone(), id);
        }
        self.stage = stage;
    }
}

impl<S> Entry<S> {
    /// A new endpoint, available, not yet given to the balancer.
    pub(super) fn new(
        slot: u32,
        service: S,
        shared: Arc<Shared>,
        id: u64,
        reported: Arc<Reported>,
    ) -> Self {
        Entry {
            slot,
            given: Given::Nothing,
            leaving: false,
            service,
            shared,
            id,
            episode: None,
            reported,
        }
    }

    /// The ejection the endpoint is out for, or on trial after.
    pub(super) fn episode(&self) -> Option<&Episode> {
        self.episode.as_deref()
    }

    /// The endpoint's record: its policies' windows, latency estimate and weight.
    pub(super) fn record(&self) -> &EndpointRecord {
        &self.shared.record
    }

    /// What a new handle on the endpoint for the balancer is made of (what cloning one gives).
    pub(super) fn endpoint(&self) -> EndpointParts<S>
    where
        S: Clone,
    {
        EndpointParts::new(self.service.clone(), self.shared.clone())
    }

    pub(super) fn standing(&self) -> Standing {
        self.episode
            .as_deref()
            .map_or(Standing::Available, |episode| episode.stage)
    }

    pub(super) fn failed_checks(&self) -> u32 {
        self.episode
            .as_ref()
            .map_or(0, |episode| episode.failed_checks)
    }

    /// What ejected the endpoint, while it is out or on trial.
    pub(super) fn ejected_by(&self) -> Option<Ejector> {
        self.episode.as_ref().map(|episode| episode.ejected_by)
    }

    /// Whether the endpoint is out (ejected or probing) for an ejection of its own, not for its
    /// host: such an endpoint holds its host out in the registry it shares.
    pub(super) fn holds_host_out(&self) -> bool {
        !self.standing().is_available()
            && matches!(self.ejected_by(), Some(Ejector::Policy(_)))
            && !self.is_shadow()
    }

    /// Whether the endpoint's episode is only what the rules would do (dry run).
    pub(super) fn is_shadow(&self) -> bool {
        self.episode.as_ref().is_some_and(|episode| episode.shadow)
    }

    /// Whether the balancer has the endpoint in its set: available, or out only in dry run.
    pub(super) fn in_balancer(&self) -> bool {
        self.standing().is_available() || self.is_shadow()
    }

    /// Whether the balancer is to have the endpoint in its set, `panicking` or not: while the
    /// fleet panics it has every endpoint but one an operator forced out; never one the upstream
    /// removed.
    pub(super) fn in_set(&self, panicking: bool) -> bool {
        !self.leaving
            && (self.in_balancer()
                || (panicking && !matches!(self.standing(), Standing::HeldByOperator)))
    }

    /// Notes that the endpoint's service or record was replaced: a handle given before is stale.
    pub(super) fn replaced(&mut self) {
        if self.given == Given::Current {
            self.given = Given::Stale;
        }
    }

    /// Whether the endpoint is out of the balancer's set for real.
    pub(super) fn is_out(&self) -> bool {
        !self.in_balancer()
    }

    /// Whether the endpoint is out only in dry run (ejected or probing as the rules would have it).
    pub(super) fn is_shadow_out(&self) -> bool {
        !self.standing().is_available() && self.is_shadow()
    }
}

/// A change of one endpoint's standing under way: the only way to write its episode, given by
/// [`Engine::restand`].
pub(super) struct Restanding<'a, K, S> {
    entry: &'a mut Entry<S>,
    key: &'a K,
    deadlines: &'a mut Deadlines<K>,
}

impl<K: Clone, S> Restanding<'_, K, S> {
    /// Its episode, to change what is not its stage (failed checks, schedule, ejector, trial
    /// counts, dry run).
    pub(super) fn episode(&mut self) -> Option<&mut Episode> {
        self.entry.episode.as_deref_mut()
    }

    /// Moves its episode, if any, on to `stage`, scheduling the stage's deadline.
    pub(super) fn set_stage(&mut self, stage: Standing) {
        if let Some(episode) = self.entry.episode.as_deref_mut() {
            episode.set_stage(stage, self.key, self.entry.id, self.deadlines);
        }
    }

    /// Ends its episode: available without condition, its failed checks forgotten.
    pub(super) fn end_episode(&mut self) {
        self.entry.episode = None;
    }

    /// Marks it removed by the upstream: out of the balancer's set, its episode over.
    pub(super) fn leave(&mut self) {
        self.entry.leaving = true;
        self.entry.episode = None;
    }

    /// Takes the endpoint out for `ejected_by` until `next_check` (`None`: held out for its host
    /// or by an operator, with no check of its own), or (`shadow`) would in dry run: an episode
    /// starts, or the one of its trial goes on.
    pub(super) fn eject(
        &mut self,
        ejected_by: Ejector,
        next_check: Option<Instant>,
        shadow: bool,
    ) -> &mut Episode {
        let stage = match (next_check, ejected_by) {
            (Some(next_check), _) => Standing::Ejected { next_check },
            (None, Ejector::Operator) => Standing::HeldByOperator,
            (None, Ejector::Health) => Standing::HeldNotServing,
            (None, _) => Standing::HeldForHost,
        };
        let (key, id) = (self.key, self.entry.id);
        let episode = self.entry.episode.get_or_insert_with(|| {
            Box::new(Episode {
                stage,
                failed_checks: 0,
                passed_checks: 0,
                schedule: None,
                ejected_by,
                trial_breached: false,
                trial_calls: 0,
                shadow,
            })
        });
        episode.ejected_by = ejected_by;
        episode.shadow = shadow;
        episode.set_stage(stage, key, id, self.deadlines);
        episode
    }

    /// Brings the endpoint back: on a new trial until `trial_until`, or (`None`) available
    /// without condition, which ends the episode (its failed checks with it).
    pub(super) fn readmit(&mut self, trial_until: Option<Instant>) {
        match trial_until {
            // Only an endpoint that is out comes back, so it is in an episode.
            Some(until) => {
                if let Some(episode) = self.entry.episode.as_deref_mut() {
                    episode.trial_breached = false;
                    episode.trial_calls = 0;
                    // Passes toward the healthy threshold are in a row: a trial breaks them.
                    episode.passed_checks = 0;
                    episode.set_stage(
                        Standing::Trial { until },
                        self.key,
                        self.entry.id,
                        self.deadlines,
                    );
                }
            }
            None => self.entry.episode = None,
        }
    }
}

/// What follows from an endpoint's standing and is kept beside it, so that it is read in
/// constant time: whether it counts among the endpoints out for real or out in dry run, and
/// whether it holds its host out in the registry it shares.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Derived {
    out: bool,
    shadow_out: bool,
    holds_host: bool,
}

impl Derived {
    fn of<S>(entry: &Entry<S>) -> Derived {
        Derived {
            out: !entry.leaving && entry.is_out(),
            shadow_out: !entry.leaving && entry.is_shadow_out(),
            holds_host: !entry.leaving && entry.holds_host_out(),
        }
    }
}

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Changes `key`'s standing with `change`, the one writer of standing, then brings what
    /// follows from it in line: the counts of endpoints out (for real, and in dry run), the
    /// readiness kept only for endpoints in the set, the host held out, and the balancer's set.
    pub(super) fn restand<R>(
        &mut self,
        key: &K,
        change: impl FnOnce(&mut Restanding<'_, K, S>) -> R,
    ) -> Option<R> {
        let entry = self.entries.get_mut(key)?;
        let before = Derived::of(entry);
        let mut restanding = Restanding {
            entry,
            key,
            deadlines: &mut self.deadlines,
        };
        let result = change(&mut restanding);
        let after = Derived::of(restanding.entry);
        let id = restanding.entry.id;
        if let Some(board) = &self.idle {
            let entry = &restanding.entry;
            board.set_in_service(
                id,
                entry.standing().is_available() && entry.episode().is_none(),
            );
        }
        if after != before {
            self.follow(id, before, after);
        }
        self.sync_member(key);
        Some(result)
    }

    /// Keeps the counts and the shared host in line with a change of standing.
    fn follow(&mut self, id: u64, before: Derived, after: Derived) {
        match (before.out, after.out) {
            (false, true) => self.ejected += 1,
            (true, false) => self.ejected -= 1,
            _ => {}
        }
        match (before.shadow_out, after.shadow_out) {
            (false, true) => {
                self.shadow_out.insert(id);
            }
            (true, false) => {
                self.shadow_out.remove(&id);
            }
            _ => {}
        }
        // Out of the set for real, its readiness no longer counts.
        if after.out && self.unready.remove(&id) {
            self.registry.unready(self.roster, id, false);
        }
        if before.holds_host != after.holds_host {
            self.share_host(id, after.holds_host);
        }
    }

    /// Follows `key`'s readiness as its balancer handle reported it; true if that changed.
    pub(super) fn sync_unready(&mut self, key: &K) -> bool {
        let Some(entry) = self.entries.get(key) else {
            return false;
        };
        // Out in dry run, it is still in the set: whether the balancer can pick it counts.
        let unready = entry.in_balancer() && entry.record().is_unready();
        let id = entry.id;
        let changed = if unready {
            self.unready.insert(id)
        } else {
            self.unready.remove(&id)
        };
        if changed {
            if unready {
                tracing::warn!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    available = self.available(),
                    "endpoint not ready: its service failed poll_ready; not counted as an endpoint to fall back on"
                );
            } else {
                tracing::info!(target: "tower_outlier", endpoint = ?key, "endpoint ready again");
            }
            self.registry.unready(self.roster, id, unready);
        }
        changed
    }

    /// Tells the registry this adaptor holds the host of endpoint `id` out, or no longer does.
    fn share_host(&self, id: u64, out: bool) {
        if let Some(sharing) = &self.sharing {
            if let Some(host) = sharing.hosts.get(&id) {
                sharing.registry.set(sharing.member, host, out);
            }
        }
    }

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

/// Where an endpoint stands: available, or where it is in an [`Episode`] (an episode is never
/// `Available`). The engine's one word for it; the monitor shows it as an
/// [`EndpointStatus`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Standing {
    Available,
    Trial {
        until: Instant,
    },
    Ejected {
        next_check: Instant,
    },
    Probing,
    /// Out because another adaptor sharing its host holds the host out: no check of its own, it
    /// comes back when the host does.
    HeldForHost,
    /// Forced out by an operator: no check, it comes back when released.
    HeldByOperator,
    /// Out because its health service says it is not serving: no check of its own, it comes
    /// back when the service says it is.
    HeldNotServing,
}

impl Standing {
    pub(super) fn is_available(self) -> bool {
        matches!(self, Standing::Available | Standing::Trial { .. })
    }

    pub(super) fn deadline(self) -> Option<Instant> {
        match self {
            Standing::Trial { until } => Some(until),
            Standing::Ejected { next_check } => Some(next_check),
            Standing::Available
            | Standing::Probing
            | Standing::HeldForHost
            | Standing::HeldByOperator
            | Standing::HeldNotServing => None,
        }
    }

    pub(super) fn public(self) -> EndpointStatus {
        match self {
            Standing::Available => EndpointStatus::Available,
            Standing::Trial { .. } => EndpointStatus::Trial,
            Standing::Ejected { .. }
            | Standing::HeldForHost
            | Standing::HeldByOperator
            | Standing::HeldNotServing => EndpointStatus::Ejected,
            Standing::Probing => EndpointStatus::Probing,
        }
    }
}
