//! Endpoints the balancer avoids after a timeout, checked at no caller's expense.
//!
//! A call that times out leaves its endpoint's latency estimate at the timeout, so p2c routes
//! around it (a black hole costs callers no more than that), but nothing else brings it back:
//! no policy need have ejected it, so no recovery check runs, and the estimate takes the better
//! part of a minute to decay. A healed black hole then got no call for 30 s and more. So while an
//! endpoint in the set stands avoided after a timeout, the layer's active probe checks it — 1 s
//! after the timeout, then a check starting every 2 s while it does not answer (a check that
//! times out after 1 s is followed by the next 1 s later, as HAProxy's `inter` spaces its
//! checks) — and the first check
//! that passes restarts its estimate at the fleet's, so p2c gives it its share at once. The
//! endpoint stays in the balancer's set throughout: this is no membership rule, and it writes no
//! standing. Without an active probe nothing is checked (the estimate decays as p2c alone lets
//! it). A [`ProbeCadence`](crate::probe::ProbeCadence) given to the layer sets these times (its
//! first check, interval, timeout, jitter and healthy threshold) as it does for ejected
//! endpoints; they are jittered only when it says so.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::{later, DiscoverKey, Engine, ProbeStart};
use crate::probe::ProbeFuture;

/// Marks a probe's id as an avoided endpoint's check rather than an ejected endpoint's recovery
/// check: the same entry may have one of each in flight, and the adaptor aborts probes by id.
pub(super) const CHECK_TAG: u64 = 1 << 63;

/// The first check, after the timeout that made the endpoint avoided.
const FIRST_CHECK: Duration = Duration::from_secs(1);

