//! Where the options cross, as a model-based test: seeded random histories over the presets
//! (the recommended detectors, linkerd's, gRPC's, Envoy's, two policies at once) × what the layer
//! does when every endpoint would be out (each preset's `WhenAllOut`) × dry run (layer-wide and
//! per policy) × operators' overrides and resets × servers' pushback × health watches (flapping
//! and panicking) × degraded servers × fresh services on return × new rules × upstream churn ×
//! readiness errors × checks of endpoints without traffic (`no_traffic_interval`, run in their own
//! task, in half the histories), on tokio's paused clock, the adaptor driven as a balancer drives it. After
//! every step:
//!
//! 1. No change removes an endpoint the balancer does not have, and the balancer's set is what
//!    the monitor says it should be.
//! 2. The set is never empty while the upstream holds an endpoint, unless the layer fails fast
//!    and the rules themselves took every endpoint out: no pushback, health word or operator
//!    takes the last.
//! 3. Layer-wide dry run changes no routing (every endpoint not forced out is in the set) and
//!    makes no new service.
//! 4. An endpoint an operator forced in is in the set, its load not avoided.
//! 5. Counts hold: outside panic, the endpoints out and the set add up to the upstream.
//! 6. Memory is bounded: the adaptor and the monitor track exactly the upstream's keys.
//!
//! At the end, liveness: every fault lifted, every watch serving, every override released and dry
//! run off, every endpoint is back in the set within twenty minutes: none is held out for good by
//! a signal, a probe or a mode.
//!
//! `SOAK_HISTORIES=100000 cargo test --release --test rules crossings::` is the soak (CI runs a
//! few hundred); a violation names its preset, seed and step.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::channel::mpsc;
use futures::Stream;
use tower::discover::Change;
use tower::load::Load;
use tower::Service;
use tower_outlier::discover::{OutlierDetectionDiscover, OutlierEndpoint};
use tower_outlier::probe::{Health, HealthStream, IdleChecker, Probe, ProbeCadence, ProbeFuture};
use tower_outlier::rebuild::Rebuild;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, ErrorRateConfig, ErrorRatePolicy,
    OutlierDetectionLayer, ServerErrors, WhenAllOut,
};

use crate::support::SeededRng;

/// The presets the histories run, each with its own choice when every endpoint would be out.
const PRESETS: [&str; 5] = ["recommended", "linkerd", "grpc", "envoy", "two policies"];

/// How many histories each preset runs: 60 in CI, `SOAK_HISTORIES` in all for a soak.
fn histories() -> u64 {
    std::env::var("SOAK_HISTORIES")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(60, |n| n.div_ceil(PRESETS.len() as u64))
}

/// What a server does now.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Healthy,
    /// Answers 500.
    Failing,
    /// Refuses connections: a transport failure (a fresh service is due on return).
    Refused,
    /// Answers `503 Retry-After: <seconds>`.
    AsksFor(u64),
    /// Its `poll_ready` fails.
    Unready,
    /// Answers 200 with `x-envoy-degraded`.
    Degraded,
}

type Modes = Arc<Mutex<HashMap<usize, Arc<Mutex<Mode>>>>>;

/// One service of a key; every service made for the key shares its mode.
#[derive(Clone)]
struct Server {
    mode: Arc<Mutex<Mode>>,
}

impl Server {
    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap()
    }
}

impl Service<()> for Server {
    type Response = http::Response<()>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<http::Response<()>, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.mode() == Mode::Unready {
            Poll::Ready(Err(io::Error::other("the connection's worker is gone")))
        } else {
            Poll::Ready(Ok(()))
        }
    }

    fn call(&mut self, _: ()) -> Self::Future {
        let response = |status: u16| http::Response::builder().status(status);
        std::future::ready(match self.mode() {
            Mode::Healthy | Mode::Unready => Ok(response(200).body(()).unwrap()),
            Mode::Failing => Ok(response(500).body(()).unwrap()),
            Mode::Refused => Err(io::ErrorKind::ConnectionRefused.into()),
            Mode::AsksFor(seconds) => Ok(response(503)
                .header("retry-after", seconds.to_string())
                .body(())
                .unwrap()),
            Mode::Degraded => Ok(response(200)
                .header("x-envoy-degraded", "")
                .body(())
                .unwrap()),
        })
    }
}

