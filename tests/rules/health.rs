//! A health watch (`Probe::watch`), on tokio's paused clock through a real p2c `Balance`: not
//! serving takes an endpoint out at once, within the budget and never the last (kept in, p2c avoids
//! it); serving brings it back at once; dry run only reports; a watch that panics is contained.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use tower::balance::p2c::Balance;
use tower::{Service, ServiceExt};
use tower_outlier::probe::{Health, HealthStream, Probe, ProbeFuture};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, Monitor, NetworkErrors, OutlierDetectionLayer,
};

use crate::support::{announce, Backend, SeededRng};

/// A probe whose watch of each endpoint is a channel the test speaks through; key 9's watch
/// panics when first polled.
#[derive(Clone, Default)]
struct Watched {
    senders: Arc<Mutex<HashMap<usize, mpsc::UnboundedSender<Health>>>>,
}

impl Watched {
    fn say(&self, key: usize, health: Health) {
        self.senders.lock().unwrap()[&key]
            .unbounded_send(health)
            .unwrap();
    }
}

impl Probe<usize, Backend> for Watched {
    fn probe(&mut self, _: &usize, _: Backend) -> Option<ProbeFuture> {
        Some(Box::pin(std::future::ready(false)))
    }

    fn watch(&mut self, key: &usize, _: &Backend) -> Option<HealthStream> {
        if *key == 9 {
            return Some(Box::pin(futures::stream::poll_fn(
                |_| -> std::task::Poll<Option<Health>> { panic!("the watch broke") },
            )));
        }
        let (tx, rx) = mpsc::unbounded();
        self.senders.lock().unwrap().insert(*key, tx);
        Some(Box::pin(rx))
    }
}

fn layer(watched: &Watched) -> OutlierDetectionLayer<NetworkErrors, Watched> {
    OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .probe(watched.clone())
}

/// Serial calls, one every 10 ms, for `span`.
async fn traffic<B>(balancer: &mut B, span: Duration)
where
    B: Service<(), Response = usize, Error = tower::BoxError>,
{
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        let _ = balancer.ready().await.unwrap().call(()).await;
        tokio::time::advance(Duration::from_millis(10)).await;
    }
}

fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get(&key.to_string()).unwrap().status
}

