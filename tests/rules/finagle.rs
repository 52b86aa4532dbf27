//! Finagle's failure accrual (`finagle::finagle()`, its default hybrid, and its members alone),
//! on tokio's paused clock through a real p2c `Balance` with open-loop traffic at 200 calls a
//! second: how soon a replica that goes hard down is marked dead, how its back-off grows while it
//! stays down, and how a success starts it again.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::balance::p2c::Balance;
use tower::Service;
use tower_outlier::finagle::{finagle_seeded, SuccessRateAccrual};
use tower_outlier::policy::OutlierPolicy;
use tower_outlier::{EndpointStatus, Monitor, OutlierDetectionLayer};

use crate::support::{announce, traffic, SeededRng};

/// A replica answering after 10 ms on tokio's clock, or refusing at once while `failing`.
#[derive(Clone, Debug, Default)]
struct Replica {
    id: usize,
    failing: Arc<AtomicBool>,
    failed: Arc<AtomicUsize>,
}

impl Service<()> for Replica {
    type Response = usize;
    type Error = io::Error;
    type Future = futures::future::BoxFuture<'static, Result<usize, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        let id = self.id;
        if self.failing.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Box::pin(async { Err(io::Error::from(io::ErrorKind::ConnectionRefused)) });
        }
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(id)
        })
    }
}

struct Fleet<B> {
    monitor: Monitor,
    replicas: Vec<Replica>,
    balancer: B,
}

fn fleet<P: OutlierPolicy>(
    policy: P,
) -> Fleet<impl Service<(), Response = usize, Error = tower::BoxError, Future: Send + 'static>> {
    let layer = OutlierDetectionLayer::new(policy);
    let monitor = layer.monitor();
    let replicas: Vec<Replica> = (0..5)
        .map(|id| Replica {
            id,
            ..Replica::default()
        })
        .collect();
    let keyed: Vec<(usize, Replica)> = replicas.iter().map(|r| (r.id, r.clone())).collect();
    let balancer = Balance::from_rng(tower::Layer::layer(&layer, announce(&keyed)), SeededRng(11));
    Fleet {
        monitor,
        replicas,
        balancer,
    }
}

fn status(monitor: &Monitor) -> EndpointStatus {
    monitor.snapshot().get("0").unwrap().status
}

/// Traffic in steps of 10 ms until #0's status is `wanted`: how long that took.
async fn until_status<B>(fleet: &mut Fleet<B>, wanted: EndpointStatus, limit: Duration) -> Duration
where
    B: Service<(), Response = usize, Error = tower::BoxError>,
    B::Future: Send + 'static,
{
    let started = tokio::time::Instant::now();
    while status(&fleet.monitor) != wanted {
        traffic(&mut fleet.balancer, 200, Duration::from_millis(10)).await;
        assert!(started.elapsed() < limit, "not {wanted:?} within {limit:?}");
    }
    started.elapsed()
}

#[tokio::test(start_paused = true)]
async fn the_default_marks_a_hard_down_replica_dead_at_its_fifth_failure() {
    let mut fleet = fleet(finagle_seeded(1));
    traffic(&mut fleet.balancer, 200, Duration::from_secs(40)).await;
    fleet.replicas[0].failing.store(true, Ordering::SeqCst);
    let took = until_status(&mut fleet, EndpointStatus::Ejected, Duration::from_secs(10)).await;
    let failed = fleet.replicas[0].failed.load(Ordering::SeqCst);
    eprintln!("finagle(): ejected {took:?} after it went down, {failed} failed calls");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(failed, 5, "exactly the streak");
    let shown = fleet.monitor.snapshot().get("0").unwrap().clone();
    assert_eq!(shown.last_reason.unwrap().policy, "consecutive-failures");
    let out = shown.next_check_in.unwrap();
    assert!(
        out > Duration::from_millis(4_950) && out <= Duration::from_secs(5),
        "{out:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_success_rate_alone_marks_it_dead_after_the_window_times_ln_one_point_two_five() {
    let mut fleet = fleet(SuccessRateAccrual::default_finagle().seeded(1));
    traffic(&mut fleet.balancer, 200, Duration::from_secs(40)).await;
    fleet.replicas[0].failing.store(true, Ordering::SeqCst);
    let took = until_status(&mut fleet, EndpointStatus::Ejected, Duration::from_secs(20)).await;
    let failed = fleet.replicas[0].failed.load(Ordering::SeqCst);
    eprintln!("success rate alone: ejected {took:?} after it went down, {failed} failed calls");
    // 30 s × ln(1/0.8) = 6.69 s after its last success; the first failure after that marks it.
    assert!(
        took >= Duration::from_millis(6_600) && took < Duration::from_millis(8_000),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_stays_down_backs_off_and_one_that_heals_starts_again() {
    let mut fleet = fleet(finagle_seeded(2));
    traffic(&mut fleet.balancer, 200, Duration::from_secs(5)).await;
    fleet.replicas[0].failing.store(true, Ordering::SeqCst);
    // Each time it is back it fails its first call and is out again, for the next time of the
    // equal-jitter back-off: 5 s, 5–10 s, 10–20 s, 20–40 s.
    let mut outs = Vec::new();
    let mut seen = None;
    let started = tokio::time::Instant::now();
    while outs.len() < 4 {
        traffic(&mut fleet.balancer, 200, Duration::from_millis(10)).await;
        let shown = fleet.monitor.snapshot().get("0").unwrap().clone();
        // A new ejection: one more failed check (a relapse on its return).
        if shown.status == EndpointStatus::Ejected && Some(shown.failed_checks) != seen {
            seen = Some(shown.failed_checks);
            outs.push(shown.next_check_in.unwrap());
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{outs:?}");
    }
    eprintln!("time outs while down: {outs:?}");
    let bounds = [(5, 5), (5, 10), (10, 20), (20, 40)];
    for (out, (low, high)) in outs.iter().zip(bounds) {
        assert!(
            *out > Duration::from_secs(low) - Duration::from_millis(20)
                && *out <= Duration::from_secs(high),
            "{outs:?}"
        );
    }
    // Healed while back: its first call succeeds, and the next trip starts at 5 s again.
    fleet.replicas[0].failing.store(false, Ordering::SeqCst);
    until_status(&mut fleet, EndpointStatus::Trial, Duration::from_secs(45)).await;
    traffic(&mut fleet.balancer, 200, Duration::from_secs(6)).await;
    assert_eq!(status(&fleet.monitor), EndpointStatus::Available);
    fleet.replicas[0].failing.store(true, Ordering::SeqCst);
    until_status(&mut fleet, EndpointStatus::Ejected, Duration::from_secs(10)).await;
    let out = fleet
        .monitor
        .snapshot()
        .get("0")
        .unwrap()
        .next_check_in
        .unwrap();
    assert!(
        out > Duration::from_millis(4_950) && out <= Duration::from_secs(5),
        "the back-off starts again: {out:?}"
    );
}
