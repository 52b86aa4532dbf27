//! Reading what the layer decided: per-endpoint status, window counts and next check
//! ([`Monitor`], [`Snapshot`]), and the callbacks that follow its events ([`EventCallback`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use tokio::time::Instant;
use tower_outlier_core::{Lock, Reason};

use crate::controls::Override;
use crate::event::{EndpointKey, Event, EventHub};
use crate::shared::Shared;
use building::Copied;
pub(crate) use ids::{IdMap, IdTable};

/// How many events a slow broadcast subscriber may fall behind by.
const EVENTS_CAPACITY: usize = 1024;

/// Endpoints a snapshot copies per hold of the registry's lock.
const SNAPSHOT_BATCH: usize = 1024;

/// The first sixteen bytes of a key's text as a number that orders as the text does (shorter
/// texts padded with zeros, which order first as the shorter text does).
fn key_prefix(text: &str) -> u128 {
    let mut bytes = [0u8; 16];
    let head = &text.as_bytes()[..text.len().min(16)];
    bytes[..head.len()].copy_from_slice(head);
    u128::from_be_bytes(bytes)
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
    rosters: Lock<IdMap<Roster>>,
    rules: Lock<(u64, Option<String>)>,
    rules_notes: Lock<Vec<String>>,
    // The layer-wide dry run, and the policies in dry run of their own (by name).
    dry_run: Lock<(bool, Vec<&'static str>)>,
    pub(crate) events: EventHub,
    discover_errors: AtomicU64,
    // Adaptors whose balancer has no endpoint to pick: the fail-fast guard fails calls then.
    pub(crate) nothing_to_pick: AtomicUsize,
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
    endpoints: IdTable<Tracked>,
    // Where the adaptor last put each endpoint, from its first ejection on; one missing is
    // available and was never ejected, as most are. Apart from `endpoints`, where every slot
    // would pay for it, and boxed, so that a map holding many costs little beyond the boxes.
    shown: IdMap<Box<Shown>>,
    // Why the adaptor can eject no endpoint at all now (its budget rounds to none), if so.
    no_ejection: Option<Box<str>>,
    // Why the balancer has every endpoint or none (panic, fail fast), if so.
    all_out: Option<Box<str>>,
}

pub(crate) struct Tracked {
    pub(crate) key: EndpointKey,
    record: Weak<Shared>,
}

/// What the monitor shows of an endpoint: where the adaptor put it, and why it last ejected it.
struct Shown {
    status: EndpointStatus,
    next_check: Option<Instant>,
    failed_checks: u32,
    last_reason: Option<Reason>,
    refused: Option<Box<str>>,
    unready: bool,
    // The status is what dry run would do: the endpoint is in the balancer's set.
    dry_run: bool,
    forced: Option<Override>,
}

impl Shown {
    /// Where every endpoint starts.
    const INITIAL: Shown = Shown {
        status: EndpointStatus::Available,
        next_check: None,
        failed_checks: 0,
        last_reason: None,
        refused: None,
        unready: false,
        dry_run: false,
        forced: None,
    };
}

impl Tracked {
    /// A newly discovered endpoint: available.
    pub(crate) fn new(key: EndpointKey, record: Weak<Shared>) -> Self {
        Tracked { key, record }
    }
}

impl Roster {
    /// Where endpoint `id` stands.
    fn shown(&self, id: u64) -> &Shown {
        self.shown
            .get(&id)
            .map_or(&Shown::INITIAL, |standing| standing)
    }
}

impl Monitor {
    pub(crate) fn new() -> Self {
        Monitor {
            registry: Arc::new(Registry {
                discover_errors: AtomicU64::new(0),
                waiting: AtomicUsize::new(0),
                nothing_to_pick: AtomicUsize::new(0),
                next_id: AtomicU64::new(0),
                rosters: Lock::new(IdMap::default()),
                rules: Lock::new((0, None)),
                rules_notes: Lock::new(Vec::new()),
                dry_run: Lock::new((false, Vec::new())),
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
        let (rosters_listed, tracked) = {
            let rosters = self.registry.rosters.lock();
            let listed: Vec<u64> = rosters.keys().copied().collect();
            let tracked: usize = rosters.values().map(|roster| roster.endpoints.len()).sum();
            (listed, tracked)
        };
        let mut copied: Vec<Copied> = Vec::with_capacity(tracked);
        // The order of the keys' text (then adaptor and endpoint ids, for a key two adaptors
        // share), found before the snapshots are built, by index and by the first sixteen bytes
        // of each key read while it is copied: sorting the finished snapshots compared keys
        // through two pointers each and moved every snapshot many times (100 of the 200 ms a
        // snapshot of 100 000 endpoints took).
        let mut order: Vec<(u128, u64, u64, usize)> = Vec::with_capacity(tracked);
        // Each adaptor's endpoints in id order, a batch per hold of the lock, each batch going
        // on from the id after the last one read: one pass over the roster's list, where a list
        // of every id first and a lookup per id took two hash lookups per endpoint.
        for roster_id in rosters_listed {
            let mut from = 0;
            loop {
                self.registry.give_way();
                let rosters = self.registry.rosters.lock();
                let Some(roster) = rosters.get(&roster_id) else {
                    break;
                };
                let mut read = 0;
                for (id, tracked) in roster.endpoints.iter_from(from).take(SNAPSHOT_BATCH) {
                    read += 1;
                    from = id + 1;
                    let Some(shared) = tracked.record.upgrade() else {
                        continue;
                    };
                    let standing = roster.shown(id);
                    order.push((0, roster_id, id, copied.len()));
                    copied.push(Copied {
                        key: tracked.key.clone(),
                        names: roster.policies.clone(),
                        shared,
                        status: standing.status,
                        dry_run: standing.dry_run,
                        forced: standing.forced,
                        unready: standing.unready,
                        next_check: standing.next_check,
                        failed_checks: standing.failed_checks,
                        last_reason: standing.last_reason.clone(),
                        refused: standing.refused.as_deref().map(str::to_owned),
                    });
                }
                if read < SNAPSHOT_BATCH {
                    break;
                }
            }
        }
        // Outside the registry's lock: each key's text is a read of its own.
        for entry in &mut order {
            entry.0 = key_prefix(copied[entry.3].key.as_str());
        }
        order.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0).then_with(|| {
                let text = |index: usize| copied[index].key.as_str();
                text(a.3).cmp(text(b.3)).then((a.1, a.2).cmp(&(b.1, b.2)))
            })
        });
        // Built in the order copied, each entry put in the keys' order as it is built: the
        // entry copied `i`th is the `rank[i]`th.
        let mut rank = vec![0; order.len()];
        for (at, &(.., index)) in order.iter().enumerate() {
            if let Some(slot) = rank.get_mut(index) {
                *slot = at;
            }
        }
        drop(order);
        let endpoints = building::build_all(copied, &rank, now, wall);
        self.registry.give_way();
        let (no_ejection, all_out) = {
            let rosters = self.registry.rosters.lock();
            (
                rosters
                    .values()
                    .find_map(|roster| roster.no_ejection.as_deref().map(str::to_owned)),
                rosters
                    .values()
                    .find_map(|roster| roster.all_out.as_deref().map(str::to_owned)),
            )
        };
        let (rules_version, rules_error) = self.registry.rules.lock().clone();
        let rules_notes = self.registry.rules_notes.lock().clone();
        let (dry_run, dry_run_policies) = self.registry.dry_run.lock().clone();
        Snapshot {
            dry_run,
            dry_run_policies,
            endpoints,
            rules_version,
            rules_error,
            rules_notes,
            discover_errors: self.registry.discover_errors.load(Ordering::Relaxed),
            no_ejection,
            all_out,
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
        let callback: crate::event::Callback = Arc::new(callback);
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
    callback: crate::event::Callback,
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

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor")
            .field("tracked", &self.tracked())
            .finish()
    }
}

mod building;
mod ids;
mod registry;
pub(crate) use registry::Placement;
mod snapshot;
pub use snapshot::*;

#[cfg(all(test, feature = "serde"))]
mod tests;
