//! Taking over another window's counts when a configuration change replaces it (cold path).

use crate::clock::Nanos;

use super::*;

impl Window {
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
    pub(super) fn set(&self, index: usize, epoch: u64, calls: u64, failures: u64, slow: u64) {
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
}