/// The probe: an active check of the endpoint's service, and a health watch per key the test
/// speaks through; a key in `panicky` has a watch that says NOT_SERVING, then panics.
#[derive(Clone, Default)]
struct Watching {
    senders: Arc<Mutex<HashMap<usize, mpsc::UnboundedSender<Health>>>>,
    panicky: Arc<Mutex<HashSet<usize>>>,
    // Its checks are sent (the cadence times them, and endpoints without traffic are checked
    // from a task of their own).
    checks: bool,
}

impl Watching {
    fn say(&self, key: usize, health: Health) {
        if let Some(sender) = self.senders.lock().unwrap().get(&key) {
            let _ = sender.unbounded_send(health);
        }
    }
}

impl Probe<usize, Server> for Watching {
    fn probe(&mut self, _: &usize, service: Server) -> Option<ProbeFuture> {
        let healthy = matches!(service.mode(), Mode::Healthy | Mode::Degraded);
        Some(Box::pin(std::future::ready(healthy)))
    }

    fn sends_checks(&self) -> bool {
        self.checks
    }

    fn idle_checker(&self) -> Option<IdleChecker<usize, Server>> {
        self.checks.then(|| IdleChecker::new(self.clone()))
    }

    fn watch(&mut self, key: &usize, _: &Server) -> Option<HealthStream> {
        if self.panicky.lock().unwrap().contains(key) {
            let mut said = false;
            return Some(Box::pin(futures::stream::poll_fn(move |_| {
                if said {
                    panic!("the watch broke");
                }
                said = true;
                Poll::Ready(Some(Health::NotServing))
            })));
        }
        let (tx, rx) = mpsc::unbounded();
        self.senders.lock().unwrap().insert(*key, tx);
        Some(Box::pin(rx))
    }
}

/// A fresh service on return, counting those made while layer-wide dry run is on.
#[derive(Clone)]
struct Fresh {
    modes: Modes,
    dry_run: Arc<AtomicBool>,
    made_in_dry_run: Arc<AtomicUsize>,
}

impl Rebuild<usize, Server> for Fresh {
    fn rebuild(&self, key: &usize, current: &Server) -> Option<Server> {
        if self.dry_run.load(Ordering::SeqCst) {
            self.made_in_dry_run.fetch_add(1, Ordering::SeqCst);
        }
        let mode = self.modes.lock().unwrap().get(key).cloned();
        Some(Server {
            mode: mode.unwrap_or_else(|| current.mode.clone()),
        })
    }
}

type Upstream = mpsc::UnboundedReceiver<Result<Change<usize, Server>, Infallible>>;
type Layer = OutlierDetectionLayer<ServerErrors, Watching, Fresh>;

/// A layer of `preset` and the fleet behind it, driven as a balancer drives the adaptor.
struct World {
    preset: &'static str,
    all_out: WhenAllOut,
    policies: usize,
    layer: Layer,
    watching: Watching,
    tx: mpsc::UnboundedSender<Result<Change<usize, Server>, Infallible>>,
    adaptor: OutlierDetectionDiscover<Upstream, ServerErrors, Watching>,
    live: HashMap<usize, OutlierEndpoint<Server, ServerErrors>>,
    task: tokio_test::task::Spawn<()>,
    modes: Modes,
    upstream: BTreeSet<usize>,
    forced_out: HashSet<usize>,
    forced_in: HashSet<usize>,
    dry_run: Arc<AtomicBool>,
    made_in_dry_run: Arc<AtomicUsize>,
    next_key: usize,
}

