//! How judging and the balancer interact (`tower_outlier::rules`, section 7), through a real
//! `tower::balance::p2c::Balance` on tokio's paused clock: an endpoint whose calls fail is judged
//! or shown avoided, never left in and unjudged; a fast-failing endpoint is never the balancer's
//! cheapest pick; a healed endpoint gets its share back; a small fleet is protected, or told why
//! not; a slow endpoint gets no more traffic than p2c alone gives it.

use crate::support;

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use support::SeededRng;
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PeakEwmaDiscover};
use tower::{BoxError, Layer, Service};
use tower_outlier::probe::{probe_fn, ProbeFuture};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, ErrorRateConfig, ErrorRatePolicy, Monitor,
    OutlierDetectionLayer, ServerErrors,
};

/// An HTTP backend on tokio's clock: its first call takes `setup` longer (a connection's TCP and
/// HTTP/2 handshake), every call `latency`; it answers 200, or 503 while `unavailable` is set.
#[derive(Clone)]
struct Backend {
    setup: Duration,
    latency: Duration,
    unavailable: Arc<AtomicBool>,
    connected: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Backend {
    fn new(latency: Duration) -> Self {
        Backend {
            setup: Duration::from_millis(40),
            latency,
            unavailable: Arc::new(AtomicBool::new(false)),
            connected: Arc::new(AtomicBool::new(false)),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn set_unavailable(&self, unavailable: bool) {
        self.unavailable.store(unavailable, Ordering::SeqCst);
    }
}

impl Service<()> for Backend {
    type Response = http::Response<()>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<http::Response<()>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let setup = if self.connected.swap(true, Ordering::SeqCst) {
            Duration::ZERO
        } else {
            self.setup
        };
        let latency = self.latency;
        let unavailable = self.unavailable.load(Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(setup + latency).await;
            let status = if unavailable { 503 } else { 200 };
            Ok(http::Response::builder().status(status).body(()).unwrap())
        })
    }
}

fn fleet(n: usize) -> Vec<Backend> {
    (0..n)
        .map(|_| Backend::new(Duration::from_micros(100)))
        .collect()
}

fn recommended() -> OutlierDetectionLayer<ServerErrors> {
    OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(ServerErrors)
}

/// Sends `n` requests one after another through `balancer`; how many got a good answer.
async fn serial<B>(balancer: &mut B, n: usize) -> usize
where
    B: Service<(), Response = http::Response<()>, Error = BoxError>,
{
    let mut good = 0;
    for _ in 0..n {
        poll_fn(|cx| balancer.poll_ready(cx)).await.unwrap();
        if let Ok(response) = balancer.call(()).await {
            good += usize::from(response.status().is_success());
        }
    }
    good
}

/// Sends requests one after another for `duration` of tokio's clock.
async fn serial_for<B>(balancer: &mut B, duration: Duration)
where
    B: Service<(), Response = http::Response<()>, Error = BoxError>,
{
    let end = tokio::time::Instant::now() + duration;
    while tokio::time::Instant::now() < end {
        serial(balancer, 1).await;
    }
}

fn standing(monitor: &Monitor, key: usize) -> tower_outlier::EndpointSnapshot {
    monitor.snapshot().get_key(&key).unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn a_server_answering_503_from_its_first_call_is_ejected_not_starved() {
    // The new user's case: three fresh servers, serial calls, one answering 503 from the first.
    // Every first call carries a 40 ms handshake against 0.1 ms calls. Were that handshake a peak
    // of the estimate, and 503 an overload not to judge, p2c (which never picks the costliest of
    // three) would stop sending the server calls after one, and it would stay in, unjudged.
    for seed in 0..10 {
        for layer in [
            recommended(),
            OutlierDetectionLayer::new(ErrorRatePolicy::new(
                ErrorRateConfig::edas_spring_cloud()
                    .min_calls(5)
                    .max_ejection_ratio(0.5)
                    .build()
                    .unwrap(),
            ))
            .classifier(ServerErrors),
        ] {
            let backends = fleet(3);
            backends[0].set_unavailable(true);
            let monitor = layer.monitor();
            let mut balancer = Balance::from_rng(
                layer.layer(ServiceList::new(backends.clone())),
                SeededRng(seed),
            );
            serial(&mut balancer, 300).await;
            let broken = standing(&monitor, 0);
            assert_eq!(
                broken.status,
                EndpointStatus::Ejected,
                "seed {seed}: {broken:?}"
            );
            assert!(backends[0].calls() <= 5, "seed {seed}: {broken:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_healed_server_has_half_its_share_back_within_ten_seconds() {
    for seed in 0..5 {
        let backends = fleet(3);
        let probe = probe_fn(|_: &usize, mut service: Backend| {
            Box::pin(
                async move { matches!(service.call(()).await, Ok(r) if r.status().is_success()) },
            ) as ProbeFuture
        });
        let layer = recommended().probe(probe);
        let monitor = layer.monitor();
        let mut balancer = Balance::from_rng(
            layer.layer(ServiceList::new(backends.clone())),
            SeededRng(seed),
        );
        serial_for(&mut balancer, Duration::from_secs(2)).await;
        backends[0].set_unavailable(true);
        serial_for(&mut balancer, Duration::from_secs(20)).await;
        assert_eq!(standing(&monitor, 0).status, EndpointStatus::Ejected);
        backends[0].set_unavailable(false);
        let mut back = None;
        for second in 1..=10 {
            let before: Vec<usize> = backends.iter().map(Backend::calls).collect();
            serial_for(&mut balancer, Duration::from_secs(1)).await;
            let got: Vec<usize> = backends
                .iter()
                .zip(&before)
                .map(|(b, before)| b.calls() - before)
                .collect();
            let all: usize = got.iter().sum();
            if got[0] * 3 * 2 >= all {
                back = Some(second);
                break;
            }
        }
        assert!(
            back.is_some(),
            "seed {seed}: no half share within 10 s: {:?}",
            standing(&monitor, 0)
        );
    }
}

/// Sends `rate` requests a second for `duration` through `balancer`, each awaited in its own
/// task.
async fn open_loop<B>(balancer: &mut B, rate: f64, duration: Duration)
where
    B: Service<(), Error = BoxError>,
    B::Future: Send + 'static,
{
    let start = tokio::time::Instant::now();
    let total = (rate * duration.as_secs_f64()) as u64;
    let mut answers = tokio::task::JoinSet::new();
    for i in 0..total {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        poll_fn(|cx| balancer.poll_ready(cx)).await.unwrap();
        let answer = balancer.call(());
        answers.spawn(async move {
            let _ = answer.await;
        });
        while answers.try_join_next().is_some() {}
    }
    while answers.join_next().await.is_some() {}
}

/// A backend failing fast (a refused connection) while `down` is set.
#[derive(Clone)]
struct Refusing {
    down: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Service<()> for Refusing {
    type Response = ();
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<(), BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let down = self.down.load(Ordering::SeqCst);
        Box::pin(async move {
            if down {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_fast_failing_endpoint_is_never_the_cheapest_pick_of_a_policy_that_judges_on_a_tick() {
    // gRPC's preset judges success rates every 10 s. Until then, a server refusing connections
    // answers faster than any healthy one: p2c alone would favour it (a third of the traffic of
    // five endpoints and more), round robin gives it a fifth. The layer neither pulls calls to it
    // (the tick cannot use them) nor lets its fast failures lower its cost.
    let services: Vec<Refusing> = (0..5)
        .map(|_| Refusing {
            down: Arc::new(AtomicBool::new(false)),
            calls: Arc::new(AtomicUsize::new(0)),
        })
        .collect();
    let layer =
        OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::grpc().build().unwrap()));
    let mut balancer = Balance::from_rng(
        layer.layer(ServiceList::new(services.clone())),
        SeededRng(5),
    );
    open_loop(&mut balancer, 200.0, Duration::from_secs(5)).await;
    services[0].down.store(true, Ordering::SeqCst);
    let before: Vec<usize> = services
        .iter()
        .map(|s| s.calls.load(Ordering::SeqCst))
        .collect();
    // Up to just before the next tick.
    open_loop(&mut balancer, 200.0, Duration::from_millis(4_900)).await;
    let got: Vec<usize> = services
        .iter()
        .zip(&before)
        .map(|(s, b)| s.calls.load(Ordering::SeqCst) - b)
        .collect();
    let all: usize = got.iter().sum();
    assert!(
        got[0] * 20 <= all,
        "the refusing endpoint got {} of {all} calls: {got:?}",
        got[0]
    );
}

/// The same fast-failing endpoint under gRPC's preset is ejected on a tick, as grpc-go's own
/// end-to-end test expects: the balancer starved it (a handful of calls, every one failed,
/// where round robin would have sent it a fifth of the traffic), so the success-rate detector
/// judges it as if it had carried its request volume at the rate it failed, once it has been in
/// rotation for a whole interval. Before, it never reached the volume and stayed in, avoided and
/// unjudged. One that joins late in an interval and fails its first calls (a cold connection)
/// is not judged so on that interval: its system would not have given it the volume either.
#[tokio::test(start_paused = true)]
async fn a_fast_failing_endpoint_is_ejected_on_the_tick_of_a_policy_that_judges_on_a_tick() {
    let services: Vec<Refusing> = (0..5)
        .map(|_| Refusing {
            down: Arc::new(AtomicBool::new(false)),
            calls: Arc::new(AtomicUsize::new(0)),
        })
        .collect();
    let layer =
        OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::grpc().build().unwrap()));
    let monitor = layer.monitor();
    let mut balancer = Balance::from_rng(
        layer.layer(ServiceList::new(services.clone())),
        SeededRng(5),
    );
    // Refusing from its first call (a server that never came up), under serial traffic: after
    // its first failure it is seldom the cheaper of a pair. Through the second tick: on the
    // first an endpoint has not been seen in rotation for a whole interval (it may have joined
    // a moment before), so it is judged on what it had.
    services[0].down.store(true, Ordering::SeqCst);
    let end = tokio::time::Instant::now() + Duration::from_millis(20_500);
    while tokio::time::Instant::now() < end {
        poll_fn(|cx| balancer.poll_ready(cx)).await.unwrap();
        let _ = balancer.call(()).await;
    }
    let refused = services[0].calls.load(Ordering::SeqCst);
    let zero = standing(&monitor, 0);
    assert_eq!(
        zero.status,
        EndpointStatus::Ejected,
        "after {refused} refused calls: {zero:#?}"
    );
    // Fewer than the detector's request volume of 100 in each interval.
    assert!(refused < 100, "{refused} calls refused");
    // The healthy ones were not judged for it.
    for key in 1..5 {
        assert_eq!(standing(&monitor, key).status, EndpointStatus::Available);
    }
}

/// A server that joins late in an interval and refuses its first two calls (a cold connection),
/// then serves: gRPC's preset does not eject it on the next tick. Its two calls are all it had,
/// both failed, and p2c then routed around it, but it was not in rotation for the interval.
#[tokio::test(start_paused = true)]
async fn a_late_joiner_whose_first_calls_fail_is_not_ejected_on_the_next_tick() {
    #[derive(Clone)]
    struct Cold {
        refusals_left: Arc<AtomicUsize>,
        calls: Arc<AtomicUsize>,
    }
    impl Service<()> for Cold {
        type Response = ();
        type Error = BoxError;
        type Future = BoxFuture<'static, Result<(), BoxError>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: ()) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let refuse = self
                .refusals_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            Box::pin(async move {
                if refuse {
                    return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(())
            })
        }
    }
    let cold = |refusals| Cold {
        refusals_left: Arc::new(AtomicUsize::new(refusals)),
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let layer =
        OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::grpc().build().unwrap()));
    let monitor = layer.monitor();
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for key in 0..5usize {
        tx.unbounded_send(Ok::<_, std::convert::Infallible>(
            tower::discover::Change::Insert(key, cold(0)),
        ))
        .unwrap();
    }
    let mut balancer = Balance::from_rng(layer.layer(rx), SeededRng(5));
    open_loop(&mut balancer, 200.0, Duration::from_secs(19)).await;
    let joiner = cold(2);
    tx.unbounded_send(Ok(tower::discover::Change::Insert(5, joiner.clone())))
        .unwrap();
    open_loop(&mut balancer, 200.0, Duration::from_secs(3)).await;
    let joined = standing(&monitor, 5);
    assert_eq!(
        joined.status,
        EndpointStatus::Available,
        "after {} calls: {joined:#?}",
        joiner.calls.load(Ordering::SeqCst)
    );
}

#[tokio::test(start_paused = true)]
async fn three_endpoints_one_failing_the_recommended_budget_ejects_edas_says_why_not() {
    let backends = fleet(3);
    backends[1].set_unavailable(true);
    let layer = recommended();
    let monitor = layer.monitor();
    let mut balancer = Balance::from_rng(
        layer.layer(ServiceList::new(backends.clone())),
        SeededRng(1),
    );
    serial(&mut balancer, 100).await;
    assert_eq!(standing(&monitor, 1).status, EndpointStatus::Ejected);

    // EDAS keeps its system's rule: 20 % of three endpoints rounds down to no ejection at all.
    let backends = fleet(3);
    backends[1].set_unavailable(true);
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud()
            .min_calls(5)
            .build()
            .unwrap(),
    ))
    .classifier(ServerErrors);
    let monitor = layer.monitor();
    let mut balancer = Balance::from_rng(
        layer.layer(ServiceList::new(backends.clone())),
        SeededRng(1),
    );
    serial(&mut balancer, 100).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let snapshot = monitor.snapshot();
    assert_eq!(
        snapshot.no_ejection.as_deref(),
        Some("ejection budget of 0 for 3 endpoints at 20 %")
    );
    // The failing endpoint is neither judged (nothing could act on it, so no call is sent to it
    // on purpose) nor shown as healthy: the balancer avoids it, and the snapshot says so.
    let broken = snapshot.get_key(&1).unwrap();
    assert_eq!(broken.status, EndpointStatus::Available);
    assert!(broken.avoided_for.is_some(), "{broken:?}");
}

/// A backend whose every call takes `latency` on tokio's clock, with a call counter.
#[derive(Clone)]
struct Fixed {
    latency: Arc<std::sync::atomic::AtomicU64>,
    calls: Arc<AtomicUsize>,
}

impl Service<()> for Fixed {
    type Response = ();
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<(), BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let latency = Duration::from_micros(self.latency.load(Ordering::SeqCst));
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            Ok(())
        })
    }
}

