//! The detector: which endpoints are in the balancer's set, which are out, and when each is
//! checked again — a synchronous state machine with no runtime in it.
//!
//! Inputs: upstream changes ([`Engine::insert`], [`Engine::remove`]), a record's signal
//! ([`Engine::signalled`]), the time ([`Engine::advance`], with every due deadline) and probe
//! results ([`Engine::probe_done`]). Every input carries the time; the engine never reads a clock
//! for its deadlines. Outputs: changes for the balancer ([`Engine::pop_change`]), probes to start
//! ([`Engine::pop_probe`]) and probes to abandon ([`Engine::take_cancelled`]); it also publishes
//! to the monitor and logs through `tracing`. The discover adaptor (`discover.rs`) feeds it from
//! the upstream stream, the endpoints' notifier, one tokio timer and the probe tasks.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower::discover::Change;
use tower_outlier_core::{
    Budget, Clock, EndpointRecord, Notifier, Policy, Reason, RecoverySchedule,
};

use crate::deadlines::Deadlines;
use crate::endpoint::{HasRecord, OutlierEndpoint, Shared};
use crate::events::{EndpointKey, Event, Refusal};
use crate::hosts::{HostOf, HostRegistry};
use crate::layer::DEFAULT_BUDGET;
use crate::monitor::{EndpointStatus, Registry, Tracked};
use crate::probe::ProbeFuture;
use crate::reconfigure::RulesCell;

pub(crate) struct Settings {
    pub(crate) policies: Arc<[Arc<dyn Policy>]>,
    pub(crate) budget: Budget,
    // The budget the layer was given, if any: otherwise each version of the rules brings its own.
    pub(crate) explicit_budget: Option<Budget>,
    pub(crate) clock: Clock,
    pub(crate) rules: Arc<RulesCell>,
    // The version of the rules these settings hold.
    pub(crate) version: u64,
    // HSF's ipDimension: the registry of hosts this layer shares, and how keys map to hosts.
    pub(crate) hosts: Option<(HostRegistry, HostOf)>,
}

impl Settings {
    /// The settings for the newest rules of `cell`.
    pub(crate) fn new(
        cell: &Arc<RulesCell>,
        explicit_budget: Option<Budget>,
        clock: Clock,
        hosts: Option<(HostRegistry, HostOf)>,
    ) -> Self {
        let rules = cell.current();
        let budget = explicit_budget.unwrap_or_else(|| {
            rules
                .policies
                .iter()
                .find_map(|p| p.budget())
                .unwrap_or(DEFAULT_BUDGET)
        });
        Settings {
            policies: rules.policies.clone(),
            budget,
            explicit_budget,
            clock,
            rules: cell.clone(),
            version: rules.version,
            hosts,
        }
    }
}

/// A probe the adaptor is to run: `probe` against the ejected endpoint, failed if it takes longer
/// than `timeout`; its result goes back to [`Engine::probe_done`] with `key` and `id`.
pub(crate) struct ProbeStart<K> {
    pub(crate) key: K,
    pub(crate) id: u64,
    pub(crate) probe: ProbeFuture,
    pub(crate) timeout: Duration,
}

pub(crate) struct Engine<K, S, C> {
    settings: Arc<Settings>,
    // The policies' names, shared by every endpoint's monitor entry.
    names: Arc<[&'static str]>,
    trial: Duration,
    classifier: C,
    notifier: Arc<Notifier>,
    registry: Arc<Registry>,
    entries: HashMap<K, Entry<S, C>>,
    // Each entry's key by its id, so a deadline can name its endpoint by a number.
    keys: HashMap<u64, K>,
    deadlines: Deadlines,
    ejected: usize,
    // How many entries have `refused` set, so the common case (none) skips the scan.
    refused: usize,
    queue: VecDeque<Change<K, OutlierEndpoint<S, C>>>,
    probes: VecDeque<ProbeStart<K>>,
    cancelled: Vec<u64>,
    fleet: Vec<FleetSchedule>,
    sharing: Option<Sharing>,
    // An endpoint on a host held out elsewhere stayed in for want of room: retried when there is.
    mirror_pending: bool,
}

/// This adaptor's membership of a host registry (HSF's ipDimension).
struct Sharing {
    registry: HostRegistry,
    host_of: HostOf,
    member: u64,
    // The registry version last acted on.
    seen: u64,
}

/// What took an endpoint out of the balancer's set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ejector {
    /// The layer's policy at this index.
    Policy(usize),
    /// Another layer sharing its host holds the host out (HSF ipDimension).
    Host,
}

