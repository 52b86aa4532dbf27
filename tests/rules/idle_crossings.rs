//! Checks of idle endpoints (`ProbeCadence::no_traffic_interval`,
//! `unhealthy_threshold`): the keeper task's lifetime and polling, probes that misbehave,
//! upstream churn, crossings with the other ways an endpoint goes out, and the guarantees the
//! feature gives (an endpoint with traffic is never taken out by its checks, nor a healthy idle
//! one, nor the last). On tokio's paused clock unless said.

use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{Service, ServiceExt};
use tower_outlier::events::{Event, ACTIVE_CHECK_POLICY};
use tower_outlier::probe::{probe_fn, Probe, ProbeCadence, ProbeFuture};
use tower_outlier::rebuild::rebuild_fn;
use tower_outlier::{
    EndpointStatus, ErrorRateConfig, ErrorRatePolicy, Monitor, OutlierDetectionLayer,
};

use crate::support::{announce, Backend, Harness, SeededRng, Sleepy};

use super::idle_checks::{edas, idle, run, S};

/// Counts the probe's starts, and the checks alive (started, not yet dropped) at most.
#[derive(Clone, Default)]
struct Counter {
    started: Arc<AtomicUsize>,
    alive: Arc<AtomicUsize>,
    most_alive: Arc<AtomicUsize>,
}

/// Dropped with the check's future: the check is no longer alive.
struct AliveGuard(Arc<AtomicUsize>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Counter {
    fn start(&self) -> AliveGuard {
        self.started.fetch_add(1, Ordering::SeqCst);
        let now = self.alive.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_alive.fetch_max(now, Ordering::SeqCst);
        AliveGuard(self.alive.clone())
    }

    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    fn alive(&self) -> usize {
        self.alive.load(Ordering::SeqCst)
    }

    fn most_alive(&self) -> usize {
        self.most_alive.load(Ordering::SeqCst)
    }

    /// A probe that calls the backend (its `()` request).
    fn calls(&self) -> impl Probe<usize, Backend> + Clone {
        let counter = self.clone();
        probe_fn(move |_: &usize, backend: Backend| -> ProbeFuture {
            let guard = counter.start();
            Box::pin(async move {
                let _guard = guard;
                backend.oneshot(()).await.is_ok()
            })
        })
    }

    /// A probe whose checks never end.
    fn hangs(&self) -> impl Probe<usize, Backend> + Clone {
        let counter = self.clone();
        probe_fn(move |_: &usize, _: Backend| -> ProbeFuture {
            let guard = counter.start();
            Box::pin(async move {
                let _guard = guard;
                std::future::pending::<bool>().await
            })
        })
    }
}

/// The keys ejected by their active checks, from the events.
fn active_check_ejections(events: &Mutex<Vec<(Instant, Event)>>) -> Vec<(Instant, String)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(at, event)| match event {
            Event::Ejected { key, reason, .. } if reason.policy == ACTIVE_CHECK_POLICY => {
                Some((*at, key.to_string()))
            }
            _ => None,
        })
        .collect()
}

type Events = Arc<Mutex<Vec<(Instant, Event)>>>;

fn record_events(monitor: &Monitor) -> (Events, tower_outlier::monitor::EventCallback) {
    let events: Events = Arc::default();
    let sink = events.clone();
    let guard = monitor.on_event(move |e| sink.lock().unwrap().push((Instant::now(), e.clone())));
    (events, guard)
}

fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get(&key.to_string()).unwrap().status
}

/// Runs `test` on a current-thread runtime with a paused clock, on a thread of its own, and
/// fails if it has not finished in `wall` of real time: a keeper that never lets the runtime go
/// idle stops the paused clock from advancing, and the test would hang instead of failing.
fn paused_within<F>(wall: Duration, test: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(test());
        }));
        let _ = tx.send(outcome.map_err(|p| tower_outlier_test_panic_message(&p)));
        // The runtime is dropped here, which ends the tasks (a keeper included).
    });
    match rx.recv_timeout(wall) {
        Ok(Ok(())) => {}
        Ok(Err(message)) => panic!("{message}"),
        Err(_) => panic!("not done within {wall:?} of real time: a task keeps the runtime busy"),
    }
}

fn tower_outlier_test_panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic".to_owned())
}

// ---------------------------------------------------------------------------------------------
// 1. The keeper's lifetime and polling.
// ---------------------------------------------------------------------------------------------

