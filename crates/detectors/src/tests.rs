//! The endpoint state's rules, call by call, without a layer.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::noop_waker_ref;
use tower_outlier_core::{
    Admit, CallsNeeded, Clock, EndpointPolicy, FailureKind, Judgement, Nanos, Observation, Outcome,
    OwnTiming, ProbeGate, Signal,
};

use crate::{Detector, DetectorBuilder, DetectorConfig, DetectorEndpoint, DetectorPolicy};

const SECOND: Nanos = 1_000_000_000;

fn policy(builder: DetectorBuilder) -> DetectorPolicy {
    DetectorPolicy::seeded(builder.build().unwrap(), 1)
}

fn call(endpoint: &DetectorEndpoint, outcome: Outcome) -> Signal {
    endpoint.record(
        &Observation {
            outcome,
            latency: Duration::from_millis(1),
        },
        SECOND,
    )
}

const OK: Outcome = Outcome::Success;
const E500: Outcome = Outcome::Failure(FailureKind::ServerError);
const E502: Outcome = Outcome::Failure(FailureKind::Gateway);
const E503: Outcome = Outcome::Failure(FailureKind::Overload);
const REFUSED: Outcome = Outcome::Failure(FailureKind::Transport);
const TIMEOUT: Outcome = Outcome::Failure(FailureKind::Timeout);

/// The indices of the calls that signalled.
fn signals(endpoint: &DetectorEndpoint, outcomes: &[Outcome]) -> Vec<usize> {
    outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| call(endpoint, **o) == Signal::Evaluate)
        .map(|(i, _)| i)
        .collect()
}

fn is_outlier(endpoint: &DetectorEndpoint) -> Option<&'static str> {
    match endpoint.judge(SECOND) {
        Judgement::Outlier(reason) => Some(reason.measure),
        Judgement::Healthy => None,
    }
}

#[test]
fn consecutive_5xx_fires_at_exactly_the_fifth_and_starts_over() {
    let policy = policy(DetectorConfig::envoy());
    let endpoint = policy.endpoint();
    assert_eq!(signals(&endpoint, &[E500; 4]), Vec::<usize>::new());
    assert_eq!(is_outlier(&endpoint), None);
    assert_eq!(signals(&endpoint, &[E500]), vec![0]);
    assert_eq!(is_outlier(&endpoint), Some("consecutive 5xx"));
    // Envoy resets the streak once it fired: the next detection needs five more.
    assert_eq!(signals(&endpoint, &[E500; 10]), vec![4, 9]);
    assert_eq!(policy.stats().detected(Detector::Consecutive5xx), 3);
    assert_eq!(policy.stats().unenforced(Detector::Consecutive5xx), 0);
    // Enforced counts ejections, which only a layer makes.
    assert_eq!(policy.stats().enforced(Detector::Consecutive5xx), 0);
    endpoint.check_at(2 * SECOND);
    assert_eq!(policy.stats().enforced(Detector::Consecutive5xx), 1);
    // Out of rotation, calls still in flight complete a streak without a detection.
    assert!(signals(&endpoint, &[E500; 5]).is_empty());
    assert_eq!(policy.stats().detected(Detector::Consecutive5xx), 3);
}

#[test]
fn one_success_in_between_resets_the_count() {
    let endpoint = policy(DetectorConfig::envoy()).endpoint();
    let mut outcomes = vec![E500; 4];
    outcomes.push(OK);
    outcomes.extend([E500; 4]);
    assert!(signals(&endpoint, &outcomes).is_empty());
    assert_eq!(signals(&endpoint, &[E500]), vec![0]);
}

