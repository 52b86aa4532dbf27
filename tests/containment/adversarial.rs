//! The adversarial suite: random histories beyond `tests/rules/invariants.rs`, on tokio's paused clock.
//! Two policies at once (the error-rate preset and the recommended detectors), callbacks that
//! panic, probes that panic or never finish, services whose `poll_ready` fails and later mends,
//! keys inserted twice, unknown keys removed, a key removed and inserted again between two polls,
//! reconfigurations, and time. After every step
//! the invariants of `tower_outlier::rules` (section 15) are checked; at the end, liveness: once
//! every backend is healthy and time has passed, every endpoint is back.
//!
//! 1 000 histories by default;
//! `SOAK_HISTORIES=100000 cargo test --release --test containment adversarial::` for the soak. The failing seed and step are printed on a violation.

use crate::support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{Backend, Harness, SeededRng};
use tower_outlier::policy::{BudgetFloor, EjectionBudget};
use tower_outlier::probe::{probe_fn, Probe, ProbeFuture};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, ErrorRateConfig, ErrorRatePolicy,
    OutlierDetectionLayer,
};

fn histories() -> u64 {
    std::env::var("SOAK_HISTORIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000)
}

/// A draw from a counter shared with user code that runs on its own schedule (probes, callbacks).
fn draw(coin: &AtomicU64) -> u64 {
    coin.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_mul(0xBF58_476D_1CE4_E5B9)
        >> 17
}

/// What a history exercised: ejections made, probe panics, callback panics.
#[derive(Default)]
struct Exercised {
    ejections: AtomicU64,
    probe_panics: AtomicU64,
    callback_panics: AtomicU64,
    readiness_errors: AtomicU64,
}

/// Live endpoints whose service is ready: the ones a balancer can send a call to.
fn callable<P: Probe<usize, Backend> + Clone>(h: &Harness<P>) -> Vec<usize> {
    h.live_ids()
        .into_iter()
        .filter(|id| !h.backend(*id).is_broken())
        .collect()
}

async fn history(seed: u64, exercised: Arc<Exercised>) {
    let mut rng = SeededRng(seed);
    let budget = EjectionBudget::new(
        [0.3, 0.5, 1.0][rng.below(3) as usize],
        if rng.below(2) == 0 {
            BudgetFloor::Zero
        } else {
            BudgetFloor::One
        },
    )
    .unwrap();
    // Probes that pass, fail, panic when started or when polled, or take a while.
    let coin = Arc::new(AtomicU64::new(seed));
    let probe_coin = coin.clone();
    let seen = exercised.clone();
    let probe = probe_fn(move |_: &usize, _: Backend| -> ProbeFuture {
        let d = draw(&probe_coin);
        if d.is_multiple_of(17) {
            seen.probe_panics.fetch_add(1, Ordering::Relaxed);
            panic!("a probe that panics when started");
        }
        let seen = seen.clone();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(d % 5_000)).await;
            if d.is_multiple_of(13) {
                seen.probe_panics.fetch_add(1, Ordering::Relaxed);
                panic!("a probe that panics when polled");
            }
            !d.is_multiple_of(3)
        })
    });
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .min_calls(5)
            .recovery_unit(Duration::from_secs(10))
            .max_recovery_multiple(3)
            .build()
            .unwrap(),
    ))
    .with_policy(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .budget(budget)
    .probe(probe);
    let monitor = layer.monitor();
    let rules = layer.rules();
    // A callback that panics on some events.
    let callback_coin = coin.clone();
    let seen = exercised.clone();
    let _callback = monitor.on_event(move |event| {
        if matches!(event, tower_outlier::events::Event::Ejected { .. }) {
            seen.ejections.fetch_add(1, Ordering::Relaxed);
        }
        if draw(&callback_coin).is_multiple_of(7) {
            seen.callback_panics.fetch_add(1, Ordering::Relaxed);
            panic!("a callback that panics");
        }
    });
    let mut h = Harness::new(&layer, 4);
    let mut upstream: HashSet<usize> = (0..4).collect();
    let mut next_id = 4;
    for step in 0..200 {
        let context = format!("seed {seed}, step {step}");
        match rng.below(16) {
            0 => {
                h.insert(next_id);
                upstream.insert(next_id);
                next_id += 1;
                h.sync();
            }
            1 if upstream.len() > 1 => {
                let victim = *upstream
                    .iter()
                    .nth(rng.below(upstream.len() as u64) as usize)
                    .unwrap();
                h.remove(victim);
                upstream.remove(&victim);
                h.sync();
                assert!(!h.is_live(victim), "{context}: removed {victim} is live");
            }
            2 => {
                // A key inserted again (its service replaced), live or not.
                let &key = upstream
                    .iter()
                    .nth(rng.below(upstream.len() as u64) as usize)
                    .unwrap();
                h.insert(key);
                h.sync();
            }
            3 => {
                // A key the upstream never held, removed.
                h.remove(1_000_000 + rng.below(10) as usize);
                h.sync();
            }
            4 => {
                // Removed and inserted again before the adaptor is polled.
                let &key = upstream
                    .iter()
                    .nth(rng.below(upstream.len() as u64) as usize)
                    .unwrap();
                h.remove(key);
                h.insert(key);
                h.sync();
            }
            5 => {
                let config = ErrorRateConfig::hsf()
                    .enabled(rng.below(4) != 0)
                    .error_rate_threshold(rng.below(10) as f64 / 10.0)
                    .min_calls(1 + rng.below(8))
                    .recovery_unit(Duration::from_secs(1 + rng.below(20)))
                    .max_recovery_multiple(3)
                    .build()
                    .unwrap();
                rules.replace(0, ErrorRatePolicy::new(config)).unwrap();
                h.sync();
            }
            6..=8 => {
                let live = callable(&h);
                if let Some(&id) = live.get(rng.below(live.len().max(1) as u64) as usize) {
                    h.calls_while_live(id, rng.below(10) as usize, rng.below(3) as usize)
                        .await;
                }
            }
            9 | 10 => {
                let live = callable(&h);
                if let Some(&id) = live.get(rng.below(live.len().max(1) as u64) as usize) {
                    h.calls_while_live(id, 0, rng.below(12) as usize).await;
                }
            }
            14 => {
                // A service's readiness fails (its connection's worker died) or mends, and the
                // balancer polls what it holds.
                let &key = upstream
                    .iter()
                    .nth(rng.below(upstream.len() as u64) as usize)
                    .unwrap();
                let backend = h.backend(key).clone();
                backend.set_broken(!backend.is_broken());
                exercised.readiness_errors.fetch_add(1, Ordering::Relaxed);
                h.poll_ready_all();
            }
            15 => h.poll_ready_all(),
            _ => h.advance(Duration::from_millis(rng.below(40_000))).await,
        }
        check(&h, &monitor, &upstream, budget, &context);
    }
    // Liveness: everything healthy, probes passing or not, time passing with traffic.
    for id in upstream.iter() {
        h.backend(*id).set_broken(false);
    }
    for _ in 0..40 {
        for id in h.live_ids() {
            h.calls_while_live(id, 0, 3).await;
        }
        h.advance(Duration::from_secs(30)).await;
        check(
            &h,
            &monitor,
            &upstream,
            budget,
            &format!("seed {seed}, end"),
        );
        let unready = monitor
            .snapshot()
            .endpoints
            .iter()
            .any(|e| e.status == EndpointStatus::Unready);
        if h.adaptor.ejected() == 0 && !unready {
            return;
        }
    }
    panic!(
        "seed {seed}: endpoints still out after 20 healthy minutes: {:#?}",
        monitor.snapshot()
    );
}

