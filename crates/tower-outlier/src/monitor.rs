//! Reading what the layer decided: per-endpoint status, window counts and next check.

use std::collections::hash_map::{self, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tower_outlier_core::{Lock, LockGuard, Reason, WindowCounts};

use crate::endpoint::HasRecord;
use crate::events::{EndpointKey, Event, EventHub};

/// How many events a slow broadcast subscriber may fall behind by.
const EVENTS_CAPACITY: usize = 1024;

/// Where an endpoint stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum EndpointStatus {
    /// In the balancer's set, serving requests.
    Available,
    /// Re-admitted for a passive trial: serving requests and judged only on what happened since
    /// re-admission; ejected again with a longer interval if it breaches before the trial ends.
    Trial,
    /// Out of the balancer's set, waiting for its next recovery check.
    Ejected,
    /// Out of the balancer's set while an active probe is in flight.
    Probing,
    /// In the balancer's set, but its service's `poll_ready` failed: the endpoint reports itself
    /// not ready (the balancer does not pick it) and asks its service again after a back-off,
    /// from 100 ms up to 30 s. The layer does not count it as an endpoint to fall back on.
    Unready,
}

impl EndpointStatus {
    /// Whether the balancer may send requests to the endpoint.
    pub fn is_available(&self) -> bool {
        matches!(self, EndpointStatus::Available | EndpointStatus::Trial)
    }
}

/// Endpoints a snapshot copies per hold of the registry's lock.
const SNAPSHOT_BATCH: usize = 1024;

/// What a snapshot copies of one endpoint under the registry's lock.
struct Copied {
    key: EndpointKey,
    names: Arc<[&'static str]>,
    shared: Arc<dyn HasRecord>,
    status: EndpointStatus,
    unready: bool,
    next_check: Option<Instant>,
    failed_checks: u32,
    last_reason: Option<Reason>,
    refused: Option<String>,
}

/// How long after its last failed call an endpoint that gets no call is shown as avoided.
const AVOIDED_AFTER: Duration = Duration::from_secs(1);

/// One policy's window, as a snapshot shows it.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PolicyWindow {
    /// The policy's name.
    pub policy: &'static str,
    /// The counts in its window now.
    pub counts: WindowCounts,
    /// The state the policy holds the endpoint in, if it has one (a slow-call breaker's
    /// `"CLOSED"`, `"OPEN"`, `"HALF_OPEN"`; linkerd's `"OPEN"`, `"SHUT"`, `"PROBATION"`).
    pub state: Option<&'static str>,
}

/// The state of one endpoint at the time of a [`Monitor::snapshot`].
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct EndpointSnapshot {
    /// The endpoint's discover key: typed ([`EndpointKey::downcast_ref`]), and read as its
    /// `Debug` text where text is enough.
    pub key: EndpointKey,
    /// Available, on trial, ejected or probing.
    pub status: EndpointStatus,
    /// Each policy's window, in the layer's policy order.
    pub windows: Vec<PolicyWindow>,
    /// The first policy's failure rate (`failures / calls`, 0 with no calls).
    pub error_rate: f64,
    /// Time until the next recovery check (ejected) or the end of the trial (on trial).
    pub next_check_in: Option<Duration>,
    /// The same as a point in time (the system clock at the snapshot plus `next_check_in`).
    pub next_check_at: Option<SystemTime>,
    /// Consecutive failed recovery checks; the next interval is this plus one units, capped.
    pub failed_checks: u32,
    /// Why the endpoint was last ejected, if it ever was.
    pub last_reason: Option<Reason>,
    /// Requests in flight.
    pub in_flight: usize,
    /// The latency estimate the endpoint's load is computed from (decayed to the snapshot's
    /// time): raised by fast failures, restored by the first success after them.
    pub latency_estimate: Duration,
    /// Relative weight (1.0 = the endpoint's original weight).
    pub weight: f64,
    /// The absolute weight a weight policy gives it (SOFARPC's), if the layer has one.
    pub absolute_weight: Option<f64>,
    /// Whether a weight policy holds it degraded.
    pub degraded: bool,
    /// Set while the endpoint is in the balancer's set, its last call failed at least a second ago
    /// and no call has completed since: the balancer is **avoiding** it, since its latency
    /// estimate carries the failures, and its policies have not judged it (a policy that judges
    /// on a timer, a window short of its minimum after timeouts, a budget that refused). The time
    /// since that last call. Callers get no traffic sent to it; it gets calls again as its
    /// estimate decays (within about 30 s after fast failures, longer after timeouts), and the
    /// first success brings it back to its share.
    pub avoided_for: Option<Duration>,
    /// Why the layer keeps the endpoint in although a policy judged it an outlier: "last
    /// available endpoint", or the budget, as "ejection budget of 0 for 3 endpoints at 20 %"
    /// (EDAS's 20 % rounds down to none below five endpoints) or "ejection budget of 1 for 5
    /// endpoints at 20 % is spent". Cleared once it is ejected or no longer judged an outlier.
    pub refused: Option<String>,
}

