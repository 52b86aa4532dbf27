use super::*;
use crate::outcome::FailureKind;

const MS: Nanos = 1_000_000;

fn record() -> EndpointRecord {
    EndpointRecord::new(Clock::tokio(), Box::new([]), Arc::new(Notifier::new()))
}

fn call(record: &EndpointRecord, outcome: Outcome, latency_ms: u64, now: Nanos) {
    let observation = Observation {
        outcome,
        latency: Duration::from_millis(latency_ms),
    };
    record.observe(&observation, now, 0);
}

/// One call of a serial caller: it starts when the last one ended and ends `latency_ms` later.
fn serial(record: &EndpointRecord, outcome: Outcome, latency_ms: u64, now: &mut Nanos) {
    *now += latency_ms * MS;
    call(record, outcome, latency_ms, *now);
}

/// The estimate right after a successful call of `latency_ms` completing at `now`.
fn estimate_after(record: &EndpointRecord, latency_ms: u64, now: Nanos) -> f64 {
    call(record, Outcome::Success, latency_ms, now);
    record.rtt_estimate(now)
}

/// A record whose first call (which may set up a connection) is behind it.
fn warm_record() -> EndpointRecord {
    let record = record();
    call(&record, Outcome::Success, 0, record.clock().now());
    record
}

#[test]
fn a_fast_call_after_an_idle_stretch_blends_with_the_decayed_estimate() {
    let record = warm_record();
    let start = record.clock().now();
    call(&record, Outcome::Success, 1000, start);
    assert!((record.rtt_estimate(start) - 1e9).abs() < 1e6);
    // A minute idle: the estimate has decayed to 1 s × e^-6 ≈ 2.5 ms. A 2 ms call blends
    // with that, not with the 1 s stored before the idle stretch.
    let later = start + 60_000 * MS;
    let estimate = estimate_after(&record, 2, later);
    assert!(
        (2.0 * MS as f64..2.5 * MS as f64).contains(&estimate),
        "estimate {estimate} ns"
    );
}

#[test]
fn a_fast_call_after_a_stale_gap_replaces_a_slow_estimate() {
    let record = warm_record();
    let start = record.clock().now();
    // Slow for a while: 100 ms a call.
    call(&record, Outcome::Success, 100, start);
    assert!(!record.estimate_stale(start + 999 * MS));
    assert!(record.estimate_stale(start + 1_000 * MS));
    // Within the stale gap, a fast call moves the estimate an eighth of the way down.
    let estimate = estimate_after(&record, 1, start + 500 * MS);
    assert!(estimate > 80.0 * MS as f64, "estimate {estimate} ns");
    // A second and more later the estimate (about 77 ms by then) is stale: a 1 ms answer is
    // the endpoint's speed now.
    let later = start + 2_000 * MS;
    let estimate = estimate_after(&record, 1, later);
    assert!(
        (0.9 * MS as f64..1.1 * MS as f64).contains(&estimate),
        "estimate {estimate} ns"
    );
    // A slow answer after a stale gap is a peak, as any: straight back up.
    assert!(estimate_after(&record, 100, later + 2_000 * MS) >= 100.0 * MS as f64);
    // A call begun before the gap ended (in flight beside the last one) is no news of the
    // endpoint now: it completes 1.5 s after the last completion, but took 600 ms.
    let slow_again = later + 2_000 * MS;
    call(&record, Outcome::Success, 2_000, slow_again);
    let estimate = estimate_after(&record, 600, slow_again + 1_500 * MS);
    assert!(estimate > 1_000.0 * MS as f64, "estimate {estimate} ns");
    // One whose last call failed has rules of its own.
    let failed_at = slow_again + 3_500 * MS;
    call(
        &record,
        Outcome::Failure(FailureKind::Transport),
        1,
        failed_at,
    );
    assert!(!record.estimate_stale(failed_at + 10_000 * MS));
    // Nor is one re-admitted, whether or not a fleet estimate seeds it: no call measured since.
    call(&record, Outcome::Success, 1, failed_at + 11_000 * MS);
    assert!(record.estimate_stale(failed_at + 13_000 * MS));
    record.reset();
    assert!(!record.estimate_stale(failed_at + 13_000 * MS));
}