impl Ejector {
    fn policy(self) -> Option<usize> {
        match self {
            Ejector::Policy(index) => Some(index),
            Ejector::Host => None,
        }
    }
}

/// Each policy's state for the endpoint of `record` (cold path).
fn policy_states(record: &EndpointRecord) -> Box<[Option<&'static str>]> {
    record.policies().iter().map(|p| p.state_name()).collect()
}

/// `at + delay`, or about thirty years from `at` when that overflows: configuration may ask for
/// absurd intervals (an HSF `isolationTime` near `u64::MAX` ms), and that must not panic.
fn later(at: Instant, delay: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    at.checked_add(delay.min(FAR))
        .or_else(|| at.checked_add(Duration::from_secs(3600)))
        .unwrap_or(at)
}

/// The longest trial period of `policies`, at least a millisecond: a zero trial would extend
/// itself without end in one poll.
fn trial_period(policies: &[Arc<dyn Policy>]) -> Duration {
    policies
        .iter()
        .map(|p| p.trial_period())
        .max()
        .unwrap_or(Duration::from_secs(10))
        .max(Duration::from_millis(1))
}

/// The fleet evaluations of `policies`: a policy whose interval is unchanged from `previous`
/// keeps its next evaluation, any other starts a full interval after `now`.
fn fleet_schedules(
    policies: &[Arc<dyn Policy>],
    now: Instant,
    previous: &[FleetSchedule],
) -> Vec<FleetSchedule> {
    policies
        .iter()
        .enumerate()
        .filter_map(|(policy, p)| {
            let every = p.fleet()?.interval();
            if every.is_zero() {
                return None;
            }
            let next = previous
                .iter()
                .find(|s| s.policy == policy && s.every == every)
                .map_or_else(|| later(now, every), |s| s.next);
            Some(FleetSchedule {
                policy,
                every,
                next,
            })
        })
        .collect()
}

#[derive(Clone, Copy)]
struct FleetSchedule {
    policy: usize,
    every: Duration,
    next: Instant,
}

struct Entry<S, C> {
    endpoint: OutlierEndpoint<S, C>,
    id: u64,
    status: Status,
    failed_checks: u32,
    schedule: Option<RecoverySchedule>,
    // The policy that ejected the endpoint: its window decides whether a trial saw enough calls.
    ejected_by: Ejector,
    // This trial already counted as a failed check (the endpoint breached during it, even if the
    // budget kept it in): one re-admission, one check, however long the budget keeps it on trial.
    trial_breached: bool,
    // Calls the ejecting policy's window held at the end of each period of this trial so far.
    trial_calls: u64,
    refused: bool,
    // The endpoint's host, when the layer shares hosts.
    host: Option<String>,
    // The typed key events and the monitor carry.
    name: EndpointKey,
    // The weight last reported in an event.
    weight: f64,
    // Each policy's state last reported in an event.
    states: Box<[Option<&'static str>]>,
    // A host ejection from another layer was refused here (reported once per episode).
    mirror_refused: bool,
}

impl<S, C> Entry<S, C> {
    /// Moves to `status`, scheduling its deadline if it has one. Every status change goes
    /// through here, so no deadline is ever missing from the heap.
    fn set_status(&mut self, status: Status, deadlines: &mut Deadlines) {
        if let Some(at) = status.deadline() {
            deadlines.push(at, self.id);
        }
        self.status = status;
    }
}

/// Whether the deadline `at` popped for entry `id` is still that entry's deadline (the heap keeps
/// deadlines its entries have since moved past).
fn deadline_is_current<'a, K: Hash + Eq, S, C>(
    entries: &'a HashMap<K, Entry<S, C>>,
    keys: &'a HashMap<u64, K>,
) -> impl Fn(u64, Instant) -> bool + 'a {
    move |id, at| {
        keys.get(&id)
            .and_then(|key| entries.get(key))
            .is_some_and(|e| e.status.deadline() == Some(at))
    }
}