/// The detectors' builder of `preset`, as its layer starts.
fn detector_preset(preset: &str) -> tower_outlier::detectors::DetectorBuilder {
    match preset {
        // Failing fast, as linkerd does (the preset keeps the last unless told): the crossing
        // the rules may empty the set in.
        "linkerd" => DetectorConfig::linkerd().when_all_out(WhenAllOut::FailFast),
        "grpc" => DetectorConfig::grpc().max_ejection_percent(50),
        "envoy" => DetectorConfig::envoy().max_ejection_percent(60),
        _ => DetectorConfig::recommended(),
    }
}

impl World {
    fn new(preset: &'static str, rng: &mut SeededRng) -> Self {
        let seed = rng.below(1_000_000);
        let detectors = |config: tower_outlier::detectors::DetectorBuilder| -> DetectorPolicy {
            DetectorPolicy::seeded(config.build().unwrap(), seed)
        };
        let (base, all_out, policies) = match preset {
            "linkerd" | "grpc" => (
                OutlierDetectionLayer::new(detectors(detector_preset(preset))),
                WhenAllOut::FailFast,
                1,
            ),
            "envoy" => (
                OutlierDetectionLayer::new(detectors(detector_preset(preset))),
                WhenAllOut::PanicBelow(0.5),
                1,
            ),
            "two policies" => (
                OutlierDetectionLayer::new(ErrorRatePolicy::new(
                    ErrorRateConfig::hsf()
                        .min_calls(4)
                        .max_ejection_ratio(0.5)
                        .recovery_unit(Duration::from_secs(10))
                        .build()
                        .unwrap(),
                ))
                .with_policy(detectors(detector_preset(preset))),
                WhenAllOut::KeepLast,
                2,
            ),
            _ => (
                OutlierDetectionLayer::new(detectors(detector_preset(preset))),
                WhenAllOut::KeepLast,
                1,
            ),
        };
        let watching = Watching {
            checks: rng.below(2) == 0,
            ..Watching::default()
        };
        let modes: Modes = Arc::default();
        let dry_run = Arc::new(AtomicBool::new(false));
        let made_in_dry_run = Arc::new(AtomicUsize::new(0));
        let layer = base
            .classifier(ServerErrors)
            .probe(watching.clone())
            .detect_degraded(Duration::from_secs(2))
            .max_pushback(Duration::from_secs(1 + rng.below(40)))
            .probe_cadence(
                ProbeCadence::new()
                    .no_traffic_interval(Duration::from_secs(1 + rng.below(30)))
                    .unhealthy_threshold(1 + rng.below(3) as u32),
            )
            .rebuild_on_return(Fresh {
                modes: modes.clone(),
                dry_run: dry_run.clone(),
                made_in_dry_run: made_in_dry_run.clone(),
            });
        let (tx, rx) = mpsc::unbounded();
        let adaptor = tower::Layer::layer(&layer, rx);
        World {
            preset,
            all_out,
            policies,
            layer,
            watching,
            tx,
            adaptor,
            live: HashMap::new(),
            task: tokio_test::task::spawn(()),
            modes,
            upstream: BTreeSet::new(),
            forced_out: HashSet::new(),
            forced_in: HashSet::new(),
            dry_run,
            made_in_dry_run,
            next_key: 0,
        }
    }

    /// Gives the upstream a service for `key`: a new key, or a new service for a known one.
    fn insert(&mut self, key: usize) {
        let mode = self
            .modes
            .lock()
            .unwrap()
            .entry(key)
            .or_insert_with(|| Arc::new(Mutex::new(Mode::Healthy)))
            .clone();
        self.upstream.insert(key);
        self.tx
            .unbounded_send(Ok(Change::Insert(key, Server { mode })))
            .unwrap();
    }

    fn remove(&mut self, key: usize) {
        self.upstream.remove(&key);
        self.forced_out.remove(&key);
        self.forced_in.remove(&key);
        self.tx.unbounded_send(Ok(Change::Remove(key))).unwrap();
    }

