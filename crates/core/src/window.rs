//! A lock-free, time-bucketed sliding window of call counts.
//!
//! The window is a ring of buckets; each bucket covers `span / buckets` of time. The ring remembers
//! its newest slice of time (its epoch); a bucket holds the counts of the latest slice at or before
//! the newest that falls on its position, so buckets carry no epoch of their own (eight bytes
//! each). Reading sums the buckets whose slices fall inside the last `span`.
//!
//! Recording takes no lock and allocates nothing. Its common path is two loads, a subtraction and
//! a comparison (is `now` still in the newest slice?) and one atomic add on the bucket's packed
//! counts; no division. Only the first recorder in a new slice divides, to find the bucket, and
//! claims the slices up to its own one at a time (a compare-and-swap on the newest slice each),
//! clearing the old counts of each bucket it moves onto.
//!
//! **Cores sharing a window.** An add that did not start from the count the recorder had just
//! read means another core wrote the bucket meanwhile. The first time that happens the window grows one ring per core (up to 16) and each
//! thread records in its own from then on, so cores that share an endpoint stop fighting over one
//! cache line; reading sums the rings. A window only one core records into never grows; a split
//! one keeps its rings until it is replaced (ten buckets: 80 bytes per ring and a cache line of
//! padding, so about 2.5 KB on a 16-core machine).
//!
//! **Imprecision.** The price of having no lock is documented imprecision at bucket boundaries: a
//! recorder that read its timestamp just before a boundary and records just after another thread
//! recycled the bucket may have its call counted in the new slice. That shifts the call by one
//! slice (by more only if the recorder was descheduled for a whole window), and never counts one
//! twice. Sentinel's `LeapArray` has the same property. A call recorded while another recorder is
//! still claiming an older slice is counted in the slice being claimed (early, by as many slices
//! as the claimer is behind); one recorded while another jumps the ring (below) is counted in the
//! slice it jumps to (late or early by the slices between). Two races can lose calls instead, never invent them: a claim that takes a
//! slice's old counts out after a [`Window::clear`] (or after another claim a whole window later)
//! emptied the bucket takes them out of whatever the bucket holds by then, down to zero at most;
//! and calls recorded while a clear runs may be forgotten with the rest. A bucket counts at most
//! about 4.29 billion calls per ring (2^32 − 2^16); calls past that in one slice are not counted.
//!
//! **What a reader racing recorders sees.** A claim publishes its slice only once the bucket's old
//! counts are out (until then readers skip that bucket), and a jump empties the ring before its
//! new slice is published (until then readers take the ring as empty), so a read never shows a
//! slice with an older slice's counts in it. It shows each call at most once, in its own slice or one of those
//! shifts, or not yet; a bucket being claimed at that instant reads as empty; and a call's failure
//! is never shown without the call (failures and slow calls are clamped to calls). These are
//! checked under every interleaving of a recycle, two claims, two recorders jumping a ring (with
//! and without a reader) and a clear racing recorders and a reader, by the loom models in `tests/loom_window.rs` (at most
//! two or three preemptions).
//!
//! **Quiet endpoints.** The first call after a pause shorter than the window claims the slices
//! passed one at a time, one compare-and-swap each; after a longer one it jumps to its slice with
//! two compare-and-swaps and a swap per bucket: about 80 ns for ten buckets, microseconds for
//! hundreds. Recorders that see a jump under way count their calls in its slice, the one bucket
//! it does not empty outright, so none is lost to the jump; a jump descheduled for a window or
//! more leaves them in a slice that has aged out by the time it is published, as a claim does.
//! A clear between a jump's first read and its compare-and-swap, followed by recorders that bring
//! the ring back to the very slice the jump read (possible in practice only with one bucket), lets
//! the calls those recorders made after the clear show one slice late.
//!
//! With one bucket the window is a fixed interval that restarts every `span`, which is exactly
//! Sentinel's `statIntervalMs` behaviour.

use std::fmt;
use std::time::Duration;

use crate::clock::Nanos;
use crate::error::ConfigError;
use crate::sync::{OnceBox, Ordering};

/// Counts of calls in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct WindowCounts {
    /// Calls that finished (cancelled calls are not recorded).
    pub calls: u64,
    /// Calls that finished as failures.
    pub failures: u64,
    /// Calls slower than the policy's slow-call threshold (0 for windows that do not count them).
    pub slow: u64,
}

impl WindowCounts {
    /// `failures / calls`, or 0 with no calls.
    pub fn failure_rate(&self) -> f64 {
        ratio(self.failures, self.calls)
    }

