//! The probe cadence (`ProbeCadence`, Envoy's health-check fields), on tokio's paused clock
//! through a real p2c `Balance`: the first check, the interval, the jitter (by default and as
//! set), the initial jitter, the timeout and the healthy threshold each time the checks as they
//! say, a passive trial keeps its policy's times, and a fleet of layers ejecting one endpoint at
//! the same moment does not probe it in step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::balance::p2c::Balance;
use tower::{Service, ServiceExt};
use tower_outlier::probe::{probe_fn, Probe, ProbeCadence, ProbeFuture};
use tower_outlier::{
    EndpointStatus, ErrorRateConfig, ErrorRatePolicy, Monitor, NetworkErrors, OutlierDetectionLayer,
};

use crate::support::{announce, Backend, SeededRng};

/// The ejection time of these tests' policy (EDAS's rule with a 10 s unit): without a cadence,
/// the first check of an endpoint comes this long after its ejection.
const UNIT: Duration = Duration::from_secs(10);

fn edas() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud()
            .recovery_unit(UNIT)
            .max_ejection_ratio(0.4)
            .build()
            .unwrap(),
    ))
}

/// A probe that records when each check starts and answers what `healthy` says after `takes`.
#[derive(Clone)]
struct Recording {
    healthy: Arc<AtomicBool>,
    times: Arc<Mutex<Vec<Instant>>>,
    takes: Duration,
}

impl Recording {
    fn new(takes: Duration) -> Self {
        Recording {
            healthy: Arc::default(),
            times: Arc::default(),
            takes,
        }
    }

    fn probe(&self) -> impl Probe<usize, Backend> + Clone {
        let this = self.clone();
        probe_fn(move |_: &usize, _: Backend| -> ProbeFuture {
            this.times.lock().unwrap().push(Instant::now());
            let (healthy, takes) = (this.healthy.clone(), this.takes);
            Box::pin(async move {
                tokio::time::sleep(takes).await;
                healthy.load(Ordering::SeqCst)
            })
        })
    }

    /// The checks' start times, from `since`.
    fn times(&self, since: Instant) -> Vec<Duration> {
        self.times
            .lock()
            .unwrap()
            .iter()
            .map(|at| at.duration_since(since))
            .collect()
    }
}

fn status(monitor: &Monitor, key: usize) -> EndpointStatus {
    monitor.snapshot().get(&key.to_string()).unwrap().status
}

