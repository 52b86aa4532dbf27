//! Edges of what servers say and a safe return, found by a red-team review: health with operator
//! controls and dry run, slow start beside degraded and avoided endpoints, a rebuilt endpoint's
//! watch, scale-out with slow start, inserts while a fleet is refused, a watch that is always
//! ready, ORCA garbage, a rebuilt service that is never ready.

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

use crate::support::{Backend, SeededRng};

#[derive(Clone, Default)]
struct Watched {
    senders: Arc<Mutex<HashMap<usize, mpsc::UnboundedSender<Health>>>>,
    watches: Arc<AtomicUsize>,
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
        self.watches.fetch_add(1, Ordering::SeqCst);
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

type Tx = mpsc::UnboundedSender<Result<Change<usize, Backend>, Infallible>>;
type Rx = mpsc::UnboundedReceiver<Result<Change<usize, Backend>, Infallible>>;

fn upstream(backends: &[(usize, Backend)]) -> (Tx, Rx) {
    let (tx, rx) = mpsc::unbounded();
    for (k, b) in backends {
        tx.unbounded_send(Ok(Change::Insert(*k, b.clone())))
            .unwrap();
    }
    (tx, rx)
}

async fn traffic<B>(balancer: &mut B, span: Duration)
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

fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get(&key.to_string()).unwrap().status
}

