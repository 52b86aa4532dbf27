//! Heap held per endpoint, with 10 000 endpoints: through the layer's adaptor (each endpoint's
//! record, policy states, monitor entry and the adaptor's maps, as a balancer holds the changes
//! it yields) against tower's `PeakEwmaDiscover` over the same services. A counting allocator
//! measures what stays allocated once every endpoint is discovered and has answered one call.
//!
//! `cargo bench -p tower-outlier-benches --bench heap_per_endpoint`

#[allow(dead_code)] // Only the service is used here, not the timing helpers.
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::task::{Context, Poll};

use common::Echo;
use futures::Stream;
use tower::discover::Change;
use tower::load::{CompleteOnResponse, PeakEwmaDiscover};
use tower_layer::Layer;
use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
use tower_outlier::weight::{WeightConfig, WeightPolicy};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer,
};
use tower_service::Service;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const ENDPOINTS: usize = 10_000;

type Upstream = futures::stream::Iter<std::vec::IntoIter<Result<Change<usize, Echo>, Infallible>>>;

fn upstream() -> Upstream {
    let changes: Vec<_> = (0..ENDPOINTS)
        .map(|key| Ok(Change::Insert(key, Echo)))
        .collect();
    futures::stream::iter(changes)
}

/// Drains `discover` the way a balancer does, keeping every change (and so every endpoint), sends
/// one call through each endpoint (what a called endpoint holds, such as its handle's lane, counts
/// too), and returns the bytes per endpoint allocated meanwhile, what it yielded still held.
fn held_per_endpoint<D, S, E>(discover: D) -> f64
where
    D: Stream<Item = Result<Change<usize, S>, E>> + Unpin,
    S: Service<u64>,
    E: std::fmt::Debug,
{
    let before = LIVE.load(Ordering::Relaxed);
    let mut discover = discover;
    let mut held = Vec::with_capacity(ENDPOINTS);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    while let Poll::Ready(Some(change)) = Pin::new(&mut discover).poll_next(&mut cx) {
        held.push(change.expect("discovery does not fail"));
    }
    assert_eq!(held.len(), ENDPOINTS);
    for change in &mut held {
        let Change::Insert(_, endpoint) = change else {
            unreachable!("only inserts are discovered")
        };
        assert!(endpoint.poll_ready(&mut cx).is_ready());
        let mut call = std::pin::pin!(endpoint.call(1));
        assert!(call.as_mut().poll(&mut cx).is_ready());
    }
    // The balancer's own list of what it holds is not the endpoints' cost.
    let list = (held.capacity() * std::mem::size_of_val(&held[0])) as isize;
    let after = LIVE.load(Ordering::Relaxed);
    let per = (after - before - list) as f64 / ENDPOINTS as f64;
    drop(held);
    drop(discover);
    per
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let peak = held_per_endpoint(PeakEwmaDiscover::new(
        upstream(),
        std::time::Duration::from_millis(1),
        std::time::Duration::from_secs(10),
        CompleteOnResponse::default(),
    ));
    let recommended = held_per_endpoint(Layer::layer(
        &OutlierDetectionLayer::new(DetectorPolicy::new(
            DetectorConfig::recommended().build().unwrap(),
        )),
        upstream(),
    ));
    let hsf = held_per_endpoint(Layer::layer(
        &OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::hsf().build().unwrap(),
        )),
        upstream(),
    ));
    let envoy = held_per_endpoint(Layer::layer(
        &OutlierDetectionLayer::new(DetectorPolicy::new(
            DetectorConfig::envoy().build().unwrap(),
        )),
        upstream(),
    ));
    let all = held_per_endpoint(Layer::layer(
        &OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::hsf().build().unwrap(),
        ))
        .with_policy(SlowCallPolicy::new(
            BreakerConfig::slow_ratio(std::time::Duration::from_millis(50))
                .open_duration(std::time::Duration::from_secs(5))
                .build()
                .unwrap(),
        ))
        .with_policy(WeightPolicy::new(WeightConfig::sofarpc().build().unwrap())),
        upstream(),
    ));
    println!("heap held per endpoint, {ENDPOINTS} endpoints discovered (bytes)");
    println!("{:<48} {:>8.0}", "tower PeakEwmaDiscover", peak);
    println!(
        "{:<48} {:>8.0} ({:.1}x)",
        "layer, DetectorConfig::recommended()",
        recommended,
        recommended / peak
    );
    println!(
        "{:<48} {:>8.0} ({:.1}x)",
        "layer, HSF error rate",
        hsf,
        hsf / peak
    );
    println!(
        "{:<48} {:>8.0} ({:.1}x)",
        "layer, Envoy detectors",
        envoy,
        envoy / peak
    );
    println!(
        "{:<48} {:>8.0} ({:.1}x)",
        "layer, error rate + slow-call breaker + weights",
        all,
        all / peak
    );
}
