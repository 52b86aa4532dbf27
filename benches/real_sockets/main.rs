//! Detection on real sockets: loopback hyper and tonic backends with injected faults, real
//! hyper-util clients and tonic `Channel`s, tower-outlier's presets in the README's recommended
//! stack, tower's stack without detection, and the peers a user would pick instead (nginx,
//! HAProxy, grpcio's C-core client) on the same backends in the same run.
//!
//! ```sh
//! benches/real_sockets/install-peers.sh        # nginx, haproxy (Debian), grpcio (PyPI)
//! cargo bench -p tower-outlier-benches --bench real_sockets -- --quick   # CI: a few cells, checked
//! cargo bench -p tower-outlier-benches --bench real_sockets -- --full --jobs 5   # all, ~80 min
//! ```
//!
//! Options: `--runs N` (runs per cell; the worst run is reported beside the median),
//! `--jobs J` (cells run at once, default 4), `--only TEXT` (cells whose title or stack contains
//! TEXT; `A|B` for either), `--without-peers` (skip nginx, HAProxy and grpcio instead of failing when they are
//! missing), `--out FILE` (also write the tables there).
//!
//! Every backend logs when each request reached it, so traffic shares are measured where they
//! land, the same way for every stack; every caller logs when each request started, how long it
//! took and whether it got a good answer (a 2xx with its whole body, or a gRPC OK).

mod backend;
mod peers;
mod sample;
mod stack;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backend::{Backend, Mode, Protocol};
use peers::{Grpcio, Proxy};
use stack::{Caller, Decision, Preset, Sample, Stack};
use tower_outlier::EndpointStatus;

/// How the fault of a scenario behaves on backend 0 while it lasts.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Steady(Mode),
    /// Down (refused) for `down` seconds, up for `up`, repeatedly.
    Flapping {
        down: f64,
        up: f64,
    },
}

#[derive(Clone, Copy, Debug)]
struct Scenario {
    name: &'static str,
    fault: Fault,
    http: bool,
    grpc: bool,
}

const HARD_DOWN: Scenario = Scenario {
    name: "hard down (server stopped)",
    fault: Fault::Steady(Mode::Down),
    http: true,
    grpc: true,
};
const UNAVAILABLE: Scenario = Scenario {
    name: "503 / UNAVAILABLE",
    fault: Fault::Steady(Mode::Unavailable),
    http: true,
    grpc: true,
};
const INTERNAL: Scenario = Scenario {
    name: "500 / INTERNAL",
    fault: Fault::Steady(Mode::Internal),
    http: true,
    grpc: true,
};
const BLACK_HOLE: Scenario = Scenario {
    name: "black hole (accepts, never answers)",
    fault: Fault::Steady(Mode::BlackHole),
    http: true,
    grpc: true,
};
const RESET: Scenario = Scenario {
    name: "reset mid-body",
    fault: Fault::Steady(Mode::ResetMidBody),
    http: true,
    grpc: false,
};
const SLOW: Scenario = Scenario {
    name: "slow (10x latency and more)",
    fault: Fault::Steady(Mode::Slow),
    http: true,
    grpc: true,
};
const GRAY: Scenario = Scenario {
    name: "gray (30 % errors)",
    fault: Fault::Steady(Mode::Gray),
    http: true,
    grpc: true,
};
const FLAPPING: Scenario = Scenario {
    name: "flapping (down 5 s, up 5 s)",
    fault: Fault::Flapping { down: 5.0, up: 5.0 },
    http: true,
    grpc: true,
};

const ALL: [Scenario; 8] = [
    HARD_DOWN,
    UNAVAILABLE,
    INTERNAL,
    BLACK_HOLE,
    RESET,
    SLOW,
    GRAY,
    FLAPPING,
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// One caller; the next request when the last one ends.
    Serial,
    /// Sixteen callers, each serial.
    Concurrent,
    /// Open loop at a fixed rate.
    Rate(f64),
}

impl Shape {
    fn name(self) -> String {
        match self {
            Shape::Serial => "serial".into(),
            Shape::Concurrent => "16 concurrent callers".into(),
            Shape::Rate(rate) => format!("open loop {rate} req/s"),
        }
    }
}

