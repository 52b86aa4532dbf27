//! Which ring a thread records in once cores contend on a window.

use std::cell::Cell;

use super::ring::Ring;

#[cfg(not(loom))]
use crate::sync::OnceLock;

/// How many rings a contended window splits into: one per core, a power of two, 2 to 16.
#[cfg(not(loom))]
pub(super) fn stripes() -> usize {
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
pub(super) fn thread_stripe() -> u32 {
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
pub(super) fn rehash_thread_stripe() {
    STRIPE.with(|stripe| {
        let mut x = stripe.get().max(1);
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        stripe.set(x.max(1));
    });
}

/// The rings of a window past its first, made once cores contend on it: the second in place, any
/// more behind a pointer. On two cores (one ring more) a call reaches its ring through one
/// pointer where a list of rings took two (about a nanosecond of every call on a split window).
pub(super) struct Split {
    second: Ring,
    rest: Box<[Ring]>,
}

impl Split {
    /// `more` rings (at least one), each made by `make`.
    #[cfg_attr(loom, allow(dead_code))]
    pub(super) fn new(more: usize, make: impl Fn() -> Ring) -> Self {
        Split {
            second: make(),
            rest: (1..more).map(|_| make()).collect(),
        }
    }

    /// The rings it holds.
    #[inline]
    pub(super) fn len(&self) -> usize {
        1 + self.rest.len()
    }

    /// Ring `index` of [`len`](Self::len) (past the end: the second; callers mask the index).
    #[inline]
    pub(super) fn ring(&self, index: usize) -> &Ring {
        match index {
            0 => &self.second,
            at => self.rest.get(at - 1).unwrap_or(&self.second),
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Ring> {
        std::iter::once(&self.second).chain(self.rest.iter())
    }
}