fn calls(b: &[(usize, Backend)]) -> Vec<usize> {
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

/// An operator forces in an endpoint that is kept in while not serving: does it get calls?
#[tokio::test(start_paused = true)]
async fn force_in_of_a_kept_in_not_serving_endpoint() {
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
    // Force both in.
    layer.rules().force_in(&0usize);
    layer.rules().force_in(&1usize);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    let before = calls(&backends);
    traffic(&mut balancer, Duration::from_secs(2)).await;
    let after = calls(&backends);
    let got: Vec<usize> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!(
        "forced in: calls {got:?}; snapshot {:#?}",
        monitor.snapshot().get("1")
    );
    assert!(got[0] > 20, "forced-in #0 (was held out) got {got:?}");
    assert!(
        got[1] > 20,
        "forced-in #1 (was kept in, avoided) got {got:?}"
    );
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

/// Only the kept-in (avoided) not-serving endpoint is forced in.
#[tokio::test(start_paused = true)]
async fn force_in_only_the_kept_in_one() {
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
    layer.rules().force_in(&1usize);
    traffic(&mut balancer, Duration::from_millis(10)).await;
    let before = calls(&backends);
    traffic(&mut balancer, Duration::from_secs(2)).await;
    let got: Vec<usize> = calls(&backends)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    let one = monitor.snapshot().get("1").unwrap().clone();
    eprintln!(
        "forced in #1: calls {got:?}; refused {:?} not_serving {}",
        one.refused, one.not_serving
    );
    assert!(got[1] > 20, "forced-in #1 (kept in, avoided) got {got:?}");
}

mod rebuild_and_watch {
    type Senders = HashMap<(usize, usize), mpsc::UnboundedSender<Health>>;
    use super::*;
    use std::io;
    use std::sync::atomic::AtomicBool;
    use tower_outlier::rebuild::rebuild_fn;
    use tower_outlier::ServerErrors;

    /// One connection of the fleet: answers its generation, refuses while `refusing`.
    #[derive(Clone)]
    pub(super) struct Conn {
        pub(super) key: usize,
        pub(super) gen: usize,
        pub(super) refusing: Arc<AtomicBool>,
        pub(super) calls: Arc<AtomicUsize>,
    }

    impl Service<()> for Conn {
        type Response = http::Response<usize>;
        type Error = io::Error;
        type Future = std::future::Ready<Result<http::Response<usize>, io::Error>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: ()) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.key == 0 && self.refusing.load(Ordering::SeqCst) {
                return std::future::ready(Err(io::ErrorKind::ConnectionRefused.into()));
            }
            std::future::ready(Ok(http::Response::new(self.gen)))
        }
    }

    /// A watch per connection: the server's health service speaks on the live connection
    /// (generation) only; an old connection is dead and says nothing.
    #[derive(Clone, Default)]
    pub(super) struct PerConn {
        pub(super) senders: Arc<Mutex<Senders>>,
        pub(super) watched: Arc<Mutex<Vec<(usize, usize)>>>,
    }

    impl Probe<usize, Conn> for PerConn {
        fn probe(&mut self, _: &usize, _: Conn) -> Option<ProbeFuture> {
            None
        }
        fn watch(&mut self, key: &usize, s: &Conn) -> Option<HealthStream> {
            self.watched.lock().unwrap().push((*key, s.gen));
            let (tx, rx) = mpsc::unbounded();
            self.senders.lock().unwrap().insert((*key, s.gen), tx);
            Some(Box::pin(rx))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebuilt_endpoint_keeps_watching_its_old_connection() {
        let refusing = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));
        let made = Arc::new(AtomicUsize::new(0));
        let conn = |key, gen| Conn {
            key,
            gen,
            refusing: refusing.clone(),
            calls: calls.clone(),
        };
        let watch = PerConn::default();
        let (r2, c2, m2) = (refusing.clone(), calls.clone(), made.clone());
        let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
            DetectorConfig::recommended().build().unwrap(),
        ))
        .classifier(ServerErrors)
        .probe(watch.clone())
        .rebuild_on_return(rebuild_fn(move |key: &usize| Conn {
            key: *key,
            gen: m2.fetch_add(1, Ordering::SeqCst) + 1,
            refusing: r2.clone(),
            calls: c2.clone(),
        }));
        let monitor = layer.monitor();
        let (tx, rx) = mpsc::unbounded::<Result<Change<usize, Conn>, Infallible>>();
        for k in 0..3 {
            tx.unbounded_send(Ok(Change::Insert(k, conn(k, 0))))
                .unwrap();
        }
        let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(5));
        async fn run<B: Service<(), Response = http::Response<usize>, Error = tower::BoxError>>(
            b: &mut B,
            span: Duration,
        ) {
            let until = tokio::time::Instant::now() + span;
            while tokio::time::Instant::now() < until {
                let _ = b.ready().await.unwrap().call(()).await;
                tokio::time::advance(Duration::from_millis(10)).await;
            }
        }
        run(&mut balancer, Duration::from_secs(1)).await;
        refusing.store(true, Ordering::SeqCst);
        let mut waited = 0;
        while monitor.snapshot().get("0").unwrap().status != EndpointStatus::Ejected {
            run(&mut balancer, Duration::from_millis(10)).await;
            waited += 1;
            assert!(waited < 1000);
        }
        refusing.store(false, Ordering::SeqCst);
        run(&mut balancer, Duration::from_secs(60)).await;
        assert_eq!(made.load(Ordering::SeqCst), 1, "rebuilt once");
        assert!(matches!(
            monitor.snapshot().get("0").unwrap().status,
            EndpointStatus::Available
        ));
        eprintln!("watches started: {:?}", watch.watched.lock().unwrap());
        // The server now drains: its health service says NOT_SERVING on the live connection.
        let sender = watch.senders.lock().unwrap().get(&(0, 1)).cloned();
        let Some(sender) = sender else {
            panic!(
                "no watch on the rebuilt service (gen 1): watches {:?}",
                watch.watched.lock().unwrap()
            );
        };
        sender.unbounded_send(Health::NotServing).unwrap();
        run(&mut balancer, Duration::from_millis(50)).await;
        assert_eq!(
            monitor.snapshot().get("0").unwrap().status,
            EndpointStatus::Ejected
        );
    }
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

mod scale {
    use super::*;
    use crate::support::Harness;
    use tower_outlier::SlowStart;

    fn slow() -> SlowStart {
        SlowStart::new(Duration::from_secs(30)).build().unwrap()
    }