enum Status {
    Available,
    Trial { until: Instant },
    Ejected { next_check: Instant },
    Probing,
}

impl Status {
    fn is_available(&self) -> bool {
        matches!(self, Status::Available | Status::Trial { .. })
    }

    fn deadline(&self) -> Option<Instant> {
        match self {
            Status::Trial { until } => Some(*until),
            Status::Ejected { next_check } => Some(*next_check),
            Status::Available | Status::Probing => None,
        }
    }

    fn public(&self) -> EndpointStatus {
        match self {
            Status::Available => EndpointStatus::Available,
            Status::Trial { .. } => EndpointStatus::Trial,
            Status::Ejected { .. } => EndpointStatus::Ejected,
            Status::Probing => EndpointStatus::Probing,
        }
    }
}

impl<K, S, C> Engine<K, S, C> {
    /// An engine with no endpoint, whose fleet evaluations start one interval after `start`.
    pub(crate) fn new(
        settings: Arc<Settings>,
        classifier: C,
        registry: Arc<Registry>,
        start: Instant,
    ) -> Self {
        let notifier = Arc::new(Notifier::new());
        settings.rules.subscribe(&notifier);
        let sharing = settings.hosts.clone().map(|(registry, host_of)| Sharing {
            member: registry.join(&notifier),
            seen: 0,
            registry,
            host_of,
        });
        if settings.rules.version() != settings.version {
            // Published between reading the rules and subscribing: apply on the first poll.
            notifier.notify();
        }
        registry.rules_in_force(settings.version);
        Engine {
            names: settings.policies.iter().map(|p| p.name()).collect(),
            trial: trial_period(&settings.policies),
            fleet: fleet_schedules(&settings.policies, start, &[]),
            settings,
            classifier,
            notifier,
            registry,
            entries: HashMap::new(),
            keys: HashMap::new(),
            deadlines: Deadlines::default(),
            ejected: 0,
            refused: 0,
            queue: VecDeque::new(),
            probes: VecDeque::new(),
            cancelled: Vec::new(),
            sharing,
            mirror_pending: false,
        }
    }

    /// The notifier every endpoint's record signals through.
    pub(crate) fn notifier(&self) -> &Arc<Notifier> {
        &self.notifier
    }

    /// The layer's policies.
    pub(crate) fn policies(&self) -> &Arc<[Arc<dyn Policy>]> {
        &self.settings.policies
    }

    /// Endpoints tracked: every key the upstream holds.
    pub(crate) fn tracked(&self) -> usize {
        self.entries.len()
    }

    /// Endpoints out of the balancer's set (ejected or probing).
    pub(crate) fn ejected(&self) -> usize {
        self.ejected
    }

    /// The next change for the balancer.
    pub(crate) fn pop_change(&mut self) -> Option<Change<K, OutlierEndpoint<S, C>>> {
        self.queue.pop_front()
    }

    /// Whether changes wait for the balancer.
    pub(crate) fn has_changes(&self) -> bool {
        !self.queue.is_empty()
    }

    /// The next probe to start.
    pub(crate) fn pop_probe(&mut self) -> Option<ProbeStart<K>> {
        self.probes.pop_front()
    }

    /// The ids of probes whose results no longer matter (their endpoint was removed or
    /// re-admitted without them).
    pub(crate) fn take_cancelled(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.cancelled)
    }
}

