//! The detectors of Envoy, gRPC and linkerd (`tower_outlier::detectors`) through the discover
//! adaptor on tokio's paused clock: when each ejects, how long an ejection lasts in each dialect,
//! and how their budgets count. The backends fail with refused connections, which Envoy counts
//! as 5xx (and gateway failures) unless the origins are split.

use crate::support;

use std::time::Duration;

use support::Harness;
use tower::Service;
use tower_outlier::detectors::{Detector, DetectorBuilder, SuccessRateRule};
use tower_outlier::probe::PassiveTrial;
use tower_outlier::{DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer};

const SECOND: Duration = Duration::from_secs(1);

fn detector_layer(builder: DetectorBuilder) -> (OutlierDetectionLayer, DetectorPolicy) {
    let policy = DetectorPolicy::seeded(builder.build().unwrap(), 7);
    (OutlierDetectionLayer::new(policy.clone()), policy)
}

fn next_check(layer: &OutlierDetectionLayer, id: usize) -> Option<Duration> {
    layer
        .monitor()
        .snapshot()
        .get(&id.to_string())
        .unwrap()
        .next_check_in
}

fn reason(layer: &OutlierDetectionLayer, id: usize) -> (&'static str, &'static str, f64) {
    let snapshot = layer.monitor().snapshot();
    let reason = snapshot
        .get(&id.to_string())
        .unwrap()
        .last_reason
        .clone()
        .expect("ejected once");
    (reason.policy, reason.measure, reason.value)
}

/// `calls` calls to each of `ids`, all successful.
async fn healthy(h: &mut Harness<PassiveTrial>, ids: std::ops::Range<usize>, calls: usize) {
    for id in ids {
        h.calls(id, 0, calls).await;
    }
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_eject_at_exactly_the_fifth() {
    let (layer, _) = detector_layer(DetectorConfig::envoy().max_ejection_percent(50));
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 4, 1).await;
    h.calls(0, 4, 0).await;
    assert!(h.is_live(0), "a success in between starts the count over");
    h.calls(0, 1, 0).await;
    assert!(!h.is_live(0), "the fifth failure in a row ejects at once");
    assert_eq!(reason(&layer, 0), ("envoy", "consecutive 5xx", 5.0));
    // Before the first interval tick there is no tick to align to: exactly the base time.
    assert_eq!(next_check(&layer, 0), Some(30 * SECOND));
}

#[tokio::test(start_paused = true)]
async fn envoys_ten_percent_ejects_nothing_among_five_unless_one_host_is_always_allowed() {
    let (layer, policy) = detector_layer(DetectorConfig::envoy());
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 5, 0).await;
    assert!(
        h.is_live(0),
        "(0 + 1) / 5 = 20 % > 10 %: Envoy's current rule refuses"
    );
    assert_eq!(policy.stats().overflow(Detector::Consecutive5xx), 1);
    assert_eq!(policy.stats().enforced(Detector::Consecutive5xx), 0);

    let (layer, _) = detector_layer(DetectorConfig::envoy().always_eject_one_host(true));
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 5, 0).await;
    assert!(!h.is_live(0), "always_eject_one_host allows the first");
    h.calls(1, 5, 0).await;
    assert!(h.is_live(1), "but only while none is ejected");
}

#[tokio::test(start_paused = true)]
async fn envoy_ejection_time_grows_per_ejection_aligns_to_ticks_and_decays_when_healthy() {
    let (layer, _) = detector_layer(DetectorConfig::envoy().max_ejection_percent(50));
    let mut h = Harness::new(&layer, 5);
    h.advance(10 * SECOND).await;
    h.advance(3 * SECOND).await;
    // Ejected at 13 s, between the ticks of 10 s and 20 s: 43 s is not a tick, 50 s is.
    h.calls(0, 5, 0).await;
    assert_eq!(next_check(&layer, 0), Some(37 * SECOND));
    h.advance(37 * SECOND).await;
    assert!(h.is_live(0), "re-admitted on the tick at 50 s");
    // Each ejection one base time longer: 60 s, then 90 s.
    h.calls(0, 5, 0).await;
    assert_eq!(next_check(&layer, 0), Some(60 * SECOND));
    h.advance(60 * SECOND).await;
    h.calls(0, 5, 0).await;
    assert_eq!(next_check(&layer, 0), Some(90 * SECOND));
    h.advance(90 * SECOND).await;
    assert!(h.is_live(0));
    // Healthy for two intervals after the one it came back on: the multiplier drops from 3 to
    // 1, so the next ejection is 2 × 30 s.
    h.advance(10 * SECOND).await;
    h.advance(10 * SECOND).await;
    h.calls(0, 5, 0).await;
    assert_eq!(next_check(&layer, 0), Some(60 * SECOND));
}