    fn set_mode(&self, key: usize, mode: Mode) {
        if let Some(m) = self.modes.lock().unwrap().get(&key) {
            *m.lock().unwrap() = mode;
        }
    }

    /// Polls the adaptor until it is pending, as a balancer does, applying what it yields.
    fn sync(&mut self, context: &str) {
        loop {
            let (task, adaptor) = (&mut self.task, &mut self.adaptor);
            let polled = task.enter(|cx, _| std::pin::Pin::new(&mut *adaptor).poll_next(cx));
            match polled {
                Poll::Ready(Some(Ok(Change::Insert(key, endpoint)))) => {
                    self.live.insert(key, endpoint);
                }
                Poll::Ready(Some(Ok(Change::Remove(key)))) => {
                    assert!(
                        self.live.remove(&key).is_some(),
                        "{context}: Remove({key}) of an endpoint the balancer does not have"
                    );
                }
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => panic!("{context}: the adaptor ended"),
                Poll::Pending => return,
            }
        }
    }

    /// Up to `calls` calls, each to a random endpoint of the set that is ready, as p2c picks
    /// among the ready ones.
    async fn traffic(&mut self, rng: &mut SeededRng, calls: u64, context: &str) {
        for _ in 0..calls {
            let keys: Vec<usize> = self.live.keys().copied().collect();
            if keys.is_empty() {
                return;
            }
            let key = keys[rng.below(keys.len() as u64) as usize];
            let Some(endpoint) = self.live.get_mut(&key) else {
                continue;
            };
            let ready = self.task.enter(|cx, _| endpoint.poll_ready(cx));
            if let Poll::Ready(Ok(())) = ready {
                let _ = endpoint.call(()).await;
            }
            self.sync(context);
        }
    }

    /// The invariants, after a step.
    fn check(&mut self, context: &str) {
        let monitor = self.layer.monitor();
        let snapshot = monitor.snapshot();
        // 6: exactly the upstream's keys are tracked; nothing else is in the set.
        assert_eq!(self.adaptor.tracked(), self.upstream.len(), "{context}");
        assert_eq!(monitor.tracked(), self.upstream.len(), "{context}");
        for key in self.live.keys() {
            assert!(
                self.upstream.contains(key),
                "{context}: {key} in the set, not upstream"
            );
        }
        let panic = snapshot
            .all_out
            .as_deref()
            .is_some_and(|why| why.starts_with("panic"));
        // 1: the set is what the monitor says it should be.
        let held_by_operator = |e: &tower_outlier::EndpointSnapshot| {
            e.forced == Some(tower_outlier::controls::Override::ForcedOut)
                && matches!(e.status, EndpointStatus::Ejected | EndpointStatus::Probing)
                && e.would_be.is_none()
        };
        let expected: BTreeSet<usize> = snapshot
            .endpoints
            .iter()
            .filter(|e| {
                if panic {
                    !held_by_operator(e)
                } else {
                    matches!(
                        e.status,
                        EndpointStatus::Available | EndpointStatus::Trial | EndpointStatus::Unready
                    ) || e.would_be.is_some()
                }
            })
            .map(|e| e.key.as_str().parse().unwrap())
            .collect();
        let live: BTreeSet<usize> = self.live.keys().copied().collect();
        assert_eq!(
            live, expected,
            "{context}: the set against the monitor; {snapshot:#?}"
        );
        // 2: never empty, but where failing fast lets the rules themselves take every endpoint.
        if !self.upstream.is_empty() && self.live.is_empty() {
            let by_rules = snapshot.endpoints.iter().all(|e| {
                e.last_reason.as_ref().is_some_and(|r| {
                    tower_outlier::events::is_outlier_judgement(r) && r.policy != "host"
                })
            });
            assert!(
                self.all_out == WhenAllOut::FailFast && by_rules,
                "{context}: the set is empty under {:?}; {snapshot:#?}",
                self.all_out
            );
        }
        // 3: layer-wide dry run changes no routing and makes no service.
        if self.dry_run.load(Ordering::SeqCst) {
            for key in &self.upstream {
                if !self.forced_out.contains(key) {
                    assert!(
                        self.live.contains_key(key),
                        "{context}: {key} out of the set in dry run; {snapshot:#?}"
                    );
                }
            }
        }
        assert_eq!(
            self.made_in_dry_run.load(Ordering::SeqCst),
            0,
            "{context}: a service made in dry run"
        );
        // 4: an endpoint forced in is in the set, its load not avoided.
        for key in &self.forced_in {
            let Some(endpoint) = self.live.get(key) else {
                panic!("{context}: {key} forced in, not in the set; {snapshot:#?}");
            };
            assert!(
                endpoint.load().value().is_finite(),
                "{context}: {key} forced in, its load avoided"
            );
        }
        // 5: outside panic, the endpoints out and the set add up to the upstream.
        let ejected = self.adaptor.ejected();
        assert!(ejected <= self.upstream.len(), "{context}: {ejected} out");
        if !panic {
            assert_eq!(
                ejected + self.live.len(),
                self.upstream.len(),
                "{context}: {ejected} out, {} in the set; {snapshot:#?}",
                self.live.len()
            );
        }
    }
}

