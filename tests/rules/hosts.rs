//! HSF's `ipDimension`: two services' layers sharing their hosts (`HostRegistry`), on tokio's
//! paused clock. A host ejected in one service is ejected in the other, within its own rules, and
//! comes back in both; with the sharing off, only the service that saw the failures ejects.

use crate::support;

use std::time::Duration;

use support::Harness;
use tower_outlier::hosts::{HostOf, HostRegistry};
use tower_outlier::policy::{BudgetFloor, EjectionBudget};
use tower_outlier::{
    EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer, WhenAllOut,
};

/// Endpoint `n` of every service runs on host `n`.
fn host_of() -> HostOf {
    HostOf::new(|key: &usize| Some(format!("10.0.0.{key}")))
}

fn layer() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .recovery_unit(Duration::from_secs(30))
            .build()
            .unwrap(),
    ))
}

fn status(layer: &OutlierDetectionLayer, id: usize) -> EndpointStatus {
    layer
        .monitor()
        .snapshot()
        .get(&id.to_string())
        .unwrap()
        .status
}

#[tokio::test(start_paused = true)]
async fn a_host_ejected_in_one_service_is_ejected_in_every_service_sharing_it() {
    let hosts = HostRegistry::new();
    let orders = layer().share_hosts(hosts.clone(), host_of());
    let payments = layer().share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);

    // Host 10.0.0.2 fails the orders service's calls.
    o.calls(2, 10, 0).await;
    assert!(!o.is_live(2));
    assert_eq!(hosts.ejected_hosts(), vec!["10.0.0.2".to_string()]);
    // The payments service's adaptor follows on its next poll, without a single failure of its
    // own.
    p.sync();
    assert!(!p.is_live(2));
    let snapshot = payments.monitor().snapshot();
    let endpoint = snapshot.get("2").unwrap();
    assert_eq!(endpoint.status, EndpointStatus::Ejected);
    let reason = endpoint.last_reason.as_ref().unwrap();
    assert_eq!(
        (reason.policy, reason.measure),
        ("hosts", "host ejected in another service")
    );
    assert_eq!(p.backend(2).calls(), 0);

    // Orders checks the host after 30 s: re-admitted on trial there, so back in payments too.
    o.advance(Duration::from_secs(30)).await;
    assert_eq!(status(&orders, 2), EndpointStatus::Trial);
    assert!(hosts.ejected_hosts().is_empty());
    p.sync();
    assert!(p.is_live(2));
    assert_eq!(status(&payments, 2), EndpointStatus::Trial);
}

#[tokio::test(start_paused = true)]
async fn without_sharing_only_the_service_that_saw_the_failures_ejects() {
    let hosts = HostRegistry::new();
    let orders = layer().share_hosts(hosts.clone(), host_of());
    // Payments runs with ipDimension off.
    let payments = layer();
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    o.calls(2, 10, 0).await;
    assert!(!o.is_live(2));
    p.sync();
    assert!(p.is_live(2));
    assert_eq!(status(&payments, 2), EndpointStatus::Available);

    // And a sharing service that joins later holds the host out from the start.
    let shipping = layer().share_hosts(hosts.clone(), host_of());
    let s = Harness::new(&shipping, 5);
    assert!(!s.is_live(2));
}

