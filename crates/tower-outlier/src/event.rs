//! The layer's events, their types and the hub they go out through (the public module is
//! `events`, with the Envoy event log beside them).

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::broadcast;
use tower_outlier_core::{Lock, Reason};

/// An endpoint's discover key, typed: [`downcast_ref`](Self::downcast_ref) gives the key itself
/// (a `SocketAddr`, a `Uri`, your own type), and it reads as its `Debug` text (`as_str`, `Deref`
/// to `str`, comparisons with `&str`) where text is enough.
#[derive(Clone)]
pub struct EndpointKey(Arc<KeyInner<dyn Any + Send + Sync>>);

// The text and the key behind one pointer: the layer keeps a copy of every endpoint's key.
struct KeyInner<V: ?Sized> {
    text: Box<str>,
    // Last, as it is unsized behind the pointer.
    value: V,
}

impl EndpointKey {
    pub(crate) fn new<K: fmt::Debug + Clone + Send + Sync + 'static>(key: &K) -> Self {
        let inner: Arc<KeyInner<dyn Any + Send + Sync>> = Arc::new(KeyInner {
            text: format!("{key:?}").into_boxed_str(),
            value: key.clone(),
        });
        EndpointKey(inner)
    }

    /// The key, if it is a `K`.
    ///
    /// ```
    /// # use tower_outlier::Snapshot;
    /// # fn show(snapshot: Snapshot) {
    /// for endpoint in snapshot.endpoints {
    ///     if let Some(addr) = endpoint.key.downcast_ref::<std::net::SocketAddr>() {
    ///         println!("{} is {:?}", addr.ip(), endpoint.status);
    ///     }
    /// }
    /// # }
    /// ```
    pub fn downcast_ref<K: 'static>(&self) -> Option<&K> {
        self.0.value.downcast_ref()
    }

    /// The key as `Debug` prints it.
    pub fn as_str(&self) -> &str {
        &self.0.text
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for EndpointKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0.text)
    }
}

impl Deref for EndpointKey {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0.text
    }
}

impl fmt::Debug for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.text)
    }
}

impl fmt::Display for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.text)
    }
}

impl PartialEq for EndpointKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.text == other.0.text
    }
}

impl Eq for EndpointKey {}

impl PartialEq<str> for EndpointKey {
    fn eq(&self, other: &str) -> bool {
        &*self.0.text == other
    }
}

impl PartialEq<&str> for EndpointKey {
    fn eq(&self, other: &&str) -> bool {
        &*self.0.text == *other
    }
}

impl Hash for EndpointKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.text.hash(state);
    }
}

impl PartialOrd for EndpointKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for EndpointKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.text.cmp(&other.0.text)
    }
}

/// Why an ejected endpoint came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Readmission {
    /// An active probe succeeded.
    ProbeSucceeded,
    /// Its recovery check came: back on trial.
    PassiveTrial,
    /// The upstream shrank so that more were out than the budget allows.
    BudgetShrank,
    /// No other endpoint was available.
    LastEndpoint,
    /// New rules turned off the policy that ejected it.
    PolicyOff,
    /// Its host came back in the services sharing it (HSF ipDimension).
    HostBack,
    /// An operator forced it in, or released it from being forced out ([`crate::controls`]).
    Operator,
    /// Dry run was turned on for the policy that ejected it: it is back in the balancer's set,
    /// and the rest of its ejection is reported as [`Event::DryRun`].
    DryRun,
    /// The time its server asked to be left alone for is up ([`crate::pushback`]).
    PushbackOver,
    /// Its health service says it is serving again ([`crate::probe::Probe::watch`]).
    Serving,
}

impl fmt::Display for Readmission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Readmission::ProbeSucceeded => "probe succeeded",
            Readmission::PassiveTrial => "passive trial",
            Readmission::BudgetShrank => "ejection budget shrank",
            Readmission::LastEndpoint => "no other endpoint available",
            Readmission::PolicyOff => "the policy that ejected it was turned off",
            Readmission::HostBack => "its host is back in the services that share it",
            Readmission::Operator => "an operator brought it back",
            Readmission::DryRun => "dry run turned on for the policy that ejected it",
            Readmission::PushbackOver => "the time its server asked for is up",
            Readmission::Serving => "its health service says it is serving",
        })
    }
}

/// Why the layer kept in an endpoint a policy judged an outlier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// As many endpoints are out as the budget allows.
    Budget,
    /// It is the last endpoint available.
    LastEndpoint,
    /// An operator forced it in ([`Override::ForcedIn`](crate::controls::Override)).
    ForcedIn,
}

/// The policy name an operator's decisions are reported under ([`Reason::policy`]).
pub const OPERATOR_POLICY: &str = "operator";

