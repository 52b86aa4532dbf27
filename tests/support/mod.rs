//! Test support: a switchable backend service and a harness that drives the discover adaptor the
//! way a balancer does, on tokio's paused clock.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::mpsc;
use futures::Stream;
use tower::discover::Change;
use tower::{Service, ServiceExt};
use tower_outlier::discover::{OutlierDetectionDiscover, OutlierEndpoint};
use tower_outlier::probe::Probe;
use tower_outlier::{NetworkErrors, OutlierDetectionLayer};

/// A backend that answers its id, or fails with a transport error while `failing` is set; its
/// `poll_ready` fails while `broken` is set (a dead connection's worker, a reconnect failing).
#[derive(Clone, Debug)]
pub struct Backend {
    pub id: usize,
    pub failing: Arc<AtomicBool>,
    pub broken: Arc<AtomicBool>,
    pub calls: Arc<AtomicUsize>,
}

impl Backend {
    pub fn new(id: usize) -> Self {
        Backend {
            id,
            failing: Arc::new(AtomicBool::new(false)),
            broken: Arc::new(AtomicBool::new(false)),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn set_broken(&self, broken: bool) {
        self.broken.store(broken, Ordering::SeqCst);
    }

    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<()> for Backend {
    type Response = usize;
    type Error = io::Error;
    type Future = Ready<Result<usize, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        if self.broken.load(Ordering::SeqCst) {
            Poll::Ready(Err(io::Error::other("the connection's worker is gone")))
        } else {
            Poll::Ready(Ok(()))
        }
    }

    fn call(&mut self, _: ()) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            ready(Err(io::Error::from(io::ErrorKind::ConnectionRefused)))
        } else {
            ready(Ok(self.id))
        }
    }
}

pub type Upstream = mpsc::UnboundedReceiver<Result<Change<usize, Backend>, Infallible>>;

/// The tests' one seeded generator (splitmix64): for `Balance::from_rng`, so p2c picks the same
/// pairs on every run, and for random test sequences.
#[derive(Clone, Debug)]
pub struct SeededRng(pub u64);

impl SeededRng {
    /// Uniform in `0..n` (n > 0); the slight modulo bias does not matter to a test.
    pub fn below(&mut self, n: u64) -> u64 {
        tower::util::rng::Rng::next_u64(self) % n
    }
}

impl tower::util::rng::Rng for SeededRng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// What the adaptor yielded, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Insert(usize),
    Remove(usize),
}

/// Drives an adaptor like a balancer would: applies every change it yields to a live set.
pub struct Harness<P> {
    pub tx: mpsc::UnboundedSender<Result<Change<usize, Backend>, Infallible>>,
    pub adaptor: OutlierDetectionDiscover<Upstream, NetworkErrors, P>,
    pub live: HashMap<usize, OutlierEndpoint<Backend, NetworkErrors>>,
    pub backends: HashMap<usize, Backend>,
    pub seen: Vec<(tokio::time::Instant, Seen)>,
    pub ended: bool,
    /// The task the adaptor is polled in, so tests can see whether it was woken.
    pub task: tokio_test::task::Spawn<()>,
}

impl<P: Probe<usize, Backend> + Clone> Harness<P> {
    pub fn new(layer: &OutlierDetectionLayer<NetworkErrors, P>, endpoints: usize) -> Self {
        let (tx, rx) = mpsc::unbounded();
        let adaptor = tower::Layer::layer(layer, rx);
        let mut harness = Harness {
            tx,
            adaptor,
            live: HashMap::new(),
            backends: HashMap::new(),
            seen: Vec::new(),
            ended: false,
            task: tokio_test::task::spawn(()),
        };
        for id in 0..endpoints {
            harness.insert(id);
        }
        harness.sync();
        harness
    }

    pub fn insert(&mut self, id: usize) {
        let backend = self
            .backends
            .entry(id)
            .or_insert_with(|| Backend::new(id))
            .clone();
        self.tx
            .unbounded_send(Ok(Change::Insert(id, backend)))
            .unwrap();
    }

    pub fn remove(&mut self, id: usize) {
        self.tx.unbounded_send(Ok(Change::Remove(id))).unwrap();
    }