#[tokio::test(start_paused = true)]
async fn not_serving_is_out_within_the_budget_and_serving_is_back_at_once() {
    let watched = Watched::default();
    let layer = layer(&watched);
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
    let mut balancer = Balance::from_rng(
        tower::Layer::layer(&layer, announce(&backends)),
        SeededRng(9),
    );
    traffic(&mut balancer, Duration::from_secs(1)).await;
    watched.say(0, Health::NotServing);
    watched.say(1, Health::NotServing);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    // One of three may be out: #0; #1 is kept in, avoided.
    assert_eq!(status(&monitor, 0), EndpointStatus::Ejected);
    assert_eq!(status(&monitor, 1), EndpointStatus::Available);
    let one = monitor.snapshot().get("1").unwrap().clone();
    assert!(one.not_serving && one.refused.is_some(), "{one:#?}");
    let before: Vec<usize> = backends.iter().map(|(_, b)| b.calls()).collect();
    traffic(&mut balancer, Duration::from_secs(2)).await;
    assert_eq!(backends[0].1.calls(), before[0], "the one out was called");
    assert_eq!(
        backends[1].1.calls(),
        before[1],
        "the avoided one was called"
    );
    // #0 serves again: back at once, and #1 takes its place out.
    watched.say(0, Health::Serving);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    assert_eq!(status(&monitor, 1), EndpointStatus::Ejected);
    watched.say(1, Health::Serving);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 1), EndpointStatus::Available);
    let before: Vec<usize> = backends.iter().map(|(_, b)| b.calls()).collect();
    traffic(&mut balancer, Duration::from_secs(3)).await;
    for (key, backend) in &backends {
        assert!(
            backend.calls() > before[*key] + 40,
            "#{key} got {} calls in 3 s once serving",
            backend.calls() - before[*key]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_last_endpoint_not_serving_stays_in() {
    let watched = Watched::default();
    let layer = layer(&watched);
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = vec![(0, Backend::new(0))];
    let mut balancer = Balance::from_rng(
        tower::Layer::layer(&layer, announce(&backends)),
        SeededRng(9),
    );
    traffic(&mut balancer, Duration::from_millis(100)).await;
    watched.say(0, Health::NotServing);
    let before = backends[0].1.calls();
    traffic(&mut balancer, Duration::from_secs(1)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    assert!(
        backends[0].1.calls() > before + 50,
        "the last endpoint got no calls"
    );
}

/// Every endpoint NOT_SERVING under the presets that fail fast (linkerd's, gRPC's): health is a
/// signal, not the rules' judgement, so the last endpoint stays in and gets the calls (before, the
/// whole fleet went out; gRPC's own client does that, this layer keeps one).
#[tokio::test(start_paused = true)]
async fn every_endpoint_not_serving_keeps_the_last_under_fail_fast_presets() {
    for (name, config) in [
        (
            "linkerd",
            DetectorConfig::linkerd().when_all_out(tower_outlier::WhenAllOut::FailFast),
        ),
        ("grpc", DetectorConfig::grpc()),
    ] {
        let watched = Watched::default();
        let layer = OutlierDetectionLayer::new(DetectorPolicy::new(config.build().unwrap()))
            .probe(watched.clone());
        let monitor = layer.monitor();
        let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
        let mut balancer = Balance::from_rng(
            tower::Layer::layer(&layer, announce(&backends)),
            SeededRng(9),
        );
        traffic(&mut balancer, Duration::from_millis(100)).await;
        for (key, _) in &backends {
            watched.say(*key, Health::NotServing);
        }
        let before: usize = backends.iter().map(|(_, b)| b.calls()).sum();
        let flowed = tokio::time::timeout(
            Duration::from_secs(5),
            traffic(&mut balancer, Duration::from_secs(1)),
        )
        .await;
        let snapshot = monitor.snapshot();
        assert!(
            flowed.is_ok(),
            "{name}: the balancer has no endpoint; {snapshot:#?}"
        );
        let kept = snapshot
            .endpoints
            .iter()
            .filter(|e| e.status == EndpointStatus::Available)
            .count();
        assert!(kept >= 1, "{name}: every endpoint out; {snapshot:#?}");
        let after: usize = backends.iter().map(|(_, b)| b.calls()).sum();
        assert!(
            after > before + 50,
            "{name}: {} calls in 1 s",
            after - before
        );
    }
}

#[tokio::test(start_paused = true)]
async fn in_dry_run_not_serving_is_only_reported() {
    let watched = Watched::default();
    let layer = layer(&watched);
    let monitor = layer.monitor();
    layer.rules().set_dry_run(true);
    let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
    let mut balancer = Balance::from_rng(
        tower::Layer::layer(&layer, announce(&backends)),
        SeededRng(9),
    );
    traffic(&mut balancer, Duration::from_millis(100)).await;
    watched.say(0, Health::NotServing);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    let zero = monitor.snapshot().get("0").unwrap().clone();
    assert_eq!(zero.status, EndpointStatus::Available, "{zero:#?}");
    assert_eq!(zero.would_be, Some(EndpointStatus::Ejected), "{zero:#?}");
    let before = backends[0].1.calls();
    traffic(&mut balancer, Duration::from_secs(2)).await;
    assert!(
        backends[0].1.calls() > before + 30,
        "dry run kept calls away"
    );
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_panics_leaves_its_endpoint_serving() {
    let watched = Watched::default();
    let layer = layer(&watched);
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = vec![
        (9, Backend::new(9)),
        (1, Backend::new(1)),
        (2, Backend::new(2)),
    ];
    let mut balancer = Balance::from_rng(
        tower::Layer::layer(&layer, announce(&backends)),
        SeededRng(9),
    );
    traffic(&mut balancer, Duration::from_secs(2)).await;
    assert_eq!(status(&monitor, 9), EndpointStatus::Available);
    assert!(backends[0].1.calls() > 30, "{}", backends[0].1.calls());
    // The others' watches still work.
    watched.say(1, Health::NotServing);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 1), EndpointStatus::Ejected);
}

/// A watch that says NOT_SERVING and then panics gives up its word: its endpoint comes back and
/// gets calls (before, it stayed out for good: no watch to say SERVING, and an ejection by
/// health has no recovery check of its own).
#[tokio::test(start_paused = true)]
async fn a_watch_that_panics_after_not_serving_gives_up_its_word() {
    /// Key 0's watch says NOT_SERVING, waits a second, then panics; the others never speak.
    #[derive(Clone)]
    struct SaysThenPanics;

    impl Probe<usize, Backend> for SaysThenPanics {
        fn probe(&mut self, _: &usize, _: Backend) -> Option<ProbeFuture> {
            Some(Box::pin(std::future::ready(false)))
        }

        fn watch(&mut self, key: &usize, _: &Backend) -> Option<HealthStream> {
            if *key != 0 {
                return Some(Box::pin(futures::stream::pending()));
            }
            let said = futures::stream::iter([Health::NotServing]);
            let broke = futures::stream::once(async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                panic!("the watch broke after its word")
            });
            Some(Box::pin(futures::StreamExt::chain(said, broke)))
        }
    }

    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .probe(SaysThenPanics);
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
    let mut balancer = Balance::from_rng(
        tower::Layer::layer(&layer, announce(&backends)),
        SeededRng(9),
    );
    traffic(&mut balancer, Duration::from_millis(100)).await;
    assert_eq!(
        status(&monitor, 0),
        EndpointStatus::Ejected,
        "out on its word"
    );
    traffic(&mut balancer, Duration::from_secs(2)).await;
    assert_eq!(
        status(&monitor, 0),
        EndpointStatus::Available,
        "its dead watch's word still holds it out"
    );
    let before = backends[0].1.calls();
    traffic(&mut balancer, Duration::from_secs(2)).await;
    assert!(
        backends[0].1.calls() > before + 40,
        "{} calls in 2 s once its watch gave up its word",
        backends[0].1.calls() - before
    );
}
