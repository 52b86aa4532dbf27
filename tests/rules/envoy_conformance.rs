//! Envoy's own test cases for its outlier detector, re-expressed against the layer with the
//! Envoy preset: each case names the test of Envoy's
//! `test/common/upstream/outlier_detection_impl_test.cc` it comes from, and keeps its inputs
//! (responses, times), its expected ejections and its counters. Envoy's tests fire the interval
//! timer by hand at chosen times; here the detector's ticks fall every interval from the layer's
//! start, and each case picks its times so that a tick Envoy fires falls where Envoy fires it (or
//! says where it differs). Envoy's tests set `max_ejection_percent` and the enforcement
//! percentages through runtime overrides; here they are the configuration fields of the same
//! names.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::channel::mpsc;
use futures::Stream;
use tower::discover::Change;
use tower::{Service, ServiceExt};
use tower_outlier::detectors::{Detector, DetectorBuilder};
use tower_outlier::discover::{OutlierDetectionDiscover, OutlierEndpoint};
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer, ServerErrors};

const MS: Duration = Duration::from_millis(1);

/// A host answering the HTTP status it is set to; 0 is a refused connection (a local-origin
/// failure, which Envoy counts as a 503 unless the origins are split).
#[derive(Clone, Debug)]
struct Host {
    status: Arc<AtomicU16>,
}

impl Service<()> for Host {
    type Response = http::Response<()>;
    type Error = io::Error;
    type Future = Ready<Result<http::Response<()>, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        match self.status.load(Ordering::SeqCst) {
            0 => ready(Err(io::Error::from(io::ErrorKind::ConnectionRefused))),
            status => ready(Ok(http::Response::builder()
                .status(status)
                .body(())
                .unwrap())),
        }
    }
}

type Changes = mpsc::UnboundedReceiver<Result<Change<usize, Host>, Infallible>>;

/// A cluster of hosts behind the layer with the Envoy preset, driven as a balancer drives it.
struct Cluster {
    policy: DetectorPolicy,
    tx: mpsc::UnboundedSender<Result<Change<usize, Host>, Infallible>>,
    adaptor: OutlierDetectionDiscover<Changes, ServerErrors, tower_outlier::probe::PassiveTrial>,
    live: HashMap<usize, OutlierEndpoint<Host, ServerErrors>>,
    hosts: HashMap<usize, Host>,
    layer: OutlierDetectionLayer<ServerErrors>,
    task: tokio_test::task::Spawn<()>,
}

impl Cluster {
    fn new(config: DetectorBuilder, hosts: usize) -> Self {
        let policy = DetectorPolicy::seeded(config.build().unwrap(), 1);
        let layer = OutlierDetectionLayer::new(policy.clone()).classifier(ServerErrors);
        let (tx, rx) = mpsc::unbounded();
        let adaptor = tower::Layer::layer(&layer, rx);
        let mut cluster = Cluster {
            policy,
            tx,
            adaptor,
            live: HashMap::new(),
            hosts: HashMap::new(),
            layer,
            task: tokio_test::task::spawn(()),
        };
        for id in 0..hosts {
            cluster.add(id);
        }
        cluster
    }

    fn add(&mut self, id: usize) {
        let host = Host {
            status: Arc::new(AtomicU16::new(200)),
        };
        self.hosts.insert(id, host.clone());
        self.tx
            .unbounded_send(Ok(Change::Insert(id, host)))
            .unwrap();
        self.sync();
    }

