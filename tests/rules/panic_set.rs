//! Envoy's panic keeps the balancer's set consistent: with every endpoint out and the balancer
//! handed all of them, whatever happens next (endpoints forced out and released, upstream removals
//! and re-inserts, dry run switched on and off, the rules replaced, endpoints unready, a lone
//! endpoint) the balancer never sees a Remove for a key it does not hold, and holds exactly the
//! endpoints the monitor says it should, on tokio's paused clock.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::{Backend, Harness, Seen};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, WhenAllOut,
};

const SECOND: Duration = Duration::from_secs(1);

fn envoy(pct: u32) -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::envoy()
            .max_ejection_percent(pct)
            .always_eject_one_host(true)
            .build()
            .unwrap(),
        7,
    ))
}

/// Replays what the adaptor yielded; fails on a Remove of a key not in the set, and compares
/// the set with what the monitor says should be in it.
fn check<P: tower_outlier::probe::Probe<usize, Backend> + Clone>(
    layer: &OutlierDetectionLayer,
    h: &Harness<P>,
    forced_out: &[usize],
    what: &str,
) {
    let mut set = BTreeSet::new();
    for (_, s) in &h.seen {
        match s {
            Seen::Insert(k) => {
                set.insert(*k);
            }
            Seen::Remove(k) => {
                assert!(
                    set.remove(k),
                    "{what}: Remove({k}) for one not in the set; seen {:?}",
                    h.seen.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>()
                );
            }
        }
    }
    let snap = layer.monitor().snapshot();
    let panic = snap
        .all_out
        .as_deref()
        .is_some_and(|w| w.starts_with("panic"));
    let expected: BTreeSet<usize> = snap
        .endpoints
        .iter()
        .filter(|e| {
            let k: usize = e.key.as_str().parse().unwrap();
            let held = forced_out.contains(&k) && !e.status.is_available();
            if panic {
                !held
            } else {
                matches!(
                    e.status,
                    EndpointStatus::Available | EndpointStatus::Trial | EndpointStatus::Unready
                ) || e.would_be.is_some()
            }
        })
        .map(|e| e.key.as_str().parse().unwrap())
        .collect();
    assert_eq!(set, expected, "{what}: balancer set vs monitor; {snap:#?}");
}

