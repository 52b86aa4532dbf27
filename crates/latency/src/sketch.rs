//! A fixed-size latency sketch: counts in log-linear buckets, eight to an octave, from 64 µs to
//! an hour (209 counters, 836 bytes); recording is one relaxed add, and a quantile is read to
//! within a bucket's width (at most 12.5 %), interpolated within it.

use std::sync::atomic::{AtomicU32, Ordering};

use tower_outlier_core::Nanos;

/// The smallest latency told apart: 2^16 ns, about 66 µs (everything faster shares a bucket).
const LOWEST_OCTAVE: u32 = 16;
/// Octaves covered: up to 2^42 ns, about 73 minutes.
const OCTAVES: u32 = 26;
const PER_OCTAVE: u32 = 8;
pub(crate) const BUCKETS: usize = (OCTAVES * PER_OCTAVE) as usize + 1;

/// Counts of latencies by bucket, since the sketch was last taken.
#[derive(Debug)]
pub(crate) struct Sketch {
    counts: Box<[AtomicU32]>,
}

impl Sketch {
    pub(crate) fn new() -> Self {
        Sketch {
            counts: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Counts one call of `nanos`. No lock, no allocation.
    #[inline]
    pub(crate) fn record(&self, nanos: Nanos) {
        self.counts[bucket(nanos)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, and the sketch empty again.
    pub(crate) fn take(&self) -> Counts {
        Counts(
            self.counts
                .iter()
                .map(|count| count.swap(0, Ordering::AcqRel))
                .collect(),
        )
    }

    /// Calls counted so far.
    pub(crate) fn calls(&self) -> u64 {
        self.counts
            .iter()
            .map(|count| u64::from(count.load(Ordering::Relaxed)))
            .sum()
    }
}

/// A sketch's counts, taken.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Counts(Vec<u32>);

impl Counts {
    /// No calls.
    #[cfg(test)]
    pub(crate) fn empty() -> Self {
        Counts(vec![0; BUCKETS])
    }

    /// Counts `calls` more calls of `nanos` each.
    pub(crate) fn add(&mut self, nanos: Nanos, calls: u32) {
        let slot = &mut self.0[bucket(nanos)];
        *slot = slot.saturating_add(calls);
    }

    /// Calls counted.
    pub(crate) fn calls(&self) -> u64 {
        self.0.iter().map(|&count| u64::from(count)).sum()
    }

    /// The mean latency (ns), each call at its bucket's geometric middle (within 4.5 % of its
    /// own); `None` with no calls.
    pub(crate) fn mean(&self) -> Option<f64> {
        let calls = self.calls();
        if calls == 0 {
            return None;
        }
        let sum: f64 = self
            .0
            .iter()
            .enumerate()
            .filter(|(_, &count)| count > 0)
            .map(|(index, &count)| {
                let (low, high) = bounds(index);
                f64::from(count) * (low * high).sqrt()
            })
            .sum();
        Some(sum / calls as f64)
    }

    /// The latency (ns) below which `q` of the calls fell, interpolated within its bucket; `None`
    /// with no calls.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let calls = self.calls();
        if calls == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * calls as f64).max(1.0);
        let mut below = 0.0;
        for (index, &count) in self.0.iter().enumerate() {
            let count = f64::from(count);
            if count > 0.0 && below + count >= rank {
                let (low, high) = bounds(index);
                let within = (rank - below) / count;
                // Geometric within the bucket: its bounds are a ratio apart.
                return Some(low * (high / low).powf(within));
            }
            below += count;
        }
        let (low, _) = bounds(BUCKETS - 1);
        Some(low)
    }
}

/// The bucket of a latency of `nanos`.
#[inline]
fn bucket(nanos: Nanos) -> usize {
    let nanos = nanos.max(1);
    let octave = 63 - nanos.leading_zeros();
    if octave < LOWEST_OCTAVE {
        return 0;
    }
    let step = (nanos >> (octave - 3)) & 0b111;
    let index = (octave - LOWEST_OCTAVE) * PER_OCTAVE + step as u32;
    (index as usize).min(BUCKETS - 1)
}

/// The latencies (ns) bucket `index` holds, from and to.
fn bounds(index: usize) -> (f64, f64) {
    let index = index as u32;
    let octave = LOWEST_OCTAVE + index / PER_OCTAVE;
    let step = index % PER_OCTAVE;
    let base = (1u64 << octave) as f64;
    let low = base * (1.0 + f64::from(step) / 8.0);
    let high = base * (1.0 + f64::from(step + 1) / 8.0);
    (low, high)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_read_to_within_a_bucket() {
        let sketch = Sketch::new();
        for ms in 1..=100u64 {
            sketch.record(ms * 1_000_000);
        }
        let counts = sketch.take();
        assert_eq!(counts.calls(), 100);
        assert_eq!(sketch.calls(), 0, "taking empties it");
        for (q, ms) in [(0.5, 50.0), (0.9, 90.0), (0.99, 99.0)] {
            let read = counts.quantile(q).unwrap() / 1e6;
            assert!((read / ms - 1.0).abs() < 0.2, "p{q}: {read} ms for {ms} ms");
        }
        assert_eq!(Counts::empty().quantile(0.9), None);
    }

    #[test]
    fn extremes_land_in_the_end_buckets() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1_000), 0);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        let mut counts = Counts::empty();
        counts.add(3_600_000_000_000 * 10, 1);
        assert!(counts.quantile(0.5).unwrap() > 3e12);
        // Buckets grow by an eighth of an octave at most.
        for index in 0..BUCKETS - 1 {
            let (low, high) = bounds(index);
            assert!(high / low <= 1.126, "{index}: {low}..{high}");
            assert_eq!(bucket(low as u64 + 1), index);
        }
    }
}
