//! Recording an outcome allocates nothing: calls through an `OutlierEndpoint`, successes and failures,
//! under a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tower::Service;
use tower_outlier::policy::Clock;
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Only the test's own thread counts: the test harness's threads may allocate meanwhile.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn counting(on: bool) {
    COUNTING.with(|c| c.set(on));
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        }
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Clone)]
struct Flaky;

impl Service<u64> for Flaky {
    type Response = u64;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<u64, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u64) -> Self::Future {
        std::future::ready(if request.is_multiple_of(3) {
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
        } else {
            Ok(request)
        })
    }
}

fn run(clock: Clock) {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().min_calls(1_000_000).build().unwrap(),
    ))
    .clock(clock);
    let mut endpoint = layer.endpoint(Flaky);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    // Warm up: the first calls may touch lazily initialised statics (clock calibration).
    for i in 0..100 {
        let _ = endpoint.poll_ready(&mut cx);
        let _ = pin!(endpoint.call(i)).poll(&mut cx);
    }
    counting(true);
    for i in 0..100_000 {
        let _ = endpoint.poll_ready(&mut cx);
        let _ = pin!(endpoint.call(i)).poll(&mut cx);
        // A dropped future (cancelled) too.
        drop(endpoint.call(i));
    }
    counting(false);
    let record = endpoint.record();
    let counts = record.policies()[0].describe(record.clock().now()).counts;
    assert!(
        counts.calls > 0 && counts.failures > 0,
        "the calls were recorded"
    );
}

#[test]
fn recording_allocates_nothing() {
    run(Clock::tsc());
    run(Clock::tokio());
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0);
}