/// Dropping the balancer (and the adaptor in it) ends the keeper: the probe is called no more,
/// and the keeper's copy of the probe (and of every service) is dropped.
#[tokio::test(start_paused = true)]
async fn idle_keeper_stops_when_the_balancer_is_dropped() {
    let counter = Counter::default();
    let backends: Vec<Backend> = (0..3).map(Backend::new).collect();
    let probe = counter.calls();
    let layer = edas(0.4).probe(probe).probe_cadence(idle(2));
    let upstream = announce(
        &backends
            .iter()
            .map(|b| (b.id, b.clone()))
            .collect::<Vec<_>>(),
    );
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, upstream), SeededRng(3));
    let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
    tokio::time::sleep(16 * S).await;
    let before = counter.started();
    assert!(before >= 6, "the keeper checks the idle fleet: {before}");
    // The probe's closure holds `counter`'s Arcs: the layer's copy, and the keeper's.
    let held_with_keeper = Arc::strong_count(&counter.started);
    drop(balancer);
    tokio::time::sleep(60 * S).await;
    assert_eq!(
        counter.started(),
        before,
        "a dropped layer's keeper still checks"
    );
    assert!(
        Arc::strong_count(&counter.started) < held_with_keeper,
        "the keeper's copy of the probe is still alive ({} refs, {} before)",
        Arc::strong_count(&counter.started),
        held_with_keeper
    );
    // And the services the keeper held are gone: only `backends` (and the test's clones) hold
    // their counters.
    drop(layer);
    assert_eq!(
        Arc::strong_count(&backends[0].calls),
        1,
        "a service is still held"
    );
}

/// Dropped while a check hangs: the keeper still ends (and drops the hanging check).
#[tokio::test(start_paused = true)]
async fn idle_keeper_stops_when_dropped_with_a_check_hanging() {
    let counter = Counter::default();
    let layer = edas(0.4)
        .probe(counter.hangs())
        .probe_cadence(idle(2).timeout(3600 * S));
    let mut h = Harness::new(&layer, 3);
    run(&mut h, 6 * S).await;
    assert_eq!(counter.alive(), 3, "three checks hang");
    drop(h);
    tokio::time::sleep(S).await;
    assert_eq!(counter.alive(), 0, "the hanging checks outlive the adaptor");
}

/// No spin: an empty board, a board whose endpoints are all out or gone, and a probe that
/// answers at once on the smallest interval — the paused clock still advances (a keeper that
/// woke itself at one instant forever would hang the runtime), and the probe is called about
/// once an interval per endpoint in service.
#[test]
fn idle_no_busy_loop_empty_all_out_instant_probe() {
    paused_within(Duration::from_secs(60), || async {
        // An empty board: the upstream gives nothing.
        let counter = Counter::default();
        let layer = edas(1.0)
            .probe(counter.calls())
            .probe_cadence(idle(1).no_traffic_interval(Duration::from_millis(1)));
        let mut h = Harness::new(&layer, 0);
        h.sync();
        tokio::time::sleep(3600 * S).await;
        assert_eq!(counter.started(), 0);

        // Every endpoint out but the last (dead, the budget at 100 %).
        let counter = Counter::default();
        let layer = edas(1.0)
            .probe(counter.calls())
            .probe_cadence(idle(1).no_traffic_interval(Duration::from_millis(1)));
        let mut h = Harness::new(&layer, 4);
        for id in 0..4 {
            h.backend(id).set_failing(true);
        }
        run(&mut h, S).await;
        assert_eq!(h.live_ids().len(), 1, "the last stays: {:?}", h.live_ids());
        let before = counter.started();
        tokio::time::sleep(60 * S).await;
        // Only the last one is in service: about one check a millisecond of it (ejected ones
        // are looked at, not checked, by the keeper).
        let checks = counter.started() - before;
        assert!(checks <= 61_000, "{checks} checks in a minute");

        // Every endpoint removed after being checked.
        for id in 0..4 {
            h.remove(id);
        }
        h.sync();
        let before = counter.started();
        tokio::time::sleep(3600 * S).await;
        assert_eq!(counter.started(), before, "checks of removed endpoints");
    });
}

