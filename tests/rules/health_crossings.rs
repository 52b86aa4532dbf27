//! A health watch (`Probe::watch`) where it crosses other rules, on tokio's paused clock through a
//! real p2c `Balance`: with every endpoint not serving the balancer keeps one through upstream
//! removals; an endpoint not serving, held out or kept in, gets calls once forced in; dry run
//! switched on while one is kept in only reports, and switched off applies what the watches said;
//! an endpoint removed and inserted again starts fresh, and one inserted again under its key waits
//! for its new watch; flapping words queued at once end on the last; a watch that is always ready
//! does not stall the adaptor; inserts while a large fleet is not serving stay fast. (A rebuilt
//! endpoint's watch: `rebuild_crossings.rs`.)

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{Service, ServiceExt};
use tower_outlier::probe::{Health, HealthStream, Probe, ProbeFuture};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, Monitor, NetworkErrors, OutlierDetectionLayer,
};

use crate::support::{Backend, Harness, SeededRng};

#[derive(Clone, Default)]
pub(super) struct Watched {
    senders: Arc<Mutex<HashMap<usize, mpsc::UnboundedSender<Health>>>>,
    watches: Arc<AtomicUsize>,
}

impl Watched {
    pub(super) fn say(&self, key: usize, health: Health) {
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
        self.watches.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::unbounded();
        self.senders.lock().unwrap().insert(*key, tx);
        Some(Box::pin(rx))
    }
}

pub(super) fn layer(watched: &Watched) -> OutlierDetectionLayer<NetworkErrors, Watched> {
    OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .probe(watched.clone())
}

pub(super) type Tx = mpsc::UnboundedSender<Result<Change<usize, Backend>, Infallible>>;
pub(super) type Rx = mpsc::UnboundedReceiver<Result<Change<usize, Backend>, Infallible>>;

pub(super) fn upstream(backends: &[(usize, Backend)]) -> (Tx, Rx) {
    let (tx, rx) = mpsc::unbounded();
    for (k, b) in backends {
        tx.unbounded_send(Ok(Change::Insert(*k, b.clone())))
            .unwrap();
    }
    (tx, rx)
}

pub(super) async fn traffic<B>(balancer: &mut B, span: Duration)
where
    B: Service<(), Response = usize, Error = tower::BoxError>,
{
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        let r = tokio::time::timeout(Duration::from_secs(5), async {
            let _ = balancer.ready().await.unwrap().call(()).await;
        })
        .await;
        assert!(r.is_ok(), "the balancer did not get ready in 5 s");
        tokio::time::advance(Duration::from_millis(10)).await;
    }
}

pub(super) fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get(&key.to_string()).unwrap().status
}

pub(super) fn calls(b: &[(usize, Backend)]) -> Vec<usize> {
    b.iter().map(|(_, b)| b.calls()).collect()
}

/// Every endpoint NOT_SERVING, then the kept-in ones removed one by one: the balancer always
/// has one, calls keep flowing.
#[tokio::test(start_paused = true)]
async fn all_not_serving_then_removals() {
    let watched = Watched::default();
    let layer = layer(&watched);
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = (0..6).map(|i| (i, Backend::new(i))).collect();
    let (tx, rx) = upstream(&backends);
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(3));
    traffic(&mut balancer, Duration::from_millis(200)).await;
    for i in 0..6 {
        watched.say(i, Health::NotServing);
    }
    traffic(&mut balancer, Duration::from_millis(100)).await;
    let snap = monitor.snapshot();
    let ins: Vec<usize> = (0..6)
        .filter(|&i| status(&monitor, i) == EndpointStatus::Available)
        .collect();
    eprintln!(
        "in: {ins:?} len {} {:#?}",
        balancer.len(),
        snap.endpoints
            .iter()
            .map(|e| (&e.key, e.status, e.not_serving, e.refused.is_some()))
            .collect::<Vec<_>>()
    );
    assert!(!ins.is_empty());
    // Remove every endpoint in the set, one at a time.
    let mut removed = vec![];
    for _ in 0..5 {
        let ins: Vec<usize> = (0..6)
            .filter(|i| !removed.contains(i))
            .filter(|&i| {
                matches!(
                    status(&monitor, i),
                    EndpointStatus::Available | EndpointStatus::Trial
                )
            })
            .collect();
        let st: Vec<_> = monitor
            .snapshot()
            .endpoints
            .iter()
            .map(|e| (e.key.to_string(), e.status))
            .collect();
        eprintln!(
            "removed {removed:?}; in {ins:?}; len {}; {st:?}",
            balancer.len()
        );
        let k = ins[0];
        tx.unbounded_send(Ok(Change::Remove(k))).unwrap();
        removed.push(k);
        let before: usize = calls(&backends).iter().sum();
        traffic(&mut balancer, Duration::from_millis(200)).await;
        let after: usize = calls(&backends).iter().sum();
        assert!(
            after > before + 10,
            "no calls after removing {k}: {}",
            balancer.len()
        );
        assert!(!balancer.is_empty());
    }
}

