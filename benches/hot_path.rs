//! The hot path against its floor and against two other breakers: per-call cost of the
//! `OutlierEndpoint` and of the standalone slow-call breaker, next to the least any wrapper that
//! times calls and shares a counter can do, and next to `recloser` and `failsafe`, on one thread
//! and on two threads sharing one service.
//!
//! Run with `cargo bench -p tower-outlier-benches --bench hot_path`. A plain harness (no
//! criterion), like `endpoint_overhead.rs`: `ROUNDS` rounds, each running every case once on one
//! thread and then once on two threads, and the median per case and thread count is reported.
//! The cases are interleaved and the medians taken because this machine is shared and noisy: a
//! neighbour's build slows whichever case runs at that moment, so absolute numbers drift from
//! run to run and only ratios between cases of one run are comparable.
//!
//! One call = `poll_ready` + `call` + polling the response future to completion, which is what a
//! balancer does per request; every call succeeds, so every breaker stays closed. Futures are
//! polled again while they return `Pending` (none of these cases should); such extra polls are
//! counted and printed. On two threads each thread drives its own clone of ONE service, so the
//! clones share their state (record, breaker, counter) as a balancer's endpoint is shared.
//! The 2-thread numbers need two free cores: "floor: two clock reads" writes nothing shared, so
//! its 2t ÷ 1t stays near 1 when they are free, and a warning is printed when it does not.
//!
//! What each case does per call, on top of `common::Echo`:
//! * bare service: nothing (`Echo` answers with a ready future).
//! * floor: two clock reads: `Clock::tsc` read in `call` and again when the response future
//!   completes, the difference `black_box`ed. No allocation, no shared write: the clock and the
//!   counter are `&'static` (leaked once), so the future reaches them without an `Arc` clone.
//! * floor: two reads + one shared atomic add: as above, plus one `fetch_add(1, Relaxed)` at
//!   completion on a counter shared by every clone (alone on its cache line). The least a
//!   wrapper that times calls and keeps shared per-endpoint state can do; the targets below are
//!   ratios to it.
//! * Endpoint: `OutlierDetectionLayer` with the HSF error-rate preset on the TSC clock,
//!   `layer.endpoint(Echo)`: everything the wrapper does per call (two clock reads, the
//!   admission check, the in-flight accounting, classification, the error-rate window update and
//!   the latency estimate update), however `crates/tower-outlier` implements them at the time.
//! * Endpoint + D2 latency: the same layer with `LatencyPolicy` (`LatencyConfig::d2()`) added:
//!   the latency rule's per-call cost (two shared atomic adds) beside the others.
//! * Endpoint, Finagle preset (composed): a layer with `finagle::finagle()` alone, a
//!   `ComposedPolicy` of two members recording every call: the success-rate average (a
//!   compare-and-swap, an exponential, a window add) and the streak (one atomic add).
//! * standalone breaker: the slow-call `CircuitBreakerLayer` exactly as `ours(Clock::tsc())` in
//!   `circuit_breaker.rs` (slow above 500 ms, ratio 1.0, 5 calls minimum, 1 s interval, open
//!   10 s): as `circuit_breaker.rs` lists it when this was written, two clock reads, one atomic
//!   load to admit, one `Arc` clone and drop, the completion recorded in the lock-free one-bucket
//!   interval and read back for the slow-ratio check.
//! * recloser: `recloser::AsyncRecloser::call` around `Echo`'s future, with the configuration its
//!   README shows as the default (`error_rate(0.5)`, `closed_len(100)`, `half_open_len(10)`,
//!   `open_wait(30 s)`; the same as `Recloser::default()`). Note that it is not a
//!   consecutive-failures breaker: it keeps the outcome of the last 100 calls in a ring buffer and
//!   trips on their failure rate. Per call: one `Arc` clone and drop (`AsyncRecloser` is an
//!   `Arc<Recloser>`, so clones share the breaker), one `crossbeam_epoch::pin` per poll, one
//!   atomic load of the state, and the ring buffer updated under its spin lock (one swap, a few
//!   relaxed atomics, one store to release). It reads no clock while closed.
//! * failsafe consecutive: `failsafe::futures::CircuitBreaker::call` around `Echo`'s future,
//!   policy `consecutive_failures(5, constant(30 s))`: one `Arc` clone and drop, two
//!   `parking_lot` mutex acquisitions (admission, success). It reads no clock while closed.
//!
//! Allocations per call are counted on one thread after the timed runs (after a warm-up, so
//! one-time thread-local set-up such as `crossbeam_epoch`'s registration is not counted).

#[path = "common.rs"]
mod common;
#[path = "per_call.rs"]
mod per_call;