    /// 10 000 endpoints join a serving fleet with slow start on: time to absorb them.
    #[tokio::test(start_paused = true)]
    async fn ten_thousand_join_a_serving_fleet_with_slow_start() {
        for on in [false, true] {
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
                "slow start {on}: 10 000 joined in {took:?}; {ramping} ramping; live {}",
                h.live.len()
            );
            assert_eq!(h.live.len(), 10_002);
            assert!(took < Duration::from_secs(20));
        }
    }

    /// A whole fleet drains (every endpoint NOT_SERVING, most kept in, refused), then the
    /// upstream adds endpoints: each insert retries every refusal?
    #[tokio::test(start_paused = true)]
    async fn inserts_while_a_large_fleet_is_not_serving() {
        for (n, drain) in [(1000, true), (2000, true), (4000, false), (4000, true)] {
            let watched = Watched::default();
            let layer = super::layer(&watched);
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
            assert!(took < Duration::from_secs(20), "2000 inserts took {took:?}");
        }
    }
}

mod scale_out {
    use super::*;
    use crate::support::Harness;
    use tower_outlier::SlowStart;

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
}

mod ramp_vs_degraded {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, ServerErrors, SlowStart};

    #[derive(Clone, Default)]
    pub(super) struct Srv {
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
        for slow in [false, true] {
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
            eprintln!("slow start {slow}: calls in the 2 s after #2 joined (#0 degraded): {got:?}");
            if slow {
                assert!(
                    got[0] < 5,
                    "the degraded endpoint got {} of {:?} while two healthy ones could take them",
                    got[0],
                    got
                );
            }
        }
    }
}

/// A kept-in NOT_SERVING endpoint (avoided) and a healthy newcomer that ramps.
#[tokio::test(start_paused = true)]
async fn a_kept_in_not_serving_endpoint_ties_with_a_ramping_one() {
    let watched = Watched::default();
    let layer = layer(&watched).slow_start(
        tower_outlier::SlowStart::new(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
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

mod orca_garbage {
    use super::*;
    use bytes::Bytes;
    use futures::stream::{self, BoxStream, StreamExt};
    use http_body_util::{BodyExt, StreamBody};
    use std::io;
    use tower_outlier::grpc::GrpcErrors;
    use tower_outlier::orca::{LoadReport, OrcaConfig, OrcaPolicy, LOAD_REPORT_HEADER};

    type TestBody = StreamBody<BoxStream<'static, Result<http_body::Frame<Bytes>, io::Error>>>;

    #[derive(Clone)]
    struct Garbage {
        value: Option<http::HeaderValue>,
        in_headers: bool,
        calls: Arc<AtomicUsize>,
    }

    impl Service<()> for Garbage {
        type Response = http::Response<TestBody>;
        type Error = io::Error;
        type Future = std::future::Ready<Result<http::Response<TestBody>, io::Error>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: ()) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            let mut response = http::Response::builder();
            if let Some(v) = &self.value {
                if self.in_headers {
                    response = response
                        .header("grpc-status", "0")
                        .header(LOAD_REPORT_HEADER, v.clone());
                } else {
                    trailers.insert(LOAD_REPORT_HEADER, v.clone());
                }
            }
            let frames: Vec<Result<http_body::Frame<Bytes>, io::Error>> = if self.in_headers {
                vec![]
            } else {
                vec![
                    Ok(http_body::Frame::data(Bytes::from_static(b"\0\0\0\0\0"))),
                    Ok(http_body::Frame::trailers(trailers)),
                ]
            };
            let body = StreamBody::new(stream::iter(frames).boxed());
            std::future::ready(Ok(response.body(body).unwrap()))
        }
    }

    fn report(qps: f64, cpu: f64, eps: f64, app: f64) -> http::HeaderValue {
        LoadReport {
            rps_fractional: qps,
            cpu_utilization: cpu,
            eps,
            application_utilization: app,
            ..Default::default()
        }
        .to_header()
        .parse()
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn nonsense_reports_do_not_break_anything() {
        let huge = http::HeaderValue::from_str(&"A".repeat(200_000)).unwrap();
        let values: Vec<(Option<http::HeaderValue>, bool)> = vec![
            (Some(report(f64::NAN, 0.5, 0.0, 0.0)), false),
            (Some(report(100.0, f64::INFINITY, 0.0, 0.0)), false),
            (Some(report(100.0, -1.0, 0.0, f64::NAN)), false),
            (Some(report(f64::MAX, 1e-308, f64::MAX, 0.0)), false),
            (Some(report(1e308, 1e-300, 0.0, 0.0)), true),
            (Some(report(100.0, 0.5, -5.0, -1.0)), false),
            (
                Some(http::HeaderValue::from_static("!!!not base64===")),
                false,
            ),
            (Some(http::HeaderValue::from_static("/w")), false),
            (Some(huge), false),
            (
                Some(http::HeaderValue::from_bytes(b"\xff\xfe\x80").unwrap()),
                true,
            ),
            (Some(report(100.0, 0.5, 0.0, 0.0)), false),
            (None, false),
        ];
        let counters: Vec<Arc<AtomicUsize>> = values
            .iter()
            .map(|_| Arc::new(AtomicUsize::new(0)))
            .collect();
        let (tx, rx) = mpsc::unbounded::<Result<Change<usize, Garbage>, Infallible>>();
        for (i, (v, h)) in values.iter().enumerate() {
            tx.unbounded_send(Ok(Change::Insert(
                i,
                Garbage {
                    value: v.clone(),
                    in_headers: *h,
                    calls: counters[i].clone(),
                },
            )))
            .unwrap();
        }
        let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
            DetectorConfig::recommended().build().unwrap(),
        ))
        .with_policy(OrcaPolicy::new(OrcaConfig::a58().build().unwrap()))
        .slow_start(
            tower_outlier::SlowStart::new(Duration::from_secs(10))
                .build()
                .unwrap(),
        )
        .classifier(GrpcErrors::default());
        let monitor = layer.monitor();
        let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(1));
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut failed = 0;
        while tokio::time::Instant::now() < until {
            match balancer.ready().await.unwrap().call(()).await {
                Ok(r) => {
                    let _ = r.collect().await;
                }
                Err(_) => failed += 1,
            }
            tokio::time::advance(Duration::from_millis(5)).await;
        }
        let got: Vec<usize> = counters.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        let st: Vec<_> = monitor
            .snapshot()
            .endpoints
            .iter()
            .map(|e| (e.key.to_string(), e.status, e.weight))
            .collect();
        eprintln!("orca garbage: calls {got:?}, failed {failed}; {st:?}");
        assert_eq!(failed, 0);
        assert!(st.iter().all(|(_, s, _)| *s == EndpointStatus::Available));
    }
}

