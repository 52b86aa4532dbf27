//! A gray endpoint that passes its health checks, under `DetectorConfig::recommended()` with an
//! active probe: the probe lets it back in after each back-off, and only its callers see it
//! fail. The success-rate trigger's window is kept across its returns
//! (`recent_window_kept_on_return`), so each return costs one failed call, not a fresh judgement
//! on new ones; a healed endpoint's successes lift the window, and one failure after them does
//! not eject it. An ejection within 10 s of a return continues the back-off
//! (`relapse_window`): 1, 2, 4, then 5 s, not 1 s each time.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::poll_fn;
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;
use tower::{BoxError, Layer, Service};
use tower_outlier::probe::{probe_fn, ProbeFuture};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, Monitor, OutlierDetectionLayer, RulesHandle,
};

fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get_key(&key).unwrap().status
}

/// Endpoint #0's behaviour, shared with the test.
#[derive(Default)]
struct Zero {
    /// Failing calls 1, 4 and 7 of every 10 (never two in a row); healthy when false.
    gray: AtomicBool,
    /// Calls #0 received.
    calls: AtomicUsize,
    /// Calls #0 failed.
    failed: AtomicUsize,
    /// Fail #0's call of this number once, if set (healthy or not).
    fail_call: AtomicUsize,
}

/// Five endpoints answering in 1 ms through p2c, `config` with a probe that always passes, as a
/// health check of a gray server does; the layer's monitor and rules handle.
fn fleet(
    zero: &Arc<Zero>,
    config: DetectorConfig,
) -> (
    impl Service<(), Error = BoxError, Future = impl Send> + Send,
    Monitor,
    RulesHandle,
) {
    let services: Vec<_> = (0..5usize)
        .map(|key| {
            let zero = zero.clone();
            tower::service_fn(move |()| {
                let fails = key == 0 && {
                    let n = zero.calls.fetch_add(1, Ordering::SeqCst);
                    let gray = zero.gray.load(Ordering::SeqCst) && matches!(n % 10, 0 | 3 | 6);
                    let once = zero.fail_call.load(Ordering::SeqCst) == n + 1;
                    if gray || once {
                        zero.failed.fetch_add(1, Ordering::SeqCst);
                    }
                    gray || once
                };
                async move {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    if fails {
                        Err::<(), BoxError>("replica broken".into())
                    } else {
                        Ok(())
                    }
                }
            })
        })
        .collect();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::seeded(config, 5)).probe(probe_fn(
        |_: &usize, _service| Box::pin(async { true }) as ProbeFuture,
    ));
    let (monitor, rules) = (layer.monitor(), layer.rules());
    (
        Balance::new(layer.layer(ServiceList::new(services))),
        monitor,
        rules,
    )
}

/// One call, then 4 ms of quiet: serial traffic at about 200 calls a second.
async fn one_call<B: Service<(), Error = BoxError>>(balancer: &mut B) {
    poll_fn(|cx| balancer.poll_ready(cx)).await.unwrap();
    let _ = balancer.call(()).await;
    tokio::time::sleep(Duration::from_millis(4)).await;
}

/// Failed calls at #0 between each of its returns and its next ejection, over 30 s of serial
/// traffic with #0 gray throughout (the first ejection's own failures apart).
async fn failures_per_return(kept: bool) -> Vec<usize> {
    let zero = Arc::new(Zero::default());
    zero.gray.store(true, Ordering::SeqCst);
    let config = DetectorConfig::recommended()
        .recent_window_kept_on_return(kept)
        .build()
        .unwrap();
    let (mut balancer, monitor, _) = fleet(&zero, config);
    let start = tokio::time::Instant::now();
    let mut was = EndpointStatus::Available;
    let mut returned_with: Option<usize> = None;
    let mut per_return = Vec::new();
    let mut ejected_once = false;
    while start.elapsed() < Duration::from_secs(30) {
        one_call(&mut balancer).await;
        let now = status(&monitor, 0);
        let failed = zero.failed.load(Ordering::SeqCst);
        if now == EndpointStatus::Ejected && was != EndpointStatus::Ejected {
            if let Some(at_return) = returned_with.take() {
                per_return.push(failed - at_return);
            }
            ejected_once = true;
        }
        if ejected_once && now == EndpointStatus::Available && was != EndpointStatus::Available {
            returned_with = Some(failed);
        }
        was = now;
    }
    per_return
}

