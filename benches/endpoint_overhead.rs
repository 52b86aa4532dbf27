//! Per-call overhead of the `OutlierEndpoint` wrapper over a trivial always-ready service, against the
//! bare service measured in the same run.
//!
//! Run with `cargo bench -p tower-outlier-benches`. A plain harness (no criterion): each case runs
//! `ITERATIONS` calls, three times, interleaved with the baseline, and the median is reported,
//! because this machine is shared and noisy and only ratios within one run are comparable.
//!
//! One call = `poll_ready` + `call` + polling the response future to completion, which is what a
//! balancer does per request. The wrapped cases include everything the wrapper does per call: two
//! clock reads (latency), classification, the error-rate window update, the latency estimate
//! update and the in-flight accounting.

#[path = "common.rs"]
mod common;
#[path = "per_call.rs"]
#[allow(dead_code)] // The harness only: not the allocation count or failsafe.
mod per_call;

use common::{median, Echo};

use tower_outlier::policy::Clock;
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
use tower_service::Service;

const ITERATIONS: u64 = 10_000_000;
const RUNS: usize = 3;

fn layer(clock: Clock) -> OutlierDetectionLayer {
    let config = ErrorRateConfig::hsf().build().expect("valid preset");
    OutlierDetectionLayer::new(ErrorRatePolicy::new(config)).clock(clock)
}

/// ns per call per thread, `make()`'s service on `threads` threads at once (each on its own
/// clone).
fn run<S, F>(threads: usize, make: &F) -> f64
where
    S: Service<u64> + Send + 'static,
    F: Fn() -> S,
{
    per_call::run(threads, ITERATIONS, make).ns
}

fn main() {
    // `Clock::tokio` reads tokio's clock, which needs no runtime when time is not paused, but the
    // layer is built inside one as users do.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();

    let tokio_layer = layer(Clock::tokio());
    let tsc_layer = layer(Clock::tsc());
    // One endpoint shared by all threads (clones share the record), as a balancer's endpoint is.
    let tokio_endpoint = tokio_layer.endpoint(Echo);
    let tsc_endpoint = tsc_layer.endpoint(Echo);

    println!(
        "per-call overhead, {ITERATIONS} calls per thread, median of {RUNS} interleaved runs (ns/call)"
    );
    println!(
        "{:<8} {:>10} {:>14} {:>10} {:>12} {:>10}",
        "threads", "bare", "tokio clock", "ratio", "tsc clock", "ratio"
    );
    for threads in [1, 2] {
        let (mut bare, mut tokio, mut tsc) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..RUNS {
            bare.push(run(threads, &|| Echo));
            tokio.push(run(threads, &|| tokio_endpoint.clone()));
            tsc.push(run(threads, &|| tsc_endpoint.clone()));
        }
        let (bare, tokio, tsc) = (median(bare), median(tokio), median(tsc));
        println!(
            "{:<8} {:>10.2} {:>14.2} {:>9.1}x {:>12.2} {:>9.1}x",
            threads,
            bare,
            tokio,
            tokio / bare,
            tsc,
            tsc / bare
        );
        println!(
            "{:<8} {:>10} {:>14.2} {:>10} {:>12.2}",
            "",
            "added:",
            tokio - bare,
            "",
            tsc - bare
        );
    }
    // The record saw every call: a sanity check that the work was not optimised away.
    let calls = tsc_endpoint.record().policies()[0]
        .describe(tsc_endpoint.record().clock().now())
        .counts
        .calls;
    assert!(calls > 0, "the wrapped calls were recorded");
}
