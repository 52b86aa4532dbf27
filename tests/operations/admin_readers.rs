//! Readers of the admin component never hold up the balancer: 8 threads read `/history`, the
//! page and `/metrics` in a loop at 256 endpoints × 300 ticks while the adaptor, polled as a
//! balancer polls it, applies operator actions that each emit events (and so run the admin's event
//! callback on the adaptor's task). Before the admin kept its timeline and its events under
//! separate locks and built documents from a copy, every such poll waited for a reader building
//! its document under the one lock: as long as a whole `/history` read.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use support::{Backend, Harness};
use tower::ServiceExt;
use tower_outlier::admin::Admin;
use tower_outlier::probe::Probe;
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};

const ENDPOINTS: usize = 256;
const TICKS: usize = 300;

/// The body of `GET path`, called on the component directly: the history and the metrics are
/// ready at once; the page waits for the sampler's copy of the monitor.
async fn read(admin: &Admin, path: &str) -> String {
    let request = http::Request::get(path).body(()).unwrap();
    let response = admin.clone().oneshot(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

async fn ticks(admin: &Admin) -> usize {
    let history: serde_json::Value = serde_json::from_str(&read(admin, "/history").await).unwrap();
    history["ticks"].as_array().map_or(0, Vec::len)
}

/// How long each poll took that applied an operator's action (and so emitted events, running the
/// admin's callback on the adaptor's task): `rounds` force-outs and releases.
async fn polls_emitting_events<P: Probe<usize, Backend> + Clone>(
    h: &mut Harness<P>,
    rules: &tower_outlier::RulesHandle,
    rounds: usize,
) -> Vec<Duration> {
    let mut polls = Vec::new();
    for round in 0..rounds {
        let key = round % ENDPOINTS;
        rules.force_out(&key);
        let started = Instant::now();
        h.sync();
        polls.push(started.elapsed());
        assert!(!h.is_live(key), "round {round}: not forced out");
        rules.release(&key);
        let started = Instant::now();
        h.sync();
        polls.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    polls
}

fn ninetieth(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() * 9 / 10]
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_history_the_page_and_metrics_never_stalls_the_balancer() {
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let rules = layer.rules();
    let mut registry = prometheus_client::registry::Registry::default();
    let _metrics = tower_outlier::metrics::register(&mut registry, &layer.monitor());
    let admin = Admin::builder(&layer.monitor())
        .sample_every(Duration::from_millis(10))
        .keep(Duration::from_millis(10 * TICKS as u64))
        .max_endpoints(ENDPOINTS)
        .metrics(Arc::new(registry))
        .build();
    let mut h = Harness::new(&layer, ENDPOINTS);
    // A full history: 300 ticks of 256 endpoints.
    let filled = Instant::now();
    while ticks(&admin).await < TICKS {
        assert!(
            filled.elapsed() < Duration::from_secs(60),
            "{} ticks after a minute",
            ticks(&admin).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // How long one reader takes to build `/history`, alone.
    let alone = Instant::now();
    let size = read(&admin, "/history").await.len();
    let one_read = alone.elapsed();
    // The same polls with nobody reading, and with 8 threads that only burn the cores the
    // readers would use: what sharing the machine costs a poll, locks aside.
    let quiet = polls_emitting_events(&mut h, &rules, 40).await;
    let stop = Arc::new(AtomicBool::new(false));
    let burners: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let busy = polls_emitting_events(&mut h, &rules, 40).await;
    stop.store(true, Ordering::Relaxed);
    for burner in burners {
        burner.join().unwrap();
    }

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let (admin, stop, reads) = (admin.clone(), stop.clone(), reads.clone());
            let runtime = tokio::runtime::Handle::current();
            std::thread::spawn(move || {
                let path = ["/history", "/", "/metrics", "/history?since=100&limit=50"][i % 4];
                while !stop.load(Ordering::Relaxed) {
                    let _ = runtime.block_on(read(&admin, path));
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // The readers under way.
    while reads.load(Ordering::Relaxed) < 8 {
        tokio::task::yield_now().await;
    }
    let polls = polls_emitting_events(&mut h, &rules, 40).await;
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().unwrap();
    }
    let (typical, p90, worst) = (
        median(polls.clone()),
        ninetieth(polls.clone()),
        *polls.iter().max().unwrap(),
    );
    let (alone, alone_p90, alone_worst) = (
        median(quiet.clone()),
        ninetieth(quiet.clone()),
        *quiet.iter().max().unwrap(),
    );
    let (busy_median, busy_p90, busy_worst) = (
        median(busy.clone()),
        ninetieth(busy.clone()),
        *busy.iter().max().unwrap(),
    );
    eprintln!(
        "/history: {size} bytes in {one_read:?}; a poll that emits events, median / p90 / worst: \
         nobody reading {alone:?} / {alone_p90:?} / {alone_worst:?}; 8 threads burning the \
         cores {busy_median:?} / {busy_p90:?} / {busy_worst:?}; 8 readers reading {typical:?} / \
         {p90:?} / {worst:?} ({} reads)",
        reads.load(Ordering::Relaxed)
    );
    // Within a millisecond of the same poll with nobody reading (the readers' threads share the
    // machine's cores with it, so not to the microsecond).
    assert!(
        typical <= alone + Duration::from_millis(1),
        "median poll {typical:?} while reading against {alone:?} alone"
    );
    // Building `/history` is what a poll used to wait for; now a poll waits for no reader.
    assert!(
        typical < one_read / 10,
        "median poll {typical:?} against one /history read of {one_read:?}"
    );
}