#[test]
fn estimates_of_tens_of_nanoseconds_are_not_rewritten_on_every_call() {
    let record = warm_record();
    let start = record.clock().now();
    let nanos = |ns| Observation {
        outcome: Outcome::Success,
        latency: Duration::from_nanos(ns),
    };
    // A sample after an idle stretch is always stored: 100 ns.
    record.observe(&nanos(100), start + 2 * MS, 0);
    assert_eq!(record.latency.rtt_nanos.load(Ordering::Relaxed), 100);
    // Then, within the millisecond, calls of 60 to 90 ns move the estimate by less than 64 ns
    // each: no store, so several cores calling do not share a written cache line.
    for ns in [60, 90, 70, 80] {
        record.observe(&nanos(ns), start + 2 * MS + 10, 0);
    }
    assert_eq!(record.latency.rtt_nanos.load(Ordering::Relaxed), 100);
    // A change of more than 64 ns is stored.
    record.observe(&nanos(1_000), start + 2 * MS + 20, 0);
    assert_eq!(record.latency.rtt_nanos.load(Ordering::Relaxed), 1_000);
}

#[test]
fn decay_matches_exp_on_both_branches() {
    for idle_ms in [0, 1, 10, 100, 156, 157, 1_000, 10_000, 100_000] {
        let idle = idle_ms * MS;
        let exact = (-(idle as f64) / RTT_DECAY.as_nanos() as f64).exp();
        assert!((decay(idle) - exact).abs() < 1e-6, "{idle_ms} ms");
    }
}

/// A policy that always wants five more calls.
#[derive(Debug)]
struct WantsFive;

impl EndpointPolicy for WantsFive {
    fn record(&self, _: &Observation, _: Nanos) -> Signal {
        Signal::None
    }
    fn judge(&self, _: Nanos) -> Judgement {
        Judgement::Healthy
    }
    fn describe(&self, _: Nanos) -> crate::policy::Description {
        Default::default()
    }
    fn reset(&self) {}
    fn calls_needed(&self) -> Option<&dyn crate::policy::CallsNeeded> {
        Some(self)
    }
}

impl crate::policy::CallsNeeded for WantsFive {
    fn calls_wanted(&self, _: Nanos) -> u64 {
        5
    }
}

#[test]
fn calls_are_wanted_after_a_failure_while_an_ejection_is_possible() {
    let notifier = Arc::new(Notifier::new());
    let record = EndpointRecord::new(
        Clock::tokio(),
        Box::new([Box::new(WantsFive) as Box<dyn EndpointPolicy>]),
        notifier.clone(),
    );
    let now = record.clock().now();
    assert_eq!(record.calls_wanted(now), 0, "not after a success");
    call(&record, Outcome::Failure(FailureKind::Overload), 1, now);
    assert_eq!(
        record.calls_wanted(now),
        5,
        "503 and UNAVAILABLE are judged like any fast failure"
    );
    notifier.set_room_to_eject(false);
    assert_eq!(
        record.calls_wanted(now),
        0,
        "not when no ejection is possible"
    );
    notifier.set_room_to_eject(true);
    call(&record, Outcome::Failure(FailureKind::Transport), 1, now);
    assert_eq!(record.calls_wanted(now), 5);
    call(&record, Outcome::Failure(FailureKind::Timeout), 1000, now);
    assert_eq!(
        record.calls_wanted(now),
        0,
        "not after a timeout: each call sent on purpose would cost a caller a timeout"
    );
}

fn estimate_ms(record: &EndpointRecord, now: Nanos) -> f64 {
    record.rtt_estimate(now) / MS as f64
}

#[test]
fn the_first_call_moves_the_estimate_as_an_average_not_as_a_peak() {
    let record = record();
    let now = record.clock().now();
    record.seed_rtt(MS as f64, now);
    // A 41 ms first call (a TCP and HTTP/2 handshake against 1 ms calls): an eighth of the
    // way, not all of it.
    call(&record, Outcome::Success, 41, now);
    assert!((estimate_ms(&record, now) - 6.0).abs() < 0.01);
    // The second is a sample like any other.
    call(&record, Outcome::Success, 41, now);
    assert!((estimate_ms(&record, now) - 41.0).abs() < 0.01);
    // Re-admission (a new seed) makes the next call a first call again.
    record.seed_rtt(MS as f64, now);
    call(&record, Outcome::Success, 41, now);
    assert!((estimate_ms(&record, now) - 6.0).abs() < 0.01);
    // A first call that times out is taken as it is: a black hole must not look fast.
    record.seed_rtt(MS as f64, now);
    call(&record, Outcome::Failure(FailureKind::Timeout), 1000, now);
    assert!((estimate_ms(&record, now) - 1000.0).abs() < 0.01);
}