#[test]
fn gateway_failures_are_counted_but_not_enforced_under_envoys_defaults() {
    let policy = policy(DetectorConfig::envoy().consecutive_5xx(0));
    let endpoint = policy.endpoint();
    // 502, 503 and 504 (and unsplit transport errors and timeouts) are gateway failures.
    assert!(signals(&endpoint, &[E502, E503, REFUSED, TIMEOUT, E502]).is_empty());
    assert_eq!(
        policy.stats().detected(Detector::ConsecutiveGatewayFailure),
        1
    );
    assert_eq!(
        policy.stats().enforced(Detector::ConsecutiveGatewayFailure),
        0
    );
    assert_eq!(is_outlier(&endpoint), None);

    let enforced = self::policy(
        DetectorConfig::envoy()
            .consecutive_5xx(0)
            .enforcing_consecutive_gateway_failure(100),
    );
    let endpoint = enforced.endpoint();
    // A 500 is a 5xx but not a gateway failure: it breaks the gateway streak.
    assert!(signals(&endpoint, &[E502, E502, E502, E502, E500, E502]).is_empty());
    assert_eq!(signals(&endpoint, &[E503, E502, E502, E502]), vec![3]);
    assert_eq!(is_outlier(&endpoint), Some("consecutive gateway failures"));
}

#[test]
fn local_origin_failures_eject_only_with_the_split_on() {
    // Only the local-origin detector is on.
    let unsplit = policy(DetectorConfig::envoy().consecutive_5xx(0));
    let endpoint = unsplit.endpoint();
    assert!(signals(&endpoint, &[REFUSED; 10]).is_empty());
    assert_eq!(
        unsplit
            .stats()
            .detected(Detector::ConsecutiveLocalOriginFailure),
        0
    );

    let split = policy(
        DetectorConfig::envoy()
            .split_external_local_origin_errors(true)
            .consecutive_5xx(5),
    );
    let endpoint = split.endpoint();
    // Split, a refused connection or a timeout is neither a 5xx nor a gateway failure.
    assert_eq!(
        signals(&endpoint, &[REFUSED, TIMEOUT, REFUSED, REFUSED, TIMEOUT]),
        vec![4]
    );
    assert_eq!(
        is_outlier(&endpoint),
        Some("consecutive local-origin failures")
    );
    assert_eq!(split.stats().detected(Detector::Consecutive5xx), 0);
    // Any response, even a 500, shows the connection works and ends the local streak.
    let endpoint = split.endpoint();
    assert!(signals(
        &endpoint,
        &[REFUSED, REFUSED, REFUSED, REFUSED, E500, REFUSED]
    )
    .is_empty());
}

#[test]
fn enforcement_zero_counts_but_never_ejects() {
    let policy = policy(DetectorConfig::envoy().enforcing_consecutive_5xx(0));
    let endpoint = policy.endpoint();
    assert!(signals(&endpoint, &[E500; 15]).is_empty());
    assert_eq!(is_outlier(&endpoint), None);
    assert_eq!(policy.stats().detected(Detector::Consecutive5xx), 3);
    assert_eq!(policy.stats().unenforced(Detector::Consecutive5xx), 3);
}

#[test]
fn a_streak_wants_its_next_call() {
    let endpoint = policy(DetectorConfig::envoy()).endpoint();
    assert_eq!(endpoint.calls_wanted(SECOND), 0);
    signals(&endpoint, &[E500, E500]);
    assert_eq!(
        endpoint.calls_wanted(SECOND),
        1,
        "the next call of the streak"
    );
    signals(&endpoint, &[E500, E500]);
    assert_eq!(endpoint.calls_wanted(SECOND), 1);
    signals(&endpoint, &[OK]);
    assert_eq!(
        endpoint.calls_wanted(SECOND),
        0,
        "a success ends the streak"
    );
    signals(&endpoint, &[TIMEOUT]);
    assert_eq!(
        endpoint.calls_wanted(SECOND),
        1,
        "the policy counts timeouts too; the layer asks only after a fast failure"
    );
}

#[test]
fn statistical_detectors_want_no_calls() {
    let config = DetectorConfig::grpc();
    let endpoint = policy(config).endpoint();
    signals(&endpoint, &[E500; 3]);
    assert_eq!(
        endpoint.calls_wanted(SECOND),
        0,
        "success rate is judged on a timer: calls pulled to it would only fail"
    );
}