    fn sync(&mut self) {
        loop {
            let (task, adaptor) = (&mut self.task, &mut self.adaptor);
            match task.enter(|cx, _| std::pin::Pin::new(&mut *adaptor).poll_next(cx)) {
                Poll::Ready(Some(Ok(Change::Insert(id, endpoint)))) => {
                    self.live.insert(id, endpoint);
                }
                Poll::Ready(Some(Ok(Change::Remove(id)))) => {
                    self.live.remove(&id);
                }
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) | Poll::Pending => return,
            }
        }
    }

    /// Host `id` answers each of `statuses` in turn (0: a refused connection).
    async fn answers(&mut self, id: usize, statuses: &[u16]) {
        for &status in statuses {
            self.hosts[&id].status.store(status, Ordering::SeqCst);
            let endpoint = self.live.get_mut(&id).expect("the host is in rotation");
            let _ = endpoint.ready().await.unwrap().call(()).await;
            self.sync();
        }
    }

    /// Moves the clock to `at` after the layer's start.
    async fn at(&mut self, start: tokio::time::Instant, at: Duration) {
        tokio::time::advance((start + at).saturating_duration_since(tokio::time::Instant::now()))
            .await;
        self.sync();
    }

    fn ejected(&self, id: usize) -> bool {
        !self.live.contains_key(&id)
    }

    fn reason(&self, id: usize) -> &'static str {
        let snapshot = self.layer.monitor().snapshot();
        let entry = snapshot.get(&id.to_string()).unwrap();
        entry.last_reason.as_ref().expect("ejected once").measure
    }

    fn detected(&self, detector: Detector) -> u64 {
        self.policy.stats().detected(detector)
    }

    fn enforced(&self, detector: Detector) -> u64 {
        self.policy.stats().enforced(detector)
    }

    fn overflow(&self) -> u64 {
        Detector::ALL
            .iter()
            .map(|&d| self.policy.stats().overflow(d))
            .sum()
    }
}

fn envoy() -> DetectorBuilder {
    DetectorConfig::envoy()
}

const GATEWAY: Detector = Detector::ConsecutiveGatewayFailure;
const FIVE_XX: Detector = Detector::Consecutive5xx;

// BasicFlowGatewayFailureAnd5xx: one 503 completes both streaks; Envoy handles the gateway
// detection first, ejects for it, and drops the 5xx detection (the host is already out).
#[tokio::test(start_paused = true)]
async fn basic_flow_gateway_failure_and_5xx() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .enforcing_consecutive_gateway_failure(100),
        2,
    );
    cluster.answers(0, &[503, 200, 503, 503, 503, 503]).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[503]).await;
    assert!(cluster.ejected(0));
    assert_eq!(cluster.reason(0), "consecutive gateway failures");
    assert_eq!(
        (cluster.detected(GATEWAY), cluster.enforced(GATEWAY)),
        (1, 1)
    );
    assert_eq!(
        (cluster.detected(FIVE_XX), cluster.enforced(FIVE_XX)),
        (0, 0)
    );
    // Envoy's timer at 9 999 ms and 30 001 ms; here the ticks of 10 s, 20 s and 30 s: back on
    // the 30 s tick, the first at or after 0 + 30 s.
    cluster.at(start, 9_999 * MS).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 30_001 * MS).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[503, 503, 500, 500]).await;
    assert!(!cluster.ejected(0), "500 breaks the gateway streak");
    cluster.at(start, 40_000 * MS).await;
    cluster.answers(0, &[500]).await;
    assert!(cluster.ejected(0));
    assert_eq!(cluster.reason(0), "consecutive 5xx");
    assert_eq!(
        (cluster.detected(FIVE_XX), cluster.enforced(FIVE_XX)),
        (1, 1)
    );
    assert_eq!(
        (cluster.detected(GATEWAY), cluster.enforced(GATEWAY)),
        (1, 1)
    );
}

// Overflow: two hosts at 60 %; the second ejection would make 100 % and is refused, counted as
// an overflow.
#[tokio::test(start_paused = true)]
async fn overflow() {
    let mut cluster = Cluster::new(envoy().max_ejection_percent(60), 2);
    cluster.answers(0, &[500; 5]).await;
    assert!(cluster.ejected(0));
    cluster.answers(1, &[500; 5]).await;
    assert!(!cluster.ejected(1));
    assert_eq!(cluster.overflow(), 1);
    assert_eq!(cluster.detected(FIVE_XX), 2);
}

// Overflow, continued (onConsecutiveErrorWorker resets the streak whatever ejectHost did): a
// refused detection is forgotten. When the budget frees, the host is not ejected on it; it
// takes a new streak of five.
#[tokio::test(start_paused = true)]
async fn a_refused_detection_is_forgotten() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(envoy().max_ejection_percent(60), 2);
    cluster.answers(0, &[500; 5]).await;
    cluster.at(start, Duration::from_secs(25)).await;
    cluster.answers(1, &[500; 5]).await;
    assert_eq!(cluster.overflow(), 1);
    // Host 0 comes back on the 30 s tick, 5 s later: room for one again.
    cluster.at(start, 30 * Duration::from_secs(1)).await;
    assert!(!cluster.ejected(0));
    assert!(
        !cluster.ejected(1),
        "the refused detection does not eject host 1 once there is room"
    );
    cluster.answers(1, &[500; 4]).await;
    assert!(!cluster.ejected(1));
    cluster.answers(1, &[500]).await;
    assert!(cluster.ejected(1), "a new streak of five does");
}

