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
//! slice it jumps to. Two races can lose calls instead, never invent them: a claim that takes a
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
//! checked under every interleaving of a recycle, two claims, two recorders jumping a ring and a
//! clear racing recorders and a reader, by the loom models in `tests/loom_window.rs` (at most
//! three preemptions).
//!
//! **Quiet endpoints.** The first call after a pause shorter than the window claims the slices
//! passed one at a time, one compare-and-swap each; after a longer one it jumps to its slice with
//! two compare-and-swaps and a swap per bucket: about 80 ns for ten buckets, microseconds for
//! hundreds. Recorders that see a jump under way count their calls in its slice, the one bucket
//! it does not empty outright, so none is lost however long the jump is descheduled.
//!
//! With one bucket the window is a fixed interval that restarts every `span`, which is exactly
//! Sentinel's `statIntervalMs` behaviour.

use std::cell::Cell;
use std::fmt;
use std::time::Duration;

use crate::clock::{duration_to_nanos, Nanos};
use crate::error::ConfigError;
use crate::sync::{AtomicU32, AtomicU64, OnceLock, Ordering};

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

// A bucket's calls in the low 32 bits of one word and its failures in the high 32, so a call is
// one atomic update.
const FAILURE: u64 = 1 << 32;
const CALLS: u64 = u32::MAX as u64;
// A bucket stops counting this far below its 32-bit limit, so recorders racing past the check can
// never carry calls into failures.
const SATURATED: u64 = CALLS - (1 << 16);

// `Ring::newest` packs the epoch above the bucket index (`MAX_BUCKETS` = 2^10).
const INDEX_BITS: u32 = 10;
const INDEX: u64 = (1 << INDEX_BITS) - 1;
// Set in `Ring::newest` while the claim of its slice has not yet taken the old counts out of the
// slice's bucket (epochs never reach this bit: it would take 2^53 slices).
const CLAIMING: u64 = 1 << 63;
// Set with `CLAIMING` while a claim jumps a ring a window or more behind (or empty) straight to
// its slice, emptying every bucket: until it is done, readers take the whole ring as empty, since
// its buckets still hold counts from before the jump that its new newest slice would date as
// recent.
const JUMPING: u64 = 1 << 62;
const FLAGS: u64 = CLAIMING | JUMPING;

struct Bucket {
    // Calls (low half) and failures (high half).
    counts: AtomicU64,
}

impl Bucket {
    fn empty() -> Self {
        Bucket {
            counts: AtomicU64::new(0),
        }
    }

    fn counts(&self) -> (u64, u64) {
        let counts = self.counts.load(Ordering::Relaxed);
        (counts & CALLS, counts >> 32)
    }
}

/// One ring of buckets: the whole window for one core (or for all, until they contend).
struct Ring {
    buckets: Box<[Bucket]>,
    // Slow calls per bucket, for windows that count them.
    slow: Option<Box<Slots<AtomicU32>>>,
    // The newest slice claimed: its epoch (`now / bucket_nanos + 1`) above its bucket's index
    // (0 before the first call and after a clear). Every other bucket holds the latest slice at
    // or before it that falls on its index, or nothing.
    newest: AtomicU64,
}

impl Ring {
    fn new(buckets: usize, counts_slow: bool) -> Self {
        Ring::with_padding(buckets, counts_slow, 0)
    }

    /// A ring for one more core, its arrays followed by a cache line of padding: the rings of a
    /// window are allocated one after another, and without it the last buckets of one could share
    /// a line with the first of the next, which another core writes. The padding is never used
    /// (indices stay below the window's bucket count).
    #[cfg_attr(loom, allow(dead_code))]
    fn for_another_core(buckets: usize, counts_slow: bool) -> Self {
        Ring::with_padding(buckets, counts_slow, 64)
    }

    fn with_padding(buckets: usize, counts_slow: bool, padding_bytes: usize) -> Self {
        let bucket_padding = padding_bytes / std::mem::size_of::<Bucket>();
        let slow_padding = padding_bytes / std::mem::size_of::<AtomicU32>();
        Ring {
            buckets: (0..buckets + bucket_padding)
                .map(|_| Bucket::empty())
                .collect(),
            slow: counts_slow.then(|| {
                Box::new(Slots(
                    (0..buckets + slow_padding)
                        .map(|_| AtomicU32::new(0))
                        .collect(),
                ))
            }),
            newest: AtomicU64::new(0),
        }
    }

    fn slow(&self, index: usize) -> u64 {
        self.slow_count(index)
            .map_or(0, |slow| u64::from(slow.load(Ordering::Relaxed)))
    }