#[test]
fn fast_failures_double_the_estimate_up_to_a_cap_and_a_success_restores_it() {
    let record = warm_record();
    let now = record.clock().now();
    record.seed_rtt(MS as f64, now);
    call(&record, Outcome::Success, 1, now);
    // Refused connections answer in microseconds: each doubles the estimate instead of
    // lowering it, so the endpoint loses every pairing with a healthy 1 ms one.
    let mut expected = 1.0;
    for _ in 0..4 {
        call(&record, Outcome::Failure(FailureKind::Transport), 0, now);
        expected *= 2.0;
        assert!((estimate_ms(&record, now) - expected).abs() < 0.01);
    }
    for _ in 0..10 {
        call(&record, Outcome::Failure(FailureKind::ServerError), 0, now);
    }
    assert!(
        (estimate_ms(&record, now) - 16.0).abs() < 0.01,
        "capped at 16 times the estimate before the failures"
    );
    // Back: the speed it had before, not an eighth of the way down from the penalty.
    call(&record, Outcome::Success, 1, now);
    assert!((estimate_ms(&record, now) - 1.0).abs() < 0.01);
    // A failure slower than the cap is taken as it is.
    call(&record, Outcome::Failure(FailureKind::ServerError), 50, now);
    assert!((estimate_ms(&record, now) - 50.0).abs() < 0.01);
}

#[test]
fn one_slow_call_is_a_peak_to_confirm() {
    let record = warm_record();
    let mut now = record.clock().now();
    record.seed_rtt(MS as f64, now);
    serial(&record, Outcome::Success, 1, &mut now);
    assert!(!record.peak_unconfirmed());
    serial(&record, Outcome::Success, 1000, &mut now);
    assert!(
        record.peak_unconfirmed(),
        "a jump far above a fresh estimate"
    );
    serial(&record, Outcome::Success, 1, &mut now);
    assert!(record.peak_unconfirmed(), "a fast call does not confirm it");
    serial(&record, Outcome::Success, 800, &mut now);
    assert!(!record.peak_unconfirmed(), "a slow one does");
    // An idle endpoint's decayed estimate: a slow call then is how a balancer tries a slow
    // endpoint again, not a healthy endpoint's accident.
    let later = now + 120_000 * MS;
    call(&record, Outcome::Success, 1, later);
    let much_later = later + 120_000 * MS;
    call(&record, Outcome::Success, 1000, much_later);
    assert!(!record.peak_unconfirmed());
    call(
        &record,
        Outcome::Failure(FailureKind::Transport),
        1,
        much_later,
    );
    assert!(
        !record.peak_unconfirmed(),
        "never while the last call failed"
    );
}

#[test]
fn a_call_of_a_few_times_the_usual_does_not_confirm_a_far_higher_peak() {
    let record = warm_record();
    let mut now = record.clock().now();
    // A call three times the usual (a loaded machine's) does not confirm a peak twenty times the
    // usual: the endpoint stays explored, and its calls bring the estimate down.
    record.seed_rtt(MS as f64, now);
    serial(&record, Outcome::Success, 1, &mut now);
    serial(&record, Outcome::Success, 20, &mut now);
    assert!(record.peak_unconfirmed());
    serial(&record, Outcome::Success, 3, &mut now);
    assert!(
        record.peak_unconfirmed(),
        "a call of 3 ms does not confirm an estimate of 17.9 ms"
    );
    // A fast call between them starts the count again.
    serial(&record, Outcome::Success, 1, &mut now);
    for _ in 0..3 {
        serial(&record, Outcome::Success, 3, &mut now);
    }
    assert!(record.peak_unconfirmed(), "three in a row do not");
    serial(&record, Outcome::Success, 3, &mut now);
    assert!(
        !record.peak_unconfirmed(),
        "the fourth slow call in a row confirms it: the endpoint is slow now, if not that slow"
    );
}

#[test]
fn a_slow_endpoint_far_below_its_jump_is_explored_four_calls_at_most() {
    let record = warm_record();
    let mut now = record.clock().now();
    record.seed_rtt(MS as f64, now);
    serial(&record, Outcome::Success, 1, &mut now);
    // One 2 s stall, then a steady 20 ms: confirming by the estimate alone would take about 35
    // explored calls of 20 ms (the estimate coming down by an eighth each).
    serial(&record, Outcome::Success, 2000, &mut now);
    let mut explored = 0;
    while record.peak_unconfirmed() {
        serial(&record, Outcome::Success, 20, &mut now);
        explored += 1;
        assert!(explored <= 4, "still unconfirmed after {explored} calls");
    }
    assert_eq!(explored, 4);
}