/// One history of `preset` from `seed`.
async fn history(preset: &'static str, seed: u64) {
    let mut rng = SeededRng(seed);
    let mut world = World::new(preset, &mut rng);
    let rules = world.layer.rules();
    for _ in 0..3 + rng.below(4) {
        let key = world.next_key;
        world.next_key += 1;
        world.insert(key);
    }
    world.sync(&format!("{preset}, seed {seed}, start"));
    for step in 0..250 {
        let context = format!("{preset}, seed {seed}, step {step}");
        let keys: Vec<usize> = world.upstream.iter().copied().collect();
        let any_key = |rng: &mut SeededRng| -> Option<usize> {
            (!keys.is_empty()).then(|| keys[rng.below(keys.len() as u64) as usize])
        };
        match rng.below(20) {
            0 if world.upstream.len() < 8 => {
                let key = world.next_key;
                world.next_key += 1;
                world.insert(key);
            }
            1 if world.upstream.len() > 1 => {
                if let Some(key) = any_key(&mut rng) {
                    world.remove(key);
                }
            }
            2 => {
                // A new service for a known key (a new connection, an upstream's refresh).
                if let Some(key) = any_key(&mut rng) {
                    world.insert(key);
                }
            }
            3..=5 => {
                if let Some(key) = any_key(&mut rng) {
                    let mode = match rng.below(8) {
                        0..=2 => Mode::Healthy,
                        3 => Mode::Failing,
                        4 => Mode::Refused,
                        5 => Mode::AsksFor(1 + rng.below(30)),
                        6 => Mode::Unready,
                        _ => Mode::Degraded,
                    };
                    world.set_mode(key, mode);
                }
            }
            6..=9 => {
                let calls = 5 + rng.below(30);
                world.traffic(&mut rng, calls, &context).await;
            }
            10 => {
                if let Some(key) = any_key(&mut rng) {
                    let health = if rng.below(2) == 0 {
                        Health::NotServing
                    } else {
                        Health::Serving
                    };
                    world.watching.say(key, health);
                }
            }
            11 => {
                // A key whose next watch says NOT_SERVING, then panics.
                if let Some(key) = any_key(&mut rng) {
                    world.watching.panicky.lock().unwrap().insert(key);
                    world.insert(key);
                }
            }
            12 | 13 => {
                // An operator, on a key held or not.
                let key = if rng.below(10) == 0 {
                    Some(1000)
                } else {
                    any_key(&mut rng)
                };
                if let Some(key) = key {
                    match rng.below(4) {
                        0 => {
                            rules.force_out(&key);
                            world.forced_in.remove(&key);
                            if world.upstream.contains(&key) {
                                world.forced_out.insert(key);
                            }
                        }
                        1 => {
                            rules.force_in(&key);
                            world.forced_out.remove(&key);
                            if world.upstream.contains(&key) {
                                world.forced_in.insert(key);
                            }
                        }
                        2 => {
                            rules.release(&key);
                            world.forced_out.remove(&key);
                            world.forced_in.remove(&key);
                        }
                        _ => rules.reset_backoff(&key),
                    }
                }
            }
            14 => {
                let on = !world.dry_run.load(Ordering::SeqCst);
                rules.set_dry_run(on);
                world.dry_run.store(on, Ordering::SeqCst);
            }
            15 if world.policies > 1 => {
                let slot = rng.below(world.policies as u64) as usize;
                let on = !rules.policy_dry_run(slot);
                rules.set_policy_dry_run(slot, on).unwrap();
            }
            16 => {
                // New rules for the first policy.
                let result = match world.preset {
                    "two policies" => rules
                        .replace(
                            0,
                            ErrorRatePolicy::new(
                                ErrorRateConfig::hsf()
                                    .min_calls(1 + rng.below(8))
                                    .error_rate_threshold(rng.below(10) as f64 / 10.0)
                                    .max_ejection_ratio(rng.below(11) as f64 / 10.0)
                                    .recovery_unit(Duration::from_secs(1 + rng.below(30)))
                                    .build()
                                    .unwrap(),
                            ),
                        )
                        .map(|_| ()),
                    preset => rules
                        .replace(
                            0,
                            DetectorPolicy::seeded(
                                detector_preset(preset)
                                    .base_ejection_time(Duration::from_secs(1 + rng.below(5)))
                                    .build()
                                    .unwrap(),
                                seed,
                            ),
                        )
                        .map(|_| ()),
                };
                result.unwrap();
            }
            _ => {
                tokio::time::advance(Duration::from_millis(rng.below(30_000))).await;
            }
        }
        // Forced-in and forced-out keys no longer upstream are forgotten by the test as the
        // layer forgets their endpoints.
        world.forced_in.retain(|k| world.upstream.contains(k));
        world.forced_out.retain(|k| world.upstream.contains(k));
        world.sync(&context);
        world.check(&context);
    }
    // Liveness: every fault lifted, every watch serving, every override released, dry run off.
    let context = format!("{preset}, seed {seed}, at the end");
    let keys: Vec<usize> = world.upstream.iter().copied().collect();
    world.watching.panicky.lock().unwrap().clear();
    for &key in &keys {
        world.set_mode(key, Mode::Healthy);
        world.watching.say(key, Health::Serving);
        rules.release(&key);
    }
    world.forced_in.clear();
    world.forced_out.clear();
    rules.set_dry_run(false);
    world.dry_run.store(false, Ordering::SeqCst);
    for slot in 0..world.policies {
        rules.set_policy_dry_run(slot, false).unwrap();
    }
    for _ in 0..240 {
        tokio::time::advance(Duration::from_secs(5)).await;
        world.sync(&context);
        world.traffic(&mut rng, 10, &context).await;
        if keys.iter().all(|k| world.live.contains_key(k)) {
            break;
        }
    }
    world.check(&context);
    let missing: Vec<&usize> = keys
        .iter()
        .filter(|k| !world.live.contains_key(k))
        .collect();
    assert!(
        missing.is_empty(),
        "{context}: {missing:?} still out twenty minutes after every fault was lifted; {:#?}",
        world.layer.monitor().snapshot()
    );
}

#[tokio::test(start_paused = true)]
async fn the_options_cross_without_emptying_the_set_or_losing_an_endpoint() {
    for (index, preset) in PRESETS.into_iter().enumerate() {
        let first = 7_000_000 * (index as u64 + 1);
        for seed in first..first + histories() {
            history(preset, seed).await;
        }
    }
}