// BasicFlowGatewayFailure: 5xx not enforced, gateway enforced; a 500 breaks only the gateway
// streak; the 5xx streak's detection while out is dropped.
#[tokio::test(start_paused = true)]
async fn basic_flow_gateway_failure() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .enforcing_consecutive_gateway_failure(100)
            .enforcing_consecutive_5xx(0),
        2,
    );
    cluster.answers(0, &[503, 500, 503, 503, 503, 503]).await;
    assert!(!cluster.ejected(0));
    assert_eq!(
        (cluster.detected(FIVE_XX), cluster.enforced(FIVE_XX)),
        (1, 0)
    );
    cluster.answers(0, &[503]).await;
    assert!(cluster.ejected(0));
    assert_eq!(cluster.reason(0), "consecutive gateway failures");
    cluster.at(start, 9_999 * MS).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 30_001 * MS).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[503; 4]).await;
    cluster.at(start, 40_000 * MS).await;
    cluster.answers(0, &[503]).await;
    assert!(cluster.ejected(0));
    assert_eq!(
        (cluster.detected(GATEWAY), cluster.enforced(GATEWAY)),
        (2, 2)
    );
    assert_eq!(
        (cluster.detected(FIVE_XX), cluster.enforced(FIVE_XX)),
        (1, 0)
    );
}

// BasicFlow5xxViaNonHttpCodes: refused connections count as 503s; with the gateway detector not
// enforced (Envoy's default) the same failure is a gateway detection let go, then a 5xx
// ejection.
#[tokio::test(start_paused = true)]
async fn basic_flow_5xx_via_non_http_codes() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(envoy().max_ejection_percent(100), 2);
    cluster.answers(0, &[0, 200, 0, 0, 0, 0]).await;
    cluster.answers(0, &[0]).await;
    assert!(cluster.ejected(0));
    assert_eq!(cluster.reason(0), "consecutive 5xx");
    assert_eq!(cluster.policy.stats().unenforced(GATEWAY), 1);
    cluster.at(start, 30_001 * MS).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[0; 4]).await;
    cluster.at(start, 40_000 * MS).await;
    cluster.answers(0, &[0]).await;
    assert!(cluster.ejected(0));
    assert_eq!(
        (cluster.detected(FIVE_XX), cluster.enforced(FIVE_XX)),
        (2, 2)
    );
    assert_eq!(
        (cluster.detected(GATEWAY), cluster.enforced(GATEWAY)),
        (2, 0)
    );
}

// MaxEjectionPercentage: three hosts at 50 %; only the first of three failing hosts is ejected.
#[tokio::test(start_paused = true)]
async fn max_ejection_percentage() {
    let mut cluster = Cluster::new(envoy().max_ejection_percent(50), 3);
    for id in 0..3 {
        cluster.answers(id, &[500; 5]).await;
    }
    assert!(cluster.ejected(0));
    assert!(!cluster.ejected(1) && !cluster.ejected(2));
    assert_eq!(cluster.overflow(), 2);
}

// MaxEjectionPercentageSingleHost: one host at 90 % is never ejected (100 % > 90 %).
#[tokio::test(start_paused = true)]
async fn max_ejection_percentage_single_host() {
    let mut cluster = Cluster::new(envoy().max_ejection_percent(90), 1);
    cluster.answers(0, &[500; 5]).await;
    assert!(!cluster.ejected(0));
    assert_eq!(cluster.overflow(), 1);
}

// The worked example of checkHostForUneject with the timer armed at the detector's start: a
// host ejected at 3 s with a 30 s base comes back on the 40 s tick, not at 33 s.
#[tokio::test(start_paused = true)]
async fn an_ejection_before_the_first_tick_ends_on_a_tick() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(envoy().max_ejection_percent(100), 2);
    cluster.at(start, Duration::from_secs(3)).await;
    cluster.answers(0, &[500; 5]).await;
    assert!(cluster.ejected(0));
    cluster.at(start, Duration::from_millis(39_999)).await;
    assert!(cluster.ejected(0), "33 s is no tick");
    cluster.at(start, Duration::from_secs(40)).await;
    assert!(!cluster.ejected(0));
}

const SECOND: Duration = Duration::from_secs(1);