use common::{median, Echo};
use per_call::{allocations_per_call, drive, run, Failsafe, Sample};

use std::convert::Infallible;
use std::future::{Future, Ready};
use std::hint::black_box;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tower_layer::Layer;
use tower_outlier::latency::{LatencyConfig, LatencyPolicy};
use tower_outlier::policy::Clock;
use tower_outlier::slow_call::{BreakerConfig, CircuitBreakerLayer, State};
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
use tower_service::Service;

/// Calls per thread per run.
const ITERATIONS: u64 = 3_000_000;
/// Rounds; each runs every case once per thread count.
const ROUNDS: usize = 7;
/// Calls per case for the allocation count (one thread, after the timed runs).
const ALLOCATION_CALLS: u64 = 10_000;
/// Uncounted calls before each allocation count.
const WARM_UP_CALLS: u64 = 1_000;

/// A counter alone on its cache line (128 bytes: adjacent-line prefetch pairs lines), so the
/// floor's shared add contends only with itself.
#[repr(align(128))]
struct Padded(AtomicU64);

/// The floor cases: `Echo` plus two reads of `clock` (at `call` and at completion), and with
/// `ADD` one relaxed `fetch_add` on `calls` at completion. Clones share the clock and the counter.
#[derive(Clone, Copy)]
struct Floor<const ADD: bool> {
    inner: Echo,
    clock: &'static Clock,
    calls: &'static Padded,
}

impl<const ADD: bool> Service<u64> for Floor<ADD> {
    type Response = u64;
    type Error = Infallible;
    type Future = FloorFuture<ADD>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: u64) -> Self::Future {
        FloorFuture {
            inner: self.inner.call(request),
            start: self.clock.now(),
            clock: self.clock,
            calls: self.calls,
        }
    }
}

/// `Echo`'s ready future, reading the clock (and with `ADD` adding to the counter) when it
/// completes.
struct FloorFuture<const ADD: bool> {
    inner: Ready<Result<u64, Infallible>>,
    start: u64,
    clock: &'static Clock,
    calls: &'static Padded,
}

impl<const ADD: bool> Future for FloorFuture<ADD> {
    type Output = Result<u64, Infallible>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        black_box(self.clock.now().wrapping_sub(self.start));
        if ADD {
            self.calls.0.fetch_add(1, Ordering::Relaxed);
        }
        Poll::Ready(result)
    }
}

/// `recloser` has no tower integration: its documented use for futures is
/// `AsyncRecloser::call(future)`, so this wraps the inner service's response future that way.
/// Clones share the breaker (`AsyncRecloser` is an `Arc<Recloser>`).
#[derive(Clone)]
struct Recloser {
    inner: Echo,
    breaker: recloser::AsyncRecloser,
}

impl Service<u64> for Recloser {
    type Response = u64;
    type Error = recloser::Error<Infallible>;
    type Future = recloser::RecloserFuture<Ready<Result<u64, Infallible>>, recloser::AnyError>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(recloser::Error::Inner)
    }

    #[inline]
    fn call(&mut self, request: u64) -> Self::Future {
        self.breaker.call(self.inner.call(request))
    }
}

/// One call to completion; its result (for the sanity checks).
fn call_once<S: Service<u64>>(service: &mut S) -> Result<S::Response, S::Error> {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(ready) = service.poll_ready(&mut cx) {
            ready?;
            break;
        }
    }
    let mut future = pin!(service.call(1));
    loop {
        if let Poll::Ready(result) = future.as_mut().poll(&mut cx) {
            return result;
        }
    }
}

/// The standalone breaker as `ours` in `circuit_breaker.rs`: Sentinel's slow-call ratio rule
/// (slow above 500 ms, ratio 1.0, 5 requests minimum, 1 s interval in one bucket), open for 10 s.
fn breaker_layer(clock: Clock) -> CircuitBreakerLayer {
    let config = BreakerConfig::slow_ratio(Duration::from_millis(500))
        .open_duration(Duration::from_secs(10))
        .build()
        .expect("valid breaker config");
    CircuitBreakerLayer::new(config).clock(clock)
}

const CASES: [&str; 9] = [
    "bare service",
    "floor: two clock reads",
    "floor: two reads + one shared atomic add",
    "Endpoint",
    "standalone breaker",
    "recloser",
    "failsafe consecutive",
    "Endpoint + D2 latency",
    "Endpoint, Finagle preset (composed)",
];
const TWO_READS: usize = 1;
const FLOOR: usize = 2;
const ENDPOINT: usize = 3;
const RECLOSER: usize = 5;
const FAILSAFE: usize = 6;