fn fixed(n: usize) -> Vec<Fixed> {
    (0..n)
        .map(|_| Fixed {
            latency: Arc::new(std::sync::atomic::AtomicU64::new(1_000)),
            calls: Arc::new(AtomicUsize::new(0)),
        })
        .collect()
}

/// The calls the slow endpoint #0 gets over 60 s at 200 requests a second after it turns ten
/// times slower.
async fn slow_share<B>(balancer: &mut B, services: &[Fixed]) -> usize
where
    B: Service<(), Error = BoxError>,
    B::Future: Send + 'static,
{
    open_loop(balancer, 200.0, Duration::from_secs(10)).await;
    services[0].latency.store(10_000, Ordering::SeqCst);
    let before = services[0].calls.load(Ordering::SeqCst);
    open_loop(balancer, 200.0, Duration::from_secs(60)).await;
    services[0].calls.load(Ordering::SeqCst) - before
}

#[tokio::test(start_paused = true)]
async fn a_slow_endpoint_gets_no_more_traffic_than_p2c_alone_gives_it() {
    let services = fixed(5);
    let discover = PeakEwmaDiscover::new(
        ServiceList::new(services.clone()),
        Duration::from_millis(1),
        Duration::from_secs(10),
        CompleteOnResponse::default(),
    );
    let mut alone = Balance::from_rng(discover, SeededRng(9));
    let alone = slow_share(&mut alone, &services).await;

    let services = fixed(5);
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let mut balancer = Balance::from_rng(
        layer.layer(ServiceList::new(services.clone())),
        SeededRng(9),
    );
    let with_layer = slow_share(&mut balancer, &services).await;
    // Exploration of one slow call stops at the slow endpoint's second slow call: at most one
    // more call each time p2c tries it again on its own. Beside that, its estimate goes stale a
    // second after its last call and it is tried once (half a percent of the calls at 200 a
    // second): at most one call a second of the 60.
    assert!(
        with_layer <= alone * 2 + 2 + 60,
        "the slow endpoint got {with_layer} calls, {alone} with p2c alone"
    );
    assert!(
        with_layer * 100 <= 12_000,
        "the slow endpoint got {with_layer} of 12 000 calls"
    );
}