/// When the fault starts, when it heals, when the run ends (seconds from the run's start).
#[derive(Clone, Copy, Debug)]
struct Timing {
    fault_at: f64,
    heal_at: f64,
    end: f64,
}

const FULL: Timing = Timing {
    fault_at: 10.0,
    heal_at: 30.0,
    end: 60.0,
};
/// Failing from the first call, as a new user's broken replica is: no warm connection, no history.
const FROM_START: Timing = Timing {
    fault_at: 0.0,
    heal_at: 10.0,
    end: 25.0,
};
/// The fault begins halfway between two of gRPC's outlier-detection ticks (a 10 s timer its
/// client starts with the channel, just before the run): at `FULL`'s 10 s it begins right at one,
/// which favours a client judging on that timer.
const MID_TICK: Timing = Timing {
    fault_at: 15.0,
    heal_at: 35.0,
    end: 60.0,
};
const SHORT: Timing = Timing {
    fault_at: 5.0,
    heal_at: 15.0,
    end: 30.0,
};

#[derive(Clone, Copy, Debug)]
struct Cell {
    scenario: Scenario,
    protocol: Protocol,
    fleet: usize,
    shape: Shape,
    timing: Timing,
}

impl Cell {
    fn title(&self) -> String {
        let protocol = match self.protocol {
            Protocol::Http => "HTTP/1.1",
            Protocol::Grpc => "gRPC",
        };
        format!(
            "{} — {protocol}, {} backends, {}, fault on #0 {}–{} s, run {} s",
            self.scenario.name,
            self.fleet,
            self.shape.name(),
            self.timing.fault_at,
            self.timing.heal_at,
            self.timing.end
        )
    }
}

/// What one run of one stack in one cell measured.
#[derive(Clone, Debug)]
struct Outcome {
    requests: usize,
    failed: usize,
    /// Seconds from the fault until backend 0 stopped getting traffic (`None`: it never did).
    cut_off: Option<f64>,
    /// Seconds from the fault until the layer ejected backend 0 (layer stacks only).
    ejected_after: Option<f64>,
    /// Backend 0's standing in the layer just before it healed (layer stacks only).
    standing: Option<&'static str>,
    /// Seconds from the heal until backend 0 got half its fair share in a bucket (`None`: not
    /// within the run).
    back_after: Option<f64>,
    false_ejections: usize,
    p50_ms: f64,
    p99_ms: f64,
}

fn stacks_for(protocol: Protocol, peers: bool) -> Vec<Stack> {
    let mut stacks = vec![
        Stack::NoDetection,
        Stack::Outlier(Preset::Recommended),
        Stack::Outlier(Preset::Edas),
        Stack::Outlier(Preset::Hsf),
        Stack::Outlier(Preset::Envoy50),
        Stack::Outlier(Preset::Linkerd),
        Stack::Outlier(Preset::RecommendedOrLatency),
        Stack::Outlier(Preset::Finagle),
    ];
    match protocol {
        Protocol::Http => {
            if peers {
                stacks.push(Stack::Proxy(Proxy::Nginx));
                stacks.push(Stack::Proxy(Proxy::Haproxy));
            }
        }
        Protocol::Grpc => {
            stacks.push(Stack::Outlier(Preset::Grpc));
            if peers {
                stacks.push(Stack::Grpcio);
            }
        }
    }
    stacks
}

fn peers_of(protocol: Protocol, peers: bool) -> Vec<Stack> {
    match (protocol, peers) {
        (_, false) => vec![],
        (Protocol::Http, true) => vec![Stack::Proxy(Proxy::Nginx), Stack::Proxy(Proxy::Haproxy)],
        (Protocol::Grpc, true) => vec![Stack::Outlier(Preset::Grpc), Stack::Grpcio],
    }
}

/// The stacks of the new user's case: the recommended configuration, and EDAS as a user of a
/// small fleet first sets it.
fn new_user_stacks() -> Vec<Stack> {
    vec![
        Stack::NoDetection,
        Stack::Outlier(Preset::Recommended),
        Stack::Outlier(Preset::EdasSmallFleet),
    ]
}

