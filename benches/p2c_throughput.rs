//! Request throughput of tower's power-of-two-choices `Balance` over 10 trivial endpoints (always
//! ready, answering at once), with the endpoints' loads from tower's `PeakEwmaDiscover` (A)
//! against the loads of the outlier-detection layer's adaptor, HSF error-rate preset on the real
//! clock, as the README puts it in front of `Balance` (B). Three setups, each for A and B:
//!
//! 1. current-thread runtime, one task calling the `Balance` directly (`ready().await`, then
//!    `call(request).await`);
//! 2. the `Balance` behind `tower::buffer::Buffer` (capacity 1024), four client tasks on a
//!    current-thread runtime;
//! 3. the same on a multi-thread runtime with two workers.
//!
//! Each run builds a fresh balancer over a fresh `ServiceList` and times everything from there:
//! the 10 endpoints are discovered on the first `ready`, a cost the run's length makes negligible.
//!
//! Beside the requests per second it prints the process's CPU time per request (every thread, on
//! Linux): on two workers the throughput also follows how the runtime parks and wakes its threads,
//! the CPU time only what the balancers and the runtime spend.
//!
//! ```text
//! cargo bench -p tower-outlier-benches --bench p2c_throughput
//! ```
//!
//! A plain harness (no criterion). This machine is shared, noisy and has two cores, so absolute
//! numbers drift from run to run and only ratios within one run are comparable: the runs are
//! interleaved (in each of `ROUNDS` rounds every setup runs A and B back to back, the order
//! alternating from round to round so a drift does not favour either) and the median of the rounds
//! is reported, which an outlier run does not move as it would a mean.

#[path = "common.rs"]
#[allow(dead_code)] // The service and the median; not the per-call helper.
mod common;

use common::{median, Echo};

use std::fmt;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PeakEwmaDiscover};
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, Monitor, OutlierDetectionLayer};

const ENDPOINTS: usize = 10;
const ROUNDS: usize = 7;
/// Requests per run when one task calls the balancer directly.
const DIRECT_REQUESTS: u64 = 2_000_000;
/// Requests per run through the buffer, all client tasks together.
const BUFFER_REQUESTS: u64 = 1_000_000;
const CLIENT_TASKS: u64 = 4;
const BUFFER_CAPACITY: usize = 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    Direct,
    BufferCurrentThread,
    BufferTwoWorkers,
}

impl Setup {
    const ALL: [Setup; 3] = [
        Setup::Direct,
        Setup::BufferCurrentThread,
        Setup::BufferTwoWorkers,
    ];

    fn requests(self) -> u64 {
        match self {
            Setup::Direct => DIRECT_REQUESTS,
            Setup::BufferCurrentThread | Setup::BufferTwoWorkers => BUFFER_REQUESTS,
        }
    }

    fn runtime(self) -> Runtime {
        let mut builder = match self {
            Setup::Direct | Setup::BufferCurrentThread => {
                tokio::runtime::Builder::new_current_thread()
            }
            Setup::BufferTwoWorkers => {
                let mut builder = tokio::runtime::Builder::new_multi_thread();
                builder.worker_threads(2);
                builder
            }
        };
        // The layer and `PeakEwma` read tokio's clock; users run them with time enabled.
        builder.enable_time().build().expect("runtime")
    }
}

impl fmt::Display for Setup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Setup::Direct => "current-thread, Balance directly",
            Setup::BufferCurrentThread => "Buffer, 4 tasks, current-thread",
            Setup::BufferTwoWorkers => "Buffer, 4 tasks, 2 workers",
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Balancer {
    PeakEwma,
    Outlier,
}

/// What one run did.
struct Run {
    elapsed: Duration,
    /// The process's CPU time (user + system, every thread) over the run, where the OS says.
    cpu: Option<Duration>,
    requests: u64,
    succeeded: u64,
    /// For the layer: what its monitor showed at the end, the balancer still alive.
    seen: Option<Seen>,
}

impl Run {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU time per request, in nanoseconds.
    fn cpu_per_request(&self) -> Option<f64> {
        self.cpu
            .map(|cpu| cpu.as_nanos() as f64 / self.requests as f64)
    }
}

/// The CPU time this process has used, user and system, all threads: `/proc/self/stat` on Linux
/// (in clock ticks of 10 ms, a 1 % resolution on a run of a second), `None` elsewhere.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let user: u64 = fields.nth(11)?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    // USER_HZ is 100 on every Linux architecture tokio runs on.
    Some(Duration::from_millis((user + system) * 10))
}