/// The time from one check's start to the next while the endpoint does not answer: HAProxy's
/// default `inter`, so a healed endpoint is back as soon as under an active health check. (It was
/// the wait after a failed check: with a check's 1 s timeout, a black hole was checked every 3 s,
/// and a healed one at 5 req/s had half its share back after 4 s against HAProxy's 2 s.)
pub(super) const CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// How long a check may take before it counts as failed: an answer slower than this is no
/// reason to send the endpoint calls again.
pub(super) const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The share of the fleet that may be checked at once: when a whole fleet stalls (an
/// overload), checking every endpoint every 2 s would add a request per endpoint to servers
/// already drowning. A tenth of the endpoints (two at least) at a time, each check taking at
/// most [`CHECK_TIMEOUT`]; the others wait their turn.
const CHECKS_AT_ONCE_PER_ENDPOINTS: usize = 10;

/// The avoided endpoints under watch and when each is checked next.
#[derive(Debug)]
pub(super) struct AvoidedChecks<K> {
    // Checks due, by time and entry id: the key to check.
    due: BTreeMap<(Instant, u64), K>,
    watched: HashMap<K, Watch>,
    // Checks in flight.
    checking: usize,
}

#[derive(Debug, Clone, Copy)]
struct Watch {
    id: u64,
    // When its next check is due; `None` while one is in flight.
    next: Option<Instant>,
    // When the check in flight (or the last one) started.
    started: Instant,
    // A check of it failed, and how many passed in a row since (toward the cadence's healthy
    // threshold).
    failed: bool,
    passes: u32,
}

impl<K> Default for AvoidedChecks<K> {
    fn default() -> Self {
        AvoidedChecks {
            due: BTreeMap::new(),
            watched: HashMap::new(),
            checking: 0,
        }
    }
}

impl<K: DiscoverKey> AvoidedChecks<K> {
    /// Watches entry `id` under `key`, avoided after a timeout at `now`, unless it is already;
    /// its first check `first` later.
    fn watch(&mut self, key: &K, id: u64, now: Instant, first: Duration) {
        if self.watched.get(key).is_some_and(|w| w.id == id) {
            return;
        }
        self.forget(key);
        let next = later(now, first);
        self.due.insert((next, id), key.clone());
        self.watched.insert(
            key.clone(),
            Watch {
                id,
                next: Some(next),
                started: now,
                failed: false,
                passes: 0,
            },
        );
    }

    /// Stops watching `key`.
    pub(super) fn forget(&mut self, key: &K) -> Option<u64> {
        let watch = self.watched.remove(key)?;
        match watch.next {
            Some(next) => {
                self.due.remove(&(next, watch.id));
            }
            None => self.checking = self.checking.saturating_sub(1),
        }
        Some(watch.id)
    }

    /// Puts a due check of `key` off by `wait` (no room to run it now).
    fn defer(&mut self, key: &K, now: Instant, wait: Duration) {
        if let Some(watch) = self.watched.get_mut(key) {
            let next = later(now, wait);
            watch.next = Some(next);
            self.due.insert((next, watch.id), key.clone());
        }
    }

    /// When the next check is due.
    pub(super) fn next(&self) -> Option<Instant> {
        self.due.keys().next().map(|(at, _)| *at)
    }

    /// The checks due at `now`, each marked in flight.
    fn pop_due(&mut self, now: Instant) -> Vec<(K, u64)> {
        let mut due = Vec::new();
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, id), key) = entry.remove_entry();
            if let Some(watch) = self.watched.get_mut(&key) {
                watch.next = None;
                watch.started = now;
                self.checking += 1;
            }
            due.push((key, id));
        }
        due
    }

    /// Whether a pass of `key` now brings it back: it has failed no check, or this pass makes
    /// `threshold` in a row.
    fn enough(&self, key: &K, threshold: u32) -> bool {
        self.watched
            .get(key)
            .is_none_or(|w| !w.failed || w.passes.saturating_add(1) >= threshold)
    }

    /// Whether entry `id` under `key` has a check in flight.
    fn checking(&self, key: &K, id: u64) -> bool {
        self.watched
            .get(key)
            .is_some_and(|w| w.id == id && w.next.is_none())
    }

    /// A check of `key` ended at `now` without bringing it back (it failed, or `passed` short of
    /// the healthy threshold): the next one starts `interval` after this one started.
    fn again(
        &mut self,
        key: &K,
        now: Instant,
        interval: Duration,
        passed: bool,
    ) -> Option<Duration> {
        let watch = self.watched.get_mut(key)?;
        if watch.next.is_none() {
            self.checking = self.checking.saturating_sub(1);
        }
        if passed {
            watch.passes = watch.passes.saturating_add(1);
        } else {
            watch.failed = true;
            watch.passes = 0;
        }
        let wait = interval.saturating_sub(now.saturating_duration_since(watch.started));
        let next = later(now, wait);
        watch.next = Some(next);
        self.due.insert((next, watch.id), key.clone());
        Some(wait)
    }
}

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Watches `key` if its last call timed out and it stands available in the set, for its
    /// own sake (not in dry run's shadow of an ejection, where its rules' check runs).
    pub(super) fn watch_if_avoided(&mut self, key: &K, now: Instant) {
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        if entry.standing().is_available()
            && entry.record().last_timed_out()
            && self
                .avoided
                .watched
                .get(key)
                .is_none_or(|w| w.id != entry.id)
        {
            let first = self.avoided_first_check();
            self.avoided.watch(key, entry.id, now, first);
        }
    }

    /// The first check of an endpoint avoided after a timeout: the cadence's, or 1 s, jittered
    /// as the cadence sets (no default jitter: each client's check follows a timeout of its own
    /// call, at a time of its own, not an ejection the fleet may share).
    fn avoided_first_check(&self) -> Duration {
        let base = self.settings.cadence.first_check.unwrap_or(FIRST_CHECK);
        self.cadenced(base, true, true)
    }

    /// From one check's start to the next while it does not bring the endpoint back: the
    /// cadence's interval, or 2 s, jittered as the cadence sets.
    fn avoided_interval(&self) -> Duration {
        let base = self.settings.cadence.interval.unwrap_or(CHECK_INTERVAL);
        self.cadenced(base, true, false)
    }

    /// Starts the checks that are due (an endpoint that answered a call since, or was taken out
    /// meanwhile, is no longer watched).
    pub(super) fn check_avoided(
        &mut self,
        now: Instant,
        probe: &mut dyn FnMut(&K, &S) -> Option<ProbeFuture>,
    ) {
        let room = (self.entries.len() / CHECKS_AT_ONCE_PER_ENDPOINTS).max(2);
        let already = self.avoided.checking;
        let due = self.avoided.pop_due(now);
        for (index, (key, id)) in due.into_iter().enumerate() {
            let Some(entry) = self.entries.get(&key).filter(|e| e.id == id) else {
                self.avoided.forget(&key);
                continue;
            };
            if !entry.standing().is_available() || !entry.record().last_timed_out() {
                self.avoided.forget(&key);
                continue;
            }
            if already + index >= room {
                // Marked in flight by `pop_due`: back to waiting, its turn a moment later.
                self.avoided.checking = self.avoided.checking.saturating_sub(1);
                self.avoided.defer(&key, now, FIRST_CHECK);
                continue;
            }
            match probe(&key, &entry.service) {
                Some(probe) => {
                    tracing::debug!(target: "tower_outlier", endpoint = ?key, "checking an endpoint avoided after a timeout");
                    self.probes.push_back(ProbeStart {
                        key: key.clone(),
                        id: id | CHECK_TAG,
                        probe,
                        timeout: self.settings.cadence.timeout.unwrap_or(CHECK_TIMEOUT),
                    });
                }
                // No active probe: nothing checks it at no caller's expense.
                None => {
                    self.avoided.forget(&key);
                }
            }
        }
    }

    /// An avoided endpoint's check is done: one that answered gets its share back at once
    /// (its estimate restarted at the fleet's), one that did not is checked again later.
    pub(super) fn avoided_checked(&mut self, key: &K, id: u64, healthy: bool, now: Instant) {
        if !self.avoided.checking(key, id) {
            return;
        }
        let Some(entry) = self.entries.get(key).filter(|e| e.id == id) else {
            self.avoided.forget(key);
            return;
        };
        if !entry.standing().is_available() || !entry.record().last_timed_out() {
            // Taken out, or a call answered meanwhile: nothing more to do here.
            self.avoided.forget(key);
            return;
        }
        let threshold = self.settings.cadence.healthy_threshold;
        if healthy && !self.avoided.enough(key, threshold) {
            let interval = self.avoided_interval();
            if let Some(wait) = self.avoided.again(key, now, interval, true) {
                tracing::debug!(target: "tower_outlier", endpoint = ?key, next_check_in = ?wait, "an endpoint avoided after a timeout passed a check, short of its healthy threshold");
            }
        } else if healthy {
            let shared = entry.shared.clone();
            self.avoided.forget(key);
            self.seed_rtt(&shared.record);
            shared.record.end_timeout_avoidance();
            tracing::info!(target: "tower_outlier", endpoint = ?key, "an endpoint avoided after a timeout answered its check: back to its share");
        } else if let Some(wait) = {
            let interval = self.avoided_interval();
            self.avoided.again(key, now, interval, false)
        } {
            tracing::debug!(target: "tower_outlier", endpoint = ?key, next_check_in = ?wait, "an endpoint avoided after a timeout did not answer its check");
        }
    }
}
