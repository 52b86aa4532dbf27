//! What every handle of one endpoint, and every call through it, share: the endpoint's record
//! and the lanes its handles count their calls in flight on.

use std::sync::Arc;

use tower_outlier_core::lanes::{HasLanes, Lanes};
use tower_outlier_core::{EndpointRecord, Nanos};

/// What the endpoint, its clones and its response futures share. The classifier is not here:
/// each handle holds one, and each call's response future a copy, as tower-http makes a
/// classifier per request (most are zero-sized, and a copy costs nothing).
pub(crate) struct Shared {
    pub(crate) record: EndpointRecord,
    // Every lane made for a handle of this endpoint, to sum the calls in flight.
    lanes: Lanes<Shared>,
}

impl Shared {
    pub(crate) fn new(record: EndpointRecord) -> Arc<Self> {
        Arc::new(Shared {
            record,
            lanes: Lanes::new(),
        })
    }

    /// Calls in flight through every handle.
    pub(crate) fn in_flight(&self) -> usize {
        self.lanes.in_flight()
    }

    /// How many lanes the endpoint's handles have made: with one, its calls in flight are that
    /// lane's.
    #[inline]
    pub(crate) fn live_lanes(&self) -> usize {
        self.lanes.live()
    }

    /// Calls in flight through every handle, and how long they have waited at `now` with no
    /// call completing: from the later of when the oldest lane became busy and the endpoint's
    /// last completion. Cold path (the lanes' lock).
    pub(crate) fn pending(&self, now: Nanos) -> (usize, Nanos) {
        let (calls, busy_since) = self.lanes.pending();
        if calls == 0 || busy_since == Nanos::MAX {
            return (calls, 0);
        }
        let since = busy_since.max(self.record.last_completed());
        (calls, now.saturating_sub(since))
    }
}

impl HasLanes for Shared {
    fn lanes(&self) -> &Lanes<Self> {
        &self.lanes
    }
}

/// The calls one handle has in flight (`tower_outlier_core::lanes`). A handle that calls more
/// than once gets a lane of its own, so cores calling through clones of one endpoint never write
/// the same word per call; copies that never call or are cloned (the layer's own) have none. Not
/// padded to a cache line, though two lanes may then share one: padding cost every called
/// endpoint 32 bytes, and p2c_throughput with `Buffer` on two workers (one thread makes every
/// endpoint's lane, responses complete on both) measured no slower without it.
pub(crate) type Lane = tower_outlier_core::lanes::Lane<Shared>;