fn check<P>(
    h: &Harness<P>,
    monitor: &tower_outlier::Monitor,
    upstream: &HashSet<usize>,
    budget: EjectionBudget,
    context: &str,
) {
    // The adaptor tracks exactly what the upstream holds; nothing else is live.
    assert_eq!(h.adaptor.tracked(), upstream.len(), "{context}");
    assert_eq!(monitor.tracked(), upstream.len(), "{context}");
    for id in h.live.keys() {
        assert!(
            upstream.contains(id),
            "{context}: {id} live but not upstream"
        );
    }
    // Never empty while the upstream is not; within the budget.
    assert!(!h.live.is_empty(), "{context}: no endpoint available");
    let ejected = h.adaptor.ejected();
    assert!(
        ejected <= budget.max_ejected(upstream.len()),
        "{context}: {ejected} ejected of {}",
        upstream.len()
    );
    assert_eq!(ejected + h.live.len(), upstream.len(), "{context}");
    // The balancer's set is exactly the available endpoints and the unready ones (held, not
    // picked); every ejection has a check due.
    let snapshot = monitor.snapshot();
    for endpoint in &snapshot.endpoints {
        let id: usize = endpoint.key.parse().unwrap();
        assert_eq!(
            endpoint.status.is_available() || endpoint.status == EndpointStatus::Unready,
            h.live.contains_key(&id),
            "{context}: {id} is {:?}",
            endpoint.status
        );
        if endpoint.status == EndpointStatus::Ejected {
            assert!(endpoint.next_check_in.is_some(), "{context}: {endpoint:?}");
        }
    }
    // Never the balancer's last pickable endpoint ejected: while one is out, one in the set is
    // ready (a readiness error on the last ready one brings an ejected one back).
    let ready = snapshot
        .endpoints
        .iter()
        .filter(|e| e.status.is_available())
        .count();
    assert!(
        ejected == 0 || ready > 0,
        "{context}: {ejected} ejected and none of the {} in the set ready",
        h.live.len()
    );
}

#[tokio::test(start_paused = true)]
async fn invariants_and_liveness_hold_in_adversarial_histories() {
    // The panics below are the histories' own (probes, callbacks): contained, they only clutter
    // the output.
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info.payload_as_str().unwrap_or("");
        if !text.starts_with("a probe that panics") && !text.starts_with("a callback that panics") {
            quiet(info);
        }
    }));
    let exercised = Arc::new(Exercised::default());
    let count = histories();
    for seed in 0..count {
        history(seed, exercised.clone()).await;
    }
    // The suite must have exercised what it attacks.
    let ejections = exercised.ejections.load(Ordering::Relaxed);
    let probe_panics = exercised.probe_panics.load(Ordering::Relaxed);
    let callback_panics = exercised.callback_panics.load(Ordering::Relaxed);
    let readiness_errors = exercised.readiness_errors.load(Ordering::Relaxed);
    assert!(
        ejections >= count && probe_panics > 0 && callback_panics > 0 && readiness_errors > 0,
        "{ejections} ejections, {probe_panics} probe panics, {callback_panics} callback panics, \
         {readiness_errors} readiness changes in {count} histories"
    );
    eprintln!(
        "{count} histories: {ejections} ejections, {probe_panics} probe panics, \
         {callback_panics} callback panics, {readiness_errors} readiness changes"
    );
}
