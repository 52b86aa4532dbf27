//! The invariants of `tower_outlier::rules` (section 15) under random sequences of upstream changes, failures, successes
//! and time, on tokio's paused clock. Deterministic: a seeded generator picks every step, and the
//! failing seed and step are printed on a violation.

use crate::support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{Backend, Harness, SeededRng};
use tower_outlier::policy::{BudgetFloor, EjectionBudget};
use tower_outlier::probe::{probe_fn, Probe, ProbeFuture};
use tower_outlier::{EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

/// How many seeds each test runs: a few in CI, as many as `SOAK_HISTORIES` asks for in a soak
/// (`SOAK_HISTORIES=20000 cargo test --release --test rules invariants::`: five histories a
/// seed, three budgets with passive trials, active probes, reconfigurations — 100 000 histories).
fn seeds(first: u64, default: u64) -> std::ops::Range<u64> {
    let count = std::env::var("SOAK_HISTORIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default);
    first..first + count
}

async fn run<P: Probe<usize, Backend> + Clone>(
    seed: u64,
    layer: OutlierDetectionLayer<tower_outlier::NetworkErrors, P>,
    mut budget: EjectionBudget,
    reconfigure: bool,
) {
    let monitor = layer.monitor();
    let rules = layer.rules();
    let mut rng = SeededRng(seed);
    let mut h = Harness::new(&layer, 4);
    let mut upstream: HashSet<usize> = (0..4).collect();
    let mut next_id = 4;
    let mut most_ejected = 0;
    for step in 0..400 {
        let context = format!("seed {seed}, step {step}");
        match rng.below(if reconfigure { 12 } else { 10 }) {
            10 | 11 => {
                // New rules: any threshold, minimum, budget, on or off.
                let ratio = rng.below(11) as f64 / 10.0;
                let floor = if rng.below(2) == 0 {
                    BudgetFloor::Zero
                } else {
                    BudgetFloor::One
                };
                let config = ErrorRateConfig::hsf()
                    .enabled(rng.below(5) != 0)
                    .error_rate_threshold(rng.below(10) as f64 / 10.0)
                    .min_calls(1 + rng.below(8))
                    .max_ejection_ratio(ratio)
                    .budget_floor(floor)
                    .recovery_unit(Duration::from_secs(1 + rng.below(30)))
                    .max_recovery_multiple(3)
                    .build()
                    .unwrap();
                budget = config.budget();
                rules.replace(0, ErrorRatePolicy::new(config)).unwrap();
                h.sync();
            }
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
                assert!(
                    !h.is_live(victim),
                    "{context}: removed {victim} is still live"
                );
            }
            2..=5 => {
                let live = h.live_ids();
                if let Some(&id) = live.get(rng.below(live.len().max(1) as u64) as usize) {
                    h.calls_while_live(id, rng.below(12) as usize, 0).await;
                }
            }
            6 | 7 => {
                let live = h.live_ids();
                if let Some(&id) = live.get(rng.below(live.len().max(1) as u64) as usize) {
                    h.calls_while_live(id, 0, rng.below(12) as usize).await;
                }
            }
            _ => h.advance(Duration::from_secs(rng.below(90))).await,
        }

        // 6: the adaptor tracks exactly what the upstream holds; nothing else is live.
        assert_eq!(h.adaptor.tracked(), upstream.len(), "{context}");
        assert_eq!(monitor.tracked(), upstream.len(), "{context}");
        for id in h.live_ids() {
            assert!(
                upstream.contains(&id),
                "{context}: {id} live but not upstream"
            );
        }
        // 1: never empty while the upstream is not.
        assert!(!h.live.is_empty(), "{context}: no endpoint available");
        // 2: within the budget.
        let ejected = h.adaptor.ejected();
        assert!(
            ejected <= budget.max_ejected(upstream.len()),
            "{context}: {ejected} ejected of {}",
            upstream.len()
        );
        assert_eq!(ejected + h.live.len(), upstream.len(), "{context}");
        most_ejected = most_ejected.max(ejected);
        // 3: the balancer's set is exactly the available endpoints.
        let snapshot = monitor.snapshot();
        for endpoint in &snapshot.endpoints {
            let id: usize = endpoint.key.parse().unwrap();
            assert_eq!(
                endpoint.status.is_available(),
                h.is_live(id),
                "{context}: {id} is {:?}",
                endpoint.status
            );
            if matches!(endpoint.status, EndpointStatus::Ejected) {
                assert!(endpoint.next_check_in.is_some(), "{context}");
            }
        }
    }
    // The run must have exercised what it checks.
    assert!(most_ejected > 0, "seed {seed}: nothing was ever ejected");
}

#[tokio::test(start_paused = true)]
async fn invariants_hold_with_passive_trials() {
    for seed in seeds(0, 12) {
        for (ratio, floor) in [
            (0.5, BudgetFloor::Zero),
            (0.3, BudgetFloor::One),
            (1.0, BudgetFloor::One),
        ] {
            let budget = EjectionBudget::new(ratio, floor).unwrap();
            let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
                ErrorRateConfig::hsf()
                    .min_calls(5)
                    .recovery_unit(Duration::from_secs(20))
                    .max_recovery_multiple(3)
                    .build()
                    .unwrap(),
            ))
            .budget(budget);
            run(seed, layer, budget, false).await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn invariants_hold_through_reconfigurations() {
    for seed in seeds(2_000_000, 24) {
        // No budget of the layer's own: each version of the rules brings its budget.
        let config = ErrorRateConfig::hsf()
            .min_calls(5)
            .recovery_unit(Duration::from_secs(20))
            .max_ejection_ratio(0.5)
            .build()
            .unwrap();
        let budget = config.budget();
        let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(config));
        run(seed, layer, budget, true).await;
    }
}

#[tokio::test(start_paused = true)]
async fn invariants_hold_with_active_probes() {
    for seed in seeds(1_000_000, 12) {
        let budget = EjectionBudget::new(0.6, BudgetFloor::One).unwrap();
        // Probes that succeed or fail at random, some only after a while.
        let coin = Arc::new(AtomicU64::new(seed));
        let probe = probe_fn(move |_: &usize, _: Backend| -> ProbeFuture {
            let draw = coin
                .fetch_add(0x9E37_79B9, Ordering::Relaxed)
                .wrapping_mul(2862933555777941757);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_secs(draw % 7)).await;
                draw.is_multiple_of(3)
            })
        });
        let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::edas_spring_cloud()
                .min_calls(5)
                .recovery_unit(Duration::from_secs(10))
                .max_recovery_multiple(4)
                .build()
                .unwrap(),
        ))
        .budget(budget)
        .probe(probe);
        run(seed, layer, budget, false).await;
    }
}
