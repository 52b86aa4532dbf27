//! Endpoints in service that get no traffic, checked at no caller's expense (Envoy's
//! `no_traffic_interval`, HAProxy's `inter` with `fall`).
//!
//! Calls judge an endpoint that gets them; one that gets none — a quiet service at night, a
//! standby nobody picks — is judged by nothing, so the first call after the quiet finds a server
//! that died in it. And in a quiet service nothing polls the adaptor either: behind tower's
//! `Buffer`, the balancer (and the adaptor in it) is polled only when a request comes. So these
//! checks run in a task of their own, the keeper, spawned by the adaptor on its first poll with
//! a clone of the layer's probe: it looks at each endpoint in service every
//! [`no_traffic_interval`](crate::probe::ProbeCadence::no_traffic_interval), checks the ones with
//! no call completed or in flight for that long, and counts their failed checks on the
//! [`IdleBoard`] it shares with the engine. At the cadence's `unhealthy_threshold` it wakes the
//! adaptor; the engine judges the endpoint — through the room rule a server's own word goes
//! through, within the budget and never the last endpoint ([`Engine::decide`]) — when the
//! adaptor is next polled, which is before the balancer picks for the first request after the
//! quiet. The endpoint comes back as an ejected endpoint does, by its checks. Its count ends
//! when it leaves service (ejected, on trial) and as soon as it gets traffic.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::future::{AbortHandle, AbortRegistration, Abortable};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;
use tower_outlier_core::{duration_to_nanos, Clock, Lock, LockGuard, Nanos, Notifier};

use super::{DiscoverKey, Engine};
use crate::probe::{Probe, ProbeCadence};
use crate::shared::Shared;

/// How long a check may take unless the cadence says: as an avoided endpoint's.
const IDLE_CHECK_TIMEOUT: Duration = super::avoided::CHECK_TIMEOUT;

/// A thousand idle endpoints whose turns fall together are checked a tenth at a time, the
/// others an eighth of an interval later; a small fleet is checked whole.
const CHECKS_AT_ONCE_PER_ENDPOINTS: usize = 10;
const CHECKS_AT_ONCE_AT_LEAST: usize = 16;

/// What the engine and the keeper share: the endpoints, when each is looked at next, their
/// failed checks, and the ones that reached the threshold since the engine last looked.
pub(crate) struct IdleBoard<K, S> {
    state: Lock<BoardState<K, S>>,
    // Wakes the keeper: an endpoint enrolled, or the adaptor gone.
    changed: tokio::sync::Notify,
    // Wakes the adaptor: an endpoint reached the threshold.
    notifier: Arc<Notifier>,
    every: Duration,
    threshold: u32,
    timeout: Duration,
    clock: Clock,
    cadence: ProbeCadence,
}

/// The checks to start and when the next turn is.
type Turns<K, S> = (Vec<Start<K, S>>, Option<Instant>);

/// A check to start: of entry `id`'s service as of `generation`, abortable through the handle
/// the board keeps.
pub(crate) struct Start<K, S> {
    id: u64,
    generation: u64,
    key: K,
    service: S,
    registration: AbortRegistration,
}

struct BoardState<K, S> {
    endpoints: HashMap<u64, Idle<K, S>>,
    due: BTreeMap<(Instant, u64), ()>,
    flagged: Vec<(u64, K)>,
    checking: usize,
    closed: bool,
}

struct Idle<K, S> {
    key: K,
    service: S,
    shared: Arc<Shared>,
    // Records replaced by new rules while calls were in flight on them: those calls are its
    // traffic until they end (they complete on the record they started on).
    previous: Vec<Arc<Shared>>,
    // The latest completion on a replaced record, once its calls ended.
    completed_floor: Nanos,
    // Available in the balancer's set, with no episode: judged by its calls or by these checks.
    in_service: bool,
    failed: u32,
    // When (the record's clock) the last failed check was counted: a call completed since
    // means its calls judge it again.
    failed_at: Nanos,
    next: Option<Instant>,
    // The check in flight, aborted if the endpoint leaves or gets a new service.
    check: Option<AbortHandle>,
    // Bumped with each new service: a check of an older one does not count.
    generation: u64,
}