/// An endpoint ten times slower for 20 s and then healed has half its share back within 2 s, at
/// 200 requests a second: p2c never picks the costliest endpoint, so before, it got no call
/// until its estimate had decayed below its peers' (about 20 s), and came back an eighth of the
/// way per call after that. Now its estimate goes stale a second after its last call, it is
/// tried, and its fast answer replaces the estimate.
#[tokio::test(start_paused = true)]
async fn a_healed_slow_endpoint_has_half_its_share_back_within_two_seconds() {
    for seed in 0..5 {
        let services = fixed(5);
        let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
            DetectorConfig::recommended().build().unwrap(),
        ));
        let mut balancer = Balance::from_rng(
            layer.layer(ServiceList::new(services.clone())),
            SeededRng(seed),
        );
        open_loop(&mut balancer, 200.0, Duration::from_secs(10)).await;
        services[0].latency.store(10_000, Ordering::SeqCst);
        open_loop(&mut balancer, 200.0, Duration::from_secs(20)).await;
        services[0].latency.store(1_000, Ordering::SeqCst);
        let calls = || -> Vec<usize> {
            services
                .iter()
                .map(|s| s.calls.load(Ordering::SeqCst))
                .collect()
        };
        // Quarter seconds after the heal until #0 gets half of a fifth of the calls.
        let mut back_after = None;
        for quarter in 1..=40 {
            let before = calls();
            open_loop(&mut balancer, 200.0, Duration::from_millis(250)).await;
            let after = calls();
            let total: usize = after.iter().zip(&before).map(|(a, b)| a - b).sum();
            if (after[0] - before[0]) * 10 >= total {
                back_after = Some(quarter);
                break;
            }
        }
        assert!(
            back_after.is_some_and(|quarter| quarter <= 8),
            "seed {seed}: half its share back after {back_after:?} quarter seconds"
        );
        // And it keeps it: not one burst of calls while the estimate was low for a moment.
        for quarter in 1..=4 {
            let before = calls();
            open_loop(&mut balancer, 200.0, Duration::from_millis(250)).await;
            let after = calls();
            let total: usize = after.iter().zip(&before).map(|(a, b)| a - b).sum();
            let mine = after[0] - before[0];
            assert!(
                mine * 10 >= total,
                "seed {seed}: {mine} of {total} calls in quarter {quarter} after it was back"
            );
        }
    }
}