/// Host `id` answers `successes` 200s and `failures` of `status`, interleaved the way Envoy's
/// tests load them (all successes, then all failures: the order does not matter to a rate).
async fn load(cluster: &mut Cluster, id: usize, successes: usize, failures: usize, status: u16) {
    let mut statuses = vec![200; successes];
    statuses.extend(std::iter::repeat_n(status, failures));
    cluster.answers(id, &statuses).await;
}

// NotEnforcing: three hosts at 35 %; 5xx enforcement off: four 503s and one more are a gateway
// detection and a 5xx detection, neither enforced.
#[tokio::test(start_paused = true)]
async fn not_enforcing() {
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(35)
            .enforcing_consecutive_5xx(0),
        3,
    );
    cluster.answers(0, &[503; 5]).await;
    assert!(!cluster.ejected(0));
    assert_eq!(
        (cluster.detected(FIVE_XX), cluster.enforced(FIVE_XX)),
        (1, 0)
    );
    assert_eq!(
        (cluster.detected(GATEWAY), cluster.enforced(GATEWAY)),
        (1, 0)
    );
    assert_eq!(cluster.overflow(), 0);
}

// Consecutive_5xxAlreadyEjected: a streak completed while the host is out is dropped.
#[tokio::test(start_paused = true)]
async fn consecutive_5xx_already_ejected() {
    let mut cluster = Cluster::new(envoy().max_ejection_percent(100), 2); // one idle: the layer keeps the last endpoint
    let mut kept = cluster.live.get(&0).cloned().unwrap();
    cluster.answers(0, &[500; 5]).await;
    assert!(cluster.ejected(0));
    // Calls still reaching it (a handle the balancer had not dropped yet).
    for status in [200, 500, 500, 500, 500, 500] {
        cluster.hosts[&0].status.store(status, Ordering::SeqCst);
        let _ = kept.ready().await.unwrap().call(()).await;
        cluster.sync();
    }
    assert_eq!(
        cluster.detected(FIVE_XX),
        1,
        "no second detection while out"
    );
}

// EjectTimeBackoff: base 10 s, ticks every 10 s. The backoff grows with each ejection, falls by
// one each tick the host has been back a full interval, and the time out follows it.
#[tokio::test(start_paused = true)]
async fn eject_time_backoff() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .base_ejection_time(10 * SECOND),
        // Envoy's one host, and an idle second: the layer never ejects the last endpoint.
        2,
    );
    // (time, whether ejected after the tick and the calls at that time, fail it then)
    let trace: &[(u64, bool, bool)] = &[
        (0, true, true),
        (10, true, true), // back on the tick, ejected again: backoff 2
        (20, true, false),
        (30, true, true), // back after 20 s, ejected: backoff 3
        (40, true, false),
        (50, true, false),
        (60, false, false), // back after 30 s
        (70, false, false), // decrement: 2
        (80, true, true),   // decrement: 1, then ejected: 2
        (90, true, false),
        (100, false, false), // back after 20 s
    ];
    for &(at, ejected_after, fail) in trace {
        cluster.at(start, Duration::from_secs(at)).await;
        if fail {
            assert!(!cluster.ejected(0), "in rotation at {at} s");
            cluster.answers(0, &[500; 5]).await;
        }
        assert_eq!(cluster.ejected(0), ejected_after, "at {at} s");
    }
    // Fifty ticks in rotation take the backoff to 0; the next ejection is one base time.
    cluster.at(start, 600 * SECOND).await;
    cluster.at(start, 610 * SECOND).await;
    cluster.answers(0, &[500; 5]).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 620 * SECOND).await;
    assert!(!cluster.ejected(0), "back after 10 s");
}

// MaxEjectTime: base 10 s, max 300 s; the i-th ejection lasts 10·i s up to 300 s, then stays.
#[tokio::test(start_paused = true)]
async fn max_eject_time() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .base_ejection_time(10 * SECOND)
            .max_ejection_time(300 * SECOND),
        // Envoy's one host, and an idle second: the layer never ejects the last endpoint.
        2,
    );
    let mut now = 0;
    for i in 1..=39u64 {
        cluster.answers(0, &[500; 5]).await;
        let out = 10 * i.min(30);
        cluster.at(start, Duration::from_secs(now + out - 10)).await;
        assert!(
            cluster.ejected(0),
            "ejection {i} still out after {} s",
            out - 10
        );
        now += out;
        cluster.at(start, Duration::from_secs(now)).await;
        assert!(!cluster.ejected(0), "ejection {i} back after {out} s");
    }
}