#[tokio::test(start_paused = true)]
async fn each_service_keeps_its_own_budget_and_last_endpoint() {
    let hosts = HostRegistry::new();
    let orders = layer().share_hosts(hosts.clone(), host_of());
    // Payments may eject nobody: 0 % with no floor.
    let payments = layer()
        .budget(EjectionBudget::new(0.0, BudgetFloor::Zero).unwrap())
        .share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    o.calls(2, 10, 0).await;
    assert!(!o.is_live(2));
    p.sync();
    assert!(p.is_live(2), "payments' budget keeps its endpoint in");
    // When the orders service drops its adaptor, it holds nothing out any more.
    drop(o);
    assert!(hosts.ejected_hosts().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_first_endpoint_discovered_on_a_held_out_host_is_ejected_once_there_is_room() {
    let hosts = HostRegistry::new();
    let orders = layer().share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    o.calls(0, 10, 0).await;
    assert!(!o.is_live(0));
    // Shipping discovers host 10.0.0.0 first: alone, it cannot be ejected (the last endpoint)…
    let shipping = layer().share_hosts(hosts.clone(), host_of());
    let s = Harness::new(&shipping, 5);
    // …but once the others arrive there is room, and it is.
    assert!(!s.is_live(0));
    assert_eq!(s.live_ids(), vec![1, 2, 3, 4]);
}

#[tokio::test(start_paused = true)]
async fn a_host_stays_out_while_any_endpoint_on_it_is_ejected() {
    let hosts = HostRegistry::new();
    // Keys 2 and 3 are two ports of one host.
    let pair = || HostOf::new(|key: &usize| Some(format!("10.0.0.{}", key.min(&3) / 2)));
    let orders = layer()
        .budget(EjectionBudget::new(0.5, BudgetFloor::Zero).unwrap())
        .share_hosts(hosts.clone(), pair());
    let mut o = Harness::new(&orders, 6);
    o.calls(2, 10, 0).await;
    o.advance(Duration::from_secs(10)).await;
    o.calls(3, 10, 0).await;
    assert!(!o.is_live(2) && !o.is_live(3));
    // #2's check comes first: back on trial, but #3 still holds the host out.
    o.advance(Duration::from_secs(20)).await;
    assert_eq!(status(&orders, 2), EndpointStatus::Trial);
    assert_eq!(status(&orders, 3), EndpointStatus::Ejected);
    assert_eq!(hosts.ejected_hosts(), vec!["10.0.0.1".to_string()]);
    o.advance(Duration::from_secs(10)).await;
    assert!(hosts.ejected_hosts().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_last_endpoint_stays_and_new_rules_leave_held_out_endpoints_alone() {
    let hosts = HostRegistry::new();
    let orders = layer().share_hosts(hosts.clone(), host_of());
    let payments = layer().share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    // Payments runs on host 10.0.0.2 alone.
    let mut p = Harness::new(&payments, 0);
    p.insert(2);
    p.sync();
    o.calls(2, 10, 0).await;
    p.sync();
    assert!(p.is_live(2), "never the last endpoint");
    p.insert(4);
    p.sync();
    assert!(!p.is_live(2), "ejected once another endpoint is there");
    // New rules in payments: the endpoint held out for its host stays out, with no panic.
    payments
        .rules()
        .replace(
            0,
            ErrorRatePolicy::new(ErrorRateConfig::hsf().enabled(false).build().unwrap()),
        )
        .unwrap();
    p.sync();
    assert!(!p.is_live(2));
    o.advance(Duration::from_secs(30)).await;
    p.sync();
    assert!(p.is_live(2), "back with its host");
}

#[tokio::test(start_paused = true)]
async fn a_service_refusing_a_held_out_host_says_so_again_at_the_hosts_next_outage() {
    let hosts = HostRegistry::new();
    let orders = layer().share_hosts(hosts.clone(), host_of());
    // Payments may eject nobody: it keeps the host in and says so.
    let payments = layer()
        .budget(EjectionBudget::new(0.0, BudgetFloor::Zero).unwrap())
        .share_hosts(hosts.clone(), host_of());
    let refusals = std::sync::Arc::new(std::sync::Mutex::new(0));
    let seen = refusals.clone();
    payments.monitor().on_event(move |event| {
        if matches!(event, tower_outlier::events::Event::EjectionRefused { key, .. } if key.as_str() == "2")
        {
            *seen.lock().unwrap() += 1;
        }
    });
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    o.calls(2, 10, 0).await;
    p.sync();
    p.sync();
    assert_eq!(*refusals.lock().unwrap(), 1, "once per outage");
    // The host comes back (re-admitted on trial in orders) and fails again.
    o.advance(Duration::from_secs(30)).await;
    assert!(hosts.ejected_hosts().is_empty());
    p.sync();
    o.calls(2, 10, 0).await;
    assert_eq!(hosts.ejected_hosts(), vec!["10.0.0.2".to_string()]);
    p.sync();
    assert!(p.is_live(2));
    assert_eq!(
        *refusals.lock().unwrap(),
        2,
        "the second outage is reported too"
    );
}

/// The HSF document two services read: `ipDimension` on (or off), a minimum of 10 calls.
fn hsf_layer(ip_dimension: bool, service: &str) -> OutlierDetectionLayer {
    let document = format!(
        r#"{{ "DEFAULT": {{ "qosEnabled": true, "requestThreshold": 10, "errorRateThreshold": 0.5,
              "maxIsolationRate": 0.4, "isolationTime": 30000, "ipDimension": {ip_dimension} }} }}"#
    );
    let hsf = tower_outlier::error_rate::HsfQosConfig::from_json(&document).unwrap();
    OutlierDetectionLayer::new(ErrorRatePolicy::new(hsf.service(service).unwrap()))
}

