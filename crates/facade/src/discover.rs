//! The discover adaptor: filters and re-admits the endpoints of an upstream discover stream.
//!
//! Upstream changes are authoritative and forwarded first. Ejections are event-driven: a record
//! that crosses a threshold wakes the adaptor through the layer's [`Notifier`], and the adaptor
//! judges the flagged endpoints when it is next polled (the balancer polls discovery before it
//! picks an endpoint, so no request is routed by a stale set). Recovery checks and trial ends run
//! on one tokio timer set to the earliest deadline.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{AbortHandle, Abortable};
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::discover::{Change, Discover};
use tower_outlier_core::{
    Budget, Clock, EndpointRecord, FleetMember, Notifier, Policy, Reason, RecoverySchedule,
};

use crate::deadlines::Deadlines;
use crate::endpoint::{Endpoint, HasRecord, Shared};
use crate::monitor::{EndpointStatus, Registry, Tracked};
use crate::probe::Probe;

pin_project! {
    /// A [`Discover`] stream of [`Endpoint`]s: the upstream's endpoints minus the ejected ones.
    ///
    /// Built by [`OutlierDetectionLayer`](crate::OutlierDetectionLayer). Upstream `Insert`s and
    /// `Remove`s pass through (wrapped); an ejection yields `Change::Remove`, a re-admission
    /// `Change::Insert` with a clone of the endpoint (so `S: Clone`).
    ///
    /// Upstream behaviour:
    /// * `Insert` of a known key replaces the service but keeps the key's history: an available
    ///   endpoint is re-inserted with the new service, an ejected one stays out and is re-admitted
    ///   with the new service when it recovers.
    /// * `Remove` forgets the key at once (its record, timers and probe); removing an unknown key
    ///   is ignored. If the removal leaves only ejected endpoints, or more ejected than the budget
    ///   allows, the earliest-due ejected endpoints are re-admitted on trial.
    /// * An upstream error is passed through and nothing is forgotten.
    /// * When the upstream ends, the last known set stays under detection; this stream ends only
    ///   once the upstream has ended and holds no endpoint.
    pub struct OutlierDetection<D, C, P>
    where
        D: Discover,
    {
        #[pin]
        discover: D,
        upstream_done: bool,
        detector: Detector<D::Key, D::Service, C, P>,
    }
}

type ProbeTask<K> = Abortable<Pin<Box<dyn Future<Output = (K, u64, bool)> + Send>>>;

pub(crate) struct Settings {
    pub(crate) policies: Arc<[Arc<dyn Policy>]>,
    pub(crate) budget: Budget,
    pub(crate) clock: Clock,
}

struct Detector<K, S, C, P> {
    settings: Arc<Settings>,
    trial: Duration,
    classifier: C,
    probe: P,
    notifier: Arc<Notifier>,
    registry: Arc<Registry>,
    entries: HashMap<K, Entry<S, C>>,
    // Each entry's key by its id, so a deadline can name its endpoint by a number.
    keys: HashMap<u64, K>,
    deadlines: Deadlines,
    ejected: usize,
    // How many entries have `refused` set, so the common case (none) skips the scan.
    refused: usize,
    queue: VecDeque<Change<K, Endpoint<S, C>>>,
    timer: Option<Pin<Box<Sleep>>>,
    timer_at: Option<Instant>,
    timers_changed: bool,
    probes: FuturesUnordered<ProbeTask<K>>,
    fleet: Vec<FleetSchedule>,
}

/// `at + delay`, or about thirty years from `at` when that overflows: configuration may ask for
/// absurd intervals (an HSF `isolationTime` near `u64::MAX` ms), and that must not panic.
fn later(at: Instant, delay: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    at.checked_add(delay.min(FAR))
        .or_else(|| at.checked_add(Duration::from_secs(3600)))
        .unwrap_or(at)
}

#[derive(Clone, Copy)]
struct FleetSchedule {
    policy: usize,
    every: Duration,
    next: Instant,
}

