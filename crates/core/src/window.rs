//! A lock-free, time-bucketed sliding window of call counts.
//!
//! The window is a ring of buckets; each bucket covers `span / buckets` of time and remembers which
//! slice of time (its epoch) its counts belong to. Recording finds the bucket for `now`; if the
//! bucket still holds an older epoch, the first recorder to claim it (one compare-and-swap) clears
//! the old counts. Reading sums the buckets whose epochs fall inside the last `span`.
//!
//! Recording takes no lock and allocates nothing: on the common path it is one atomic load and one
//! or two `fetch_add`s. The price of having no lock is a documented imprecision at bucket
//! boundaries: a recorder that read its timestamp just before a boundary and records just after
//! another thread recycled the bucket may have its call counted in the new slice. That shifts one
//! call by one bucket; it never loses one and never counts one twice. Sentinel's `LeapArray` has the
//! same property.
//!
//! With one bucket the window is a fixed interval that restarts every `span`, which is exactly
//! Sentinel's `statIntervalMs` behaviour.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{duration_to_nanos, Nanos};
use crate::error::ConfigError;

/// Counts of calls in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct WindowCounts {
    /// Calls that finished (cancelled calls are not recorded).
    pub calls: u64,
    /// Calls that finished as failures.
    pub failures: u64,
    /// Calls slower than the policy's slow-call threshold.
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

struct Bucket {
    // The time slice (`now / bucket_nanos + 1`) these counts belong to; 0 means empty.
    epoch: AtomicU64,
    calls: AtomicU64,
    failures: AtomicU64,
    slow: AtomicU64,
}

impl Bucket {
    fn empty() -> Self {
        Bucket {
            epoch: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            slow: AtomicU64::new(0),
        }
    }
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

    /// A new, empty window of this shape.
    pub fn window(&self) -> Window {
        Window {
            buckets: (0..self.buckets).map(|_| Bucket::empty()).collect(),
            bucket_nanos: self.bucket_nanos,
        }
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
    buckets: Box<[Bucket]>,
    bucket_nanos: u64,
}

impl Window {
    /// Most buckets a window may have.
    pub const MAX_BUCKETS: usize = 1024;

    /// A window covering `span`, split into `buckets` equal slices.
    ///
    /// `span` must be at least one millisecond and `buckets` in `1..=1024`, and each bucket must
    /// cover at least one microsecond.
    pub fn new(span: Duration, buckets: usize) -> Result<Self, ConfigError> {
        Ok(WindowShape::new(span, buckets)?.window())
    }

    /// The time the window covers.
    pub fn span(&self) -> Duration {
        Duration::from_nanos(self.bucket_nanos * self.buckets.len() as u64)
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    #[inline]
    fn epoch_of(&self, now: Nanos) -> u64 {
        now / self.bucket_nanos + 1
    }

    /// Records one finished call at time `now`. Lock-free and allocation-free.
    #[inline]
    pub fn record(&self, now: Nanos, failed: bool, slow: bool) {
        let epoch = self.epoch_of(now);
        let bucket = &self.buckets[(epoch % self.buckets.len() as u64) as usize];
        loop {
            let current = bucket.epoch.load(Ordering::Acquire);
            if current == epoch {
                break;
            }
            if current > epoch {
                // The slot already moved on a whole ring ahead of this timestamp, so the call is
                // older than the window: it no longer belongs to any counted slice.
                return;
            }
            // Take the stale counts before claiming the slot, and subtract exactly those after:
            // calls recorded by others between the claim and the subtraction survive.
            let calls = bucket.calls.load(Ordering::Relaxed);
            let failures = bucket.failures.load(Ordering::Relaxed);
            let slow_calls = bucket.slow.load(Ordering::Relaxed);
            if bucket
                .epoch
                .compare_exchange(current, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                bucket.calls.fetch_sub(calls, Ordering::Relaxed);
                bucket.failures.fetch_sub(failures, Ordering::Relaxed);
                bucket.slow.fetch_sub(slow_calls, Ordering::Relaxed);
                break;
            }
        }
        bucket.calls.fetch_add(1, Ordering::Relaxed);
        if failed {
            bucket.failures.fetch_add(1, Ordering::Relaxed);
        }
        if slow {
            bucket.slow.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts of the last `span` as seen at `now`.
    pub fn counts(&self, now: Nanos) -> WindowCounts {
        let newest = self.epoch_of(now);
        let oldest = newest.saturating_sub(self.buckets.len() as u64 - 1).max(1);
        let mut counts = WindowCounts::default();
        for bucket in self.buckets.iter() {
            let epoch = bucket.epoch.load(Ordering::Acquire);
            if epoch >= oldest && epoch <= newest {
                counts.calls += bucket.calls.load(Ordering::Relaxed);
                counts.failures += bucket.failures.load(Ordering::Relaxed);
                counts.slow += bucket.slow.load(Ordering::Relaxed);
            }
        }
        // A reader racing a recycle can see the new epoch before the old counts are subtracted;
        // keep the reported counts self-consistent.
        counts.failures = counts.failures.min(counts.calls);
        counts.slow = counts.slow.min(counts.calls);
        counts
    }

    /// Takes over what `previous` holds at `now`, when a configuration change replaces one window
    /// by another (cold path): bucket by bucket when both have the same shape, otherwise all of
    /// `previous`'s counts in the current bucket (they age out of the new window as one slice).
    pub fn absorb(&self, previous: &Window, now: Nanos) {
        if previous.bucket_nanos == self.bucket_nanos
            && previous.buckets.len() == self.buckets.len()
        {
            for (mine, theirs) in self.buckets.iter().zip(previous.buckets.iter()) {
                mine.epoch
                    .store(theirs.epoch.load(Ordering::Acquire), Ordering::Release);
                for (to, from) in [
                    (&mine.calls, &theirs.calls),
                    (&mine.failures, &theirs.failures),
                    (&mine.slow, &theirs.slow),
                ] {
                    to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
            return;
        }
        let counts = previous.counts(now);
        let epoch = self.epoch_of(now);
        let bucket = &self.buckets[(epoch % self.buckets.len() as u64) as usize];
        self.clear();
        bucket.epoch.store(epoch, Ordering::Release);
        bucket.calls.store(counts.calls, Ordering::Relaxed);
        bucket.failures.store(counts.failures, Ordering::Relaxed);
        bucket.slow.store(counts.slow, Ordering::Relaxed);
    }

    /// Forgets every recorded call.
    ///
    /// Used when an endpoint returns from ejection and must be judged only on what happens after.
    pub fn clear(&self) {
        for bucket in self.buckets.iter() {
            bucket.epoch.store(0, Ordering::Release);
            bucket.calls.store(0, Ordering::Relaxed);
            bucket.failures.store(0, Ordering::Relaxed);
            bucket.slow.store(0, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("span", &self.span())
            .field("buckets", &self.buckets.len())
            .finish()
    }
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
}
