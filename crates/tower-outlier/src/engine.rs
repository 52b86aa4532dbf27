//! The detector: which endpoints are in the balancer's set, which are out, and when each is
//! checked again — a synchronous state machine with no runtime in it.
//!
//! Inputs: upstream changes ([`Engine::insert`], [`Engine::remove`]), what other handles share
//! (rules, operator controls, records' signals, hosts: [`Engine::catch_up`]), the time
//! ([`Engine::advance`], with every due deadline), probe results ([`Engine::probe_done`]) and
//! health watches' words ([`Engine::health`]); [`Engine::settle`] then works out what follows for
//! the whole set. Every input carries the time; the engine never reads a clock for its
//! deadlines. Outputs, polled: changes for the balancer ([`Engine::pop_change`]), probes to start
//! ([`Engine::pop_probe`]), probes to abandon ([`Engine::take_cancelled`]), endpoints rebuilt
//! ([`Engine::take_rebuilt`]) and the next deadline ([`Engine::next_deadline`]); it also
//! publishes to the monitor and logs through `tracing`. The discover adaptor (`discover.rs`) feeds it from
//! the upstream stream, the endpoints' notifier, one tokio timer and the probe tasks.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower::discover::Change;
use tower_outlier_core::{DynOutlierPolicy, EndpointRecord, Notifier};

use crate::controls::{Controls, Override};
use crate::deadlines::Deadlines;
use crate::endpoint::EndpointParts;
use crate::event::Event;
use crate::hosts::{HostOf, HostRegistry};
use crate::monitor::Registry;
use crate::probe::ProbeFuture;
use avoided::AvoidedChecks;
use entries::Entries;
pub(crate) use idle::{keep as keep_idle, IdleBoard};
use recovery::deadline_is_current;
use settings::{fleet_schedules, trial_period, FleetSchedule};
pub(crate) use settings::{Settings, DEFAULT_MAX_PUSHBACK};
use shown::Reported;
use signals::SignalBoard;
use standing::{Entry, Standing};

/// What the engine needs of a discover key: hashed and compared (the entries), cloned (the
/// balancer's changes), printed (the monitor and events) and shared with the monitor's tasks.
pub(crate) trait DiscoverKey:
    Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static
{
}

impl<K: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static> DiscoverKey for K {}

/// A probe the adaptor is to run: `probe` against the ejected endpoint, failed if it takes longer
/// than `timeout`; its result goes back to [`Engine::probe_done`] with `key` and `id`.
pub(crate) struct ProbeStart<K> {
    pub(crate) key: K,
    pub(crate) id: u64,
    pub(crate) probe: ProbeFuture,
    pub(crate) timeout: Duration,
}