/// A probe that answers at once, a 1 ms interval: about one check per ms per endpoint, not a
/// loop at one instant.
#[test]
fn idle_instant_probe_does_not_loop_at_one_instant() {
    paused_within(Duration::from_secs(60), || async {
        let counter = Counter::default();
        let probe = {
            let counter = counter.clone();
            probe_fn(move |_: &usize, _: Backend| -> ProbeFuture {
                let _guard = counter.start();
                Box::pin(std::future::ready(true))
            })
        };
        let layer = edas(0.4)
            .probe(probe)
            .probe_cadence(idle(1).no_traffic_interval(Duration::from_millis(1)));
        let mut h = Harness::new(&layer, 3);
        h.sync();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let checks = counter.started();
        assert!(
            (20_000..=30_100).contains(&checks),
            "{checks} checks of 3 endpoints in 10 s at 1 ms"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 2. Probes that misbehave.
// ---------------------------------------------------------------------------------------------

/// A probe that panics inside `probe()` (not in its future) for one key: a failed check of that
/// key; the keeper goes on checking the others, and the panicking one goes out.
#[tokio::test(start_paused = true)]
async fn idle_probe_panicking_as_it_starts() {
    let counter = Counter::default();
    let seen = counter.clone();
    let probe = probe_fn(move |key: &usize, backend: Backend| -> ProbeFuture {
        assert_ne!(*key, 1, "the probe panics as it starts");
        let guard = seen.start();
        Box::pin(async move {
            let _guard = guard;
            backend.oneshot(()).await.is_ok()
        })
    });
    let layer = edas(0.4).probe(probe).probe_cadence(idle(2));
    let mut h = Harness::new(&layer, 4);
    run(&mut h, 11 * S).await;
    assert!(!h.is_live(1), "{:?}", layer.monitor().snapshot().get("1"));
    assert_eq!(h.live_ids(), [0, 2, 3]);
    let before = counter.started();
    run(&mut h, 10 * S).await;
    assert!(
        counter.started() >= before + 6,
        "the keeper goes on after the panics: {} then {}",
        before,
        counter.started()
    );
}

/// A probe that says `None` for a key (no check for it): the key is never taken out by the
/// checks, even with its backend dead; the others are checked.
#[tokio::test(start_paused = true)]
async fn idle_probe_returning_none_for_a_key() {
    let counter = Counter::default();
    let seen = counter.clone();
    let probe = tower_outlier::probe::probe_fn(move |key: &usize, backend: Backend| {
        let guard = seen.start();
        let skip = *key == 2;
        Box::pin(async move {
            let _guard = guard;
            skip || backend.oneshot(()).await.is_ok()
        }) as ProbeFuture
    });
    // A probe of our own that returns None for key 2, around probe_fn.
    #[derive(Clone)]
    struct NoneFor2<P>(P);
    impl<P: Probe<usize, Backend> + Clone + Send + 'static> Probe<usize, Backend> for NoneFor2<P> {
        fn probe(&mut self, key: &usize, service: Backend) -> Option<ProbeFuture> {
            if *key == 2 {
                return None;
            }
            self.0.probe(key, service)
        }
        fn sends_checks(&self) -> bool {
            true
        }
        fn idle_checker(&self) -> Option<tower_outlier::probe::IdleChecker<usize, Backend>> {
            Some(tower_outlier::probe::IdleChecker::new(self.clone()))
        }
    }
    let layer = edas(0.4).probe(NoneFor2(probe)).probe_cadence(idle(1));
    let mut h = Harness::new(&layer, 4);
    h.backend(2).set_failing(true);
    h.backend(3).set_failing(true);
    run(&mut h, 31 * S).await;
    assert!(h.is_live(2), "a key the probe does not check is taken out");
    assert!(!h.is_live(3));
    assert!(counter.started() >= 12, "{}", counter.started());
}

/// A probe future that never ends, with the cadence's timeout left unset: it fails at the
/// default timeout, the endpoint goes out, and no check piles up.
#[tokio::test(start_paused = true)]
async fn idle_probe_that_never_ends_default_timeout() {
    let counter = Counter::default();
    let layer = edas(0.4).probe(counter.hangs()).probe_cadence(idle(2));
    let mut h = Harness::new(&layer, 5);
    run(&mut h, 60 * S).await;
    // Two of five out (the budget), none of them left hanging.
    assert_eq!(h.live_ids().len(), 3, "{:?}", h.live_ids());
    assert!(
        counter.most_alive() <= 5,
        "{} checks alive at once",
        counter.most_alive()
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Upstream churn.
// ---------------------------------------------------------------------------------------------

/// Checks in flight are bounded (16 for a small fleet): removing and re-inserting the keys
/// while their checks hang must not start more and more checks alongside the abandoned ones.
#[tokio::test(start_paused = true)]
async fn idle_churn_keeps_checks_in_flight_bounded() {
    let counter = Counter::default();
    let layer = edas(0.4)
        .probe(counter.hangs())
        .probe_cadence(idle(2).timeout(3600 * S));
    let mut h = Harness::new(&layer, 20);
    run(&mut h, 6 * S).await;
    assert_eq!(counter.alive(), 16, "the bound for a small fleet");
    for _ in 0..10 {
        for id in 0..20 {
            h.remove(id);
        }
        h.sync();
        for id in 0..20 {
            h.insert(id);
        }
        h.sync();
        run(&mut h, 6 * S).await;
    }
    assert!(
        counter.alive() <= 20,
        "{} checks alive at once for 20 endpoints (the keeper forgot the ones of removed keys \
         but never stopped them)",
        counter.alive()
    );
}

/// Insert of a known key with a new service: the checks use the new one.
#[tokio::test(start_paused = true)]
async fn idle_reinserted_key_is_checked_on_its_new_service() {
    let counter = Counter::default();
    let layer = edas(0.4).probe(counter.calls()).probe_cadence(idle(2));
    let mut h = Harness::new(&layer, 4);
    let old = h.backend(2).clone();
    old.set_failing(true);
    run(&mut h, 6 * S).await; // one failed check of the old one
    let fresh = Backend::new(2);
    h.backends.insert(2, fresh.clone());
    h.insert(2);
    h.sync();
    let old_calls = old.calls();
    run(&mut h, 30 * S).await;
    assert_eq!(old.calls(), old_calls, "the old service is still checked");
    assert!(
        fresh.calls() >= 4,
        "the new one is checked: {}",
        fresh.calls()
    );
    assert!(h.is_live(2));
}

/// A check in flight on a service the upstream has since replaced (same key): its failure is
/// about the old service, not the endpoint as it is now; with a threshold of 1 it must not take
/// out the endpoint whose new service answers.
#[tokio::test(start_paused = true)]
async fn idle_check_in_flight_on_a_replaced_service_does_not_count() {
    let probe = probe_fn(move |_: &usize, backend: Backend| -> ProbeFuture {
        Box::pin(async move {
            tokio::time::sleep(2 * S).await;
            backend.oneshot(()).await.is_ok()
        })
    });
    let layer = edas(0.4)
        .probe(probe)
        .probe_cadence(idle(1).timeout(10 * S));
    let (events, _guard) = record_events(&layer.monitor());
    let mut h = Harness::new(&layer, 4);
    h.backend(2).set_failing(true);
    run(&mut h, 5500 * Duration::from_millis(1)).await; // a check of the old one in flight
    let fresh = Backend::new(2);
    h.backends.insert(2, fresh.clone());
    h.insert(2);
    h.sync();
    run(&mut h, 2 * S).await; // the old one's check ends, failed
    assert!(
        active_check_ejections(&events).is_empty(),
        "taken out for its old service's failed check: {:?}",
        active_check_ejections(&events)
    );
}

/// `rebuild_on_return`: an endpoint that comes back with a fresh service (its old connections
/// dead) is checked, while idle, on that fresh service — not the stale one, which would fail
/// every check and take the healthy endpoint out again and again.
#[tokio::test(start_paused = true)]
async fn idle_rebuilt_endpoint_is_checked_on_its_new_service() {
    #[derive(Clone)]
    struct Conn {
        generation: usize,
        dead: Arc<AtomicBool>,
    }
    impl Service<()> for Conn {
        type Response = usize;
        type Error = io::Error;
        type Future = std::future::Ready<Result<usize, io::Error>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: ()) -> Self::Future {
            std::future::ready(if self.dead.load(Ordering::SeqCst) {
                Err(io::ErrorKind::ConnectionRefused.into())
            } else {
                Ok(self.generation)
            })
        }
    }
    let made = Arc::new(AtomicUsize::new(0));
    let factory = {
        let made = made.clone();
        move |_: &usize| Conn {
            generation: made.fetch_add(1, Ordering::SeqCst) + 1,
            dead: Arc::new(AtomicBool::new(false)),
        }
    };
    let checked: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
    let seen = checked.clone();
    let probe = probe_fn(move |key: &usize, conn: Conn| -> ProbeFuture {
        seen.lock().unwrap().push((*key, conn.generation));
        Box::pin(async move { conn.oneshot(()).await.is_ok() })
    });
    let layer = edas(0.4)
        .probe(probe)
        .probe_cadence(idle(2))
        .rebuild_on_return(rebuild_fn(factory));
    let monitor = layer.monitor();
    let (events, _guard) = record_events(&monitor);
    let first: Vec<Conn> = (0..3)
        .map(|_| Conn {
            generation: 0,
            dead: Arc::new(AtomicBool::new(false)),
        })
        .collect();
    let upstream = announce(
        &first
            .iter()
            .enumerate()
            .map(|(k, c)| (k, c.clone()))
            .collect::<Vec<_>>(),
    );
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, upstream), SeededRng(7));
    let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
    // Traffic; key 0's connections die; calls go on until it is out.
    first[0].dead.store(true, Ordering::SeqCst);
    let mut waited = 0;
    while status(&monitor, 0) != EndpointStatus::Ejected {
        let _ = balancer.ready().await.unwrap().call(()).await;
        tokio::time::advance(Duration::from_millis(10)).await;
        waited += 1;
        assert!(waited < 5000, "never ejected");
    }
    // Its recovery check runs on the rebuilt service (generation 1), which answers: back.
    let until = Instant::now() + 30 * S;
    while Instant::now() < until && status(&monitor, 0) != EndpointStatus::Available {
        let _ = balancer.ready().await.unwrap().call(()).await;
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    assert_eq!(made.load(Ordering::SeqCst), 1, "rebuilt once");
    let rebuilt_at = checked.lock().unwrap().len();
    // A quiet minute, the balancer polled (a caller waiting in `ready`).
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
    }
    let stale: Vec<(usize, usize)> = checked.lock().unwrap()[rebuilt_at..]
        .iter()
        .copied()
        .filter(|&(key, generation)| key == 0 && generation == 0)
        .collect();
    assert!(
        stale.is_empty() && active_check_ejections(&events).is_empty(),
        "checked {} times on its dead old service; taken out by its checks at {:?}",
        stale.len(),
        active_check_ejections(&events)
    );
}

// ---------------------------------------------------------------------------------------------
// 5. The guarantees.
// ---------------------------------------------------------------------------------------------

/// An endpoint whose ejection by its checks was refused (the budget) keeps its count; it heals
/// and gets traffic that succeeds. When room appears (the others come back), it must not be
/// taken out by the checks it failed before its traffic.
#[tokio::test(start_paused = true)]
async fn idle_refused_count_does_not_eject_an_endpoint_with_traffic() {
    let counter = Counter::default();
    let layer = edas(0.4).probe(counter.calls()).probe_cadence(idle(2));
    let (events, _guard) = record_events(&layer.monitor());
    let mut h = Harness::new(&layer, 5);
    for id in [1, 2, 3] {
        h.backend(id).set_failing(true);
    }
    run(&mut h, 10500 * Duration::from_millis(1)).await;
    assert_eq!(h.live_ids(), [0, 3, 4], "two out (the budget), 3 refused");
    // 3 heals and gets traffic: its calls succeed.
    h.backend(3).set_failing(false);
    h.calls_while_live(3, 0, 20).await;
    run(&mut h, 200 * Duration::from_millis(1)).await;
    h.calls_while_live(3, 0, 20).await;
    // 1 and 2 heal: back by their checks (2 s apart), which makes room.
    h.backend(1).set_failing(false);
    h.backend(2).set_failing(false);
    for _ in 0..30 {
        h.calls_while_live(3, 0, 1).await; // traffic to 3 every 100 ms throughout
        run(&mut h, Duration::from_millis(100)).await;
    }
    let out: Vec<(Instant, String)> = active_check_ejections(&events)
        .into_iter()
        .filter(|(_, key)| key == "3")
        .collect();
    assert!(
        out.is_empty(),
        "endpoint 3, with successful calls every 100 ms, taken out by its active checks: {out:?}\n{:#?}",
        events.lock().unwrap()
    );
    assert!(h.is_live(3));
}

/// The counting key: counts its clones, to measure the engine's work on the adaptor's poll.
struct CountedKey(usize, Arc<AtomicUsize>);

impl std::fmt::Debug for CountedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl PartialEq for CountedKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for CountedKey {}

impl Clone for CountedKey {
    fn clone(&self) -> Self {
        self.1.fetch_add(1, Ordering::Relaxed);
        CountedKey(self.0, self.1.clone())
    }
}

impl Hash for CountedKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

/// A quiet service with a dead endpoint, nothing polling the balancer (behind `Buffer`): the
/// first poll after the quiet must not do work in proportion to how long the quiet lasted (the
/// failed checks past the threshold each queue the endpoint again, and the first poll judges it
/// once per queued flag).
#[tokio::test(start_paused = true)]
async fn idle_flags_do_not_pile_up_while_nothing_polls() {
    async fn first_poll_work(quiet: Duration) -> usize {
        let clones = Arc::new(AtomicUsize::new(0));
        let backends: Vec<Backend> = (0..3).map(Backend::new).collect();
        let layer = edas(0.4)
            .probe(probe_fn(|_: &CountedKey, b: Backend| -> ProbeFuture {
                Box::pin(async move { b.oneshot(()).await.is_ok() })
            }))
            .probe_cadence(idle(1).no_traffic_interval(Duration::from_millis(1)));
        let (tx, rx) =
            futures::channel::mpsc::unbounded::<Result<Change<CountedKey, Backend>, Infallible>>();
        for b in &backends {
            tx.unbounded_send(Ok(Change::Insert(
                CountedKey(b.id, clones.clone()),
                b.clone(),
            )))
            .unwrap();
        }
        let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, rx), SeededRng(1));
        let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
        backends[1].set_failing(true);
        tokio::time::sleep(quiet).await;
        let before = clones.load(Ordering::Relaxed);
        let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
        assert_eq!(
            status(&layer.monitor(), 1),
            EndpointStatus::Ejected,
            "out at the first poll"
        );
        drop(tx);
        clones.load(Ordering::Relaxed) - before
    }
    let short = first_poll_work(Duration::from_millis(100)).await;
    let long = first_poll_work(Duration::from_secs(10)).await;
    assert!(
        long <= short * 2 + 50,
        "the first poll after a 10 s quiet cloned the key {long} times, after 0.1 s {short}: \
         one queued flag per failed check past the threshold"
    );
}