// MaxEjectTimeNotAlligned: max 305 s with 10 s ticks: the capped time out of 305 s ends on the
// 310 s tick.
#[tokio::test(start_paused = true)]
async fn max_eject_time_not_aligned() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .base_ejection_time(10 * SECOND)
            .max_ejection_time(305 * SECOND),
        // Envoy's one host, and an idle second: the layer never ejects the last endpoint.
        2,
    );
    let mut now = 0;
    for i in 1..=35u64 {
        cluster.answers(0, &[500; 5]).await;
        let out = if i <= 30 { 10 * i } else { 310 };
        cluster.at(start, Duration::from_secs(now + out - 10)).await;
        assert!(
            cluster.ejected(0),
            "ejection {i} still out after {} s",
            out - 10
        );
        now += out;
        cluster.at(start, Duration::from_secs(now)).await;
        assert!(!cluster.ejected(0), "ejection {i} back after {out} s");
    }
}

// BasicFlowSuccessRateExternalOrigin: five hosts, h4 at 50 % over 400 requests against 100 %:
// the threshold is 90 − 1.9 × 20 = 52, h4 is ejected on the tick; after it returns, 50 requests
// a host is under the request volume of 100 and nothing is judged.
#[tokio::test(start_paused = true)]
async fn basic_flow_success_rate_external_origin() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .enforcing_consecutive_5xx(0),
        5,
    );
    for id in 0..5 {
        load(&mut cluster, id, 200, 0, 200).await;
    }
    load(&mut cluster, 4, 0, 200, 503).await;
    assert_eq!(cluster.detected(FIVE_XX), 40, "non-enforced 5xx detections");
    cluster.at(start, 10 * SECOND).await;
    assert!(cluster.ejected(4));
    assert_eq!(cluster.reason(4), "success rate");
    let snapshot = cluster.layer.monitor().snapshot();
    let reason = snapshot.get("4").unwrap().last_reason.clone().unwrap();
    assert_eq!((reason.value, reason.threshold), (50.0, 52.0));
    cluster.at(start, 19_999 * MS).await;
    assert!(cluster.ejected(4));
    // Envoy's timer at 50 001 ms; here the 40 s tick (10 s + 30 s).
    cluster.at(start, 40 * SECOND).await;
    assert!(!cluster.ejected(4));
    for id in 0..5 {
        load(&mut cluster, id, 25, 0, 200).await;
    }
    load(&mut cluster, 4, 0, 25, 503).await;
    cluster.at(start, 50 * SECOND).await;
    assert!(!cluster.ejected(4), "under the request volume");
    assert_eq!(cluster.policy.stats().detected(Detector::SuccessRate), 1);
}

// BasicFlowFailurePercentageExternalOrigin: only failure percentage enforced; h3 fails 83 %
// (kept), h4 85.7 % (ejected: at or above 85); success rate has too few hosts with volume.
#[tokio::test(start_paused = true)]
async fn basic_flow_failure_percentage_external_origin() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .enforcing_consecutive_5xx(0)
            .enforcing_success_rate(0)
            .enforcing_failure_percentage(100),
        5,
    );
    for id in 0..5 {
        load(&mut cluster, id, 50, 0, 200).await;
    }
    load(&mut cluster, 3, 0, 250, 503).await;
    load(&mut cluster, 4, 0, 300, 503).await;
    cluster.at(start, 10 * SECOND).await;
    assert!(!cluster.ejected(3), "83.3 % < 85 %");
    assert!(cluster.ejected(4), "85.7 % >= 85 %");
    assert_eq!(cluster.reason(4), "failure percentage");
    assert_eq!(cluster.policy.stats().detected(Detector::SuccessRate), 0);
}

// BasicFlowLocalOriginFailure: with the origins split, refused connections are local-origin
// failures; five in a row eject, the second ejection lasts 60 s, and a connect success breaks
// the streak.
#[tokio::test(start_paused = true)]
async fn basic_flow_local_origin_failure() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .split_external_local_origin_errors(true),
        // Envoy's one host, and an idle second: the layer never ejects the last endpoint.
        2,
    );
    cluster.answers(0, &[0; 5]).await;
    assert!(cluster.ejected(0));
    assert_eq!(cluster.reason(0), "consecutive local-origin failures");
    cluster.at(start, 9_999 * MS).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 30 * SECOND).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[0; 5]).await;
    assert!(cluster.ejected(0), "ejected again: 60 s");
    cluster.at(start, 80 * SECOND).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 90 * SECOND).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[0, 0, 0, 0, 200, 0, 0]).await;
    assert!(
        !cluster.ejected(0),
        "a response breaks the local-origin streak"
    );
    let local = Detector::ConsecutiveLocalOriginFailure;
    assert_eq!((cluster.detected(local), cluster.enforced(local)), (2, 2));
}