#[test]
fn a_detection_the_layer_could_not_act_on_expires_after_an_interval() {
    let endpoint = policy(DetectorConfig::envoy()).endpoint();
    signals(&endpoint, &[E500; 5]);
    assert!(matches!(endpoint.judge(11 * SECOND), Judgement::Outlier(_)));
    assert_eq!(endpoint.judge(12 * SECOND), Judgement::Healthy);
}

#[test]
fn reset_forgets_streaks_and_detections() {
    let endpoint = policy(DetectorConfig::envoy()).endpoint();
    signals(&endpoint, &[E500; 5]);
    signals(&endpoint, &[E500; 3]);
    endpoint.reset();
    assert_eq!(is_outlier(&endpoint), None);
    assert_eq!(
        signals(&endpoint, &[E500; 5]),
        vec![4],
        "a full streak again"
    );
}

fn admit(endpoint: &DetectorEndpoint, armed: bool) -> Poll<Admit> {
    let gate = endpoint.gate().expect("linkerd gates readiness");
    gate.poll_admit(
        armed,
        &Clock::tokio(),
        &mut Context::from_waker(noop_waker_ref()),
    )
}

#[test]
fn linkerd_probes_with_one_real_request_and_backs_off_on_failure() {
    let policy = policy(DetectorConfig::linkerd_consecutive().backoff_jitter(0.0));
    let endpoint = policy.endpoint();
    assert!(policy.endpoint().gate().is_some());
    assert!(self::policy(DetectorConfig::envoy())
        .endpoint()
        .gate()
        .is_none());
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Call));
    assert_eq!(signals(&endpoint, &[REFUSED; 7]), vec![6]);
    // Ejected: one second, then two, four… while probes fail.
    assert_eq!(endpoint.check_at(10 * SECOND), Some(11 * SECOND));
    endpoint.reset();
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Probe));
    assert_eq!(
        admit(&endpoint, false),
        Poll::Pending,
        "one probe at a time"
    );
    assert_eq!(admit(&endpoint, true), Poll::Ready(Admit::Probe));
    let gate = endpoint.gate().unwrap();
    let failed = Observation {
        outcome: REFUSED,
        latency: Duration::ZERO,
    };
    assert_eq!(gate.record_probe(&failed, 11 * SECOND), Signal::Evaluate);
    assert_eq!(
        endpoint.judge(11 * SECOND),
        Judgement::Outlier(tower_outlier_core::Reason {
            policy: "linkerd",
            measure: "failed probation request",
            value: 1.0,
            threshold: 1.0,
            comparison: tower_outlier_core::Comparison::Said,
            counts: endpoint.describe(0).counts,
        })
    );
    assert_eq!(endpoint.check_at(11 * SECOND), Some(13 * SECOND));
    endpoint.reset();
    // A cancelled probe hands the permit to the next call.
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Probe));
    gate.probe_cancelled(13 * SECOND);
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Probe));
    let passed = Observation {
        outcome: OK,
        latency: Duration::ZERO,
    };
    assert_eq!(gate.record_probe(&passed, 13 * SECOND), Signal::Evaluate);
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Call));
    // The next trip starts at the shortest back-off again.
    signals(&endpoint, &[REFUSED; 7]);
    assert_eq!(endpoint.check_at(20 * SECOND), Some(21 * SECOND));
}

