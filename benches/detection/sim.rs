//! The simulated world: endpoints that misbehave on a schedule, an open-loop load, and the
//! record of what callers received.
//!
//! Everything runs on tokio's paused clock in one current-thread runtime, and every random choice
//! comes from one seeded generator, so a run is a pure function of its scenario and configuration.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::poll_fn;
use tokio::time::Instant;
use tower::discover::Change;
use tower::BoxError;
use tower_service::Service;

/// SplitMix64: small, fast, and plenty for choosing latencies and failures reproducibly.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The balancer's draws come from the same kind of generator (tower's default is seeded from
/// the process's random state, which would make every run different).
impl tower::util::rng::Rng for Rng {
    fn next_u64(&mut self) -> u64 {
        self.next()
    }
}

/// How a bad endpoint misbehaves while its fault is active.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Every call fails at once, as a refused connection.
    Down,
    /// Calls never answer; the per-endpoint timeout ends them.
    BlackHole,
    /// This fraction of calls fails (a reset connection), the rest answer normally.
    Gray(f64),
    /// Calls answer correctly, this many times slower.
    Slow(f64),
    /// The process stops for `pause` seconds every `every` seconds (a stop-the-world GC): a call
    /// begun during a pause answers once it is over, after its usual latency.
    Pauses { every: f64, pause: f64 },
}

/// When a fault is active.
#[derive(Clone, Copy, Debug)]
pub enum Schedule {
    /// From `start` (seconds) until `end`, if any.
    Window { start: f64, end: Option<f64> },
    /// From `start`: `down` seconds faulty, `up` seconds healthy, repeating.
    Flapping { start: f64, down: f64, up: f64 },
}

impl Schedule {
    pub fn active(&self, t: f64) -> bool {
        match *self {
            Schedule::Window { start, end } => t >= start && end.is_none_or(|end| t < end),
            Schedule::Flapping { start, down, up } => {
                t >= start && (t - start) % (down + up) < down
            }
        }
    }

    pub fn start(&self) -> f64 {
        match *self {
            Schedule::Window { start, .. } | Schedule::Flapping { start, .. } => start,
        }
    }
}

/// One scenario: the fleet, the load, and who misbehaves how and when.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub endpoints: usize,
    /// Requests per second across the fleet (open loop: sent on schedule whatever happens).
    pub rate: f64,
    pub duration: f64,
    pub bad: Vec<usize>,
    pub fault: Fault,
    pub schedule: Schedule,
    /// Failure probability of every call on every endpoint, faulty or not.
    pub noise: f64,
    /// Healthy latency is uniform in `[latency / 2, 3 × latency / 2)`.
    pub latency: Duration,
    /// `Some(n)`: the `n`-th call (counting from 1) to endpoint 0 takes one second, once.
    pub one_slow_call: Option<usize>,
    /// For this many seconds after a `Window` fault ends, a bad endpoint is still warming up (a
    /// JIT, cold caches, a pool filling): a call fails with a probability falling linearly from 1
    /// to 0.
    pub warm_up: f64,
    /// On every endpoint, faulty or not: the probability that a call takes ten times its usual
    /// latency (a latency tail with no slow replica).
    pub tail: f64,
}

impl Scenario {
    pub fn is_bad(&self, endpoint: usize) -> bool {
        self.bad.contains(&endpoint)
    }
}

/// Per-endpoint timeout in front of every simulated endpoint, as the README's recommended stack
/// has it.
pub const TIMEOUT: Duration = Duration::from_secs(1);

/// Traffic bins for the share-over-time picture.
pub const BIN: f64 = 1.0;

/// What happened in one run, recorded as it happened.
#[derive(Debug)]
pub struct Log {
    pub calls: Vec<usize>,
    /// Calls per endpoint per `BIN` seconds, by send time.
    pub bins: Vec<Vec<u32>>,
    pub sent: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub failed_from_bad: u64,
    /// When each failed request from a bad endpoint was sent (seconds).
    pub bad_failures_sent_at: Vec<f64>,
    /// Requests the balancer could not take before the run ended (it had no ready endpoint).
    pub unsent: u64,
    /// Every answered request's latency (seconds), for the callers' percentiles.
    pub latencies: Vec<f64>,
    /// `(seconds, endpoint, event)`: every removal from and re-insertion into the balancer's set
    /// after the initial inserts, and (where the run samples the monitor) passed trials.
    pub events: Vec<(f64, usize, Event)>,
    nth_call: Vec<usize>,
}

