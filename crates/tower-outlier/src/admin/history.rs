//! What the admin component remembers: a sample of every endpoint at each tick, and the latest
//! events, both bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::Weak;
use std::time::{Duration, SystemTime};

use tower_outlier_core::Lock;

use crate::events::Event;
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
#[derive(Debug)]
pub(super) struct Tick {
    pub(super) at: SystemTime,
    pub(super) samples: Vec<Sample>,
}

/// An event as the admin component keeps it.
#[derive(Clone, Debug)]
pub(super) struct Kept {
    pub(super) at: SystemTime,
    pub(super) event: Event,
}

/// The bounded memory of the admin component.
#[derive(Debug)]
pub(super) struct History {
    pub(super) ticks: VecDeque<Tick>,
    /// Endpoint keys by their index in samples, and back.
    pub(super) keys: Vec<String>,
    index: HashMap<String, u32>,
    pub(super) events: VecDeque<Kept>,
    /// When each endpoint out of rotation now was last ejected.
    pub(super) ejected_since: HashMap<String, SystemTime>,
    /// Endpoints not sampled because [`Limits::endpoints`] were already tracked.
    pub(super) untracked: usize,
    limits: Limits,
}

/// How much the admin component keeps.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) every: Duration,
    pub(super) ticks: usize,
    pub(super) endpoints: usize,
    pub(super) events: usize,
}

impl History {
    pub(super) fn new(limits: Limits) -> Self {
        History {
            ticks: VecDeque::with_capacity(limits.ticks.min(1024)),
            keys: Vec::new(),
            index: HashMap::new(),
            events: VecDeque::new(),
            ejected_since: HashMap::new(),
            untracked: 0,
            limits,
        }
    }

    pub(super) fn limits(&self) -> Limits {
        self.limits
    }

    /// Samples every endpoint of `snapshot`, taken at `at`.
    pub(super) fn sample(&mut self, at: SystemTime, snapshot: &Snapshot) {
        let mut samples = Vec::with_capacity(snapshot.endpoints.len().min(self.limits.endpoints));
        let mut untracked = 0;
        for endpoint in &snapshot.endpoints {
            let key = endpoint.key.as_str();
            let index = match self.index.get(key) {
                Some(&index) => index,
                None if self.keys.len() < self.limits.endpoints => {
                    let index = self.keys.len() as u32;
                    self.keys.push(key.to_owned());
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
        if self.ticks.len() == self.limits.ticks {
            self.ticks.pop_front();
        }
        self.ticks.push_back(Tick { at, samples });
        self.forget_gone();
    }

    /// Drops the keys no tick holds any more (endpoints removed a whole history ago), so that
    /// churn does not grow the key table.
    fn forget_gone(&mut self) {
        if self.keys.len() < self.limits.endpoints {
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
        // Renumber the keys still seen, and the samples with them.
        let mut renumbered = vec![u32::MAX; self.keys.len()];
        let mut keys = Vec::new();
        for (old, key) in self.keys.drain(..).enumerate() {
            if seen[old] {
                renumbered[old] = keys.len() as u32;
                keys.push(key);
            }
        }
        for tick in &mut self.ticks {
            for sample in &mut tick.samples {
                sample.endpoint = renumbered[sample.endpoint as usize];
            }
        }
        self.index = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), i as u32))
            .collect();
        self.keys = keys;
    }

    pub(super) fn record(&mut self, at: SystemTime, event: &Event) {
        match event {
            Event::Ejected { key, .. }
                if self.ejected_since.len() < self.limits.endpoints
                    || self.ejected_since.contains_key(key.as_str()) =>
            {
                self.ejected_since.insert(key.as_str().to_owned(), at);
            }
            Event::Readmitted { key, .. } | Event::Removed { key, .. } => {
                self.ejected_since.remove(key.as_str());
            }
            _ => {}
        }
        if self.events.len() == self.limits.events {
            self.events.pop_front();
        }
        self.events.push_back(Kept {
            at,
            event: event.clone(),
        });
    }
}

/// Samples `monitor` into `history` every `every` until the history is dropped. A tick is one
/// monitor snapshot, taken on tokio's blocking pool (about 2.4 µs per endpoint: a quarter of a
/// second at 100 000), and the next waits at least ten times as long as the last took, so that
/// sampling never takes more than a tenth of a core.
pub(super) async fn sample_while_kept(
    history: Weak<Lock<History>>,
    monitor: Monitor,
    every: Duration,
) {
    loop {
        if history.strong_count() == 0 {
            return;
        }
        let started = tokio::time::Instant::now();
        let taking = monitor.clone();
        let Ok(snapshot) = tokio::task::spawn_blocking(move || taking.snapshot()).await else {
            return;
        };
        let took = started.elapsed();
        let Some(kept) = history.upgrade() else {
            return;
        };
        // Wall-clock time for the people reading the page; nothing is measured with it.
        #[allow(clippy::disallowed_methods)]
        let at = SystemTime::now();
        kept.lock().sample(at, &snapshot);
        drop(kept);
        tokio::time::sleep(every.max(took.saturating_mul(10))).await;
    }
}