#[tokio::test(start_paused = true)]
async fn panic_force_out_and_release_keep_the_set_consistent() {
    let layer = envoy(100);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    check(&layer, &h, &[], "two out");
    h.advance(15 * SECOND).await;
    h.calls(2, 5, 0).await;
    check(&layer, &h, &[], "panic");
    assert_eq!(h.live_ids(), vec![0, 1, 2, 3]);
    rules.force_out(&1usize);
    h.sync();
    check(&layer, &h, &[1], "forced out an ejected one in panic");
    assert!(!h.is_live(1));
    rules.force_out(&3usize);
    h.sync();
    check(&layer, &h, &[1, 3], "forced out the last healthy in panic");
    rules.release(&1usize);
    h.sync();
    check(&layer, &h, &[3], "released in panic");
    rules.release(&3usize);
    h.sync();
    check(&layer, &h, &[], "released #3");
    for _ in 0..12 {
        h.advance(10 * SECOND).await;
        check(&layer, &h, &[], "timers");
    }
    assert_eq!(h.live_ids(), vec![0, 1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn panic_upstream_remove_and_reinsert() {
    let layer = envoy(100);
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    h.advance(15 * SECOND).await;
    h.calls(2, 5, 0).await;
    check(&layer, &h, &[], "panic");
    h.remove(2);
    h.sync();
    check(&layer, &h, &[], "removed an ejected one in panic");
    h.remove(3);
    h.sync();
    check(&layer, &h, &[], "removed the healthy one in panic");
    h.insert(3);
    h.sync();
    check(&layer, &h, &[], "re-inserted 3");
    h.insert(2);
    h.sync();
    check(&layer, &h, &[], "re-inserted 2");
    h.insert(0);
    h.sync();
    check(&layer, &h, &[], "re-inserted (replaced) 0 while ejected");
    for _ in 0..10 {
        h.advance(10 * SECOND).await;
        check(&layer, &h, &[], "timers");
    }
}

#[tokio::test(start_paused = true)]
async fn panic_and_dry_run_toggles() {
    let layer = envoy(100);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    h.advance(15 * SECOND).await;
    h.calls(2, 5, 0).await;
    check(&layer, &h, &[], "panic");
    rules.set_dry_run(true);
    h.sync();
    check(&layer, &h, &[], "dry run on in panic");
    h.calls(3, 5, 0).await;
    check(&layer, &h, &[], "dry ejection");
    rules.set_dry_run(false);
    h.sync();
    check(&layer, &h, &[], "dry run off");
    h.calls(3, 5, 0).await;
    h.calls(2, 5, 0).await;
    h.calls(1, 5, 0).await;
    check(&layer, &h, &[], "ejections again");
    rules.set_dry_run(true);
    h.sync();
    rules.force_out(&0usize);
    h.sync();
    check(&layer, &h, &[0], "forced out in dry run");
    rules.set_dry_run(false);
    h.sync();
    check(&layer, &h, &[0], "dry run off 2");
    for _ in 0..10 {
        h.advance(10 * SECOND).await;
        check(&layer, &h, &[0], "timers");
    }
}

#[tokio::test(start_paused = true)]
async fn panic_and_reconfiguration() {
    let layer = envoy(100);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    h.advance(15 * SECOND).await;
    h.calls(2, 5, 0).await;
    check(&layer, &h, &[], "panic");
    // The same preset again, then keep-the-last, fail fast, and back to the preset, each applied
    // while in panic.
    let replacements: [(&str, Option<WhenAllOut>); 4] = [
        ("replaced in panic", None),
        ("replaced with keep-last", Some(WhenAllOut::KeepLast)),
        ("replaced with fail fast", Some(WhenAllOut::FailFast)),
        ("back to envoy", None),
    ];
    for (what, when_all_out) in replacements {
        let mut config = DetectorConfig::envoy().max_ejection_percent(100);
        if let Some(choice) = when_all_out {
            config = config.when_all_out(choice);
        }
        rules
            .replace(0, DetectorPolicy::seeded(config.build().unwrap(), 7))
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        h.sync();
        check(&layer, &h, &[], what);
    }
    for id in 0..4 {
        h.calls_while_live(id, 6, 0).await;
        check(&layer, &h, &[], "ejecting all");
    }
    for _ in 0..12 {
        h.advance(10 * SECOND).await;
        check(&layer, &h, &[], "timers");
    }
}

#[tokio::test(start_paused = true)]
async fn panic_with_unready_endpoints() {
    let layer = envoy(100);
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    check(&layer, &h, &[], "two out");
    h.backend(2).set_broken(true);
    h.poll_ready_all();
    check(&layer, &h, &[], "#2 unready: panic");
    h.backend(3).set_broken(true);
    h.poll_ready_all();
    check(&layer, &h, &[], "#3 unready too");
    h.backend(2).set_broken(false);
    h.backend(3).set_broken(false);
    for _ in 0..40 {
        h.advance(SECOND).await;
        h.poll_ready_all();
        check(&layer, &h, &[], "recovering");
    }
}

#[tokio::test(start_paused = true)]
async fn panic_single_endpoint_forced_out_then_released() {
    let layer = envoy(10);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 1);
    h.calls(0, 5, 0).await;
    check(&layer, &h, &[], "lone panic");
    rules.force_out(&0usize);
    h.sync();
    check(&layer, &h, &[0], "forced out");
    rules.release(&0usize);
    h.sync();
    check(&layer, &h, &[], "released");
    h.calls(0, 5, 0).await;
    check(&layer, &h, &[], "ejected again");
    h.remove(0);
    h.sync();
    check(&layer, &h, &[], "removed");
    h.insert(0);
    h.sync();
    check(&layer, &h, &[], "back");
}