/// All endpoints of a layer, sorted by key.
#[derive(Clone, Debug, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Snapshot {
    /// One entry per endpoint the upstream currently holds.
    pub endpoints: Vec<EndpointSnapshot>,
    /// The version of the rules in force: the newest an adaptor of the layer has applied (0 as
    /// built; see [`RulesHandle`](crate::RulesHandle)). A version just published is in force once
    /// the balancer next polls the adaptor.
    pub rules_version: u64,
    /// Why the last reconfiguration was refused, if it was (cleared by the next accepted one).
    pub rules_error: Option<String>,
    /// What the rules in force said on their way in, when a document was accepted with notes:
    /// keys it ignored (with the key a misspelt one likely meant), detection it switched off.
    /// Replaced by the next accepted change.
    pub rules_notes: Vec<String>,
    /// Errors the upstream discover streams returned that the layer kept serving through
    /// ([`DiscoverErrors::KeepServing`](crate::DiscoverErrors)).
    pub discover_errors: u64,
    /// Set while the layer's budget allows no ejection at all for the endpoints it has, with
    /// why: "ejection budget of 0 for 3 endpoints at 20 %" (EDAS's 20 % of fewer than five,
    /// Envoy's 10 % of fewer than ten). Its policies may judge endpoints outliers; none is
    /// ejected, and failing ones are only avoided by the balancer.
    pub no_ejection: Option<String>,
}

impl Snapshot {
    /// The endpoint whose key prints (with `Debug`) as `key`.
    pub fn get(&self, key: &str) -> Option<&EndpointSnapshot> {
        self.endpoints.iter().find(|e| e.key.as_str() == key)
    }

    /// The endpoint with discover key `key` (compared by its `Debug` form, as snapshots keep it).
    ///
    /// ```
    /// # use tower_outlier::Snapshot;
    /// let addr: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
    /// let snapshot = Snapshot::default();
    /// assert!(snapshot.get_key(&addr).is_none());
    /// ```
    pub fn get_key<K: fmt::Debug + ?Sized>(&self, key: &K) -> Option<&EndpointSnapshot> {
        self.get(&format!("{key:?}"))
    }

    /// How many endpoints are out of the balancer's set (ejected or probing).
    pub fn ejected(&self) -> usize {
        self.endpoints
            .iter()
            .filter(|e| !e.status.is_available())
            .count()
    }
}

/// A handle for reading the layer's decisions (what EDAS and HSF call "verify the result").
///
/// Cheap to clone. Every adaptor the layer builds reports to the same monitor.
///
/// Window counts are read live. Statuses change when the adaptor runs, which is when the balancer
/// polls discovery: behind `tower::buffer::Buffer` that is on the next request, so an idle
/// balancer can show an endpoint as ejected with its next check already due (`next_check_in` of
/// zero) until traffic resumes and the check runs.
///
#[cfg_attr(feature = "error-rate", doc = "```")]
#[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build().unwrap()));
/// let monitor = layer.monitor();
/// // ... build the balancer with `layer` ...
/// for endpoint in monitor.snapshot().endpoints {
///     println!("{} {:?} error rate {:.2}", endpoint.key, endpoint.status, endpoint.error_rate);
/// }
/// ```
#[derive(Clone)]
pub struct Monitor {
    registry: Arc<Registry>,
}

pub(crate) struct Registry {
    // The ids of adaptors and endpoints: an endpoint's is its place in the order of discovery.
    next_id: AtomicU64,
    // Each adaptor's endpoints, by the adaptor's id.
    rosters: Lock<HashMap<u64, Roster>>,
    rules: Lock<(u64, Option<String>)>,
    rules_notes: Lock<Vec<String>>,
    pub(crate) events: EventHub,
    discover_errors: AtomicU64,
    // Adaptors waiting for `rosters`: a snapshot gives way to them between its batches (std's
    // lock is not fair: released and taken again at once, it went back to the snapshot about
    // every time, and an upstream change waited for the whole snapshot, 18 ms at 100 000).
    waiting: AtomicUsize,
}