/// Reconfiguration while a slow endpoint has calls in flight: it has traffic, and must not be
/// checked as idle (nor taken out by a check that times out because it is slow).
#[tokio::test(start_paused = true)]
async fn idle_slow_endpoint_with_calls_in_flight_is_not_checked_across_reconfiguration() {
    for reconfigure in [false, true] {
        let backends: Vec<Sleepy> = (0..3).map(|id| Sleepy::new(id, 10)).collect();
        let checked = Arc::new(Mutex::new(Vec::new()));
        let seen = checked.clone();
        let probe = probe_fn(move |key: &usize, s: Sleepy| -> ProbeFuture {
            seen.lock().unwrap().push((Instant::now(), *key));
            Box::pin(async move { s.oneshot(()).await.is_ok() })
        });
        let layer = edas(0.4).probe(probe).probe_cadence(idle(1).timeout(S));
        let monitor = layer.monitor();
        let (events, _guard) = record_events(&monitor);
        let upstream = announce(
            &backends
                .iter()
                .map(|b| (b.id, b.clone()))
                .collect::<Vec<_>>(),
        );
        let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, upstream), SeededRng(5));
        // Endpoint 0 turns slow: a minute a call; a burst of calls, some stuck on it.
        backends[0].set_latency(60_000);
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..30 {
            let call = balancer.ready().await.unwrap().call(());
            calls.spawn(call);
        }
        assert!(
            backends[0].in_flight.load(Ordering::SeqCst) > 0,
            "a call is stuck on the slow one"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        if reconfigure {
            layer
                .rules()
                .replace(
                    0,
                    ErrorRatePolicy::new(
                        ErrorRateConfig::edas_spring_cloud()
                            .recovery_unit(Duration::from_secs(20))
                            .max_ejection_ratio(0.4)
                            .build()
                            .unwrap(),
                    ),
                )
                .unwrap();
        }
        // 30 s quiet but for the calls in flight; the balancer polled.
        for _ in 0..300 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
        }
        assert!(backends[0].in_flight.load(Ordering::SeqCst) > 0);
        let checks_of_0 = checked
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, key)| *key == 0)
            .count();
        assert!(
            checks_of_0 == 0 && active_check_ejections(&events).is_empty(),
            "reconfigured {reconfigure}: endpoint 0, with calls in flight, checked {checks_of_0} \
             times as idle; taken out by its checks: {:?}",
            active_check_ejections(&events)
        );
        calls.abort_all();
    }
}