pub(crate) struct Engine<K, S> {
    settings: Arc<Settings>,
    // The policies' names, for events and this adaptor's roster in the monitor.
    names: Arc<[&'static str]>,
    trial: Duration,
    notifier: Arc<Notifier>,
    registry: Arc<Registry>,
    // This adaptor's endpoints in the monitor.
    roster: u64,
    entries: Entries<K, S>,
    deadlines: Deadlines<K>,
    ejected: usize,
    // The endpoints kept in for want of room after a policy judged them outliers, by id, so they
    // are retried in discovery order. Here rather than a flag in every entry: most endpoints
    // never are, and each entry's size is paid for every slot of the map.
    refused: BTreeMap<u64, K>,
    // The endpoints a host ejection from another layer was refused for, by id: reported once,
    // until one goes through.
    mirror_refused: HashSet<u64>,
    // How the newest endpoint started (weight 1, its policies' states: a slow-call breaker's
    // CLOSED), as most endpoints stay: every entry whose last report is just that shares this.
    usual_report: Arc<Reported>,
    queue: VecDeque<Change<K, EndpointParts<S>>>,
    probes: VecDeque<ProbeStart<K>>,
    cancelled: Vec<u64>,
    fleet: Vec<FleetSchedule>,
    sharing: Option<Sharing>,
    // An endpoint on a host held out elsewhere stayed in for want of room: retried when there is.
    mirror_pending: bool,
    // The fleet size the monitor was last told the budget allows no ejection for, if it was.
    no_ejection: Option<usize>,
    // The endpoints in the balancer's set whose service failed `poll_ready`, by id: the balancer
    // cannot pick them, so they are no endpoint to fall back on (the last-endpoint rule).
    unready: HashSet<u64>,
    signals: SignalBoard,
    // Endpoints out only in dry run (ejected or probing as the rules would have them): still in
    // the balancer's set, counted apart from `ejected`.
    shadow_out: HashSet<u64>,
    // The operator's controls in force, and their version.
    controls: Arc<Controls>,
    controls_version: u64,
    // The overrides in force, by endpoint id: most layers have none.
    forced: HashMap<u64, Override>,
    // How many back-off resets were asked for when this adaptor last applied them.
    resets_seen: u64,
    // Envoy's panic: too few healthy, so the balancer has every endpoint, ejected ones included.
    panicking: bool,
    // The balancer has no endpoint to pick (fail fast), as the registry was last told.
    nothing_to_pick: bool,
    // What the monitor was last told of it.
    all_out_shown: Option<String>,
    // Makes an endpoint a fresh service when it returns after its connections failed.
    rebuild: Option<Box<dyn crate::rebuild::Rebuild<K, S> + Send + Sync>>,
    // The endpoints rebuilt since the adaptor last asked: their health watches start again on
    // the new services.
    rebuilt: Vec<K>,
    // An endpoint had served when one joined: later ones join a serving fleet (slow start).
    fleet_served: bool,
    // Endpoints avoided after a timeout, checked by the active probe (`avoided.rs`).
    avoided: AvoidedChecks<K>,
    // Endpoints in service checked while they get no traffic, by the keeper task (`idle.rs`).
    idle: Option<Arc<IdleBoard<K, S>>>,
    idle_keeper_started: bool,
    // The layer's probe sends checks (the cadence times them); a passive trial sends none.
    checks_sent: bool,
}

/// This adaptor's membership of a host registry (HSF's ipDimension).
struct Sharing {
    registry: HostRegistry,
    host_of: HostOf,
    member: u64,
    // The registry version last acted on.
    seen: u64,
    // The host of each endpoint that has one, by the endpoint's id: here rather than in every
    // entry, as only a layer that shares hosts has any.
    hosts: HashMap<u64, Box<str>>,
}

/// What took an endpoint out of the balancer's set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ejector {
    /// The layer's policy at this index.
    Policy(usize),
    /// Another layer sharing its host holds the host out (HSF ipDimension).
    Host,
    /// An operator forced it out.
    Operator,
    /// Its server asked to be left alone for a while (`Retry-After`, gRPC's pushback).
    Pushback,
    /// Its health service says it is not serving.
    Health,
    /// It failed the cadence's unhealthy threshold of active checks while it got no traffic.
    ActiveCheck,
}

impl Ejector {
    fn policy(self) -> Option<usize> {
        match self {
            Ejector::Policy(index) => Some(index),
            Ejector::Host
            | Ejector::Operator
            | Ejector::Pushback
            | Ejector::Health
            | Ejector::ActiveCheck => None,
        }
    }

    /// Whether this is a signal's ejection, not the rules' judgement nor an operator's: what
    /// the rules counted stands through it, and it never takes the balancer's last endpoint.
    fn is_signal(self) -> bool {
        matches!(
            self,
            Ejector::Pushback | Ejector::Health | Ejector::Host | Ejector::ActiveCheck
        )
    }
}

/// Each policy's state for the endpoint of `record` (cold path), or none at all, which holds no
/// memory, while no policy has one (most policies never do).
fn policy_states(record: &EndpointRecord) -> Box<[Option<&'static str>]> {
    let now = record.clock().now();
    let states: Box<[_]> = record
        .policies()
        .iter()
        .map(|p| p.describe(now).state)
        .collect();
    if states.iter().all(Option::is_none) {
        Box::default()
    } else {
        states
    }
}

/// `at + delay`, or about thirty years from `at` when that overflows: configuration may ask for
/// absurd intervals (an HSF `isolationTime` near `u64::MAX` ms), and that must not panic.
fn later(at: Instant, delay: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    at.checked_add(delay.min(FAR))
        .or_else(|| at.checked_add(Duration::from_secs(3600)))
        .unwrap_or(at)
}

impl<K, S> Engine<K, S> {
    /// Makes endpoints that return after connection failures fresh services with `rebuild`.
    /// Whether the layer's probe sends checks: the probe cadence times them; a passive trial
    /// keeps its policy's ejection times.
    pub(crate) fn set_checks_sent(&mut self, sent: bool) {
        self.checks_sent = sent;
    }

    /// `base` as the probe cadence jitters it, when the layer sends checks: `own_jitter` says
    /// the policy's timing is jittered already, `first` that this is the first check after the
    /// endpoint was taken out.
    fn cadenced(&self, base: Duration, own_jitter: bool, first: bool) -> Duration {
        if self.checks_sent {
            self.settings.cadence.jittered(base, own_jitter, first)
        } else {
            base
        }
    }

    pub(crate) fn set_rebuild(
        &mut self,
        rebuild: Box<dyn crate::rebuild::Rebuild<K, S> + Send + Sync>,
    ) {
        self.rebuild = Some(rebuild);
    }

