//! What one timer wake-up of the discover adaptor costs as the fleet grows: 10 % of the endpoints
//! ejected with recovery checks 1 ms apart; each measured poll finds one check due and re-admits
//! that endpoint on trial.
//!
//! Run with `cargo bench -p tower-outlier-benches --bench wakeup`. Time is tokio's paused clock
//! (advanced 1 ms between wake-ups); each poll is timed with the wall clock. Fleets of 1 000 and
//! 10 000 endpoints, interleaved, three runs of 100 wake-ups, median ns per wake-up.

#[path = "common.rs"]
#[allow(dead_code)]
mod common;

use common::{median, Echo};

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::Stream;
use tower::discover::Change;
use tower::ServiceExt;
use tower_layer::Layer;
use tower_outlier::classify::classify_fn;
use tower_outlier::classify::{FailureKind, Outcome};
use tower_outlier::policy::Clock;
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
use tower_service::Service;

/// A request that the classifier counts as a failure.
const FAIL: u64 = u64::MAX;
/// Wake-ups measured per fleet: as many as the smaller fleet has ejected endpoints.
const WAKEUPS: usize = 100;
const RUNS: usize = 3;

/// Polls the adaptor until it is pending, applying what it yields to `live`; returns how many
/// changes it yielded.
fn drain<D, E>(adaptor: &mut D, live: &mut HashMap<usize, E>) -> usize
where
    D: Stream<Item = Result<Change<usize, E>, Infallible>> + Unpin,
{
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut yielded = 0;
    while let Poll::Ready(Some(Ok(change))) = Pin::new(&mut *adaptor).poll_next(&mut cx) {
        match change {
            Change::Insert(key, endpoint) => live.insert(key, endpoint),
            Change::Remove(key) => live.remove(&key),
        };
        yielded += 1;
    }
    yielded
}

async fn wakeups(endpoints: usize) -> f64 {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .max_ejection_ratio(0.5)
            .build()
            .expect("valid config"),
    ))
    .clock(Clock::tokio())
    .classifier(classify_fn(
        |result: Result<&u64, &Infallible>| match result {
            Ok(&FAIL) => Outcome::Failure(FailureKind::Transport),
            _ => Outcome::Success,
        },
    ));
    let (changes, discover) = mpsc::unbounded::<Result<Change<usize, Echo>, Infallible>>();
    for key in 0..endpoints {
        changes
            .unbounded_send(Ok(Change::Insert(key, Echo)))
            .expect("the adaptor holds the receiver");
    }
    let mut adaptor = layer.layer(discover);
    let mut live = HashMap::new();
    drain(&mut adaptor, &mut live);
    // Eject every tenth endpoint, 1 ms apart, so their recovery checks come due one at a time.
    for key in (0..endpoints).step_by(10) {
        let mut endpoint = live.get(&key).expect("live").clone();
        for _ in 0..10 {
            let _ = endpoint.ready().await.expect("ready").call(FAIL).await;
        }
        drain(&mut adaptor, &mut live);
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    assert_eq!(
        adaptor.ejected(),
        endpoints / 10,
        "every tenth endpoint is out"
    );
    // HSF's first check is one unit (60 s) after the ejection: the first comes due at 60 s. Stop
    // half a millisecond short, so each 1 ms step below passes exactly one deadline whatever
    // rounding the timer applies.
    let ejections = Duration::from_millis(endpoints as u64 / 10);
    tokio::time::advance(Duration::from_secs(60) - ejections - Duration::from_micros(500)).await;
    let mut times = Vec::with_capacity(WAKEUPS);
    for _ in 0..WAKEUPS {
        tokio::time::advance(Duration::from_millis(1)).await;
        let start = Instant::now();
        let yielded = drain(&mut adaptor, &mut live);
        times.push(start.elapsed().as_nanos() as f64);
        assert_eq!(yielded, 1, "one endpoint re-admitted per wake-up");
    }
    median(times)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        small.push(runtime.block_on(wakeups(1_000)));
        large.push(runtime.block_on(wakeups(10_000)));
    }
    let (small, large) = (median(small), median(large));
    println!("one timer wake-up that re-admits one endpoint, median of {WAKEUPS} × {RUNS} (ns)");
    println!("1 000 endpoints, 100 ejected        {small:10.0}");
    println!(
        "10 000 endpoints, 1 000 ejected     {large:10.0}   ({:.2}x)",
        large / small
    );
}
