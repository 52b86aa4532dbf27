//! The registry behind a monitor: every adaptor's roster of endpoints, and the snapshots and
//! events read from them.

use std::collections::hash_map;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tokio::time::Instant;
use tower_outlier_core::{LockGuard, Reason};

use super::{IdMap, IdTable};
use crate::controls::Override;
use crate::event::{EndpointKey, Event};
use crate::shared::Shared;

use super::*;

/// Where an adaptor put an endpoint, as [`Registry::publish`] records it.
pub(crate) struct Placement {
    pub(crate) status: EndpointStatus,
    // The status is what dry run would do: the endpoint is in the balancer's set.
    pub(crate) dry_run: bool,
    pub(crate) next_check: Option<Instant>,
    pub(crate) failed_checks: u32,
}

impl Registry {
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The rosters, for an adaptor: it is counted as waiting while another holds them, so that a
    /// snapshot lets it in between batches.
    pub(super) fn rosters(&self) -> LockGuard<'_, IdMap<Roster>> {
        if let Some(rosters) = self.rosters.try_lock() {
            return rosters;
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let rosters = self.rosters.lock();
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        rosters
    }

    /// Lets the adaptors waiting for the rosters take them first (a snapshot, between batches).
    pub(super) fn give_way(&self) {
        // Bounded: an adaptor counted as waiting takes the free lock within microseconds, but a
        // snapshot must not wait on one descheduled for long.
        for _ in 0..1_000 {
            if self.waiting.load(Ordering::Acquire) == 0 {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// A new adaptor, with no endpoint yet and the policies named `policies`: its roster's id.
    pub(crate) fn join(&self, policies: Arc<[&'static str]>) -> u64 {
        let roster = self.next_id();
        let joined = Roster {
            policies,
            endpoints: IdTable::default(),
            shown: IdMap::default(),
            no_ejection: None,
            all_out: None,
        };
        self.rosters().insert(roster, joined);
        roster
    }

    /// The adaptor of `roster` is gone, and so are its endpoints: they are returned.
    pub(crate) fn leave(&self, roster: u64) -> IdTable<Tracked> {
        let removed = self.rosters().remove(&roster);
        removed.map(|roster| roster.endpoints).unwrap_or_default()
    }

    /// A new endpoint of the adaptor of `roster`: its id.
    pub(crate) fn insert(&self, roster: u64, tracked: Tracked) -> u64 {
        let id = self.next_id();
        if let Some(roster) = self.rosters().get_mut(&roster) {
            roster.endpoints.insert(id, tracked);
        }
        id
    }

    /// Sends the event `make` builds about endpoint `id` of `roster` from the key the monitor
    /// holds for it, if anybody listens.
    pub(crate) fn emit_about(&self, roster: u64, id: u64, make: impl FnOnce(EndpointKey) -> Event) {
        if !self.events.listened() {
            return;
        }
        let key = self
            .rosters()
            .get(&roster)
            .and_then(|roster| roster.endpoints.get(&id))
            .map(|tracked| tracked.key.clone());
        if let Some(key) = key {
            self.events.emit(|| make(key));
        }
    }

    pub(crate) fn remove(&self, roster: u64, id: u64) -> Option<Tracked> {
        let mut rosters = self.rosters();
        let roster = rosters.get_mut(&roster)?;
        roster.shown.remove(&id);
        roster.endpoints.remove(&id)
    }

    /// New rules in the adaptor of `roster`: its policies are named `policies`, and each endpoint
    /// has a new record. All at once, so no snapshot reads a record with another's names.
    pub(crate) fn reconfigure(
        &self,
        roster: u64,
        policies: Arc<[&'static str]>,
        records: impl IntoIterator<Item = (u64, Weak<Shared>)>,
    ) {
        let mut rosters = self.rosters();
        let Some(roster) = rosters.get_mut(&roster) else {
            return;
        };
        roster.policies = policies;
        for (id, record) in records {
            if let Some(tracked) = roster.endpoints.get_mut(&id) {
                tracked.record = record;
            }
        }
    }

    /// An adaptor put `version` of the rules in force; whether it is the first to.
    pub(crate) fn rules_in_force(&self, version: u64) -> bool {
        let mut rules = self.rules.lock();
        let newer = version > rules.0;
        rules.0 = rules.0.max(version);
        newer
    }

    /// An adaptor applied `version` of the rules (not at start-up): one event per version, from
    /// the first adaptor of the layer to apply it.
    pub(crate) fn rules_applied(&self, version: u64) {
        if self.rules_in_force(version) {
            self.events.emit(|| Event::RulesApplied { version });
        }
    }

    /// The notes of the last accepted document ([`Dialect::parse`](crate::dialect::Dialect::parse)).
    pub(crate) fn rules_notes(&self, notes: Vec<String>) {
        *self.rules_notes.lock() = notes;
    }

    /// The last reconfiguration was refused for `error`, or accepted (`None`: its notes are
    /// cleared too, until the dialect's are set).
    /// A configuration source's trouble (not a refused document: no event, the notes kept).
    #[cfg(any(feature = "etcd", feature = "file-source"))]
    pub(crate) fn source_trouble(&self, trouble: Option<String>) {
        self.rules.lock().1 = trouble;
    }

    pub(crate) fn rules_error(&self, error: Option<String>) {
        if error.is_none() {
            self.rules_notes.lock().clear();
        }
        self.rules.lock().1 = error.clone();
        if let Some(error) = error {
            self.events.emit(|| Event::RulesRejected { error });
        }
    }

    /// Records where the adaptor of `roster` put endpoint `id`, and `reason` if it has just been
    /// judged an outlier (the last reason stays otherwise).
    pub(crate) fn publish(&self, roster: u64, id: u64, placed: Placement, reason: Option<Reason>) {
        let Placement {
            status,
            dry_run,
            next_check,
            failed_checks,
        } = placed;
        let mut rosters = self.rosters();
        let Some(roster) = rosters.get_mut(&roster) else {
            return;
        };
        if !roster.endpoints.contains_key(&id) {
            return;
        }
        let standing = match roster.shown.entry(id) {
            hash_map::Entry::Occupied(standing) => standing.into_mut(),
            hash_map::Entry::Vacant(vacant) => {
                let initial = status == EndpointStatus::Available
                    && !dry_run
                    && next_check.is_none()
                    && failed_checks == 0
                    && reason.is_none();
                if initial {
                    // Nothing to hold: it stands where every endpoint starts.
                    return;
                }
                vacant.insert(Box::new(Shown::INITIAL))
            }
        };
        standing.status = status;
        standing.dry_run = dry_run;
        standing.next_check = next_check;
        standing.failed_checks = failed_checks;
        if let Some(reason) = reason {
            standing.last_reason = Some(reason);
        }
    }

    /// Shows the operator's override of endpoint `id`, or (`None`) that it has none.
    pub(crate) fn overridden(&self, roster: u64, id: u64, forced: Option<Override>) {
        let mut rosters = self.rosters();
        let Some(roster) = rosters.get_mut(&roster) else {
            return;
        };
        if !roster.endpoints.contains_key(&id) {
            return;
        }
        match roster.shown.entry(id) {
            hash_map::Entry::Occupied(standing) => standing.into_mut().forced = forced,
            hash_map::Entry::Vacant(vacant) if forced.is_some() => {
                vacant.insert(Box::new(Shown {
                    forced,
                    ..Shown::INITIAL
                }));
            }
            hash_map::Entry::Vacant(_) => {}
        }
    }

    /// Shows the layer-wide dry run on or off, and the policies in dry run of their own.
    pub(crate) fn dry_run(&self, on: bool, policies: Vec<&'static str>) {
        *self.dry_run.lock() = (on, policies);
    }

    /// Shows endpoint `id` not ready (its service failed `poll_ready`), or ready again.
    pub(crate) fn unready(&self, roster: u64, id: u64, unready: bool) {
        let mut rosters = self.rosters();
        let Some(roster) = rosters.get_mut(&roster) else {
            return;
        };
        if !roster.endpoints.contains_key(&id) {
            return;
        }
        match roster.shown.entry(id) {
            hash_map::Entry::Occupied(standing) => standing.into_mut().unready = unready,
            hash_map::Entry::Vacant(vacant) if unready => {
                vacant.insert(Box::new(Shown {
                    unready,
                    ..Shown::INITIAL
                }));
            }
            hash_map::Entry::Vacant(_) => {}
        }
    }

    /// Counts an upstream error an adaptor kept serving through.
    pub(crate) fn discover_error(&self) {
        self.discover_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Shows why the adaptor of `roster` can eject nothing now, or (`None`) that it can.
    pub(crate) fn no_ejection(&self, roster: u64, why: Option<String>) {
        if let Some(roster) = self.rosters().get_mut(&roster) {
            roster.no_ejection = why.map(String::into_boxed_str);
        }
    }

    /// Shows why the balancer of the adaptor of `roster` has every endpoint or none, or (`None`)
    /// that it has the ones the rules leave in; `nothing` counts it as having none to pick.
    pub(crate) fn all_out(&self, roster: u64, why: Option<String>, nothing: Option<bool>) {
        if let Some(roster) = self.rosters().get_mut(&roster) {
            roster.all_out = why.map(String::into_boxed_str);
        }
        match nothing {
            Some(true) => {
                self.nothing_to_pick.fetch_add(1, Ordering::AcqRel);
            }
            Some(false) => {
                self.nothing_to_pick.fetch_sub(1, Ordering::AcqRel);
            }
            None => {}
        }
    }

    /// Shows why the layer keeps endpoint `id` in although a policy judged it an outlier, or
    /// (`None`) that it no longer does.
    pub(crate) fn refused(&self, roster: u64, id: u64, why: Option<String>) {
        let mut rosters = self.rosters();
        let Some(roster) = rosters.get_mut(&roster) else {
            return;
        };
        if !roster.endpoints.contains_key(&id) {
            return;
        }
        match (roster.shown.entry(id), why) {
            (hash_map::Entry::Occupied(standing), why) => {
                standing.into_mut().refused = why.map(String::into_boxed_str);
            }
            (hash_map::Entry::Vacant(vacant), Some(why)) => {
                vacant.insert(Box::new(Shown {
                    refused: Some(why.into_boxed_str()),
                    ..Shown::INITIAL
                }));
            }
            (hash_map::Entry::Vacant(_), None) => {}
        }
    }
}