/// Prints one target check: `value` is what the line shows, `met` whether the target holds.
fn target(what: &str, value: String, met: bool) {
    let verdict = if met { "met" } else { "NOT met" };
    println!("target: {what} : {value} ({verdict})");
}

fn main() {
    // Neither the TSC clock nor the comparison crates need a runtime on the closed path, but the
    // services are built inside one as users do.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();

    // One service per case, shared by all threads through clones.
    let floor_clock: &'static Clock = Box::leak(Box::new(Clock::tsc()));
    let floor_calls: &'static Padded = Box::leak(Box::new(Padded(AtomicU64::new(0))));
    let two_reads = Floor::<false> {
        inner: Echo,
        clock: floor_clock,
        calls: floor_calls,
    };
    let two_reads_add = Floor::<true> {
        inner: Echo,
        clock: floor_clock,
        calls: floor_calls,
    };
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().expect("valid preset"),
    ))
    .clock(Clock::tsc());
    let endpoint = layer.endpoint(Echo);
    // The same, with the latency rule beside the error rate: two more shared adds per call.
    let timed_layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().expect("valid preset"),
    ))
    .with_policy(LatencyPolicy::new(
        LatencyConfig::d2().build().expect("valid preset"),
    ))
    .clock(Clock::tsc());
    let timed_endpoint = timed_layer.endpoint(Echo);
    // Finagle's default: a composition of its success-rate average and its streak, each recording
    // every call (a compare-and-swap of the average, an exponential, a window add).
    let finagle_endpoint = OutlierDetectionLayer::new(tower_outlier::finagle::finagle())
        .clock(Clock::tsc())
        .endpoint(Echo);
    // The clock is kept (clones share its origin) to read the breaker's counts at the end.
    let breaker_clock = Clock::tsc();
    let breaker = breaker_layer(breaker_clock.clone()).layer(Echo);
    let recloser = Recloser {
        inner: Echo,
        breaker: recloser::AsyncRecloser::from(
            recloser::Recloser::custom()
                .error_rate(0.5)
                .closed_len(100)
                .half_open_len(10)
                .open_wait(Duration::from_secs(30))
                .build(),
        ),
    };
    let failsafe = Failsafe {
        inner: Echo,
        breaker: failsafe::Config::new()
            .failure_policy(failsafe::failure_policy::consecutive_failures(
                5,
                failsafe::backoff::constant(Duration::from_secs(30)),
            ))
            .build(),
    };

    let run_case = |case: usize, threads: usize| -> Sample {
        match case {
            0 => run(threads, ITERATIONS, &|| Echo),
            1 => run(threads, ITERATIONS, &|| two_reads),
            2 => run(threads, ITERATIONS, &|| two_reads_add),
            3 => run(threads, ITERATIONS, &|| endpoint.clone()),
            4 => run(threads, ITERATIONS, &|| breaker.clone()),
            5 => run(threads, ITERATIONS, &|| recloser.clone()),
            6 => run(threads, ITERATIONS, &|| failsafe.clone()),
            7 => run(threads, ITERATIONS, &|| timed_endpoint.clone()),
            8 => run(threads, ITERATIONS, &|| finagle_endpoint.clone()),
            _ => unreachable!("nine cases"),
        }
    };

    let started = Instant::now();
    // samples[threads - 1][case]: one sample per round.
    let mut samples: [[Vec<Sample>; CASES.len()]; 2] = Default::default();
    for _ in 0..ROUNDS {
        for threads in [1, 2] {
            for (case, runs) in samples[threads - 1].iter_mut().enumerate() {
                runs.push(run_case(case, threads));
            }
        }
    }
    let timed = started.elapsed();
    // medians[threads - 1][case]
    let medians = samples.map(|per_case| {
        per_case.map(|runs| Sample {
            ns: median(runs.iter().map(|s| s.ns).collect()),
            pending: median(runs.iter().map(|s| s.pending).collect()),
        })
    });
    let allocs = [
        allocations_per_call(Echo, WARM_UP_CALLS, ALLOCATION_CALLS),
        allocations_per_call(two_reads, WARM_UP_CALLS, ALLOCATION_CALLS),
        allocations_per_call(two_reads_add, WARM_UP_CALLS, ALLOCATION_CALLS),
        allocations_per_call(endpoint.clone(), WARM_UP_CALLS, ALLOCATION_CALLS),
        allocations_per_call(breaker.clone(), WARM_UP_CALLS, ALLOCATION_CALLS),
        allocations_per_call(recloser.clone(), WARM_UP_CALLS, ALLOCATION_CALLS),
        allocations_per_call(failsafe.clone(), WARM_UP_CALLS, ALLOCATION_CALLS),
        allocations_per_call(timed_endpoint.clone(), WARM_UP_CALLS, ALLOCATION_CALLS),
        allocations_per_call(finagle_endpoint.clone(), WARM_UP_CALLS, ALLOCATION_CALLS),
    ];

    println!(
        "hot path, {ITERATIONS} calls per thread per run, median of {ROUNDS} interleaved rounds; \
         2 threads = clones of one service; timed runs took {:.1} s",
        timed.as_secs_f64()
    );
    println!(
        "| {:<40} | {:>10} | {:>10} | {:>12} | {:>9} | {:>11} | {:>10} |",
        "case", "1t ns/call", "2t ns/call", "1t ÷ floor", "2t ÷ 1t", "allocs/call", "2t pending"
    );
    println!(
        "|{:-<42}|{:->12}|{:->12}|{:->14}|{:->11}|{:->13}|{:->12}|",
        "", "", "", "", "", "", ""
    );
    let floor = medians[0][FLOOR].ns;
    for (case, name) in CASES.iter().enumerate() {
        let (one, two) = (medians[0][case], medians[1][case]);
        println!(
            "| {:<40} | {:>10.2} | {:>10.2} | {:>11.2}x | {:>8.2}x | {:>11.3} | {:>10.3} |",
            name,
            one.ns,
            two.ns,
            one.ns / floor,
            two.ns / one.ns,
            allocs[case],
            two.pending
        );
    }
    println!(
        "(2t ns/call: per thread, both threads calling at once; 1t ÷ floor: against \
         \"floor: two reads + one shared atomic add\" on 1 thread; 2t pending: polls per call \
         that returned Pending)"
    );

    // "floor: two clock reads" shares nothing writable, so on two free cores its 2t ÷ 1t is
    // about 1. Well above, the two threads did not run in parallel (another process held a
    // core) and every 2t number counts time spent descheduled.
    let parallel = medians[1][TWO_READS].ns / medians[0][TWO_READS].ns;
    if parallel > 1.3 {
        println!(
            "warning: \"floor: two clock reads\" (no shared writes) took {parallel:.2}x as long \
             per call on 2 threads: the threads did not get two cores, the 2t columns and \
             targets are not meaningful in this run"
        );
    }
    let (endpoint1, endpoint2) = (medians[0][ENDPOINT].ns, medians[1][ENDPOINT].ns);
    let (recloser2, failsafe2) = (medians[1][RECLOSER].ns, medians[1][FAILSAFE].ns);
    target(
        "Endpoint 1t ≤ 1.25 × floor (two reads + add) 1t",
        format!(
            "{:.2}x ({endpoint1:.2} ns vs {floor:.2} ns)",
            endpoint1 / floor
        ),
        endpoint1 <= 1.25 * floor,
    );
    target(
        "Endpoint 2t ≤ 1.5 × Endpoint 1t",
        format!(
            "{:.2}x ({endpoint2:.2} ns vs {endpoint1:.2} ns)",
            endpoint2 / endpoint1
        ),
        endpoint2 <= 1.5 * endpoint1,
    );
    target(
        "Endpoint 2t < recloser 2t",
        format!(
            "{:.2}x ({endpoint2:.2} ns vs {recloser2:.2} ns)",
            endpoint2 / recloser2
        ),
        endpoint2 < recloser2,
    );
    target(
        "Endpoint 2t < failsafe consecutive 2t",
        format!(
            "{:.2}x ({endpoint2:.2} ns vs {failsafe2:.2} ns)",
            endpoint2 / failsafe2
        ),
        endpoint2 < failsafe2,
    );

    // The work was done and not optimised away: the floor counted every call of its case, the
    // endpoint and the standalone breaker recorded calls, and every breaker is still closed.
    let floor_expected = ROUNDS as u64 * 3 * ITERATIONS + WARM_UP_CALLS + ALLOCATION_CALLS;
    assert_eq!(
        floor_calls.0.load(Ordering::Relaxed),
        floor_expected,
        "the floor's shared add ran once per call"
    );
    let mut check = endpoint.clone();
    drive(&mut check, 1_000);
    let record = endpoint.record();
    assert!(
        record.policies()[0]
            .describe(record.clock().now())
            .counts
            .calls
            > 0,
        "the endpoint recorded the calls"
    );
    let mut check = breaker.clone();
    drive(&mut check, 1_000);
    assert_eq!(breaker.state(), State::Closed);
    assert!(
        breaker.breaker().counts(breaker_clock.now()).calls > 0,
        "the standalone breaker recorded the calls"
    );
    assert!(
        matches!(call_once(&mut recloser.clone()), Ok(1)),
        "recloser is closed (admits calls)"
    );
    assert!(failsafe.breaker.is_call_permitted(), "failsafe is closed");
}