/// An endpoint not serving, held out (#0) or kept in and avoided (#1), forced in: it gets calls.
#[tokio::test(start_paused = true)]
async fn a_not_serving_endpoint_forced_in_gets_calls() {
    struct Case {
        name: &'static str,
        /// The endpoints forced in, each with where it stood.
        forced: &'static [(usize, &'static str)],
        /// The endpoints shown available at once.
        available: &'static [usize],
    }
    let cases = [
        Case {
            name: "both forced in",
            forced: &[(0, "was held out"), (1, "was kept in, avoided")],
            available: &[0],
        },
        Case {
            name: "only the kept-in one forced in",
            forced: &[(1, "kept in, avoided")],
            available: &[],
        },
    ];
    for case in cases {
        let name = case.name;
        let watched = Watched::default();
        let layer = layer(&watched);
        let monitor = layer.monitor();
        let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
        let (_tx, rx) = upstream(&backends);
        let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(9));
        traffic(&mut balancer, Duration::from_millis(200)).await;
        watched.say(0, Health::NotServing);
        watched.say(1, Health::NotServing);
        traffic(&mut balancer, Duration::from_millis(10)).await;
        assert_eq!(status(&monitor, 0), EndpointStatus::Ejected, "{name}");
        assert_eq!(status(&monitor, 1), EndpointStatus::Available, "{name}");
        for &(key, _) in case.forced {
            layer.rules().force_in(&key);
        }
        traffic(&mut balancer, Duration::from_millis(10)).await;
        for &key in case.available {
            assert_eq!(
                status(&monitor, key),
                EndpointStatus::Available,
                "{name}: #{key}"
            );
        }
        let before = calls(&backends);
        traffic(&mut balancer, Duration::from_secs(2)).await;
        let got: Vec<usize> = calls(&backends)
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect();
        eprintln!(
            "{name}: calls {got:?}; #1 {:#?}",
            monitor.snapshot().get("1")
        );
        for &(key, was) in case.forced {
            assert!(
                got[key] > 20,
                "{name}: forced-in #{key} ({was}) got {got:?}"
            );
        }
    }
}

/// Dry run turned on while an endpoint is kept in not serving: dry run only reports.
#[tokio::test(start_paused = true)]
async fn dry_run_on_while_kept_in_not_serving() {
    let watched = Watched::default();
    let layer = layer(&watched);
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
    let (_tx, rx) = upstream(&backends);
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(9));
    traffic(&mut balancer, Duration::from_millis(200)).await;
    watched.say(0, Health::NotServing);
    watched.say(1, Health::NotServing);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Ejected);
    assert_eq!(status(&monitor, 1), EndpointStatus::Available);
    layer.rules().set_dry_run(true);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    let before = calls(&backends);
    traffic(&mut balancer, Duration::from_secs(2)).await;
    let after = calls(&backends);
    let got: Vec<usize> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("dry run: calls {got:?}; {:#?}", monitor.snapshot().get("1"));
    assert!(got[0] > 20, "#0 in dry run got {got:?}");
    assert!(got[1] > 20, "#1 in dry run got {got:?}");
    // And back off: both not serving again, one out and one kept in.
    layer.rules().set_dry_run(false);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    let outs = (0..2)
        .filter(|&i| status(&monitor, i) == EndpointStatus::Ejected)
        .count();
    assert_eq!(outs, 1);
}

