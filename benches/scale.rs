//! The layer at 1 000, 10 000 and 100 000 endpoints during an incident: the budget spent (one
//! endpoint ejected), 100 more failing and kept in. Measures what one failing call on a refused
//! endpoint costs the adaptor, what one upstream change (an insert, then its remove) costs, what a
//! monitor snapshot costs, and the adaptor's worst upstream change while another thread takes
//! snapshots without pause.
//!
//! ```sh
//! cargo bench -p tower-outlier-benches --bench scale
//! ```

use std::convert::Infallible;
use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::Stream;
use tower::discover::Change;
use tower_layer::Layer;
use tower_outlier::discover::OutlierEndpoint;
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
use tower_service::Service;

/// An in-memory endpoint that fails while `failing` is set.
#[derive(Clone)]
struct Backend {
    failing: Arc<AtomicBool>,
}

impl Service<()> for Backend {
    type Response = ();
    type Error = std::io::Error;
    type Future = Ready<Result<(), std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        std::future::ready(if self.failing.load(Ordering::Relaxed) {
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        } else {
            Ok(())
        })
    }
}

type Handle = OutlierEndpoint<Backend, tower_outlier::NetworkErrors>;

/// One upstream change, timed: `key` inserted and polled, then removed and polled; half the
/// time taken.
fn change<D>(
    tx: &mpsc::UnboundedSender<Result<Change<usize, Backend>, Infallible>>,
    discover: &mut Pin<Box<D>>,
    handles: &mut Vec<Option<Handle>>,
    key: usize,
    backend: &Backend,
) -> Duration
where
    D: Stream<Item = Result<Change<usize, Handle>, Infallible>>,
{
    let started = Instant::now();
    tx.unbounded_send(Ok(Change::Insert(key, backend.clone())))
        .expect("open");
    drain(discover, handles);
    tx.unbounded_send(Ok(Change::Remove(key))).expect("open");
    drain(discover, handles);
    started.elapsed() / 2
}

/// Polls the adaptor until it has nothing more to say, keeping the handles it inserts.
fn drain<D>(discover: &mut Pin<Box<D>>, handles: &mut Vec<Option<Handle>>)
where
    D: Stream<Item = Result<Change<usize, Handle>, Infallible>>,
{
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    while let Poll::Ready(Some(Ok(change))) = discover.as_mut().poll_next(&mut cx) {
        match change {
            Change::Insert(key, handle) => {
                if handles.len() <= key {
                    handles.resize_with(key + 1, || None);
                }
                handles[key] = Some(handle);
            }
            Change::Remove(key) => {
                if let Some(slot) = handles.get_mut(key) {
                    *slot = None;
                }
            }
        }
    }
}

fn fail_once(handle: &mut Handle) {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let _ = handle.poll_ready(&mut cx);
    let mut call = std::pin::pin!(handle.call(()));
    let _ = call.as_mut().poll(&mut cx);
}

fn percentile(mut samples: Vec<Duration>, p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p) as usize]
}