/// HSF's `ipDimension: true` in both services' document: a host failing 6 calls in one service
/// and 4 in the other — fewer than the minimum of 10 in either, 10 on the host — is judged once,
/// on the host's 10 calls, and held out of both; both services' snapshots show the host's one
/// window. With `ipDimension: false`, the same calls eject nothing (each service saw fewer than
/// 10).
#[tokio::test(start_paused = true)]
async fn with_ip_dimension_a_host_is_judged_on_every_services_calls() {
    for by_host in [true, false] {
        let hosts = HostRegistry::new();
        let orders = hsf_layer(by_host, "orders:1.0.0").share_hosts(hosts.clone(), host_of());
        let payments = hsf_layer(by_host, "payments:1.0.0").share_hosts(hosts.clone(), host_of());
        let mut o = Harness::new(&orders, 5);
        let mut p = Harness::new(&payments, 5);
        o.calls(2, 6, 0).await;
        p.calls(2, 4, 0).await;
        o.sync();
        p.sync();
        if by_host {
            assert!(!o.is_live(2) && !p.is_live(2), "held out of both");
            assert_eq!(hosts.ejected_hosts(), vec!["10.0.0.2".to_string()]);
            for layer in [&orders, &payments] {
                let snapshot = layer.monitor().snapshot();
                let window = &snapshot.get("2").unwrap().windows[0];
                assert_eq!(
                    (window.counts.calls, window.counts.failures),
                    (10, 10),
                    "the host's window, in both"
                );
            }
            // Judged by the error-rate rule on the host's calls in the service that judged
            // first; the other holds it out for its host or by the same window's verdict.
            let reason = orders
                .monitor()
                .snapshot()
                .get("2")
                .unwrap()
                .last_reason
                .clone()
                .unwrap();
            assert_eq!(reason.policy, "error-rate", "{reason:?}");
            // Other hosts are judged on their own calls, per host too.
            assert!(o.is_live(1) && p.is_live(1));
        } else {
            assert!(
                o.is_live(2) && p.is_live(2),
                "each service saw fewer than its 10"
            );
            assert!(hosts.ejected_hosts().is_empty());
        }
    }
}

