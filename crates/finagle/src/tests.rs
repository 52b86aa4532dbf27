use std::time::Duration;

use tower_outlier_core::{
    Dice, EndpointPolicy, FailureKind, Judgement, Nanos, Observation, Outcome, OutlierPolicy,
    Signal,
};

use super::*;

const MS: Nanos = 1_000_000;
const SECOND: Nanos = 1_000_000_000;

fn call(ok: bool) -> Observation {
    Observation {
        outcome: if ok {
            Outcome::Success
        } else {
            Outcome::Failure(FailureKind::ServerError)
        },
        latency: Duration::from_millis(1),
    }
}

#[test]
fn equal_jitter_doubles_its_half_and_sticks_at_the_maximum() {
    let backoff = EqualJitter::finagle();
    let dice = Dice::new(3);
    for _ in 0..200 {
        assert_eq!(backoff.duration(0, &dice), Duration::from_secs(5));
        for attempt in 1..7u32 {
            let half = Duration::from_secs(5) * (1 << (attempt - 1));
            let got = backoff.duration(attempt, &dice);
            let top = (half * 2).min(Duration::from_secs(300));
            assert!(got >= half && got <= top, "attempt {attempt}: {got:?}");
        }
        assert_eq!(backoff.duration(7, &dice), Duration::from_secs(300));
        assert_eq!(backoff.duration(u32::MAX, &dice), Duration::from_secs(300));
    }
    // The jitter is drawn: not always the same.
    let draws: std::collections::HashSet<Duration> =
        (0..20).map(|_| backoff.duration(3, &dice)).collect();
    assert!(draws.len() > 10);
    assert!(EqualJitter::new(Duration::ZERO, Duration::from_secs(1)).is_err());
    assert!(EqualJitter::new(Duration::from_secs(2), Duration::from_secs(1)).is_err());
}

/// Calls every `every` from `from` for `span`, `ok` or not: the time of the first that signals.
fn until_signal(
    state: &dyn EndpointPolicy,
    ok: bool,
    from: Nanos,
    span: Nanos,
    every: Nanos,
) -> Option<Nanos> {
    let mut now = from;
    while now < from + span {
        if state.record(&call(ok), now) == Signal::Evaluate {
            return Some(now);
        }
        now += every;
    }
    None
}

#[test]
fn a_success_rate_falling_from_one_trips_after_window_times_ln_one_point_two_five() {
    let policy = SuccessRateAccrual::default_finagle().seeded(1);
    let state = policy.new_endpoint();
    assert_eq!(until_signal(&state, true, 0, 40 * SECOND, 10 * MS), None);
    let tripped = until_signal(&state, false, 40 * SECOND, 20 * SECOND, 10 * MS).unwrap();
    let after = (tripped - 40 * SECOND) as f64 / SECOND as f64;
    let expected = 30.0 * (1.0f64 / 0.8).ln();
    assert!(
        (after - expected).abs() < 0.05,
        "{after} s, {expected} s expected"
    );
    // Whatever the rate: one call a second crosses at the same time, to the second (6.69 s after
    // the last success, at 39 s: the failure at 46 s).
    let state = policy.new_endpoint();
    until_signal(&state, true, 0, 40 * SECOND, SECOND);
    let tripped = until_signal(&state, false, 40 * SECOND, 20 * SECOND, SECOND).unwrap();
    assert_eq!(tripped, 46 * SECOND);
    let Judgement::Outlier(reason) = state.judge(tripped) else {
        panic!("fired");
    };
    assert_eq!(reason.policy, "success-rate-ema");
    assert!(reason.value < 0.8 && reason.value > 0.78, "{reason:?}");
}

#[test]
fn the_success_rate_is_judged_only_after_a_whole_window_and_with_the_minimum() {
    let policy = SuccessRateAccrual::default_finagle();
    // Failing from its first call: not before 30 s.
    let state = policy.new_endpoint();
    let tripped = until_signal(&state, false, SECOND, 60 * SECOND, 100 * MS).unwrap();
    assert_eq!(tripped, 31 * SECOND);
    // Four calls in the window: never.
    let state = policy.new_endpoint();
    assert_eq!(
        until_signal(&state, false, 0, 120 * SECOND, 8 * SECOND),
        None
    );
    // Five: yes.
    let state = policy.new_endpoint();
    assert!(until_signal(&state, false, 0, 120 * SECOND, 6 * SECOND).is_some());
}

#[test]
fn consecutive_failures_trip_at_the_nth_and_a_success_resets_them() {
    let policy = ConsecutiveFailuresAccrual::default_finagle().seeded(2);
    let state = policy.new_endpoint();
    for _ in 0..4 {
        assert_eq!(state.record(&call(false), 0), Signal::None);
    }
    state.record(&call(true), 0);
    for _ in 0..4 {
        assert_eq!(state.record(&call(false), 0), Signal::None);
    }
    assert_eq!(state.record(&call(false), 0), Signal::Evaluate);
    assert!(matches!(state.judge(0), Judgement::Outlier(_)));
}