impl<K, S> Idle<K, S> {
    /// Its calls in flight and its last completion at `now`, on its record and on any record
    /// new rules replaced while its calls were in flight (those are let go once their calls
    /// end).
    fn activity(&mut self, now: Nanos) -> (usize, Nanos) {
        let (mut in_flight, _) = self.shared.pending(now);
        let mut last = self
            .shared
            .record
            .last_completed()
            .max(self.completed_floor);
        let mut floor = self.completed_floor;
        self.previous.retain(|old| {
            let (calls, _) = old.pending(now);
            let completed = old.record.last_completed();
            last = last.max(completed);
            in_flight += calls;
            if calls == 0 {
                floor = floor.max(completed);
            }
            calls > 0
        });
        self.completed_floor = floor;
        (in_flight, last)
    }

    /// Gives up the check in flight, if any: whether there was one.
    fn abort_check(&mut self) -> bool {
        match self.check.take() {
            Some(check) => {
                check.abort();
                true
            }
            None => false,
        }
    }
}

impl<K, S> fmt::Debug for IdleBoard<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleBoard")
            .field("every", &self.every)
            .field("threshold", &self.threshold)
            .finish_non_exhaustive()
    }
}

impl<K, S> IdleBoard<K, S> {
    /// A board for checks every `every`, taken out at the cadence's threshold, waking the
    /// adaptor through `notifier`.
    pub(super) fn new(
        cadence: &ProbeCadence,
        every: Duration,
        notifier: Arc<Notifier>,
        clock: Clock,
    ) -> Self {
        IdleBoard {
            state: Lock::new(BoardState {
                endpoints: HashMap::new(),
                due: BTreeMap::new(),
                flagged: Vec::new(),
                checking: 0,
                closed: false,
            }),
            changed: tokio::sync::Notify::new(),
            notifier,
            every,
            threshold: cadence.unhealthy_threshold,
            timeout: cadence.timeout.unwrap_or(IDLE_CHECK_TIMEOUT),
            clock,
            cadence: cadence.clone(),
        }
    }

    /// The adaptor is gone: the keeper ends (and its checks with it).
    pub(super) fn close(&self) {
        self.state.lock().closed = true;
        self.changed.notify_one();
    }
}