pub struct World {
    pub scenario: Scenario,
    pub start: Instant,
    rng: Mutex<Rng>,
    // The probes' own draws: how many probes a configuration sends leaves the callers' draws
    // (latencies, failures) what they would be without them.
    probe_rng: Mutex<Rng>,
    pub log: Mutex<Log>,
}

impl World {
    pub fn new(scenario: Scenario, seed: u64) -> Arc<Self> {
        let n = scenario.endpoints;
        let bins = (scenario.duration / BIN).ceil() as usize + 1;
        Arc::new(World {
            start: Instant::now(),
            rng: Mutex::new(Rng::new(seed)),
            probe_rng: Mutex::new(Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15)),
            log: Mutex::new(Log {
                calls: vec![0; n],
                bins: vec![vec![0; bins]; n],
                sent: 0,
                succeeded: 0,
                failed: 0,
                failed_from_bad: 0,
                bad_failures_sent_at: Vec::new(),
                unsent: 0,
                latencies: Vec::new(),
                events: Vec::new(),
                nth_call: vec![0; n],
            }),
            scenario,
        })
    }

    pub fn elapsed(&self) -> f64 {
        Instant::now().duration_since(self.start).as_secs_f64()
    }

    /// Notes the balancer's set changing, as the detector's output stream yields it.
    pub fn observe_change<K: Copy + Into<usize>, S>(
        &self,
        change: &Change<K, S>,
        seen: &mut [bool],
    ) {
        let t = self.elapsed();
        let mut log = self.log.lock().unwrap();
        match change {
            Change::Insert(key, _) => {
                let i = (*key).into();
                if std::mem::replace(&mut seen[i], true) {
                    log.events.push((t, i, Event::Readmitted));
                }
            }
            Change::Remove(key) => log.events.push((t, (*key).into(), Event::Ejected)),
        }
    }
}

/// Samples the layer's monitor every 100 ms and logs each passed trial (Trial → Available).
pub async fn watch_trials(world: Arc<World>, monitor: tower_outlier::Monitor) {
    use tower_outlier::EndpointStatus;
    let n = world.scenario.endpoints;
    let mut on_trial = vec![false; n];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        let snapshot = monitor.snapshot();
        for (i, was_on_trial) in on_trial.iter_mut().enumerate() {
            let Some(status) = snapshot.get_key(&i).map(|e| e.status) else {
                continue;
            };
            let now_on_trial = status == EndpointStatus::Trial;
            if *was_on_trial && status == EndpointStatus::Available {
                let t = world.elapsed();
                world
                    .log
                    .lock()
                    .unwrap()
                    .events
                    .push((t, i, Event::Recovered));
            }
            *was_on_trial = now_on_trial;
        }
    }
}

/// A request: remembers which endpoint served it, so failures can be attributed (`usize::MAX`
/// until one does: a request no endpoint saw is blamed on none).
#[derive(Debug)]
pub struct Request {
    served_by: Arc<AtomicUsize>,
    // An active probe's: it meets the endpoint's fault as a caller's would, but it is no
    // caller's call (not in the shares) and draws from the probes' own numbers.
    probe: bool,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            served_by: Arc::new(AtomicUsize::new(usize::MAX)),
            probe: false,
        }
    }
}

impl Request {
    /// An active probe's request.
    pub fn probe() -> Self {
        Request {
            probe: true,
            ..Request::default()
        }
    }
}

/// A change in an endpoint's standing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Removed from the balancer's set.
    Ejected,
    /// Put back into the balancer's set (on trial, or after a probe).
    Readmitted,
    /// Its trial passed: recovered for good.
    Recovered,
}