// OutlierUtility.SRThreshold: rates {50, 100, 100, 100, 100}: mean 90, threshold 52.
#[tokio::test(start_paused = true)]
async fn success_rate_threshold() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .enforcing_consecutive_5xx(0),
        5,
    );
    for id in 1..5 {
        load(&mut cluster, id, 100, 0, 200).await;
    }
    load(&mut cluster, 0, 50, 50, 500).await;
    cluster.at(start, 10 * SECOND).await;
    let snapshot = cluster.layer.monitor().snapshot();
    let reason = snapshot.get("0").unwrap().last_reason.clone().unwrap();
    assert_eq!((reason.value, reason.threshold), (50.0, 52.0));
}

/// Envoy's YAML test configurations, as the proto3 JSON the reader takes.
fn read(json: &str) -> DetectorConfig {
    match tower_outlier::detectors::EnvoyOutlierDetection::from_json(json) {
        Ok(read) => read.config().clone(),
        Err(error) => panic!("{json} refused: {error}"),
    }
}

// DetectorStaticConfig: every field read as given; the gateway and failure-percentage
// enforcements keep their defaults of 0.
#[test]
fn detector_static_config() {
    let config = read(
        r#"{"interval": "0.100s", "base_ejection_time": "10s", "consecutive_5xx": 10,
            "max_ejection_percent": 50, "enforcing_consecutive_5xx": 10,
            "enforcing_success_rate": 20, "success_rate_minimum_hosts": 50,
            "success_rate_request_volume": 200, "success_rate_stdev_factor": 3000,
            "failure_percentage_minimum_hosts": 10, "failure_percentage_request_volume": 25,
            "failure_percentage_threshold": 70, "max_ejection_time": "400s"}"#,
    );
    assert_eq!(config.interval(), 100 * MS);
    assert_eq!(config.base_ejection_time(), 10 * SECOND);
    assert_eq!(config.consecutive_5xx().threshold, 10);
    assert_eq!(config.consecutive_5xx().enforcement, 10);
    assert_eq!(config.consecutive_gateway_failure().threshold, 5);
    assert_eq!(config.consecutive_gateway_failure().enforcement, 0);
    assert_eq!(config.max_ejection_percent(), 50);
    let success_rate = config.success_rate().unwrap();
    assert_eq!(
        (
            success_rate.enforcement,
            success_rate.minimum_hosts,
            success_rate.request_volume,
            success_rate.stdev_factor
        ),
        (20, 50, 200, 3000)
    );
    let failure_percentage = config.failure_percentage().unwrap();
    assert_eq!(
        (
            failure_percentage.enforcement,
            failure_percentage.local_origin_enforcement,
            failure_percentage.minimum_hosts,
            failure_percentage.request_volume,
            failure_percentage.threshold
        ),
        (0, 0, 10, 25, 70)
    );
    assert_eq!(config.max_ejection_time(), 400 * SECOND);
}