/// The endpoints of one adaptor.
struct Roster {
    // The names of the adaptor's policies, in order: every endpoint of the adaptor has them, so
    // they are held once.
    policies: Arc<[&'static str]>,
    endpoints: HashMap<u64, Tracked>,
    // Where the adaptor last put each endpoint, from its first ejection on; one missing is
    // available and was never ejected, as most are. Apart from `endpoints`, where every slot
    // would pay for it, and boxed, so that a map holding many costs little beyond the boxes.
    standings: HashMap<u64, Box<Standing>>,
    // Why the adaptor can eject no endpoint at all now (its budget rounds to none), if so.
    no_ejection: Option<Box<str>>,
}

pub(crate) struct Tracked {
    pub(crate) key: EndpointKey,
    record: Weak<dyn HasRecord>,
}

/// Where the adaptor put an endpoint, and why it last ejected it.
struct Standing {
    status: EndpointStatus,
    next_check: Option<Instant>,
    failed_checks: u32,
    last_reason: Option<Reason>,
    refused: Option<Box<str>>,
    unready: bool,
}

impl Standing {
    /// Where every endpoint starts.
    const INITIAL: Standing = Standing {
        status: EndpointStatus::Available,
        next_check: None,
        failed_checks: 0,
        last_reason: None,
        refused: None,
        unready: false,
    };
}

impl Tracked {
    /// A newly discovered endpoint: available.
    pub(crate) fn new(key: EndpointKey, record: Weak<dyn HasRecord>) -> Self {
        Tracked { key, record }
    }
}

impl Roster {
    /// Where endpoint `id` stands.
    fn standing(&self, id: u64) -> &Standing {
        self.standings
            .get(&id)
            .map_or(&Standing::INITIAL, |standing| standing)
    }
}

impl Monitor {
    pub(crate) fn new() -> Self {
        Monitor {
            registry: Arc::new(Registry {
                discover_errors: AtomicU64::new(0),
                waiting: AtomicUsize::new(0),
                next_id: AtomicU64::new(0),
                rosters: Lock::new(HashMap::new()),
                rules: Lock::new((0, None)),
                rules_notes: Lock::new(Vec::new()),
                events: EventHub::new(EVENTS_CAPACITY),
            }),
        }
    }

    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Whether `other` is a handle on the same layer's monitor.
    #[cfg(feature = "prometheus")]
    pub(crate) fn same_as(&self, other: &Monitor) -> bool {
        Arc::ptr_eq(&self.registry, &other.registry)
    }