/// The same through two real p2c balancers, serial traffic in turn: host 2 fails every call in
/// both services. With `ipDimension`, its window is the host's: the two services together reach
/// the minimum, and it is out of both after fewer failed calls in each than the minimum alone
/// would take (10 per service without it).
#[tokio::test(start_paused = true)]
async fn with_ip_dimension_two_balancers_eject_a_failing_host_together() {
    use tower::{Service, ServiceExt};

    async fn failed_before_out(by_host: bool) -> (usize, usize) {
        let hosts = HostRegistry::new();
        let orders = hsf_layer(by_host, "orders:1.0.0").share_hosts(hosts.clone(), host_of());
        let payments = hsf_layer(by_host, "payments:1.0.0").share_hosts(hosts.clone(), host_of());
        let o_backends: Vec<support::Backend> = (0..5).map(support::Backend::new).collect();
        let p_backends: Vec<support::Backend> = (0..5).map(support::Backend::new).collect();
        o_backends[2].set_failing(true);
        p_backends[2].set_failing(true);
        let announce = |backends: &[support::Backend]| {
            support::announce(
                &backends
                    .iter()
                    .map(|b| (b.id, b.clone()))
                    .collect::<Vec<_>>(),
            )
        };
        let mut o = tower::balance::p2c::Balance::from_rng(
            tower::Layer::layer(&orders, announce(&o_backends)),
            support::SeededRng(3),
        );
        let mut p = tower::balance::p2c::Balance::from_rng(
            tower::Layer::layer(&payments, announce(&p_backends)),
            support::SeededRng(5),
        );
        for _ in 0..2_000 {
            let _ = o.ready().await.unwrap().call(()).await;
            let _ = p.ready().await.unwrap().call(()).await;
            tokio::time::advance(Duration::from_millis(5)).await;
            if hosts.ejected_hosts() == vec!["10.0.0.2".to_string()]
                && status(&orders, 2) == EndpointStatus::Ejected
                && status(&payments, 2) == EndpointStatus::Ejected
            {
                break;
            }
        }
        assert_eq!(
            status(&orders, 2),
            EndpointStatus::Ejected,
            "by_host {by_host}"
        );
        assert_eq!(
            status(&payments, 2),
            EndpointStatus::Ejected,
            "by_host {by_host}"
        );
        (o_backends[2].calls(), p_backends[2].calls())
    }
    let (o, p) = failed_before_out(true).await;
    assert!(o + p <= 12 && o < 10 && p < 10, "by host: {o} + {p}");
    let (o, p) = failed_before_out(false).await;
    // Without it, each service needs its own minimum (or follows the other's host ejection).
    assert!(o.max(p) >= 10, "per endpoint: {o} + {p}");
}

/// `ipDimension` turned on at runtime (a new HSF document in both services): the endpoints
/// already there move to their hosts' windows, carrying their history (the first endpoint of a
/// host to move brings its own), and a host failing in both services is then judged on both
/// services' calls; turned off again, each endpoint is judged on its own calls.
#[tokio::test(start_paused = true)]
async fn ip_dimension_follows_new_rules() {
    let hosts = HostRegistry::new();
    let orders = hsf_layer(false, "orders:1.0.0").share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(false, "payments:1.0.0").share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    // Orders saw 6 failures of host 2 before the change: they stay in its window.
    o.calls(2, 6, 0).await;
    let policy = |on: bool| {
        let layer_rules = hsf_layer(on, "any:1.0.0");
        layer_rules.rules().policies()[0].clone()
    };
    orders.rules().replace_arc(0, policy(true)).unwrap();
    payments.rules().replace_arc(0, policy(true)).unwrap();
    o.sync();
    p.sync();
    // The host's window is orders' 6 (carried over): 4 more from payments reach the minimum.
    p.calls(2, 4, 0).await;
    o.sync();
    p.sync();
    assert!(!o.is_live(2) && !p.is_live(2), "held out of both");

    // Off again: each endpoint on its own calls (host 3: 6 failures in each, 10 needed).
    orders.rules().replace_arc(0, policy(false)).unwrap();
    payments.rules().replace_arc(0, policy(false)).unwrap();
    o.sync();
    p.sync();
    o.calls(3, 6, 0).await;
    p.calls(3, 6, 0).await;
    o.sync();
    p.sync();
    assert!(o.is_live(3) && p.is_live(3), "judged per endpoint again");
}

/// The HSF document's error-rate rule, `ipDimension` as given.
fn by_host_policy(ip: bool) -> ErrorRatePolicy {
    let doc = format!(
        r#"{{ "DEFAULT": {{ "qosEnabled": true, "requestThreshold": 10, "errorRateThreshold": 0.5,
              "maxIsolationRate": 0.4, "isolationTime": 30000, "ipDimension": {ip} }} }}"#
    );
    let hsf = tower_outlier::error_rate::HsfQosConfig::from_json(&doc).unwrap();
    ErrorRatePolicy::new(hsf.service("svc:1").unwrap())
}