/// The layer's monitor at the end of a run.
struct Seen {
    endpoints: usize,
    available: usize,
    /// Calls in the error-rate windows of all endpoints (the window outlasts the run).
    calls: u64,
}

fn seen(monitor: &Monitor) -> Seen {
    let snapshot = monitor.snapshot();
    Seen {
        endpoints: snapshot.endpoints.len(),
        available: snapshot
            .endpoints
            .iter()
            .filter(|e| e.status.is_available())
            .count(),
        calls: snapshot
            .endpoints
            .iter()
            .map(|e| e.windows.first().map_or(0, |w| w.counts.calls))
            .sum(),
    }
}

fn discover() -> ServiceList<Vec<Echo>> {
    ServiceList::new(vec![Echo; ENDPOINTS])
}

/// One task, `requests` requests, one after the other; returns how many succeeded.
async fn drive_directly<S>(balance: &mut S, requests: u64) -> u64
where
    S: Service<u64, Response = u64>,
{
    let mut succeeded = 0;
    for i in 0..requests {
        let Ok(ready) = balance.ready().await else {
            continue;
        };
        if ready.call(i).await.is_ok_and(|answer| answer == i) {
            succeeded += 1;
        }
    }
    succeeded
}

/// `CLIENT_TASKS` spawned tasks, each sending its share of `requests` on its clone of `buffer`;
/// returns how many succeeded.
async fn drive_buffer<B>(buffer: &B, requests: u64) -> u64
where
    B: Service<u64, Response = u64> + Clone + Send + 'static,
    B::Future: Send,
{
    let tasks: Vec<_> = (0..CLIENT_TASKS)
        .map(|_| {
            let mut client = buffer.clone();
            tokio::spawn(async move { drive_directly(&mut client, requests / CLIENT_TASKS).await })
        })
        .collect();
    let mut succeeded = 0;
    for task in tasks {
        succeeded += task.await.expect("client task");
    }
    succeeded
}

/// Times one run of `setup` on a balancer `make` builds (inside the timed span); `look` reads the
/// layer's monitor once the requests are done, before the balancer is dropped.
fn measure<S>(
    setup: Setup,
    runtime: &Runtime,
    make: impl FnOnce() -> S,
    look: impl FnOnce() -> Option<Seen>,
) -> Run
where
    S: Service<u64, Response = u64, Error = BoxError> + Send + 'static,
    S::Future: Send + 'static,
{
    let requests = setup.requests();
    runtime.block_on(async move {
        let start = Instant::now();
        let cpu_start = process_cpu();
        let mut balance = make();
        // Outlives the timing: shutting its worker down is not part of the run.
        let buffer;
        let succeeded = if setup == Setup::Direct {
            drive_directly(&mut balance, requests).await
        } else {
            buffer = Buffer::new(balance, BUFFER_CAPACITY);
            drive_buffer(&buffer, requests).await
        };
        let elapsed = start.elapsed();
        let cpu = process_cpu().zip(cpu_start).map(|(end, start)| end - start);
        Run {
            elapsed,
            cpu,
            requests,
            succeeded,
            seen: look(),
        }
    })
}

fn run(setup: Setup, balancer: Balancer, runtime: &Runtime) -> Run {
    match balancer {
        Balancer::PeakEwma => measure(
            setup,
            runtime,
            || {
                // tower's example defaults.
                Balance::new(PeakEwmaDiscover::new(
                    discover(),
                    Duration::from_millis(30),
                    Duration::from_secs(10),
                    CompleteOnResponse::default(),
                ))
            },
            || None,
        ),
        Balancer::Outlier => {
            let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
                ErrorRateConfig::hsf().build().expect("the HSF preset"),
            ));
            let monitor = layer.monitor();
            measure(
                setup,
                runtime,
                move || Balance::new(layer.layer(discover())),
                move || Some(seen(&monitor)),
            )
        }
    }
}