    /// Polls the adaptor until it is pending, applying what it yields, and checks it does not
    /// busy-poll: a `Pending` after the adaptor woke its own task is polled once more (aborting a
    /// probe wakes the task once, as the aborted probe finishes), and must then stay quiet.
    pub fn sync(&mut self) {
        let mut woke_itself = false;
        loop {
            let (task, adaptor) = (&mut self.task, &mut self.adaptor);
            let polled = task.enter(|cx, _| std::pin::Pin::new(&mut *adaptor).poll_next(cx));
            match polled {
                Poll::Ready(Some(Ok(Change::Insert(k, endpoint)))) => {
                    woke_itself = false;
                    self.seen
                        .push((tokio::time::Instant::now(), Seen::Insert(k)));
                    self.live.insert(k, endpoint);
                }
                Poll::Ready(Some(Ok(Change::Remove(k)))) => {
                    woke_itself = false;
                    self.seen
                        .push((tokio::time::Instant::now(), Seen::Remove(k)));
                    self.live.remove(&k);
                }
                Poll::Ready(Some(Err(e))) => match e {},
                Poll::Ready(None) => {
                    self.ended = true;
                    return;
                }
                Poll::Pending if self.task.is_woken() => {
                    assert!(
                        !woke_itself,
                        "the adaptor keeps waking its own task and returning Pending: a busy poll"
                    );
                    woke_itself = true;
                }
                Poll::Pending => return,
            }
        }
    }

    pub fn backend(&self, id: usize) -> &Backend {
        &self.backends[&id]
    }

    pub fn is_live(&self, id: usize) -> bool {
        self.live.contains_key(&id)
    }

    pub fn live_ids(&self) -> Vec<usize> {
        let mut ids: Vec<usize> = self.live.keys().copied().collect();
        ids.sort();
        ids
    }

    /// Sends `failures` failing and then `successes` succeeding calls straight to endpoint `id`,
    /// syncing after each, the way a balancer routes and then re-polls discovery.
    pub async fn calls(&mut self, id: usize, failures: usize, successes: usize) {
        for i in 0..failures + successes {
            let backend = self.backends[&id].clone();
            backend.set_failing(i < failures);
            let Some(endpoint) = self.live.get_mut(&id) else {
                panic!("endpoint {id} is not live");
            };
            let _ = endpoint.ready().await.unwrap().call(()).await;
            self.sync();
        }
        self.backends[&id].set_failing(false);
    }

    /// Like [`calls`](Self::calls), but stops quietly once the endpoint is no longer live.
    pub async fn calls_while_live(&mut self, id: usize, failures: usize, successes: usize) {
        for i in 0..failures + successes {
            let backend = self.backends[&id].clone();
            backend.set_failing(i < failures);
            let Some(endpoint) = self.live.get_mut(&id) else {
                break;
            };
            let _ = endpoint.ready().await.unwrap().call(()).await;
            self.sync();
        }
        self.backends[&id].set_failing(false);
    }

    /// Polls every endpoint in the live set for readiness once, as p2c's ready cache does with
    /// the endpoints it holds, then syncs (an endpoint whose service failed tells the layer).
    pub fn poll_ready_all(&mut self) {
        let (task, live) = (&mut self.task, &mut self.live);
        for endpoint in live.values_mut() {
            let _ = task.enter(|cx, _| endpoint.poll_ready(cx));
        }
        self.sync();
    }

    /// Advances the paused clock and lets the adaptor fire its timers.
    pub async fn advance(&mut self, by: std::time::Duration) {
        tokio::time::advance(by).await;
        self.sync();
    }

    /// The ids ejected (removed) at some point, in order.
    pub fn removals(&self) -> Vec<usize> {
        self.seen
            .iter()
            .filter_map(|(_, s)| match s {
                Seen::Remove(k) => Some(*k),
                Seen::Insert(_) => None,
            })
            .collect()
    }
}

