//! Slow start (`OutlierDetectionLayer::slow_start`) where it crosses other rules, on tokio's paused
//! clock: 10 000 endpoints joining a serving fleet are absorbed in time; every newcomer to a
//! serving fleet ramps; a degraded endpoint, or one kept in while not serving, does not take the
//! calls a ramping newcomer sits out.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{Service, ServiceExt};
use tower_outlier::probe::Health;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, ErrorRateConfig, ErrorRatePolicy,
    OutlierDetectionLayer, ServerErrors, SlowStart,
};

use super::health_crossings::{calls, layer, status, traffic, upstream, Watched};
use crate::support::{Backend, Harness, SeededRng};

fn slow() -> SlowStart {
    SlowStart::new(Duration::from_secs(30)).build().unwrap()
}

/// 10 000 endpoints join a serving fleet with slow start on: time to absorb them.
#[tokio::test(start_paused = true)]
async fn ten_thousand_join_a_serving_fleet_with_slow_start() {
    for (name, on) in [("without slow start", false), ("with slow start", true)] {
        let base = OutlierDetectionLayer::new(DetectorPolicy::new(
            DetectorConfig::recommended().build().unwrap(),
        ));
        let layer = if on { base.slow_start(slow()) } else { base };
        let mut h = Harness::new(&layer, 2);
        h.calls(0, 0, 5).await;
        h.calls(1, 0, 5).await;
        let t = std::time::Instant::now();
        for id in 2..10_002 {
            h.insert(id);
        }
        h.sync();
        let took = t.elapsed();
        let ramping = layer
            .monitor()
            .snapshot()
            .endpoints
            .iter()
            .filter(|e| e.ramp_share.is_some())
            .count();
        eprintln!(
            "{name}: 10 000 joined in {took:?}; {ramping} ramping; live {}",
            h.live.len()
        );
        assert_eq!(h.live.len(), 10_002, "{name}");
        assert!(took < Duration::from_secs(20), "{name}: took {took:?}");
    }
}

/// A serving fleet of 4 scales out to 400: does every newcomer ramp?
#[tokio::test(start_paused = true)]
async fn every_newcomer_to_a_serving_fleet_ramps() {
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .slow_start(SlowStart::new(Duration::from_secs(30)).build().unwrap());
    let mut h = Harness::new(&layer, 4);
    for i in 0..4 {
        h.calls(i, 0, 5).await;
    }
    for id in 4..400 {
        h.insert(id);
        h.sync();
    }
    let snap = layer.monitor().snapshot();
    let not_ramping: Vec<String> = snap
        .endpoints
        .iter()
        .filter(|e| e.ramp_share.is_none())
        .map(|e| e.key.to_string())
        .collect();
    eprintln!(
        "not ramping: {} of 400; first five: {:?}",
        not_ramping.len(),
        (0..5)
            .map(|i| snap.get(&i.to_string()).unwrap().ramp_share)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        not_ramping.len(),
        4,
        "newcomers that did not ramp: {not_ramping:?}"
    );
}

#[derive(Clone, Default)]
struct Srv {
    degraded: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
}
impl Service<()> for Srv {
    type Response = http::Response<()>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<http::Response<()>, Infallible>>;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: ()) -> Self::Future {
        self.served.fetch_add(1, Ordering::SeqCst);
        let mut r = http::Response::builder();
        if self.degraded.load(Ordering::SeqCst) {
            r = r.header("x-envoy-degraded", "");
        }
        std::future::ready(Ok(r.body(()).unwrap()))
    }
}

async fn run<B: Service<(), Response = http::Response<()>, Error = tower::BoxError>>(
    b: &mut B,
    span: Duration,
) {
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        let _ = b.ready().await.unwrap().call(()).await;
        tokio::time::advance(Duration::from_millis(10)).await;
    }
}

/// A degraded endpoint and a healthy newcomer that ramps: who gets the calls?
#[tokio::test(start_paused = true)]
async fn a_degraded_endpoint_takes_the_draws_a_ramping_one_sits_out() {
    for (name, slow) in [("without slow start", false), ("with slow start", true)] {
        let base = OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::hsf()
                .max_ejection_ratio(0.4)
                .build()
                .unwrap(),
        ))
        .classifier(ServerErrors)
        .detect_degraded(Duration::from_secs(5));
        let layer = if slow {
            base.slow_start(SlowStart::new(Duration::from_secs(10)).build().unwrap())
        } else {
            base
        };
        let servers: Vec<Srv> = (0..3).map(|_| Srv::default()).collect();
        let (tx, rx) = mpsc::unbounded::<Result<Change<usize, Srv>, Infallible>>();
        tx.unbounded_send(Ok(Change::Insert(0, servers[0].clone())))
            .unwrap();
        tx.unbounded_send(Ok(Change::Insert(1, servers[1].clone())))
            .unwrap();
        let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(3));
        run(&mut balancer, Duration::from_secs(1)).await;
        // #0 says it is degraded from now on; #2 (healthy) joins.
        servers[0].degraded.store(true, Ordering::SeqCst);
        run(&mut balancer, Duration::from_millis(100)).await;
        tx.unbounded_send(Ok(Change::Insert(2, servers[2].clone())))
            .unwrap();
        let before: Vec<usize> = servers
            .iter()
            .map(|s| s.served.load(Ordering::SeqCst))
            .collect();
        run(&mut balancer, Duration::from_secs(2)).await;
        let got: Vec<usize> = servers
            .iter()
            .zip(&before)
            .map(|(s, b)| s.served.load(Ordering::SeqCst) - b)
            .collect();
        eprintln!("{name}: calls in the 2 s after #2 joined (#0 degraded): {got:?}");
        if slow {
            assert!(
                got[0] < 5,
                "{name}: the degraded endpoint got {} of {:?} while two healthy ones could take them",
                got[0],
                got
            );
        }
    }
}

/// A kept-in NOT_SERVING endpoint (avoided) and a healthy newcomer that ramps.
#[tokio::test(start_paused = true)]
async fn a_kept_in_not_serving_endpoint_ties_with_a_ramping_one() {
    let watched = Watched::default();
    let layer =
        layer(&watched).slow_start(SlowStart::new(Duration::from_secs(10)).build().unwrap());
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = (0..4).map(|i| (i, Backend::new(i))).collect();
    let (tx, rx) = upstream(&backends[..3]);
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(9));
    traffic(&mut balancer, Duration::from_millis(500)).await;
    watched.say(0, Health::NotServing);
    watched.say(1, Health::NotServing);
    watched.say(2, Health::NotServing);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    tx.unbounded_send(Ok(Change::Insert(3, backends[3].1.clone())))
        .unwrap();
    traffic(&mut balancer, Duration::from_millis(10)).await;
    let st: Vec<_> = (0..4).map(|i| status(&monitor, i)).collect();
    let one = monitor.snapshot().get("1").unwrap().clone();
    eprintln!("statuses {st:?}; #1 refused {:?}", one.refused);
    let before = calls(&backends);
    traffic(&mut balancer, Duration::from_secs(2)).await;
    let got: Vec<usize> = calls(&backends)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    eprintln!("calls with #3 ramping: {got:?}");
    for i in 0..3 {
        if st[i] == EndpointStatus::Available {
            assert!(
                got[i] < 5,
                "kept-in NOT_SERVING #{i} got {got:?} while healthy #3 is in"
            );
        }
    }
}
