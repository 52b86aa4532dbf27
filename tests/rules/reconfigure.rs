//! Rules changed while the layer runs (`RulesHandle`), behind `Buffer` and p2c on tokio's paused
//! clock: what takes effect when, and what each endpoint keeps.

use crate::support;

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use support::{announce, SeededRng, Sleepy};
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_outlier::dialect::{Hsf, Sentinel};
use tower_outlier::slow_call::{parse_degrade_rules, SlowCallPolicy, State};
use tower_outlier::{
    EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer, RulesHandle,
};

const SERVICE: &str = "com.example.Orders:1.0.0";

/// A backend failing a fixed share of its calls (`failing_per_10` of every 10), or all of them.
#[derive(Clone, Debug)]
struct Gray {
    id: usize,
    failing_per_10: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl Gray {
    fn new(id: usize, failing_per_10: usize) -> Self {
        Gray {
            id,
            failing_per_10: Arc::new(AtomicUsize::new(failing_per_10)),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Service<()> for Gray {
    type Response = usize;
    type Error = io::Error;
    type Future = Ready<Result<usize, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n % 10 < self.failing_per_10.load(Ordering::SeqCst) {
            ready(Err(io::Error::from(io::ErrorKind::ConnectionReset)))
        } else {
            ready(Ok(self.id))
        }
    }
}

type Balancer = Buffer<
    (),
    <Balance<
        tower_outlier::discover::OutlierDetectionDiscover<
            futures::channel::mpsc::UnboundedReceiver<
                Result<tower::discover::Change<usize, Gray>, Infallible>,
            >,
            tower_outlier::NetworkErrors,
            tower_outlier::probe::PassiveTrial,
        >,
        (),
    > as Service<()>>::Future,
>;

/// Five endpoints, #4 failing `failing_per_10` of every 10 calls, behind HSF's preset at 50 %.
fn setup(failing_per_10: usize) -> (OutlierDetectionLayer, RulesHandle, Balancer, Vec<Gray>) {
    let backends: Vec<Gray> = (0..5)
        .map(|id| Gray::new(id, if id == 4 { failing_per_10 } else { 0 }))
        .collect();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let rules = layer.rules();
    let services: Vec<(usize, Gray)> = backends.iter().map(|b| (b.id, b.clone())).collect();
    let balancer = Buffer::new(
        Balance::from_rng(layer.layer(announce(&services)), SeededRng(3)),
        16,
    );
    (layer, rules, balancer, backends)
}

async fn send(balancer: &Balancer, requests: usize) {
    for _ in 0..requests {
        let _ = balancer.clone().oneshot(()).await;
    }
}

fn threshold(rate: f64) -> ErrorRatePolicy {
    ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .error_rate_threshold(rate)
            .build()
            .unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_lower_threshold_ejects_the_endpoint_that_now_crosses_it_with_its_window() {
    let (layer, rules, balancer, backends) = setup(3);
    let monitor = layer.monitor();
    // Enough traffic that #4's window holds its minimum: 30 % is not above 50 %.
    send(&balancer, 100).await;
    let before = monitor.snapshot().get("4").unwrap().clone();
    assert_eq!(before.status, EndpointStatus::Available);
    assert!(before.windows[0].counts.calls >= 10, "{before:?}");
    let calls_before = backends[4].calls.load(Ordering::SeqCst);

    assert_eq!(rules.replace(0, threshold(0.2)).unwrap(), 1);
    // Behind the buffer the adaptor applies it on the next request, and judges #4 by the calls
    // its window already holds.
    send(&balancer, 1).await;
    let after = monitor.snapshot();
    let endpoint = after.get("4").unwrap();
    assert_eq!(after.rules_version, 1);
    assert_eq!(endpoint.status, EndpointStatus::Ejected, "{endpoint:?}");
    let reason = endpoint.last_reason.as_ref().unwrap();
    assert_eq!(reason.threshold, 0.2);
    assert!(reason.counts.calls >= 10, "the window was kept: {reason:?}");
    assert!(backends[4].calls.load(Ordering::SeqCst) <= calls_before + 1);
}

#[tokio::test(start_paused = true)]
async fn a_higher_threshold_keeps_an_ejected_endpoint_out_until_its_check() {
    let (layer, rules, balancer, backends) = setup(10);
    let monitor = layer.monitor();
    send(&balancer, 200).await;
    assert_eq!(
        monitor.snapshot().get("4").unwrap().status,
        EndpointStatus::Ejected
    );
    let next_check = monitor.snapshot().get("4").unwrap().next_check_in.unwrap();
    assert_eq!(next_check, Duration::from_secs(60));

    rules.replace(0, threshold(0.95)).unwrap();
    backends[4].failing_per_10.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let calls = backends[4].calls.load(Ordering::SeqCst);
    send(&balancer, 200).await;
    let endpoint = monitor.snapshot().get("4").unwrap().clone();
    assert_eq!(
        endpoint.status,
        EndpointStatus::Ejected,
        "not before its check"
    );
    assert_eq!(endpoint.next_check_in, Some(Duration::from_secs(30)));
    assert_eq!(backends[4].calls.load(Ordering::SeqCst), calls);
    tokio::time::sleep(Duration::from_secs(30)).await;
    send(&balancer, 200).await;
    assert_eq!(
        monitor.snapshot().get("4").unwrap().status,
        EndpointStatus::Trial
    );
    assert!(backends[4].calls.load(Ordering::SeqCst) > calls);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_document_keeps_the_rules_in_force_and_reports_why() {
    let (layer, rules, balancer, _backends) = setup(6);
    let hsf = Hsf::service(SERVICE);
    let error = rules
        .apply(&hsf, r#"{"DEFAULT": {"errorRateThreshold": 1.5}}"#)
        .unwrap_err();
    assert!(error.is_document());
    assert!(error.to_string().contains("errorRateThreshold"), "{error}");
    assert!(rules.apply(&hsf, "{ not json").is_err());
    assert_eq!(rules.version(), 0);
    let snapshot = layer.monitor().snapshot();
    assert_eq!(snapshot.rules_version, 0);
    assert!(snapshot.rules_error.unwrap().contains("HSF JSON"));
    // The rules in force still eject 60 % above 50 %.
    send(&balancer, 200).await;
    assert_eq!(
        layer.monitor().snapshot().get("4").unwrap().status,
        EndpointStatus::Ejected
    );
    // The next valid document clears the error.
    rules
        .apply(&hsf, r#"{"DEFAULT": {"errorRateThreshold": 0.4}}"#)
        .unwrap();
    assert_eq!(layer.monitor().snapshot().rules_error, None);
}

#[tokio::test(start_paused = true)]
async fn turning_the_policy_off_readmits_what_it_ejected() {
    let (layer, rules, balancer, backends) = setup(10);
    send(&balancer, 200).await;
    assert_eq!(
        layer.monitor().snapshot().get("4").unwrap().status,
        EndpointStatus::Ejected
    );
    let calls = backends[4].calls.load(Ordering::SeqCst);
    rules
        .apply(
            &Hsf::service(SERVICE),
            r#"{"DEFAULT": {"qosEnabled": false}}"#,
        )
        .unwrap();
    send(&balancer, 200).await;
    let endpoint = layer.monitor().snapshot().get("4").unwrap().clone();
    assert_eq!(endpoint.status, EndpointStatus::Trial, "{endpoint:?}");
    assert!(backends[4].calls.load(Ordering::SeqCst) > calls);
}

const ORDERS: &str = r#"[
  {"resource": "orders", "grade": 2, "count": 2, "minRequestAmount": 3,
   "statIntervalMs": 1000, "timeWindow": 10}
]"#;

#[tokio::test(start_paused = true)]
async fn a_sentinel_reload_keeps_an_unchanged_rules_open_breaker_open() {
    for (reload, keeps) in [
        (
            // The same rule for `orders`, a new resource beside it.
            r#"[
  {"resource": "payments", "grade": 2, "count": 3, "timeWindow": 5},
  {"resource": "orders", "grade": 2, "count": 2, "minRequestAmount": 3,
   "statIntervalMs": 1000, "timeWindow": 10}
]"#,
            true,
        ),
        (
            // `orders` with another error count: a fresh breaker.
            r#"[
  {"resource": "orders", "grade": 2, "count": 4, "minRequestAmount": 3,
   "statIntervalMs": 1000, "timeWindow": 10}
]"#,
            false,
        ),
    ] {
        let transitions: Arc<Mutex<Vec<(State, State)>>> = Arc::default();
        let seen = transitions.clone();
        let rule = parse_degrade_rules(ORDERS).unwrap().remove(0);
        let policy = SlowCallPolicy::new(rule.config().clone())
            .on_state_change(move |change| seen.lock().unwrap().push((change.from, change.to)));
        let layer = OutlierDetectionLayer::new(policy);
        let rules = layer.rules();
        let backends: Vec<Sleepy> = (0..3).map(|id| Sleepy::new(id, 5)).collect();
        backends[0].failing.store(true, Ordering::SeqCst);
        let services: Vec<(usize, Sleepy)> = backends.iter().map(|b| (b.id, b.clone())).collect();
        let balancer = Buffer::new(
            Balance::from_rng(layer.layer(announce(&services)), SeededRng(5)),
            16,
        );
        // #0 fails every call: more than two errors in a second open its breaker.
        let mut sent = 0;
        let ejected = |layer: &OutlierDetectionLayer| {
            layer
                .monitor()
                .snapshot()
                .get("0")
                .is_some_and(|e| e.status == EndpointStatus::Ejected)
        };
        while !ejected(&layer) {
            let call = balancer.clone().oneshot(());
            let _: Result<usize, BoxError> = call.await;
            sent += 1;
            assert!(sent < 500, "#0's breaker never opened");
        }
        tower_outlier::slow_call::wait_for_state_observers();
        assert_eq!(
            transitions.lock().unwrap().last(),
            Some(&(State::Closed, State::Open))
        );
        backends[0].failing.store(false, Ordering::SeqCst);

        rules.apply(&Sentinel::resource("orders"), reload).unwrap();
        let _ = balancer.clone().oneshot(()).await;
        assert_eq!(
            layer.monitor().snapshot().get("0").unwrap().status,
            EndpointStatus::Ejected,
            "ejected endpoints stay out until their check, whatever the rule"
        );
        // The open duration ends (10 s): re-admitted for its probe.
        tokio::time::sleep(Duration::from_secs(10)).await;
        for _ in 0..100 {
            let _ = balancer.clone().oneshot(()).await;
        }
        tower_outlier::slow_call::wait_for_state_observers();
        let after: Vec<(State, State)> = transitions.lock().unwrap()[1..].to_vec();
        if keeps {
            // The breaker taken over was open: the probe went through HALF_OPEN and closed it,
            // and the callbacks registered on the policy still hear it.
            assert_eq!(
                after,
                vec![
                    (State::Open, State::HalfOpen),
                    (State::HalfOpen, State::Closed)
                ],
            );
        } else {
            // A changed rule starts a closed breaker: nothing to probe.
            assert_eq!(after, vec![]);
        }
        assert_ne!(
            layer.monitor().snapshot().get("0").unwrap().status,
            EndpointStatus::Ejected
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_or_a_watch_channel_of_documents_feeds_the_rules() {
    let (layer, rules, _balancer, _backends) = setup(0);
    let hsf = Hsf::service(SERVICE);
    let documents = futures::stream::iter([
        r#"{"DEFAULT": {"errorRateThreshold": 0.4}}"#,
        r#"{"DEFAULT": {"errorRateThreshold": "high"}}"#,
        r#"{"DEFAULT": {"errorRateThreshold": 0.3}}"#,
    ]);
    rules.clone().follow(hsf.clone(), documents).await;
    // The refused document in the middle did not stop the stream.
    assert_eq!(rules.version(), 2);
    assert_eq!(layer.monitor().snapshot().rules_error, None);

    let (tx, rx) =
        tokio::sync::watch::channel(r#"{"DEFAULT": {"errorRateThreshold": 0.25}}"#.to_string());
    let follower = tokio::spawn(rules.clone().follow_watch(hsf, rx));
    tokio::task::yield_now().await;
    assert_eq!(
        rules.version(),
        3,
        "the value the channel holds is applied at once"
    );
    tx.send(r#"{"DEFAULT": {"errorRateThreshold": 0.2}}"#.to_string())
        .unwrap();
    tokio::task::yield_now().await;
    assert_eq!(rules.version(), 4);
    drop(tx);
    follower.await.unwrap();
    let policies = rules.policies();
    assert!(
        format!("{:?}", policies[0]).contains("threshold: 0.2"),
        "{policies:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_clone_extended_with_a_policy_leaves_the_original_alone() {
    let layer = OutlierDetectionLayer::new(threshold(0.5));
    let extended = layer.clone().with_policy(threshold(0.3));
    assert_eq!(layer.rules().policies().len(), 1);
    assert_eq!(extended.rules().policies().len(), 2);
    // Clones without new policies share the rules: one handle changes both.
    let twin = layer.clone();
    layer.rules().replace(0, threshold(0.2)).unwrap();
    assert_eq!(twin.rules().version(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_adaptor_built_after_a_change_shows_the_version_it_runs() {
    let layer = OutlierDetectionLayer::new(threshold(0.5));
    layer.rules().replace(0, threshold(0.2)).unwrap();
    let mut h = support::Harness::new(&layer, 3);
    h.sync();
    assert_eq!(layer.monitor().snapshot().rules_version, 1);
}

/// A misspelt key in a runtime HSF document is accepted as HSF would (ignored) but noted, with
/// the key it likely meant; a document leaving detection off says so; the strict dialect refuses
/// both typos and keeps the rules in force; a clean document clears the notes.
#[test]
fn hsf_and_sentinel_typos_are_noted_or_refused() {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let (rules, monitor) = (layer.rules(), layer.monitor());
    let typo = r#"{"DEFAULT": {"qosEnabled": true, "errorRateThreshhold": 0.1}}"#;
    let version = rules.apply(&Hsf::service(SERVICE), typo).unwrap();
    assert_eq!(
        monitor.snapshot().rules_notes,
        ["unknown key `DEFAULT.errorRateThreshhold` ignored (did you mean `errorRateThreshold`?)"]
    );

    let error = rules
        .apply(&Hsf::service(SERVICE).strict(), typo)
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("did you mean `errorRateThreshold`"),
        "{error}"
    );
    assert_eq!(rules.version(), version, "refused: the rules in force stay");

    rules
        .apply(
            &Hsf::service(SERVICE),
            r#"{"DEFAULT": {"errorRateThreshold": 0.1}}"#,
        )
        .unwrap();
    let notes = monitor.snapshot().rules_notes;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].starts_with("detection is off for `com.example.Orders:1.0.0`"));

    rules
        .apply(
            &Hsf::service(SERVICE).strict(),
            r#"{"DEFAULT": {"qosEnabled": true, "errorRateThreshold": 0.1}}"#,
        )
        .unwrap();
    assert!(
        monitor.snapshot().rules_notes.is_empty(),
        "a clean document clears them"
    );

    let breaker = OutlierDetectionLayer::new(SlowCallPolicy::new(
        parse_degrade_rules(
            r#"[{"resource": "orders", "grade": 0, "count": 50, "timeWindow": 10}]"#,
        )
        .unwrap()[0]
            .config()
            .clone(),
    ));
    let sentinel_typo = r#"[{"resource": "orders", "grade": 0, "count": 50, "timeWindow": 10, "slowRatioThreshhold": 0.2}]"#;
    assert!(breaker
        .rules()
        .apply(&Sentinel::resource("orders").strict(), sentinel_typo)
        .is_err());
    breaker
        .rules()
        .apply(&Sentinel::resource("orders"), sentinel_typo)
        .unwrap();
    let notes = breaker.monitor().snapshot().rules_notes;
    assert_eq!(
        notes,
        ["unknown field `slowRatioThreshhold` of the rule for `orders` ignored (did you mean `slowRatioThreshold`?)"]
    );
}

/// A policy named like the error-rate policy but of another type: a document of a dialect that
/// configures error-rate policies finds none of its type and is refused, the rules in force
/// staying; with the right type in a later slot of the same name, that slot is the one replaced.
#[test]
fn a_dialect_replaces_only_a_policy_of_its_own_type() {
    use tower_outlier::policy::{
        Description, EndpointPolicy, Judgement, Nanos, Observation, OutlierPolicy,
        RecoverySchedule, Signal,
    };

    #[derive(Debug)]
    struct Impostor;
    #[derive(Debug)]
    struct Calm;
    impl EndpointPolicy for Calm {
        fn record(&self, _: &Observation, _: Nanos) -> Signal {
            Signal::None
        }
        fn judge(&self, _: Nanos) -> Judgement {
            Judgement::Healthy
        }
        fn describe(&self, _: Nanos) -> Description {
            Description::default()
        }
        fn reset(&self) {}
    }
    impl OutlierPolicy for Impostor {
        type Endpoint = Calm;
        fn name(&self) -> &'static str {
            ErrorRatePolicy::NAME
        }
        fn new_endpoint(&self) -> Calm {
            Calm
        }
        fn recovery(&self) -> RecoverySchedule {
            RecoverySchedule::fixed(Duration::from_secs(30))
        }
        fn trial_period(&self) -> Duration {
            Duration::from_secs(10)
        }
    }

    let document = r#"{"DEFAULT": {"qosEnabled": true, "errorRateThreshold": 0.2}}"#;
    let alone = OutlierDetectionLayer::new(Impostor);
    let error = alone
        .rules()
        .apply(&Hsf::service("Orders:1.0"), document)
        .unwrap_err();
    assert!(!error.is_document());
    assert!(error.to_string().contains("is not of the type"), "{error}");
    assert_eq!(alone.rules().version(), 0);

    let both = OutlierDetectionLayer::new(Impostor).with_policy(threshold(0.5));
    assert_eq!(
        both.rules()
            .apply(&Hsf::service("Orders:1.0"), document)
            .unwrap(),
        1
    );
    let policies = both.rules().policies();
    assert!(policies[0].downcast_ref::<Impostor>().is_some());
    let replaced = policies[1].downcast_ref::<ErrorRatePolicy>().unwrap();
    assert_eq!(replaced.config().error_rate_threshold(), 0.2);
}
