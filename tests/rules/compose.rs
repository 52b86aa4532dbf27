//! Policies composed (`ComposedPolicy`: any of, all of, k of n), on tokio's paused clock through a
//! real p2c `Balance` with open-loop traffic: each rule decides what it should, the members show
//! in the snapshot, and an endpoint several members judge at once is out for the longest of their
//! times.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::balance::p2c::Balance;
use tower::Service;
use tower_outlier::finagle::{ConsecutiveFailuresAccrual, EqualJitter};
use tower_outlier::latency::{LatencyConfig, LatencyPolicy};
use tower_outlier::{
    ComposedPolicy, ComposedPolicyBuilder, ErrorRateConfig, ErrorRatePolicy, Monitor,
    OutlierDetectionLayer,
};

use crate::support::{announce, ejected, traffic, SeededRng};

/// A replica answering its id after `latency_ms` on tokio's clock, or refusing the call (after
/// the same time) while `failing`, or two calls of three while `flaky`.
#[derive(Clone, Debug)]
pub(super) struct Replica {
    pub(super) id: usize,
    pub(super) latency_ms: Arc<AtomicU64>,
    pub(super) failing: Arc<AtomicBool>,
    pub(super) flaky: Arc<AtomicBool>,
    pub(super) calls: Arc<AtomicU64>,
}

impl Replica {
    pub(super) fn new(id: usize) -> Self {
        Replica {
            id,
            latency_ms: Arc::new(AtomicU64::new(10)),
            failing: Arc::default(),
            flaky: Arc::default(),
            calls: Arc::default(),
        }
    }
}

impl Service<()> for Replica {
    type Response = usize;
    type Error = io::Error;
    type Future = futures::future::BoxFuture<'static, Result<usize, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        let latency = Duration::from_millis(self.latency_ms.load(Ordering::SeqCst));
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let failing = self.failing.load(Ordering::SeqCst)
            || (self.flaky.load(Ordering::SeqCst) && !call.is_multiple_of(3));
        let id = self.id;
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            if failing {
                Err(io::Error::from(io::ErrorKind::ConnectionRefused))
            } else {
                Ok(id)
            }
        })
    }
}

pub(super) fn error_rate() -> ErrorRatePolicy {
    ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .max_ejection_ratio(0.4)
            .build()
            .unwrap(),
    )
}

pub(super) fn latency() -> LatencyPolicy {
    LatencyPolicy::new(LatencyConfig::recommended().min_calls(5).build().unwrap())
}

pub(super) fn consecutive(backoff_secs: u64) -> ConsecutiveFailuresAccrual {
    ConsecutiveFailuresAccrual::new(5)
        .unwrap()
        .backoff(
            EqualJitter::new(Duration::from_secs(backoff_secs), Duration::from_secs(300)).unwrap(),
        )
        .seeded(1)
}

/// Five replicas behind the composition: the monitor, the replicas, and the balancer.
pub(super) fn fleet(
    composed: ComposedPolicyBuilder,
) -> (
    Monitor,
    Vec<Replica>,
    impl Service<(), Response = usize, Error = tower::BoxError, Future: Send + 'static>,
) {
    let layer = OutlierDetectionLayer::new(composed.build().unwrap());
    let monitor = layer.monitor();
    let replicas: Vec<Replica> = (0..5).map(Replica::new).collect();
    let keyed: Vec<(usize, Replica)> = replicas.iter().map(|r| (r.id, r.clone())).collect();
    let balancer = Balance::from_rng(tower::Layer::layer(&layer, announce(&keyed)), SeededRng(5));
    (monitor, replicas, balancer)
}

#[tokio::test(start_paused = true)]
async fn a_slow_replica_is_ejected_by_any_of_and_kept_by_all_of() {
    let any = ComposedPolicy::any_of()
        .member(error_rate())
        .member(latency());
    let (monitor, replicas, mut balancer) = fleet(any);
    replicas[0].latency_ms.store(30, Ordering::SeqCst);
    traffic(&mut balancer, 200, Duration::from_secs(16)).await;
    assert_eq!(ejected(&monitor), vec!["0".to_owned()]);
    let shown = monitor.snapshot().get("0").unwrap().clone();
    assert_eq!(
        shown.last_reason.unwrap().policy,
        "latency",
        "the member that judged"
    );
    let window = &shown.windows[0];
    assert_eq!(window.policy, "any-of");
    assert_eq!(
        window.members.iter().map(|m| m.policy).collect::<Vec<_>>(),
        vec!["error-rate", "latency"]
    );
    // All of them: the slow replica's error rate is nil, it stays.
    let all = ComposedPolicy::all_of()
        .member(error_rate())
        .member(latency());
    let (monitor, replicas, mut balancer) = fleet(all);
    replicas[0].latency_ms.store(30, Ordering::SeqCst);
    traffic(&mut balancer, 200, Duration::from_secs(30)).await;
    assert!(ejected(&monitor).is_empty(), "{:?}", ejected(&monitor));
}