#[tokio::test(start_paused = true)]
async fn a_gray_endpoint_that_passes_its_checks_costs_one_failure_per_return() {
    let per_return = failures_per_return(true).await;
    assert!(
        per_return.len() >= 3,
        "returned and ejected again {} times in 30 s: {per_return:?}",
        per_return.len()
    );
    assert!(
        per_return.iter().all(|&failed| failed == 1),
        "failed calls between each return and the next ejection: {per_return:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn with_the_window_emptied_on_return_each_return_costs_more() {
    // linkerd's own behaviour, the option off: the contrast that shows what keeping it buys.
    let per_return = failures_per_return(false).await;
    assert!(
        per_return.iter().any(|&failed| failed > 1),
        "failed calls between each return and the next ejection: {per_return:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_healed_endpoint_is_not_ejected_again_by_one_failure_after_its_return() {
    let zero = Arc::new(Zero::default());
    zero.gray.store(true, Ordering::SeqCst);
    let (mut balancer, monitor, _) = fleet(&zero, DetectorConfig::recommended().build().unwrap());
    let start = tokio::time::Instant::now();
    // The endpoints are discovered at the first call.
    one_call(&mut balancer).await;
    while status(&monitor, 0) != EndpointStatus::Ejected {
        one_call(&mut balancer).await;
        assert!(start.elapsed() < Duration::from_secs(30), "never ejected");
    }
    // Healed while out: the probe lets it back in.
    zero.gray.store(false, Ordering::SeqCst);
    while status(&monitor, 0) != EndpointStatus::Available {
        one_call(&mut balancer).await;
        assert!(start.elapsed() < Duration::from_secs(40), "never back");
    }
    // Its 20th call after the return fails, once.
    let back_at = zero.calls.load(Ordering::SeqCst);
    let failed_before = zero.failed.load(Ordering::SeqCst);
    zero.fail_call.store(back_at + 20, Ordering::SeqCst);
    while zero.calls.load(Ordering::SeqCst) < back_at + 40 {
        one_call(&mut balancer).await;
        assert_eq!(
            status(&monitor, 0),
            EndpointStatus::Available,
            "ejected again: {} calls since its return",
            zero.calls.load(Ordering::SeqCst) - back_at
        );
        assert!(start.elapsed() < Duration::from_secs(60), "no traffic back");
    }
    assert_eq!(
        zero.failed.load(Ordering::SeqCst) - failed_before,
        1,
        "the one failure after its return"
    );
}

/// How long #0 stayed out each time it was ejected over `span` of serial traffic, as `gray` says
/// at each instant (seconds since the start), under `config`.
async fn times_out(
    config: DetectorConfig,
    span: Duration,
    gray: impl Fn(f64) -> bool,
) -> Vec<(f64, Duration)> {
    let zero = Arc::new(Zero::default());
    let (mut balancer, monitor, _) = fleet(&zero, config);
    let start = tokio::time::Instant::now();
    let mut out_since = None;
    let mut out = Vec::new();
    while start.elapsed() < span {
        zero.gray
            .store(gray(start.elapsed().as_secs_f64()), Ordering::SeqCst);
        one_call(&mut balancer).await;
        let ejected = status(&monitor, 0) == EndpointStatus::Ejected;
        match (ejected, out_since) {
            (true, None) => out_since = Some(tokio::time::Instant::now()),
            (false, Some(since)) => {
                out.push((
                    (since - start).as_secs_f64(),
                    tokio::time::Instant::now() - since,
                ));
                out_since = None;
            }
            _ => {}
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_gray_endpoint_that_relapses_is_held_out_longer_each_time() {
    let recommended = DetectorConfig::recommended().build().unwrap();
    let out = times_out(recommended, Duration::from_secs(30), |_| true).await;
    let lengths: Vec<f64> = out.iter().map(|(_, d)| d.as_secs_f64()).collect();
    // 1, 2, 4, then 5 s (the longest), each lengthened by up to half of itself but never past
    // 5 s; a few milliseconds more for the probe and the next call.
    assert!(lengths.len() >= 4, "ejections: {lengths:?}");
    for (n, least) in [1.0, 2.0, 4.0, 5.0].into_iter().enumerate() {
        assert!(
            lengths[n] >= least && lengths[n] < least * 1.5 + 0.1,
            "ejection {n} lasted {:.2} s: {lengths:?}",
            lengths[n]
        );
    }
    // linkerd's own rule: every trip starts again at 1 s once a probe passes.
    let linkerd_like = DetectorConfig::recommended()
        .relapse_window(Duration::ZERO)
        .build()
        .unwrap();
    let out = times_out(linkerd_like, Duration::from_secs(30), |_| true).await;
    assert!(
        out.iter().all(|(_, d)| d.as_secs_f64() < 1.6),
        "without the relapse window: {out:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_in_for_longer_than_the_relapse_window_starts_again_at_the_base() {
    let recommended = DetectorConfig::recommended().build().unwrap();
    // Gray for 12 s, healthy for 15 s, gray again.
    let gray = |at: f64| !(12.0..27.0).contains(&at);
    let out = times_out(recommended, Duration::from_secs(45), gray).await;
    let (first_of_second_episode, length) = out
        .iter()
        .find(|(at, _)| *at >= 27.0)
        .copied()
        .unwrap_or_else(|| panic!("not ejected after 27 s: {out:?}"));
    assert!(
        length.as_secs_f64() < 1.6,
        "ejected at {first_of_second_episode:.1} s for {length:?}: {out:?}"
    );
    assert!(
        out.iter()
            .any(|(at, d)| *at < 12.0 && d.as_secs_f64() >= 4.0),
        "the first episode's back-off never reached 4 s: {out:?}"
    );
}

/// Rules without a relapse window put in while the endpoint is back in after a 4 s ejection:
/// linkerd's rule applies from then on, and its next trip starts at the base again (the count
/// the relapse window kept past the passed probe is not carried into them).
#[tokio::test(start_paused = true)]
async fn new_rules_without_a_relapse_window_start_the_next_trip_at_the_base() {
    let zero = Arc::new(Zero::default());
    zero.gray.store(true, Ordering::SeqCst);
    let (mut balancer, monitor, rules) =
        fleet(&zero, DetectorConfig::recommended().build().unwrap());
    let start = tokio::time::Instant::now();
    let mut out_since = None;
    let mut lengths = Vec::new();
    let mut replaced = false;
    while start.elapsed() < Duration::from_secs(40) {
        one_call(&mut balancer).await;
        let ejected = status(&monitor, 0) == EndpointStatus::Ejected;
        match (ejected, out_since) {
            (true, None) => out_since = Some(tokio::time::Instant::now()),
            (false, Some(since)) => {
                let length = tokio::time::Instant::now() - since;
                out_since = None;
                if replaced {
                    lengths.push(length);
                    break;
                }
                if length >= Duration::from_secs(4) {
                    let linkerd_like = DetectorConfig::recommended()
                        .relapse_window(Duration::ZERO)
                        .build()
                        .unwrap();
                    rules
                        .replace(0, DetectorPolicy::seeded(linkerd_like, 5))
                        .unwrap();
                    replaced = true;
                }
            }
            _ => {}
        }
    }
    assert!(replaced, "never out for 4 s");
    assert!(
        lengths.first().is_some_and(|l| l.as_secs_f64() < 1.6),
        "the first ejection under the new rules: {lengths:?}"
    );
}
