//! Calls in flight across the handles of one endpoint, without a counter every call writes.
//!
//! A balancer's handle on an endpoint makes a [`Lane`] the first time it calls, and each call's
//! response future holds a reference to it until the call completes or is dropped, so a lane's
//! calls in flight are its reference count less the handles holding it: one atomic add as a call
//! starts and one subtract as it ends, on a word only this handle's calls write. An endpoint's
//! [`Lanes`] lists its lanes (weakly) to sum them, and counts the ones alive so that a handle whose
//! lane is the only one reads its own count without the list.
//!
//! What a racing reader can see: a lane's count is exact between a handle's clones and drops,
//! and may be off by one while a handle holding the lane is cloned or dropped; the sum over lanes
//! counts each call in flight at most once and never a call that has completed before the read
//! began; [`Lanes::live`] may lag a lane made or dropped concurrently, by that lane. Dropping a
//! lane's last reference takes no lock, so it may happen under the list's lock (a reader's
//! upgrade can hold the last reference). `crates/core/tests/loom_lanes.rs` checks these under
//! every interleaving loom finds.
//!
//! ```
//! use std::sync::Arc;
//! use tower_outlier_core::lanes::{HasLanes, Lane, Lanes};
//!
//! struct Endpoint {
//!     lanes: Lanes<Endpoint>,
//! }
//!
//! impl HasLanes for Endpoint {
//!     fn lanes(&self) -> &Lanes<Self> {
//!         &self.lanes
//!     }
//! }
//!
//! let endpoint = Arc::new(Endpoint { lanes: Lanes::new() });
//! let lane = Lane::new(endpoint.clone());
//! let call = lane.clone(); // a call's response future
//! assert_eq!(Lane::in_flight(&lane), 1);
//! assert_eq!(endpoint.lanes.in_flight(), 1);
//! drop(call);
//! assert_eq!(endpoint.lanes.in_flight(), 0);
//! assert_eq!(endpoint.lanes.live(), 1);
//! drop(lane);
//! assert_eq!(endpoint.lanes.live(), 0);
//! ```

use std::fmt;
use std::sync::Arc;

use crate::sync::{AtomicU64, AtomicUsize, LaneLock, Ordering};
pub use crate::sync::{LaneArc, LaneWeak, LastRef};
use crate::Nanos;

/// What owns an endpoint's lanes: the state its handles and response futures share.
pub trait HasLanes: Sized {
    /// The endpoint's lanes.
    fn lanes(&self) -> &Lanes<Self>;
}

/// Every lane made for the handles of one endpoint.
pub struct Lanes<O: HasLanes> {
    // Weak, so that a lane goes when its handles and calls do; dead ones are pruned when a lane is
    // made (cold path, and `Load` while more than one handle calls).
    list: LaneLock<List<LaneWeak<Lane<O>>>>,
    // Lanes alive, kept by the lanes themselves without the lock.
    live: AtomicUsize,
}

impl<O: HasLanes> Lanes<O> {
    /// No lanes yet.
    pub fn new() -> Self {
        Lanes {
            list: LaneLock::new(List::default()),
            live: AtomicUsize::new(0),
        }
    }

    /// Calls in flight through every lane.
    pub fn in_flight(&self) -> usize {
        // Upgrading may take the last reference to a lane, which then goes here, under the lock:
        // a lane's last-reference step must not take it.
        self.list.with(|list| {
            list.iter()
                .filter_map(LaneWeak::upgrade)
                // Minus the reference just taken.
                .map(|lane| Lane::in_flight(&lane).saturating_sub(1))
                .sum()
        })
    }

    /// Calls in flight through every lane, and the earliest time a lane with calls in flight
    /// became busy (`Nanos::MAX` with none in flight): how long the oldest may have waited. Cold
    /// path (a lock), for fleet evaluations.
    pub fn pending(&self) -> (usize, Nanos) {
        self.list.with(|list| {
            list.iter()
                .filter_map(LaneWeak::upgrade)
                .map(|lane| {
                    let calls = Lane::in_flight(&lane).saturating_sub(1);
                    let since = if calls > 0 {
                        lane.busy_since()
                    } else {
                        Nanos::MAX
                    };
                    (calls, since)
                })
                .fold((0, Nanos::MAX), |(calls, since), (more, at)| {
                    (calls + more, since.min(at))
                })
        })
    }

    /// Lanes alive.
    #[inline]
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

impl<O: HasLanes> Default for Lanes<O> {
    fn default() -> Self {
        Lanes::new()
    }
}

impl<O: HasLanes> fmt::Debug for Lanes<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lanes")
            .field("live", &self.live())
            .finish_non_exhaustive()
    }
}

/// The lanes of one endpoint: the first in place, any more behind a pointer. Most endpoints only
/// ever get one lane (the balancer's handle), and a list on the heap cost each 8 bytes there and
/// 16 in the record for its capacity and length.
struct List<T> {
    first: Option<T>,
    // Boxed: one word in every endpoint where a `Vec` is three.
    #[allow(clippy::box_collection)]
    more: Option<Box<Vec<T>>>,
}