// DetectorStaticConfigMaxDefaultValue: no max_ejection_time: 300 s.
#[test]
fn detector_static_config_max_default_value() {
    let config = read(r#"{"interval": "0.100s", "base_ejection_time": "10s"}"#);
    assert_eq!(config.interval(), 100 * MS);
    assert_eq!(config.base_ejection_time(), 10 * SECOND);
    assert_eq!(config.max_ejection_time(), 300 * SECOND);
}

// DetectorStaticConfigiInvalidMaxEjectTime: a max_ejection_time below the base is refused.
#[test]
fn detector_static_config_invalid_max_eject_time() {
    let error = tower_outlier::detectors::EnvoyOutlierDetection::from_json(
        r#"{"interval": "0.100s", "base_ejection_time": "10s", "max_ejection_time": "3s"}"#,
    )
    .unwrap_err();
    assert_eq!(error.field(), Some("max_ejection_time"), "{error}");
}

// DetectorStaticConfigBaseLargerThanMaxNoMax: a base of 400 s with no max: the max is 400 s.
#[test]
fn detector_static_config_base_larger_than_max_no_max() {
    let config = read(r#"{"interval": "0.100s", "base_ejection_time": "400s"}"#);
    assert_eq!(config.base_ejection_time(), 400 * SECOND);
    assert_eq!(config.max_ejection_time(), 400 * SECOND);
}

// DetectorStaticConfigMaxEjectionTimeJitter, DetectorStaticConfigDefaultMaxEjectionTimeJitter.
#[test]
fn detector_static_config_max_ejection_time_jitter() {
    let config = read(
        r#"{"interval": "0.100s", "base_ejection_time": "10s", "max_ejection_time_jitter": "13s"}"#,
    );
    assert_eq!(config.max_ejection_time_jitter(), 13 * SECOND);
    let config = read(r#"{"interval": "0.100s", "base_ejection_time": "10s"}"#);
    assert_eq!(config.max_ejection_time_jitter(), Duration::ZERO);
}

// BasicFlow5xxViaHttpCodes: 500, 200, four 500s and one more eject; back on the 30 s tick;
// ejected again at 40 s (two ejections, both 5xx).
#[tokio::test(start_paused = true)]
async fn basic_flow_5xx_via_http_codes() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(envoy().max_ejection_percent(100), 2);
    cluster.answers(0, &[500, 200, 500, 500, 500, 500]).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[500]).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 9_999 * MS).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 30_001 * MS).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[500; 4]).await;
    cluster.at(start, 40 * SECOND).await;
    cluster.answers(0, &[500]).await;
    assert!(cluster.ejected(0));
    assert_eq!(
        (cluster.detected(FIVE_XX), cluster.enforced(FIVE_XX)),
        (2, 2)
    );
}

// ExternalOriginEventsNonSplit: alternating failure and success never eject; a run of
// failures ejects at the fifth, and the streak completed again while out is dropped.
#[tokio::test(start_paused = true)]
async fn external_origin_events_non_split() {
    let mut cluster = Cluster::new(envoy().max_ejection_percent(60), 2);
    let mut kept = cluster.live.get(&0).cloned().unwrap();
    for _ in 0..100 {
        cluster.answers(0, &[500, 200]).await;
    }
    assert!(!cluster.ejected(0));
    for _ in 0..100 {
        cluster.hosts[&0].status.store(500, Ordering::SeqCst);
        let _ = kept.ready().await.unwrap().call(()).await;
        cluster.sync();
    }
    assert!(cluster.ejected(0));
    assert_eq!(cluster.detected(FIVE_XX), 1);
    assert_eq!(cluster.detected(GATEWAY), 0, "500 is no gateway error");
}

// ExternalOriginEventsWithSplit: with the origins split a response failure is still a 5xx (and,
// for a 503, a gateway failure): alternating never ejects, a run of 503s ejects at the fifth.
#[tokio::test(start_paused = true)]
async fn external_origin_events_with_split() {
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .split_external_local_origin_errors(true),
        2,
    );
    for _ in 0..100 {
        cluster.answers(0, &[503, 200]).await;
    }
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[503; 5]).await;
    assert!(cluster.ejected(0));
    assert_eq!(cluster.reason(0), "consecutive 5xx");
    assert_eq!(cluster.policy.stats().unenforced(GATEWAY), 1);
}

// RemoveWhileEjected: an ejected host removed from the cluster frees its place; the next tick
// does nothing with it.
#[tokio::test(start_paused = true)]
async fn remove_while_ejected() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(envoy().max_ejection_percent(100), 2);
    cluster.answers(0, &[500; 5]).await;
    assert!(cluster.ejected(0));
    cluster.tx.unbounded_send(Ok(Change::Remove(0))).unwrap();
    cluster.sync();
    cluster.at(start, 9_999 * MS).await;
    cluster.at(start, 40 * SECOND).await;
    assert!(cluster.ejected(0), "gone, and not brought back");
    assert!(cluster.layer.monitor().snapshot().get("0").is_none());
}