    /// The current state of every endpoint.
    pub fn snapshot(&self) -> Snapshot {
        let now = Instant::now();
        // Wall-clock time for the people and programs reading the snapshot; nothing is measured
        // with it (measurements read the layer's `Clock`).
        #[allow(clippy::disallowed_methods)]
        let wall = SystemTime::now();
        // What the snapshot needs is copied under the registry's lock, a batch of endpoints at a
        // time, and computed outside it (windows, calls in flight, judgements): the adaptor takes
        // that lock for every upstream change and every decision, so a snapshot of 100 000
        // endpoints held it for a third of a second. The snapshot is consistent per endpoint, not
        // across endpoints (as it never was across adaptors' records).
        self.registry.give_way();
        let ids: Vec<(u64, u64)> = {
            let rosters = self.registry.rosters.lock();
            rosters
                .iter()
                .flat_map(|(&roster, r)| r.endpoints.keys().map(move |&id| (roster, id)))
                .collect()
        };
        let mut copied: Vec<Copied> = Vec::with_capacity(ids.len());
        for batch in ids.chunks(SNAPSHOT_BATCH) {
            self.registry.give_way();
            let rosters = self.registry.rosters.lock();
            for &(roster_id, id) in batch {
                let Some(roster) = rosters.get(&roster_id) else {
                    continue;
                };
                let Some(tracked) = roster.endpoints.get(&id) else {
                    continue;
                };
                let Some(shared) = tracked.record.upgrade() else {
                    continue;
                };
                let standing = roster.standing(id);
                copied.push(Copied {
                    key: tracked.key.clone(),
                    names: roster.policies.clone(),
                    shared,
                    status: standing.status,
                    unready: standing.unready,
                    next_check: standing.next_check,
                    failed_checks: standing.failed_checks,
                    last_reason: standing.last_reason.clone(),
                    refused: standing.refused.as_deref().map(str::to_owned),
                });
            }
        }
        let mut endpoints: Vec<EndpointSnapshot> = copied
            .into_iter()
            .map(|copied| {
                let shared = &copied.shared;
                let record = shared.record();
                let at = record.clock().now();
                let descriptions: Vec<_> = record
                    .policies()
                    .iter()
                    .map(|policy| policy.describe(at))
                    .collect();
                let windows: Vec<PolicyWindow> = descriptions
                    .iter()
                    .zip(copied.names.iter())
                    .map(|(shown, name)| PolicyWindow {
                        policy: name,
                        counts: shown.counts,
                        state: shown.state,
                    })
                    .collect();
                let next_check_in = copied
                    .next_check
                    .map(|at| at.saturating_duration_since(now));
                let weighting = descriptions.iter().find_map(|shown| shown.weight);
                let (absolute_weight, degraded) = (
                    weighting.map(|w| w.weight),
                    weighting.is_some_and(|w| w.degraded),
                );
                let in_flight = shared.in_flight();
                let status = match copied.status {
                    EndpointStatus::Available | EndpointStatus::Trial if copied.unready => {
                        EndpointStatus::Unready
                    }
                    status => status,
                };
                let avoided_for = match copied.status {
                    EndpointStatus::Available | EndpointStatus::Trial if in_flight == 0 => record
                        .failing_for(at)
                        .filter(|since| *since >= AVOIDED_AFTER),
                    _ => None,
                };
                EndpointSnapshot {
                    key: copied.key,
                    status,
                    error_rate: windows.first().map_or(0.0, |w| w.counts.failure_rate()),
                    windows,
                    next_check_in,
                    next_check_at: next_check_in.map(|wait| wall + wait),
                    absolute_weight,
                    degraded,
                    failed_checks: copied.failed_checks,
                    last_reason: copied.last_reason,
                    weight: record.weight(),
                    in_flight,
                    latency_estimate: Duration::from_nanos(record.rtt_estimate(at) as u64),
                    avoided_for,
                    // Only while a policy still judges it an outlier: an endpoint that healed
                    // sends the layer no signal, so the refusal the engine noted can outlive it.
                    refused: copied.refused.filter(|_| record.judge(at).is_some()),
                }
            })
            .collect();
        endpoints.sort_by(|a, b| a.key.cmp(&b.key));
        self.registry.give_way();
        let no_ejection = self
            .registry
            .rosters
            .lock()
            .values()
            .find_map(|roster| roster.no_ejection.as_deref().map(str::to_owned));
        let (rules_version, rules_error) = self.registry.rules.lock().clone();
        let rules_notes = self.registry.rules_notes.lock().clone();
        Snapshot {
            endpoints,
            rules_version,
            rules_error,
            rules_notes,
            discover_errors: self.registry.discover_errors.load(Ordering::Relaxed),
            no_ejection,
        }
    }

    /// How many endpoints the layer tracks (every adaptor it built, all keys the upstreams hold).
    pub fn tracked(&self) -> usize {
        let rosters = self.registry.rosters.lock();
        rosters.values().map(|roster| roster.endpoints.len()).sum()
    }

    /// A receiver of every [`Event`] from now on, in the order the adaptors decided them. It holds
    /// the last 1024; a receiver that falls further behind misses the oldest (and is told so by
    /// `RecvError::Lagged`). Nothing is built for events while nobody listens.
    ///
    #[cfg_attr(feature = "error-rate", doc = "```")]
    #[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
    /// use tower_outlier::events::Event;
    /// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
    ///
    /// # async fn run() -> Result<(), tower::BoxError> {
    /// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
    /// let mut events = layer.monitor().subscribe();
    /// tokio::spawn(async move {
    ///     while let Ok(event) = events.recv().await {
    ///         if let Event::Ejected { key, reason, .. } = event {
    ///             println!("{key} ejected: {reason}");
    ///         }
    ///     }
    /// });
    /// # Ok(()) }
    /// ```
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.registry.events.subscribe()
    }

    /// Calls `callback` with every [`Event`], on the adaptor's task as it decides (a refused
    /// reconfiguration: on the task that offered it), with no lock of the layer held; keep it
    /// short (metrics, logs). Callbacks see every event; none is dropped. A callback that panics
    /// is logged and keeps its place. The returned handle removes it
    /// ([`EventCallback::unsubscribe`]); dropping the handle keeps it.
    ///
    #[cfg_attr(feature = "error-rate", doc = "```")]
    #[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
    /// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
    ///
    /// # fn main() -> Result<(), tower::BoxError> {
    /// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
    /// let logging = layer.monitor().on_event(|event| println!("{event:?}"));
    /// assert!(logging.unsubscribe(), "it was subscribed");
    /// # Ok(()) }
    /// ```
    pub fn on_event(&self, callback: impl Fn(&Event) + Send + Sync + 'static) -> EventCallback {
        let callback: crate::events::Callback = Arc::new(callback);
        self.registry.events.on_event(callback.clone());
        EventCallback {
            registry: Arc::downgrade(&self.registry),
            callback,
        }
    }
}

