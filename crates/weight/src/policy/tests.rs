use super::*;
use tower_outlier_core::{Clock, DynOutlierPolicy, EndpointRecord, FailureKind, Notifier, Outcome};

/// One record per endpoint, each holding this policy's state.
fn fleet(policy: &WeightPolicy, endpoints: usize) -> Vec<EndpointRecord> {
    (0..endpoints)
        .map(|_| {
            EndpointRecord::new(
                Clock::tsc(),
                vec![Box::new(policy.new_endpoint()) as Box<dyn EndpointPolicy>].into_boxed_slice(),
                Arc::new(Notifier::new()),
            )
        })
        .collect()
}

/// Records `(calls, exceptions)` per endpoint (exceptions are timeouts), then evaluates.
fn window(policy: &WeightPolicy, records: &[EndpointRecord], counts: &[(u64, u64)]) {
    for (record, &(calls, exceptions)) in records.iter().zip(counts) {
        for call in 0..calls {
            let outcome = if call < exceptions {
                Outcome::Failure(FailureKind::Timeout)
            } else {
                Outcome::Success
            };
            let observation = Observation {
                outcome,
                latency: Duration::ZERO,
            };
            record.policies()[0].record(&observation, 0);
        }
    }
    let keys: Vec<usize> = (0..records.len()).collect();
    let members: Vec<FleetMember<'_, dyn EndpointPolicy>> = records
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
    assert!(<dyn DynOutlierPolicy>::from_policy(policy.clone()).evaluate_fleet(&members, 0));
}

/// Absolute weights (original 100), to six decimals.
fn weights(records: &[EndpointRecord]) -> Vec<f64> {
    records
        .iter()
        .map(|r| (r.weight() * 100.0 * 1e6).round() / 1e6)
        .collect()
}

#[test]
fn rates_are_rounded_half_up_to_hundredths_exactly() {
    for (numerator, denominator, expected) in [
        (1, 8, 13),    // 0.125
        (23, 200, 12), // 0.115
        (29, 200, 15), // 0.145, which is 14.499… hundredths in binary
        (57, 200, 29), // 0.285, likewise
        (1, 200, 1),   // 0.005
        (49, 10_000, 0),
        (3, 10, 30),
        (3, 60, 5),
        (0, 7, 0),
        (7, 7, 100),
        (2, 3, 67),
        (1, 3, 33),
    ] {
        assert_eq!(
            hundredths(numerator, denominator),
            expected,
            "{numerator}/{denominator}"
        );
    }
    // Large counts do not overflow.
    let max = u128::from(u64::MAX) * 4;
    assert_eq!(hundredths(max, max), 100);
    assert_eq!(hundredths(max / 2, max), 50);
}

#[test]
fn the_rate_multiple_is_rounded_half_up_then_compared() {
    // 0.30 / 0.05 is exactly 6.
    assert!(reaches_multiple(30, 5, 6.0));
    // 0.13 / 0.02 = 6.5; 0.11 / 0.02 = 5.5.
    assert!(reaches_multiple(13, 2, 6.5));
    assert!(!reaches_multiple(11, 2, 6.0));
    // 0.23 / 0.20 = 1.15, compared with the `f64` nearest 1.15.
    assert!(reaches_multiple(23, 20, 1.15));
    assert!(!reaches_multiple(23, 20, 1.16));
    // 0.11 / 0.03 = 3.666… → 3.67, so it reaches 3.67 (unrounded, it would not).
    assert!(reaches_multiple(11, 3, 3.67));
    assert!(!reaches_multiple(11, 3, 3.68));
}

#[test]
fn an_endpoint_exactly_at_the_multiple_is_degraded() {
    // 3 exceptions in 10 calls (0.30) against 3 in 60 (0.05) is exactly 6 times the average;
    // in binary floating point 0.3 / 0.05 is 5.999999999999999.
    let binary = |exceptions: u32, calls: u32| f64::from(exceptions) / f64::from(calls);
    assert!(binary(3, 10) / binary(3, 60) < 6.0);
    let policy = WeightPolicy::new(WeightConfig::sofarpc().build().unwrap());
    assert_eq!(policy.config().exception_rate_multiple(), 6.0);
    assert_eq!(policy.config().min_calls(), 10);
    let records = fleet(&policy, 2);
    window(&policy, &records, &[(10, 3), (50, 0)]);
    assert_eq!(weights(&records), [5.0, 100.0]);
}

#[test]
fn an_average_rounded_to_zero_judges_everyone_healthy() {
    // 1 exception in 10 + 300 calls is 0.0032, 0.00 at two places: nobody is abnormal,
    // although the endpoint's own 0.10 is 31 times the unrounded average.
    let policy = WeightPolicy::new(WeightConfig::sofarpc().build().unwrap());
    let records = fleet(&policy, 2);
    window(&policy, &records, &[(10, 1), (300, 0)]);
    assert_eq!(weights(&records), [100.0, 100.0]);
    // 2 in 310 rounds to 0.01: the endpoint's 0.20 is 20 times that.
    window(&policy, &records, &[(10, 2), (300, 0)]);
    assert_eq!(weights(&records), [5.0, 100.0]);
}

#[test]
fn the_scaled_least_count_truncates() {
    let policy = WeightPolicy::new(WeightConfig::sofarpc().min_calls(10).build().unwrap());
    // 10 × 0.55 = 5.5: 5, not 6.
    assert_eq!(policy.scaled_least_count(55.0), 5);
    assert_eq!(policy.scaled_least_count(100.0), 10);
    assert_eq!(policy.scaled_least_count(99.0), 9);
    assert_eq!(policy.scaled_least_count(50.0), 5);
    // The ratio is rounded half-up to hundredths first: 0.125 → 0.13.
    assert_eq!(policy.scaled_least_count(12.5), 1);
    // Never below 1.
    assert_eq!(policy.scaled_least_count(5.0), 1);
    assert_eq!(policy.scaled_least_count(1.0), 1);
    assert_eq!(policy.scaled_least_count(0.1), 1);

    let policy = WeightPolicy::new(WeightConfig::sofarpc().min_calls(100).build().unwrap());
    // 100 × 0.29 is 28.999999999999996 in binary; exactly 29.
    assert_eq!(policy.scaled_least_count(29.0), 29);
    assert_eq!(policy.scaled_least_count(12.5), 13);
    let policy = WeightPolicy::new(WeightConfig::sofarpc().min_calls(u64::MAX).build().unwrap());
    assert_eq!(policy.scaled_least_count(100.0), u64::MAX);
}

#[test]
fn a_degraded_endpoint_at_its_truncated_least_count_is_judged() {
    // Least count 10 at weight 55 of 100 is 5 calls.
    let policy = WeightPolicy::new(
        WeightConfig::sofarpc()
            .min_calls(10)
            .degrade_rate(0.55)
            .build()
            .unwrap(),
    );
    let records = fleet(&policy, 3);
    window(&policy, &records, &[(10, 10), (50, 0), (50, 0)]);
    assert_eq!(weights(&records), [55.0, 100.0, 100.0]);
    // 5 calls, all failing, at weight 55: counted, so abnormal again.
    window(&policy, &records, &[(5, 5), (50, 0), (50, 0)]);
    assert_eq!(weights(&records), [30.25, 100.0, 100.0]);
}
