//! Latency judged against the fleet (`latency::LatencyPolicy`, D2's relative rule), on tokio's
//! paused clock through a real p2c `Balance` with open-loop traffic: a replica three times slower
//! than its peers is ejected at the first evaluation that has its calls; the whole fleet slowing
//! together ejects nobody; a replica that hangs is judged on its calls in flight.

use std::time::Duration;

use tower::balance::p2c::Balance;
use tower_outlier::latency::{LatencyConfig, LatencyPolicy};
use tower_outlier::OutlierDetectionLayer;

use crate::support::{announce, ejected, traffic, SeededRng, Sleepy};

fn layer() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(LatencyPolicy::new(
        LatencyConfig::recommended().min_calls(5).build().unwrap(),
    ))
}

#[tokio::test(start_paused = true)]
async fn a_replica_three_times_slower_is_ejected_and_a_fleet_slowing_together_is_not() {
    let layer = layer();
    let monitor = layer.monitor();
    let backends: Vec<(usize, Sleepy)> = (0..5).map(|i| (i, Sleepy::new(i, 10))).collect();
    let mut balancer = Balance::from_rng(
        tower::Layer::layer(&layer, announce(&backends)),
        SeededRng(17),
    );
    traffic(&mut balancer, 200, Duration::from_secs(6)).await;
    assert!(ejected(&monitor).is_empty(), "{:?}", ejected(&monitor));
    // Everyone three times slower: the fleet's mean moves with them.
    for (_, backend) in &backends {
        backend.set_latency(30);
    }
    traffic(&mut balancer, 200, Duration::from_secs(11)).await;
    assert!(ejected(&monitor).is_empty(), "{:?}", ejected(&monitor));
    // Back to 10 ms but #0, which stays at 30 ms: out once it has stood out two intervals in
    // a row (the first may be half over).
    for (_, backend) in &backends[1..] {
        backend.set_latency(10);
    }
    traffic(&mut balancer, 200, Duration::from_secs(16)).await;
    assert_eq!(ejected(&monitor), vec!["0".to_owned()]);
    let reason = monitor
        .snapshot()
        .get("0")
        .unwrap()
        .last_reason
        .clone()
        .unwrap();
    assert_eq!(reason.policy, "latency");
    assert!(reason.value >= 1.3, "{reason:?}");
}

#[tokio::test(start_paused = true)]
async fn a_hung_replica_is_judged_on_its_calls_in_flight() {
    let layer = layer();
    let monitor = layer.monitor();
    let backends: Vec<(usize, Sleepy)> = (0..4).map(|i| (i, Sleepy::new(i, 10))).collect();
    let mut balancer = Balance::from_rng(
        tower::Layer::layer(&layer, announce(&backends)),
        SeededRng(17),
    );
    traffic(&mut balancer, 200, Duration::from_secs(6)).await;
    // #0 hangs: its calls never complete (no timeout here), none of them is ever timed.
    backends[0].1.set_latency(3_600_000);
    let driving = async {
        traffic(&mut balancer, 200, Duration::from_secs(16)).await;
    };
    // The hung calls are never awaited to the end: the test looks before they would be.
    let _ = tokio::time::timeout(Duration::from_secs(17), driving).await;
    assert_eq!(ejected(&monitor), vec!["0".to_owned()]);
}

/// Five replicas, #0 three times slower from 6 s to 22 s, under `config`: #0's share of the
/// calls while slow, its lowest weight then (one look a second), its weight 30 s after it healed
/// and its share of the 5 s after that; and whether anything was ejected.
async fn slow_then_healed(config: LatencyConfig) -> (f64, f64, f64, f64, bool) {
    let layer = OutlierDetectionLayer::new(LatencyPolicy::new(config));
    let monitor = layer.monitor();
    let backends: Vec<(usize, Sleepy)> = (0..5).map(|i| (i, Sleepy::new(i, 10))).collect();
    let mut balancer = Balance::from_rng(
        tower::Layer::layer(&layer, announce(&backends)),
        SeededRng(17),
    );
    traffic(&mut balancer, 200, Duration::from_secs(6)).await;
    backends[0].1.set_latency(30);
    let before = backends[0].1.calls();
    let (mut lowest, mut any_ejected) = (1.0f64, false);
    for _ in 0..16 {
        traffic(&mut balancer, 200, Duration::from_secs(1)).await;
        lowest = lowest.min(monitor.snapshot().get("0").unwrap().weight);
        any_ejected |= !ejected(&monitor).is_empty();
    }
    let slow_share = (backends[0].1.calls() - before) as f64 / 3200.0;
    backends[0].1.set_latency(10);
    traffic(&mut balancer, 200, Duration::from_secs(30)).await;
    any_ejected |= !ejected(&monitor).is_empty();
    let healed_weight = monitor.snapshot().get("0").unwrap().weight;
    let before = backends[0].1.calls();
    traffic(&mut balancer, 200, Duration::from_secs(5)).await;
    let healed_share = (backends[0].1.calls() - before) as f64 / 1000.0;
    (slow_share, lowest, healed_weight, healed_share, any_ejected)
}

#[tokio::test(start_paused = true)]
async fn down_weighting_takes_traffic_from_a_slow_replica_without_ejecting_it_and_gives_it_back() {
    let d2 = || LatencyConfig::recommended().min_calls(5);
    // The same layer with a bar no replica reaches: p2c and the layer's load alone.
    let (alone, _, _, _, _) = slow_then_healed(d2().eject_above(1000.0).build().unwrap()).await;
    let (slow, lowest, healed, healed_share, any_ejected) =
        slow_then_healed(d2().down_weight(true).build().unwrap()).await;
    eprintln!(
        "slow replica's share: {alone:.4} alone, {slow:.4} down-weighted (lowest weight \
         {lowest:.2}); healed: weight {healed}, share {healed_share:.3}"
    );
    assert!(!any_ejected, "down-weighting ejects nothing");
    assert!(lowest < 0.5, "weighed down by its ratio: {lowest}");
    assert!(slow < alone, "{slow} of the calls, {alone} without");
    assert_eq!(healed, 1.0);
    assert!(healed_share > 0.12, "its share back: {healed_share}");
}