/// Re-admitted on trial after an ejection by the rules, then the service goes quiet: a trial
/// needs calls to end, so with none the endpoint stays on trial — out of the checks' reach
/// (they skip endpoints with an episode). It dies in the quiet; it must still be checked and
/// taken out before the first call after it.
#[tokio::test(start_paused = true)]
async fn idle_endpoint_on_trial_in_a_quiet_spell_is_still_checked() {
    let backends: Vec<Backend> = (0..5).map(Backend::new).collect();
    let counter = Counter::default();
    let layer = edas(0.4).probe(counter.calls()).probe_cadence(idle(2));
    let monitor = layer.monitor();
    let (events, _guard) = record_events(&monitor);
    let upstream = announce(
        &backends
            .iter()
            .map(|b| (b.id, b.clone()))
            .collect::<Vec<_>>(),
    );
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, upstream), SeededRng(11));
    let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
    // Traffic; 3 fails until the rules take it out; it heals and its check brings it back.
    backends[3].set_failing(true);
    let mut n = 0;
    while status(&monitor, 3) != EndpointStatus::Ejected {
        let _ = balancer.ready().await.unwrap().call(()).await;
        tokio::time::advance(Duration::from_millis(10)).await;
        n += 1;
        assert!(n < 10_000, "never ejected");
    }
    backends[3].set_failing(false);
    let mut n = 0;
    while status(&monitor, 3) == EndpointStatus::Ejected {
        let _ = balancer.ready().await.unwrap().call(()).await;
        tokio::time::advance(Duration::from_millis(10)).await;
        n += 1;
        assert!(n < 10_000, "never back");
    }
    let readmitted = events
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find_map(|(_, e)| match e {
            Event::Readmitted { key, trial, .. } if *key == "3" => Some(*trial),
            _ => None,
        });
    // The quiet: 3 dies again at once; the balancer polled every 100 ms for two minutes.
    backends[3].set_failing(true);
    let checks_before = backends[3].calls();
    for _ in 0..1200 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = futures::poll!(std::future::poll_fn(|cx| balancer.poll_ready(cx)));
    }
    let shown = monitor.snapshot().get("3").unwrap().clone();
    assert_eq!(
        shown.status,
        EndpointStatus::Ejected,
        "readmitted with trial {readmitted:?}; after two quiet minutes it is {:?}, checked {} \
         times while idle: {shown:#?}",
        shown.status,
        backends[3].calls() - checks_before
    );
}

