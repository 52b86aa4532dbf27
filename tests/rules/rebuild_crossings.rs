//! Rebuilding on return (`OutlierDetectionLayer::rebuild_on_return`) where it crosses other rules,
//! on tokio's paused clock through a real p2c `Balance`: a rebuilt endpoint is watched on its new
//! connection, whose health service is the one that speaks; a rebuilt service that is never ready
//! is not the balancer's last hope while the others fail.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{Service, ServiceExt};
use tower_outlier::probe::{Health, HealthStream, Probe, ProbeFuture};
use tower_outlier::rebuild::rebuild_fn;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, ServerErrors,
};

use super::health_crossings::{calls, status, traffic, upstream};
use crate::support::{Backend, SeededRng};

type Senders = HashMap<(usize, usize), mpsc::UnboundedSender<Health>>;

/// One connection of the fleet: answers its generation, refuses while `refusing`.
#[derive(Clone)]
struct Conn {
    key: usize,
    gen: usize,
    refusing: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Service<()> for Conn {
    type Response = http::Response<usize>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<http::Response<usize>, io::Error>>;
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
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
struct PerConn {
    senders: Arc<Mutex<Senders>>,
    watched: Arc<Mutex<Vec<(usize, usize)>>>,
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

/// #0 refuses until ejected, comes back as a new connection (generation 1), and its server then
/// drains: the watch on the new connection says NOT_SERVING, and #0 is out.
#[tokio::test(start_paused = true)]
async fn a_rebuilt_endpoint_is_watched_on_its_new_connection() {
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

/// The rebuild factory hands back a service whose poll_ready fails for good.
#[tokio::test(start_paused = true)]
async fn a_rebuilt_service_that_is_never_ready() {
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