#[tokio::test(start_paused = true)]
async fn all_of_ejects_a_replica_every_member_judges_and_keeps_one_judged_by_some() {
    // The error rate and a streak of five: #0 fails every call (both judge it), #1 two calls of
    // three, never five in a row (the error rate alone).
    let all = ComposedPolicy::all_of()
        .member(error_rate())
        .member(consecutive(5));
    let (monitor, replicas, mut balancer) = fleet(all);
    traffic(&mut balancer, 200, Duration::from_secs(2)).await;
    replicas[0].failing.store(true, Ordering::SeqCst);
    replicas[1].flaky.store(true, Ordering::SeqCst);
    traffic(&mut balancer, 200, Duration::from_secs(20)).await;
    assert_eq!(ejected(&monitor), vec!["0".to_owned()]);
    let shown = monitor.snapshot().get("1").unwrap().clone();
    let rate = &shown.windows[0].members[0];
    assert!(
        rate.counts.failure_rate() > 0.5 && rate.counts.calls >= 5,
        "the error rate alone stands out: {shown:#?}"
    );
    // Any of them: both are out.
    let any = ComposedPolicy::any_of()
        .member(error_rate())
        .member(consecutive(5));
    let (monitor, replicas, mut balancer) = fleet(any);
    traffic(&mut balancer, 200, Duration::from_secs(2)).await;
    replicas[0].failing.store(true, Ordering::SeqCst);
    replicas[1].flaky.store(true, Ordering::SeqCst);
    traffic(&mut balancer, 200, Duration::from_secs(20)).await;
    assert_eq!(ejected(&monitor), vec!["0".to_owned(), "1".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn two_of_three_ejects_on_two_members_and_keeps_on_one() {
    let two = ComposedPolicy::at_least(2)
        .member(error_rate())
        .member(latency())
        .member(consecutive(5));
    let (monitor, replicas, mut balancer) = fleet(two);
    traffic(&mut balancer, 200, Duration::from_secs(2)).await;
    // #0 fails fast (the error rate and the streak), #1 is slow (the latency alone).
    replicas[0].failing.store(true, Ordering::SeqCst);
    replicas[1].latency_ms.store(30, Ordering::SeqCst);
    traffic(&mut balancer, 200, Duration::from_secs(20)).await;
    assert_eq!(ejected(&monitor), vec!["0".to_owned()]);
    let reason = monitor
        .snapshot()
        .get("0")
        .unwrap()
        .last_reason
        .clone()
        .unwrap();
    assert_eq!(
        reason.policy, "error-rate",
        "the first member that judged it"
    );
}

/// The time the composition keeps #0 out once it fails every call from the start.
async fn first_time_out(composed: ComposedPolicyBuilder) -> Duration {
    let (monitor, replicas, mut balancer) = fleet(composed);
    replicas[0].failing.store(true, Ordering::SeqCst);
    let mut waited = Duration::ZERO;
    while ejected(&monitor).is_empty() {
        traffic(&mut balancer, 200, Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
        assert!(waited < Duration::from_secs(10), "never ejected");
    }
    monitor.snapshot().get("0").unwrap().next_check_in.unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_judged_by_two_members_at_once_is_out_for_the_longer_time() {
    // HSF's error rate (recovery unit 60 s) with 5 calls as its minimum, and a streak of 5 (its
    // back-off from 5 s): a replica failing every call trips both at its fifth failure.
    let both = ComposedPolicy::any_of()
        .member(ErrorRatePolicy::new(
            ErrorRateConfig::hsf()
                .min_calls(5)
                .max_ejection_ratio(0.4)
                .build()
                .unwrap(),
        ))
        .member(consecutive(5));
    let out = first_time_out(both).await;
    assert!(
        out > Duration::from_secs(55) && out <= Duration::from_secs(60),
        "{out:?}"
    );
    // With 50 calls as the error rate's minimum the streak alone judges it: its 5 s.
    let streak = ComposedPolicy::any_of()
        .member(ErrorRatePolicy::new(
            ErrorRateConfig::hsf()
                .min_calls(50)
                .max_ejection_ratio(0.4)
                .build()
                .unwrap(),
        ))
        .member(consecutive(5));
    let out = first_time_out(streak).await;
    assert!(
        out > Duration::from_secs(4) && out <= Duration::from_secs(5),
        "{out:?}"
    );
}