/// A server that had served and then fails fast on every call (killed: refused connections) is
/// ejected within a few seconds of serial traffic, and a blip (one failure, then healthy) gets
/// calls again within two seconds: after one fast failure p2c may stop picking the server (its
/// estimate doubled), and before, nothing sent it the call that tells the two apart: it stayed
/// avoided and unjudged, and once healthy unfed until its estimate decayed.
#[tokio::test(start_paused = true)]
async fn one_fast_failure_is_followed_up_within_seconds() {
    for seed in 0..10 {
        let backends = fleet(3);
        let layer = recommended();
        let monitor = layer.monitor();
        let mut balancer = Balance::from_rng(
            layer.layer(ServiceList::new(backends.clone())),
            SeededRng(seed),
        );
        serial_for(&mut balancer, Duration::from_secs(2)).await;
        backends[0].set_unavailable(true);
        let mut ejected_after = None;
        for tenth in 1..=50 {
            serial_for(&mut balancer, Duration::from_millis(100)).await;
            if standing(&monitor, 0).status == EndpointStatus::Ejected {
                ejected_after = Some(tenth);
                break;
            }
        }
        assert!(
            ejected_after.is_some_and(|t| t <= 30),
            "seed {seed}: not ejected within 3 s ({ejected_after:?}): {:?}",
            standing(&monitor, 0)
        );
    }
    for seed in 0..10 {
        let backends = fleet(3);
        let layer = recommended();
        let mut balancer = Balance::from_rng(
            layer.layer(ServiceList::new(backends.clone())),
            SeededRng(seed),
        );
        serial_for(&mut balancer, Duration::from_secs(2)).await;
        // One failure, then healthy again.
        backends[0].set_unavailable(true);
        let before = backends[0].calls();
        while backends[0].calls() == before {
            serial(&mut balancer, 1).await;
        }
        backends[0].set_unavailable(false);
        let healed = backends[0].calls();
        serial_for(&mut balancer, Duration::from_secs(2)).await;
        assert!(
            backends[0].calls() > healed,
            "seed {seed}: no call within 2 s of a blip"
        );
    }
}