impl<K: DiscoverKey, S: Clone> IdleBoard<K, S> {
    // No user code runs under it (a probe starts outside).
    fn state(&self) -> LockGuard<'_, BoardState<K, S>> {
        self.state.lock()
    }

    /// An interval, jittered as the cadence says (20 % by default).
    fn interval(&self) -> Duration {
        self.cadence.jittered(self.every, false, false)
    }

    /// Enrolls entry `id`, just joined at `now`: looked at one interval later.
    pub(super) fn enroll(&self, id: u64, key: K, service: S, shared: Arc<Shared>, now: Instant) {
        let next = super::later(now, self.interval());
        let mut state = self.state();
        state.endpoints.insert(
            id,
            Idle {
                key,
                service,
                shared,
                previous: Vec::new(),
                completed_floor: 0,
                in_service: true,
                failed: 0,
                failed_at: 0,
                next: Some(next),
                check: None,
                generation: 0,
            },
        );
        state.due.insert((next, id), ());
        drop(state);
        self.changed.notify_one();
    }

    /// Entry `id` has a new service (the upstream's, or one made on its return): a check of the
    /// old one in flight is given up, and the new one is looked at an interval later.
    pub(super) fn replace_service(&self, id: u64, service: S, now: Instant) {
        let next = super::later(now, self.interval());
        let mut state = self.state();
        let Some(idle) = state.endpoints.get_mut(&id) else {
            return;
        };
        idle.service = service;
        idle.generation = idle.generation.wrapping_add(1);
        if idle.abort_check() {
            state.checking = state.checking.saturating_sub(1);
            if let Some(idle) = state.endpoints.get_mut(&id) {
                idle.next = Some(next);
            }
            state.due.insert((next, id), ());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// New rules gave entry `id` a new record: the old one's calls in flight still count as its
    /// traffic.
    pub(super) fn replace_record(&self, id: u64, shared: Arc<Shared>) {
        let recorded_now = self.clock.now();
        let mut state = self.state();
        if let Some(idle) = state.endpoints.get_mut(&id) {
            let old = std::mem::replace(&mut idle.shared, shared);
            if old.pending(recorded_now).0 > 0 {
                idle.previous.push(old);
            } else {
                idle.completed_floor = idle.completed_floor.max(old.record.last_completed());
            }
        }
    }

    /// Entry `id` left the upstream: its check in flight is given up.
    pub(super) fn forget(&self, id: u64) {
        let mut state = self.state();
        if let Some(mut idle) = state.endpoints.remove(&id) {
            if let Some(next) = idle.next {
                state.due.remove(&(next, id));
            }
            if idle.abort_check() {
                state.checking = state.checking.saturating_sub(1);
            }
        }
    }

    /// Entry `id` is in service, or not (ejected, on trial, out in dry run): coming back, what
    /// its checks found before is past.
    pub(super) fn set_in_service(&self, id: u64, in_service: bool) {
        let mut state = self.state();
        if let Some(idle) = state.endpoints.get_mut(&id) {
            if in_service && !idle.in_service {
                idle.failed = 0;
            }
            idle.in_service = in_service;
        }
    }

    /// The failed checks in a row that make entry `id` an outlier, and the threshold, if it has
    /// that many and no call completed since the last of them, nor is one in flight (its calls
    /// judge it then: a count kept in for want of room must not take out an endpoint that
    /// serves).
    pub(super) fn outlier(&self, id: u64) -> Option<(u32, u32)> {
        let recorded_now = self.clock.now();
        let mut state = self.state();
        let idle = state.endpoints.get_mut(&id)?;
        if idle.failed < self.threshold {
            return None;
        }
        let (in_flight, last) = idle.activity(recorded_now);
        if in_flight > 0 || last > idle.failed_at {
            return None;
        }
        Some((idle.failed, self.threshold))
    }

    /// The entries that reached the threshold since the engine last asked, with their keys.
    pub(super) fn take_flagged(&self) -> Vec<(u64, K)> {
        let mut state = self.state();
        if state.flagged.is_empty() {
            return Vec::new();
        }
        std::mem::take(&mut state.flagged)
    }

    /// Takes the turns that are due at `now`: the checks to start (each marked in flight), and
    /// when the next turn is. `None` once the board is closed.
    fn due(&self, now: Instant) -> Option<Turns<K, S>> {
        let every = self.every;
        let quiet = duration_to_nanos(every);
        let recorded_now = self.clock.now();
        let mut state = self.state();
        if state.closed {
            return None;
        }
        let room =
            (state.endpoints.len() / CHECKS_AT_ONCE_PER_ENDPOINTS).max(CHECKS_AT_ONCE_AT_LEAST);
        let mut start = Vec::new();
        while let Some(entry) = state.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, id), ()) = entry.remove_entry();
            let checking = state.checking;
            let Some(idle) = state.endpoints.get_mut(&id) else {
                continue;
            };
            idle.next = None;
            let wait = if !idle.in_service {
                // Its recovery checks or its trial's calls judge it: looked at again later.
                self.interval()
            } else {
                let (in_flight, last) = idle.activity(recorded_now);
                let since = recorded_now.saturating_sub(last);
                if in_flight > 0 || since < quiet {
                    // Traffic: its calls judge it, and what its checks found is past.
                    idle.failed = 0;
                    let rest = Duration::from_nanos(quiet - since.min(quiet));
                    self.cadence.jittered(rest.max(every / 8), false, false)
                } else if checking >= room {
                    every / 8
                } else {
                    let (handle, registration) = AbortHandle::new_pair();
                    idle.check = Some(handle);
                    start.push(Start {
                        id,
                        generation: idle.generation,
                        key: idle.key.clone(),
                        service: idle.service.clone(),
                        registration,
                    });
                    state.checking += 1;
                    continue;
                }
            };
            let next = super::later(now, wait);
            if let Some(idle) = state.endpoints.get_mut(&id) {
                idle.next = Some(next);
            }
            state.due.insert((next, id), ());
        }
        let next = state.due.keys().next().map(|(at, _)| *at);
        Some((start, next))
    }

    /// Entry `id`'s check of its service as of `generation` ended at `now`: its next turn an
    /// interval later; a failure counted, and the adaptor woken when the count reaches the
    /// threshold (once per run of failures: one kept in for want of room is retried by the
    /// engine when room appears, not at each failure after).
    fn checked(&self, id: u64, generation: u64, healthy: bool, now: Instant) {
        let next = super::later(now, self.interval());
        let recorded_now = self.clock.now();
        let mut state = self.state();
        let Some(idle) = state.endpoints.get_mut(&id) else {
            return;
        };
        if idle.generation != generation || idle.check.take().is_none() {
            return;
        }
        idle.next = Some(next);
        let reached = if healthy || !idle.in_service {
            idle.failed = 0;
            false
        } else {
            idle.failed = idle.failed.saturating_add(1);
            idle.failed_at = recorded_now;
            tracing::debug!(
                target: "tower_outlier",
                endpoint = ?idle.key,
                failed = idle.failed,
                unhealthy_threshold = self.threshold,
                "an endpoint without traffic failed its check"
            );
            idle.failed == self.threshold
        };
        let key = reached.then(|| idle.key.clone());
        state.checking = state.checking.saturating_sub(1);
        state.due.insert((next, id), ());
        if let Some(key) = key {
            state.flagged.push((id, key));
            drop(state);
            self.notifier.notify();
        }
    }
}

