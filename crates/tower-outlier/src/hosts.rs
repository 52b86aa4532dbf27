//! Hosts shared by several layers: HSF's `ipDimension`, where a host ejected in one service is
//! ejected in every service that runs on it.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use tower_outlier_core::{EndpointPolicy, Lock, Notifier};

/// The hosts that layers sharing them have ejected. Give one registry to the layer of each
/// service with [`OutlierDetectionLayer::share_hosts`](crate::OutlierDetectionLayer::share_hosts)
/// (HSF's `ipDimension` on for that service): when one of them ejects an endpoint, every other
/// one ejects its endpoints on the same host, each within its own budget and never its last
/// endpoint, and re-admits them (on trial) once no layer holds the host out any more.
///
/// Cheap to clone; clones are the same registry.
///
#[cfg_attr(feature = "error-rate", doc = "```")]
#[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
/// use tower_outlier::hosts::{HostOf, HostRegistry};
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// let hosts = HostRegistry::new();
/// let policy = || ErrorRatePolicy::new(ErrorRateConfig::hsf().build().unwrap());
/// // Endpoints keyed by socket address: the host is the IP address.
/// let orders = OutlierDetectionLayer::new(policy()).share_hosts(hosts.clone(), HostOf::default());
/// let payments = OutlierDetectionLayer::new(policy()).share_hosts(hosts.clone(), HostOf::default());
/// assert!(!hosts.is_ejected("10.0.0.7"));
/// # let _ = (orders, payments);
/// ```
#[derive(Clone, Default)]
pub struct HostRegistry {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    // Read by every sharing adaptor on every poll that woke it: changes only, without the lock.
    version: AtomicU64,
    state: Lock<State>,
    // HSF's ipDimension: the state of a policy that judges by host, one per host, policy name and
    // slot, shared by every endpoint on the host in every sharing layer (held by them; here
    // weakly). Locked only when an endpoint joins or new rules come in.
    by_host: Lock<ByHostStates>,
}

/// A host, the rules a state is of (the policy as it prints) and the policy's slot.
type HostStateKey = (Box<str>, Box<str>, usize);

#[derive(Default)]
struct ByHostStates {
    states: HashMap<HostStateKey, Weak<dyn EndpointPolicy>>,
    // The map's size after its last pruning of states no endpoint holds any more.
    pruned_at: usize,
}

#[derive(Default)]
struct State {
    // Host → the layers (adaptors) holding it out, and how many of their endpoints do.
    ejected: HashMap<String, HashMap<u64, usize>>,
    subscribers: Vec<(u64, Weak<Notifier>)>,
    next_member: u64,
}

impl HostRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether some sharing layer holds `host` out.
    pub fn is_ejected(&self, host: &str) -> bool {
        self.inner.state.lock().ejected.contains_key(host)
    }

    /// The hosts some sharing layer holds out, sorted.
    pub fn ejected_hosts(&self) -> Vec<String> {
        let mut hosts: Vec<String> = self.inner.state.lock().ejected.keys().cloned().collect();
        hosts.sort();
        hosts
    }

    /// The state of the policy `rules` (as it prints, configuration included; in slot `index`)
    /// for `host`, shared by the endpoints on it in every layer sharing this registry under the
    /// same rules: the one they hold, or `make()`'s, kept from now.
    pub(crate) fn host_state(
        &self,
        host: &str,
        rules: &str,
        index: usize,
        make: impl FnOnce() -> Box<dyn EndpointPolicy>,
    ) -> Arc<dyn EndpointPolicy> {
        let mut by_host = self.inner.by_host.lock();
        let key = (Box::from(host), Box::from(rules), index);
        if let Some(state) = by_host.states.get(&key).and_then(Weak::upgrade) {
            return state;
        }
        let state: Arc<dyn EndpointPolicy> = Arc::from(make());
        by_host.states.insert(key, Arc::downgrade(&state));
        // Hosts come and go: forget those no endpoint holds, once the map has doubled.
        if by_host.states.len() >= 2 * by_host.pruned_at.max(16) {
            by_host.states.retain(|_, state| state.strong_count() > 0);
            by_host.pruned_at = by_host.states.len();
        }
        state
    }

    pub(crate) fn version(&self) -> u64 {
        self.inner.version.load(Ordering::Acquire)
    }

    /// Registers an adaptor, to be woken when another one ejects or re-admits a host.
    pub(crate) fn join(&self, notifier: &Arc<Notifier>) -> u64 {
        let mut state = self.inner.state.lock();
        let member = state.next_member;
        state.next_member += 1;
        state.subscribers.push((member, Arc::downgrade(notifier)));
        member
    }

    /// One more endpoint of `member` holds `host` out (or, `out` false, one fewer does). The host
    /// is out while any endpoint of any member holds it.
    pub(crate) fn set(&self, member: u64, host: &str, out: bool) {
        let mut state = self.inner.state.lock();
        let changed = if out {
            let count = state
                .ejected
                .entry(host.to_owned())
                .or_default()
                .entry(member)
                .or_default();
            *count += 1;
            *count == 1
        } else {
            let Some(members) = state.ejected.get_mut(host) else {
                return;
            };
            let Some(count) = members.get_mut(&member) else {
                return;
            };
            *count -= 1;
            let released = *count == 0;
            if released {
                members.remove(&member);
            }
            if members.is_empty() {
                state.ejected.remove(host);
            }
            released
        };
        if changed {
            self.changed(&mut state, member);
        }
    }

    /// Whether a member other than `member` holds `host` out.
    pub(crate) fn ejected_elsewhere(&self, member: u64, host: &str) -> bool {
        self.inner
            .state
            .lock()
            .ejected
            .get(host)
            .is_some_and(|members| members.keys().any(|m| *m != member))
    }

    /// `member` is gone: it holds nothing out any more.
    pub(crate) fn leave(&self, member: u64) {
        let mut state = self.inner.state.lock();
        let before = state.ejected.len();
        let mut released = false;
        state.ejected.retain(|_, members| {
            released |= members.remove(&member).is_some();
            !members.is_empty()
        });
        state.subscribers.retain(|(m, _)| *m != member);
        if released || state.ejected.len() != before {
            self.changed(&mut state, member);
        }
    }

    fn changed(&self, state: &mut State, by: u64) {
        self.inner.version.fetch_add(1, Ordering::AcqRel);
        state
            .subscribers
            .retain(|(member, notifier)| match notifier.upgrade() {
                Some(notifier) => {
                    if *member != by {
                        notifier.notify();
                    }
                    true
                }
                None => false,
            });
    }
}