    /// `slow / calls`, or 0 with no calls.
    pub fn slow_rate(&self) -> f64 {
        ratio(self.slow, self.calls)
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// A sliding window of call counts over the last `span` of time, in `buckets` slices.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::Window;
///
/// let window = Window::new(Duration::from_secs(10), 10).unwrap();
/// let second = 1_000_000_000;
/// window.record(0, true, false);
/// window.record(5 * second, false, false);
/// assert_eq!(window.counts(5 * second).calls, 2);
/// // Eleven seconds later the first call has slid out of the window.
/// assert_eq!(window.counts(11 * second).calls, 1);
/// ```
pub struct Window {
    first: Ring,
    // One ring per core past the first, made the first time cores contend on this window.
    // One pointer, not std's `OnceLock<Box<_>>` (two words): 8 bytes in every window.
    more: OnceBox<Split>,
    bucket_nanos: u64,
}

impl Window {
    /// Most buckets a window may have.
    pub const MAX_BUCKETS: usize = 1024;

    /// A window covering `span`, split into `buckets` equal slices, counting calls, failures and
    /// slow calls.
    ///
    /// `span` must be at least one millisecond and `buckets` in `1..=1024`, and each bucket must
    /// cover at least one microsecond.
    pub fn new(span: Duration, buckets: usize) -> Result<Self, ConfigError> {
        Ok(WindowShape::new(span, buckets)?.window_counting_slow())
    }

    fn with_shape(shape: WindowShape, counts_slow: bool) -> Self {
        Window {
            first: Ring::new(shape.buckets, counts_slow),
            more: OnceBox::new(),
            bucket_nanos: shape.bucket_nanos,
        }
    }

    /// The time the window covers.
    pub fn span(&self) -> Duration {
        Duration::from_nanos(self.bucket_nanos * self.first.buckets.len() as u64)
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.first.buckets.len()
    }

    #[cfg_attr(loom, allow(dead_code))]
    fn counts_slow(&self) -> bool {
        self.first.slow.is_some()
    }

    #[inline]
    fn epoch_of(&self, now: Nanos) -> u64 {
        now / self.bucket_nanos + 1
    }

    fn rings(&self) -> impl Iterator<Item = &Ring> {
        std::iter::once(&self.first).chain(self.more.get().into_iter().flat_map(|more| more.iter()))
    }

    /// Records one finished call at time `now`. Lock-free and allocation-free (but for the one
    /// time cores first contend on this window: see the module documentation).
    #[inline]
    pub fn record(&self, now: Nanos, failed: bool, slow: bool) {
        let ring = match self.more.get() {
            None => &self.first,
            Some(more) => match thread_stripe() as usize & more.len() {
                0 => &self.first,
                stripe => more.ring(stripe - 1),
            },
        };
        if self.record_in(ring, now, failed, slow) {
            self.contended();
        }
    }

    /// Records in `ring`; true when another core wrote the same bucket meanwhile.
    #[inline]
    fn record_in(&self, ring: &Ring, now: Nanos, failed: bool, slow: bool) -> bool {
        let newest = ring.newest.load(Ordering::Acquire);
        let slice_start = (newest >> INDEX_BITS)
            .wrapping_sub(1)
            .wrapping_mul(self.bucket_nanos);
        // `newest` in 1..CLAIMING: a slice claimed and published (one comparison, as `!= 0` was).
        let published = newest.wrapping_sub(1) < CLAIMING - 1;
        let index = if published && now.wrapping_sub(slice_start) < self.bucket_nanos {
            (newest & INDEX) as usize
        } else {
            match self.claim(ring, now) {
                Some(index) => index,
                None => return false,
            }
        };
        let bucket = &ring.buckets[index];
        let add = if failed { 1 + FAILURE } else { 1 };
        let before = bucket.counts.load(Ordering::Relaxed);
        if before & CALLS >= SATURATED {
            return false;
        }
        // Another core wrote the bucket between the load and the add when the add did not start
        // from what the load saw (an add does not wait on the load, as a compare-and-swap would).
        let added_to = bucket.counts.fetch_add(add, Ordering::Relaxed);
        let contended = added_to != before;
        if contended && added_to & CALLS >= SATURATED {
            bucket.counts.fetch_sub(add, Ordering::Relaxed);
            return true;
        }
        if slow {
            if let Some(count) = ring.slow_count(index) {
                if count.fetch_add(1, Ordering::Relaxed) as u64 >= SATURATED {
                    count.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        contended
    }

    /// The bucket of `now`'s slice in `ring`, claiming the slices up to it first if it is newer
    /// than the newest; `None` when the call is older than the window.
    #[cold]
    fn claim(&self, ring: &Ring, now: Nanos) -> Option<usize> {
        let epoch = self.epoch_of(now);
        let buckets = self.buckets() as u64;
        let index_of = |epoch: u64| (epoch % buckets) as usize;
        loop {
            let newest = ring.newest.load(Ordering::Acquire);
            let newest_epoch = (newest & !FLAGS) >> INDEX_BITS;
            if newest & JUMPING != 0 {
                // Another recorder is jumping the ring to `newest_epoch`, emptying every other
                // bucket: the call is counted in that slice (late or early by the slices between)
                // unless it is older than the window.
                return (newest_epoch.saturating_sub(epoch) < buckets)
                    .then(|| index_of(newest_epoch));
            }
            if newest & CLAIMING != 0 {
                // Another recorder is moving the ring onto `newest_epoch`. A call of that slice
                // or an older one goes to its bucket as usual; a newer one is counted in the slice
                // being claimed, a slice or so early, rather than wait for the claim to finish.
                return (newest_epoch.saturating_sub(epoch) < buckets)
                    .then(|| index_of(epoch.min(newest_epoch)));
            }
            if newest != 0 && epoch <= newest_epoch {
                // Its slice is claimed already: its bucket still holds it unless the ring has
                // moved a whole window past it.
                return (newest_epoch - epoch < buckets).then(|| index_of(epoch));
            }
            // When the ring is empty or a window or more behind, every bucket is stale: one
            // jump to `now`'s slice empties them all, unseen by readers until done. Otherwise one
            // slice at a time, so each bucket moved onto is cleared exactly once.
            if newest == 0 || epoch - newest_epoch >= buckets {
                if ring.jump(newest, epoch, index_of(epoch)) {
                    return Some(index_of(epoch));
                }
                continue;
            }
            let next = newest_epoch + 1;
            let index = index_of(next);
            let stale = ring.stale(index);
            if ring.advance(newest, next, index, stale) && next == epoch {
                return Some(index);
            }
        }
    }

    /// Cores contend on this window: give each its own ring, or move this thread to another.
    #[cold]
    #[cfg(loom)]
    fn contended(&self) {}

    /// Cores contend on this window: give each its own ring, or move this thread to another.
    #[cold]
    #[cfg(not(loom))]
    fn contended(&self) {
        if self.more.get().is_some() {
            rehash_thread_stripe();
            return;
        }
        let counts_slow = self.counts_slow();
        self.more.get_or_init(|| {
            Box::new(Split::new(stripes() - 1, || {
                Ring::for_another_core(self.buckets(), counts_slow)
            }))
        });
    }

    /// The counts of the last `span` as seen at `now`.
    pub fn counts(&self, now: Nanos) -> WindowCounts {
        let newest = self.epoch_of(now);
        let oldest = newest
            .saturating_sub(self.first.buckets.len() as u64 - 1)
            .max(1);
        let buckets = self.buckets();
        let mut counts = WindowCounts::default();
        for ring in self.rings() {
            let (ring_newest, claiming) = ring.published();
            // The extra rings' padding past `buckets` is never used.
            for (index, bucket) in ring.buckets[..buckets].iter().enumerate() {
                if claiming == Some(index) {
                    continue;
                }
                let Some(epoch) = slice_held(ring_newest, index, buckets) else {
                    continue;
                };
                if epoch >= oldest && epoch <= newest {
                    let (calls, failures) = bucket.counts();
                    counts.calls += calls;
                    counts.failures += failures;
                    counts.slow += ring.slow(index);
                }
            }
        }
        // Failures and slow calls are added apart from calls (a separate counter for slow ones):
        // a reader between the two adds of a call could see one without the other.
        counts.failures = counts.failures.min(counts.calls);
        counts.slow = counts.slow.min(counts.calls);
        counts
    }

    /// Forgets every recorded call.
    ///
    /// Used when an endpoint returns from ejection and must be judged only on what happens after.
    pub fn clear(&self) {
        for ring in self.rings() {
            ring.clear();
        }
    }
}

impl fmt::Debug for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("span", &self.span())
            .field("buckets", &self.buckets())
            .field("rings", &self.rings().count())
            .finish()
    }
}

mod absorb;
mod cores;
mod ring;
mod shape;
mod shared;

use cores::*;
use ring::*;
pub use shape::WindowShape;
pub use shared::SharedWindow;

#[cfg(test)]
mod tests;

#[cfg(all(test, not(loom)))]
mod jump_tests;