#[test]
fn a_relapse_window_continues_the_back_off_and_a_late_failed_probe_stays_in_its_trip() {
    let config = DetectorConfig::linkerd_consecutive()
        .backoff_jitter(0.0)
        .relapse_window(Duration::from_secs(10));
    let endpoint = policy(config).endpoint();
    let gate = endpoint.gate().unwrap();
    let failed = Observation {
        outcome: REFUSED,
        latency: Duration::ZERO,
    };
    let passed = Observation {
        outcome: OK,
        latency: Duration::ZERO,
    };
    signals(&endpoint, &[REFUSED; 7]);
    assert_eq!(endpoint.check_at(10 * SECOND), Some(11 * SECOND));
    endpoint.reset();
    // Its probe, the next request, comes 19 s after its return and fails: the same trip.
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Probe));
    gate.record_probe(&failed, 30 * SECOND);
    assert_eq!(endpoint.check_at(30 * SECOND), Some(32 * SECOND));
    endpoint.reset();
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Probe));
    gate.record_probe(&passed, 33 * SECOND);
    // Out again 3 s after its return: a relapse, the back-off goes on (linkerd: 1 s).
    signals(&endpoint, &[REFUSED; 7]);
    assert_eq!(endpoint.check_at(35 * SECOND), Some(39 * SECOND));
    endpoint.reset();
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Probe));
    gate.record_probe(&passed, 40 * SECOND);
    // In for 21 s: a new trip, at the base.
    signals(&endpoint, &[REFUSED; 7]);
    assert_eq!(endpoint.check_at(60 * SECOND), Some(61 * SECOND));
}

/// linkerd's `endpoint` ejected by 7 refusals, back after its back-off with its probe out: its
/// gate.
fn probing(endpoint: &DetectorEndpoint) -> &dyn ProbeGate {
    signals(endpoint, &[REFUSED; 7]);
    endpoint.check_at(10 * SECOND);
    endpoint.reset();
    assert_eq!(admit(endpoint, false), Poll::Ready(Admit::Probe));
    endpoint.gate().expect("linkerd gates readiness")
}

#[test]
fn after_a_failed_probe_calls_wait_for_the_layer() {
    let policy = policy(DetectorConfig::linkerd_consecutive().backoff_jitter(0.0));
    let endpoint = policy.endpoint();
    let gate = probing(&endpoint);
    let failed = Observation {
        outcome: REFUSED,
        latency: Duration::ZERO,
    };
    assert_eq!(gate.record_probe(&failed, 11 * SECOND), Signal::Evaluate);
    // No call may reach an endpoint that just failed its probe before the layer decides.
    assert_eq!(admit(&endpoint, false), Poll::Pending);
    // The layer kept it in rotation (the last endpoint, say): it serves again.
    endpoint.ejection_refused(11 * SECOND);
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Call));
}

#[test]
fn every_handle_waiting_on_linkerds_gate_is_woken() {
    // Three tasks wait on the gate while a probe is out (clones of one handle, each in its own
    // task); the probe passes and each is woken, not only the last to wait. (A single waker slot
    // left the others asleep for good.)
    let policy = policy(DetectorConfig::linkerd_consecutive().backoff_jitter(0.0));
    let endpoint = policy.endpoint();
    let gate = probing(&endpoint);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let counter = Arc::new(WakeCounter::default());
            let waker = std::task::Waker::from(counter.clone());
            let waiting = gate.poll_admit(false, &Clock::tokio(), &mut Context::from_waker(&waker));
            assert_eq!(waiting, Poll::Pending, "one probe at a time");
            // The same task waiting again is listed once.
            let again = gate.poll_admit(false, &Clock::tokio(), &mut Context::from_waker(&waker));
            assert_eq!(again, Poll::Pending);
            counter
        })
        .collect();
    let passed = Observation {
        outcome: OK,
        latency: Duration::ZERO,
    };
    assert_eq!(gate.record_probe(&passed, 11 * SECOND), Signal::Evaluate);
    for (index, waiter) in waiters.iter().enumerate() {
        assert_eq!(
            waiter.woken.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "waiter {index} woken once"
        );
    }
    assert_eq!(admit(&endpoint, false), Poll::Ready(Admit::Call));
}

#[derive(Default)]
struct WakeCounter {
    woken: std::sync::atomic::AtomicUsize,
}

impl std::task::Wake for WakeCounter {
    fn wake(self: Arc<Self>) {
        self.woken
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}