    /// An engine with no endpoint, whose fleet evaluations start one interval after `start`.
    pub(crate) fn new(settings: Arc<Settings>, registry: Arc<Registry>, start: Instant) -> Self {
        let notifier = Arc::new(Notifier::new());
        settings.rules.subscribe(&notifier);
        let sharing = settings.hosts.clone().map(|(registry, host_of)| Sharing {
            member: registry.join(&notifier),
            seen: 0,
            registry,
            host_of,
            hosts: HashMap::new(),
        });
        if settings.rules.version() != settings.version {
            // Published between reading the rules and subscribing: apply on the first poll.
            notifier.notify();
        }
        registry.rules_in_force(settings.version);
        let names: Arc<[&'static str]> = settings.policies.iter().map(|p| p.name()).collect();
        // Applied on the first poll, as the rules' first version is: none at start. Resets asked
        // for before this adaptor existed were for the endpoints of the adaptors then.
        let controls = Arc::new(Controls::default());
        let resets_seen = settings.rules.controls().0.resets.asked;
        if settings.rules.controls_version() != 0 {
            notifier.notify();
        }
        // Idle endpoints are checked only when the cadence asks (and the probe sends checks).
        let idle = settings.cadence.no_traffic_interval.map(|every| {
            Arc::new(IdleBoard::new(
                &settings.cadence,
                every,
                notifier.clone(),
                settings.clock.clone(),
            ))
        });
        Engine {
            roster: registry.join(names.clone()),
            names,
            trial: trial_period(&settings.policies),
            fleet: fleet_schedules(&settings.policies, start, settings.clock.now(), &[]),
            settings,
            notifier,
            registry,
            entries: Entries::new(),
            deadlines: Deadlines::default(),
            ejected: 0,
            refused: BTreeMap::new(),
            mirror_refused: HashSet::new(),
            usual_report: Arc::new(Reported {
                weight: 1.0,
                states: Box::default(),
            }),
            queue: VecDeque::new(),
            probes: VecDeque::new(),
            cancelled: Vec::new(),
            sharing,
            mirror_pending: false,
            no_ejection: None,
            unready: HashSet::new(),
            signals: SignalBoard::new(),
            shadow_out: HashSet::new(),
            controls,
            controls_version: 0,
            forced: HashMap::new(),
            resets_seen,
            panicking: false,
            nothing_to_pick: false,
            all_out_shown: None,
            rebuild: None,
            rebuilt: Vec::new(),
            fleet_served: false,
            avoided: AvoidedChecks::default(),
            idle,
            idle_keeper_started: false,
            checks_sent: false,
        }
    }

    /// The notifier every endpoint's record signals through.
    pub(crate) fn notifier(&self) -> &Arc<Notifier> {
        &self.notifier
    }

    /// The layer's policies.
    pub(crate) fn policies(&self) -> &Arc<[Arc<dyn DynOutlierPolicy>]> {
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
    pub(crate) fn pop_change(&mut self) -> Option<Change<K, EndpointParts<S>>> {
        self.queue.pop_front()
    }

    /// Whether changes wait for the balancer.
    fn has_changes(&self) -> bool {
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

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// When [`advance`](Self::advance) next has something to do: the earliest trial end,
    /// recovery check or fleet evaluation.
    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        let entries = &self.entries;
        self.deadlines.compact(entries.len(), || {
            entries
                .iter()
                .filter_map(|(key, e)| Some((e.standing().deadline()?, key.clone(), e.id)))
                .collect()
        });
        self.deadlines
            .next(deadline_is_current(entries))
            .into_iter()
            .chain(self.fleet.iter().map(|f| f.next))
            .chain(self.avoided.next())
            .min()
    }

    /// Catches up with what other handles share with the adaptor: when `notified` (the notifier
    /// was marked), new rules, operator controls and the records that flagged a signal or a
    /// judgement, in that order (rules before the controls that may name their policies,
    /// both before the records they judge by); always the shared hosts, whose changes come
    /// through the same notifier or with upstream changes and re-admissions.
    pub(crate) fn catch_up(&mut self, notified: bool, clock: impl FnOnce() -> Instant) {
        // The clock is read only when there is something to do: the balancer polls the adaptor
        // before every pick, and most polls find nothing (a system call's worth of each).
        if !notified && self.sharing.is_none() {
            return;
        }
        let now = clock();
        if notified {
            self.reconfigure(now);
            self.apply_controls(now);
            self.signalled(now);
            self.idle_flagged(now);
        }
        self.sync_hosts(now);
    }

    /// Settles what follows from the rest once the inputs are in: whether the rules leave the
    /// balancer any endpoint (and what that does to the set), then, with no change left for
    /// the balancer, the room shown to the records. True while changes wait for the balancer.
    pub(crate) fn settle(&mut self) -> bool {
        self.sync_all_out();
        if self.has_changes() {
            return true;
        }
        self.publish_room();
        false
    }

    fn signalled(&mut self, now: Instant) {
        let mut flagged: Vec<(u64, K)> = self
            .signals
            .take()
            .into_iter()
            .filter_map(|slot| {
                let (key, entry) = self.entries.by_slot(slot)?;
                Some((entry.id, key.clone()))
            })
            .collect();
        // In discovery order: when several compete for one budget slot the first discovered
        // wins, whatever order their bits came in.
        flagged.sort_unstable_by_key(|(id, _)| *id);
        for (id, key) in flagged {
            match self.entries.get(&key) {
                Some(entry) if entry.id == id => {
                    entry.record().take_flag();
                }
                _ => continue,
            }
            self.consider(&key, now);
            self.watch_if_avoided(&key, now);
        }
    }

    /// The keys of the entries that match, in discovery order: when several endpoints compete
    /// for one budget slot the first discovered wins, whatever the hash map's order, so a run is
    /// reproducible from its inputs.
    fn keys_where(&self, mut matches: impl FnMut(&Entry<S>) -> bool) -> Vec<K> {
        let mut keys: Vec<(u64, K)> = self
            .entries
            .iter()
            .filter(|(_, e)| matches(e))
            .map(|(k, e)| (e.id, k.clone()))
            .collect();
        keys.sort_unstable_by_key(|(id, _)| *id);
        keys.into_iter().map(|(_, k)| k).collect()
    }

    /// Judges the endpoints whose ejection was refused again — only when an ejection could now
    /// pass: with the budget spent and many outliers kept in, re-judging every one of them at
    /// every change cost each upstream change a pass over all of them.
    fn retry_refused(&mut self, now: Instant) {
        if self.refused.is_empty() {
            return;
        }
        // An endpoint forced out needs only another endpoint to fall back on, whatever the budget.
        let forced_pending = !self.forced.is_empty() && self.available() >= 1;
        if self.room().is_err() && !forced_pending {
            return;
        }
        // In discovery order, and only while an ejection could still pass: once the room is
        // spent, the rest stay refused without being judged again (with a fleet of refused
        // outliers, judging them all at every insert made inserts quadratic).
        let mut after = 0;
        while let Some((&id, key)) = self.refused.range(after..).next() {
            let key = key.clone();
            after = id.saturating_add(1);
            self.consider(&key, now);
            let forced_pending = !self.forced.is_empty() && self.available() >= 1;
            if self.room().is_err() && !forced_pending {
                break;
            }
        }
    }

    fn consider(&mut self, key: &K, now: Instant) {
        let readiness_changed = self.sync_unready(key);
        self.report_states(key);
        self.judge_and_eject(key, now);
        self.report_states(key);
        if readiness_changed {
            // Fewer endpoints to pick may leave none (an ejected one comes back on trial); more
            // may make room for an ejection that was refused.
            self.enforce_budget(now);
            self.retry_refused(now);
        }
    }

    /// Judges one available endpoint and ejects it if a policy says so and the rules allow it.
    fn judge_and_eject(&mut self, key: &K, now: Instant) {
        let verdict = self.decide(key);
        self.apply(key, verdict, now);
    }
}

impl<K, S> Drop for Engine<K, S> {
    fn drop(&mut self) {
        // The monitor outlives the adaptor; it must not keep listing endpoints nobody tracks.
        let mut tracked = self.registry.leave(self.roster);
        if self.nothing_to_pick {
            self.registry
                .nothing_to_pick
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
        if let Some(sharing) = &self.sharing {
            sharing.registry.leave(sharing.member);
        }
        if let Some(board) = &self.idle {
            board.close();
        }
        // No user code in a destructor run by an unwind (a second panic there would abort).
        if std::thread::panicking() {
            return;
        }
        let mut gone: Vec<&Entry<S>> = self.entries.values().collect();
        gone.sort_unstable_by_key(|entry| entry.id);
        for entry in gone {
            if let Some(tracked) = tracked.remove(&entry.id) {
                let status = entry.standing().public();
                self.registry.events.emit(|| Event::Removed {
                    key: tracked.key,
                    status,
                });
            }
        }
    }
}

mod apply;
mod availability;
mod avoided;
mod controls;
mod decide;
mod entries;
mod health;
mod hosts;
mod idle;
mod readmit;
mod reconfigure;
mod recovery;
mod settings;
mod shown;
mod signals;
mod standing;
#[cfg(test)]
mod tests;
mod upstream;
