//! Per-call overhead of the standalone circuit breaker (`tower_outlier::slow_call`) over a trivial
//! always-ready service, against the bare service, `tower-resilience-circuitbreaker` and
//! `failsafe`, all measured in the same run.
//!
//! Run with `cargo bench -p tower-outlier-benches --bench circuit_breaker`. A plain harness (no
//! criterion), like `endpoint_overhead.rs`: each case runs `ITERATIONS` calls, `RUNS` times,
//! interleaved with the others, and the median is reported, because this machine is shared and
//! noisy and only ratios within one run are comparable.
//!
//! One call = `poll_ready` + `call` + polling the response future to completion, on the hot path:
//! every call succeeds, so every breaker stays closed. Futures are polled again while they return
//! `Pending` (only a contended lock does, in the comparison crates); such extra polls are counted
//! and printed.
//!
//! What each case does per call:
//! * ours: two clock reads (latency), the admission check (one atomic load), one `Arc` clone and
//!   drop (the response future's completion), classification, and the completion recorded in the
//!   lock-free one-bucket interval and read back for the slow-ratio check.
//! * `tower-resilience-circuitbreaker` (count-based window): one boxed future, two
//!   `tokio::sync::Mutex` acquisitions, two `std::time::Instant` reads for the latency, and two
//!   events (`CallPermitted`, `SuccessRecorded`) built even with no listener, each with another
//!   `Instant` read and a clone of the breaker's name (a `String`, `"<unnamed>"` by default).
//! * `failsafe` (`failsafe::futures::CircuitBreaker::call` around the inner service's future, its
//!   default policy): one `Arc` clone and drop, two `parking_lot` mutex acquisitions, two
//!   `Instant` reads and an EMA update. It does not time calls (no slow-call rule).

#[path = "common.rs"]
mod common;
#[path = "per_call.rs"]
mod per_call;

use common::{median, Echo};
use per_call::{allocations_per_call, drive, run, Failsafe, Sample};

use std::time::Duration;

use tower_layer::Layer;
use tower_outlier::policy::Clock;
use tower_outlier::slow_call::{BreakerConfig, CircuitBreakerLayer, State};
use tower_resilience_circuitbreaker::{
    CircuitBreakerLayer as ResilienceLayer, CircuitState, SlidingWindowType,
};

const ITERATIONS: u64 = 5_000_000;
const RUNS: usize = 5;
/// Calls per case for the allocation count (one thread, after the timed runs).
const ALLOCATION_CALLS: u64 = 10_000;

fn ours(clock: Clock) -> CircuitBreakerLayer {
    // The brief's configuration: Sentinel's slow-call ratio rule (slow above 500 ms, ratio 1.0,
    // 5 requests minimum, 1 s interval in one bucket), open for 10 s.
    let config = BreakerConfig::slow_ratio(Duration::from_millis(500))
        .open_duration(Duration::from_secs(10))
        .build()
        .expect("valid breaker config");
    CircuitBreakerLayer::new(config).clock(clock)
}

/// The closest `tower-resilience-circuitbreaker` configuration: a failure-rate threshold plus its
/// slow-call rule (slow at or above 500 ms, trips when all calls are slow), 5 calls minimum,
/// 10 s open. `window` chooses the count-based window (size 100, its default; in 0.14 its counts
/// accumulate from the last state change rather than slide) or a time-based one.
fn resilience_layer(window: SlidingWindowType) -> ResilienceLayer {
    let builder = ResilienceLayer::builder()
        .failure_rate_threshold(0.5)
        .slow_call_duration_threshold(Duration::from_millis(500))
        .slow_call_rate_threshold(1.0)
        .minimum_number_of_calls(5)
        .wait_duration_in_open(Duration::from_secs(10))
        .sliding_window_type(window);
    let builder = match window {
        SlidingWindowType::CountBased => builder.sliding_window_size(100),
        SlidingWindowType::TimeBased => builder.sliding_window_duration(Duration::from_secs(60)),
    };
    builder.build().expect("valid tower-resilience config")
}