/// A callback given to [`Monitor::on_event`]: [`unsubscribe`](Self::unsubscribe) removes it.
/// Dropping the handle leaves it subscribed.
pub struct EventCallback {
    registry: std::sync::Weak<Registry>,
    callback: crate::events::Callback,
}

impl EventCallback {
    /// Stops calling the callback; false if it was already removed or the layer is gone.
    pub fn unsubscribe(self) -> bool {
        self.registry
            .upgrade()
            .is_some_and(|registry| registry.events.remove_callback(&self.callback))
    }
}

impl fmt::Debug for EventCallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventCallback").finish_non_exhaustive()
    }
}

impl Registry {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The rosters, for an adaptor: it is counted as waiting while another holds them, so that a
    /// snapshot lets it in between batches.
    fn rosters(&self) -> LockGuard<'_, HashMap<u64, Roster>> {
        if let Some(rosters) = self.rosters.try_lock() {
            return rosters;
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let rosters = self.rosters.lock();
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        rosters
    }

    /// Lets the adaptors waiting for the rosters take them first (a snapshot, between batches).
    fn give_way(&self) {
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
            endpoints: HashMap::new(),
            standings: HashMap::new(),
            no_ejection: None,
        };
        self.rosters().insert(roster, joined);
        roster
    }

    /// The adaptor of `roster` is gone, and so are its endpoints: they are returned.
    pub(crate) fn leave(&self, roster: u64) -> HashMap<u64, Tracked> {
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
        roster.standings.remove(&id);
        roster.endpoints.remove(&id)
    }

    /// New rules in the adaptor of `roster`: its policies are named `policies`, and each endpoint
    /// has a new record. All at once, so no snapshot reads a record with another's names.
    pub(crate) fn reconfigure(
        &self,
        roster: u64,
        policies: Arc<[&'static str]>,
        records: impl IntoIterator<Item = (u64, Weak<dyn HasRecord>)>,
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

    /// The notes of the last accepted document ([`Dialect::parse_noting`](crate::dialect::Dialect)).
    pub(crate) fn rules_notes(&self, notes: Vec<String>) {
        *self.rules_notes.lock() = notes;
    }

    /// The last reconfiguration was refused for `error`, or accepted (`None`: its notes are
    /// cleared too, until the dialect's are set).
    /// A configuration source's trouble (not a refused document: no event, the notes kept).
    #[cfg(feature = "etcd")]
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
    pub(crate) fn publish(
        &self,
        roster: u64,
        id: u64,
        status: EndpointStatus,
        next_check: Option<Instant>,
        failed_checks: u32,
        reason: Option<Reason>,
    ) {
        let mut rosters = self.rosters();
        let Some(roster) = rosters.get_mut(&roster) else {
            return;
        };
        if !roster.endpoints.contains_key(&id) {
            return;
        }
        let standing = match roster.standings.entry(id) {
            hash_map::Entry::Occupied(standing) => standing.into_mut(),
            hash_map::Entry::Vacant(vacant) => {
                let initial = status == EndpointStatus::Available
                    && next_check.is_none()
                    && failed_checks == 0
                    && reason.is_none();
                if initial {
                    // Nothing to hold: it stands where every endpoint starts.
                    return;
                }
                vacant.insert(Box::new(Standing::INITIAL))
            }
        };
        standing.status = status;
        standing.next_check = next_check;
        standing.failed_checks = failed_checks;
        if let Some(reason) = reason {
            standing.last_reason = Some(reason);
        }
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
        match roster.standings.entry(id) {
            hash_map::Entry::Occupied(standing) => standing.into_mut().unready = unready,
            hash_map::Entry::Vacant(vacant) if unready => {
                vacant.insert(Box::new(Standing {
                    unready,
                    ..Standing::INITIAL
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
        match (roster.standings.entry(id), why) {
            (hash_map::Entry::Occupied(standing), why) => {
                standing.into_mut().refused = why.map(String::into_boxed_str);
            }
            (hash_map::Entry::Vacant(vacant), Some(why)) => {
                vacant.insert(Box::new(Standing {
                    refused: Some(why.into_boxed_str()),
                    ..Standing::INITIAL
                }));
            }
            (hash_map::Entry::Vacant(_), None) => {}
        }
    }
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor")
            .field("tracked", &self.tracked())
            .finish()
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests;
