//! `tower_outlier::rules`, sections 2 to 4 and 8 (error-rate ejection), rule by rule, through the discover adaptor on
//! tokio's paused clock. Each test fails if its rule is broken.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use support::{Harness, Seen};
use tokio::time::Instant;
use tower::discover::Change;
use tower::Service;
use tower_outlier::error_rate::ErrorRateBuilder;
use tower_outlier::probe::{probe_fn, PassiveTrial, ProbeCadence, ProbeFuture};
use tower_outlier::{
    EndpointStatus, ErrorRateConfig, ErrorRatePolicy, NetworkErrors, OutlierDetectionLayer,
};

const SECOND: Duration = Duration::from_secs(1);

fn layer(config: ErrorRateBuilder) -> OutlierDetectionLayer {
    // EDAS's and HSF's recovery times exactly: an active check unjittered (by default the layer
    // lengthens one by up to 20 %, so that a fleet does not probe in step; `cadence.rs`).
    OutlierDetectionLayer::new(ErrorRatePolicy::new(config.build().unwrap()))
        .probe_cadence(ProbeCadence::new().interval_jitter_percent(0))
}

#[tokio::test(start_paused = true)]
async fn six_failures_in_ten_calls_at_fifty_percent_is_ejected() {
    let layer = layer(ErrorRateConfig::hsf());
    let mut h = Harness::new(&layer, 5);
    // Failures first: the rate is above the threshold before the minimum is reached, so the
    // success that completes the minimum is what crosses.
    h.calls(0, 6, 3).await;
    assert!(h.is_live(0), "nine calls are below the minimum of ten");
    h.calls(0, 0, 1).await;
    assert!(!h.is_live(0), "6 of 10 = 60 % > 50 % must eject at once");
    let snapshot = layer.monitor().snapshot();
    let endpoint = snapshot.get("0").unwrap();
    assert_eq!(snapshot.get_key(&0usize), Some(endpoint));
    assert_eq!(endpoint.status, EndpointStatus::Ejected);
    assert_eq!(endpoint.error_rate, 0.6);
    assert_eq!(endpoint.windows[0].counts.calls, 10);
    assert_eq!(endpoint.next_check_in, Some(Duration::from_secs(60)));
    let reason = endpoint.last_reason.as_ref().unwrap();
    assert_eq!((reason.value, reason.threshold), (0.6, 0.5));
}

#[tokio::test(start_paused = true)]
async fn five_failures_in_ten_calls_at_fifty_percent_is_not_ejected() {
    let layer = layer(ErrorRateConfig::hsf());
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 5, 5).await;
    assert!(h.is_live(0), "50 % is not strictly greater than 50 %");
    h.calls(0, 1, 0).await;
    assert!(!h.is_live(0), "6 of 11 = 54.5 % > 50 %");
}

#[tokio::test(start_paused = true)]
async fn successes_then_failures_eject_on_the_crossing_failure() {
    let layer = layer(ErrorRateConfig::hsf());
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 0, 4).await;
    h.calls(0, 5, 0).await;
    assert!(h.is_live(0));
    h.calls(0, 1, 0).await;
    assert!(!h.is_live(0));
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_is_judged_only_with_the_minimum_calls_in_the_window() {
    let layer = layer(ErrorRateConfig::hsf().min_calls(20));
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 19, 0).await;
    assert!(h.is_live(0), "19 failures are below the minimum of 20");
    // The window is 10 s: after 11 s the 19 failures have slid out.
    h.advance(11 * SECOND).await;
    h.calls(0, 1, 0).await;
    assert!(h.is_live(0));
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().windows[0]
            .counts
            .calls,
        1
    );
    h.calls(0, 19, 0).await;
    assert!(!h.is_live(0));
}