#[tokio::test(start_paused = true)]
async fn envoy_ejection_time_is_capped_at_max_ejection_time() {
    let (layer, _) = detector_layer(
        DetectorConfig::envoy()
            .max_ejection_percent(50)
            .max_ejection_time(90 * SECOND),
    );
    let mut h = Harness::new(&layer, 5);
    h.advance(10 * SECOND).await;
    let mut lengths = Vec::new();
    for _ in 0..5 {
        h.calls(0, 5, 0).await;
        let length = next_check(&layer, 0).unwrap();
        lengths.push(length.as_secs());
        h.advance(length).await;
        assert!(h.is_live(0));
    }
    assert_eq!(lengths, vec![30, 60, 90, 90, 90]);
}

#[tokio::test(start_paused = true)]
async fn grpc_success_rate_ejects_on_the_tick_and_the_multiplier_grows_and_decays() {
    let (layer, policy) = detector_layer(DetectorConfig::grpc());
    let mut h = Harness::new(&layer, 5);
    healthy(&mut h, 1..5, 100).await;
    h.calls(0, 50, 50).await;
    assert!(h.is_live(0), "gRPC has no consecutive-failure detector");
    h.advance(10 * SECOND).await;
    assert!(
        !h.is_live(0),
        "50 % against four at 100 %: below mean − 1.9 × stdev"
    );
    assert_eq!(reason(&layer, 0), ("grpc", "success rate", 50.0));
    assert_eq!(policy.stats().detected(Detector::SuccessRate), 1);
    // Re-admitted on the first tick at or after the end: 40 s.
    assert_eq!(next_check(&layer, 0), Some(30 * SECOND));
    h.advance(30 * SECOND).await;
    assert!(h.is_live(0));
    // An endpoint condemned on a tick is ejected before the multipliers decay: this second
    // ejection, at the tick of 50 s, is 2 × 30 s.
    healthy(&mut h, 1..5, 100).await;
    h.calls(0, 50, 50).await;
    h.advance(10 * SECOND).await;
    assert!(!h.is_live(0));
    assert_eq!(next_check(&layer, 0), Some(60 * SECOND));
    h.advance(60 * SECOND).await;
    assert!(h.is_live(0));
    // Two ticks in rotation take its multiplier from 2 to 0, so ejecting it again takes one
    // base time.
    h.advance(10 * SECOND).await;
    h.advance(10 * SECOND).await;
    healthy(&mut h, 1..5, 100).await;
    h.calls(0, 50, 50).await;
    h.advance(10 * SECOND).await;
    assert!(!h.is_live(0));
    assert_eq!(next_check(&layer, 0), Some(30 * SECOND));
}

#[tokio::test(start_paused = true)]
async fn grpc_allows_the_first_ejection_whatever_the_percentage() {
    // The robust rule finds both (the stdev rule would find neither: see below).
    let (layer, _) =
        detector_layer(DetectorConfig::grpc().success_rate_rule(SuccessRateRule::robust()));
    let mut h = Harness::new(&layer, 5);
    healthy(&mut h, 2..5, 100).await;
    h.calls(0, 60, 40).await;
    h.calls(1, 60, 40).await;
    h.advance(10 * SECOND).await;
    // 0 / 5 < 10 % lets one through; 1 / 5 ≥ 10 % stops the second. (Envoy's rule would
    // eject neither: 1 / 5 > 10 %.)
    assert_eq!(h.live_ids(), vec![1, 2, 3, 4]);
    assert_eq!(reason(&layer, 0).1, "success rate");
}

#[tokio::test(start_paused = true)]
async fn success_rate_needs_the_minimum_hosts_and_volume() {
    let (layer, _) = detector_layer(
        DetectorConfig::envoy()
            .consecutive_5xx(0)
            .max_ejection_percent(50),
    );
    let mut h = Harness::new(&layer, 5);
    healthy(&mut h, 1..4, 100).await;
    h.calls(4, 0, 99).await;
    h.calls(0, 50, 50).await;
    h.advance(10 * SECOND).await;
    assert!(h.is_live(0), "only four endpoints have 100 calls");
    healthy(&mut h, 1..5, 100).await;
    h.calls(0, 50, 50).await;
    h.advance(10 * SECOND).await;
    assert!(!h.is_live(0), "with five it is the outlier");
}