fn by_host_snap(layer: &OutlierDetectionLayer, id: usize) -> (EndpointStatus, u64, u64) {
    let s = layer.monitor().snapshot();
    let e = s.get(&id.to_string()).unwrap();
    (
        e.status,
        e.windows[0].counts.calls,
        e.windows[0].counts.failures,
    )
}

/// With ipDimension, a host judged on another service's calls alone never takes this service's
/// last endpoint, even under fail-fast (as following another service's host ejection never
/// does): a fail-fast service on one host is not emptied by another service's failures.
#[tokio::test(start_paused = true)]
async fn a_host_judged_by_another_service_never_empties_a_fail_fast_one() {
    for by_host in [false, true] {
        let hosts = HostRegistry::new();
        let orders = OutlierDetectionLayer::new(by_host_policy(by_host))
            .share_hosts(hosts.clone(), host_of());
        let payments = OutlierDetectionLayer::new(by_host_policy(by_host))
            .budget(EjectionBudget::new(1.0, BudgetFloor::One).unwrap())
            .when_all_out(WhenAllOut::FailFast)
            .share_hosts(hosts.clone(), host_of());
        let mut o = Harness::new(&orders, 5);
        let mut p = Harness::new(&payments, 0);
        p.insert(2); // payments runs on host 2 alone and has made no call
        p.sync();
        o.calls(2, 10, 0).await;
        p.sync();
        eprintln!(
            "ipDimension {by_host}: payments {:?}, live {:?}",
            by_host_snap(&payments, 2),
            p.live_ids()
        );
        assert!(
            p.is_live(2),
            "ipDimension {by_host}: payments emptied by orders' failures"
        );
    }
}

/// A dry-run layer's shadow re-admission leaves the host window an enforcing layer judges by
/// as it was: dry run changes nothing for real.
#[tokio::test(start_paused = true)]
async fn a_dry_run_readmission_keeps_the_hosts_evidence() {
    let hosts = HostRegistry::new();
    let orders =
        OutlierDetectionLayer::new(by_host_policy(true)).share_hosts(hosts.clone(), host_of());
    let payments =
        OutlierDetectionLayer::new(by_host_policy(true)).share_hosts(hosts.clone(), host_of());
    payments.rules().set_dry_run(true);
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    p.calls(2, 10, 0).await; // payments (dry run) shadow-ejects host 2 at t0
    o.advance(Duration::from_secs(25)).await; // the 10 s window ages out
    p.sync();
    o.calls(2, 9, 0).await; // orders: 9 failures, one short of its minimum
    o.advance(Duration::from_secs(5)).await; // t0 + 30: payments' shadow check
    p.sync();
    eprintln!(
        "orders' window after payments' shadow re-admission: {:?}",
        by_host_snap(&orders, 2)
    );
    o.calls_while_live(2, 1, 0).await;
    eprintln!(
        "after orders' 10th failure in a row: {:?}",
        by_host_snap(&orders, 2)
    );
    assert!(
        !o.is_live(2),
        "10 failures of 10 in orders' own calls, still in"
    );
}

/// An operator's force-out and release in one service keep the evidence another service's
/// calls put in the host window.
#[tokio::test(start_paused = true)]
async fn an_operators_release_keeps_the_hosts_evidence() {
    let hosts = HostRegistry::new();
    let orders =
        OutlierDetectionLayer::new(by_host_policy(true)).share_hosts(hosts.clone(), host_of());
    let payments =
        OutlierDetectionLayer::new(by_host_policy(true)).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    o.calls(2, 9, 0).await;
    payments.rules().force_out(&2usize);
    p.sync();
    payments.rules().release(&2usize);
    p.sync();
    o.calls_while_live(2, 1, 0).await;
    eprintln!(
        "orders after its 10th failure: {:?}",
        by_host_snap(&orders, 2)
    );
    assert!(
        !o.is_live(2),
        "orders' 9 failures were wiped by payments' operator"
    );
}
