//! What the per-call benches (`circuit_breaker.rs`, `endpoint_overhead.rs`, `hot_path.rs`) share:
//! the harness that drives a service on one or more threads, the allocation count, and `failsafe`
//! as a service.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::{Future, Ready};
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use failsafe::failure_policy::FailurePolicy;
use failsafe::futures::CircuitBreaker as _;
use tower_service::Service;

use crate::common::{ns_per_call, Echo};

/// The system allocator, counting the allocations of the current thread while `COUNTING` is on
/// (only in the allocation pass, after the timed runs; during them it costs one relaxed load).
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
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

/// Allocations per call, on this thread, over `calls` calls after `warm_up` uncounted ones.
pub fn allocations_per_call<S: Service<u64>>(mut service: S, warm_up: u64, calls: u64) -> f64 {
    drive(&mut service, warm_up);
    COUNTING.store(true, Ordering::Relaxed);
    let before = allocations();
    drive(&mut service, calls);
    let allocated = allocations() - before;
    COUNTING.store(false, Ordering::Relaxed);
    allocated as f64 / calls as f64
}

/// Makes `iterations` calls; returns the time taken and how many polls returned `Pending`.
#[inline]
pub fn drive<S: Service<u64>>(service: &mut S, iterations: u64) -> (Duration, u64) {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut extra = 0;
    let start = Instant::now();
    for i in 0..iterations {
        while black_box(service.poll_ready(&mut cx)).is_pending() {
            extra += 1;
        }
        let mut future = pin!(service.call(black_box(i)));
        while black_box(future.as_mut().poll(&mut cx)).is_pending() {
            extra += 1;
        }
    }
    (start.elapsed(), extra)
}

/// One run of a case: ns per call and `Pending` polls per call, averaged over the threads.
#[derive(Clone, Copy, Default)]
pub struct Sample {
    pub ns: f64,
    pub pending: f64,
}

/// Runs `make()`'s service on `threads` threads at once (each on its own clone), `iterations`
/// calls per thread.
pub fn run<S, F>(threads: usize, iterations: u64, make: &F) -> Sample
where
    S: Service<u64> + Send + 'static,
    F: Fn() -> S,
{
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let mut service = make();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                drive(&mut service, iterations)
            })
        })
        .collect();
    let mut total = Sample::default();
    for handle in handles {
        let (elapsed, pending) = handle.join().expect("bench thread");
        total.ns += ns_per_call(elapsed, iterations);
        total.pending += pending as f64 / iterations as f64;
    }
    Sample {
        ns: total.ns / threads as f64,
        pending: total.pending / threads as f64,
    }
}

/// `failsafe` has no tower integration: its documented use is `breaker.call(future)`, so this
/// wraps the inner service's response future exactly that way. Clones share the breaker
/// (`StateMachine` is an `Arc`).
pub struct Failsafe<P> {
    pub inner: Echo,
    pub breaker: failsafe::StateMachine<P, ()>,
}

// Not derived: a derive would ask the policy to be `Clone`, which sharing does not need.
impl<P> Clone for Failsafe<P> {
    fn clone(&self) -> Self {
        Failsafe {
            inner: self.inner,
            breaker: self.breaker.clone(),
        }
    }
}

impl<P: FailurePolicy + Send + Sync> Service<u64> for Failsafe<P> {
    type Response = u64;
    type Error = failsafe::Error<Infallible>;
    type Future =
        failsafe::futures::ResponseFuture<Ready<Result<u64, Infallible>>, P, (), failsafe::Any>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(failsafe::Error::Inner)
    }

    #[inline]
    fn call(&mut self, request: u64) -> Self::Future {
        self.breaker.call(self.inner.call(request))
    }
}
