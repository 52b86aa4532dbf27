//! linkerd2-proxy's own test cases for its failure accrual (`breaker/unified.rs`, the "unified"
//! breaker of consecutive failures and a recent success rate, since mid-2026), re-expressed
//! against the layer with the linkerd preset. Each case names the linkerd test it comes from.
//! linkerd's tests use a back-off of 1 s to 100 s without jitter, 3 consecutive failures, a
//! threshold of 0.8 over 10 s and 1 minimum request unless they say otherwise; so do these.
//!
//! linkerd's tests feed classified responses to one endpoint's breaker; here they are calls to
//! one of three endpoints (the layer never ejects the last). Where linkerd counts a 429 or
//! RESOURCE_EXHAUSTED against the rate but not as a consecutive failure, these use failures the
//! classifier counts (refused connections), which count for both: the cases keep linkerd's
//! expectations where the two agree and say so where they do not.

use crate::support;

use std::time::Duration;

use support::Harness;
use tower_outlier::detectors::{Detector, RecentSuccessRate};
use tower_outlier::probe::PassiveTrial;
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer, WhenAllOut};

const SECOND: Duration = Duration::from_secs(1);

/// linkerd's test parameters: `max_failures` in a row, `threshold` over 10 s on `min_requests`.
fn breaker(
    max_failures: u32,
    threshold: f64,
    min_requests: u32,
) -> (OutlierDetectionLayer, DetectorPolicy) {
    let config = DetectorConfig::linkerd()
        .consecutive_5xx(max_failures)
        .backoff_jitter(0.0)
        .max_ejection_time(100 * SECOND)
        .recent_success_rate(Some(RecentSuccessRate {
            threshold,
            window: 10 * SECOND,
            min_requests,
        }))
        .build()
        .unwrap();
    let policy = DetectorPolicy::seeded(config, 5);
    (OutlierDetectionLayer::new(policy.clone()), policy)
}

fn measure(layer: &OutlierDetectionLayer) -> &'static str {
    let snapshot = layer.monitor().snapshot();
    let entry = snapshot.get("0").unwrap();
    entry.last_reason.as_ref().expect("tripped once").measure
}

/// Calls endpoint 0: `true` a success, `false` a failure, stopping if it leaves rotation.
async fn calls(h: &mut Harness<PassiveTrial>, outcomes: &[bool]) {
    for &ok in outcomes {
        if !h.is_live(0) {
            return;
        }
        h.calls(0, usize::from(!ok), usize::from(ok)).await;
    }
}

// starts_open, trips_on_consecutive_failures (threshold 0: the rate off).
#[tokio::test(start_paused = true)]
async fn trips_on_consecutive_failures() {
    let (layer, _) = breaker(3, 0.0, 1);
    let mut h = Harness::new(&layer, 3);
    assert!(h.is_live(0), "starts open");
    calls(&mut h, &[false, false]).await;
    assert!(h.is_live(0));
    calls(&mut h, &[false]).await;
    assert!(!h.is_live(0));
    assert_eq!(measure(&layer), "consecutive failures");
}

// success_resets_consecutive_count (threshold 0, as linkerd's other consecutive cases).
#[tokio::test(start_paused = true)]
async fn success_resets_consecutive_count() {
    let (layer, _) = breaker(3, 0.0, 1);
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[false, false, true, false, false]).await;
    assert!(h.is_live(0));
}

// trips_on_low_success_rate (max_failures 100): a success, then a failure: 1/2 < 0.8.
#[tokio::test(start_paused = true)]
async fn trips_on_low_success_rate() {
    let (layer, policy) = breaker(100, 0.8, 1);
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[true]).await;
    h.advance(SECOND).await;
    calls(&mut h, &[false]).await;
    assert!(!h.is_live(0));
    assert_eq!(measure(&layer), "success rate");
    assert_eq!(policy.stats().enforced(Detector::SuccessRate), 1);
}

// success_rate_counts_5xx, min_requests_zero_trips_on_first_failure: one failure is 0/1.
#[tokio::test(start_paused = true)]
async fn one_failure_trips_with_one_or_no_minimum() {
    for min_requests in [1, 0] {
        let (layer, _) = breaker(100, 0.8, min_requests);
        let mut h = Harness::new(&layer, 3);
        calls(&mut h, &[false]).await;
        assert!(!h.is_live(0), "min_requests {min_requests}");
    }
}

// cold_start_protects_success_rate (min_requests 5): four failures do not trip on the rate
// (linkerd's case uses 429s, which do not count as consecutive failures either: here the
// consecutive trigger is 100); the fifth does (cold_start_holds_until_min_requests).
#[tokio::test(start_paused = true)]
async fn cold_start_protects_success_rate() {
    let (layer, _) = breaker(100, 0.8, 5);
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[false; 4]).await;
    assert!(h.is_live(0));
    calls(&mut h, &[false]).await;
    assert!(!h.is_live(0));
}

// threshold_zero_disables_success_rate, both_policies_disabled_never_trips.
#[tokio::test(start_paused = true)]
async fn a_zero_threshold_turns_the_rate_off_and_nothing_trips_with_both_off() {
    let (layer, _) = breaker(100, 0.0, 1);
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[true]).await;
    calls(&mut h, &[false; 50]).await;
    assert!(h.is_live(0));
    let (layer, _) = breaker(0, 0.0, 1);
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[false; 20]).await;
    assert!(h.is_live(0));
}