/// The policy name an ejection its server asked for (`Retry-After`, gRPC's pushback) is reported
/// under.
pub const PUSHBACK_POLICY: &str = "pushback";

/// The policy name an ejection its health service asked for (NOT_SERVING) is reported under.
pub const HEALTH_POLICY: &str = "health";

/// The policy name an ejection for failed active checks of an endpoint in service is reported
/// under ([`ProbeCadence::no_traffic_interval`](crate::probe::ProbeCadence::no_traffic_interval)).
pub const ACTIVE_CHECK_POLICY: &str = "active_check";

/// Whether `reason` is the rules' judgement of an outlier (a policy's, or the host another
/// service's policy holds out), not an operator's decision, what the endpoint's server or
/// health service said of itself, nor the layer's active checks: what counts as an outlier
/// ejection in gRFC A91's metrics.
///
/// ```
/// use tower_outlier::events::{is_outlier_judgement, PUSHBACK_POLICY};
/// use tower_outlier::policy::{Reason, WindowCounts};
///
/// let reason = |policy| Reason {
///     policy,
///     measure: "",
///     value: 0.0,
///     threshold: 0.0,
///     comparison: tower_outlier::policy::Comparison::AtOrAbove,
///     counts: WindowCounts::default(),
/// };
/// assert!(is_outlier_judgement(&reason("error-rate")));
/// assert!(!is_outlier_judgement(&reason(PUSHBACK_POLICY)));
/// ```
pub fn is_outlier_judgement(reason: &Reason) -> bool {
    ![
        OPERATOR_POLICY,
        PUSHBACK_POLICY,
        HEALTH_POLICY,
        ACTIVE_CHECK_POLICY,
    ]
    .contains(&reason.policy)
}

/// One decision of the layer, in the order the adaptor took them.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// Taken out of the balancer's set.
    Ejected {
        /// The endpoint.
        key: EndpointKey,
        /// Why (the policy, the measure, its value and threshold).
        reason: Reason,
        /// When it is checked again (`None`: when its host comes back).
        next_check_in: Option<Duration>,
    },
    /// A policy judged it an outlier, and the layer kept it in (once per episode).
    EjectionRefused {
        /// The endpoint.
        key: EndpointKey,
        /// The policy's judgement.
        reason: Reason,
        /// Which rule kept it in.
        refusal: Refusal,
    },
    /// Back in the balancer's set.
    Readmitted {
        /// The endpoint.
        key: EndpointKey,
        /// Why.
        cause: Readmission,
        /// How long its trial lasts, if it is on trial.
        trial: Option<Duration>,
    },
    /// Its trial ended with no outlier judgement and enough calls: recovered.
    Recovered {
        /// The endpoint.
        key: EndpointKey,
    },
    /// Judged an outlier again during its trial: a failed recovery check.
    TrialFailed {
        /// The endpoint.
        key: EndpointKey,
        /// Failed checks in a row.
        failed_checks: u32,
    },
    /// An active probe of it was started.
    ProbeStarted {
        /// The endpoint.
        key: EndpointKey,
    },
    /// An active probe of it failed (or timed out): it stays out.
    ProbeFailed {
        /// The endpoint.
        key: EndpointKey,
        /// When it is checked again.
        next_check_in: Duration,
    },
    /// A policy changed its weight (relative to its original weight).
    WeightChanged {
        /// The endpoint.
        key: EndpointKey,
        /// The weight before.
        from: f64,
        /// The weight now.
        to: f64,
    },
    /// The upstream removed it, or its adaptor was dropped: the layer forgets it (a probe of it
    /// in flight is abandoned).
    Removed {
        /// The endpoint.
        key: EndpointKey,
        /// Where it stood.
        status: crate::status::EndpointStatus,
    },
    /// A policy's state for the endpoint changed (a slow-call breaker's or linkerd's
    /// probe gate's CLOSED, OPEN, HALF_OPEN), as the layer saw it at its decisions: when a
    /// call crossed a threshold, a probe answered, the endpoint was ejected or re-admitted. A
    /// state held only between two of those (a breaker half open while its probe runs) may not
    /// show; `SlowCallPolicy::on_state_change` reports every transition, on a thread of its own.
    PolicyStateChanged {
        /// The endpoint.
        key: EndpointKey,
        /// The policy.
        policy: &'static str,
        /// The state before (`None`: none yet).
        from: Option<&'static str>,
        /// The state now.
        to: Option<&'static str>,
    },
    /// An adaptor put new rules in force.
    RulesApplied {
        /// Their version.
        version: u64,
    },
    /// New rules were refused; those in force stay.
    RulesRejected {
        /// Why.
        error: String,
    },
    /// What the layer would have done about an endpoint had the policy that judged it not been
    /// in dry run ([`RulesHandle::set_dry_run`](crate::RulesHandle::set_dry_run)): the event an
    /// enforcing layer emits, at the same decision — `Ejected`, `EjectionRefused`,
    /// `Readmitted`, `Recovered`, `TrialFailed`, `ProbeStarted`, `ProbeFailed`. The endpoint
    /// stayed in the balancer's set.
    DryRun(Box<Event>),
    /// An operator's action took effect on the endpoint ([`crate::controls`]).
    Operator {
        /// The endpoint.
        key: EndpointKey,
        /// What was done.
        action: crate::controls::OperatorAction,
    },
}