/// A backend whose latency (on tokio's clock) can be changed while it runs.
#[derive(Clone, Debug)]
pub struct Sleepy {
    pub id: usize,
    pub latency_ms: Arc<std::sync::atomic::AtomicU64>,
    pub calls: Arc<AtomicUsize>,
    pub in_flight: Arc<AtomicUsize>,
    pub max_in_flight: Arc<AtomicUsize>,
    pub failing: Arc<AtomicBool>,
    /// While set: no call, in flight or new, ends before this instant (a stalled server).
    pub stalled_until: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
}

impl Sleepy {
    pub fn new(id: usize, latency_ms: u64) -> Self {
        Sleepy {
            id,
            latency_ms: Arc::new(std::sync::atomic::AtomicU64::new(latency_ms)),
            calls: Arc::new(AtomicUsize::new(0)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight: Arc::new(AtomicUsize::new(0)),
            failing: Arc::new(AtomicBool::new(false)),
            stalled_until: Arc::default(),
        }
    }

    /// Stalls the backend for `pause` from now: the calls in flight and those that start
    /// meanwhile end together when it is over, as when a server's process is descheduled.
    pub fn stall(&self, pause: std::time::Duration) {
        *self.stalled_until.lock().unwrap() = Some(tokio::time::Instant::now() + pause);
    }

    pub fn set_latency(&self, ms: u64) {
        self.latency_ms.store(ms, Ordering::SeqCst);
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<()> for Sleepy {
    type Response = usize;
    type Error = io::Error;
    type Future = futures::future::BoxFuture<'static, Result<usize, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let latency = self.latency_ms.load(Ordering::SeqCst);
        let (id, in_flight) = (self.id, self.in_flight.clone());
        let failing = self.failing.load(Ordering::SeqCst);
        let stalled_until = self.stalled_until.clone();
        Box::pin(async move {
            tokio::time::sleep(std::time::Duration::from_millis(latency)).await;
            let stall = *stalled_until.lock().unwrap();
            if let Some(until) = stall {
                tokio::time::sleep_until(until).await;
            }
            in_flight.fetch_sub(1, Ordering::SeqCst);
            if failing {
                // "Server busy": an overload, as SOFARPC counts it.
                Err(io::Error::from(io::ErrorKind::TimedOut))
            } else {
                Ok(id)
            }
        })
    }
}

/// An upstream that announces `services` and then stays open, as a registry watch would.
pub fn announce<S: Clone>(
    services: &[(usize, S)],
) -> mpsc::UnboundedReceiver<Result<Change<usize, S>, Infallible>> {
    let (tx, rx) = mpsc::unbounded();
    for (key, service) in services {
        tx.unbounded_send(Ok(Change::Insert(*key, service.clone())))
            .unwrap();
    }
    std::mem::forget(tx);
    rx
}

/// A service answering 7, or failing with a connection reset while `failing` is set: the
/// standalone breaker's tests' backend.
pub fn reset_while(
    failing: Arc<AtomicBool>,
) -> impl Service<(), Response = u32, Error = io::Error, Future = Ready<Result<u32, io::Error>>> + Clone
{
    tower::service_fn(move |()| {
        ready(if failing.load(Ordering::SeqCst) {
            Err(io::Error::from(io::ErrorKind::ConnectionReset))
        } else {
            Ok(7)
        })
    })
}

/// `rate` calls a second for `span`, each in its own task (open loop), awaited at the end.
pub async fn traffic<B>(balancer: &mut B, rate: u64, span: std::time::Duration)
where
    B: Service<(), Response = usize, Error = tower::BoxError>,
    B::Future: Send + 'static,
{
    let every = std::time::Duration::from_nanos(1_000_000_000 / rate);
    let until = tokio::time::Instant::now() + span;
    let mut calls = tokio::task::JoinSet::new();
    while tokio::time::Instant::now() < until {
        let call = balancer.ready().await.unwrap().call(());
        calls.spawn(async move {
            let _ = call.await;
        });
        tokio::time::sleep(every).await;
    }
    while calls.join_next().await.is_some() {}
}

/// The keys of the endpoints the monitor shows ejected.
pub fn ejected(monitor: &tower_outlier::Monitor) -> Vec<String> {
    monitor
        .snapshot()
        .endpoints
        .iter()
        .filter(|e| e.status == tower_outlier::EndpointStatus::Ejected)
        .map(|e| e.key.to_string())
        .collect()
}
