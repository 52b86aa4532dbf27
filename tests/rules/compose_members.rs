//! What each member of a composition judges, and how an endpoint it judged comes back, on tokio's
//! paused clock through a real p2c `Balance`: a healed replica passes its trial whatever the
//! members' order (the member that saw the calls judges it); a streak that ended long ago no
//! longer counts in all of; a fleet member inside a nested composition ejects the slow replica; a
//! slow-call breaker in any of or all of probes and returns the healed replica, and one open alone
//! in all of keeps it serving; a failed probe times the next check by the member that judged, the
//! same rules re-applied while it was out or not.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tower::balance::p2c::Balance;
use tower::ServiceExt;
use tower_outlier::latency::{LatencyConfig, LatencyPolicy};
use tower_outlier::{
    ComposedPolicy, ComposedPolicyBuilder, EndpointStatus, ErrorRateConfig, ErrorRatePolicy,
    OutlierDetectionLayer,
};

use super::compose::{consecutive, error_rate, fleet, latency};
use crate::support::{announce, ejected, traffic, SeededRng};

/// #0 fails every call until ejected, then heals; the status it reaches after `heal_for` of
/// healthy traffic.
async fn after_healing(
    case: &str,
    composed: ComposedPolicyBuilder,
    heal_for: Duration,
) -> (EndpointStatus, String) {
    let (monitor, replicas, mut balancer) = fleet(composed);
    traffic(&mut balancer, 100, Duration::from_secs(2)).await;
    replicas[0].failing.store(true, Ordering::SeqCst);
    let mut waited = Duration::ZERO;
    while ejected(&monitor).is_empty() {
        traffic(&mut balancer, 100, Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
        assert!(waited < Duration::from_secs(20), "{case}: never ejected");
    }
    replicas[0].failing.store(false, Ordering::SeqCst);
    traffic(&mut balancer, 100, heal_for).await;
    let shown = monitor.snapshot().get("0").unwrap().clone();
    // It fails again: a new incident, or a relapse on a trial that never ended?
    replicas[0].failing.store(true, Ordering::SeqCst);
    while ejected(&monitor).is_empty() {
        traffic(&mut balancer, 100, Duration::from_millis(100)).await;
    }
    let again = monitor.snapshot().get("0").unwrap().clone();
    (
        shown.status,
        format!(
            "{shown:#?}\nejected again with failed_checks {} next_check_in {:?}",
            again.failed_checks, again.next_check_in
        ),
    )
}

#[tokio::test(start_paused = true)]
async fn a_healed_replica_passes_its_trial_whatever_the_members_order() {
    // The same two members in either order: the trial passes.
    let cases = [
        (
            "error rate first",
            ComposedPolicy::any_of()
                .member(error_rate())
                .member(consecutive(5)),
        ),
        (
            "streak first",
            ComposedPolicy::any_of()
                .member(consecutive(5))
                .member(error_rate()),
        ),
    ];
    for (name, composed) in cases {
        let (status, shown) = after_healing(name, composed, Duration::from_secs(180)).await;
        eprintln!("{name}: {}", shown.lines().last().unwrap());
        assert_eq!(status, EndpointStatus::Available, "{name}: {shown}");
    }
}

#[tokio::test(start_paused = true)]
async fn all_of_does_not_count_a_streak_that_ended_long_ago() {
    // #1 fails a burst of calls (a streak of 5 or more, an error rate far below the bar), serves
    // fine for a minute, then fails two calls of three (never 5 in a row): the error rate alone
    // judges it, and all of them are needed.
    let all = ComposedPolicy::all_of()
        .member(error_rate())
        .member(consecutive(5));
    let (monitor, replicas, mut balancer) = fleet(all);
    traffic(&mut balancer, 200, Duration::from_secs(2)).await;
    let before = replicas[1].calls.load(Ordering::SeqCst);
    replicas[1].failing.store(true, Ordering::SeqCst);
    while replicas[1].calls.load(Ordering::SeqCst) < before + 5 {
        traffic(&mut balancer, 200, Duration::from_millis(20)).await;
    }
    replicas[1].failing.store(false, Ordering::SeqCst);
    traffic(&mut balancer, 200, Duration::from_secs(60)).await;
    let shown = monitor.snapshot().get("1").unwrap().clone();
    assert!(
        ejected(&monitor).is_empty(),
        "{:?} {shown:#?}",
        ejected(&monitor)
    );
    assert_eq!(
        shown.windows[0].members[1].counts.calls, 0,
        "the streak is over: {shown:#?}"
    );
    replicas[1].flaky.store(true, Ordering::SeqCst);
    traffic(&mut balancer, 200, Duration::from_secs(20)).await;
    let shown = monitor.snapshot().get("1").unwrap().clone();
    assert!(
        ejected(&monitor).is_empty(),
        "#1 never failed 5 in a row since its burst a minute ago: {:?}",
        shown.last_reason
    );
}

#[tokio::test(start_paused = true)]
async fn a_nested_composition_with_a_fleet_member_ejects_the_slow_replica() {
    let cases = [
        ("the recommended latency rule", latency()),
        (
            "D2's latency rule",
            LatencyPolicy::new(LatencyConfig::d2().min_calls(5).build().unwrap()),
        ),
    ];
    for (name, latency) in cases {
        let nested = ComposedPolicy::any_of().member(error_rate()).member(
            ComposedPolicy::any_of()
                .name("inner")
                .member(latency)
                .build()
                .unwrap(),
        );
        let (monitor, replicas, mut balancer) = fleet(nested);
        replicas[0].latency_ms.store(30, Ordering::SeqCst);
        let mut out = Vec::new();
        for _ in 0..16 {
            traffic(&mut balancer, 200, Duration::from_secs(1)).await;
            out.extend(ejected(&monitor));
        }
        out.dedup();
        assert_eq!(out, vec!["0".to_owned()], "{name}");
        let shown = monitor.snapshot().get("0").unwrap().clone();
        assert_eq!(shown.last_reason.unwrap().policy, "latency", "{name}");
    }
}

/// Sentinel's slow-call breaker, which gates readiness with its half-open probe.
fn breaker() -> tower_outlier::slow_call::SlowCallPolicy {
    use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
    SlowCallPolicy::new(
        BreakerConfig::slow_ratio(Duration::from_millis(500))
            .ratio(1.0)
            .min_calls(3)
            .window(Duration::from_secs(5))
            .open_duration(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
}

mod with_a_breaker {
    use super::*;
    use crate::support::Sleepy;
    use tower::buffer::Buffer;
    use tower_outlier::policy::{BudgetFloor, EjectionBudget};

    async fn load<S>(balancer: &Buffer<(), S>, workers: usize, span: Duration) -> usize
    where
        S: std::future::Future<Output = Result<usize, tower::BoxError>> + Send + 'static,
    {
        let until = tokio::time::Instant::now() + span;
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let balancer = balancer.clone();
                tokio::spawn(async move {
                    let mut sent = 0;
                    while tokio::time::Instant::now() < until {
                        let _ = balancer.clone().oneshot(()).await;
                        sent += 1;
                    }
                    sent
                })
            })
            .collect();
        let mut sent = 0;
        for handle in handles {
            sent += handle.await.unwrap();
        }
        sent
    }

    /// #3 slow (and failing, if `failing`) until ejected, then healed: it must come back.
    async fn slow_then_healed(case: &str, composed: ComposedPolicyBuilder, failing: bool) {
        let backends: Vec<(usize, Sleepy)> = (0..4)
            .map(|id| (id, Sleepy::new(id, if id == 3 { 600 } else { 100 })))
            .collect();
        let layer = OutlierDetectionLayer::new(composed.build().unwrap())
            .budget(EjectionBudget::new(0.5, BudgetFloor::One).unwrap());
        let monitor = layer.monitor();
        monitor.on_event(|event| eprintln!("{:?} {event:?}", tokio::time::Instant::now()));
        let balancer = Buffer::new(
            Balance::from_rng(
                tower::Layer::layer(&layer, announce(&backends)),
                SeededRng(3),
            ),
            64,
        );
        let slow = backends[3].1.clone();
        slow.failing.store(failing, Ordering::SeqCst);
        let mut waited = Duration::ZERO;
        while ejected(&monitor).is_empty() {
            load(&balancer, 16, Duration::from_millis(500)).await;
            waited += Duration::from_millis(500);
            assert!(
                waited < Duration::from_secs(60),
                "{case}: never ejected: {:#?}",
                monitor.snapshot().get("3")
            );
        }
        slow.set_latency(100);
        slow.failing.store(false, Ordering::SeqCst);
        load(&balancer, 16, Duration::from_secs(150)).await;
        let before = slow.calls();
        load(&balancer, 16, Duration::from_secs(5)).await;
        let shown = monitor.snapshot().get("3").unwrap().clone();
        assert_eq!(
            shown.status,
            EndpointStatus::Available,
            "{case}: {shown:#?}"
        );
        assert_eq!(
            shown.windows[0].members[0].state,
            Some("CLOSED"),
            "{case}: {shown:#?}"
        );
        assert!(
            slow.calls() - before > 100,
            "{case}: healed #3 got {} calls in 5 s",
            slow.calls() - before
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_breaker_in_a_composition_probes_and_returns_the_healed_replica() {
        // (the case, the composition, whether #3 also fails while slow: all of needs both
        // members to judge it)
        let cases = [
            (
                "any of, #3 slow",
                ComposedPolicy::any_of()
                    .member(breaker())
                    .member(error_rate()),
                false,
            ),
            (
                "all of, #3 slow and failing",
                ComposedPolicy::all_of()
                    .member(breaker())
                    .member(error_rate()),
                true,
            ),
        ];
        for (name, composed, failing) in cases {
            slow_then_healed(name, composed, failing).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn all_of_a_breaker_alone_open_keeps_the_replica_serving() {
        // Slow but not failing: the breaker opens, the error rate disagrees; #3 stays in, and
        // must not be held unready.
        let backends: Vec<(usize, Sleepy)> = (0..4)
            .map(|id| (id, Sleepy::new(id, if id == 3 { 600 } else { 100 })))
            .collect();
        let layer = OutlierDetectionLayer::new(
            ComposedPolicy::all_of()
                .member(breaker())
                .member(error_rate())
                .build()
                .unwrap(),
        )
        .budget(EjectionBudget::new(0.5, BudgetFloor::One).unwrap());
        let monitor = layer.monitor();
        let balancer = Buffer::new(
            Balance::from_rng(
                tower::Layer::layer(&layer, announce(&backends)),
                SeededRng(3),
            ),
            64,
        );
        let slow = backends[3].1.clone();
        load(&balancer, 16, Duration::from_secs(30)).await;
        assert!(ejected(&monitor).is_empty());
        let shown = monitor.snapshot().get("3").unwrap().clone();
        eprintln!(
            "{shown:#?} max in flight {}",
            slow.max_in_flight.load(Ordering::SeqCst)
        );
        // It heals: the breaker must close and it must take its share.
        slow.set_latency(100);
        load(&balancer, 16, Duration::from_secs(30)).await;
        let before = slow.calls();
        load(&balancer, 16, Duration::from_secs(5)).await;
        let shown = monitor.snapshot().get("3").unwrap().clone();
        assert_eq!(
            shown.windows[0].members[0].state,
            Some("CLOSED"),
            "{shown:#?}"
        );
        assert!(
            slow.calls() - before > 100,
            "healed #3 got {} calls in 5 s",
            slow.calls() - before
        );
    }
}

mod harnessed {
    use super::*;
    use crate::support::Harness;
    use tower_outlier::probe::{probe_fn, ProbeFuture};

    fn composed() -> ComposedPolicy {
        ComposedPolicy::any_of()
            .member(ErrorRatePolicy::new(
                ErrorRateConfig::hsf().build().unwrap(),
            ))
            .member(consecutive(5))
            .build()
            .unwrap()
    }

    /// #0 fails 5 in a row (the streak alone judges it: the error rate needs 10 calls), out for
    /// 5 s; optionally the rules are replaced by the same composition while it is out; its probe
    /// then fails. The time to the next check.
    async fn after_failed_probe(case: &str, reconfigure: bool) -> Duration {
        let layer = OutlierDetectionLayer::new(composed()).probe(probe_fn(
            |_: &usize, _: crate::support::Backend| -> ProbeFuture { Box::pin(async { false }) },
        ));
        let monitor = layer.monitor();
        let rules = layer.rules();
        let mut h = Harness::new(&layer, 4);
        h.calls(0, 5, 0).await;
        assert!(!h.is_live(0), "{case}");
        let shown = monitor.snapshot().get("0").unwrap().clone();
        assert_eq!(
            shown.last_reason.unwrap().policy,
            "consecutive-failures",
            "{case}"
        );
        assert_eq!(shown.next_check_in, Some(Duration::from_secs(5)), "{case}");
        if reconfigure {
            rules.replace(0, composed()).unwrap();
            h.sync();
        }
        h.advance(Duration::from_secs(5)).await;
        h.sync();
        tokio::task::yield_now().await;
        h.sync();
        let shown = monitor.snapshot().get("0").unwrap().clone();
        assert_eq!(shown.status, EndpointStatus::Ejected, "{case}: {shown:#?}");
        assert_eq!(shown.failed_checks, 1, "{case}");
        shown.next_check_in.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_times_the_next_check_by_the_member_that_judged() {
        let cases = [
            ("as configured", false),
            ("the same rules re-applied while it was out", true),
        ];
        let mut times = Vec::new();
        for (name, reconfigure) in cases {
            let next = after_failed_probe(name, reconfigure).await;
            times.push((name, next));
            assert!(
                next <= Duration::from_secs(10),
                "{name}: {next:?} (every case so far: {times:?})"
            );
        }
    }
}
