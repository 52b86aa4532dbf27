//! The holes the detection benchmark (`benches/detection`) exposed, each pinned by a test on
//! tokio's paused clock:
//!
//! * a latency-driven balancer starved an endpoint after one slow call or a timeout, so it was
//!   never judged (a black hole was never ejected; a healthy endpoint lost its traffic);
//! * a passive trial passed when the endpoint received no calls during it;
//! * a trial that breached while the budget kept the endpoint in counted as a recovery.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::poll_fn;
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;
use tower::timeout::Timeout;
use tower::{BoxError, Layer, Service};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, ErrorRateConfig, ErrorRatePolicy, Monitor,
    OutlierDetectionLayer,
};

use support::{Harness, SeededRng, Sleepy};

fn edas() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud().build().unwrap(),
    ))
}

fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get_key(&key).unwrap().status
}

fn failed_checks(monitor: &Monitor, key: usize) -> u32 {
    monitor.snapshot().get_key(&key).unwrap().failed_checks
}

#[tokio::test(start_paused = true)]
async fn a_passive_trial_without_calls_does_not_pass() {
    let layer = edas();
    let monitor = layer.monitor();
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    h.advance(Duration::from_secs(30)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Trial);

    // A whole trial period with no call at all has shown nothing: the trial goes on.
    h.advance(Duration::from_secs(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Trial);
    // So does one with fewer calls than the minimum (10).
    h.calls(0, 0, 9).await;
    h.advance(Duration::from_secs(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Trial);

    // A relapse in the extended trial is still a failed check: ejected, next check in 2 units.
    h.calls(0, 10, 0).await;
    assert!(!h.is_live(0));
    let snapshot = monitor.snapshot();
    let entry = snapshot.get_key(&0).unwrap();
    assert_eq!(entry.failed_checks, 1);
    assert_eq!(entry.next_check_in, Some(Duration::from_secs(60)));

    // With the minimum of healthy calls in its window, the trial passes.
    h.advance(Duration::from_secs(60)).await;
    assert!(h.is_live(0));
    h.advance(Duration::from_secs(5)).await;
    h.calls(0, 0, 10).await;
    h.advance(Duration::from_secs(5)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    assert_eq!(failed_checks(&monitor, 0), 0);
}

#[tokio::test(start_paused = true)]
async fn a_breached_trial_that_the_budget_kept_in_is_a_failed_check() {
    // Five endpoints at EDAS's 20 %: one may be out at a time.
    let layer = edas();
    let monitor = layer.monitor();
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    h.advance(Duration::from_secs(30)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Trial);

    // #1 takes the budget, then #0 breaches its trial and cannot be ejected.
    h.calls(1, 10, 0).await;
    assert!(!h.is_live(1));
    h.calls(0, 10, 0).await;
    assert!(h.is_live(0), "the budget keeps #0 in");

    // The trial ends while #0 is failing: a failed check, not a recovery.
    h.advance(Duration::from_secs(10)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Trial);
    assert_eq!(failed_checks(&monitor, 0), 1);

    // Still failing in the next trial period: the same check, still failed, not another one.
    // When #1 comes back on trial the budget frees, and #0 goes out two units.
    h.advance(Duration::from_secs(19)).await;
    h.calls(0, 10, 0).await;
    assert!(h.is_live(0), "the budget still keeps #0 in");
    assert_eq!(failed_checks(&monitor, 0), 1);
    h.advance(Duration::from_secs(1)).await;
    assert!(h.is_live(1));
    assert!(!h.is_live(0));
    let snapshot = monitor.snapshot();
    let entry = snapshot.get_key(&0).unwrap();
    assert_eq!(entry.failed_checks, 1);
    assert_eq!(entry.next_check_in, Some(Duration::from_secs(60)));
}

/// Sends `rate` requests a second for `duration` through `balancer`, open loop: each answer is
/// awaited in its own task. Returns the number of failed answers.
async fn open_loop<B>(balancer: &mut B, rate: f64, duration: Duration) -> usize
where
    B: Service<(), Error = BoxError>,
    B::Future: Send + 'static,
{
    let failed = Arc::new(AtomicUsize::new(0));
    let start = tokio::time::Instant::now();
    let total = (rate * duration.as_secs_f64()) as u64;
    let mut answers = tokio::task::JoinSet::new();
    for i in 0..total {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        poll_fn(|cx| balancer.poll_ready(cx)).await.unwrap();
        let answer = balancer.call(());
        let failed = failed.clone();
        answers.spawn(async move {
            if answer.await.is_err() {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        });
        while answers.try_join_next().is_some() {}
    }
    while answers.join_next().await.is_some() {}
    failed.load(Ordering::Relaxed)
}

/// Ten 1 ms endpoints behind the EDAS layer and p2c at 1 000 requests a second: after a second,
/// #0's next calls take `slow` (each entry: a latency in ms and how many calls take it), then
/// 1 ms again. Returns each endpoint's calls in the 20 s after that.
async fn calls_after_slow_calls(slow: &[(u64, usize)]) -> Vec<usize> {
    let backends: Vec<Sleepy> = (0..10).map(|id| Sleepy::new(id, 1)).collect();
    let layer = edas();
    let mut balancer = Balance::from_rng(
        layer.layer(ServiceList::new(backends.clone())),
        SeededRng(11),
    );
    open_loop(&mut balancer, 1000.0, Duration::from_secs(1)).await;
    for &(latency, calls) in slow {
        backends[0].set_latency(latency);
        let before = backends[0].calls();
        while backends[0].calls() < before + calls {
            open_loop(&mut balancer, 1000.0, Duration::from_millis(10)).await;
        }
    }
    backends[0].set_latency(1);
    let start: Vec<usize> = backends.iter().map(Sleepy::calls).collect();
    open_loop(&mut balancer, 1000.0, Duration::from_secs(20)).await;
    backends
        .iter()
        .zip(&start)
        .map(|(b, s)| b.calls() - s)
        .collect()
}

fn assert_half_a_fair_share(got: &[usize]) {
    let fair = got.iter().sum::<usize>() as f64 / got.len() as f64;
    assert!(
        got[0] as f64 >= fair / 2.0,
        "#0 got {} of a fair {fair:.0} ({got:?})",
        got[0]
    );
}

#[tokio::test(start_paused = true)]
async fn one_slow_call_does_not_starve_a_healthy_endpoint() {
    // One call to #0 takes a second; everything else stays at 1 ms.
    assert_half_a_fair_share(&calls_after_slow_calls(&[(1000, 1)]).await);
}

#[tokio::test(start_paused = true)]
async fn one_slow_call_then_a_few_slower_ones_do_not_starve_a_healthy_endpoint() {
    // One call to #0 takes a second, its next three 10 ms (ten times the usual, as a loaded
    // machine's calls may be, but a hundredth of the estimate the slow call left); then 1 ms.
    // Before, the first 10 ms call confirmed the peak: no more exploration, and #0 waited for
    // the estimate to decay from about 900 ms (a minute).
    assert_half_a_fair_share(&calls_after_slow_calls(&[(1000, 1), (10, 3)]).await);
}

#[tokio::test(start_paused = true)]
async fn calls_that_waited_through_one_stall_do_not_starve_a_healthy_endpoint() {
    // Three 1 ms endpoints behind the EDAS layer and p2c, callers sending batches of eight
    // concurrent requests (as the examples do). #0 stalls for 100 ms once: its calls in flight
    // all end together when the stall is over. Before, the second of them confirmed the first's
    // peak: no exploration, and #0 got nothing until its estimate decayed below the others'
    // (about half a minute).
    let backends: Vec<Sleepy> = (0..3).map(|id| Sleepy::new(id, 1)).collect();
    let mut balancer = Balance::from_rng(
        edas().layer(ServiceList::new(backends.clone())),
        SeededRng(5),
    );
    async fn batches<B>(balancer: &mut B, duration: Duration)
    where
        B: Service<(), Error = BoxError>,
    {
        let end = tokio::time::Instant::now() + duration;
        while tokio::time::Instant::now() < end {
            let mut calls = Vec::new();
            for _ in 0..8 {
                poll_fn(|cx| balancer.poll_ready(cx)).await.unwrap();
                calls.push(balancer.call(()));
            }
            futures::future::try_join_all(calls).await.unwrap();
        }
    }
    batches(&mut balancer, Duration::from_secs(1)).await;
    backends[0].stall(Duration::from_millis(100));
    batches(&mut balancer, Duration::from_millis(200)).await;
    let start: Vec<usize> = backends.iter().map(Sleepy::calls).collect();
    batches(&mut balancer, Duration::from_secs(5)).await;
    let got: Vec<usize> = backends
        .iter()
        .zip(&start)
        .map(|(b, s)| b.calls() - s)
        .collect();
    assert_half_a_fair_share(&got);
}

/// Runs five 10 ms endpoints behind a 1 s timeout at 5 requests a second through `balancer`
/// for 10 s, then makes #0 a black hole for a minute; returns the failed requests and the calls
/// the black hole received.
async fn black_hole_at_low_traffic<B>(balancer: &mut B, backends: &[Sleepy]) -> (usize, usize)
where
    B: Service<(), Error = BoxError>,
    B::Future: Send + 'static,
{
    open_loop(balancer, 5.0, Duration::from_secs(10)).await;
    backends[0].set_latency(3_600_000);
    let before = backends[0].calls();
    let failed = open_loop(balancer, 5.0, Duration::from_secs(60)).await;
    (failed, backends[0].calls() - before)
}

#[tokio::test(start_paused = true)]
async fn a_black_hole_costs_callers_no_more_than_p2c_alone_and_is_shown_avoided() {
    use tower::load::{CompleteOnResponse, PeakEwmaDiscover};

    let timed = |backends: &[Sleepy]| {
        backends
            .iter()
            .map(|b| Timeout::new(b.clone(), Duration::from_secs(1)))
            .collect::<Vec<_>>()
    };
    // No detection: PeakEwma and p2c.
    let backends: Vec<Sleepy> = (0..5).map(|id| Sleepy::new(id, 10)).collect();
    let discover = PeakEwmaDiscover::new(
        ServiceList::new(timed(&backends)),
        Duration::from_millis(10),
        Duration::from_secs(10),
        CompleteOnResponse::default(),
    );
    let mut alone = Balance::from_rng(discover, SeededRng(3));
    let (failed_alone, _) = black_hole_at_low_traffic(&mut alone, &backends).await;

    let backends: Vec<Sleepy> = (0..5).map(|id| Sleepy::new(id, 10)).collect();
    let layer = edas();
    let monitor = layer.monitor();
    let mut balancer = Balance::from_rng(
        layer.layer(ServiceList::new(timed(&backends))),
        SeededRng(3),
    );
    let (failed, sent_to_hole) = black_hole_at_low_traffic(&mut balancer, &backends).await;
    // Judging it would take the policy's minimum of 10 calls, each a caller's 1 s timeout: the
    // layer sends it none on purpose, and p2c routes around it as it would alone.
    assert!(
        failed <= failed_alone.max(3),
        "{failed} failed requests, {failed_alone} with p2c alone"
    );
    assert!(
        sent_to_hole <= 3,
        "{sent_to_hole} calls sent to the black hole"
    );
    let snapshot = monitor.snapshot();
    let hole = snapshot.get_key(&0).unwrap();
    assert_eq!(hole.status, EndpointStatus::Available);
    assert!(
        hole.avoided_for
            .is_some_and(|d| d >= Duration::from_secs(1)),
        "shown avoided: {hole:?}"
    );
    assert!(snapshot.get_key(&1).unwrap().avoided_for.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_suspect_endpoint_asks_for_calls_only_while_it_could_be_ejected() {
    use tower::load::Load;

    let layer = edas();
    let mut h = Harness::new(&layer, 5);
    // 3 failures of the 10 calls the policy needs: #1 reports no load until 7 more are in flight.
    h.calls(1, 3, 0).await;
    assert_eq!(h.live[&1].load().value(), 0.0);
    assert!(
        h.live[&2].load().value() > 0.0,
        "a healthy endpoint is not favoured"
    );
    // A success ends the suspicion.
    h.calls(1, 0, 1).await;
    assert!(h.live[&1].load().value() > 0.0);

    // #0 takes the budget (one of five): evidence against #1 could not eject it, so none is sought.
    h.calls(0, 10, 0).await;
    assert!(!h.is_live(0));
    h.advance(Duration::from_secs(11)).await;
    h.calls(1, 3, 0).await;
    assert!(h.live[&1].load().value() > 0.0);

    // #0 comes back on trial and the budget has room again.
    h.advance(Duration::from_secs(19)).await;
    assert!(h.is_live(0));
    h.calls(1, 3, 0).await;
    assert_eq!(h.live[&1].load().value(), 0.0);
}

#[tokio::test(start_paused = true)]
async fn trial_calls_add_up_over_its_periods() {
    let layer = edas();
    let monitor = layer.monitor();
    let mut h = Harness::new(&layer, 5);
    h.calls(0, 10, 0).await;
    h.advance(Duration::from_secs(30)).await;
    // A quiet endpoint: 6 calls in the first trial period, 4 in the second. Neither window holds
    // the minimum of 10, together they do.
    h.advance(Duration::from_secs(2)).await;
    h.calls(0, 0, 6).await;
    h.advance(Duration::from_secs(8)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Trial);
    h.advance(Duration::from_secs(2)).await;
    h.calls(0, 0, 4).await;
    h.advance(Duration::from_secs(8)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_no_adaptor_tracks_asks_for_no_evidence() {
    use tower::load::Load;
    use tower::ServiceExt;

    let layer = edas();
    let backend = support::Backend::new(0);
    backend.set_failing(true);
    let mut endpoint = layer.endpoint(backend);
    for _ in 0..3 {
        let _ = endpoint.ready().await.unwrap().call(()).await;
    }
    // Nothing could eject it, so failing calls are not drawn to it.
    assert!(endpoint.load().value() > 0.0);
}

/// Five 10 ms endpoints behind a 1 s timeout, the recommended configuration with an active
/// probe, open loop at 200 requests a second through p2c: #0 is a black hole from 10 s to 30 s.
/// It is avoided, not ejected (its timeouts never come three in a row), so no recovery check
/// runs; the layer checks it with the probe while it is avoided, and once healed it has half its
/// share (10 % of the calls) back within 5 s. Before, p2c's estimate of it was the timeout, which
/// decays over most of a minute: no call in the 5 s after it healed.
#[tokio::test(start_paused = true)]
async fn a_healed_black_hole_is_back_at_half_its_share_within_5_s() {
    use tower_outlier::probe::request_probe;
    use tower_outlier::{DetectorConfig, DetectorPolicy, NetworkErrors};

    let backends: Vec<Sleepy> = (0..5).map(|id| Sleepy::new(id, 10)).collect();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::recommended().build().unwrap(),
        3,
    ))
    .probe(request_probe(|| (), NetworkErrors));
    let timed: Vec<_> = backends
        .iter()
        .map(|b| Timeout::new(b.clone(), Duration::from_secs(1)))
        .collect();
    let mut balancer = Balance::from_rng(layer.layer(ServiceList::new(timed)), SeededRng(3));
    open_loop(&mut balancer, 200.0, Duration::from_secs(10)).await;
    backends[0].set_latency(3_600_000);
    open_loop(&mut balancer, 200.0, Duration::from_secs(20)).await;
    backends[0].set_latency(10);
    let healed = backends[0].calls();
    let mut per_second = Vec::new();
    for _ in 0..5 {
        let before = backends[0].calls();
        open_loop(&mut balancer, 200.0, Duration::from_secs(1)).await;
        per_second.push(backends[0].calls() - before);
    }
    eprintln!("calls to #0 in each second after it healed: {per_second:?}");
    let snapshot = layer.monitor().snapshot();
    assert!(
        per_second.iter().any(|&calls| calls >= 20),
        "calls to the healed black hole in each of the 5 s after it healed: {per_second:?} \
         ({} in all since)\n{:#?}",
        backends[0].calls() - healed,
        snapshot.get_key(&0)
    );
}

/// A black hole avoided after a timeout is checked by a probe starting every 2 s while it does
/// not answer (HAProxy's `inter`), each check timing out after 1 s: five endpoints behind a 1 s
/// timeout, open loop at 200 requests a second, #0 a black hole from 10 s to 30 s. Before, the
/// 2 s were waited after each check's timeout, so a check started every 3 s (about 7 in the 20
/// s) and a healed endpoint waited up to 3 s for the one that would find it.
#[tokio::test(start_paused = true)]
async fn an_avoided_endpoint_that_does_not_answer_is_checked_every_2_s() {
    use tower_outlier::probe::{probe_fn, ProbeFuture};
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    let backends: Vec<Sleepy> = (0..5).map(|id| Sleepy::new(id, 10)).collect();
    let checks_of_the_hole = Arc::new(AtomicUsize::new(0));
    let counted = checks_of_the_hole.clone();
    let hole = backends[0].clone();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::recommended().build().unwrap(),
        3,
    ))
    .probe(probe_fn(move |key: &usize, _: Timeout<Sleepy>| {
        let (key, counted, hole) = (*key, counted.clone(), hole.clone());
        Box::pin(async move {
            if key != 0 {
                return true;
            }
            counted.fetch_add(1, Ordering::SeqCst);
            // A check answers as a call would: never, while it is a black hole.
            if hole.latency_ms.load(Ordering::SeqCst) > 1_000 {
                std::future::pending::<()>().await;
            }
            true
        }) as ProbeFuture
    }));
    let timed: Vec<_> = backends
        .iter()
        .map(|b| Timeout::new(b.clone(), Duration::from_secs(1)))
        .collect();
    let mut balancer = Balance::from_rng(layer.layer(ServiceList::new(timed)), SeededRng(3));
    open_loop(&mut balancer, 200.0, Duration::from_secs(10)).await;
    backends[0].set_latency(3_600_000);
    open_loop(&mut balancer, 200.0, Duration::from_secs(20)).await;
    let checks = checks_of_the_hole.load(Ordering::SeqCst);
    let hole = layer.monitor().snapshot();
    let hole = hole.get_key(&0).unwrap();
    assert!(hole.avoided_for.is_some(), "avoided, not ejected: {hole:?}");
    // The first 1 s after its first timeout, then one every 2 s: 10 in the 20 s.
    assert!(
        (9..=11).contains(&checks),
        "{checks} checks of the black hole in 20 s"
    );
}

/// When a whole fleet stalls, the checks of its avoided endpoints are rationed: at most a tenth
/// of the endpoints (two at least) are checked at once, so an overloaded fleet is not sent a
/// request per endpoint every 2 s on top of its callers'.
#[tokio::test(start_paused = true)]
async fn the_checks_of_a_stalled_fleet_are_rationed() {
    use std::sync::atomic::AtomicUsize;
    use tower_outlier::probe::{probe_fn, ProbeFuture};
    use tower_outlier::{DetectorConfig, DetectorPolicy};

    struct Checking(Arc<AtomicUsize>);
    impl Drop for Checking {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let now_checking = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let checks = Arc::new(AtomicUsize::new(0));
    let (counting, highest, total) = (now_checking.clone(), most.clone(), checks.clone());
    let backends: Vec<Sleepy> = (0..40).map(|id| Sleepy::new(id, 10)).collect();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::recommended().build().unwrap(),
        3,
    ))
    .probe(probe_fn(move |_: &usize, _: Timeout<Sleepy>| {
        let (counting, highest, total) = (counting.clone(), highest.clone(), total.clone());
        Box::pin(async move {
            let now = counting.fetch_add(1, Ordering::SeqCst) + 1;
            highest.fetch_max(now, Ordering::SeqCst);
            total.fetch_add(1, Ordering::SeqCst);
            let _checking = Checking(counting);
            // The stalled server never answers: the check times out.
            std::future::pending::<()>().await;
            true
        }) as ProbeFuture
    }));
    let timed: Vec<_> = backends
        .iter()
        .map(|b| Timeout::new(b.clone(), Duration::from_secs(1)))
        .collect();
    let mut balancer = Balance::from_rng(layer.layer(ServiceList::new(timed)), SeededRng(3));
    open_loop(&mut balancer, 100.0, Duration::from_secs(5)).await;
    for backend in &backends {
        backend.set_latency(3_600_000);
    }
    open_loop(&mut balancer, 100.0, Duration::from_secs(30)).await;
    let (most, checks) = (most.load(Ordering::SeqCst), checks.load(Ordering::SeqCst));
    // The probe also checks the endpoints the rules ejected (as many as the budget allows):
    // those are rationed by the budget, the avoided ones by the tenth.
    let ejected = layer.monitor().snapshot().ejected();
    eprintln!("{most} probes at once of 40 endpoints, {ejected} of them ejected; {checks} in all");
    assert!(checks > 0, "the avoided endpoints were checked");
    assert!(
        most <= ejected + 4,
        "{most} probes at once of 40 endpoints, {ejected} of them ejected"
    );
}

/// A gray endpoint failing every third call or so (calls 1, 4 and 7 of every 10: never two in a
/// row), serial traffic through p2c over five endpoints: `DetectorConfig::recommended()` ejects
/// it on linkerd's success-rate trigger (under 0.8 over 10 s, on 5 calls or more) after a handful
/// of failures. Without the trigger, three in a row never happen and it stays in, failing.
#[tokio::test(start_paused = true)]
async fn the_recommended_configuration_ejects_a_gray_endpoint_that_never_fails_twice_in_a_row() {
    let failed = Arc::new(AtomicUsize::new(0));
    let services: Vec<_> = (0..5usize)
        .map(|key| {
            let calls = Arc::new(AtomicUsize::new(0));
            let failed = failed.clone();
            tower::service_fn(move |()| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                let fails = key == 0 && matches!(n % 10, 0 | 3 | 6);
                if fails {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
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
    let layer = OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::recommended().build().unwrap(),
        5,
    ));
    let monitor = layer.monitor();
    let mut balancer = Balance::new(layer.layer(ServiceList::new(services)));
    let mut calls = 0;
    loop {
        poll_fn(|cx| balancer.poll_ready(cx)).await.unwrap();
        let _ = balancer.call(()).await;
        tokio::time::sleep(Duration::from_millis(4)).await;
        calls += 1;
        if status(&monitor, 0) == EndpointStatus::Ejected {
            break;
        }
        assert!(
            calls < 2_000,
            "a gray endpoint still in after {calls} calls, {} failed",
            failed.load(Ordering::SeqCst)
        );
    }
    let failed = failed.load(Ordering::SeqCst);
    assert!(failed <= 5, "{failed} failed calls before the ejection");
}

/// Four endpoints answering in 1 ms, serial traffic through p2c, `DetectorConfig::recommended()`
/// with an active probe: #0 fails slowly for 2 s (an error after 100 ms, which takes its latency
/// estimate to a hundred times the others'), is ejected, and is re-admitted by the probe once it
/// heals. Its estimate from the failures would keep p2c away for tens of seconds as it decays;
/// re-admitted, it restarts at the fleet's and has half its share within 2 s.
#[tokio::test(start_paused = true)]
async fn a_readmitted_endpoint_whose_estimate_was_high_from_its_failures_gets_its_share() {
    use std::sync::atomic::AtomicBool;
    use tower_outlier::probe::{probe_fn, ProbeFuture};

    let failing = Arc::new(AtomicBool::new(false));
    let served: Vec<Arc<AtomicUsize>> = (0..4).map(|_| Arc::default()).collect();
    let services: Vec<_> = (0..4usize)
        .map(|key| {
            let (failing, served) = (failing.clone(), served[key].clone());
            tower::service_fn(move |()| {
                let fails = key == 0 && failing.load(Ordering::SeqCst);
                let served = served.clone();
                async move {
                    if fails {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        return Err::<(), BoxError>("503".into());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    served.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
        })
        .collect();
    let healthy = failing.clone();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::recommended().build().unwrap(),
        7,
    ))
    .probe(probe_fn(move |_: &usize, _service| {
        let up = !healthy.load(Ordering::SeqCst);
        Box::pin(async move { up }) as ProbeFuture
    }));
    let monitor = layer.monitor();
    let mut balancer = Balance::new(layer.layer(ServiceList::new(services)));
    async fn serial<B: Service<(), Error = BoxError>>(balancer: &mut B, span: Duration) {
        let until = tokio::time::Instant::now() + span;
        while tokio::time::Instant::now() < until {
            poll_fn(|cx| balancer.poll_ready(cx)).await.unwrap();
            let _ = balancer.call(()).await;
        }
    }
    serial(&mut balancer, Duration::from_secs(2)).await;
    failing.store(true, Ordering::SeqCst);
    serial(&mut balancer, Duration::from_secs(2)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Ejected);
    let estimate = monitor
        .snapshot()
        .get_key(&0usize)
        .unwrap()
        .latency_estimate;
    failing.store(false, Ordering::SeqCst);
    let healed = tokio::time::Instant::now();
    while status(&monitor, 0) != EndpointStatus::Available {
        serial(&mut balancer, Duration::from_millis(10)).await;
        assert!(
            healed.elapsed() < Duration::from_secs(10),
            "never re-admitted"
        );
    }
    let before: Vec<usize> = served.iter().map(|s| s.load(Ordering::SeqCst)).collect();
    serial(&mut balancer, Duration::from_secs(2)).await;
    let got: Vec<usize> = served
        .iter()
        .zip(&before)
        .map(|(s, b)| s.load(Ordering::SeqCst) - b)
        .collect();
    let all: usize = got.iter().sum();
    assert!(
        got[0] * 4 * 2 >= all,
        "less than half its share in the 2 s after its re-admission: {got:?} (its estimate \
         while ejected: {estimate:?})"
    );
}
