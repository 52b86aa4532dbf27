//! What the admin component remembers: a sample of every endpoint at each tick, and the latest
//! events, both bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use tower_outlier_core::Lock;

use super::latest::Answering;
use crate::event::Event;
use crate::monitor::{EndpointStatus, Monitor, Snapshot};

/// One endpoint at one tick.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    /// Its place in [`History::keys`].
    pub(super) endpoint: u32,
    pub(super) out: bool,
    pub(super) error_rate: f32,
    /// Calls in its first policy's window: its share of the tick's traffic is this over the sum.
    pub(super) calls: u32,
}

/// Every endpoint sampled at one moment.
#[derive(Clone, Debug)]
pub(super) struct Tick {
    /// Its number: 1 for the first tick the component sampled, one more for each after.
    pub(super) seq: u64,
    pub(super) at: SystemTime,
    pub(super) samples: Vec<Sample>,
}

/// An event as the admin component keeps it.
#[derive(Clone, Debug)]
pub(super) struct Kept {
    pub(super) at: SystemTime,
    pub(super) event: Event,
}

/// The bounded memory of the admin component, in two parts under locks of their own: the
/// timeline, written by the sampler, and the journal of events, written by the event callback on
/// the balancer's task. Each lock is held only to push or to copy pointers: a reader builds its
/// document from a [`History`] copied out ([`Memory::history`]), outside both, so no page however
/// large holds up a balancer that emits an event (building `/history` at 256 endpoints × 300
/// ticks under the one lock the callback also took stalled the balancer's poll for 249 ms).
#[derive(Debug)]
pub(super) struct Memory {
    timeline: Lock<Timeline>,
    journal: Lock<Journal>,
    limits: Limits,
}

#[derive(Debug)]
struct Timeline {
    ticks: VecDeque<Arc<Tick>>,
    /// Endpoint keys by their index in samples, and back.
    keys: Arc<Vec<String>>,
    index: HashMap<String, u32>,
    /// Endpoints not sampled because [`Limits::endpoints`] were already tracked.
    untracked: usize,
    /// The number of the last tick sampled (0 before the first).
    last_seq: u64,
}

#[derive(Debug, Default)]
struct Journal {
    events: VecDeque<Arc<Kept>>,
    /// When each endpoint out of rotation now was last ejected.
    ejected_since: HashMap<Arc<str>, SystemTime>,
}

/// What a reader of the admin component sees: a copy of the memory's pointers, taken in
/// microseconds, read without any lock.
#[derive(Debug)]
pub(super) struct History {
    pub(super) ticks: Vec<Arc<Tick>>,
    pub(super) keys: Arc<Vec<String>>,
    pub(super) untracked: usize,
    pub(super) events: Vec<Arc<Kept>>,
    pub(super) ejected_since: HashMap<Arc<str>, SystemTime>,
    limits: Limits,
}

/// Which parts of the memory a reader copies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Parts {
    Timeline,
    Journal,
    Both,
}

/// How much the admin component keeps.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) every: Duration,
    pub(super) ticks: usize,
    pub(super) endpoints: usize,
    pub(super) events: usize,
}

impl Memory {
    pub(super) fn new(limits: Limits) -> Self {
        Memory {
            timeline: Lock::new(Timeline {
                ticks: VecDeque::with_capacity(limits.ticks.min(1024)),
                keys: Arc::default(),
                index: HashMap::new(),
                untracked: 0,
                last_seq: 0,
            }),
            journal: Lock::new(Journal::default()),
            limits,
        }
    }

    /// A copy of `parts` of the memory for a reader: pointers only, under each lock in turn.
    pub(super) fn history(&self, parts: Parts) -> History {
        let mut history = History {
            ticks: Vec::new(),
            keys: Arc::default(),
            untracked: 0,
            events: Vec::new(),
            ejected_since: HashMap::new(),
            limits: self.limits,
        };
        if parts != Parts::Journal {
            let timeline = self.timeline.lock();
            history.ticks = timeline.ticks.iter().cloned().collect();
            history.keys = timeline.keys.clone();
            history.untracked = timeline.untracked;
        }
        if parts != Parts::Timeline {
            let journal = self.journal.lock();
            history.events = journal.events.iter().cloned().collect();
            history.ejected_since = journal.ejected_since.clone();
        }
        history
    }

    /// Samples every endpoint of `snapshot`, taken at `at`.
    pub(super) fn sample(&self, at: SystemTime, snapshot: &Snapshot) {
        self.timeline.lock().sample(at, snapshot, self.limits);
    }

    /// Keeps `event`, seen at `at`: on the balancer's task, under the journal's lock only.
    pub(super) fn record(&self, at: SystemTime, event: &Event) {
        let kept = Arc::new(Kept {
            at,
            event: event.clone(),
        });
        let limits = self.limits;
        let mut journal = self.journal.lock();
        match event {
            Event::Ejected { key, .. }
                if journal.ejected_since.len() < limits.endpoints
                    || journal.ejected_since.contains_key(key.as_str()) =>
            {
                journal.ejected_since.insert(Arc::from(key.as_str()), at);
            }
            Event::Readmitted { key, .. } | Event::Removed { key, .. } => {
                journal.ejected_since.remove(key.as_str());
            }
            _ => {}
        }
        if journal.events.len() == limits.events {
            journal.events.pop_front();
        }
        journal.events.push_back(kept);
    }
}

