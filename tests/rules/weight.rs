//! `tower_outlier::rules`, section 6 (SOFARPC weight degradation), rule by rule, through the discover
//! adaptor on tokio's paused clock, and the weight's effect through a real p2c balancer.

use crate::support;

use std::time::Duration;

use support::Harness;
use tower_outlier::policy::{BudgetFloor, EjectionBudget};
use tower_outlier::probe::PassiveTrial;
use tower_outlier::weight::{WeightConfig, WeightPolicy};
use tower_outlier::OutlierDetectionLayer;

/// SOFARPC's documented example: window 20 s, least 30 calls, multiple 6, degrade 0.5, recover 1.2, least
/// weight 1, at most 2 degraded.
fn seed() -> tower_outlier::weight::WeightBuilder {
    WeightConfig::builder()
        .regulation_effective(true)
        .degrade_effective(true)
        .window(Duration::from_secs(20))
        .min_calls(30)
        .exception_rate_multiple(6.0)
        .degrade_rate(0.5)
        .recover_rate(1.2)
        .least_weight(1.0)
        .max_degraded(2)
}

fn layer(config: tower_outlier::weight::WeightBuilder) -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(WeightPolicy::new(config.build().unwrap()))
        .budget(EjectionBudget::new(0.0, BudgetFloor::Zero).unwrap())
}

/// Absolute weights (original 100) as the monitor reports them, by key.
fn weights(layer: &OutlierDetectionLayer) -> Vec<f64> {
    let mut endpoints = layer.monitor().snapshot().endpoints;
    endpoints.sort_by_key(|e| e.key.parse::<usize>().unwrap());
    endpoints
        .iter()
        .map(|e| (e.weight * 100.0 * 1e6).round() / 1e6)
        .collect()
}

/// One window: `calls` calls to every endpoint, the `failing` ones all failing; then the window
/// closes and the policy evaluates.
async fn window(h: &mut Harness<PassiveTrial>, endpoints: usize, calls: usize, failing: &[usize]) {
    for id in 0..endpoints {
        if failing.contains(&id) {
            h.calls(id, calls, 0).await;
        } else {
            h.calls(id, 0, calls).await;
        }
    }
    h.advance(Duration::from_secs(20)).await;
}

#[tokio::test(start_paused = true)]
async fn the_seed_example_degrades_by_half_to_one_and_recovers_by_1_2_to_the_original() {
    let layer = layer(seed());
    let mut h = Harness::new(&layer, 10);
    let mut expected = 100.0;
    for _ in 0..7 {
        window(&mut h, 10, 30, &[0]).await;
        expected = f64::max(expected * 0.5, 1.0);
        assert_eq!(weights(&layer)[0], expected);
        assert!(weights(&layer)[1..].iter().all(|&w| w == 100.0));
    }
    assert_eq!(
        weights(&layer)[0],
        1.0,
        "100 → 50 → 25 → 12.5 → 6.25 → 3.125 → 1.5625 → 1"
    );
    window(&mut h, 10, 30, &[0]).await;
    assert_eq!(weights(&layer)[0], 1.0, "never below the least weight");

    let mut recovering = Vec::new();
    for _ in 0..40 {
        window(&mut h, 10, 30, &[]).await;
        recovering.push(weights(&layer)[0]);
        if recovering.last() == Some(&100.0) {
            break;
        }
    }
    assert_eq!(recovering[0], 1.2);
    assert_eq!(recovering[1], 1.44);
    assert_eq!(
        *recovering.last().unwrap(),
        100.0,
        "back to exactly the original weight"
    );
    assert_eq!(
        recovering.len(),
        26,
        "1.2^25 < 100 ≤ 1.2^26 ({recovering:?})"
    );
}