/// The cells of a run, each with the stacks it compares.
fn matrix(quick: bool, peers: bool) -> Vec<(Cell, Vec<Stack>, usize)> {
    let mut cells = Vec::new();
    let both = [Protocol::Http, Protocol::Grpc];
    let core = |protocol| {
        let mut stacks = vec![Stack::NoDetection, Stack::Outlier(Preset::Recommended)];
        stacks.extend(peers_of(protocol, peers));
        stacks
    };
    if quick {
        // The starved-but-unjudged case of a new user: three servers, serial calls, one
        // answering 503 / UNAVAILABLE from the first call, then healing.
        for protocol in both {
            let cell = Cell {
                scenario: UNAVAILABLE,
                protocol,
                fleet: 3,
                shape: Shape::Serial,
                timing: FROM_START,
            };
            cells.push((cell, new_user_stacks(), 3));
        }
        for scenario in [HARD_DOWN, BLACK_HOLE] {
            let cell = Cell {
                scenario,
                protocol: Protocol::Http,
                fleet: 5,
                shape: Shape::Rate(200.0),
                timing: SHORT,
            };
            cells.push((cell, core(Protocol::Http), 1));
        }
        return cells;
    }
    // Every scenario at 200 req/s over five backends, every stack.
    for protocol in both {
        for scenario in ALL {
            if (protocol == Protocol::Http && !scenario.http)
                || (protocol == Protocol::Grpc && !scenario.grpc)
            {
                continue;
            }
            let cell = Cell {
                scenario,
                protocol,
                fleet: 5,
                shape: Shape::Rate(200.0),
                timing: FULL,
            };
            cells.push((cell, stacks_for(protocol, peers), 1));
        }
    }
    // A gray failure beginning between two of gRPC's ticks instead of at one.
    let cell = Cell {
        scenario: GRAY,
        protocol: Protocol::Grpc,
        fleet: 5,
        shape: Shape::Rate(200.0),
        timing: MID_TICK,
    };
    cells.push((cell, stacks_for(Protocol::Grpc, peers), 1));
    // Other traffic shapes, for the faults where they matter.
    for protocol in both {
        for scenario in [HARD_DOWN, UNAVAILABLE, BLACK_HOLE, SLOW] {
            for shape in [Shape::Serial, Shape::Concurrent, Shape::Rate(5.0)] {
                let cell = Cell {
                    scenario,
                    protocol,
                    fleet: 5,
                    shape,
                    timing: FULL,
                };
                cells.push((cell, core(protocol), 1));
            }
        }
    }
    // Fleet sizes.
    for fleet in [3, 20] {
        for scenario in [HARD_DOWN, UNAVAILABLE] {
            let cell = Cell {
                scenario,
                protocol: Protocol::Http,
                fleet,
                shape: Shape::Rate(200.0),
                timing: FULL,
            };
            let mut stacks = vec![
                Stack::NoDetection,
                Stack::Outlier(Preset::Recommended),
                Stack::Outlier(Preset::Edas),
                Stack::Outlier(Preset::Envoy50),
            ];
            stacks.extend(peers_of(Protocol::Http, peers));
            cells.push((cell, stacks, 1));
        }
    }
    // The new user's case, twenty times each: failing from the first call, and after a warm
    // start.
    for timing in [FROM_START, SHORT] {
        for protocol in both {
            let cell = Cell {
                scenario: UNAVAILABLE,
                protocol,
                fleet: 3,
                shape: Shape::Serial,
                timing,
            };
            cells.push((cell, new_user_stacks(), 20));
        }
    }
    cells
}

fn seconds(start: Instant) -> f64 {
    Instant::now()
        .saturating_duration_since(start)
        .as_secs_f64()
}

async fn sleep_until(start: Instant, at: f64) {
    tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()).await;
}

/// Drives backend 0 through the scenario's fault.
async fn fault(backend: Arc<Backend>, scenario: Scenario, timing: Timing, start: Instant) {
    sleep_until(start, timing.fault_at).await;
    match scenario.fault {
        Fault::Steady(mode) => backend.set_mode(mode),
        Fault::Flapping { down, up } => {
            let mut at = timing.fault_at;
            while at < timing.heal_at {
                backend.set_mode(Mode::Down);
                sleep_until(start, (at + down).min(timing.heal_at)).await;
                backend.set_mode(Mode::Healthy);
                at += down + up;
                sleep_until(start, at.min(timing.heal_at)).await;
            }
        }
    }
    sleep_until(start, timing.heal_at).await;
    backend.set_mode(Mode::Healthy);
}

