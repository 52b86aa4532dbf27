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
    w.record_in(more.ring(0), 6_200 * MS, false, true);
    w.record_in(&w.first, 1_500 * MS, false, false);
    w.record_in(more.ring(0), 1_700 * MS, true, false);
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