#[tokio::test(start_paused = true)]
async fn no_more_than_two_endpoints_are_degraded_at_once() {
    // 3 failing of 20: each is 20/3 ≈ 6.7 times the average.
    let layer = layer(seed());
    let mut h = Harness::new(&layer, 20);
    window(&mut h, 20, 30, &[0, 1, 2]).await;
    let w = weights(&layer);
    assert_eq!(w.iter().filter(|&&w| w < 100.0).count(), 2);
    // An already-degraded endpoint may degrade further; the third still may not.
    window(&mut h, 20, 30, &[0, 1, 2]).await;
    let w = weights(&layer);
    assert_eq!(w.iter().filter(|&&w| w < 100.0).count(), 2);
    assert_eq!(w.iter().filter(|&&w| w == 25.0).count(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_single_counted_endpoint_is_never_degraded() {
    let layer = layer(seed());
    let mut h = Harness::new(&layer, 3);
    // Only endpoint 0 reaches the least count: it is the average, 1 < 6.
    h.calls(0, 30, 0).await;
    h.calls(1, 29, 0).await;
    h.advance(Duration::from_secs(20)).await;
    assert_eq!(weights(&layer), vec![100.0, 100.0, 100.0]);
}

#[tokio::test(start_paused = true)]
async fn an_average_of_zero_means_every_counted_endpoint_is_healthy() {
    let layer = layer(seed());
    let mut h = Harness::new(&layer, 10);
    window(&mut h, 10, 30, &[0]).await;
    assert_eq!(weights(&layer)[0], 50.0);
    window(&mut h, 10, 30, &[]).await;
    assert_eq!(weights(&layer)[0], 60.0, "healthy and degraded: × 1.2");
}

#[tokio::test(start_paused = true)]
async fn endpoints_under_the_least_count_are_not_judged_nor_averaged() {
    let layer = layer(seed());
    let mut h = Harness::new(&layer, 10);
    // Endpoint 0 fails every call but makes only 29: not counted. Endpoint 1 has two failures in
    // 30; with 0 out of the average, 1's rate (2/30 → 0.07, SOFARPC rounds to hundredths) over
    // the average (2/270 → 0.01) is 7 ≥ 6. Had endpoint 0 been averaged in, the average would
    // have been (29 + 2)/299 → 0.10 and nothing abnormal.
    h.calls(0, 29, 0).await;
    h.calls(1, 2, 28).await;
    for id in 2..10 {
        h.calls(id, 0, 30).await;
    }
    h.advance(Duration::from_secs(20)).await;
    let w = weights(&layer);
    assert_eq!(w[0], 100.0, "not counted, not judged");
    assert_eq!(w[1], 50.0, "judged against the counted endpoints only");
}

#[tokio::test(start_paused = true)]
async fn a_degraded_endpoint_is_judged_on_its_scaled_least_count() {
    let layer = layer(seed());
    let mut h = Harness::new(&layer, 10);
    window(&mut h, 10, 30, &[0]).await;
    assert_eq!(weights(&layer)[0], 50.0);
    // At weight 50 of 100 the least count is 15: 14 calls are not counted.
    h.calls(0, 14, 0).await;
    for id in 1..10 {
        h.calls(id, 0, 30).await;
    }
    h.advance(Duration::from_secs(20)).await;
    assert_eq!(weights(&layer)[0], 50.0);
    h.calls(0, 15, 0).await;
    for id in 1..10 {
        h.calls(id, 0, 30).await;
    }
    h.advance(Duration::from_secs(20)).await;
    assert_eq!(weights(&layer)[0], 25.0);
}

#[tokio::test(start_paused = true)]
async fn the_global_switch_off_does_nothing() {
    let layer = layer(seed().regulation_effective(false));
    let mut h = Harness::new(&layer, 10);
    window(&mut h, 10, 30, &[0]).await;
    assert!(weights(&layer).iter().all(|&w| w == 100.0));
}

mod log_only {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_degrade_switch_off_reports_and_leaves_weights() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let layer = layer(seed().degrade_effective(false));
        let mut h = Harness::new(&layer, 10);
        window(&mut h, 10, 30, &[4]).await;
        assert!(weights(&layer).iter().all(|&w| w == 100.0));
        let log = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
        assert!(
            log.contains("abnormal endpoint (degrade switch off: weight unchanged)"),
            "{log}"
        );
        assert!(log.contains("endpoint=4"), "{log}");
        assert!(log.contains("would_be=50"), "{log}");
    }
}

mod through_p2c {
    use super::support::{announce, SeededRng, Sleepy};
    use super::*;
    use std::sync::atomic::Ordering;
    use tower::balance::p2c::Balance;
    use tower::buffer::Buffer;
    use tower::{Layer, ServiceExt};

    pub(super) async fn load(
        balancer: &Buffer<
            (),
            impl std::future::Future<Output = Result<usize, tower::BoxError>> + Send + 'static,
        >,
        span: Duration,
    ) {
        let until = tokio::time::Instant::now() + span;
        let workers: Vec<_> = (0..20)
            .map(|_| {
                let balancer = balancer.clone();
                tokio::spawn(async move {
                    while tokio::time::Instant::now() < until {
                        let _ = balancer.clone().oneshot(()).await;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.unwrap();
        }
    }

    fn shares(backends: &[(usize, Sleepy)], before: &[usize]) -> Vec<f64> {
        let now: Vec<usize> = backends.iter().map(|(_, b)| b.calls()).collect();
        let total: usize = now.iter().zip(before).map(|(n, b)| n - b).sum();
        now.iter()
            .zip(before)
            .map(|(n, b)| (n - b) as f64 / total as f64)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_degraded_endpoint_gets_a_small_share_and_regains_it_at_full_weight() {
        let backends: Vec<(usize, Sleepy)> = (0..4).map(|id| (id, Sleepy::new(id, 10))).collect();
        // SOFARPC's rates (1/20 down, × 2 up); multiple 3, since one failing endpoint of four is
        // at most 4 times the average.
        let layer = OutlierDetectionLayer::new(WeightPolicy::new(
            WeightConfig::sofarpc()
                .window(Duration::from_secs(10))
                .exception_rate_multiple(3.0)
                .build()
                .unwrap(),
        ));
        let monitor = layer.monitor();
        let balancer = Buffer::new(
            Balance::from_rng(layer.layer(announce(&backends)), SeededRng(11)),
            64,
        );
        let weight_of_0 = || monitor.snapshot().get("0").unwrap().weight;

        backends[0].1.failing.store(true, Ordering::SeqCst);
        load(&balancer, Duration::from_secs(10)).await;
        backends[0].1.failing.store(false, Ordering::SeqCst);
        // The window closes on the next request after it ends.
        load(&balancer, Duration::from_millis(20)).await;
        assert_eq!(weight_of_0(), 0.05, "degraded to 1/20");
        let zero = monitor.snapshot().get("0").unwrap().clone();
        assert!(zero.degraded);
        assert_eq!(zero.absolute_weight, Some(5.0), "SOFARPC's 100 × 1/20");
        assert!(!monitor.snapshot().get("1").unwrap().degraded);

        let before: Vec<usize> = backends.iter().map(|(_, b)| b.calls()).collect();
        load(&balancer, Duration::from_secs(5)).await;
        let degraded = shares(&backends, &before);
        println!("shares with endpoint 0 at 1/20: {degraded:?}");
        assert!(degraded[0] < 0.05, "{degraded:?}");
        assert!(degraded[1..].iter().all(|&s| s > 0.25), "{degraded:?}");

        // Healthy windows bring it back (× 2 per counted window); it is counted once it gets the
        // few calls its scaled least count asks for.
        for _ in 0..40 {
            if weight_of_0() == 1.0 {
                break;
            }
            load(&balancer, Duration::from_secs(10)).await;
        }
        assert_eq!(weight_of_0(), 1.0, "restored to its original weight");
        let before: Vec<usize> = backends.iter().map(|(_, b)| b.calls()).collect();
        load(&balancer, Duration::from_secs(5)).await;
        let restored = shares(&backends, &before);
        println!("shares at full weight: {restored:?}");
        assert!(restored.iter().all(|&s| s > 0.15), "{restored:?}");
    }
}

mod all_three_policies {
    use super::support::{announce, SeededRng, Sleepy};
    use super::*;
    use std::sync::atomic::Ordering;
    use tower::balance::p2c::Balance;
    use tower::buffer::Buffer;
    use tower::Layer;
    use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
    use tower_outlier::{ErrorRateConfig, ErrorRatePolicy};

    #[tokio::test(start_paused = true)]
    async fn error_rate_slow_calls_and_weights_share_one_layer_and_one_budget() {
        // 0 fails, 1 is slow; 6 × 20 % = 1.2: one ejection between them.
        let backends: Vec<(usize, Sleepy)> = (0..6)
            .map(|id| (id, Sleepy::new(id, if id == 1 { 600 } else { 50 })))
            .collect();
        backends[0].1.failing.store(true, Ordering::SeqCst);
        let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::hsf().min_calls(5).build().unwrap(),
        ))
        .with_policy(SlowCallPolicy::new(
            BreakerConfig::slow_ratio(Duration::from_millis(500))
                .min_calls(3)
                .window(Duration::from_secs(5))
                .open_duration(Duration::from_secs(30))
                .build()
                .unwrap(),
        ))
        .with_policy(WeightPolicy::new(
            WeightConfig::sofarpc()
                .exceptions(&[tower_outlier::classify::FailureKind::Timeout])
                .min_calls(5)
                .exception_rate_multiple(2.0)
                .build()
                .unwrap(),
        ));
        let monitor = layer.monitor();
        let balancer = Buffer::new(
            Balance::from_rng(layer.layer(announce(&backends)), SeededRng(21)),
            64,
        );
        super::through_p2c::load(&balancer, Duration::from_secs(12)).await;
        let snapshot = monitor.snapshot();
        assert_eq!(snapshot.ejected(), 1, "one shared budget: {snapshot:#?}");
        let zero = snapshot.get("0").unwrap();
        let one = snapshot.get("1").unwrap();
        let names: Vec<&str> = zero.windows.iter().map(|w| w.policy).collect();
        assert_eq!(names, vec!["error-rate", "slow-call", "weight"]);
        // Both are outliers; the one ejected first spent the budget, the other stays in rotation.
        let ejected_reason = if zero.status.is_available() {
            one.last_reason.clone().unwrap()
        } else {
            zero.last_reason.clone().unwrap()
        };
        assert!(["error-rate", "slow-call"].contains(&ejected_reason.policy));
        // The failing endpoint's timeouts also cost it weight while it served.
        assert!(
            zero.weight < 1.0 || !zero.status.is_available(),
            "{zero:#?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_zero_weight_never_wins_a_pair() {
    use tower::load::Load;
    use tower::Service;
    let layer = layer(seed());
    let mut heavy = layer.endpoint(support::Backend::new(0));
    let zero = layer.endpoint(support::Backend::new(1));
    // The other endpoint as loaded as it gets: slow and busy.
    heavy.record().seed_rtt(10e9, heavy.record().clock().now());
    let _in_flight: Vec<_> = (0..1000).map(|_| heavy.call(())).collect();
    assert_eq!(heavy.in_flight(), 1000);
    zero.record().set_weight(0.0);
    assert!(zero.load().value().is_infinite());
    assert!(heavy.load() < zero.load());
    // Negative and non-numeric weights are stored as zero.
    zero.record().set_weight(f64::NAN);
    assert_eq!(zero.record().weight(), 0.0);
    zero.record().set_weight(-1.0);
    assert_eq!(zero.record().weight(), 0.0);
}