/// The keeper: runs `board`'s checks with `probe` until the board closes.
pub(crate) async fn keep<K, S, P>(board: Arc<IdleBoard<K, S>>, mut probe: P)
where
    K: DiscoverKey,
    S: Clone + Send + 'static,
    P: Probe<K, S>,
{
    type Check = Abortable<Pin<Box<dyn Future<Output = (u64, u64, bool)> + Send>>>;
    let mut checks: FuturesUnordered<Check> = FuturesUnordered::new();
    loop {
        let Some((start, next)) = board.due(Instant::now()) else {
            return;
        };
        for Start {
            id,
            generation,
            key,
            service,
            registration,
        } in start
        {
            let check = crate::discover::start_user_probe(&mut probe, &key, &service)
                .unwrap_or_else(|| Box::pin(std::future::ready(true)));
            let guarded = crate::discover::guarded(check, board.timeout);
            tracing::debug!(target: "tower_outlier", endpoint = ?key, "checking an endpoint in service that gets no traffic");
            let check: Pin<Box<dyn Future<Output = (u64, u64, bool)> + Send>> =
                Box::pin(async move { (id, generation, guarded.await) });
            checks.push(Abortable::new(check, registration));
        }
        let mut changed = pin!(board.changed.notified());
        let mut sleep = next.map(|at| Box::pin(tokio::time::sleep_until(at)));
        let done = std::future::poll_fn(|cx| {
            // A check given up (its endpoint left, or got a new service) ends as aborted.
            while let Poll::Ready(Some(done)) = checks.poll_next_unpin(cx) {
                if let Ok(done) = done {
                    return Poll::Ready(Some(done));
                }
            }
            if changed.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            if let Some(sleep) = sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
            }
            Poll::Pending
        })
        .await;
        if let Some((id, generation, healthy)) = done {
            board.checked(id, generation, healthy, Instant::now());
        }
    }
}

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// The failed checks that make an endpoint in service an outlier, if entry `id` has that
    /// many (and the layer checks idle endpoints).
    pub(super) fn idle_failures(&self, id: u64) -> Option<(u32, u32)> {
        self.idle.as_ref()?.outlier(id)
    }

    /// Judges the endpoints whose checks reached the threshold since the last look.
    pub(super) fn idle_flagged(&mut self, now: tokio::time::Instant) {
        let Some(board) = &self.idle else {
            return;
        };
        let mut flagged = board.take_flagged();
        // In discovery order, as the records' signals are judged: the first discovered wins a
        // budget slot several compete for.
        flagged.sort_unstable_by_key(|(id, _)| *id);
        for (id, key) in flagged {
            if self.entries.get(&key).is_some_and(|e| e.id == id) {
                self.consider(&key, now);
            }
        }
    }

    /// The board a keeper is to run, if the layer checks idle endpoints, its probe sends
    /// checks and no keeper runs yet.
    pub(crate) fn idle_keeper_wanted(&self) -> Option<Arc<IdleBoard<K, S>>> {
        if !self.checks_sent || self.idle_keeper_started {
            return None;
        }
        self.idle.clone()
    }

    /// A keeper runs (or never will: the probe has no idle checker), so none is wanted again.
    pub(crate) fn idle_keeper_settled(&mut self) {
        self.idle_keeper_started = true;
    }
}
