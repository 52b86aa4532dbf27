//! What an operator's action costs the poll that applies it: what it changes, not everything asked
//! for before. Back-off resets of keys the layer never held are kept in a bounded log each
//! adaptor reads on from where it stopped (kept by key and walked in full at every action,
//! 100 000 stale resets made the poll applying a force-out take 40-86 ms in a release build).

use crate::support;

use std::time::{Duration, Instant};

use support::Harness;
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};

/// The median time of the polls that apply a force-out and a release of endpoint #1, 25 of each.
fn override_polls(
    layer: &OutlierDetectionLayer,
    h: &mut Harness<tower_outlier::probe::PassiveTrial>,
) -> Duration {
    let rules = layer.rules();
    let mut polls = Vec::new();
    for _ in 0..25 {
        rules.force_out(&1usize);
        let started = Instant::now();
        h.sync();
        polls.push(started.elapsed());
        assert!(!h.is_live(1), "forced out");
        rules.release(&1usize);
        let started = Instant::now();
        h.sync();
        polls.push(started.elapsed());
        assert!(h.is_live(1), "released");
    }
    polls.sort();
    polls[polls.len() / 2]
}

#[tokio::test(start_paused = true)]
async fn stale_resets_do_not_slow_the_poll_that_applies_an_override() {
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let mut h = Harness::new(&layer, 5);
    let clean = override_polls(&layer, &mut h);
    // Resets of 20 000 keys no adaptor holds, applied (and found to name no endpoint).
    let rules = layer.rules();
    for stale in 1_000..21_000usize {
        rules.reset_backoff(&stale);
    }
    h.sync();
    let after = override_polls(&layer, &mut h);
    eprintln!(
        "median poll applying an override: {clean:?} clean, {after:?} after 20 000 stale resets"
    );
    assert!(
        after < clean * 10 + Duration::from_millis(1),
        "{after:?} against {clean:?} with no stale reset"
    );
}