/// The rebuild factory hands back a service whose poll_ready fails for good.
#[tokio::test(start_paused = true)]
async fn a_rebuilt_service_that_is_never_ready() {
    use tower_outlier::rebuild::rebuild_fn;
    let made = Arc::new(AtomicUsize::new(0));
    let m2 = made.clone();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .rebuild_on_return(rebuild_fn(move |k: &usize| {
        m2.fetch_add(1, Ordering::SeqCst);
        let b = Backend::new(*k + 100);
        b.set_broken(true);
        b
    }));
    let monitor = layer.monitor();
    let backends: Vec<(usize, Backend)> = (0..3).map(|i| (i, Backend::new(i))).collect();
    let (_tx, rx) = upstream(&backends);
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(9));
    traffic(&mut balancer, Duration::from_millis(500)).await;
    backends[0].1.set_failing(true);
    let mut n = 0;
    while status(&monitor, 0) != EndpointStatus::Ejected {
        traffic(&mut balancer, Duration::from_millis(10)).await;
        n += 1;
        assert!(n < 500);
    }
    // Everything else also fails for a while: the broken rebuilt one must not be the last hope.
    let before = calls(&backends);
    traffic(&mut balancer, Duration::from_secs(120)).await;
    let got: Vec<usize> = calls(&backends)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    let zero = monitor.snapshot().get("0").unwrap().clone();
    eprintln!(
        "rebuilt never-ready: made {}, calls {got:?}, #0 {:?} unready {:?}",
        made.load(Ordering::SeqCst),
        zero.status,
        zero
    );
    assert!(got[1] + got[2] > 10_000);
}
