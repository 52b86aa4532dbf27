//! The cost of one weight-degradation evaluation (SOFARPC semantics) over 10 to 10 000 endpoints.
//!
//! Run with `cargo bench -p tower-outlier-benches --bench weight_evaluation`. Plain harness: for
//! each size, every endpoint's window is filled (untimed: 30 calls each, one endpoint in 50
//! failing them all, so the evaluation degrades and recovers), then one evaluation is timed the
//! way the layer runs it — building the fleet view and calling the policy's fleet evaluation (which
//! recovers each member's typed state). Median of many
//! evaluations per size.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_outlier::classify::{FailureKind, Observation, Outcome};
use tower_outlier::policy::Clock;
use tower_outlier::policy::{
    DynOutlierPolicy, EndpointPolicy, EndpointRecord, FleetMember, Notifier, OutlierPolicy,
};
use tower_outlier::weight::{WeightConfig, WeightPolicy};

fn main() {
    let policy = WeightPolicy::new(
        WeightConfig::sofarpc()
            .exceptions(&[FailureKind::Transport])
            .build()
            .expect("valid configuration"),
    );
    let clock = Clock::tsc();
    let notifier = Arc::new(Notifier::new());
    let ok = Observation {
        outcome: Outcome::Success,
        latency: Duration::from_millis(1),
    };
    let failed = Observation {
        outcome: Outcome::Failure(FailureKind::Transport),
        latency: Duration::from_millis(1),
    };
    println!(
        "one weight evaluation (fleet view + the policy's fleet evaluation), median of the runs"
    );
    println!(
        "{:>10} {:>8} {:>14} {:>14}",
        "endpoints", "runs", "median (µs)", "per endpoint (ns)"
    );
    let held = <dyn DynOutlierPolicy>::from_policy(policy.clone());
    assert!(held.fleet_interval().is_some(), "regulation is on");
    for size in [10usize, 100, 1_000, 10_000] {
        let records: Vec<EndpointRecord> = (0..size)
            .map(|_| {
                EndpointRecord::new(
                    clock.clone(),
                    vec![Box::new(policy.new_endpoint()) as Box<dyn EndpointPolicy>]
                        .into_boxed_slice(),
                    notifier.clone(),
                )
            })
            .collect();
        let keys: Vec<usize> = (0..size).collect();
        let runs = (2_000_000 / size).clamp(20, 2_000);
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            for (i, record) in records.iter().enumerate() {
                let observation = if i % 50 == 0 { &failed } else { &ok };
                for _ in 0..30 {
                    record.policies()[0].record(observation, 0);
                }
            }
            let start = Instant::now();
            let fleet: Vec<FleetMember<'_, dyn EndpointPolicy>> = records
                .iter()
                .zip(&keys)
                .map(|(record, key)| FleetMember {
                    key,
                    state: &*record.policies()[0],
                    record,
                    available: true,
                    in_flight: 0,
                    waited: 0,
                })
                .collect();
            held.evaluate_fleet(black_box(&fleet), 0);
            times.push(start.elapsed());
        }
        times.sort();
        let median = times[times.len() / 2];
        println!(
            "{:>10} {:>8} {:>14.2} {:>14.1}",
            size,
            runs,
            median.as_secs_f64() * 1e6,
            median.as_nanos() as f64 / size as f64
        );
    }
}