fn main() {
    // `Clock::tokio` needs no runtime when time is not paused, and neither comparison crate needs
    // one on the closed path, but the services are built inside one as users do.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();

    // One service per case, shared by all threads through clones (clones share the breaker).
    // The clock is kept (clones share its origin) to read the breaker's counts at the end.
    let tsc_clock = Clock::tsc();
    let tsc = ours(tsc_clock.clone()).layer(Echo);
    let tokio = ours(Clock::tokio()).layer(Echo);
    let resilience = resilience_layer(SlidingWindowType::CountBased).layer_fn(Echo);
    let failsafe = Failsafe {
        inner: Echo,
        breaker: failsafe::Config::new().build(),
    };

    const CASES: [&str; 5] = [
        "bare service",
        "ours, TSC clock",
        "ours, tokio clock",
        "tower-resilience-circuitbreaker",
        "failsafe",
    ];
    // medians[threads - 1][case]
    let mut medians = [[Sample::default(); CASES.len()]; 2];
    for threads in [1, 2] {
        let mut samples: [Vec<Sample>; CASES.len()] = Default::default();
        for _ in 0..RUNS {
            samples[0].push(run(threads, ITERATIONS, &|| Echo));
            samples[1].push(run(threads, ITERATIONS, &|| tsc.clone()));
            samples[2].push(run(threads, ITERATIONS, &|| tokio.clone()));
            samples[3].push(run(threads, ITERATIONS, &|| resilience.clone()));
            samples[4].push(run(threads, ITERATIONS, &|| failsafe.clone()));
        }
        medians[threads - 1] = samples.map(|runs| Sample {
            ns: median(runs.iter().map(|s| s.ns).collect()),
            pending: median(runs.iter().map(|s| s.pending).collect()),
        });
    }
    let allocs = [
        allocations_per_call(Echo, 0, ALLOCATION_CALLS),
        allocations_per_call(tsc.clone(), 0, ALLOCATION_CALLS),
        allocations_per_call(tokio.clone(), 0, ALLOCATION_CALLS),
        allocations_per_call(resilience.clone(), 0, ALLOCATION_CALLS),
        allocations_per_call(failsafe.clone(), 0, ALLOCATION_CALLS),
    ];

    println!(
        "per-call overhead, {ITERATIONS} calls per thread, median of {RUNS} interleaved runs; \
         2 threads = clones of one service"
    );
    println!(
        "{:<32} {:>9} {:>8} {:>9} {:>9} {:>8} {:>9} {:>7} {:>9}",
        "case", "1t ns", "ratio", "added", "2t ns", "ratio", "added", "allocs", "2t pend."
    );
    let (bare1, bare2) = (medians[0][0].ns, medians[1][0].ns);
    for (case, name) in CASES.iter().enumerate() {
        let (one, two) = (medians[0][case], medians[1][case]);
        println!(
            "{:<32} {:>9.2} {:>7.1}x {:>9.2} {:>9.2} {:>7.1}x {:>9.2} {:>7.2} {:>9.2}",
            name,
            one.ns,
            one.ns / bare1,
            one.ns - bare1,
            two.ns,
            two.ns / bare2,
            two.ns - bare2,
            allocs[case],
            two.pending
        );
    }
    println!("(allocs: allocations per call; 2t pend.: polls per call that returned Pending)");

    // tower-resilience's time-based window keeps one record per call and, on every call, evicts
    // expired ones and counts all the others, so its cost grows with the calls in the window.
    // Measured apart, single-threaded, on a fresh breaker per size with a 60 s window (the
    // window holds every call made): the average over the window filling from 0 to `calls`.
    println!("tower-resilience time-based window (60 s), one thread, fresh breaker per size");
    println!("{:<12} {:>10} {:>12}", "calls", "bare", "tower-resil");
    for calls in [1_000, 10_000, 100_000] {
        let (mut bare, mut time_based) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            bare.push(run(1, calls, &|| Echo).ns);
            let service = resilience_layer(SlidingWindowType::TimeBased).layer_fn(Echo);
            time_based.push(run(1, calls, &|| service.clone()).ns);
        }
        println!(
            "{:<12} {:>10.2} {:>12.2}",
            calls,
            median(bare),
            median(time_based)
        );
    }

    // Every breaker saw only successes and is still closed, and ours counted the calls: a sanity
    // check that the work was done and not optimised away.
    assert_eq!(tsc.state(), State::Closed);
    assert_eq!(tokio.state(), State::Closed);
    assert_eq!(resilience.state_sync(), CircuitState::Closed);
    assert!(failsafe.breaker.is_call_permitted());
    let mut check = tsc.clone();
    drive(&mut check, 1_000);
    assert!(
        tsc.breaker().counts(tsc_clock.now()).calls > 0,
        "the wrapped calls were recorded"
    );
}