struct Entry<S, C> {
    endpoint: Endpoint<S, C>,
    id: u64,
    status: Status,
    failed_checks: u32,
    schedule: Option<RecoverySchedule>,
    // The policy that ejected the endpoint: its window decides whether a trial saw enough calls.
    ejected_by: usize,
    // This trial already counted as a failed check (the endpoint breached during it, even if the
    // budget kept it in): one re-admission, one check, however long the budget keeps it on trial.
    trial_breached: bool,
    // Calls the ejecting policy's window held at the end of each period of this trial so far.
    trial_calls: u64,
    refused: bool,
}

enum Status {
    Available,
    Trial { until: Instant },
    Ejected { next_check: Instant },
    Probing { abort: AbortHandle },
}

impl Status {
    fn is_available(&self) -> bool {
        matches!(self, Status::Available | Status::Trial { .. })
    }

    fn deadline(&self) -> Option<Instant> {
        match self {
            Status::Trial { until } => Some(*until),
            Status::Ejected { next_check } => Some(*next_check),
            Status::Available | Status::Probing { .. } => None,
        }
    }

    fn public(&self) -> EndpointStatus {
        match self {
            Status::Available => EndpointStatus::Available,
            Status::Trial { .. } => EndpointStatus::Trial,
            Status::Ejected { .. } => EndpointStatus::Ejected,
            Status::Probing { .. } => EndpointStatus::Probing,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Readmission {
    ProbeSucceeded,
    PassiveTrial,
    BudgetShrank,
    LastEndpoint,
}

impl fmt::Display for Readmission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Readmission::ProbeSucceeded => "probe succeeded",
            Readmission::PassiveTrial => "passive trial",
            Readmission::BudgetShrank => "ejection budget shrank",
            Readmission::LastEndpoint => "no other endpoint available",
        })
    }
}

impl<D, C, P> OutlierDetection<D, C, P>
where
    D: Discover,
{
    pub(crate) fn new(
        discover: D,
        settings: Arc<Settings>,
        classifier: C,
        probe: P,
        registry: Arc<Registry>,
    ) -> Self {
        // At least a millisecond: a zero trial would extend itself without end in one poll.
        let trial = settings
            .policies
            .iter()
            .map(|p| p.trial_period())
            .max()
            .unwrap_or(Duration::from_secs(10))
            .max(Duration::from_millis(1));
        let start = Instant::now();
        let fleet = settings
            .policies
            .iter()
            .enumerate()
            .filter_map(|(policy, p)| {
                let every = p.fleet_interval().filter(|every| !every.is_zero())?;
                Some(FleetSchedule {
                    policy,
                    every,
                    next: later(start, every),
                })
            })
            .collect();
        OutlierDetection {
            discover,
            upstream_done: false,
            detector: Detector {
                settings,
                trial,
                classifier,
                probe,
                notifier: Arc::new(Notifier::new()),
                registry,
                entries: HashMap::new(),
                keys: HashMap::new(),
                deadlines: Deadlines::default(),
                ejected: 0,
                refused: 0,
                queue: VecDeque::new(),
                timer: None,
                timer_at: None,
                // Arms the fleet evaluations on the first poll.
                timers_changed: true,
                probes: FuturesUnordered::new(),
                fleet,
            },
        }
    }

    /// How many endpoints this adaptor tracks (every key the upstream holds).
    pub fn tracked(&self) -> usize {
        self.detector.entries.len()
    }

    /// How many of them are out of the balancer's set (ejected or probing).
    pub fn ejected(&self) -> usize {
        self.detector.ejected
    }

    /// Probes in flight.
    pub fn probes_in_flight(&self) -> usize {
        self.detector.probes.len()
    }
}