/// Sends the cell's traffic through `call` until the run ends.
async fn traffic(call: stack::Call, shape: Shape, end: f64, start: Instant) -> Vec<Sample> {
    let samples = Arc::new(Mutex::new(Vec::new()));
    let send = {
        let samples = samples.clone();
        move |call: stack::Call| {
            let samples = samples.clone();
            async move {
                let begun = seconds(start);
                let ok = call().await;
                let latency = seconds(start) - begun;
                samples.lock().unwrap().push(Sample { latency, ok });
            }
        }
    };
    match shape {
        Shape::Serial | Shape::Concurrent => {
            let callers = if shape == Shape::Serial { 1 } else { 16 };
            let mut tasks = Vec::new();
            for _ in 0..callers {
                let (call, send) = (call.clone(), send.clone());
                tasks.push(tokio::spawn(async move {
                    while seconds(start) < end {
                        send(call.clone()).await;
                    }
                }));
            }
            for task in tasks {
                let _ = task.await;
            }
        }
        Shape::Rate(rate) => {
            let mut tasks = Vec::new();
            let mut n = 0u64;
            loop {
                let at = n as f64 / rate;
                if at >= end {
                    break;
                }
                sleep_until(start, at).await;
                tasks.push(tokio::spawn(send(call.clone())));
                n += 1;
            }
            for task in tasks {
                let _ = task.await;
            }
        }
    }
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    samples
}

/// Runs one stack once in one cell.
async fn run(cell: Cell, stack: Stack) -> Result<Outcome, String> {
    let start = Instant::now();
    let mut backends = Vec::new();
    for _ in 0..cell.fleet {
        let backend = Backend::start(cell.protocol, start)
            .await
            .map_err(|e| format!("backend: {e}"))?;
        backends.push(Arc::new(backend));
    }
    let addrs: Vec<_> = backends.iter().map(|b| b.addr).collect();
    let timing = cell.timing;
    let faulting = tokio::spawn(fault(backends[0].clone(), cell.scenario, timing, start));
    let (samples, caller, decisions) = match stack {
        Stack::Grpcio => {
            let (shape, rate, callers) = match cell.shape {
                Shape::Serial => ("serial", 0.0, 1),
                Shape::Concurrent => ("concurrent", 0.0, 16),
                Shape::Rate(rate) => ("open", rate, 1),
            };
            let addrs_for = addrs.clone();
            let mut client = tokio::task::spawn_blocking(move || {
                Grpcio::start(&addrs_for, shape, rate, callers, timing.end)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("grpcio: {e}"))?;
            // The fault's schedule started with the backends, before the client connected: the
            // client's "go" must come at once (it connects in well under the fault's start).
            client.go().map_err(|e| e.to_string())?;
            let samples = tokio::task::spawn_blocking(move || client.finish())
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("grpcio: {e}"))?;
            (samples, None, Vec::new())
        }
        _ => {
            let proxy = match stack {
                Stack::Proxy(proxy) => Some(
                    proxy
                        .start(&addrs)
                        .map_err(|e| format!("{}: {e}", proxy.name()))?,
                ),
                _ => None,
            };
            let targets = match &proxy {
                Some(running) => vec![running.addr],
                None => addrs.clone(),
            };
            let caller: Caller = stack::build(stack, cell.protocol, &targets, start);
            let standing = caller.monitor.clone().map(|monitor| {
                tokio::spawn(async move {
                    sleep_until(start, timing.heal_at - 0.05).await;
                    standing_of(&monitor)
                })
            });
            let samples = traffic(caller.call.clone(), cell.shape, timing.end, start).await;
            let standing = match standing {
                Some(task) => task.await.ok().flatten(),
                None => None,
            };
            let decisions = caller.decisions.lock().unwrap().clone();
            drop(proxy);
            (samples, standing, decisions)
        }
    };
    let _ = faulting.await;
    let received: Vec<Vec<f64>> = backends.iter().map(|b| b.received()).collect();
    Ok(measure(cell, &samples, &received, caller, &decisions))
}