impl fmt::Debug for HostRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRegistry")
            .field("ejected", &self.ejected_hosts())
            .finish()
    }
}

/// How a layer finds the host of an endpoint from its discover key.
///
/// [`HostOf::default`] knows the usual keys: a `SocketAddr` (the host is its IP address), an
/// `http::Uri` (its host), a `String` or `&'static str` (the key is the host). Any other key has
/// no host and never takes part; give a function for it with [`HostOf::new`].
///
/// ```
/// use tower_outlier::hosts::HostOf;
///
/// // Keys like "10.0.0.7:8080/orders".
/// let host_of = HostOf::new(|key: &String| key.split(':').next().map(str::to_owned));
/// assert_eq!(host_of.host(&"10.0.0.7:8080/orders".to_string()).as_deref(), Some("10.0.0.7"));
/// let addr: std::net::SocketAddr = "10.0.0.7:9090".parse().unwrap();
/// assert_eq!(tower_outlier::hosts::HostOf::default().host(&addr).as_deref(), Some("10.0.0.7"));
/// ```
#[derive(Clone)]
pub struct HostOf(Arc<KeyToHost>);

// Keys arrive type-erased: a layer is not generic over its discover key type.
type KeyToHost = dyn Fn(&dyn Any) -> Option<String> + Send + Sync;

impl HostOf {
    /// The host of keys of type `K` is what `f` says (`None`: no host). Keys of other types have
    /// none.
    pub fn new<K: 'static>(f: impl Fn(&K) -> Option<String> + Send + Sync + 'static) -> Self {
        HostOf(Arc::new(move |key: &dyn Any| {
            key.downcast_ref::<K>().and_then(&f)
        }))
    }

    /// The host of `key`.
    pub fn host<K: 'static>(&self, key: &K) -> Option<String> {
        (self.0)(key)
    }
}

impl Default for HostOf {
    fn default() -> Self {
        HostOf(Arc::new(|key: &dyn Any| {
            if let Some(addr) = key.downcast_ref::<SocketAddr>() {
                Some(addr.ip().to_string())
            } else if let Some(uri) = key.downcast_ref::<http::Uri>() {
                uri.host().map(str::to_owned)
            } else if let Some(host) = key.downcast_ref::<String>() {
                Some(host.clone())
            } else {
                key.downcast_ref::<&'static str>().map(|h| (*h).to_owned())
            }
        }))
    }
}

impl fmt::Debug for HostOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HostOf")
    }
}

/// An endpoint's state of a policy that judges by host: the host's, shared with every endpoint
/// on it in every layer sharing hosts (HSF's `ipDimension`).
#[derive(Debug)]
pub(crate) struct ByHost(pub(crate) Arc<dyn EndpointPolicy>);

impl EndpointPolicy for ByHost {
    #[inline]
    fn record(
        &self,
        observation: &tower_outlier_core::Observation,
        now: tower_outlier_core::Nanos,
    ) -> tower_outlier_core::Signal {
        self.0.record(observation, now)
    }

    fn judge(&self, now: tower_outlier_core::Nanos) -> tower_outlier_core::Judgement {
        self.0.judge(now)
    }

    fn describe(&self, now: tower_outlier_core::Nanos) -> tower_outlier_core::Description {
        self.0.describe(now)
    }

    /// Not cleared: the window is the host's, fed by every service on it, and a re-admission in
    /// one of them (a trial, an operator's release, dry run's) is no reason to forget what the
    /// others saw. Its calls age out of the window instead (HSF's window is 10 s, its isolation
    /// 60 s).
    fn reset(&self) {}

    fn calls_needed(&self) -> Option<&dyn tower_outlier_core::CallsNeeded> {
        self.0.calls_needed()
    }

    fn own_timing(&self) -> Option<&dyn tower_outlier_core::OwnTiming> {
        self.0.own_timing()
    }

    fn shared_window(&self) -> Option<Arc<tower_outlier_core::SharedWindow>> {
        self.0.shared_window()
    }

    fn gate(&self) -> Option<&dyn tower_outlier_core::ProbeGate> {
        self.0.gate()
    }

    fn hears(&self) -> bool {
        self.0.hears()
    }

    fn hear(&self, signal: &tower_outlier_core::ServerSignal<'_>, now: tower_outlier_core::Nanos) {
        self.0.hear(signal, now)
    }

    fn members(
        &self,
        now: tower_outlier_core::Nanos,
    ) -> Vec<(&'static str, tower_outlier_core::Description)> {
        self.0.members(now)
    }
}