#[tokio::test(start_paused = true)]
async fn two_of_five_fully_down_escape_envoys_rule_but_not_the_robust_one() {
    for (rule, ejected) in [
        (SuccessRateRule::Stdev, vec![]),
        (SuccessRateRule::robust(), vec![3, 4]),
    ] {
        let (layer, _) = detector_layer(
            DetectorConfig::envoy()
                .consecutive_5xx(0)
                .max_ejection_percent(50)
                .success_rate_rule(rule),
        );
        let mut h = Harness::new(&layer, 5);
        healthy(&mut h, 0..3, 100).await;
        h.calls(3, 100, 0).await;
        h.calls(4, 100, 0).await;
        h.advance(10 * SECOND).await;
        let out: Vec<usize> = (0..5).filter(|id| !h.is_live(*id)).collect();
        assert_eq!(out, ejected, "{rule:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn failure_percentage_is_off_by_default_in_envoy_and_ejects_at_the_threshold() {
    let quiet = DetectorConfig::envoy()
        .consecutive_5xx(0)
        .success_rate(None)
        .max_ejection_percent(50);
    let (layer, policy) = detector_layer(quiet.clone());
    let mut h = Harness::new(&layer, 5);
    healthy(&mut h, 1..5, 100).await;
    h.calls(0, 85, 15).await;
    h.advance(10 * SECOND).await;
    assert!(h.is_live(0), "enforcing_failure_percentage is 0 by default");
    assert_eq!(policy.stats().detected(Detector::FailurePercentage), 1);
    assert_eq!(policy.stats().enforced(Detector::FailurePercentage), 0);

    let (layer, _) = detector_layer(quiet.enforcing_failure_percentage(100));
    let mut h = Harness::new(&layer, 5);
    healthy(&mut h, 1..5, 100).await;
    h.calls(0, 84, 16).await;
    h.advance(10 * SECOND).await;
    assert!(h.is_live(0), "84 % is below 85 %");
    healthy(&mut h, 1..5, 100).await;
    h.calls(0, 85, 15).await;
    h.advance(10 * SECOND).await;
    assert!(!h.is_live(0), "Envoy ejects at the threshold itself");
    assert_eq!(reason(&layer, 0), ("envoy", "failure percentage", 85.0));
}

#[tokio::test(start_paused = true)]
async fn linkerd_backs_off_exponentially_and_probes_with_one_real_request() {
    let (layer, _) = detector_layer(DetectorConfig::linkerd_consecutive().backoff_jitter(0.0));
    let mut h = Harness::new(&layer, 3);
    h.calls(0, 6, 0).await;
    assert!(h.is_live(0));
    h.calls(0, 1, 0).await;
    assert!(!h.is_live(0), "seven failures in a row");
    assert_eq!(next_check(&layer, 0), Some(SECOND));
    h.advance(SECOND).await;
    assert!(h.is_live(0));
    // On probation: one handle gets the probe, every other waits for its answer.
    let mut first = h.live[&0].clone();
    let mut second = h.live[&0].clone();
    let mut task = tokio_test::task::spawn(());
    assert!(task.enter(|cx, _| first.poll_ready(cx)).is_ready());
    assert!(task.enter(|cx, _| second.poll_ready(cx)).is_pending());
    drop(first);
    assert!(
        task.is_woken(),
        "dropping the probe's handle hands the probe on"
    );
    drop(second);
    // The probe fails: out again for twice as long.
    h.calls(0, 1, 0).await;
    assert!(!h.is_live(0));
    assert_eq!(next_check(&layer, 0), Some(2 * SECOND));
    h.advance(2 * SECOND).await;
    h.calls(0, 0, 1).await;
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().status,
        EndpointStatus::Trial
    );
    // The probe passed: the next trip starts at one second again.
    h.calls(0, 7, 0).await;
    assert_eq!(next_check(&layer, 0), Some(SECOND));
}

#[tokio::test(start_paused = true)]
async fn a_refused_detection_lapses_and_the_multiplier_still_decays() {
    let (layer, policy) = detector_layer(DetectorConfig::envoy());
    // Ten endpoints: Envoy's 10 % allows one ejection at a time.
    let mut h = Harness::new(&layer, 10);
    h.advance(10 * SECOND).await;
    h.calls(0, 5, 0).await;
    assert!(!h.is_live(0));
    h.advance(30 * SECOND).await;
    assert!(h.is_live(0));
    // Endpoint 1 takes the one slot; endpoint 0's next detection is refused.
    h.calls(1, 5, 0).await;
    h.calls(0, 5, 0).await;
    assert!(!h.is_live(1) && h.is_live(0));
    assert_eq!(policy.stats().overflow(Detector::Consecutive5xx), 1);
    // When the slot frees, at 70 s, the detection is older than an interval: it has lapsed.
    for _ in 0..20 {
        h.advance(10 * SECOND).await;
    }
    assert!(h.is_live(0) && h.is_live(1));
    // Healthy all that time, endpoint 0's multiplier is back to zero: one base time again.
    h.calls(0, 5, 0).await;
    assert_eq!(next_check(&layer, 0), Some(30 * SECOND));
    assert_eq!(policy.stats().enforced(Detector::Consecutive5xx), 3);
}

/// Waits (real time) until endpoint 0 is `live` or not, syncing the adaptor every 5 ms.
async fn until_live(h: &mut Harness<PassiveTrial>, live: bool) {
    let deadline = tokio::time::Instant::now() + 5 * SECOND;
    while h.is_live(0) != live {
        assert!(
            tokio::time::Instant::now() < deadline,
            "endpoint 0 never became {}",
            if live { "live" } else { "ejected" }
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        h.sync();
    }
}

// On a running clock, not the paused one: the layer reaches an ejection a tick decided a few
// microseconds after the tick. gRPC (grpc-go, grpc-core) ejects at the tick and re-admits after
// the base time; the ejection used to count from the later instant, so 30 s became the tick
// after (40 s), and the multiplier decay held back for a tick's ejection was paid anyway (the
// ejection's time was not the tick's), so a host still failing got 30 s again instead of 60 s.
#[tokio::test]
async fn grpc_ejections_decided_on_a_tick_last_the_base_time_and_grow_on_a_real_clock() {
    let base = Duration::from_millis(600);
    let (layer, _) = detector_layer(
        DetectorConfig::grpc()
            .interval(Duration::from_millis(200))
            .base_ejection_time(base),
    );
    let mut h = Harness::new(&layer, 5);
    healthy(&mut h, 1..5, 100).await;
    h.calls(0, 50, 50).await;
    until_live(&mut h, false).await;
    let first = next_check(&layer, 0).unwrap();
    assert!(
        first <= base,
        "ejected on a tick for {first:?}, not the base time of {base:?}"
    );
    until_live(&mut h, true).await;
    // Back on a tick, and failing again before the next one.
    healthy(&mut h, 1..5, 100).await;
    h.calls(0, 50, 50).await;
    until_live(&mut h, false).await;
    let second = next_check(&layer, 0).unwrap();
    assert!(
        second <= 2 * base && second > base,
        "the second ejection lasts {second:?}, not twice the base time"
    );
}

// grpc-go accepts zero durations (its AllFields_Zero parse case): with a zero interval the
// layer sweeps every millisecond (grpc-go back to back), and a zero base ejection time ejects
// and re-admits on the same sweep. A config of every field zero runs without fault.
#[tokio::test(start_paused = true)]
async fn grpc_zero_interval_and_base_sweep_every_millisecond_and_eject_for_no_time() {
    let (layer, policy) = detector_layer(
        DetectorConfig::grpc()
            .interval(Duration::ZERO)
            .base_ejection_time(Duration::ZERO)
            .max_ejection_time(Duration::ZERO)
            .success_rate(None)
            .failure_percentage_threshold(50)
            .enforcing_failure_percentage(100)
            .failure_percentage_minimum_hosts(1)
            .failure_percentage_request_volume(10),
    );
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    h.advance(Duration::from_millis(1)).await;
    // Ejected on the sweep a millisecond later and, with a zero base time, back on the same
    // sweep, as grpc-go un-ejects it in the same run of its timer.
    assert_eq!(h.removals(), vec![0]);
    assert!(h.is_live(0));
    assert_eq!(policy.stats().enforced(Detector::FailurePercentage), 1);

    let zero = tower_outlier::detectors::GrpcOutlierDetection::from_json(&format!(
        "{{{}}}",
        crate::grpc_conformance::ALL_FIELDS_ZERO
    ))
    .unwrap();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(zero.into_config()));
    let mut h = Harness::new(&layer, 3);
    for _ in 0..20 {
        h.calls(0, 3, 3).await;
        h.calls(1, 0, 3).await;
        h.advance(Duration::from_millis(1)).await;
    }
    assert_eq!(h.live_ids(), vec![0, 1, 2], "nothing enforced, nothing out");
}

// Found by review: a new detector policy put in place under the same interval keeps the
// layer's tick series, and is told where it stands: an ejection before the first tick still
// ends on a tick (40 s for 30 s from 3 s), not at its exact due time.
#[tokio::test(start_paused = true)]
async fn a_new_policy_under_the_same_interval_keeps_the_tick_series() {
    let (layer, _) = detector_layer(DetectorConfig::envoy().max_ejection_percent(50));
    let mut h = Harness::new(&layer, 5);
    let fresh = DetectorPolicy::seeded(
        DetectorConfig::envoy()
            .max_ejection_percent(50)
            .build()
            .unwrap(),
        9,
    );
    layer.rules().replace(0, fresh).unwrap();
    h.sync();
    h.advance(3 * SECOND).await;
    h.calls(0, 5, 0).await;
    assert!(!h.is_live(0));
    assert_eq!(next_check(&layer, 0), Some(37 * SECOND));
}