// EjectTimeBackoffTimeBasedDetection: failure percentage only (minimum one host), base 10 s:
// ejected on the 10 s tick, back on the 20 s one, ejected again at 30 s for 20 s, the backoff
// decays over two healthy intervals, and the next ejection lasts 10 s again.
#[tokio::test(start_paused = true)]
async fn eject_time_backoff_time_based_detection() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .base_ejection_time(10 * SECOND)
            .enforcing_consecutive_5xx(0)
            .enforcing_success_rate(0)
            .enforcing_failure_percentage(100)
            .failure_percentage_minimum_hosts(1),
        // Envoy's one host, and an idle second: the layer never ejects the last endpoint.
        2,
    );
    cluster.answers(0, &[500; 100]).await;
    cluster.at(start, 10 * SECOND).await;
    assert!(cluster.ejected(0), "0 % success over 100 calls");
    cluster.at(start, 20 * SECOND).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[500; 100]).await;
    cluster.at(start, 30 * SECOND).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 40 * SECOND).await;
    assert!(cluster.ejected(0), "the second lasts 20 s");
    cluster.at(start, 50 * SECOND).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[200; 100]).await;
    cluster.at(start, 60 * SECOND).await;
    cluster.answers(0, &[200; 100]).await;
    cluster.at(start, 70 * SECOND).await;
    assert!(!cluster.ejected(0));
    cluster.answers(0, &[500; 100]).await;
    cluster.at(start, 80 * SECOND).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 90 * SECOND).await;
    assert!(!cluster.ejected(0), "back to one base time");
}

// EmptySuccessRate: a tick with no host and a minimum of 0 hosts does not fail.
#[tokio::test(start_paused = true)]
async fn empty_success_rate() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(envoy().success_rate_minimum_hosts(0), 0);
    cluster.at(start, 10 * SECOND).await;
    assert!(cluster.live.is_empty());
}

// EjectionTimeJitterIsZeroWhenNotConfigured: without jitter an ejection lasts exactly the base
// time (on a tick).
#[tokio::test(start_paused = true)]
async fn ejection_time_jitter_is_zero_when_not_configured() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(envoy().max_ejection_percent(100), 2);
    cluster.at(start, 10 * SECOND).await;
    cluster.answers(0, &[500; 5]).await;
    cluster.at(start, 39_999 * MS).await;
    assert!(cluster.ejected(0));
    cluster.at(start, 40 * SECOND).await;
    assert!(!cluster.ejected(0));
}

// BasicFlowSuccessRateLocalOrigin: with the origins split, connection failures feed the
// local-origin success rate: h4 at 50 % of 400 against 100 % is ejected on the tick (threshold
// 52), the external rates untouched.
#[tokio::test(start_paused = true)]
async fn basic_flow_success_rate_local_origin() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .split_external_local_origin_errors(true)
            .enforcing_consecutive_local_origin_failure(0),
        5,
    );
    for id in 0..5 {
        load(&mut cluster, id, 200, 0, 200).await;
    }
    load(&mut cluster, 4, 0, 200, 0).await;
    cluster.at(start, 10 * SECOND).await;
    assert!(cluster.ejected(4));
    assert_eq!(cluster.reason(4), "local-origin success rate");
    let snapshot = cluster.layer.monitor().snapshot();
    let reason = snapshot.get("4").unwrap().last_reason.clone().unwrap();
    assert_eq!((reason.value, reason.threshold), (50.0, 52.0));
    assert_eq!(
        cluster.policy.stats().detected(Detector::SuccessRate),
        0,
        "the external rates are all 100 %"
    );
}

// BasicFlowFailurePercentageLocalOrigin: local-origin failure percentage enforced at a
// threshold of 40 (the local success rate detects first, not enforced): h4 is ejected for its
// 50 % of local failures.
#[tokio::test(start_paused = true)]
async fn basic_flow_failure_percentage_local_origin() {
    let start = tokio::time::Instant::now();
    let mut cluster = Cluster::new(
        envoy()
            .max_ejection_percent(100)
            .split_external_local_origin_errors(true)
            .enforcing_consecutive_local_origin_failure(0)
            .enforcing_local_origin_success_rate(0)
            .enforcing_failure_percentage_local_origin(100)
            .failure_percentage_threshold(40),
        5,
    );
    for id in 0..5 {
        load(&mut cluster, id, 200, 0, 200).await;
    }
    load(&mut cluster, 4, 0, 200, 0).await;
    cluster.at(start, 10 * SECOND).await;
    assert!(cluster.ejected(4));
    assert_eq!(cluster.reason(4), "local-origin failure percentage");
    let stats = cluster.policy.stats();
    assert_eq!(stats.unenforced(Detector::LocalOriginSuccessRate), 1);
    assert_eq!(stats.enforced(Detector::LocalOriginFailurePercentage), 1);
}