/// NOT_SERVING, removed by the upstream, inserted again under the same key: fresh, in, called.
#[tokio::test(start_paused = true)]
async fn not_serving_then_remove_and_reinsert() {
    let watched = Watched::default();
    let layer = layer(&watched);
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
    let (tx, rx) = upstream(&backends);
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(9));
    traffic(&mut balancer, Duration::from_millis(200)).await;
    watched.say(0, Health::NotServing);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Ejected);
    tx.unbounded_send(Ok(Change::Remove(0))).unwrap();
    tx.unbounded_send(Ok(Change::Insert(0, backends[0].1.clone())))
        .unwrap();
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    let before = calls(&backends);
    traffic(&mut balancer, Duration::from_secs(1)).await;
    assert!(calls(&backends)[0] > before[0] + 10);
    // Same key inserted again (no removal) while held not serving; its new watch says SERVING.
    watched.say(0, Health::NotServing);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Ejected);
    tx.unbounded_send(Ok(Change::Insert(0, backends[0].1.clone())))
        .unwrap();
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(
        status(&monitor, 0),
        EndpointStatus::Ejected,
        "still held: the new watch said nothing yet"
    );
    watched.say(0, Health::Serving);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
}

/// Flapping: NOT_SERVING / SERVING 1000 times queued at once, last NOT_SERVING.
#[tokio::test(start_paused = true)]
async fn flapping_words_queued() {
    let watched = Watched::default();
    let layer = layer(&watched);
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
    let (_tx, rx) = upstream(&backends);
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(9));
    traffic(&mut balancer, Duration::from_millis(200)).await;
    for _ in 0..1000 {
        watched.say(0, Health::NotServing);
        watched.say(1, Health::NotServing);
        watched.say(0, Health::Serving);
        watched.say(1, Health::Serving);
    }
    watched.say(0, Health::NotServing);
    watched.say(1, Health::NotServing);
    traffic(&mut balancer, Duration::from_millis(50)).await;
    let st: Vec<_> = (0..3).map(|i| status(&monitor, i)).collect();
    eprintln!("{st:?} len {}", balancer.len());
    assert_eq!(
        st.iter().filter(|s| **s == EndpointStatus::Ejected).count(),
        1
    );
    assert_eq!(balancer.len(), 2);
}

/// A watch stream that is always ready (user code: `stream::repeat`): does the adaptor's
/// poll ever return?
#[test]
fn a_watch_that_is_always_ready() {
    #[derive(Clone)]
    struct Repeat;
    impl Probe<usize, Backend> for Repeat {
        fn probe(&mut self, _: &usize, _: Backend) -> Option<ProbeFuture> {
            None
        }
        fn watch(&mut self, key: &usize, _: &Backend) -> Option<HealthStream> {
            if *key == 0 {
                Some(Box::pin(futures::stream::repeat(Health::Serving)))
            } else {
                None
            }
        }
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
                DetectorConfig::recommended().build().unwrap(),
            ))
            .probe(Repeat);
            let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
            let (_tx, rx) = upstream(&backends);
            let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(9));
            let _ = balancer.ready().await.unwrap().call(()).await;
        });
        let _ = done_tx.send(());
    });
    assert!(
        done_rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the first call did not complete in 10 s: the adaptor spins on a watch that is always ready"
    );
}

/// A whole fleet drains (every endpoint NOT_SERVING, most kept in, refused), then the
/// upstream adds endpoints: each insert retries every refusal?
#[tokio::test(start_paused = true)]
async fn inserts_while_a_large_fleet_is_not_serving() {
    for (n, drain) in [(1000, true), (2000, true), (4000, false), (4000, true)] {
        let watched = Watched::default();
        let layer = layer(&watched);
        let mut h = Harness::new(&layer, n);
        if drain {
            for i in 0..n {
                watched.say(i, Health::NotServing);
            }
        }
        let t = std::time::Instant::now();
        h.sync();
        let said = t.elapsed();
        let t = std::time::Instant::now();
        for id in n..n + n / 2 {
            h.insert(id);
            // The upstream trickles: one change per poll, as a registry watch delivers them.
            h.sync();
        }
        let took = t.elapsed();
        let snap = layer.monitor().snapshot();
        let out = snap
            .endpoints
            .iter()
            .filter(|e| e.status == EndpointStatus::Ejected)
            .count();
        eprintln!(
            "fleet {n}, drain {drain}: words took {said:?}; {} inserts",
            n / 2
        );
        eprintln!("   took {took:?}; {out} out, live {}", h.live.len());
        assert!(
            took < Duration::from_secs(20),
            "fleet {n}, drain {drain}: {} inserts took {took:?}",
            n / 2
        );
    }
}