impl<K, S, C> Engine<K, S, C>
where
    K: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    S: Clone,
    C: Clone + Send + Sync + 'static,
{
    /// When [`advance`](Self::advance) next has something to do: the earliest trial end,
    /// recovery check or fleet evaluation.
    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        let (entries, keys) = (&self.entries, &self.keys);
        let current = deadline_is_current(entries, keys);
        self.deadlines.compact(entries.len(), || {
            entries
                .values()
                .filter_map(|e| Some((e.status.deadline()?, e.id)))
                .collect()
        });
        self.deadlines
            .next(current)
            .into_iter()
            .chain(self.fleet.iter().map(|f| f.next))
            .min()
    }

    pub(crate) fn insert(&mut self, key: K, service: S, now: Instant) {
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
        let name = EndpointKey::new(&key);
        let id = self.registry.insert(Tracked {
            key: name.clone(),
            record: weak,
            status: EndpointStatus::Available,
            next_check: None,
            failed_checks: 0,
            last_reason: None,
            policies: self.names.clone(),
        });
        let endpoint = OutlierEndpoint::new(service, shared);
        let states = policy_states(endpoint.record());
        let host = self.sharing.as_ref().and_then(|s| s.host_of.host(&key));
        self.seed_rtt(&endpoint);
        self.queue
            .push_back(Change::Insert(key.clone(), endpoint.clone()));
        self.keys.insert(id, key.clone());
        let held_out = match (&self.sharing, &host) {
            (Some(sharing), Some(host)) => sharing.registry.ejected_elsewhere(sharing.member, host),
            _ => false,
        };
        self.entries.insert(
            key.clone(),
            Entry {
                endpoint,
                id,
                status: Status::Available,
                failed_checks: 0,
                schedule: None,
                ejected_by: Ejector::Policy(0),
                trial_breached: false,
                trial_calls: 0,
                refused: false,
                host,
                name,
                weight: 1.0,
                states,
                mirror_refused: false,
            },
        );
        // A larger set may have room for an ejection that was refused.
        self.retry_refused(now);
        // Joining on a host another service holds out.
        if held_out {
            self.mirror(&key, now);
        }
    }

    pub(crate) fn remove(&mut self, key: &K, now: Instant) {
        let Some(entry) = self.entries.remove(key) else {
            tracing::debug!(target: "tower_outlier", endpoint = ?key, "upstream removed an unknown endpoint");
            return;
        };
        self.registry.remove(entry.id);
        self.keys.remove(&entry.id);
        self.refused -= usize::from(entry.refused);
        let (name, status) = (entry.name.clone(), entry.status.public());
        self.registry
            .events
            .emit(|| Event::Removed { key: name, status });
        match entry.status {
            Status::Available | Status::Trial { .. } => {
                self.queue.push_back(Change::Remove(key.clone()));
            }
            Status::Ejected { .. } => self.ejected -= 1,
            Status::Probing => {
                self.cancelled.push(entry.id);
                self.ejected -= 1;
            }
        }
        if !entry.status.is_available() && entry.ejected_by != Ejector::Host {
            self.share_host(entry.host.as_deref(), false);
        }
        self.enforce_budget(now);
        self.retry_refused(now);
    }

    /// Starts `endpoint`'s latency estimate at the mean of the available endpoints', so it
    /// competes for traffic on equal terms: the samples from before its ejection (or none at all)
    /// would otherwise starve it, and a passive trial needs traffic to judge. A sample of the
    /// fleet is enough for a starting point and keeps inserting n endpoints linear in n.
    fn seed_rtt(&self, endpoint: &OutlierEndpoint<S, C>) {
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
    pub(crate) fn publish_room(&self) {
        let max = self.settings.budget.max_ejected(self.entries.len());
        self.notifier
            .set_room_to_eject(self.available() > 1 && self.ejected < max);
    }

    pub(crate) fn signalled(&mut self, now: Instant) {
        let flagged = self.keys_where(|e| e.endpoint.record().take_flag());
        for key in flagged {
            self.consider(&key, now);
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

    fn retry_refused(&mut self, now: Instant) {
        if self.refused == 0 {
            return;
        }
        let refused = self.keys_where(|e| e.refused);
        debug_assert_eq!(refused.len(), self.refused, "refused count out of step");
        for key in refused {
            self.consider(&key, now);
        }
    }

    /// Judges one available endpoint and ejects it if a policy says so and the rules allow it.
    /// Reports the policy states of `key`'s endpoint that changed since last reported.
    fn report_states(&mut self, key: &K) {
        if !self.registry.events.listened() {
            return;
        }
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let now_states = policy_states(entry.endpoint.record());
        if now_states == entry.states {
            return;
        }
        for ((index, from), to) in entry.states.iter().enumerate().zip(now_states.iter()) {
            if from != to {
                let (name, policy) = (entry.name.clone(), self.names[index]);
                let (from, to) = (*from, *to);
                self.registry.events.emit(|| Event::PolicyStateChanged {
                    key: name,
                    policy,
                    from,
                    to,
                });
            }
        }
        entry.states = now_states;
    }

    fn consider(&mut self, key: &K, now: Instant) {
        self.report_states(key);
        self.judge_and_eject(key, now);
        self.report_states(key);
    }

    fn judge_and_eject(&mut self, key: &K, now: Instant) {
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
            let (name, failed_checks) = (entry.name.clone(), entry.failed_checks);
            self.registry.events.emit(|| Event::TrialFailed {
                key: name,
                failed_checks,
            });
        }
        let refusal = if available <= 1 {
            Some(Refusal::LastEndpoint)
        } else if ejected >= max {
            Some(Refusal::Budget)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            let why = match refusal {
                Refusal::LastEndpoint => "last available endpoint",
                _ => "ejection budget exhausted",
            };
            let recorded_now = record.clock().now();
            for state in record.policies().iter() {
                state.ejection_refused(recorded_now);
            }
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
                let name = entry.name.clone();
                let reason = reason.clone();
                self.registry.events.emit(|| Event::EjectionRefused {
                    key: name,
                    reason,
                    refusal,
                });
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
        // The ejecting state's own deadline, when it has one, owns the timing of the check.
        let recorded_now = record.clock().now();
        let delay = match record
            .policies()
            .get(policy)
            .and_then(|p| p.check_at(recorded_now))
        {
            Some(at) => Duration::from_nanos(at.saturating_sub(recorded_now)),
            None => schedule.delay(entry.failed_checks),
        };
        let next_check = later(now, delay);
        entry.set_status(Status::Ejected { next_check }, &mut self.deadlines);
        entry.schedule = Some(schedule);
        entry.ejected_by = Ejector::Policy(policy);
        self.ejected += 1;
        let host = entry.host.clone();
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
        let name = entry.name.clone();
        let event_reason = reason.clone();
        self.publish(key, Some(next_check), Some(reason));
        self.queue.push_back(Change::Remove(key.clone()));
        self.share_host(host.as_deref(), true);
        // After the monitor shows it: a callback reading a snapshot sees the ejection.
        self.registry.events.emit(|| Event::Ejected {
            key: name,
            reason: event_reason,
            next_check_in: Some(delay),
        });
    }

    fn publish(&self, key: &K, next_check: Option<Instant>, reason: Option<Reason>) {
        if let Some(entry) = self.entries.get(key) {
            let status = entry.status.public();
            let failed_checks = entry.failed_checks;
            self.registry.update(entry.id, |t| {
                t.status = status;
                t.next_check = next_check;
                t.failed_checks = failed_checks;
                if let Some(reason) = reason {
                    t.last_reason = Some(Box::new(reason));
                }
            });
        }
    }
}

impl<K, S, C> Drop for Engine<K, S, C> {
    fn drop(&mut self) {
        // The monitor outlives the adaptor; it must not keep listing endpoints nobody tracks.
        let mut tracked = self.registry.lock();
        for entry in self.entries.values() {
            tracked.remove(&entry.id);
        }
        drop(tracked);
        let mut gone: Vec<&Entry<S, C>> = self.entries.values().collect();
        gone.sort_unstable_by_key(|entry| entry.id);
        for entry in gone {
            let (name, status) = (entry.name.clone(), entry.status.public());
            self.registry
                .events
                .emit(|| Event::Removed { key: name, status });
        }
        if let Some(sharing) = &self.sharing {
            sharing.registry.leave(sharing.member);
        }
    }
}

mod hosts;
mod reconfigure;
mod recovery;
#[cfg(test)]
mod tests;