/// Ten thousand idle endpoints, every one healthy, checks taking 100 ms: no endpoint goes out,
/// at most a tenth are checked at once, every endpoint is checked about once an interval, and
/// the adaptor's polls stay cheap.
#[tokio::test(start_paused = true)]
async fn idle_ten_thousand_endpoints() {
    let counter = Counter::default();
    let probe = {
        let counter = counter.clone();
        probe_fn(move |_: &usize, backend: Backend| -> ProbeFuture {
            let guard = counter.start();
            Box::pin(async move {
                let _guard = guard;
                tokio::time::sleep(Duration::from_millis(100)).await;
                backend.oneshot(()).await.is_ok()
            })
        })
    };
    let layer = edas(0.1)
        .probe(probe)
        .probe_cadence(ProbeCadence::new().no_traffic_interval(5 * S));
    let mut h = Harness::new(&layer, 10_000);
    let wall = std::time::Instant::now();
    let mut slowest_sync = Duration::ZERO;
    for _ in 0..310 {
        tokio::time::advance(Duration::from_millis(100)).await;
        tokio::task::yield_now().await;
        let t = std::time::Instant::now();
        h.sync();
        slowest_sync = slowest_sync.max(t.elapsed());
    }
    let checks = counter.started();
    println!(
        "10 000 idle: {checks} checks in 31 s, at most {} at once, {:?} of real time, slowest \
         poll {slowest_sync:?}",
        counter.most_alive(),
        wall.elapsed()
    );
    assert_eq!(h.live_ids().len(), 10_000);
    assert!(
        counter.most_alive() <= 1000,
        "{} at once",
        counter.most_alive()
    );
    assert!((40_000..=60_000).contains(&checks), "{checks} checks");
    assert!(
        slowest_sync < Duration::from_millis(500),
        "{slowest_sync:?}"
    );
}