#[tokio::test(start_paused = true)]
async fn crossing_wakes_the_task_that_polls_the_adaptor() {
    let layer = layer(ErrorRateConfig::hsf());
    let mut h = Harness::new(&layer, 5);
    let mut endpoint = h.live[&0].clone();
    let mut next = tokio_test::task::spawn(());
    assert!(next
        .enter(|cx, _| h.adaptor.poll_next_unpin(cx))
        .is_pending());
    h.backend(0).set_failing(true);
    for _ in 0..9 {
        let _ = endpoint.call(()).await;
    }
    assert!(!next.is_woken(), "no threshold crossed yet");
    let _ = endpoint.call(()).await;
    assert!(
        next.is_woken(),
        "the crossing failure must wake the adaptor's task"
    );
    match next.enter(|cx, _| h.adaptor.poll_next_unpin(cx)) {
        std::task::Poll::Ready(Some(Ok(Change::Remove(0)))) => {}
        other => panic!(
            "expected the ejection, got {:?}",
            other.map(|c| c.map(|c| c.map(|_| ())))
        ),
    }
}

async fn fail_all(h: &mut Harness<PassiveTrial>, ids: impl IntoIterator<Item = usize>) {
    for id in ids {
        if h.is_live(id) {
            h.calls(id, 10, 0).await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn six_instances_at_sixty_percent_eject_at_most_three() {
    let layer = layer(ErrorRateConfig::edas_spring_cloud().max_ejection_ratio(0.6));
    let mut h = Harness::new(&layer, 6);
    fail_all(&mut h, 0..6).await;
    assert_eq!(h.live_ids(), vec![3, 4, 5]);
    assert_eq!(layer.monitor().snapshot().ejected(), 3);
    // Still refused on further failures.
    fail_all(&mut h, 3..6).await;
    assert_eq!(h.live.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn below_one_hsf_ejects_one_and_edas_none() {
    let hsf = layer(ErrorRateConfig::hsf().max_ejection_ratio(0.2));
    let mut h = Harness::new(&hsf, 3);
    fail_all(&mut h, 0..3).await;
    assert_eq!(h.live.len(), 2, "HSF: 3 × 20 % = 0.6 < 1 → eject one");

    let edas = layer(ErrorRateConfig::edas_spring_cloud().max_ejection_ratio(0.2));
    let mut h = Harness::new(&edas, 3);
    fail_all(&mut h, 0..3).await;
    assert_eq!(h.live.len(), 3, "EDAS: 3 × 20 % = 0.6 < 1 → eject none");
}

#[tokio::test(start_paused = true)]
async fn the_last_available_endpoint_is_never_ejected() {
    let all = layer(ErrorRateConfig::hsf().max_ejection_ratio(1.0));
    let mut h = Harness::new(&all, 3);
    fail_all(&mut h, 0..3).await;
    assert_eq!(h.live_ids(), vec![2]);
    h.calls(2, 50, 0).await;
    assert_eq!(h.live_ids(), vec![2]);

    let mut single = Harness::new(&layer(ErrorRateConfig::hsf().max_ejection_ratio(1.0)), 1);
    single.calls(0, 100, 0).await;
    assert!(single.is_live(0));
}

/// A probe that records when it ran and answers what `healthy` says.
fn recording_probe(
    healthy: Arc<Mutex<bool>>,
    times: Arc<Mutex<Vec<Instant>>>,
) -> impl tower_outlier::probe::Probe<usize, support::Backend> + Clone {
    probe_fn(move |_: &usize, _: support::Backend| -> ProbeFuture {
        times.lock().unwrap().push(Instant::now());
        let healthy = *healthy.lock().unwrap();
        Box::pin(async move { healthy })
    })
}

async fn probed_schedule(config: ErrorRateBuilder, expected: &[u64]) {
    let healthy = Arc::new(Mutex::new(false));
    let times = Arc::new(Mutex::new(Vec::new()));
    let layer = layer(config).probe(recording_probe(healthy.clone(), times.clone()));
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    assert!(!h.is_live(0));
    for (check, &secs) in expected.iter().enumerate() {
        h.advance(Duration::from_secs(secs) - SECOND).await;
        assert_eq!(
            times.lock().unwrap().len(),
            check,
            "check {check} came early"
        );
        h.advance(SECOND).await;
        assert_eq!(
            times.lock().unwrap().len(),
            check + 1,
            "check {check} did not come after {secs} s"
        );
        assert!(!h.is_live(0), "a failed probe keeps the endpoint out");
    }
}

#[tokio::test(start_paused = true)]
async fn edas_thirty_seconds_times_twenty_caps_at_ten_minutes() {
    let mut expected: Vec<u64> = (1..=20).map(|k| 30 * k).collect();
    expected.extend([600, 600, 600]);
    probed_schedule(
        ErrorRateConfig::edas_spring_cloud()
            .recovery_unit(Duration::from_secs(30))
            .max_recovery_multiple(20),
        &expected,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn hsf_sixty_seconds_times_sixty_caps_at_an_hour() {
    let mut expected: Vec<u64> = (1..=60).map(|k| 60 * k).collect();
    expected.extend([3600, 3600]);
    probed_schedule(ErrorRateConfig::hsf(), &expected).await;
}

#[tokio::test(start_paused = true)]
async fn a_successful_probe_readmits_and_resets_the_interval() {
    let healthy = Arc::new(Mutex::new(false));
    let times = Arc::new(Mutex::new(Vec::new()));
    let layer = layer(ErrorRateConfig::edas_spring_cloud())
        .probe(recording_probe(healthy.clone(), times.clone()));
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    // Checks at +30 s, +60 s, +90 s fail.
    for secs in [30, 60, 90] {
        h.advance(Duration::from_secs(secs)).await;
    }
    assert_eq!(times.lock().unwrap().len(), 3);
    *healthy.lock().unwrap() = true;
    h.advance(Duration::from_secs(119)).await;
    assert!(!h.is_live(0));
    h.advance(SECOND).await;
    assert!(
        h.is_live(0),
        "the fourth check (after 4 units) succeeds and re-admits"
    );
    let snapshot = layer.monitor().snapshot();
    assert_eq!(snapshot.get("0").unwrap().status, EndpointStatus::Available);
    assert_eq!(snapshot.get("0").unwrap().failed_checks, 0);
    assert_eq!(
        snapshot.get("0").unwrap().windows[0].counts.calls,
        0,
        "re-admission starts a fresh window"
    );
    // Ejected again: the first check is one unit away again.
    *healthy.lock().unwrap() = false;
    h.calls(0, 10, 0).await;
    assert!(!h.is_live(0));
    h.advance(Duration::from_secs(29)).await;
    assert_eq!(times.lock().unwrap().len(), 4);
    h.advance(SECOND).await;
    assert_eq!(times.lock().unwrap().len(), 5);
}

#[tokio::test(start_paused = true)]
async fn passive_trial_readmits_judges_fresh_and_lengthens_on_relapse() {
    let layer = layer(ErrorRateConfig::edas_spring_cloud());
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    assert!(!h.is_live(0));
    h.advance(Duration::from_secs(30)).await;
    assert!(h.is_live(0), "re-admitted on trial after one unit");
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().status,
        EndpointStatus::Trial
    );
    // Relapse: judged only on calls since re-admission, so 10 more failures are needed.
    h.calls(0, 9, 0).await;
    assert!(h.is_live(0));
    h.calls(0, 1, 0).await;
    assert!(!h.is_live(0));
    // The failed trial makes the next interval two units.
    h.advance(Duration::from_secs(59)).await;
    assert!(!h.is_live(0));
    h.advance(SECOND).await;
    assert!(h.is_live(0));
    // Healthy through the trial (one window, holding the minimum of calls when it ends):
    // recovered, and the interval is back to one unit.
    h.advance(Duration::from_secs(5)).await;
    h.calls(0, 0, 10).await;
    h.advance(Duration::from_secs(5)).await;
    let snapshot = layer.monitor().snapshot();
    assert_eq!(snapshot.get("0").unwrap().status, EndpointStatus::Available);
    assert_eq!(snapshot.get("0").unwrap().failed_checks, 0);
    // The trial's 10 successes are still in the window: the 11th failure crosses 50 %.
    h.calls(0, 10, 0).await;
    assert!(h.is_live(0));
    h.calls(0, 1, 0).await;
    assert!(!h.is_live(0));
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().next_check_in,
        Some(Duration::from_secs(30))
    );
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_removed_upstream_is_forgotten_and_never_reinserted() {
    let layer = layer(ErrorRateConfig::edas_spring_cloud());
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    assert!(!h.is_live(0));
    h.remove(0);
    h.sync();
    assert_eq!(h.adaptor.tracked(), 4);
    assert_eq!(h.adaptor.ejected(), 0);
    assert!(layer.monitor().snapshot().get("0").is_none());
    h.advance(Duration::from_secs(3600)).await;
    assert!(
        !h.is_live(0),
        "a recovery timer must not bring back a removed endpoint"
    );
    assert_eq!(
        h.seen.iter().filter(|(_, s)| *s == Seen::Remove(0)).count(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn an_insert_for_a_known_key_replaces_the_service_and_keeps_the_history() {
    let layer = layer(ErrorRateConfig::edas_spring_cloud());
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    let seen_before = h.seen.len();
    // The upstream re-announces 0 with a new connection while it is ejected.
    h.backends.insert(0, support::Backend::new(0));
    h.insert(0);
    h.sync();
    assert!(
        !h.is_live(0),
        "an ejected key stays out when the upstream replaces it"
    );
    assert_eq!(h.seen.len(), seen_before);
    h.advance(Duration::from_secs(30)).await;
    assert!(h.is_live(0));
    let mut endpoint = h.live[&0].clone();
    let _ = endpoint.call(()).await;
    assert_eq!(
        h.backend(0).calls(),
        1,
        "re-admitted with the replacement service"
    );
    // An available key is re-inserted with its new service at once.
    h.backends.insert(1, support::Backend::new(1));
    h.insert(1);
    h.sync();
    assert_eq!(h.seen.last().unwrap().1, Seen::Insert(1));
    let _ = h.live.get_mut(&1).unwrap().call(()).await;
    assert_eq!(h.backend(1).calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn removing_the_available_endpoints_readmits_an_ejected_one() {
    let layer = layer(ErrorRateConfig::hsf().max_ejection_ratio(1.0));
    let mut h = Harness::new(&layer, 3);
    fail_all(&mut h, 0..2).await;
    assert_eq!(h.live_ids(), vec![2]);
    h.remove(2);
    h.sync();
    assert_eq!(h.live.len(), 1, "one endpoint must stay available");
    assert_eq!(h.adaptor.ejected(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_shrinking_upstream_shrinks_the_budget() {
    let layer = layer(ErrorRateConfig::edas_spring_cloud().max_ejection_ratio(0.6));
    let mut h = Harness::new(&layer, 6);
    fail_all(&mut h, 0..3).await;
    assert_eq!(h.adaptor.ejected(), 3);
    // 4 endpoints × 60 % = 2.4 → 2.
    h.remove(4);
    h.remove(5);
    h.sync();
    assert_eq!(h.adaptor.ejected(), 2);
    assert_eq!(h.live.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn detection_goes_on_after_the_upstream_ends() {
    let layer = layer(ErrorRateConfig::hsf());
    let mut h = Harness::new(&layer, 5);
    h.tx.close_channel();
    h.sync();
    assert!(!h.ended, "the last known set stays under detection");
    h.calls(0, 10, 0).await;
    assert!(!h.is_live(0));
    h.advance(Duration::from_secs(60)).await;
    assert!(h.is_live(0));
}

#[tokio::test(start_paused = true)]
async fn the_stream_ends_once_the_upstream_ended_empty() {
    let layer = layer(ErrorRateConfig::hsf());
    let mut h = Harness::new(&layer, 2);
    h.remove(0);
    h.remove(1);
    h.tx.close_channel();
    h.sync();
    assert!(h.ended);
}

#[tokio::test(start_paused = true)]
async fn upstream_errors_pass_through_and_lose_nothing() {
    let layer = layer(ErrorRateConfig::hsf());
    let upstream = futures::stream::iter(vec![
        Ok(Change::Insert(1, support::Backend::new(1))),
        Err("registry unreachable"),
        Ok(Change::Insert(2, support::Backend::new(2))),
    ]);
    let mut adaptor = tower::Layer::layer(&layer, upstream);
    let yielded: Vec<_> = (&mut adaptor)
        .take(3)
        .map(|item| match item {
            Ok(Change::Insert(k, _)) => Ok(k),
            Ok(Change::Remove(k)) => Ok(100 + k),
            Err(e) => Err(e),
        })
        .collect()
        .await;
    assert_eq!(yielded, vec![Ok(1), Err("registry unreachable"), Ok(2)]);
    assert_eq!(layer.monitor().tracked(), 2);
}

#[tokio::test(start_paused = true)]
async fn churn_leaves_no_state_behind() {
    let layer = layer(ErrorRateConfig::hsf()).classifier(NetworkErrors);
    let mut h = Harness::new(&layer, 0);
    for cycle in 0..100_000 {
        h.insert(cycle);
        h.remove(cycle);
        if cycle % 1000 == 0 {
            h.sync();
        }
    }
    h.sync();
    assert_eq!(h.adaptor.tracked(), 0);
    assert_eq!(h.adaptor.ejected(), 0);
    assert_eq!(h.adaptor.probes_in_flight(), 0);
    assert_eq!(layer.monitor().tracked(), 0);
    assert!(h.live.is_empty());
}

#[tokio::test(start_paused = true)]
async fn churn_of_ejected_and_probing_endpoints_leaves_no_state_behind() {
    // A probe that never answers keeps endpoints in the probing state until removed.
    let layer = layer(
        ErrorRateConfig::hsf()
            .max_ejection_ratio(1.0)
            .recovery_unit(SECOND),
    )
    .probe(probe_fn(|_: &usize, _: support::Backend| -> ProbeFuture {
        Box::pin(futures::future::pending())
    }));
    let mut h = Harness::new(&layer, 1);
    for cycle in 1..2_000 {
        h.insert(cycle);
        h.sync();
        h.calls(cycle, 10, 0).await;
        if cycle % 2 == 0 {
            h.advance(SECOND).await; // start the probes of the ejected ones
        }
        h.remove(cycle);
        h.sync();
    }
    assert_eq!(h.adaptor.tracked(), 1);
    assert_eq!(h.adaptor.ejected(), 0);
    h.advance(SECOND).await;
    assert_eq!(
        h.adaptor.probes_in_flight(),
        0,
        "aborted probes are dropped"
    );
    assert_eq!(layer.monitor().tracked(), 1);
}

/// A service whose readiness fails: tower's balancer drops such an endpoint for good, so the
/// layer must not also count it (invariant 9).
#[derive(Clone)]
struct NeverReady;

impl tower::Service<()> for NeverReady {
    type Response = ();
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<(), std::io::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe)))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        std::future::ready(Ok(()))
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_errors_are_not_outcomes() {
    let layer = layer(ErrorRateConfig::hsf().min_calls(1));
    let mut endpoint = layer.endpoint(NeverReady);
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    for _ in 0..20 {
        // Held not ready (a balancer given the error would drop the endpoint for good), and
        // asked again after a back-off.
        assert!(endpoint.poll_ready(&mut cx).is_pending());
        assert!(endpoint.record().is_unready());
        tokio::time::sleep(Duration::from_secs(31)).await;
    }
    let record = endpoint.record();
    assert_eq!(
        record.policies()[0]
            .describe(record.clock().now())
            .counts
            .calls,
        0
    );
}

#[tokio::test(start_paused = true)]
async fn the_seed_hsf_json_drives_the_layer() {
    let json = r#"{ "DEFAULT": { "errorRateThreshold":0.5, "isolationTime":60000, "maxIsolationRate":0.2,
        "maxIsolationTimeMultiple":15, "qosEnabled":true, "requestThreshold":20, "timeWindowInSeconds":10 },
        "service:version": { "errorRateThreshold":0.5, "isolationTime":60000, "maxIsolationRate":0.2,
        "maxIsolationTimeMultiple":15, "qosEnabled":true, "requestThreshold":20, "timeWindowInSeconds":10 } }"#;
    let hsf = tower_outlier::error_rate::HsfQosConfig::from_json(json).unwrap();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        hsf.service("service:version").unwrap(),
    ));
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 19, 0).await;
    assert!(h.is_live(0), "requestThreshold 20");
    h.calls(0, 1, 0).await;
    assert!(!h.is_live(0));
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().next_check_in,
        Some(Duration::from_secs(60)),
        "isolationTime 60000 ms"
    );
    // qosEnabled false: nothing is ever ejected.
    let off =
        tower_outlier::error_rate::HsfQosConfig::from_json(r#"{"DEFAULT": {"qosEnabled": false}}"#)
            .unwrap();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(off.application().unwrap()));
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 100, 0).await;
    assert!(h.is_live(0));
}

#[tokio::test(start_paused = true)]
async fn a_readmitted_endpoint_is_judged_only_on_calls_since_readmission() {
    // The window (2 min) outlives the recovery unit (30 s), so the failures that caused the
    // ejection are still inside it when the endpoint comes back.
    let layer = layer(
        ErrorRateConfig::edas_spring_cloud()
            .window(Duration::from_secs(120))
            .buckets(12),
    );
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    assert!(!h.is_live(0));
    h.advance(Duration::from_secs(30)).await;
    assert!(h.is_live(0));
    h.calls(0, 1, 1).await;
    assert!(
        h.is_live(0),
        "one failure in two calls since re-admission is below the minimum"
    );
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().windows[0]
            .counts
            .calls,
        2
    );
}

#[tokio::test(start_paused = true)]
async fn an_active_request_probe_goes_through_a_clone_of_the_endpoint() {
    let layer = layer(ErrorRateConfig::edas_spring_cloud())
        .probe(tower_outlier::probe::request_probe(|| (), NetworkErrors));
    let mut h = Harness::new(&layer, 5);
    h.backend(0).set_failing(true);
    let mut endpoint = h.live[&0].clone();
    for _ in 0..10 {
        let _ = endpoint.call(()).await;
    }
    h.sync();
    assert!(!h.is_live(0));
    let calls = h.backend(0).calls();
    // The first check probes the still-failing backend: one request reaches it, and it stays out.
    h.advance(Duration::from_secs(30)).await;
    assert_eq!(
        h.backend(0).calls(),
        calls + 1,
        "the probe reached the backend"
    );
    assert!(!h.is_live(0));
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().failed_checks,
        1
    );
    // Healed: the next check (two units later) succeeds and re-admits it.
    h.backend(0).set_failing(false);
    h.advance(Duration::from_secs(60)).await;
    assert_eq!(h.backend(0).calls(), calls + 2);
    assert!(h.is_live(0));
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().status,
        EndpointStatus::Available
    );
}

#[tokio::test(start_paused = true)]
async fn absurd_intervals_do_not_panic() {
    let layer = layer(
        ErrorRateConfig::hsf()
            .recovery_unit(Duration::from_secs(u64::MAX))
            .max_recovery_multiple(u32::MAX),
    )
    .with_policy(tower_outlier::weight::WeightPolicy::new(
        tower_outlier::weight::WeightConfig::sofarpc()
            .window(Duration::MAX)
            .build()
            .unwrap(),
    ));
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    assert!(!h.is_live(0));
    let next = layer
        .monitor()
        .snapshot()
        .get("0")
        .unwrap()
        .next_check_in
        .unwrap();
    assert!(next > Duration::from_secs(365 * 24 * 3600), "{next:?}");
    h.advance(Duration::from_secs(3600)).await;
    assert!(!h.is_live(0));
}