/// Backend 0's standing in the layer's monitor.
fn standing_of(monitor: &tower_outlier::Monitor) -> Option<&'static str> {
    let snapshot = monitor.snapshot();
    let endpoint = snapshot
        .endpoints
        .iter()
        .find(|e| e.key.downcast_ref::<usize>() == Some(&0))?;
    Some(match endpoint.status {
        EndpointStatus::Ejected => "ejected",
        EndpointStatus::Probing => "probing",
        // Out of the balancer's picks: its connection refused (`tower_outlier::connection`).
        EndpointStatus::Unready => "unready",
        _ if endpoint.avoided_for.is_some() => "avoided",
        EndpointStatus::Trial => "on trial",
        EndpointStatus::Available if endpoint.error_rate >= 0.99 => "in, failing every call",
        EndpointStatus::Available => "in",
        _ => "other",
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn measure(
    cell: Cell,
    samples: &[Sample],
    received: &[Vec<f64>],
    standing: Option<&'static str>,
    decisions: &[Decision],
) -> Outcome {
    let timing = cell.timing;
    let n = cell.fleet as f64;
    let failed = samples.iter().filter(|s| !s.ok).count();
    let mut latencies: Vec<f64> = samples.iter().map(|s| s.latency * 1e3).collect();
    latencies.sort_by(f64::total_cmp);
    // Healthy traffic (before the fault, or after the heal for a fault from the start) sets the
    // scale of a "gap": five mean inter-arrival times of one backend, at least a second.
    let (from, to) = if timing.fault_at >= 1.0 {
        (0.0, timing.fault_at)
    } else {
        (timing.heal_at, timing.end)
    };
    let healthy: usize = received
        .iter()
        .map(|r| r.iter().filter(|&&t| t >= from && t < to).count())
        .sum();
    let per_backend_rate = (healthy as f64 / (to - from) / n).max(1e-3);
    let gap = (5.0 / per_backend_rate).max(1.0);
    let mut bad: Vec<f64> = received[0]
        .iter()
        .copied()
        .filter(|&t| t >= timing.fault_at && t < timing.heal_at)
        .collect();
    bad.sort_by(f64::total_cmp);
    let mut cut_off = None;
    let mut last = timing.fault_at;
    for &t in bad.iter().chain(std::iter::once(&timing.heal_at)) {
        if t - last >= gap.min(timing.heal_at - timing.fault_at) {
            cut_off = Some(last - timing.fault_at);
            break;
        }
        last = t;
    }
    // Back to half its share: the first bucket after the heal in which backend 0 got at least
    // half of 1/n of what all backends got.
    let bucket = (10.0 / (per_backend_rate * n)).max(1.0);
    let mut back_after = None;
    let mut from = timing.heal_at;
    while from + bucket <= timing.end + 1e-9 {
        let count = |r: &Vec<f64>| {
            r.iter()
                .filter(|&&t| t >= from && t < from + bucket)
                .count()
        };
        let all: usize = received.iter().map(count).sum();
        let mine = count(&received[0]);
        if all > 0 && mine as f64 >= 0.5 * all as f64 / n {
            back_after = Some(from + bucket - timing.heal_at);
            break;
        }
        from += bucket;
    }
    let ejected_after = decisions
        .iter()
        .find(|d| d.endpoint == 0 && d.ejected && d.at >= timing.fault_at)
        .map(|d| d.at - timing.fault_at);
    let false_ejections = decisions
        .iter()
        .filter(|d| d.endpoint != 0 && d.ejected)
        .count();
    Outcome {
        requests: samples.len(),
        failed,
        cut_off,
        ejected_after,
        standing,
        back_after,
        false_ejections,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
    }
}

struct Options {
    quick: bool,
    runs: Option<usize>,
    jobs: usize,
    only: Option<String>,
    peers: bool,
    out: Option<String>,
}

fn options() -> Options {
    let mut options = Options {
        quick: true,
        runs: None,
        jobs: 4,
        only: None,
        peers: true,
        out: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--full" => options.quick = false,
            "--runs" => options.runs = args.next().and_then(|v| v.parse().ok()),
            "--jobs" => options.jobs = args.next().and_then(|v| v.parse().ok()).unwrap_or(4),
            "--only" => options.only = args.next(),
            "--without-peers" => options.peers = false,
            "--out" => options.out = args.next(),
            // cargo bench passes --bench.
            "--bench" => {}
            other => {
                eprintln!("unknown option {other}");
                std::process::exit(2);
            }
        }
    }
    options
}

fn fmt_secs(value: Option<f64>) -> String {
    value.map_or_else(|| "never".into(), |v| format!("{v:.1} s"))
}

/// Median and worst of a column over the runs, "m (worst w)" when they differ.
fn spread(values: &mut [f64], worst_is_max: bool, show: impl Fn(f64) -> String) -> String {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    let worst = if worst_is_max {
        values[values.len() - 1]
    } else {
        values[0]
    };
    if values.len() == 1 || show(median) == show(worst) {
        show(median)
    } else {
        format!("{} (worst {})", show(median), show(worst))
    }
}

fn row(stack: Stack, runs: &[Outcome]) -> String {
    let mut failed: Vec<f64> = runs.iter().map(|o| o.failed as f64).collect();
    let requests = runs[0].requests;
    let never = f64::INFINITY;
    let mut cut: Vec<f64> = runs.iter().map(|o| o.cut_off.unwrap_or(never)).collect();
    let mut back: Vec<f64> = runs.iter().map(|o| o.back_after.unwrap_or(never)).collect();
    let secs = |v: f64| fmt_secs(v.is_finite().then_some(v));
    let ejected = if matches!(stack, Stack::Outlier(_)) {
        let mut ejected: Vec<f64> = runs
            .iter()
            .map(|o| o.ejected_after.unwrap_or(never))
            .collect();
        let count = runs.iter().filter(|o| o.ejected_after.is_some()).count();
        let label = spread(&mut ejected, true, secs);
        if runs.len() > 1 {
            format!("{label}, in {count} of {} runs", runs.len())
        } else {
            label
        }
    } else {
        "—".into()
    };
    let standing = if matches!(stack, Stack::Outlier(_)) {
        let mut kinds: Vec<&str> = runs.iter().filter_map(|o| o.standing).collect();
        kinds.sort_unstable();
        kinds.dedup();
        kinds.join(" / ")
    } else {
        "—".into()
    };
    let false_ejections = if matches!(stack, Stack::Outlier(_)) {
        runs.iter()
            .map(|o| o.false_ejections)
            .max()
            .unwrap_or(0)
            .to_string()
    } else {
        "—".into()
    };
    let mut p50: Vec<f64> = runs.iter().map(|o| o.p50_ms).collect();
    let mut p99: Vec<f64> = runs.iter().map(|o| o.p99_ms).collect();
    format!(
        "| {} | {} of {} | {} | {} | {} | {} | {} | {} | {} |",
        stack.name(),
        spread(&mut failed, true, |v| format!("{v:.0}")),
        requests,
        spread(&mut cut, true, secs),
        ejected,
        standing,
        spread(&mut back, true, secs),
        false_ejections,
        spread(&mut p50, true, |v| format!("{v:.1} ms")),
        spread(&mut p99, true, |v| format!("{v:.1} ms")),
    )
}

const HEADER: &str = "| stack | failed to callers | cut off after | ejected after | standing before heal | half its share back after heal | false ejections | p50 | p99 |\n|---|---:|---:|---:|---|---:|---:|---:|---:|";

/// A claim the quick mode checks, with what it saw.
fn check_quick(cell: &Cell, stack: Stack, runs: &[Outcome], failures: &mut Vec<String>) {
    if !matches!(
        stack,
        Stack::Outlier(Preset::Recommended | Preset::EdasSmallFleet)
    ) {
        return;
    }
    let title = cell.title();
    if cell.shape == Shape::Serial {
        for (i, run) in runs.iter().enumerate() {
            let judged = run.ejected_after.is_some()
                || matches!(
                    run.standing,
                    Some("avoided" | "ejected" | "probing" | "unready")
                );
            if !judged {
                failures.push(format!(
                    "{title}: run {i}: backend 0 neither ejected nor reported avoided or unready"
                ));
            }
            // EDAS's recovery checks start 30 s after an ejection, by its design.
            if stack == Stack::Outlier(Preset::Recommended)
                && run.back_after.is_none_or(|after| after > 10.0)
            {
                failures.push(format!(
                    "{title}: run {i}: healed backend 0 had half its share back after {}",
                    fmt_secs(run.back_after)
                ));
            }
        }
    }
}

/// A run's cell, stack and run index, and what it measured.
type RunResult = (usize, usize, usize, Result<Outcome, String>);

fn main() {
    let options = options();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut cells = matrix(options.quick, options.peers);
    if options.peers {
        let mut missing = Vec::new();
        for proxy in [Proxy::Nginx, Proxy::Haproxy] {
            if !proxy.installed() {
                missing.push(proxy.name());
            }
        }
        if !Grpcio::installed() {
            missing.push("grpcio (python3 -c 'import grpc')");
        }
        if !missing.is_empty() {
            eprintln!(
                "missing peers: {}; run benches/real_sockets/install-peers.sh, or pass --without-peers",
                missing.join(", ")
            );
            std::process::exit(2);
        }
    }
    if let Some(only) = &options.only {
        // Alternatives separated by `|`: a cell (or stack) matching any of them runs.
        let any = |text: &str| only.split('|').any(|part| text.contains(part));
        cells.retain_mut(|(cell, stacks, _)| {
            if any(&cell.title()) {
                return true;
            }
            stacks.retain(|s| any(s.name()));
            !stacks.is_empty()
        });
    }
    // Every (cell, stack, run) is a job; jobs of different cells interleave.
    let mut jobs = Vec::new();
    for (c, (cell, stacks, runs)) in cells.iter().enumerate() {
        let runs = options.runs.unwrap_or(*runs);
        for r in 0..runs {
            for (s, stack) in stacks.iter().enumerate() {
                jobs.push((c, s, r, *cell, *stack));
            }
        }
    }
    let total = jobs.len();
    eprintln!(
        "{} cells, {total} runs, {} at a time",
        cells.len(),
        options.jobs
    );
    let results: Arc<Mutex<Vec<RunResult>>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    runtime.block_on(async {
        let queue = Arc::new(Mutex::new(jobs.into_iter()));
        let mut workers = Vec::new();
        for _ in 0..options.jobs.max(1) {
            let (queue, results, done) = (queue.clone(), results.clone(), done.clone());
            workers.push(tokio::spawn(async move {
                loop {
                    let next = queue.lock().unwrap().next();
                    let Some((c, s, r, cell, stack)) = next else {
                        return;
                    };
                    let outcome = run(cell, stack).await;
                    let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                    eprintln!(
                        "[{finished}/{total} {:.0} s] {} · {}: {}",
                        began.elapsed().as_secs_f64(),
                        cell.title(),
                        stack.name(),
                        match &outcome {
                            Ok(o) => format!("{} of {} failed", o.failed, o.requests),
                            Err(e) => format!("error: {e}"),
                        }
                    );
                    results.lock().unwrap().push((c, s, r, outcome));
                }
            }));
        }
        for worker in workers {
            worker.await.expect("a worker");
        }
    });
    let results = std::mem::take(&mut *results.lock().unwrap());
    let mut text = String::new();
    let mut failures = Vec::new();
    for (c, (cell, stacks, _)) in cells.iter().enumerate() {
        let _ = writeln!(text, "### {}\n\n{HEADER}", cell.title());
        for (s, stack) in stacks.iter().enumerate() {
            let mut runs: Vec<(usize, Outcome)> = Vec::new();
            for (rc, rs, rr, outcome) in &results {
                if *rc == c && *rs == s {
                    match outcome {
                        Ok(o) => runs.push((*rr, o.clone())),
                        Err(e) => failures.push(format!("{}: {}: {e}", cell.title(), stack.name())),
                    }
                }
            }
            runs.sort_by_key(|(r, _)| *r);
            let runs: Vec<Outcome> = runs.into_iter().map(|(_, o)| o).collect();
            if runs.is_empty() {
                continue;
            }
            let _ = writeln!(text, "{}", row(*stack, &runs));
            if options.quick {
                check_quick(cell, *stack, &runs, &mut failures);
            }
        }
        let _ = writeln!(text);
    }
    print!("{text}");
    if let Some(out) = &options.out {
        std::fs::write(out, &text).expect("writable --out");
    }
    eprintln!("done in {:.0} s", began.elapsed().as_secs_f64());
    if !failures.is_empty() {
        for failure in &failures {
            eprintln!("FAILED: {failure}");
        }
        std::process::exit(1);
    }
}