    fn slow_count(&self, index: usize) -> Option<&AtomicU32> {
        self.slow.as_ref()?.get(index)
    }

    /// The counts bucket `index` holds now, to be subtracted once it is claimed for a new slice:
    /// calls recorded there meanwhile (by others that already see it claimed) then survive.
    fn stale(&self, index: usize) -> (u64, u32) {
        (
            self.buckets[index].counts.load(Ordering::Relaxed),
            self.slow(index) as u32,
        )
    }

    /// Makes slice `next` (in bucket `index`) the newest if `seen` still is; then takes `stale`,
    /// read before, out of its bucket. False when another claim or a clear came first.
    ///
    /// In two steps, so that no reader sees the new slice in a bucket still holding the old
    /// one's counts: the slice is first claimed with `CLAIMING` set (readers skip its bucket,
    /// recorders of it add to the bucket as usual and their calls survive the take), and
    /// published once the old counts are out. A clear meanwhile wins: the ring stays empty.
    fn advance(&self, seen: u64, next: u64, index: usize, stale: (u64, u32)) -> bool {
        let slice = next << INDEX_BITS | index as u64;
        if self
            .newest
            .compare_exchange(seen, slice | CLAIMING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.take(index, stale);
        let _ = self.newest.compare_exchange(
            slice | CLAIMING,
            slice,
            Ordering::Release,
            Ordering::Relaxed,
        );
        true
    }

    /// Makes slice `epoch` (in bucket `index`) the newest if `seen` still is, emptying every
    /// bucket first: the ring was empty or a window or more behind, so everything it holds is
    /// stale. False when another claim or a clear came first.
    ///
    /// While it runs, recorders that see it count their calls in bucket `index` and no other
    /// (`Window::claim`), so the other buckets can be emptied outright, and `index` keeps their
    /// calls: what it held is read before the jump is claimed and taken out after, as a step
    /// does.
    fn jump(&self, seen: u64, epoch: u64, index: usize) -> bool {
        let slice = epoch << INDEX_BITS | index as u64;
        let stale = self.stale(index);
        if self
            .newest
            .compare_exchange(seen, slice | FLAGS, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        for (other, bucket) in self.buckets.iter().enumerate() {
            if other == index {
                continue;
            }
            // A swap, not a store: it is ordered after every add already made to the bucket.
            bucket.counts.swap(0, Ordering::Relaxed);
            if let Some(slow) = self.slow_count(other) {
                slow.swap(0, Ordering::Relaxed);
            }
        }
        self.take(index, stale);
        let _ = self.newest.compare_exchange(
            slice | FLAGS,
            slice,
            Ordering::Release,
            Ordering::Relaxed,
        );
        true
    }

    /// Takes `stale`, read before a claim, out of bucket `index`, never below zero: a clear (or
    /// a claim a window later) may have emptied the bucket since `stale` was read.
    fn take(&self, index: usize, stale: (u64, u32)) {
        let _ = self.buckets[index].counts.fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |counts| {
                let calls = (counts & CALLS).saturating_sub(stale.0 & CALLS);
                let failures = (counts >> 32).saturating_sub(stale.0 >> 32).min(calls);
                Some(calls | failures << 32)
            },
        );
        if let Some(slow) = self.slow_count(index) {
            let _ = slow.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |count| {
                Some(count.saturating_sub(stale.1))
            });
        }
    }

    /// The newest slice as readers take it, and the bucket to skip while a claim of that slice
    /// is still taking the old counts out of it.
    fn published(&self) -> (u64, Option<usize>) {
        let newest = self.newest.load(Ordering::Acquire);
        if newest & JUMPING != 0 {
            return (0, None);
        }
        let claiming = (newest & CLAIMING != 0).then_some((newest & INDEX) as usize);
        (newest & !FLAGS, claiming)
    }

    fn clear(&self) {
        for (index, bucket) in self.buckets.iter().enumerate() {
            bucket.counts.store(0, Ordering::Relaxed);
            if let Some(slow) = self.slow_count(index) {
                slow.store(0, Ordering::Relaxed);
            }
        }
        // Last, and released: a claim that sees the ring empty reads the zeroed counts as the
        // stale ones, so what it takes out is exact. A claim that read its stale counts before
        // the clear takes them out of whatever the bucket holds when it gets there, never below
        // zero (`take`): it may forget calls recorded around the clear, never show garbage.
        self.newest.store(0, Ordering::Release);
    }
}

/// A slice behind a pointer of one word rather than two: for arrays most windows never have (the
/// extra rings, slow counts), so that not having them costs little.
struct Slots<T>(Box<[T]>);