/// One simulated endpoint.
#[derive(Clone)]
pub struct Backend {
    pub id: usize,
    pub world: Arc<World>,
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<(), io::Error>> + Send>>;

impl Service<Request> for Backend {
    type Response = ();
    type Error = io::Error;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> BoxFuture {
        request.served_by.store(self.id, Ordering::Relaxed);
        let world = &self.world;
        let scenario = &world.scenario;
        let t = world.elapsed();
        let nth = if request.probe {
            0
        } else {
            let mut log = world.log.lock().unwrap();
            log.calls[self.id] += 1;
            let bin = ((t / BIN) as usize).min(log.bins[self.id].len() - 1);
            log.bins[self.id][bin] += 1;
            log.nth_call[self.id] += 1;
            log.nth_call[self.id]
        };
        let (base, noise_fails, gray_fails, tail) = {
            let rng = if request.probe {
                &world.probe_rng
            } else {
                &world.rng
            };
            let mut rng = rng.lock().unwrap();
            // The tail's draw only where there is a tail: the other scenarios keep their draws.
            let drawn = (rng.unit(), rng.unit(), rng.unit());
            let tail = if scenario.tail > 0.0 { rng.unit() } else { 1.0 };
            (drawn.0, drawn.1, drawn.2, tail)
        };
        let mut latency = scenario.latency.mul_f64(0.5 + base);
        if tail < scenario.tail {
            latency = latency.mul_f64(10.0);
        }
        let mut fail = noise_fails < scenario.noise;
        if self.id == 0 && scenario.one_slow_call == Some(nth) {
            latency = Duration::from_secs(1);
        }
        if let Schedule::Window { end: Some(end), .. } = scenario.schedule {
            let cold = t - end;
            if scenario.is_bad(self.id) && cold >= 0.0 && cold < scenario.warm_up {
                fail |= gray_fails < 1.0 - cold / scenario.warm_up;
            }
        }
        if scenario.is_bad(self.id) && scenario.schedule.active(t) {
            match scenario.fault {
                Fault::Down => {
                    return Box::pin(std::future::ready(Err(
                        io::ErrorKind::ConnectionRefused.into()
                    )))
                }
                Fault::BlackHole => return Box::pin(std::future::pending()),
                Fault::Gray(rate) => fail |= gray_fails < rate,
                Fault::Slow(factor) => latency = latency.mul_f64(factor),
                Fault::Pauses { every, pause } => {
                    let into = (t - scenario.schedule.start()) % every;
                    if into < pause {
                        latency += Duration::from_secs_f64(pause - into);
                    }
                }
            }
        }
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            if fail {
                Err(io::ErrorKind::ConnectionReset.into())
            } else {
                Ok(())
            }
        })
    }
}

/// Sends `scenario.rate` requests a second through `balancer` for the scenario's duration, open
/// loop, then waits for the last answers.
pub async fn drive<B>(world: Arc<World>, mut balancer: B)
where
    B: Service<Request, Error = BoxError>,
    B::Future: Send + 'static,
{
    let scenario = world.scenario.clone();
    let total = (scenario.rate * scenario.duration) as u64;
    let mut answers = tokio::task::JoinSet::new();
    let deadline = world.start + Duration::from_secs_f64(scenario.duration);
    for i in 0..total {
        let at = world.start + Duration::from_secs_f64(i as f64 / scenario.rate);
        tokio::time::sleep_until(at).await;
        let ready = tokio::time::timeout_at(deadline, poll_fn(|cx| balancer.poll_ready(cx))).await;
        match ready {
            Ok(Ok(())) => {}
            Ok(Err(error)) => panic!("balancer failed: {error}"),
            Err(_) => {
                world.log.lock().unwrap().unsent += total - i;
                break;
            }
        }
        let request = Request::default();
        let served_by = request.served_by.clone();
        let answer = balancer.call(request);
        let world = world.clone();
        let sent_at = world.elapsed();
        world.log.lock().unwrap().sent += 1;
        answers.spawn(async move {
            let ok = answer.await.is_ok();
            let latency = world.elapsed() - sent_at;
            let endpoint = served_by.load(Ordering::Relaxed);
            let mut log = world.log.lock().unwrap();
            log.latencies.push(latency);
            if ok {
                log.succeeded += 1;
            } else {
                log.failed += 1;
                if world.scenario.is_bad(endpoint) {
                    log.failed_from_bad += 1;
                    log.bad_failures_sent_at.push(sent_at);
                }
            }
        });
        // Completed answers are reaped as we go, so the set stays the size of what is in flight.
        while answers.try_join_next().is_some() {}
    }
    // The balancer stays in scope until the last answer is in, as a live client's would.
    while answers.join_next().await.is_some() {}
    drop(balancer);
}