/// Five backends behind `layer` and p2c, backend 0 failing: serial calls every 10 ms until it is
/// ejected. Returns the balancer, the backends and the moment of the ejection.
async fn eject_one<P>(
    layer: &OutlierDetectionLayer<NetworkErrors, P>,
) -> (
    impl Service<(), Response = usize, Error = tower::BoxError>,
    Vec<Backend>,
    Instant,
)
where
    P: Probe<usize, Backend> + Clone + Send + 'static,
{
    let backends: Vec<Backend> = (0..5).map(Backend::new).collect();
    backends[0].set_failing(true);
    let upstream = announce(
        &backends
            .iter()
            .map(|b| (b.id, b.clone()))
            .collect::<Vec<_>>(),
    );
    let mut balancer = Balance::from_rng(tower::Layer::layer(layer, upstream), SeededRng(7));
    let monitor = layer.monitor();
    let started = Instant::now();
    loop {
        let _ = balancer.ready().await.unwrap().call(()).await;
        if monitor
            .snapshot()
            .get("0")
            .is_some_and(|e| e.status == EndpointStatus::Ejected)
        {
            return (balancer, backends, Instant::now());
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never ejected");
        tokio::time::advance(Duration::from_millis(10)).await;
    }
}

/// Serial calls every 10 ms for `span`.
async fn serve<B>(balancer: &mut B, span: Duration)
where
    B: Service<(), Response = usize, Error = tower::BoxError>,
{
    let until = Instant::now() + span;
    while Instant::now() < until {
        let _ = balancer.ready().await.unwrap().call(()).await;
        tokio::time::advance(Duration::from_millis(10)).await;
    }
}

/// The check times `times`, each within 20 ms (the calls' step and the timer's) of `expected`.
fn assert_near(times: &[Duration], expected: &[Duration]) {
    assert_eq!(
        times.len(),
        expected.len(),
        "{times:?} against {expected:?}"
    );
    for (seen, wanted) in times.iter().zip(expected) {
        let off = seen.abs_diff(*wanted);
        assert!(
            off <= Duration::from_millis(20),
            "a check at {seen:?}, wanted at {wanted:?}: {times:?}"
        );
    }
}

fn secs(s: &[f64]) -> Vec<Duration> {
    s.iter().map(|&s| Duration::from_secs_f64(s)).collect()
}

/// Without jitter, the first check comes at the cadence's `first_check` (Envoy's
/// `unhealthy_edge_interval`), not at the policy's ejection time.
#[tokio::test(start_paused = true)]
async fn the_first_check_comes_when_the_cadence_says() {
    let probe = Recording::new(Duration::ZERO);
    let layer = edas().probe(probe.probe()).probe_cadence(
        ProbeCadence::new()
            .first_check(Duration::from_secs(2))
            .interval_jitter_percent(0),
    );
    let (mut balancer, _, ejected) = eject_one(&layer).await;
    serve(&mut balancer, Duration::from_secs(3)).await;
    assert_near(&probe.times(ejected), &secs(&[2.0]));
}

/// Failed checks come an `interval` apart (Envoy's `interval` / `unhealthy_interval`), instead
/// of the policy's back-off (10 s, 20 s, 30 s here).
#[tokio::test(start_paused = true)]
async fn failed_checks_come_an_interval_apart() {
    let probe = Recording::new(Duration::ZERO);
    let layer = edas().probe(probe.probe()).probe_cadence(
        ProbeCadence::new()
            .interval(Duration::from_secs(3))
            .interval_jitter_percent(0),
    );
    let (mut balancer, _, ejected) = eject_one(&layer).await;
    serve(&mut balancer, Duration::from_secs(20)).await;
    assert_near(&probe.times(ejected), &secs(&[10.0, 13.0, 16.0, 19.0]));
}

/// By default an active check is lengthened by up to 20 % of itself, drawn from the cadence's
/// dice: within [10 s, 12 s] for a 10 s ejection, different seeds at different times; with the
/// percentage at 0, exactly 10 s.
#[tokio::test(start_paused = true)]
async fn by_default_a_check_is_jittered_by_up_to_a_fifth() {
    let mut firsts = Vec::new();
    for seed in 0..6 {
        let probe = Recording::new(Duration::ZERO);
        let layer = edas()
            .probe(probe.probe())
            .probe_cadence(ProbeCadence::new().seed(seed));
        let (mut balancer, _, ejected) = eject_one(&layer).await;
        serve(&mut balancer, Duration::from_secs(13)).await;
        let times = probe.times(ejected);
        assert_eq!(times.len(), 1, "{times:?}");
        assert!(
            times[0] >= UNIT && times[0] <= UNIT.mul_f64(1.2) + Duration::from_millis(20),
            "{times:?}"
        );
        firsts.push(times[0]);
    }
    let spread = *firsts.iter().max().unwrap() - *firsts.iter().min().unwrap();
    assert!(spread >= Duration::from_millis(500), "{firsts:?}");

    let probe = Recording::new(Duration::ZERO);
    let layer = edas()
        .probe(probe.probe())
        .probe_cadence(ProbeCadence::new().interval_jitter_percent(0));
    let (mut balancer, _, ejected) = eject_one(&layer).await;
    serve(&mut balancer, Duration::from_secs(13)).await;
    assert_near(&probe.times(ejected), &secs(&[10.0]));
}

/// `interval_jitter` adds up to its time to every interval, `initial_jitter` up to its own to
/// the first check only.
#[tokio::test(start_paused = true)]
async fn the_interval_jitter_and_the_initial_jitter_add_their_own() {
    let mut firsts = Vec::new();
    for seed in 0..6 {
        let probe = Recording::new(Duration::ZERO);
        let layer = edas().probe(probe.probe()).probe_cadence(
            ProbeCadence::new()
                .first_check(Duration::from_secs(1))
                .interval(Duration::from_secs(2))
                .interval_jitter_percent(0)
                .interval_jitter(Duration::from_millis(500))
                .initial_jitter(Duration::from_secs(4))
                .seed(seed),
        );
        let (mut balancer, _, ejected) = eject_one(&layer).await;
        serve(&mut balancer, Duration::from_secs(16)).await;
        let times = probe.times(ejected);
        assert!(times.len() >= 4, "{times:?}");
        let step = Duration::from_millis(20);
        // The first: 1 s, plus up to 4.5 s.
        assert!(
            times[0] >= Duration::from_secs(1) && times[0] <= Duration::from_millis(5_500) + step,
            "{times:?}"
        );
        // The others: 2 s apart, plus up to 0.5 s.
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap >= Duration::from_secs(2) - step && gap <= Duration::from_millis(2_500) + step,
                "{times:?}"
            );
        }
        firsts.push(times[0]);
    }
    // The initial jitter, not the interval's half second alone, spread the first checks.
    let spread = *firsts.iter().max().unwrap() - *firsts.iter().min().unwrap();
    assert!(spread > Duration::from_secs(1), "{firsts:?}");
}