impl<T> Default for List<T> {
    fn default() -> Self {
        List {
            first: None,
            more: None,
        }
    }
}

impl<T> List<T> {
    fn iter(&self) -> impl Iterator<Item = &T> {
        self.first
            .iter()
            .chain(self.more.iter().flat_map(|more| more.iter()))
    }

    fn push(&mut self, lane: T) {
        match &mut self.first {
            first @ None => *first = Some(lane),
            Some(_) => self.more.get_or_insert_with(Default::default).push(lane),
        }
    }

    /// Keeps the lanes `keep` accepts, in order.
    fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        if self.first.as_ref().is_some_and(|first| !keep(first)) {
            self.first = None;
        }
        if let Some(more) = &mut self.more {
            more.retain(&mut keep);
            if self.first.is_none() && !more.is_empty() {
                self.first = Some(more.remove(0));
            }
            if more.is_empty() {
                self.more = None;
            }
        }
    }
}

/// The calls one handle has in flight: each response future holds a reference.
pub struct Lane<O: HasLanes> {
    owner: Arc<O>,
    // Handles holding this lane: the one that made it, and its clones until they make their own.
    holders: AtomicUsize,
    // When this lane last went from no call in flight to one (the owner's clock), or
    // `Nanos::MAX`: how long its calls have been waiting.
    busy_since: AtomicU64,
}

impl<O: HasLanes> Lane<O> {
    /// A lane for `owner`'s endpoint, held by one handle. The one allocation and the one lock of
    /// a handle's calls, once per handle.
    pub fn new(owner: Arc<O>) -> LaneArc<Self> {
        let lane = LaneArc::new(Lane {
            owner,
            holders: AtomicUsize::new(1),
            busy_since: AtomicU64::new(Nanos::MAX),
        });
        let lanes = lane.owner.lanes();
        lanes.list.with(|list| {
            list.retain(|lane| lane.strong_count() > 0);
            list.push(LaneArc::downgrade(&lane));
        });
        lanes.live.fetch_add(1, Ordering::Relaxed);
        lane
    }

    /// The state the lane's endpoint shares.
    #[inline]
    pub fn owner(&self) -> &Arc<O> {
        &self.owner
    }

    /// References to `lane` other than its handles': its response futures, plus any the caller
    /// holds. (An associated function: loom's model of `Arc` cannot be a method receiver.)
    #[inline]
    pub fn in_flight(lane: &LaneArc<Self>) -> usize {
        LaneArc::strong_count(lane).saturating_sub(lane.holders.load(Ordering::Relaxed))
    }

    /// One more handle holds the lane (a clone of the handle that made it).
    #[inline]
    pub fn hold(&self) {
        self.holders.fetch_add(1, Ordering::Relaxed);
    }

    /// A handle holding the lane lets go of it (dropped, or moved to a lane of its own).
    #[inline]
    pub fn release(&self) {
        self.holders.fetch_sub(1, Ordering::Relaxed);
    }

    /// When the lane last went from no call in flight to one, or `Nanos::MAX` if never.
    #[inline]
    pub fn busy_since(&self) -> Nanos {
        self.busy_since.load(Ordering::Relaxed)
    }

    /// The lane's first call in flight started at `at`.
    #[inline]
    pub fn set_busy_since(&self, at: Nanos) {
        self.busy_since.store(at, Ordering::Relaxed);
    }
}

impl<O: HasLanes> LastRef for Lane<O> {
    fn last_ref_dropped(&self) {
        // No lock: see `Lanes::in_flight`. Its entry in the list is pruned later.
        self.owner.lanes().live.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(not(loom))]
impl<O: HasLanes> Drop for Lane<O> {
    fn drop(&mut self) {
        self.last_ref_dropped();
    }
}

impl<O: HasLanes> fmt::Debug for Lane<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lane")
            .field("holders", &self.holders.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::List;

    fn listed(list: &List<u32>) -> Vec<u32> {
        list.iter().copied().collect()
    }

    #[test]
    fn the_list_keeps_its_lanes_in_order_and_the_first_in_place() {
        let mut list = List::default();
        assert!(listed(&list).is_empty());
        list.push(1);
        assert_eq!(listed(&list), [1]);
        assert!(list.more.is_none(), "one lane needs nothing on the heap");
        list.push(2);
        list.push(3);
        assert_eq!(listed(&list), [1, 2, 3]);
        // The first gone: the next takes its place.
        list.retain(|&lane| lane != 1);
        assert_eq!(listed(&list), [2, 3]);
        assert_eq!(list.first, Some(2));
        list.retain(|&lane| lane != 3);
        assert_eq!(listed(&list), [2]);
        assert!(list.more.is_none(), "an empty overflow is let go");
        list.retain(|_| false);
        assert!(listed(&list).is_empty());
        list.push(4);
        assert_eq!(listed(&list), [4]);
    }
}