impl<T> std::ops::Deref for Slots<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.0
    }
}

/// The slice bucket `index` of `buckets` holds when a ring's newest slice is `newest`: the latest
/// at or before it that falls on that index. `None` when the ring is empty or no slice since the
/// first falls on the index yet.
fn slice_held(newest: u64, index: usize, buckets: usize) -> Option<u64> {
    let (epoch, newest_index) = (newest >> INDEX_BITS, (newest & INDEX) as usize);
    let age = (newest_index + buckets - index) % buckets;
    (newest != 0 && (age as u64) < epoch).then(|| epoch - age as u64)
}

/// A validated window shape: a span and a bucket count. Policies validate the shape once, when
/// they are configured, and build one window per endpoint from it without further checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowShape {
    bucket_nanos: u64,
    buckets: usize,
}

impl WindowShape {
    /// Checks that `span` is at least one millisecond, `buckets` in `1..=1024`, and each bucket at
    /// least one microsecond long.
    pub fn new(span: Duration, buckets: usize) -> Result<Self, ConfigError> {
        if span < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "window",
                format_args!("{span:?}"),
                "at least 1ms",
            ));
        }
        if !(1..=Window::MAX_BUCKETS).contains(&buckets) {
            return Err(ConfigError::new("buckets", buckets, "1 to 1024"));
        }
        let bucket_nanos = duration_to_nanos(span) / buckets as u64;
        if bucket_nanos < 1_000 {
            return Err(ConfigError::new(
                "buckets",
                buckets,
                "few enough that each bucket covers at least 1µs",
            ));
        }
        Ok(WindowShape {
            bucket_nanos,
            buckets,
        })
    }

    /// The time a window of this shape covers.
    pub fn span(&self) -> Duration {
        Duration::from_nanos(self.bucket_nanos * self.buckets as u64)
    }

    /// How many buckets a window of this shape slides by.
    pub fn buckets(&self) -> usize {
        self.buckets
    }

    /// A new, empty window of this shape counting calls and failures (its
    /// [`WindowCounts::slow`] stays 0: `record`'s `slow` is ignored).
    pub fn window(&self) -> Window {
        Window::with_shape(*self, false)
    }

    /// A new, empty window of this shape that also counts slow calls (four bytes more per
    /// bucket).
    pub fn window_counting_slow(&self) -> Window {
        Window::with_shape(*self, true)
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
    more: OnceLock<Box<Slots<Ring>>>,
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
            more: OnceLock::new(),
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
                stripe => &more[stripe - 1],
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
            Box::new(Slots(
                (1..stripes())
                    .map(|_| Ring::for_another_core(self.buckets(), counts_slow))
                    .collect(),
            ))
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

    /// Takes over what `previous` holds at `now`, when a configuration change replaces one window
    /// by another (cold path): slice by slice when both have the same shape, otherwise all of
    /// `previous`'s counts in the current bucket (they age out of the new window as one slice).
    pub fn absorb(&self, previous: &Window, now: Nanos) {
        self.clear();
        let buckets = self.buckets();
        if previous.bucket_nanos == self.bucket_nanos && previous.buckets() == buckets {
            // Each ring's newest slice read once, so that every slot is read against the same
            // one even if `previous` is still recorded into (cold path: the one allocation).
            let newest: Vec<(u64, Option<usize>)> = previous.rings().map(Ring::published).collect();
            for index in 0..buckets {
                // Each ring's slot may hold another slice: keep the newest, summed over rings.
                // (The ring with the newest slice holds the newest of every slot, so the slots
                // agree with the newest slice `set` leaves.)
                let epoch = previous
                    .rings()
                    .zip(&newest)
                    .filter(|(_, &(_, claiming))| claiming != Some(index))
                    .filter_map(|(_, &(newest, _))| slice_held(newest, index, buckets))
                    .max()
                    .unwrap_or(0);
                let (mut calls, mut failures, mut slow) = (0, 0, 0);
                for (ring, &(newest, claiming)) in previous.rings().zip(&newest) {
                    if epoch != 0
                        && claiming != Some(index)
                        && slice_held(newest, index, buckets) == Some(epoch)
                    {
                        let (c, f) = ring.buckets[index].counts();
                        calls += c;
                        failures += f;
                        slow += ring.slow(index);
                    }
                }
                self.set(index, epoch, calls, failures, slow);
            }
            return;
        }
        let counts = previous.counts(now);
        let epoch = self.epoch_of(now);
        let index = (epoch % self.buckets() as u64) as usize;
        self.set(index, epoch, counts.calls, counts.failures, counts.slow);
    }

    /// Sets a bucket of the first ring, which `clear` emptied, to slice `epoch` (which falls on
    /// `index`; 0 for none) (cold path, counts clamped to what a bucket holds). The newest slice
    /// set decides which slice every bucket holds.
    fn set(&self, index: usize, epoch: u64, calls: u64, failures: u64, slow: u64) {
        let calls = calls.min(SATURATED);
        let (failures, slow) = (failures.min(calls), slow.min(calls));
        let bucket = &self.first.buckets[index];
        bucket
            .counts
            .store(calls | failures << 32, Ordering::Relaxed);
        if let Some(count) = self.first.slow_count(index) {
            count.store(slow as u32, Ordering::Relaxed);
        }
        if epoch != 0 {
            self.first
                .newest
                .fetch_max(epoch << INDEX_BITS | index as u64, Ordering::AcqRel);
        }
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

/// A window that a policy's endpoint state shares with the endpoint's record, and a flag saying
/// whether the record may count successes in it without asking the state.
///
/// A state hands one to its record ([`EndpointPolicy::shared_window`]) so that the common call,
/// a success while nothing is wrong, costs no call into the state. Who counts what:
///
/// * the record counts a successful call in [`window`](Self::window) itself, and then does not
///   call the state's [`record`](crate::EndpointPolicy::record), when [`watching`](Self::watching)
///   reads false and the call holds no probe permit;
/// * every other call (a failure, a success while watching, a call holding a probe permit) goes
///   to the state's `record` (or its gate's `record_probe`) as usual, and the state counts it.
///
/// So each call is counted once, either here or by the state. A state that needs to see
/// successes (to check the window when one may complete its minimum) sets
/// [`set_watching`](Self::set_watching) until it no longer does. The record does this for one
/// policy at most: the first of its first 256 that has a shared window; the others' calls all
/// go to their `record`.
///
/// [`EndpointPolicy::shared_window`]: crate::EndpointPolicy::shared_window
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::{SharedWindow, Window};
///
/// let shared = SharedWindow::new(Window::new(Duration::from_secs(10), 10).unwrap());
/// assert!(!shared.watching());
/// shared.window().record(0, true, false);
/// shared.set_watching(true);
/// assert!(shared.watching());
/// assert_eq!(shared.window().counts(0).failures, 1);
/// ```
pub struct SharedWindow {
    window: Window,
    watching: std::sync::atomic::AtomicBool,
}

impl SharedWindow {
    /// Shares `window`, not watching.
    pub fn new(window: Window) -> Self {
        SharedWindow {
            window,
            watching: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The window.
    #[inline]
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// Whether successes go to the state's `record` (true) or are counted by the record (false).
    #[inline]
    pub fn watching(&self) -> bool {
        self.watching.load(Ordering::Relaxed)
    }

    /// Sends successes to the state's `record` (true) or lets the record count them (false).
    /// Stores only when it changes (see [`store_if_changed`](crate::store_if_changed)).
    #[inline]
    pub fn set_watching(&self, watching: bool) {
        crate::record::store_if_changed(&self.watching, watching);
    }

    /// The record's path: counts a success at `now` unless watching; false when it did not.
    #[inline]
    pub(crate) fn count_success(&self, now: Nanos) -> bool {
        if self.watching() {
            return false;
        }
        self.window.record(now, false, false);
        true
    }
}

impl fmt::Debug for SharedWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedWindow")
            .field("window", &self.window)
            .field("watching", &self.watching())
            .finish()
    }
}

/// How many rings a contended window splits into: one per core, a power of two, 2 to 16.
#[cfg(not(loom))]
fn stripes() -> usize {
    static STRIPES: OnceLock<usize> = OnceLock::new();
    *STRIPES.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(2, |cores| cores.get())
            .clamp(2, 16)
            .next_power_of_two()
    })
}