impl<D, C, P> Stream for OutlierDetection<D, C, P>
where
    D: Discover,
    D::Key: Hash + Eq + Clone + fmt::Debug + Send + 'static,
    D::Service: Clone,
    C: Clone + Send + Sync + 'static,
    P: Probe<D::Key, D::Service>,
{
    type Item = Result<Change<D::Key, Endpoint<D::Service, C>>, D::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            if let Some(change) = this.detector.queue.pop_front() {
                return Poll::Ready(Some(Ok(change)));
            }
            if !*this.upstream_done {
                match this.discover.as_mut().poll_discover(cx) {
                    Poll::Ready(Some(Ok(change))) => {
                        this.detector.upstream(change);
                        continue;
                    }
                    Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                    Poll::Ready(None) => {
                        tracing::debug!(target: "tower_outlier", "upstream discovery ended");
                        *this.upstream_done = true;
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            this.detector.poll_events(cx);
            if !this.detector.queue.is_empty() {
                continue;
            }
            this.detector.publish_room();
            if *this.upstream_done && this.detector.entries.is_empty() {
                return Poll::Ready(None);
            }
            // The notifier, the probes and the timer have all registered the waker.
            return Poll::Pending;
        }
    }
}

impl<K, S, C, P> Detector<K, S, C, P>
where
    K: Hash + Eq + Clone + fmt::Debug + Send + 'static,
    S: Clone,
    C: Clone + Send + Sync + 'static,
    P: Probe<K, S>,
{
    fn upstream(&mut self, change: Change<K, S>) {
        match change {
            Change::Insert(key, service) => self.insert(key, service),
            Change::Remove(key) => self.remove(&key),
        }
    }

    fn insert(&mut self, key: K, service: S) {
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.endpoint = entry.endpoint.with_service(service);
            if entry.status.is_available() {
                self.queue
                    .push_back(Change::Insert(key.clone(), entry.endpoint.clone()));
            }
            tracing::debug!(target: "tower_outlier", endpoint = ?key, "upstream replaced the service");
            return;
        }
        let settings = &self.settings;
        let record = EndpointRecord::new(
            settings.clock.clone(),
            settings.policies.iter().map(|p| p.new_endpoint()).collect(),
            self.notifier.clone(),
        );
        let shared = Shared::new(record, self.classifier.clone());
        let weak: std::sync::Weak<dyn HasRecord> =
            Arc::downgrade(&(shared.clone() as Arc<dyn HasRecord>));
        let id = self.registry.insert(Tracked {
            key: format!("{key:?}"),
            record: weak,
            status: EndpointStatus::Available,
            next_check: None,
            failed_checks: 0,
            last_reason: None,
        });
        let endpoint = Endpoint::new(service, shared);
        self.seed_rtt(&endpoint);
        self.queue
            .push_back(Change::Insert(key.clone(), endpoint.clone()));
        self.keys.insert(id, key.clone());
        self.entries.insert(
            key,
            Entry {
                endpoint,
                id,
                status: Status::Available,
                failed_checks: 0,
                schedule: None,
                ejected_by: 0,
                trial_breached: false,
                trial_calls: 0,
                refused: false,
            },
        );
        // A larger set may have room for an ejection that was refused.
        self.retry_refused();
    }

    fn remove(&mut self, key: &K) {
        let Some(entry) = self.entries.remove(key) else {
            tracing::debug!(target: "tower_outlier", endpoint = ?key, "upstream removed an unknown endpoint");
            return;
        };
        self.registry.remove(entry.id);
        self.keys.remove(&entry.id);
        self.refused -= usize::from(entry.refused);
        match entry.status {
            Status::Available | Status::Trial { .. } => {
                self.queue.push_back(Change::Remove(key.clone()));
            }
            Status::Ejected { .. } => self.ejected -= 1,
            Status::Probing { abort } => {
                abort.abort();
                self.ejected -= 1;
            }
        }
        self.timers_changed = true;
        self.enforce_budget();
        self.retry_refused();
    }

    /// Starts `endpoint`'s latency estimate at the mean of the available endpoints', so it
    /// competes for traffic on equal terms: the samples from before its ejection (or none at all)
    /// would otherwise starve it, and a passive trial needs traffic to judge. A sample of the
    /// fleet is enough for a starting point and keeps inserting n endpoints linear in n.
    fn seed_rtt(&self, endpoint: &Endpoint<S, C>) {
        const SAMPLE: usize = 32;
        let record = endpoint.record();
        let now = record.clock().now();
        let (sum, count) = self
            .entries
            .values()
            .filter(|e| e.status.is_available())
            .take(SAMPLE)
            .map(|e| e.endpoint.record().rtt_estimate(now))
            .fold((0.0, 0usize), |(sum, n), rtt| (sum + rtt, n + 1));
        if count > 0 {
            record.seed_rtt(sum / count as f64, now);
        }
    }

    fn available(&self) -> usize {
        self.entries.len() - self.ejected
    }

    /// Tells the endpoints whether one more ejection would be allowed, the same test
    /// [`consider`](Self::consider) applies, so none gathers evidence for an ejection that would
    /// be refused.
    fn publish_room(&self) {
        let max = self.settings.budget.max_ejected(self.entries.len());
        self.notifier
            .set_room_to_eject(self.available() > 1 && self.ejected < max);
    }

    fn poll_events(&mut self, cx: &mut Context<'_>) {
        loop {
            // Register before taking the mark, so a record that signals in between still wakes us.
            self.notifier.register(cx.waker());
            if self.notifier.take() {
                self.judge_flagged();
            }
            let mut progressed = false;
            self.rearm_timer();
            if let (Some(_), Some(timer)) = (self.timer_at, self.timer.as_mut()) {
                if timer.as_mut().poll(cx).is_ready() {
                    self.timer_at = None;
                    self.timers_changed = true;
                    self.fire_due();
                    progressed = true;
                }
            }
            while let Poll::Ready(Some(done)) = self.probes.poll_next_unpin(cx) {
                if let Ok((key, id, healthy)) = done {
                    self.probe_done(key, id, healthy);
                }
                progressed = true;
            }
            if !progressed {
                return;
            }
        }
    }

    fn rearm_timer(&mut self) {
        if !self.timers_changed {
            return;
        }
        self.timers_changed = false;
        let (entries, keys) = (&self.entries, &self.keys);
        let current = |id: u64, at: Instant| {
            keys.get(&id)
                .and_then(|key| entries.get(key))
                .is_some_and(|e| e.status.deadline() == Some(at))
        };
        self.deadlines.compact(entries.len(), || {
            entries
                .values()
                .filter_map(|e| Some((e.status.deadline()?, e.id)))
                .collect()
        });
        let next = self
            .deadlines
            .next(current)
            .into_iter()
            .chain(self.fleet.iter().map(|f| f.next))
            .min();
        if next == self.timer_at {
            return;
        }
        self.timer_at = next;
        if let Some(at) = next {
            match self.timer.as_mut() {
                Some(timer) => timer.as_mut().reset(at),
                // Created on first use, inside the runtime that polls us: building the layer
                // needs no runtime.
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
    }

    fn judge_flagged(&mut self) {
        let flagged = self.keys_where(|e| e.endpoint.record().take_flag());
        for key in flagged {
            self.consider(&key);
        }
    }

    /// The keys of the entries that match, in discovery order: when several endpoints compete
    /// for one budget slot the first discovered wins, whatever the hash map's order, so a run is
    /// reproducible from its inputs.
    fn keys_where(&self, mut matches: impl FnMut(&Entry<S, C>) -> bool) -> Vec<K> {
        let mut keys: Vec<(u64, K)> = self
            .entries
            .iter()
            .filter(|(_, e)| matches(e))
            .map(|(k, e)| (e.id, k.clone()))
            .collect();
        keys.sort_unstable_by_key(|(id, _)| *id);
        keys.into_iter().map(|(_, k)| k).collect()
    }

    fn retry_refused(&mut self) {
        if self.refused == 0 {
            return;
        }
        let refused = self.keys_where(|e| e.refused);
        debug_assert_eq!(refused.len(), self.refused, "refused count out of step");
        for key in refused {
            self.consider(&key);
        }
    }

    /// Judges one available endpoint and ejects it if a policy says so and the rules allow it.
    fn consider(&mut self, key: &K) {
        let n = self.entries.len();
        let max = self.settings.budget.max_ejected(n);
        let available = self.available();
        let ejected = self.ejected;
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if !entry.status.is_available() {
            self.refused -= usize::from(entry.refused);
            entry.refused = false;
            return;
        }
        let record = entry.endpoint.record();
        let Some((policy, reason)) = record.judge(record.clock().now()) else {
            self.refused -= usize::from(entry.refused);
            entry.refused = false;
            return;
        };
        let trial_breached_now =
            matches!(entry.status, Status::Trial { .. }) && !entry.trial_breached;
        if trial_breached_now {
            // Breaching during the trial is a failed recovery check, whether or not the rules
            // below let the endpoint be ejected again.
            entry.failed_checks = entry.failed_checks.saturating_add(1);
            entry.trial_breached = true;
        }
        let refusal = if available <= 1 {
            Some("last available endpoint")
        } else if ejected >= max {
            Some("ejection budget exhausted")
        } else {
            None
        };
        if let Some(why) = refusal {
            if !entry.refused {
                tracing::info!(
                    target: "tower_outlier",
                    endpoint = ?key,
                    reason = %reason,
                    error_rate = reason.value,
                    ejected,
                    budget = max,
                    endpoints = n,
                    "ejection refused: {why}"
                );
            }
            self.refused += usize::from(!entry.refused);
            entry.refused = true;
            if trial_breached_now {
                let trial_until = entry.status.deadline();
                self.publish(key, trial_until, Some(reason));
            }
            return;
        }
        self.refused -= usize::from(entry.refused);
        entry.refused = false;
        let schedule = self.settings.policies[policy].recovery();
        let delay = schedule.delay(entry.failed_checks);
        let next_check = later(Instant::now(), delay);
        entry.status = Status::Ejected { next_check };
        self.deadlines.push(next_check, entry.id);
        entry.schedule = Some(schedule);
        entry.ejected_by = policy;
        self.ejected += 1;
        self.timers_changed = true;
        tracing::warn!(
            target: "tower_outlier",
            endpoint = ?key,
            policy = reason.policy,
            reason = %reason,
            error_rate = reason.value,
            failed_checks = entry.failed_checks,
            next_check_in = ?delay,
            "endpoint ejected"
        );
        self.publish(key, Some(next_check), Some(reason));
        self.queue.push_back(Change::Remove(key.clone()));
    }

    fn publish(&self, key: &K, next_check: Option<Instant>, reason: Option<Reason>) {
        if let Some(entry) = self.entries.get(key) {
            let status = entry.status.public();
            let failed_checks = entry.failed_checks;
            self.registry.update(entry.id, |t| {
                t.status = status;
                t.next_check = next_check;
                t.failed_checks = failed_checks;
                if reason.is_some() {
                    t.last_reason = reason;
                }
            });
        }
    }

    fn fire_due(&mut self) {
        let now = Instant::now();
        self.evaluate_fleet(now);
        let (entries, keys) = (&self.entries, &self.keys);
        let current = |id: u64, at: Instant| {
            keys.get(&id)
                .and_then(|key| entries.get(key))
                .is_some_and(|e| e.status.deadline() == Some(at))
        };
        let due: Vec<K> = self
            .deadlines
            .pop_due(now, current)
            .into_iter()
            .filter_map(|id| self.keys.get(&id).cloned())
            .collect();
        self.timers_changed = true;
        for key in due {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            match entry.status {
                Status::Trial { .. } => self.trial_ended(&key),
                Status::Ejected { .. } => self.check(key),
                Status::Available | Status::Probing { .. } => {}
            }
        }
    }

    /// A passive trial's time is up. It passes only on evidence: no policy judges the endpoint an
    /// outlier, and the window of the policy that ejected it held, added up over the trial's
    /// periods, at least that policy's [`trial_calls`](tower_outlier_core::EndpointPolicy::trial_calls);
    /// with fewer calls the trial goes on for another period. An endpoint still judged an outlier
    /// has failed this check (counted once per re-admission, even when the budget or the
    /// last-endpoint rule keeps it in); it stays on trial and is ejected, with the longer
    /// interval, as soon as the rules allow.
    fn trial_ended(&mut self, key: &K) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let record = entry.endpoint.record();
        let now = record.clock().now();
        let until = later(Instant::now(), self.trial);
        if record.judge(now).is_some() {
            if !entry.trial_breached {
                entry.failed_checks = entry.failed_checks.saturating_add(1);
                entry.trial_breached = true;
            }
            entry.status = Status::Trial { until };
            self.deadlines.push(until, entry.id);
            self.timers_changed = true;
            tracing::info!(
                target: "tower_outlier",
                endpoint = ?key,
                failed_checks = entry.failed_checks,
                "trial failed: the endpoint is still an outlier"
            );
            self.publish(key, Some(until), None);
            self.consider(key);
            return;
        }
        let (seen, needed) = record
            .policies()
            .get(entry.ejected_by)
            .map_or((0, 0), |policy| {
                (policy.counts(now).calls, policy.trial_calls())
            });
        entry.trial_calls = entry.trial_calls.saturating_add(seen);
        if entry.trial_calls < needed {
            entry.status = Status::Trial { until };
            self.deadlines.push(until, entry.id);
            self.timers_changed = true;
            tracing::debug!(
                target: "tower_outlier",
                endpoint = ?key,
                calls = entry.trial_calls,
                needed,
                "trial extended: too few calls to judge"
            );
            self.publish(key, Some(until), None);
        } else {
            entry.status = Status::Available;
            entry.failed_checks = 0;
            tracing::info!(target: "tower_outlier", endpoint = ?key, "endpoint recovered: trial passed");
            self.publish(key, None, None);
        }
    }

    /// Runs the fleet-wide evaluations that are due (policies judging endpoints against each
    /// other, such as weight degradation against the service average).
    fn evaluate_fleet(&mut self, now: Instant) {
        for index in 0..self.fleet.len() {
            let schedule = self.fleet[index];
            if schedule.next > now {
                continue;
            }
            // From now, not from the missed deadline: an idle stretch is one long window, not a
            // burst of empty ones.
            self.fleet[index].next = later(now, schedule.every);
            self.timers_changed = true;
            if self.entries.is_empty() {
                continue;
            }
            let members: Vec<FleetMember<'_>> = self
                .entries
                .iter()
                .map(|(key, entry)| {
                    let record = entry.endpoint.record();
                    FleetMember {
                        key: key as &dyn fmt::Debug,
                        state: &*record.policies()[schedule.policy],
                        record,
                        available: entry.status.is_available(),
                    }
                })
                .collect();
            self.settings.policies[schedule.policy]
                .evaluate_fleet(&members, self.settings.clock.now());
        }
    }

    /// A recovery check is due: probe actively, or re-admit for a passive trial.
    fn check(&mut self, key: K) {
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        let service = entry.endpoint.get_ref().clone();
        match self.probe.probe(&key, service) {
            Some(probe) => {
                let timeout = entry.schedule.map_or(Duration::from_secs(10), |s| s.unit());
                let id = entry.id;
                let (abort, registration) = AbortHandle::new_pair();
                entry.status = Status::Probing { abort };
                let probe_key = key.clone();
                let task: Pin<Box<dyn Future<Output = (K, u64, bool)> + Send>> =
                    Box::pin(async move {
                        // A probe that hangs longer than one recovery unit is a failed check.
                        let healthy = tokio::time::timeout(timeout, probe).await.unwrap_or(false);
                        (probe_key, id, healthy)
                    });
                self.probes.push(Abortable::new(task, registration));
                tracing::info!(target: "tower_outlier", endpoint = ?key, failed_checks = entry.failed_checks, "probing ejected endpoint");
                self.publish(&key, None, None);
            }
            None => {
                let until = later(Instant::now(), self.trial);
                self.readmit(&key, Status::Trial { until }, Readmission::PassiveTrial);
            }
        }
    }

    fn probe_done(&mut self, key: K, id: u64, healthy: bool) {
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        if entry.id != id || !matches!(entry.status, Status::Probing { .. }) {
            return;
        }
        if healthy {
            entry.failed_checks = 0;
            self.readmit(&key, Status::Available, Readmission::ProbeSucceeded);
        } else {
            entry.failed_checks = entry.failed_checks.saturating_add(1);
            let delay = entry
                .schedule
                .map_or(Duration::from_secs(10), |s| s.delay(entry.failed_checks));
            let next_check = later(Instant::now(), delay);
            entry.status = Status::Ejected { next_check };
            self.deadlines.push(next_check, entry.id);
            self.timers_changed = true;
            tracing::info!(
                target: "tower_outlier",
                endpoint = ?key,
                failed_checks = entry.failed_checks,
                next_check_in = ?delay,
                "probe failed: endpoint stays ejected"
            );
            self.publish(&key, Some(next_check), None);
        }
    }

    fn readmit(&mut self, key: &K, status: Status, cause: Readmission) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if entry.status.is_available() {
            return;
        }
        entry.endpoint.record().reset();
        self.refused -= usize::from(entry.refused);
        entry.refused = false;
        entry.trial_breached = false;
        entry.trial_calls = 0;
        let endpoint = entry.endpoint.clone();
        self.seed_rtt(&endpoint);
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let next = status.deadline();
        entry.status = status;
        if let Some(at) = next {
            self.deadlines.push(at, entry.id);
        }
        self.ejected -= 1;
        self.timers_changed = true;
        tracing::info!(
            target: "tower_outlier",
            endpoint = ?key,
            cause = %cause,
            failed_checks = entry.failed_checks,
            trial_until = ?next.map(|at| at.saturating_duration_since(Instant::now())),
            "endpoint re-admitted"
        );
        self.queue
            .push_back(Change::Insert(key.clone(), entry.endpoint.clone()));
        self.publish(key, next, None);
        self.retry_refused();
    }

    /// Re-admits ejected endpoints while more are ejected than the budget allows, or none is
    /// available; the ones due soonest go first.
    fn enforce_budget(&mut self) {
        loop {
            let max = self.settings.budget.max_ejected(self.entries.len());
            let cause = if self.ejected > 0 && self.available() == 0 {
                Readmission::LastEndpoint
            } else if self.ejected > max {
                Readmission::BudgetShrank
            } else {
                return;
            };
            let soonest = self
                .entries
                .iter()
                .filter(|(_, e)| !e.status.is_available())
                .min_by_key(|(_, e)| (e.status.deadline(), e.id))
                .map(|(k, _)| k.clone());
            let Some(key) = soonest else { return };
            if let Some(Status::Probing { abort }) = self.entries.get(&key).map(|e| &e.status) {
                abort.abort();
            }
            let until = later(Instant::now(), self.trial);
            self.readmit(&key, Status::Trial { until }, cause);
        }
    }
}

impl<K, S, C, P> Drop for Detector<K, S, C, P> {
    fn drop(&mut self) {
        // The monitor outlives the adaptor; it must not keep listing endpoints nobody tracks.
        let mut tracked = self.registry.lock();
        for entry in self.entries.values() {
            tracked.remove(&entry.id);
        }
    }
}

impl<D, C, P> fmt::Debug for OutlierDetection<D, C, P>
where
    D: Discover + fmt::Debug,
    D::Key: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutlierDetection")
            .field("discover", &self.discover)
            .field("tracked", &self.detector.entries.len())
            .field("ejected", &self.detector.ejected)
            .field("policies", &self.detector.settings.policies)
            .finish_non_exhaustive()
    }
}
