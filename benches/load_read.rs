//! What a power-of-two-choices draw costs: one `Load::load` read of an `OutlierEndpoint`, against tower's
//! own `PeakEwma` read measured in the same run; and whether the balancer's reads slow down the
//! completions recorded on another core.
//!
//! Run with `cargo bench -p tower-outlier-benches --bench load_read`. A plain harness: every case
//! runs `ITERATIONS` reads, interleaved, `RUNS` times, and the median is reported.

#[path = "common.rs"]
mod common;

use common::{median, ns_per_call, Echo};

use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::io;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tower::discover::{Change, ServiceList};
use tower::load::{CompleteOnResponse, Load, PeakEwma};
use tower_layer::Layer;
use tower_outlier::discover::OutlierEndpoint;
use tower_outlier::policy::Clock;
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
use tower_service::Service;

const ITERATIONS: u64 = 10_000_000;
const CALLS: u64 = 5_000_000;
const RUNS: usize = 5;

/// Times out every call, as a black hole behind a timeout does (minus the wait).
#[derive(Clone, Copy)]
struct TimesOut;

impl Service<u64> for TimesOut {
    type Response = u64;
    type Error = io::Error;
    type Future = Ready<Result<u64, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: u64) -> Self::Future {
        ready(Err(io::ErrorKind::TimedOut.into()))
    }
}

/// Endpoints as the balancer receives them: through the layer's adaptor, so they are tracked and
/// may ask for evidence.
fn tracked<S: Service<u64> + Clone>(
    service: S,
) -> OutlierEndpoint<S, tower_outlier::NetworkErrors> {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().expect("valid preset"),
    ))
    .clock(Clock::tsc());
    let mut adaptor = layer.layer(ServiceList::new(vec![service.clone(), service]));
    match futures::executor::block_on(adaptor.next()) {
        Some(Ok(Change::Insert(_, endpoint))) => endpoint,
        _ => unreachable!("a service list yields its services"),
    }
}

fn call<S: Service<u64>>(service: &mut S, i: u64) {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let _ = black_box(service.poll_ready(&mut cx));
    let future = pin!(service.call(black_box(i)));
    let _ = black_box(future.poll(&mut cx));
}

fn reads<L: Load>(service: &L) -> f64
where
    L::Metric: std::fmt::Debug,
{
    let start = Instant::now();
    for _ in 0..ITERATIONS {
        black_box(service.load());
    }
    ns_per_call(start.elapsed(), ITERATIONS)
}

/// ns per completed call on one thread, while another thread reads the load of a second handle of
/// the same endpoint (`with_reader`) or idles.
fn completions_beside_reads<S>(
    endpoint: &OutlierEndpoint<S, tower_outlier::NetworkErrors>,
    with_reader: bool,
) -> f64
where
    S: Service<u64> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let reader = with_reader.then(|| {
        let handle = endpoint.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1000 {
                    black_box(handle.load());
                }
            }
        })
    });
    let mut caller = endpoint.clone();
    let start = Instant::now();
    for i in 0..CALLS {
        call(&mut caller, i);
    }
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    if let Some(reader) = reader {
        reader.join().expect("reader thread");
    }
    ns_per_call(elapsed, CALLS)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();

    let peak_ewma = PeakEwma::new(
        Echo,
        Duration::from_millis(10),
        Duration::from_secs(10).as_nanos() as f64,
        CompleteOnResponse::default(),
    );
    let mut healthy = tracked(Echo);
    call(&mut healthy, 0);
    // Three timeouts of the ten calls HSF needs: its load asks for seven more.
    let mut suspect = tracked(TimesOut);
    for i in 0..3 {
        call(&mut suspect, i);
    }
    assert_eq!(
        suspect.load().value(),
        0.0,
        "the suspect endpoint asks for evidence"
    );

    let (mut tower_ns, mut healthy_ns, mut suspect_ns) = (Vec::new(), Vec::new(), Vec::new());
    let (mut alone_ns, mut beside_ns) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        tower_ns.push(reads(&peak_ewma));
        healthy_ns.push(reads(&healthy));
        suspect_ns.push(reads(&suspect));
        alone_ns.push(completions_beside_reads(&healthy, false));
        beside_ns.push(completions_beside_reads(&healthy, true));
    }
    println!("Load::load, {ITERATIONS} reads, median of {RUNS} interleaved runs (ns/read)");
    println!(
        "tower PeakEwma                       {:8.2}",
        median(tower_ns.clone())
    );
    println!(
        "OutlierEndpoint, last call succeeded {:8.2}   ({:.2}x tower)",
        median(healthy_ns.clone()),
        median(healthy_ns) / median(tower_ns.clone())
    );
    println!(
        "OutlierEndpoint, asking for evidence {:8.2}   ({:.2}x tower)",
        median(suspect_ns.clone()),
        median(suspect_ns) / median(tower_ns)
    );
    println!();
    println!("Completed calls on one core, {CALLS} calls, median of {RUNS} runs (ns/call)");
    let alone = median(alone_ns);
    let beside = median(beside_ns);
    println!("another core idle                    {alone:8.2}");
    println!(
        "another core reading its load        {beside:8.2}   ({:.2}x)",
        beside / alone
    );
}