thread_local! {
    // This thread's ring in contended windows (0: not assigned yet).
    static STRIPE: Cell<u32> = const { Cell::new(0) };
}

/// This thread's stripe: threads are numbered in the order they first record, so the first
/// `stripes()` threads to share a window get rings of their own.
#[inline]
fn thread_stripe() -> u32 {
    STRIPE.with(|stripe| match stripe.get() {
        0 => {
            // A numbering, not part of the window's protocol: std's even under loom.
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
            let assigned = NEXT
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .max(1);
            stripe.set(assigned);
            assigned
        }
        assigned => assigned,
    })
}

/// Moves this thread to another ring after it met another core on its own (xorshift).
#[cfg(not(loom))]
fn rehash_thread_stripe() {
    STRIPE.with(|stripe| {
        let mut x = stripe.get().max(1);
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        stripe.set(x.max(1));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn counts_slide_bucket_by_bucket() {
        let w = Window::new(Duration::from_secs(10), 10).unwrap();
        for s in 0..10 {
            w.record(s * 1000 * MS, s % 2 == 0, false);
        }
        assert_eq!(w.counts(9_999 * MS).calls, 10);
        assert_eq!(w.counts(9_999 * MS).failures, 5);
        // At t = 10 s the slice [0, 1 s) has left the window.
        let c = w.counts(10_000 * MS);
        assert_eq!((c.calls, c.failures), (9, 4));
        assert_eq!(w.counts(30_000 * MS), WindowCounts::default());
    }

    #[test]
    fn a_recycled_bucket_starts_from_zero() {
        let w = Window::new(Duration::from_secs(1), 2).unwrap();
        w.record(0, true, true);
        w.record(1, true, true);
        // Same slot, one ring later.
        w.record(1000 * MS, false, false);
        let c = w.counts(1000 * MS);
        assert_eq!((c.calls, c.failures, c.slow), (1, 0, 0));
    }

    #[test]
    fn one_bucket_is_a_fixed_interval() {
        let w = Window::new(Duration::from_secs(1), 1).unwrap();
        w.record(100 * MS, true, false);
        w.record(999 * MS, true, false);
        assert_eq!(w.counts(999 * MS).calls, 2);
        assert_eq!(w.counts(1000 * MS).calls, 0);
    }

    #[test]
    fn stale_timestamps_are_not_counted() {
        let w = Window::new(Duration::from_secs(1), 2).unwrap();
        w.record(5000 * MS, false, false);
        w.record(1000 * MS, true, false);
        assert_eq!(w.counts(5000 * MS).failures, 0);
    }

    #[test]
    fn clear_forgets_everything() {
        let w = Window::new(Duration::from_secs(1), 4).unwrap();
        w.record(10 * MS, true, true);
        w.clear();
        assert_eq!(w.counts(10 * MS), WindowCounts::default());
    }

    #[test]
    fn bad_shapes_are_rejected() {
        assert_eq!(
            Window::new(Duration::ZERO, 1).unwrap_err().field(),
            "window"
        );
        assert_eq!(
            Window::new(Duration::from_secs(1), 0).unwrap_err().field(),
            "buckets"
        );
        assert!(Window::new(Duration::from_millis(1), 1024).is_err());
    }

    #[test]
    fn concurrent_recording_loses_nothing_within_a_bucket() {
        let w = std::sync::Arc::new(Window::new(Duration::from_secs(60), 1).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        w.record(MS * (i % 1000), (i + t) % 4 == 0, false);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let c = w.counts(1000 * MS);
        assert_eq!(c.calls, 40_000);
        assert_eq!(c.failures, 10_000);
    }

    #[test]
    fn absorb_keeps_the_counts_across_shapes() {
        let second = 1_000_000_000;
        let old = Window::new(Duration::from_secs(10), 10).unwrap();
        for i in 0..6 {
            old.record(i * second, i % 2 == 0, false);
        }
        let same = Window::new(Duration::from_secs(10), 10).unwrap();
        same.absorb(&old, 6 * second);
        assert_eq!(same.counts(6 * second), old.counts(6 * second));
        assert_eq!(
            same.counts(12 * second),
            old.counts(12 * second),
            "the slices keep their age"
        );
        let longer = Window::new(Duration::from_secs(30), 3).unwrap();
        longer.absorb(&old, 6 * second);
        assert_eq!(longer.counts(6 * second).calls, 6);
        assert_eq!(longer.counts(6 * second).failures, 3);
        assert_eq!(
            longer.counts(40 * second).calls,
            0,
            "they age out as one slice"
        );
    }

    #[test]
    fn concurrent_recorders_lose_nothing_whether_or_not_the_window_splits() {
        let w = std::sync::Arc::new(Window::new(Duration::from_secs(60), 6).unwrap());
        assert_eq!(w.rings().count(), 1, "one ring until cores contend");
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..200_000u64 {
                        w.record(MS * (i % 30_000), (i + t) % 4 == 0, i % 2 == 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let c = w.counts(30_000 * MS);
        assert_eq!((c.calls, c.failures, c.slow), (800_000, 200_000, 400_000));
    }

    /// Cores that find the window a long pause behind together (one jumps it while the others
    /// record): every call of every burst is counted. When the jump
    /// emptied every bucket, the calls recorded meanwhile could go with them (about 4 % of
    /// them on two cores, more when the claimer was descheduled).
    #[test]
    fn concurrent_bursts_after_long_pauses_lose_nothing() {
        const THREADS: u64 = 4;
        const PER_BURST: u64 = 2_000;
        let second = 1_000_000_000;
        let w = std::sync::Arc::new(Window::new(Duration::from_secs(10), 10).unwrap());
        let bursts = 200;
        let start = std::sync::Arc::new(std::sync::Barrier::new(THREADS as usize + 1));
        let end = std::sync::Arc::new(std::sync::Barrier::new(THREADS as usize + 1));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (w, start, end) = (w.clone(), start.clone(), end.clone());
                std::thread::spawn(move || {
                    for burst in 0..bursts {
                        start.wait();
                        // A burst within one second, a hundred seconds (ten windows) after the
                        // last.
                        let at = burst * 100 * second;
                        for i in 0..PER_BURST {
                            w.record(at + i * 100_000, (i + t) % 4 == 0, false);
                        }
                        end.wait();
                    }
                })
            })
            .collect();
        for burst in 0..bursts {
            start.wait();
            end.wait();
            let c = w.counts(burst * 100 * second + second);
            assert_eq!(
                (c.calls, c.failures),
                (THREADS * PER_BURST, THREADS * PER_BURST / 4),
                "burst {burst}"
            );
        }
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn split_rings_read_slide_absorb_and_clear_as_one_window() {
        let w = Window::new(Duration::from_secs(6), 6).unwrap();
        w.record(500 * MS, true, false);
        w.contended();
        assert_eq!(
            w.rings().count(),
            stripes(),
            "one ring per core once contended"
        );
        let more = w.more.get().unwrap();
        // Another core's ring: the same slot holds a newer slice there (slot 0 at 6 s) while the
        // first ring still holds the one of 0 s, and slot 1 holds the same slice in both.
        w.record_in(&more[0], 6_200 * MS, false, true);
        w.record_in(&w.first, 1_500 * MS, false, false);
        w.record_in(&more[0], 1_700 * MS, true, false);
        let c = w.counts(6_200 * MS);
        assert_eq!((c.calls, c.failures, c.slow), (3, 1, 1), "0 s has slid out");
        let c = w.counts(5_900 * MS);
        assert_eq!(
            (c.calls, c.failures),
            (3, 2),
            "before 6 s the slice of 0 s counts"
        );
        // Absorbed, each slot keeps its newest slice, summed over the rings that hold it.
        let copy = Window::new(Duration::from_secs(6), 6).unwrap();
        copy.absorb(&w, 6_200 * MS);
        assert_eq!(copy.rings().count(), 1);
        for at in [6_200, 6_900, 7_600, 12_100] {
            assert_eq!(copy.counts(at * MS), w.counts(at * MS), "at {at} ms");
        }
        w.clear();
        assert_eq!(w.counts(6_200 * MS), WindowCounts::default());
        w.record(6_300 * MS, false, false);
        assert_eq!(
            w.counts(6_300 * MS).calls,
            1,
            "a cleared window records again"
        );
    }

    #[test]
    fn a_clear_before_a_claim_moves_on_makes_the_claim_start_over() {
        let w = Window::new(Duration::from_secs(1), 1).unwrap();
        for _ in 0..5 {
            w.record(10 * MS, true, false);
        }
        // A recorder at 1.2 s reads the newest slice and the stale counts, then `clear` runs
        // entirely before its compare-and-swap.
        let seen = w.first.newest.load(Ordering::Acquire);
        let stale = w.first.stale(0);
        w.clear();
        assert!(!w.first.advance(seen, 2, 0, stale), "the clear came first");
        for _ in 0..100 {
            w.record(1_200 * MS, false, false);
        }
        let c = w.counts(1_200 * MS);
        assert_eq!((c.calls, c.failures), (100, 0));
    }

    #[test]
    fn a_claim_after_a_long_silence_clears_every_bucket_once() {
        let w = Window::new(Duration::from_secs(10), 10).unwrap();
        for s in 0..10 {
            w.record(s * 1000 * MS + 1, true, true);
        }
        // Three seconds later: three slices are claimed, the seven others keep their counts.
        w.record(12_500 * MS, false, false);
        let c = w.counts(12_500 * MS);
        assert_eq!((c.calls, c.failures, c.slow), (8, 7, 7));
        // A window and more later: every bucket is stale.
        w.record(40_000 * MS, false, false);
        let c = w.counts(40_000 * MS);
        assert_eq!((c.calls, c.failures, c.slow), (1, 0, 0));
        assert_eq!(w.counts(49_999 * MS).calls, 1);
        assert_eq!(w.counts(50_000 * MS).calls, 0);
    }

    #[test]
    fn a_full_bucket_stops_counting_instead_of_overflowing() {
        let w = Window::new(Duration::from_secs(1), 1).unwrap();
        w.set(0, 1, SATURATED - 1, 7, 3);
        for _ in 0..3 {
            w.record(10 * MS, true, true);
        }
        let c = w.counts(10 * MS);
        assert_eq!((c.calls, c.failures, c.slow), (SATURATED, 8, 4));
    }

    #[test]
    fn only_slow_counting_windows_count_slow_calls() {
        let shape = WindowShape::new(Duration::from_secs(1), 2).unwrap();
        let plain = shape.window();
        let slow = shape.window_counting_slow();
        for w in [&plain, &slow] {
            w.record(MS, false, true);
        }
        assert_eq!(plain.counts(MS).slow, 0);
        assert_eq!(slow.counts(MS).slow, 1);
        assert_eq!(plain.counts(MS).calls, 1);
    }

    #[test]
    fn late_timestamps_find_their_own_slice() {
        let w = Window::new(Duration::from_secs(10), 10).unwrap();
        w.record(5_500 * MS, false, false);
        // A recorder that read its clock before the boundary records after a newer call.
        w.record(4_900 * MS, true, false);
        w.record(5_600 * MS, false, false);
        let c = w.counts(5_600 * MS);
        assert_eq!((c.calls, c.failures), (3, 1));
        assert_eq!(
            w.counts(14_950 * MS).calls,
            2,
            "the late call aged with its own slice"
        );
    }

    /// A claim that moved `newest` on before a `clear`, and is descheduled before it subtracts the
    /// stale counts it read, subtracts them after the next claim has already stepped over the
    /// bucket: without the floor at zero the bucket would wrap below zero in a slice readers
    /// count.
    #[test]
    fn a_claim_subtracting_after_a_clear_and_the_next_claim_leaves_no_garbage() {
        let w = Window::new(Duration::from_secs(1), 1).unwrap();
        for _ in 0..5 {
            w.record(10 * MS, true, false);
        }
        // Claimer A (at 1.2 s): reads newest and the stale counts, wins its compare-and-swap...
        let seen = w.first.newest.load(Ordering::Acquire);
        let stale = w.first.stale(0);
        assert!(w
            .first
            .newest
            .compare_exchange(seen, 2 << INDEX_BITS, Ordering::AcqRel, Ordering::Acquire)
            .is_ok());
        // ... and is descheduled before its `fetch_sub`. The endpoint returns from ejection:
        w.clear();
        // Another recorder claims the slice again (reading the zeroed counts as stale) and records.
        w.record(1_300 * MS, false, false);
        // A resumes and subtracts what it read before the clear.
        w.first.take(0, stale);
        let c = w.counts(1_300 * MS);
        assert!(c.calls <= 1, "garbage visible to readers: {c:?}");
    }

    /// Same without any clear: a claimer descheduled between its compare-and-swap and its
    /// subtraction for a window, while another recorder steps the ring over the same bucket.
    #[test]
    fn a_claim_subtracting_a_window_late_leaves_no_garbage() {
        let w = Window::new(Duration::from_secs(1), 2).unwrap();
        for _ in 0..5 {
            w.record(100 * MS, true, false); // slice 1, bucket 1
            w.record(600 * MS, true, false); // slice 2, bucket 0
        }
        // Claimer A at 1.1 s (slice 3, bucket 1) wins its compare-and-swap, then stalls.
        let seen = w.first.newest.load(Ordering::Acquire);
        let stale = w.first.stale(1);
        assert!(w
            .first
            .newest
            .compare_exchange(
                seen,
                3 << INDEX_BITS | 1,
                Ordering::AcqRel,
                Ordering::Acquire
            )
            .is_ok());
        // A window later another recorder steps over slices 4 and 5 (buckets 0 and 1).
        w.record(2_100 * MS, false, false);
        w.first.take(1, stale);
        let c = w.counts(2_100 * MS);
        assert!(c.calls <= 1, "garbage visible to readers: {c:?}");
    }

    /// Absorb while previous's ring moves on between the two passes.
    #[test]
    fn absorb_of_the_same_shape_reads_as_the_previous_window_later_on() {
        for buckets in [1usize, 2, 3, 7, 10] {
            let span = Duration::from_millis(100 * buckets as u64);
            let old = Window::new(span, buckets).unwrap();
            for t in [5u64, 130, 260, 390, 1_250, 1_260] {
                old.record(t * MS, t % 2 == 0, true);
            }
            let copy = Window::new(span, buckets).unwrap();
            copy.absorb(&old, 1_260 * MS);
            for at in (1_200..3_000).step_by(37) {
                assert_eq!(
                    copy.counts(at * MS),
                    old.counts(at * MS),
                    "{buckets} at {at}"
                );
            }
        }
    }

    /// Early times (epoch < buckets), a max-sized window, and a single-threaded equivalence with
    /// a naive model over random-ish timestamps including late ones.
    #[test]
    fn one_recorder_matches_a_model_of_slices() {
        for &(span_ms, buckets) in &[
            (1_000u64, 1usize),
            (1_000, 2),
            (1_000, 10),
            (1_024, 1024),
            (60, 7),
        ] {
            let w = Window::new(Duration::from_millis(span_ms), buckets).unwrap();
            let bn = span_ms * MS / buckets as u64;
            let mut seed = 12345u64 ^ buckets as u64;
            let mut t = 0u64;
            let mut calls: Vec<(u64, bool)> = Vec::new();
            let mut newest_epoch = 0u64;
            for i in 0..5_000u64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let step = match seed % 10 {
                    0 => span_ms * MS * 2,
                    1..=3 => bn,
                    _ => bn / 7 + 1,
                };
                t += step % (bn * 3 + 1);
                if seed.is_multiple_of(97) {
                    t += span_ms * MS * 3;
                }
                // A late timestamp now and then, within a slice.
                let at = if seed.is_multiple_of(5) {
                    t.saturating_sub(bn / 2)
                } else {
                    t
                };
                let failed = i % 3 == 0;
                // Model: a call is counted iff its slice is within a window of the newest slice
                // seen so far (else dropped), and counts are read as all kept calls whose slice
                // is within the reader's window.
                let e = at / bn + 1;
                let kept = newest_epoch == 0 || e + (buckets as u64) > newest_epoch;
                newest_epoch = newest_epoch.max(e);
                w.record(at, failed, false);
                if kept {
                    calls.push((e, failed));
                }
                let r = t / bn + 1;
                let oldest = r.saturating_sub(buckets as u64 - 1).max(1);
                let want_calls = calls
                    .iter()
                    .filter(|(e, _)| *e >= oldest && *e <= r)
                    .count() as u64;
                let want_fail = calls
                    .iter()
                    .filter(|(e, f)| *f && *e >= oldest && *e <= r)
                    .count() as u64;
                let c = w.counts(t);
                assert_eq!(
                    (c.calls, c.failures),
                    (want_calls, want_fail),
                    "{span_ms}/{buckets} i={i} t={t}"
                );
            }
        }
    }

    /// ABA on `newest`: a claimer reads newest = X and the stale counts of the next bucket, a
    /// clear runs, and a recorder whose timestamp is in slice X (read just before the boundary)
    /// claims the ring back up to exactly X. The first claimer's compare-and-swap then succeeds
    /// and subtracts counts the clear already zeroed.
    #[test]
    fn a_claim_whose_newest_slice_came_back_after_a_clear_leaves_no_garbage() {
        let w = Window::new(Duration::from_secs(1), 10).unwrap();
        for _ in 0..5 {
            w.record(250 * MS, true, false); // slice 3, bucket 3
        }
        w.record(1_150 * MS, false, false); // slice 12, bucket 2: newest = X
                                            // Claimer A at 1.25 s (slice 13, bucket 3): reads newest and bucket 3's stale counts...
        let seen = w.first.newest.load(Ordering::Acquire);
        assert_eq!(seen >> INDEX_BITS, 12);
        let stale = w.first.stale(3);
        // ... the endpoint is re-admitted (clear), and a recorder that read its clock at 1.199 s
        // records: its claim starts a window back and ends at slice 12, bucket 2 — X again.
        w.clear();
        w.record(1_199 * MS, false, false);
        assert_eq!(w.first.newest.load(Ordering::Acquire), seen, "ABA");
        // A's compare-and-swap succeeds and subtracts the pre-clear counts from a zeroed bucket.
        let _ = w.first.advance(seen, 13, 3, stale);
        w.record(1_250 * MS, false, false);
        let c = w.counts(1_250 * MS);
        assert!(c.calls <= 2, "garbage visible to readers: {c:?}");
    }
}

#[cfg(all(test, not(loom)))]
mod jump_tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_ring_a_window_behind_jumps_and_forgets_what_it_held() {
        let w = Window::new(Duration::from_millis(2), 2).unwrap();
        w.record(0, false, false);
        w.record(2 * MS, true, false);
        w.record(2 * MS + 1, false, false);
        let after = w.counts(2 * MS + 1);
        assert_eq!((after.calls, after.failures), (2, 1));
    }
}