/// A check that hangs fails at the cadence's `timeout`: the next one is scheduled from then.
#[tokio::test(start_paused = true)]
async fn a_check_that_hangs_fails_at_the_timeout() {
    let probe = Recording::new(Duration::from_secs(60));
    let layer = edas().probe(probe.probe()).probe_cadence(
        ProbeCadence::new()
            .first_check(Duration::from_secs(1))
            .interval(Duration::from_secs(1))
            .timeout(Duration::from_millis(300))
            .interval_jitter_percent(0),
    );
    let monitor = layer.monitor();
    let (mut balancer, _, ejected) = eject_one(&layer).await;
    serve(&mut balancer, Duration::from_millis(1_100)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Probing);
    serve(&mut balancer, Duration::from_millis(300)).await;
    assert_eq!(
        status(&monitor, 0),
        EndpointStatus::Ejected,
        "the hanging check failed at its timeout"
    );
    serve(&mut balancer, Duration::from_millis(2_300)).await;
    // At 1 s, then 1 s after the first failed at 1.3 s, and again.
    assert_near(&probe.times(ejected), &secs(&[1.0, 2.3, 3.6]));
}

/// After a failed check, `healthy_threshold` passes in a row bring the endpoint back (Envoy's
/// `healthy_threshold`, HAProxy's `rise`), an interval apart; an endpoint that failed no check
/// comes back at its first pass.
#[tokio::test(start_paused = true)]
async fn after_a_failed_check_it_takes_the_healthy_threshold_in_a_row() {
    let probe = Recording::new(Duration::ZERO);
    let layer = edas().probe(probe.probe()).probe_cadence(
        ProbeCadence::new()
            .first_check(Duration::from_secs(1))
            .interval(Duration::from_secs(1))
            .interval_jitter_percent(0)
            .healthy_threshold(3),
    );
    let monitor = layer.monitor();
    let (mut balancer, backends, ejected) = eject_one(&layer).await;
    // The first check (at 1 s) fails; then the backend heals.
    serve(&mut balancer, Duration::from_millis(1_500)).await;
    backends[0].set_failing(false);
    probe.healthy.store(true, Ordering::SeqCst);
    // Passes at 2 s and 3 s: still out.
    serve(&mut balancer, Duration::from_millis(1_800)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Ejected);
    // The third pass in a row, at 4 s, brings it back.
    serve(&mut balancer, Duration::from_millis(1_000)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    assert_near(&probe.times(ejected), &secs(&[1.0, 2.0, 3.0, 4.0]));

    // One that never failed a check is back at its first pass.
    let probe = Recording::new(Duration::ZERO);
    probe.healthy.store(true, Ordering::SeqCst);
    let again = edas().probe(probe.probe()).probe_cadence(
        ProbeCadence::new()
            .first_check(Duration::from_secs(1))
            .interval_jitter_percent(0)
            .healthy_threshold(3),
    );
    let monitor = again.monitor();
    let (mut balancer, backends, ejected) = eject_one(&again).await;
    backends[0].set_failing(false);
    serve(&mut balancer, Duration::from_millis(1_100)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    assert_near(&probe.times(ejected), &secs(&[1.0]));
}

/// A passive trial sends no check: the cadence does not time it, the policy's ejection time
/// does.
#[tokio::test(start_paused = true)]
async fn a_passive_trial_keeps_its_policys_time() {
    let layer = edas().probe_cadence(
        ProbeCadence::new()
            .first_check(Duration::from_secs(1))
            .initial_jitter(Duration::from_secs(5)),
    );
    let monitor = layer.monitor();
    let (mut balancer, _, _) = eject_one(&layer).await;
    serve(&mut balancer, Duration::from_millis(9_900)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Ejected);
    serve(&mut balancer, Duration::from_millis(200)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Trial);
}

/// Twenty layers (twenty clients, each its own dice) eject the same endpoint at the same moment.
/// By default their checks of it are spread over the fifth of the interval the jitter draws
/// from: no more pairs of checks within 1 % of the interval of each other than uniform draws
/// over that window give (with some slack); without jitter, all twenty probe at once.
#[tokio::test(start_paused = true)]
async fn a_fleet_of_layers_does_not_probe_in_step() {
    async fn first_checks(cadence: impl Fn(u64) -> ProbeCadence) -> Vec<Duration> {
        let mut firsts = Vec::new();
        for client in 0..20 {
            let probe = Recording::new(Duration::ZERO);
            let layer = edas().probe(probe.probe()).probe_cadence(cadence(client));
            let (mut balancer, _, ejected) = eject_one(&layer).await;
            serve(&mut balancer, Duration::from_secs(13)).await;
            firsts.push(probe.times(ejected)[0]);
        }
        firsts
    }
    fn close_pairs(times: &[Duration]) -> usize {
        let near = UNIT / 100;
        let mut close = 0;
        for (i, a) in times.iter().enumerate() {
            close += times[i + 1..]
                .iter()
                .filter(|b| a.abs_diff(**b) < near)
                .count();
        }
        close
    }
    let jittered = first_checks(|client| ProbeCadence::new().seed(client * 7919 + 1)).await;
    let in_step = first_checks(|_| ProbeCadence::new().interval_jitter_percent(0)).await;
    // Uniform over a 2 s window, two draws land within 0.1 s of each other with probability
    // 2 × 0.05 − 0.05² ≈ 0.0975: 18.5 of the 190 pairs.
    let close = close_pairs(&jittered);
    assert!(close <= 30, "{close} close pairs: {jittered:?}");
    assert_eq!(close_pairs(&in_step), 190, "{in_step:?}");
}

/// An Envoy `HealthCheck` message sets the cadence by Envoy's names: the first check at
/// `unhealthy_edge_interval`, then `unhealthy_interval` apart, `healthy_threshold` passes after
/// a failed one; `interval` where the unhealthy one is not given.
#[tokio::test(start_paused = true)]
async fn an_envoy_health_check_sets_the_cadence() {
    use tower_outlier::detectors::EnvoyHealthCheck;
    let check = EnvoyHealthCheck::from_json(
        r#"{"timeout": "0.2s", "interval": "30s", "unhealthy_interval": "1.5s",
            "unhealthy_edge_interval": "0.5s", "interval_jitter_percent": 0,
            "healthy_threshold": 2, "unhealthy_threshold": 3,
            "http_health_check": {"path": "/healthz"}}"#,
    )
    .unwrap();
    assert_eq!(check.notes().len(), 1, "{:?}", check.notes());
    let probe = Recording::new(Duration::ZERO);
    let layer = edas()
        .probe(probe.probe())
        .probe_cadence(ProbeCadence::from_envoy(&check));
    let monitor = layer.monitor();
    let (mut balancer, backends, ejected) = eject_one(&layer).await;
    // Fails at 0.5 s and 2 s; heals; passes at 3.5 s (one of two) and 5 s (back).
    serve(&mut balancer, Duration::from_millis(2_500)).await;
    backends[0].set_failing(false);
    probe.healthy.store(true, Ordering::SeqCst);
    serve(&mut balancer, Duration::from_millis(1_500)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Ejected);
    serve(&mut balancer, Duration::from_millis(1_500)).await;
    assert_eq!(status(&monitor, 0), EndpointStatus::Available);
    assert_near(&probe.times(ejected), &secs(&[0.5, 2.0, 3.5, 5.0]));
}
