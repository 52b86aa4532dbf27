//! What every handle of one endpoint, and every call through it, share: the endpoint's record
//! and the lanes its handles count their calls in flight on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tower_outlier_core::lanes::{HasLanes, Lanes};
use tower_outlier_core::{EndpointRecord, Nanos};

/// What the endpoint, its clones and its response futures share. The classifier is not here:
/// each handle holds one, and each call's response future a copy, as tower-http makes a
/// classifier per request (most are zero-sized, and a copy costs nothing).
pub(crate) struct Shared {
    pub(crate) record: EndpointRecord,
    // The calls sent on purpose to it while it fails (evidence for its policies), rationed.
    pub(crate) evidence: Evidence,
    // Every lane made for a handle of this endpoint, to sum the calls in flight.
    lanes: Lanes<Shared>,
}

impl Shared {
    pub(crate) fn new(record: EndpointRecord) -> Arc<Self> {
        Arc::new(Shared {
            record,
            evidence: Evidence::default(),
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

/// Lets the monitor read records without knowing the endpoint's type.
pub(crate) trait HasRecord: Send + Sync {
    fn record(&self) -> &EndpointRecord;
    fn in_flight(&self) -> usize;
}

impl HasRecord for Shared {
    fn record(&self) -> &EndpointRecord {
        &self.record
    }

    fn in_flight(&self) -> usize {
        Shared::in_flight(self)
    }
}

/// How long after one evidence episode began (the calls a policy wants for a judgement, sent on
/// purpose) the next may begin: 10 s after the first, twice as long after each one more, up to
/// [`MAX_EVIDENCE_EPISODE_GAP`] (anew once the endpoint is ejected and back). One
/// episode completes a hard-down endpoint's streak; a gray one whose streaks keep breaking would
/// otherwise be sent calls after each pair of failures, more than p2c alone sends it, and deliver
/// more failures to callers than no detection.
pub(crate) const EVIDENCE_EPISODE_GAP: Nanos = 10_000_000_000;

/// The longest gap between two evidence episodes of one endpoint.
pub(crate) const MAX_EVIDENCE_EPISODE_GAP: Nanos = 320_000_000_000;

/// The episodes of calls sent on purpose to an endpoint failing fast (the rest of a streak, a
/// window's minimum, the follow-up of a fast failure): the one under way, since when, and the
/// earliest the next may begin. The endpoint's, not a handle's: an upstream that inserts the key
/// again (a new service, so a new handle) does not start the doubling anew (it did, and a gray
/// replica re-inserted every few seconds delivered twice the failures); a re-admission does.
#[derive(Debug)]
pub(crate) struct Evidence {
    since: AtomicU64,
    next_at: AtomicU64,
    gap: AtomicU64,
}

impl Default for Evidence {
    fn default() -> Self {
        Evidence {
            since: AtomicU64::new(Nanos::MAX),
            next_at: AtomicU64::new(0),
            gap: AtomicU64::new(EVIDENCE_EPISODE_GAP),
        }
    }
}

impl Evidence {
    /// `wanted` within the evidence episodes: one under way goes on; a new one begins only
    /// [`EVIDENCE_EPISODE_GAP`] after the first began, twice that after the second, and so on.
    pub(crate) fn episode(&self, wanted: u64, now: Nanos) -> u64 {
        if wanted == 0 {
            self.end();
            return 0;
        }
        if self.under_way() {
            return wanted;
        }
        if now < self.next_at.load(Ordering::Relaxed) {
            return 0;
        }
        self.since.store(now, Ordering::Relaxed);
        let gap = self.gap.load(Ordering::Relaxed);
        self.next_at
            .store(now.saturating_add(gap), Ordering::Relaxed);
        self.gap.store(
            gap.saturating_mul(2).min(MAX_EVIDENCE_EPISODE_GAP),
            Ordering::Relaxed,
        );
        wanted
    }

    /// Whether an episode is under way.
    #[inline]
    pub(crate) fn under_way(&self) -> bool {
        self.since.load(Ordering::Relaxed) != Nanos::MAX
    }

    /// Ends the episode under way, if any.
    #[inline]
    pub(crate) fn end(&self) {
        if self.under_way() {
            self.since.store(Nanos::MAX, Ordering::Relaxed);
        }
    }

    /// Starts over: the endpoint is back from an ejection.
    pub(crate) fn reset(&self) {
        self.since.store(Nanos::MAX, Ordering::Relaxed);
        self.next_at.store(0, Ordering::Relaxed);
        self.gap.store(EVIDENCE_EPISODE_GAP, Ordering::Relaxed);
    }
}
