//! Slow start (`OutlierDetectionLayer::slow_start`), on tokio's paused clock through a real p2c
//! `Balance`: a re-admitted endpoint's share of a full endpoint's traffic follows Envoy's formula
//! over the window; an endpoint joining a serving fleet ramps the same way; the endpoints present
//! from the start do not.

use std::convert::Infallible;
use std::time::Duration;

use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{Service, ServiceExt};
use tower_outlier::{OutlierDetectionLayer, ServerErrors, SlowStart};

use super::pushback::{layer, Server};
use crate::support::SeededRng;

const SECOND: Duration = Duration::from_secs(1);

type Upstream = futures::channel::mpsc::UnboundedSender<Result<Change<usize, Server>, Infallible>>;

/// p2c over `layer` with `servers` announced, drawing from a seeded generator; the sender stays
/// open for more.
fn balance(
    layer: &OutlierDetectionLayer<ServerErrors>,
    servers: &[Server],
    seed: u64,
) -> (
    impl Service<(), Response = http::Response<()>, Error = tower::BoxError>,
    Upstream,
) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for (id, server) in servers.iter().enumerate() {
        tx.unbounded_send(Ok(Change::Insert(id, server.clone())))
            .unwrap();
    }
    let balancer = Balance::from_rng(tower::Layer::layer(layer, rx), SeededRng(seed));
    (balancer, tx)
}

/// Serial calls, one every millisecond, for `span`.
async fn traffic<B>(balancer: &mut B, span: Duration)
where
    B: Service<(), Response = http::Response<()>, Error = tower::BoxError>,
{
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        let _ = balancer.ready().await.unwrap().call(()).await;
        tokio::time::advance(Duration::from_millis(1)).await;
    }
}

/// The served counts of `servers` over the next `span` of traffic.
async fn served_during<B>(balancer: &mut B, servers: &[Server], span: Duration) -> Vec<usize>
where
    B: Service<(), Response = http::Response<()>, Error = tower::BoxError>,
{
    let before: Vec<usize> = servers.iter().map(Server::served).collect();
    traffic(balancer, span).await;
    servers
        .iter()
        .zip(before)
        .map(|(server, before)| server.served() - before)
        .collect()
}

/// Envoy's share averaged over `[from, to)` seconds into a linear 10 s ramp with a 10 % floor.
fn mean_share(from: f64, to: f64) -> f64 {
    let steps = 1000;
    (0..steps)
        .map(|i| {
            let t = from + (to - from) * (i as f64 + 0.5) / steps as f64;
            (t.max(1.0) / 10.0).clamp(0.1, 1.0)
        })
        .sum::<f64>()
        / steps as f64
}

/// `ramp`'s share of `counts[ramping]` against the mean of the others'.
fn share_of(counts: &[usize], ramping: usize) -> f64 {
    let others: Vec<usize> = (0..counts.len())
        .filter(|&i| i != ramping)
        .map(|i| counts[i])
        .collect();
    let mean = others.iter().sum::<usize>() as f64 / others.len() as f64;
    counts[ramping] as f64 / mean
}

fn ramp() -> SlowStart {
    SlowStart::new(10 * SECOND).build().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_readmitted_endpoint_ramps_up_as_the_formula_says() {
    let layer = layer(0.4).slow_start(ramp());
    let servers: Vec<Server> = (0..4).map(|_| Server::new()).collect();
    let (mut balancer, _upstream) = balance(&layer, &servers, 7);
    traffic(&mut balancer, SECOND).await;
    // #0 asks for 2 s off: ejected, then re-admitted when the time is up.
    servers[0].busy(Some("2"));
    let served = servers[0].served();
    while servers[0].served() == served {
        let _ = balancer.ready().await.unwrap().call(()).await;
    }
    servers[0].busy(None);
    traffic(&mut balancer, 2 * SECOND - Duration::from_millis(50)).await;
    let snapshot = layer.monitor().snapshot();
    assert_eq!(
        snapshot.get("0").unwrap().status,
        tower_outlier::EndpointStatus::Ejected
    );
    // Until the re-admission.
    while layer.monitor().snapshot().get("0").unwrap().status
        != tower_outlier::EndpointStatus::Available
    {
        traffic(&mut balancer, Duration::from_millis(1)).await;
    }
    let mut shares = Vec::new();
    for window in 0..6 {
        let counts = served_during(&mut balancer, &servers, 2 * SECOND).await;
        let from = 2.0 * window as f64;
        let expected = mean_share(from, from + 2.0);
        let measured = share_of(&counts, 0);
        shares.push((from, expected, measured, counts.clone()));
    }
    for (from, expected, measured, counts) in &shares {
        assert!(
            (measured - expected).abs() <= 0.05 + 0.1 * expected,
            "{from} s into the ramp: {measured:.3} of a full share, the formula says \
             {expected:.3} (calls {counts:?}); all: {shares:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn without_slow_start_a_readmitted_endpoint_has_its_full_share_at_once() {
    let layer = layer(0.4);
    let servers: Vec<Server> = (0..4).map(|_| Server::new()).collect();
    let (mut balancer, _upstream) = balance(&layer, &servers, 7);
    traffic(&mut balancer, SECOND).await;
    servers[0].busy(Some("2"));
    let served = servers[0].served();
    while servers[0].served() == served {
        let _ = balancer.ready().await.unwrap().call(()).await;
    }
    servers[0].busy(None);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    let snapshot = layer.monitor().snapshot();
    assert_eq!(
        snapshot.get("0").unwrap().status,
        tower_outlier::EndpointStatus::Ejected
    );
    while layer.monitor().snapshot().get("0").unwrap().status
        != tower_outlier::EndpointStatus::Available
    {
        traffic(&mut balancer, Duration::from_millis(1)).await;
    }
    let counts = served_during(&mut balancer, &servers, 2 * SECOND).await;
    let measured = share_of(&counts, 0);
    assert!(measured > 0.85, "{measured:.3} of a full share: {counts:?}");
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_joining_a_serving_fleet_ramps_and_the_first_ones_do_not() {
    let layer = layer(0.4).slow_start(ramp());
    let servers: Vec<Server> = (0..4).map(|_| Server::new()).collect();
    let (mut balancer, upstream) = balance(&layer, &servers[..3], 11);
    // The first three share evenly from the start: none ramps.
    let counts = served_during(&mut balancer, &servers[..3], 2 * SECOND).await;
    let (least, most) = (
        *counts.iter().min().unwrap() as f64,
        *counts.iter().max().unwrap() as f64,
    );
    assert!(
        least / most > 0.85,
        "the first endpoints ramped: {counts:?}"
    );
    upstream
        .unbounded_send(Ok(Change::Insert(3, servers[3].clone())))
        .unwrap();
    let first = served_during(&mut balancer, &servers, 2 * SECOND).await;
    let share = share_of(&first, 3);
    let expected = mean_share(0.0, 2.0);
    assert!(
        (share - expected).abs() <= 0.05 + 0.1 * expected,
        "the newcomer's first 2 s: {share:.3} of a full share, the formula says {expected:.3} \
         ({first:?})"
    );
    traffic(&mut balancer, 8 * SECOND).await;
    let after = served_during(&mut balancer, &servers, 2 * SECOND).await;
    let share = share_of(&after, 3);
    assert!(
        share > 0.85,
        "after the window the newcomer has {share:.3} of a full share ({after:?})"
    );
    let snapshot = layer.monitor().snapshot();
    assert!(snapshot.endpoints.iter().all(|e| e.ramp_share.is_none()));
}