// idle_reengages_cold_start_with_failure (threshold 0.5, min_requests 3): after 200 s idle the
// window is empty again; failures one and two do not trip, the third (0/3) does.
#[tokio::test(start_paused = true)]
async fn idle_reengages_cold_start() {
    let (layer, _) = breaker(100, 0.5, 3);
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[true, true, true]).await;
    h.advance(200 * SECOND).await;
    calls(&mut h, &[false, false]).await;
    assert!(h.is_live(0));
    calls(&mut h, &[false]).await;
    assert!(!h.is_live(0));
}

// dual_mode_success_rate_trips_before_consecutive (5, 0.8, min_requests 3): 200, 429, 429 is
// 1/3 and trips on the rate (here two failures, short of five in a row).
#[tokio::test(start_paused = true)]
async fn dual_mode_success_rate_trips_before_consecutive() {
    let (layer, _) = breaker(5, 0.8, 3);
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[true, false, false]).await;
    assert!(!h.is_live(0));
    assert_eq!(measure(&layer), "success rate");
}

// simultaneous_threshold_cross_reports_consecutive_reason (3, 0.8, min_requests 3): three
// failures cross both; the consecutive trigger is checked first and named.
#[tokio::test(start_paused = true)]
async fn simultaneous_threshold_cross_reports_consecutive_reason() {
    let (layer, policy) = breaker(3, 0.8, 3);
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[false, false, false]).await;
    assert!(!h.is_live(0));
    assert_eq!(measure(&layer), "consecutive failures");
    assert_eq!(policy.stats().detected(Detector::SuccessRate), 0);
}

// success_rate_recovers_after_decay (max_failures 0, threshold 0.5, min_requests 3): three
// successes, then failures until it trips (3/7 < 0.5); after the 1 s back-off a successful
// probe reopens it with an empty window, so one failure does not trip it again, and twenty
// successes a second apart keep it in.
#[tokio::test(start_paused = true)]
async fn success_rate_recovers_after_decay() {
    let (layer, _) = breaker(0, 0.5, 3);
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[true, true, true, false, false, false]).await;
    assert!(h.is_live(0), "3/6 is not below 0.5");
    calls(&mut h, &[false]).await;
    assert!(!h.is_live(0));
    h.advance(SECOND).await;
    assert!(h.is_live(0), "back after the 1 s back-off, for the probe");
    calls(&mut h, &[true]).await;
    calls(&mut h, &[false]).await;
    assert!(
        h.is_live(0),
        "the window started empty: 1/2 on 2 calls, under the minimum"
    );
    for _ in 0..20 {
        h.advance(SECOND).await;
        calls(&mut h, &[true]).await;
    }
    assert!(h.is_live(0));
}

// The older consecutive-only accrual stays available by name, with no rate trigger.
#[tokio::test(start_paused = true)]
async fn the_consecutive_only_accrual_is_kept_by_name() {
    let config = DetectorConfig::linkerd_consecutive().build().unwrap();
    assert_eq!(config.recent_success_rate(), None);
    assert_eq!(config.consecutive_5xx().threshold, 7);
    let unified = DetectorConfig::linkerd().build().unwrap();
    assert_eq!(
        unified.recent_success_rate(),
        Some(RecentSuccessRate {
            threshold: 0.8,
            window: 10 * SECOND,
            min_requests: 5,
        })
    );
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(config));
    let mut h = Harness::new(&layer, 3);
    calls(&mut h, &[true, false, false, false, false, false, false]).await;
    assert!(h.is_live(0), "6 failures of 7, no rate trigger");
    calls(&mut h, &[false]).await;
    assert!(!h.is_live(0));
}

// Found by review: a rate trip the layer refused (endpoint 0 was the last one in rotation, kept
// in by a layer that keeps the last) must not switch the rate trigger off for good. Once its condemnation lapses (an interval)
// and there is room, a new trip ejects the gray endpoint. The back-off is longer than the
// interval, so the stale condemnation cannot be what ejects it.
#[tokio::test(start_paused = true)]
async fn a_refused_rate_trip_does_not_switch_the_trigger_off() {
    let config = DetectorConfig::linkerd()
        .consecutive_5xx(3)
        .backoff_jitter(0.0)
        .base_ejection_time(30 * SECOND)
        .max_ejection_time(100 * SECOND)
        .recent_success_rate(Some(RecentSuccessRate {
            threshold: 0.8,
            window: 10 * SECOND,
            min_requests: 5,
        }))
        .when_all_out(WhenAllOut::KeepLast)
        .build()
        .unwrap();
    let policy = DetectorPolicy::seeded(config, 5);
    let layer = OutlierDetectionLayer::new(policy.clone());
    let mut h = Harness::new(&layer, 2);
    h.calls(1, 3, 0).await;
    assert!(!h.is_live(1));
    for _ in 0..5 {
        h.calls(0, 1, 1).await;
    }
    assert!(h.is_live(0), "the last endpoint in rotation: refused");
    h.advance(31 * SECOND).await;
    h.poll_ready_all();
    if h.is_live(1) {
        h.calls(1, 0, 3).await;
    }
    h.advance(11 * SECOND).await;
    assert!(h.is_live(1) && h.is_live(0));
    for _ in 0..40 {
        if !h.is_live(0) {
            break;
        }
        h.calls_while_live(0, 1, 1).await;
        h.advance(Duration::from_millis(100)).await;
    }
    assert!(
        !h.is_live(0),
        "with room, the gray endpoint is ejected on the rate"
    );
    assert_eq!(policy.stats().enforced(Detector::SuccessRate), 1);
}