/// Ten thousand idle endpoints, a fifth of them dead, a budget of a tenth: a thousand go out
/// and another thousand are refused — and judged again at each of their failed checks. The
/// adaptor's polls must stay cheap (each flagged endpoint is looked up by id).
#[tokio::test(start_paused = true)]
async fn idle_ten_thousand_endpoints_a_fifth_dead() {
    let counter = Counter::default();
    let layer = edas(0.1).probe(counter.calls()).probe_cadence(
        ProbeCadence::new()
            .no_traffic_interval(5 * S)
            .unhealthy_threshold(1),
    );
    let mut h = Harness::new(&layer, 10_000);
    for id in (0..10_000).step_by(5) {
        h.backend(id).set_failing(true);
    }
    let mut slowest_sync = Duration::ZERO;
    for _ in 0..310 {
        tokio::time::advance(Duration::from_millis(100)).await;
        tokio::task::yield_now().await;
        let t = std::time::Instant::now();
        h.sync();
        slowest_sync = slowest_sync.max(t.elapsed());
    }
    let out = 10_000 - h.live_ids().len();
    println!("a fifth dead: {out} out, slowest poll {slowest_sync:?}");
    assert_eq!(out, 1000, "the budget");
    assert!(
        slowest_sync < Duration::from_millis(500),
        "slowest poll {slowest_sync:?}"
    );
}

/// Taken out by its checks, then forced out by an operator, healed, released: it comes back
/// once traffic polls the balancer. Likewise when the upstream gives its key a new, healthy
/// service while it is out.
#[tokio::test(start_paused = true)]
async fn idle_active_check_ejection_always_comes_back() {
    let counter = Counter::default();
    let layer = edas(0.4).probe(counter.calls()).probe_cadence(idle(2));
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    h.backend(1).set_failing(true);
    h.backend(2).set_failing(true);
    run(&mut h, 11 * S).await;
    assert_eq!(h.live_ids(), [0, 3, 4]);
    rules.force_out(&1usize);
    run(&mut h, S).await;
    h.backend(1).set_failing(false);
    run(&mut h, 5 * S).await;
    assert!(!h.is_live(1), "forced out");
    rules.release(&1usize);
    run(&mut h, 10 * S).await;
    assert!(
        h.is_live(1),
        "healed and released: {:?}",
        layer.monitor().snapshot().get("1")
    );
    // 2: a new service for its key while it is out.
    let fresh = Backend::new(2);
    h.backends.insert(2, fresh);
    h.insert(2);
    run(&mut h, 10 * S).await;
    assert!(
        h.is_live(2),
        "its new service answers: {:?}",
        layer.monitor().snapshot().get("2")
    );
}

/// Under steady traffic to every endpoint, a probe that always fails (a wrong health path)
/// never takes one out: endpoints with traffic are judged by their calls.
#[tokio::test(start_paused = true)]
async fn idle_endpoints_with_traffic_are_never_taken_out_by_failing_checks() {
    let counter = Counter::default();
    let probe = {
        let counter = counter.clone();
        probe_fn(move |_: &usize, _: Backend| -> ProbeFuture {
            let guard = counter.start();
            Box::pin(async move {
                let _guard = guard;
                false
            })
        })
    };
    let layer = edas(0.4).probe(probe).probe_cadence(
        ProbeCadence::new()
            .no_traffic_interval(Duration::from_millis(500))
            .unhealthy_threshold(1),
    );
    let (events, _guard) = record_events(&layer.monitor());
    let backends: Vec<Backend> = (0..5).map(Backend::new).collect();
    let upstream = announce(
        &backends
            .iter()
            .map(|b| (b.id, b.clone()))
            .collect::<Vec<_>>(),
    );
    let mut balancer = Balance::from_rng(tower::Layer::layer(&layer, upstream), SeededRng(2));
    // 200 calls a second, 60 s: each endpoint gets ~40 a second.
    let until = Instant::now() + 60 * S;
    while Instant::now() < until {
        balancer.ready().await.unwrap().call(()).await.unwrap();
        tokio::time::advance(Duration::from_millis(5)).await;
    }
    assert!(
        active_check_ejections(&events).is_empty(),
        "{:?} (checks sent: {})",
        active_check_ejections(&events),
        counter.started()
    );
}