#[test]
fn the_back_off_moves_on_until_a_success_revives_the_endpoint() {
    let policy = ConsecutiveFailuresAccrual::default_finagle().seeded(4);
    let state = policy.new_endpoint();
    let timing = state.own_timing().unwrap();
    for _ in 0..5 {
        state.record(&call(false), 0);
    }
    assert_eq!(timing.check_at(0), Some(5 * SECOND), "the first time out");
    assert_eq!(timing.check_at(0), None, "asked once per ejection");
    // Back after it: its first failure marks it dead again, for 5–10 s.
    state.reset();
    assert!(matches!(state.judge(5 * SECOND), Judgement::Healthy));
    assert_eq!(state.record(&call(false), 5 * SECOND), Signal::Evaluate);
    let next = timing.check_at(5 * SECOND).unwrap() - 5 * SECOND;
    assert!((5 * SECOND..10 * SECOND).contains(&next), "{next}");
    // A failed probe: 10–20 s.
    let next = timing.check_after_failed_probe(1, 0).unwrap();
    assert!((10 * SECOND..20 * SECOND).contains(&next), "{next}");
    // A success revives it: the count and the back-off start again.
    state.reset();
    state.record(&call(true), 30 * SECOND);
    for _ in 0..4 {
        assert_eq!(state.record(&call(false), 30 * SECOND), Signal::None);
    }
    assert_eq!(state.record(&call(false), 30 * SECOND), Signal::Evaluate);
    assert_eq!(timing.check_at(30 * SECOND), Some(35 * SECOND));
}

#[test]
fn a_refused_ejection_fires_again_on_the_next_failure() {
    let policy = ConsecutiveFailuresAccrual::default_finagle();
    let state = policy.new_endpoint();
    for _ in 0..5 {
        state.record(&call(false), 0);
    }
    state.own_timing().unwrap().ejection_refused(0);
    assert!(matches!(state.judge(0), Judgement::Healthy));
    assert_eq!(state.record(&call(false), 0), Signal::Evaluate);
}

#[test]
fn the_hybrid_marks_dead_for_the_longer_of_the_two_times() {
    let policy = finagle_seeded(9);
    assert_eq!(policy.name(), "finagle");
    let state = policy.new_endpoint();
    let timing = state.own_timing().unwrap();
    // 40 s of successes, then failures every 10 ms: the consecutive rule trips at the fifth.
    until_signal(&state, true, 0, 40 * SECOND, 10 * MS);
    let tripped = until_signal(&state, false, 40 * SECOND, 20 * SECOND, 10 * MS).unwrap();
    assert_eq!(tripped, 40 * SECOND + 40 * MS);
    let Judgement::Outlier(reason) = state.judge(tripped) else {
        panic!("fired");
    };
    assert_eq!(reason.policy, "consecutive-failures");
    assert_eq!(timing.check_at(tripped), Some(tripped + 5 * SECOND));
    // Back, failing, through both rules' time: the success rate is below 0.8 too, and both mark
    // it dead. Each rule's back-off has moved on once; the longer time wins.
    state.reset();
    let now = 55 * SECOND;
    assert_eq!(state.record(&call(false), now), Signal::Evaluate);
    let Judgement::Outlier(_) = state.judge(now) else {
        panic!("both fired");
    };
    let members = state.members(now);
    assert_eq!(members.len(), 2);
    let out = timing.check_at(now).unwrap() - now;
    // The success-rate rule's first (5 s) against the consecutive rule's second (5–10 s).
    assert!((5 * SECOND..10 * SECOND).contains(&out), "{out}");
}

// ---- red team ----

#[test]
fn two_threads_recording_at_once_lose_no_failure() {
    // Both threads record failures at the same stamps: every call moves the average, none is lost,
    // and it never becomes NaN.
    let policy = SuccessRateAccrual::default_finagle().seeded(1);
    let state = std::sync::Arc::new(policy.new_endpoint());
    let s = state.clone();
    let t = std::thread::spawn(move || {
        for i in 0..200_000u64 {
            s.record(&call(i % 2 == 0), i * MS);
        }
    });
    for i in 0..200_000u64 {
        state.record(&call(i % 3 == 0), i * MS);
    }
    t.join().unwrap();
    let rate = state.success_rate();
    assert!(rate.is_finite() && (0.0..=1.0).contains(&rate), "{rate}");
}

#[test]
fn a_streak_broken_by_a_success_no_longer_judges_the_endpoint() {
    // Fired at the 2nd failure in a row, but the layer never acted on it (a composition's other
    // members did not agree); a success then ends the streak.
    let policy = ConsecutiveFailuresAccrual::new(2).unwrap().seeded(1);
    let state = policy.new_endpoint();
    state.record(&call(false), 0);
    assert_eq!(state.record(&call(false), MS), Signal::Evaluate);
    for i in 0..1000 {
        state.record(&call(true), 2 * MS + i * MS);
    }
    assert_eq!(
        state.judge(3600 * SECOND),
        Judgement::Healthy,
        "a thousand successes after the streak"
    );
}