#[test]
fn evidence_is_wanted_only_after_a_failure_other_than_overload() {
    let record = record();
    let now = record.clock().now();
    assert!(!record.last_call_failed());
    call(&record, Outcome::Failure(FailureKind::Timeout), 1000, now);
    assert!(record.last_call_failed());
    call(&record, Outcome::Failure(FailureKind::Overload), 1, now);
    assert!(record.last_call_failed());
    call(&record, Outcome::Cancelled, 1, now);
    assert!(
        record.last_call_failed(),
        "a cancelled call is not recorded"
    );
    record.reset();
    assert!(!record.last_call_failed(), "re-admission starts afresh");
}

/// A policy that shares its window and counts the calls that reach its `record`.
#[derive(Debug)]
struct Sharing {
    shared: Arc<SharedWindow>,
    recorded: AtomicU64,
}

impl EndpointPolicy for Sharing {
    fn record(&self, observation: &Observation, now: Nanos) -> Signal {
        self.recorded.fetch_add(1, Ordering::Relaxed);
        self.shared
            .window()
            .record(now, observation.outcome.is_failure(), false);
        Signal::None
    }
    fn judge(&self, _: Nanos) -> Judgement {
        Judgement::Healthy
    }
    fn describe(&self, now: Nanos) -> crate::policy::Description {
        crate::policy::Description {
            counts: self.shared.window().counts(now),
            ..Default::default()
        }
    }
    fn reset(&self) {}
    fn shared_window(&self) -> Option<Arc<SharedWindow>> {
        Some(self.shared.clone())
    }
}

#[test]
fn successes_not_watched_are_counted_once_without_the_policy() {
    let shared = Arc::new(SharedWindow::new(
        crate::window::Window::new(Duration::from_secs(10), 10).unwrap(),
    ));
    let sharing = Box::new(Sharing {
        shared: shared.clone(),
        recorded: AtomicU64::new(0),
    });
    let record = EndpointRecord::new(
        Clock::tokio(),
        Box::new([Box::new(WantsFive) as Box<dyn EndpointPolicy>, sharing]),
        Arc::new(Notifier::new()),
    );
    let now = record.clock().now();
    let recorded = |record: &EndpointRecord| {
        (&*record.policies()[1] as &dyn std::any::Any)
            .downcast_ref::<Sharing>()
            .unwrap()
            .recorded
            .load(Ordering::Relaxed)
    };
    call(&record, Outcome::Success, 1, now);
    call(&record, Outcome::Success, 1, now);
    assert_eq!(recorded(&record), 0, "plain successes skip the policy");
    call(&record, Outcome::Failure(FailureKind::Timeout), 1, now);
    assert_eq!(recorded(&record), 1, "failures reach it");
    shared.set_watching(true);
    call(&record, Outcome::Success, 1, now);
    assert_eq!(recorded(&record), 2, "successes reach it while it watches");
    shared.set_watching(false);
    record.observe(
        &Observation {
            outcome: Outcome::Success,
            latency: Duration::from_millis(1),
        },
        now,
        1,
    );
    assert_eq!(
        recorded(&record),
        3,
        "a call holding probe permits reaches it"
    );
    call(&record, Outcome::Cancelled, 1, now);
    let counts = shared.window().counts(now);
    assert_eq!(
        (counts.calls, counts.failures),
        (5, 1),
        "each call counted once"
    );
}

#[test]
fn calls_that_waited_through_the_same_stall_do_not_confirm_its_peak() {
    let record = warm_record();
    let mut now = record.clock().now();
    record.seed_rtt(MS as f64, now);
    serial(&record, Outcome::Success, 1, &mut now);
    // Eight calls in flight when the process (or the server) stalls for 100 ms: they all end
    // together, each about 100 ms. The first is a jump; the others share its cause.
    now += 100 * MS;
    for latency in [100, 99, 99, 98, 98, 97, 97, 96] {
        call(&record, Outcome::Success, latency, now);
    }
    assert!(
        record.peak_unconfirmed(),
        "calls begun before the jump was seen are no evidence of it: the endpoint stays explored"
    );
    // A call begun after the stall and as slow confirms it: the endpoint is slow.
    serial(&record, Outcome::Success, 90, &mut now);
    assert!(!record.peak_unconfirmed());
}
