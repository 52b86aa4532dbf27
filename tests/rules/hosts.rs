//! HSF's `ipDimension`: two services' layers sharing their hosts (`HostRegistry`), on tokio's
//! paused clock. A host ejected in one service is ejected in the other, within its own rules, and
//! comes back in both; with the sharing off, only the service that saw the failures ejects.

use crate::support;

use std::time::Duration;

use support::Harness;
use tower_outlier::hosts::{HostOf, HostRegistry};
use tower_outlier::policy::{BudgetFloor, EjectionBudget};
use tower_outlier::{EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

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