/// `1234567.8` as `1 234 568`.
fn grouped(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn main() {
    let started = Instant::now();
    let runtimes: Vec<Runtime> = Setup::ALL.iter().map(|s| s.runtime()).collect();
    // runs[setup][balancer], in round order.
    let mut runs: Vec<[Vec<Run>; 2]> = Setup::ALL.iter().map(|_| [vec![], vec![]]).collect();
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [Balancer::PeakEwma, Balancer::Outlier]
        } else {
            [Balancer::Outlier, Balancer::PeakEwma]
        };
        for (s, setup) in Setup::ALL.into_iter().enumerate() {
            for balancer in order {
                let b = balancer as usize;
                runs[s][b].push(run(setup, balancer, &runtimes[s]));
            }
        }
    }

    println!(
        "p2c throughput, {ENDPOINTS} always-ready endpoints, median of {ROUNDS} interleaved \
         rounds (requests per second; {DIRECT_REQUESTS} requests per direct run, \
         {BUFFER_REQUESTS} per Buffer run)"
    );
    println!(
        "{:<34} {:>17} {:>15} {:>7} {:>19}",
        "setup", "PeakEwmaDiscover", "tower-outlier", "B ÷ A", "per round, min–max"
    );
    let mut ratios = Vec::new();
    for (s, setup) in Setup::ALL.into_iter().enumerate() {
        let a = median(runs[s][0].iter().map(Run::per_second).collect());
        let b = median(runs[s][1].iter().map(Run::per_second).collect());
        let per_round: Vec<f64> = runs[s][0]
            .iter()
            .zip(&runs[s][1])
            .map(|(a, b)| b.per_second() / a.per_second())
            .collect();
        let low = per_round.iter().copied().fold(f64::INFINITY, f64::min);
        let high = per_round.iter().copied().fold(0.0, f64::max);
        println!(
            "{:<34} {:>17} {:>15} {:>6.2}× {:>12.2}–{:.2}×",
            setup.to_string(),
            grouped(a),
            grouped(b),
            b / a,
            low,
            high
        );
        ratios.push(b / a);
    }
    // What the runs cost the machine: with two workers the throughput also depends on how the
    // runtime parks and wakes its threads, the CPU time on what the balancers do.
    println!();
    println!("CPU time per request, every thread (ns; median of the rounds; lower is better)");
    println!(
        "{:<34} {:>17} {:>15} {:>7} {:>19}",
        "setup", "PeakEwmaDiscover", "tower-outlier", "B ÷ A", "per round, min–max"
    );
    for (s, setup) in Setup::ALL.into_iter().enumerate() {
        let cpu = |b: usize| -> Option<Vec<f64>> {
            runs[s][b].iter().map(Run::cpu_per_request).collect()
        };
        let (Some(a), Some(b)) = (cpu(0), cpu(1)) else {
            println!("{:<34} (no CPU time on this OS)", setup.to_string());
            continue;
        };
        let per_round: Vec<f64> = a.iter().zip(&b).map(|(a, b)| b / a).collect();
        let low = per_round.iter().copied().fold(f64::INFINITY, f64::min);
        let high = per_round.iter().copied().fold(0.0, f64::max);
        let (a, b) = (median(a), median(b));
        println!(
            "{:<34} {:>17.0} {:>15.0} {:>6.2}× {:>12.2}–{:.2}×",
            setup.to_string(),
            a,
            b,
            b / a,
            low,
            high
        );
    }
    println!();
    for (setup, ratio) in Setup::ALL.into_iter().zip(ratios) {
        println!(
            "target: tower-outlier ≥ 1.0× PeakEwmaDiscover ({setup}): {ratio:.2} ({})",
            if ratio >= 1.0 { "met" } else { "NOT met" }
        );
    }

    // Sanity: every request of every run succeeded, and the layer saw all of them.
    let mut problems = Vec::new();
    for (s, setup) in Setup::ALL.into_iter().enumerate() {
        for (b, name) in ["PeakEwmaDiscover", "tower-outlier"]
            .into_iter()
            .enumerate()
        {
            for (round, run) in runs[s][b].iter().enumerate() {
                if run.succeeded != run.requests {
                    problems.push(format!(
                        "{setup}, {name}, round {round}: {} of {} requests succeeded",
                        run.succeeded, run.requests
                    ));
                }
                if let Some(seen) = &run.seen {
                    if seen.endpoints != ENDPOINTS
                        || seen.available != ENDPOINTS
                        || seen.calls != run.requests
                    {
                        problems.push(format!(
                            "{setup}, {name}, round {round}: the monitor shows {} endpoints, {} \
                             available, {} calls counted (expected {ENDPOINTS}, {ENDPOINTS}, {})",
                            seen.endpoints, seen.available, seen.calls, run.requests
                        ));
                    }
                }
            }
        }
    }
    println!();
    if problems.is_empty() {
        println!(
            "sanity: every request succeeded; after every tower-outlier run the monitor showed \
             {ENDPOINTS} endpoints, all available, and counted every call"
        );
    } else {
        for problem in &problems {
            println!("sanity FAILED: {problem}");
        }
    }
    println!("bench time: {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        problems.is_empty(),
        "{} sanity checks failed",
        problems.len()
    );
}