/// A health watch saying NOT_SERVING on an endpoint whose checks have been failing: out by its
/// health; back when it says SERVING, with a fresh count (one more failed check with a
/// threshold of 2 keeps it in).
#[tokio::test(start_paused = true)]
async fn idle_health_watch_and_checks_on_one_endpoint() {
    use futures::channel::mpsc as fmpsc;
    use tower_outlier::probe::{Health, HealthStream, IdleChecker};
    #[derive(Clone)]
    struct Watched {
        words: Arc<Mutex<Option<fmpsc::UnboundedReceiver<Health>>>>,
    }
    impl Probe<usize, Backend> for Watched {
        fn probe(&mut self, _: &usize, backend: Backend) -> Option<ProbeFuture> {
            Some(Box::pin(async move { backend.oneshot(()).await.is_ok() }))
        }
        fn watch(&mut self, key: &usize, _: &Backend) -> Option<HealthStream> {
            if *key != 1 {
                return None;
            }
            let rx = self.words.lock().unwrap().take()?;
            Some(Box::pin(rx))
        }
        fn sends_checks(&self) -> bool {
            true
        }
        fn idle_checker(&self) -> Option<IdleChecker<usize, Backend>> {
            Some(IdleChecker::new(self.clone()))
        }
    }
    let (tx, rx) = fmpsc::unbounded();
    let layer = edas(0.4)
        .probe(Watched {
            words: Arc::new(Mutex::new(Some(rx))),
        })
        .probe_cadence(idle(2));
    let (events, _guard) = record_events(&layer.monitor());
    let mut h = Harness::new(&layer, 5);
    tx.unbounded_send(Health::Serving).unwrap();
    h.backend(1).set_failing(true);
    run(&mut h, 6 * S).await; // one failed check
    assert!(h.is_live(1));
    tx.unbounded_send(Health::NotServing).unwrap();
    run(&mut h, S).await;
    assert!(!h.is_live(1), "out by its health");
    run(&mut h, 10 * S).await;
    tx.unbounded_send(Health::Serving).unwrap();
    run(&mut h, 100 * Duration::from_millis(1)).await;
    assert!(h.is_live(1), "back by its health");
    // It fails its checks still: out after two of them, not one.
    run(&mut h, 5500 * Duration::from_millis(1)).await;
    assert!(
        h.is_live(1),
        "one failed check after its return: {:?}",
        active_check_ejections(&events)
    );
    run(&mut h, 5 * S).await;
    assert!(!h.is_live(1), "two");
}

/// An adaptor first polled outside a tokio runtime (another executor) starts no keeper then, and
/// starts it at its first poll inside one: the checks run from there.
#[test]
fn a_keeper_starts_once_a_runtime_polls_the_adaptor() {
    use futures::StreamExt;
    let backends: Vec<Backend> = (0..3).map(Backend::new).collect();
    let checks = Arc::new(AtomicUsize::new(0));
    let counted = checks.clone();
    let probe = probe_fn(move |_: &usize, backend: Backend| -> ProbeFuture {
        counted.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { backend.oneshot(()).await.is_ok() })
    });
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ))
    .probe(probe)
    .probe_cadence(
        ProbeCadence::new()
            .no_traffic_interval(Duration::from_millis(50))
            .unhealthy_threshold(1),
    );
    let (tx, rx) =
        futures::channel::mpsc::unbounded::<Result<Change<usize, Backend>, Infallible>>();
    for b in &backends {
        tx.unbounded_send(Ok(Change::Insert(b.id, b.clone())))
            .unwrap();
    }
    let mut adaptor = tower::Layer::layer(&layer, rx);
    // Outside any runtime: the three inserts come through, no keeper starts.
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    for _ in 0..3 {
        assert!(adaptor.poll_next_unpin(&mut cx).is_ready());
    }
    // The real clock (the layer was made outside a runtime: its clock is the real one).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    backends[2].set_failing(true);
    runtime.block_on(async {
        // Inside one: the next poll starts it.
        let _ = futures::poll!(adaptor.next());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(checks.load(Ordering::SeqCst) >= 3, "no checks ran");
        match tokio::time::timeout(S, adaptor.next()).await {
            Ok(Some(Ok(Change::Remove(key)))) => assert_eq!(key, 2),
            other => panic!("the dead endpoint was not taken out: {:?}", other.is_ok()),
        }
    });
    drop(tx);
}