impl History {
    pub(super) fn limits(&self) -> Limits {
        self.limits
    }
}

impl Timeline {
    fn sample(&mut self, at: SystemTime, snapshot: &Snapshot, limits: Limits) {
        let mut samples = Vec::with_capacity(snapshot.endpoints.len().min(limits.endpoints));
        let mut untracked = 0;
        for endpoint in &snapshot.endpoints {
            let key = endpoint.key.as_str();
            let index = match self.index.get(key) {
                Some(&index) => index,
                None if self.keys.len() < limits.endpoints => {
                    let index = self.keys.len() as u32;
                    // Copied only if a reader still holds the old list.
                    Arc::make_mut(&mut self.keys).push(key.to_owned());
                    self.index.insert(key.to_owned(), index);
                    index
                }
                None => {
                    untracked += 1;
                    continue;
                }
            };
            let calls = endpoint.windows.first().map_or(0, |w| w.counts.calls);
            samples.push(Sample {
                endpoint: index,
                out: matches!(
                    endpoint.status,
                    EndpointStatus::Ejected | EndpointStatus::Probing
                ),
                error_rate: endpoint.error_rate as f32,
                calls: u32::try_from(calls).unwrap_or(u32::MAX),
            });
        }
        self.untracked = untracked;
        if self.ticks.len() == limits.ticks {
            self.ticks.pop_front();
        }
        self.last_seq += 1;
        self.ticks.push_back(Arc::new(Tick {
            seq: self.last_seq,
            at,
            samples,
        }));
        self.forget_gone(limits);
    }

    /// Drops the keys no tick holds any more (endpoints removed a whole history ago), so that
    /// churn does not grow the key table.
    fn forget_gone(&mut self, limits: Limits) {
        if self.keys.len() < limits.endpoints {
            return;
        }
        let mut seen = vec![false; self.keys.len()];
        for tick in &self.ticks {
            for sample in &tick.samples {
                seen[sample.endpoint as usize] = true;
            }
        }
        if seen.iter().all(|s| *s) {
            return;
        }
        // Renumber the keys still seen, and the samples with them (ticks a reader still holds
        // are copied: the reader keeps the numbering it copied with its keys).
        let mut renumbered = vec![u32::MAX; self.keys.len()];
        let mut keys = Vec::new();
        for (old, key) in self.keys.iter().enumerate() {
            if seen[old] {
                renumbered[old] = keys.len() as u32;
                keys.push(key.clone());
            }
        }
        for tick in &mut self.ticks {
            for sample in &mut Arc::make_mut(tick).samples {
                sample.endpoint = renumbered[sample.endpoint as usize];
            }
        }
        self.index = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), i as u32))
            .collect();
        self.keys = Arc::new(keys);
    }
}

/// Samples `monitor` into `memory` every `every` until the memory is dropped, and answers the
/// requests that ask for a copy of it meanwhile (`latest.rs`). A tick is one monitor snapshot,
/// taken on tokio's blocking pool (about a microsecond per endpoint: a tenth of a second at
/// 100 000), and the next waits at least ten times as long as the last took, so that sampling
/// never takes more than a tenth of a core. A request asking between ticks gets a snapshot begun
/// after it asked, at once, shared with every request that asked before it began.
pub(super) async fn sample_while_kept(
    history: Weak<Memory>,
    monitor: Monitor,
    every: Duration,
    answering: Answering,
) {
    let mut next_tick = tokio::time::Instant::now();
    loop {
        if history.strong_count() == 0 || answering.closed() {
            return;
        }
        let mut woken = std::pin::pin!(answering.woken());
        woken.as_mut().enable();
        let due = tokio::time::Instant::now() >= next_tick;
        if !due && !answering.wanted() {
            let sleep = std::pin::pin!(tokio::time::sleep_until(next_tick));
            futures::future::select(woken, sleep).await;
            continue;
        }
        let covered = answering.cover();
        let started = tokio::time::Instant::now();
        let taking = monitor.clone();
        let kept = history.clone();
        // All of it on the blocking pool, the snapshot dropped there too (freeing 100 000
        // entries is milliseconds): the runtime's thread only waits.
        let tick = move || {
            let snapshot = Arc::new(taking.snapshot());
            covered.answer(&snapshot);
            if due {
                if let Some(kept) = kept.upgrade() {
                    // Wall-clock time for the people reading the page; nothing is measured with it.
                    #[allow(clippy::disallowed_methods)]
                    let at = SystemTime::now();
                    kept.sample(at, &snapshot);
                }
            }
        };
        if tokio::task::spawn_blocking(tick).await.is_err() {
            return;
        }
        let took = started.elapsed();
        if due {
            next_tick = started + every.max(took.saturating_mul(10));
        }
    }
}
