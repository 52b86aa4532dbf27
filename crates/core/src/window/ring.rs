//! One ring of buckets and its claim protocol: the window of one core (or of all, until they
//! contend).

use crate::sync::{AtomicU32, AtomicU64, Ordering};

// A bucket's calls in the low 32 bits of one word and its failures in the high 32, so a call is
// one atomic update.
pub(super) const FAILURE: u64 = 1 << 32;
pub(super) const CALLS: u64 = u32::MAX as u64;
// A bucket stops counting this far below its 32-bit limit, so recorders racing past the check can
// never carry calls into failures.
pub(super) const SATURATED: u64 = CALLS - (1 << 16);

// `Ring::newest` packs the epoch above the bucket index (`MAX_BUCKETS` = 2^10).
pub(super) const INDEX_BITS: u32 = 10;
pub(super) const INDEX: u64 = (1 << INDEX_BITS) - 1;
// Set in `Ring::newest` while the claim of its slice has not yet taken the old counts out of the
// slice's bucket (epochs never reach this bit: it would take 2^53 slices).
pub(super) const CLAIMING: u64 = 1 << 63;
// Set with `CLAIMING` while a claim jumps a ring a window or more behind (or empty) straight to
// its slice, emptying the other buckets and taking its own bucket's old counts out: until it is
// done, readers take the whole ring as empty, since its buckets still hold counts from before the
// jump that its new newest slice would date as recent.
pub(super) const JUMPING: u64 = 1 << 62;
pub(super) const FLAGS: u64 = CLAIMING | JUMPING;

pub(super) struct Bucket {
    // Calls (low half) and failures (high half).
    pub(super) counts: AtomicU64,
}

impl Bucket {
    pub(super) fn empty() -> Self {
        Bucket {
            counts: AtomicU64::new(0),
        }
    }

    pub(super) fn counts(&self) -> (u64, u64) {
        let counts = self.counts.load(Ordering::Relaxed);
        (counts & CALLS, counts >> 32)
    }
}

/// One ring of buckets: the whole window for one core (or for all, until they contend).
pub(super) struct Ring {
    pub(super) buckets: Box<[Bucket]>,
    // Slow calls per bucket, for windows that count them.
    pub(super) slow: Option<Box<Slots<AtomicU32>>>,
    // The newest slice claimed: its epoch (`now / bucket_nanos + 1`) above its bucket's index
    // (0 before the first call and after a clear). Every other bucket holds the latest slice at
    // or before it that falls on its index, or nothing.
    pub(super) newest: AtomicU64,
}

impl Ring {
    pub(super) fn new(buckets: usize, counts_slow: bool) -> Self {
        Ring::with_padding(buckets, counts_slow, 0)
    }

    /// A ring for one more core, its arrays followed by a cache line of padding: the rings of a
    /// window are allocated one after another, and without it the last buckets of one could share
    /// a line with the first of the next, which another core writes. The padding is never used
    /// (indices stay below the window's bucket count).
    #[cfg_attr(loom, allow(dead_code))]
    pub(super) fn for_another_core(buckets: usize, counts_slow: bool) -> Self {
        Ring::with_padding(buckets, counts_slow, 64)
    }

    pub(super) fn with_padding(buckets: usize, counts_slow: bool, padding_bytes: usize) -> Self {
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

    pub(super) fn slow(&self, index: usize) -> u64 {
        self.slow_count(index)
            .map_or(0, |slow| u64::from(slow.load(Ordering::Relaxed)))
    }

    pub(super) fn slow_count(&self, index: usize) -> Option<&AtomicU32> {
        self.slow.as_ref()?.get(index)
    }

    /// The counts bucket `index` holds now, to be subtracted once it is claimed for a new slice:
    /// calls recorded there meanwhile (by others that already see it claimed) then survive.
    pub(super) fn stale(&self, index: usize) -> (u64, u32) {
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
    pub(super) fn advance(&self, seen: u64, next: u64, index: usize, stale: (u64, u32)) -> bool {
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

    /// Makes slice `epoch` (in bucket `index`) the newest if `seen` still is, emptying the ring
    /// of what it held first: it was empty or a window or more behind, so everything it holds is
    /// stale. False when another claim or a clear came first.
    ///
    /// While it runs, recorders that see it count their calls in bucket `index` and no other
    /// (`Window::claim`), so the other buckets can be emptied outright, and `index` keeps their
    /// calls: what it held is read before the jump is claimed and taken out after, as a step
    /// does.
    pub(super) fn jump(&self, seen: u64, epoch: u64, index: usize) -> bool {
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
    pub(super) fn take(&self, index: usize, stale: (u64, u32)) {
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
    pub(super) fn published(&self) -> (u64, Option<usize>) {
        let newest = self.newest.load(Ordering::Acquire);
        if newest & JUMPING != 0 {
            return (0, None);
        }
        let claiming = (newest & CLAIMING != 0).then_some((newest & INDEX) as usize);
        (newest & !FLAGS, claiming)
    }

    pub(super) fn clear(&self) {
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
pub(super) struct Slots<T>(pub(super) Box<[T]>);

impl<T> std::ops::Deref for Slots<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.0
    }
}

/// The slice bucket `index` of `buckets` holds when a ring's newest slice is `newest`: the latest
/// at or before it that falls on that index. `None` when the ring is empty or no slice since the
/// first falls on the index yet.
pub(super) fn slice_held(newest: u64, index: usize, buckets: usize) -> Option<u64> {
    let (epoch, newest_index) = (newest >> INDEX_BITS, (newest & INDEX) as usize);
    let age = (newest_index + buckets - index) % buckets;
    (newest != 0 && (age as u64) < epoch).then(|| epoch - age as u64)
}