fn run(n: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let _guard = runtime.enter();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended()
            .max_ejection_percent(0)
            .build()
            .expect("valid"),
    ));
    let monitor = layer.monitor();
    // A listener, as metrics or an event log attach one: events are then built and emitted on
    // the adaptor's path (through the registry's lock).
    let _listening = monitor.on_event(|event| {
        std::hint::black_box(event);
    });
    let (tx, rx) = mpsc::unbounded::<Result<Change<usize, Backend>, Infallible>>();
    let backends: Vec<Backend> = (0..n)
        .map(|_| Backend {
            failing: Arc::new(AtomicBool::new(false)),
        })
        .collect();
    for (key, backend) in backends.iter().enumerate() {
        tx.unbounded_send(Ok(Change::Insert(key, backend.clone())))
            .expect("open");
    }
    let mut discover = Box::pin(layer.layer(rx));
    let mut handles = Vec::new();
    drain(&mut discover, &mut handles);
    // The incident: #0 is ejected (the budget of one, always-one), 100 more fail and are kept in.
    for key in 0..=100 {
        backends[key].failing.store(true, Ordering::Relaxed);
        for _ in 0..3 {
            if let Some(handle) = handles[key].as_mut() {
                fail_once(handle);
            }
            drain(&mut discover, &mut handles);
        }
    }
    let refused = monitor
        .snapshot()
        .endpoints
        .iter()
        .filter(|e| e.refused.is_some())
        .count();
    assert!(refused >= 90, "{refused} refused");

    // One failing call on a refused endpoint, and the adaptor's poll that follows.
    let mut per_call = Vec::new();
    for round in 0..2_000 {
        let key = 1 + round % 100;
        let started = Instant::now();
        if let Some(handle) = handles[key].as_mut() {
            fail_once(handle);
        }
        drain(&mut discover, &mut handles);
        per_call.push(started.elapsed());
    }
    // One upstream change: a new endpoint inserted, polled, removed, polled.
    let mut per_change = Vec::new();
    for round in 0..200 {
        per_change.push(change(
            &tx,
            &mut discover,
            &mut handles,
            n + round,
            &backends[0],
        ));
    }
    // Snapshots, alone, then on another thread without pause while the adaptor takes changes.
    let mut per_snapshot = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let snapshot = monitor.snapshot();
        per_snapshot.push(started.elapsed());
        assert_eq!(snapshot.endpoints.len(), n);
    }
    // The same changes while another thread takes snapshots without pause, and, as the noise
    // floor of this machine, while another thread only spins (no lock, no snapshot).
    let mut round = 0;
    let snapshots_taken = Arc::new(AtomicUsize::new(0));
    let while_scraped = changes_while(
        &tx,
        &mut discover,
        &mut handles,
        n,
        &mut round,
        &backends[0],
        {
            let (monitor, taken) = (monitor.clone(), snapshots_taken.clone());
            move || {
                let _ = monitor.snapshot();
                taken.fetch_add(1, Ordering::Relaxed);
            }
        },
    );
    let snapshots = snapshots_taken.load(Ordering::Relaxed);
    let while_spun = changes_while(
        &tx,
        &mut discover,
        &mut handles,
        n,
        &mut round,
        &backends[0],
        || {
            std::hint::black_box(
                (0..10_000u64).fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(b)),
            );
        },
    );
    let spun_worst = *while_spun.iter().max().expect("a change");
    let worst = *while_scraped.iter().max().expect("a change");
    println!(
        "| {n} | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} ms | {:.2} ms ({} snapshots, {} changes) | {:.2} ms |",
        mean(&per_call).as_secs_f64() * 1e6,
        percentile(per_call, 0.99).as_secs_f64() * 1e6,
        mean(&per_change).as_secs_f64() * 1e6,
        percentile(per_change, 0.99).as_secs_f64() * 1e6,
        percentile(per_snapshot, 0.5).as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e3,
        snapshots,
        while_scraped.len(),
        spun_worst.as_secs_f64() * 1e3,
    );
    drop(tx);
}

/// Upstream changes for 3 s, 1 ms apart, while another thread runs `background` without pause.
fn changes_while<D>(
    tx: &mpsc::UnboundedSender<Result<Change<usize, Backend>, Infallible>>,
    discover: &mut Pin<Box<D>>,
    handles: &mut Vec<Option<Handle>>,
    n: usize,
    round: &mut usize,
    backend: &Backend,
    mut background: impl FnMut() + Send + 'static,
) -> Vec<Duration>
where
    D: Stream<Item = Result<Change<usize, Handle>, Infallible>>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                background();
            }
        })
    };
    let mut taken = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let key = n + 1_000 + *round;
        *round += 1;
        taken.push(change(tx, discover, handles, key, backend));
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("the background thread");
    taken
}

fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / samples.len() as u32
}

fn main() {
    println!("| endpoints | failing call: mean | p99 | upstream change: mean | p99 | snapshot (median) | worst change while snapshots run | worst change while a thread spins |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in [1_000, 10_000, 100_000] {
        run(n);
    }
}