impl Event {
    /// The endpoint the event is about, if it is about one.
    pub fn key(&self) -> Option<&EndpointKey> {
        match self {
            Event::Ejected { key, .. }
            | Event::EjectionRefused { key, .. }
            | Event::Readmitted { key, .. }
            | Event::Recovered { key }
            | Event::TrialFailed { key, .. }
            | Event::ProbeStarted { key }
            | Event::ProbeFailed { key, .. }
            | Event::WeightChanged { key, .. }
            | Event::Removed { key, .. }
            | Event::PolicyStateChanged { key, .. }
            | Event::Operator { key, .. } => Some(key),
            Event::DryRun(event) => event.key(),
            Event::RulesApplied { .. } | Event::RulesRejected { .. } => None,
        }
    }
}

pub(crate) type Callback = Arc<dyn Fn(&Event) + Send + Sync>;

/// Delivers events to subscribers: a broadcast channel for async consumers and callbacks for
/// synchronous ones (metrics). Nothing is built when nobody listens.
pub(crate) struct EventHub {
    capacity: usize,
    // Opened by the first subscriber: the channel's buffer is all its slots at once (128 KiB for
    // the monitor's 1024 events), which a layer nobody subscribes to need not hold.
    sender: OnceLock<broadcast::Sender<Event>>,
    callbacks: Lock<Vec<Callback>>,
    has_callbacks: AtomicBool,
}

impl EventHub {
    pub(crate) fn new(capacity: usize) -> Self {
        EventHub {
            capacity: capacity.max(1),
            sender: OnceLock::new(),
            callbacks: Lock::new(Vec::new()),
            has_callbacks: AtomicBool::new(false),
        }
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.sender
            .get_or_init(|| broadcast::channel(self.capacity).0)
            .subscribe()
    }

    /// The channel, while a receiver of it is alive.
    fn received(&self) -> Option<&broadcast::Sender<Event>> {
        self.sender
            .get()
            .filter(|sender| sender.receiver_count() > 0)
    }

    /// Whether anybody listens (a callback or a live receiver).
    pub(crate) fn listened(&self) -> bool {
        self.has_callbacks.load(Ordering::Acquire) || self.received().is_some()
    }

    pub(crate) fn on_event(&self, callback: Callback) {
        self.callbacks.lock().push(callback);
        self.has_callbacks.store(true, Ordering::Release);
    }

    /// Removes `callback` (the same `Arc`); true if it was there.
    pub(crate) fn remove_callback(&self, callback: &Callback) -> bool {
        let mut callbacks = self.callbacks.lock();
        let before = callbacks.len();
        callbacks.retain(|c| !Arc::ptr_eq(c, callback));
        let removed = callbacks.len() != before;
        if callbacks.is_empty() {
            self.has_callbacks.store(false, Ordering::Release);
        }
        removed
    }

    /// Sends the event `make` builds, if anybody listens. Cold path: the adaptor's decisions.
    pub(crate) fn emit(&self, make: impl FnOnce() -> Event) {
        let callbacks = self.has_callbacks.load(Ordering::Acquire);
        if !callbacks && self.received().is_none() {
            return;
        }
        let event = make();
        if callbacks {
            let callbacks = self.callbacks.lock().clone();
            for callback in callbacks {
                // A callback runs on the adaptor's task, inside the balancer's `poll_ready` (and
                // behind `Buffer`, in its worker): a panic there would take the service down.
                // It is caught, logged, and the next callbacks and subscribers still get the
                // event.
                let run = std::panic::AssertUnwindSafe(|| callback(&event));
                if let Err(panic) = std::panic::catch_unwind(run) {
                    tracing::error!(
                        target: "tower_outlier",
                        event = ?event,
                        panic = tower_outlier_core::panic_message(&*panic),
                        "an on_event callback panicked; the event was still delivered to the others"
                    );
                    tower_outlier_core::drop_panic(panic);
                }
            }
        }
        // A receiver may have subscribed while the callbacks ran.
        if let Some(sender) = self.sender.get() {
            // No receiver left is not an error: nobody listens any more.
            let _ = sender.send(event);
        }
    }
}
