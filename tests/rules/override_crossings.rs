//! Operator overrides (force out, force in, release, back-off reset) where they cross other
//! rules, on tokio's paused clock: an unready endpoint forced out is removed; a release or a
//! force-in against a host another service holds out; every control change wakes the adaptor and
//! p2c sees it on its next poll; a force-in aborts the probe in flight; a key forced out before it
//! joins on a held-out host is removed and counted once, and comes back when released, in dry run
//! too; a reset is applied once, not replayed by later adaptors.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Harness, Seen};
use tower_outlier::events::Event;
use tower_outlier::EndpointStatus;

use super::dry_run_crossings::{host_of, hsf_layer, two_policy_layer};

const SECOND: Duration = Duration::from_secs(1);

// An endpoint whose own service fails poll_ready is forced out: removing it takes nothing the
// balancer can pick, so it is not kept in as "the last available endpoint".
#[tokio::test(start_paused = true)]
async fn an_unready_endpoint_forced_out_is_kept_in_as_the_last_available() {
    let layer = hsf_layer(0.5);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 2);
    h.backend(1).set_broken(true);
    h.poll_ready_all();
    assert_eq!(
        layer.monitor().snapshot().get("1").unwrap().status,
        EndpointStatus::Unready
    );
    rules.force_out(&1usize);
    h.sync();
    assert!(
        !h.is_live(1),
        "forced out, broken, and endpoint 0 serves: still in the set; {:?}",
        layer.monitor().snapshot().get("1").unwrap().refused
    );
}

// Released from a forced out while its host is held out elsewhere: it is held out for its host
// again (as an enforcing layer joining now holds it out).
#[tokio::test(start_paused = true)]
async fn release_ignores_a_host_held_out_elsewhere() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    payments.rules().force_out(&2usize);
    p.sync();
    assert!(!p.is_live(2));
    o.calls_while_live(2, 10, 0).await;
    assert!(!o.is_live(2));
    p.sync();
    payments.rules().release(&2usize);
    p.sync();
    p.advance(SECOND).await;
    assert!(
        !p.is_live(2),
        "released while its host is out elsewhere: back in the set; {:?}",
        payments.monitor().snapshot().get("2")
    );
}

// Every control change wakes the adaptor's task, and takes effect on the next poll.
#[tokio::test(start_paused = true)]
async fn every_control_change_wakes_the_adaptor() {
    let layer = two_policy_layer();
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(1, 10, 0).await;
    type Change = (&'static str, Box<dyn Fn()>);
    let changes: Vec<Change> = vec![
        (
            "dry on",
            Box::new({
                let r = rules.clone();
                move || r.set_dry_run(true)
            }),
        ),
        (
            "policy dry",
            Box::new({
                let r = rules.clone();
                move || r.set_policy_dry_run(1, true).unwrap()
            }),
        ),
        (
            "dry off",
            Box::new({
                let r = rules.clone();
                move || r.set_dry_run(false)
            }),
        ),
        (
            "force out",
            Box::new({
                let r = rules.clone();
                move || r.force_out(&3usize)
            }),
        ),
        (
            "force in",
            Box::new({
                let r = rules.clone();
                move || r.force_in(&3usize)
            }),
        ),
        (
            "release",
            Box::new({
                let r = rules.clone();
                move || r.release(&3usize)
            }),
        ),
        (
            "reset",
            Box::new({
                let r = rules.clone();
                move || r.reset_backoff(&1usize)
            }),
        ),
        (
            "force out unknown",
            Box::new({
                let r = rules.clone();
                move || r.force_out(&"nope")
            }),
        ),
        (
            "policy dry off",
            Box::new({
                let r = rules.clone();
                move || r.set_policy_dry_run(1, false).unwrap()
            }),
        ),
    ];
    for (name, change) in changes {
        h.sync();
        assert!(!h.task.is_woken(), "{name}: woken before");
        change();
        assert!(h.task.is_woken(), "{name}: the adaptor was not woken");
        h.sync();
    }
}

// p2c picks up a force_out on its next poll_ready, and a release.
#[tokio::test(start_paused = true)]
async fn p2c_sees_force_out_and_release_on_its_next_poll() {
    use tower::{Service, ServiceExt};
    let layer = hsf_layer(0.2);
    let rules = layer.rules();
    let backends: Vec<support::Backend> = (0..3).map(support::Backend::new).collect();
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for (id, backend) in backends.iter().enumerate() {
        tx.unbounded_send(Ok::<_, std::convert::Infallible>(
            tower::discover::Change::Insert(id, backend.clone()),
        ))
        .unwrap();
    }
    let mut balance = tower::balance::p2c::Balance::new(tower::Layer::layer(&layer, rx));
    balance.ready().await.unwrap();
    assert_eq!(balance.len(), 3);
    // All three forced out: the last stays.
    for id in 0..3usize {
        rules.force_out(&id);
    }
    balance.ready().await.unwrap();
    assert_eq!(
        balance.len(),
        1,
        "forced out on the next poll, the last kept"
    );
    for _ in 0..50 {
        let _ = balance.ready().await.unwrap().call(()).await;
    }
    let served: Vec<usize> = backends.iter().map(|b| b.calls()).collect();
    assert_eq!(served.iter().filter(|&&c| c > 0).count(), 1, "{served:?}");
    for id in 0..3usize {
        rules.release(&id);
    }
    balance.ready().await.unwrap();
    assert_eq!(balance.len(), 3, "released on the next poll");
    // Dry run on with everything forced out: still never empty, and dry run off changes nothing.
    for id in 0..3usize {
        rules.force_out(&id);
    }
    rules.set_dry_run(true);
    balance.ready().await.unwrap();
    assert_eq!(balance.len(), 1);
    rules.set_dry_run(false);
    balance.ready().await.unwrap();
    assert_eq!(balance.len(), 1);
    drop(tx);
}

// Forcing in an endpoint whose active probe is in flight aborts the probe, as a force-out or a
// budget re-admission does.
#[tokio::test(start_paused = true)]
async fn force_in_does_not_abort_the_probe_in_flight() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower_outlier::probe::{probe_fn, ProbeFuture};
    let finished = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let (f, s) = (finished.clone(), started.clone());
    let layer = hsf_layer(0.4)
        .probe(probe_fn(
            move |_: &usize, _: support::Backend| -> ProbeFuture {
                s.fetch_add(1, Ordering::SeqCst);
                let f = f.clone();
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    f.fetch_add(1, Ordering::SeqCst);
                    false
                })
            },
        ))
        // The probe starts at HSF's 5 s exactly (no jitter on the checks).
        .probe_cadence(tower_outlier::probe::ProbeCadence::new().interval_jitter_percent(0));
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(1, 10, 0).await;
    assert!(!h.is_live(1));
    h.advance(5 * SECOND).await;
    assert_eq!(started.load(Ordering::SeqCst), 1);
    assert_eq!(
        layer.monitor().snapshot().get("1").unwrap().status,
        EndpointStatus::Probing
    );
    rules.force_in(&1usize);
    h.sync();
    assert!(h.is_live(1));
    h.advance(4 * SECOND).await;
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the abandoned probe ran to its end against the endpoint"
    );
}

// An endpoint forced in stays in when another service sharing its host holds the host out.
#[tokio::test(start_paused = true)]
async fn forced_in_stays_in_when_its_host_is_held_out() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 5);
    let mut p = Harness::new(&payments, 5);
    payments.rules().force_in(&2usize);
    p.sync();
    o.calls_while_live(2, 10, 0).await;
    assert!(!o.is_live(2));
    p.sync();
    assert!(
        p.is_live(2),
        "forced in, yet ejected for its host: {:?}",
        payments
            .monitor()
            .snapshot()
            .get("2")
            .map(|e| (e.status, e.forced, e.last_reason.clone()))
    );
}

// A key forced out before it is discovered, on a host another service holds out: on insert the
// balancer gets it and one Remove, and the engine counts one ejection for it.
#[tokio::test(start_paused = true)]
async fn forced_out_key_joining_on_a_host_held_out_is_removed_once() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.5).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 10);
    o.calls_while_live(9, 10, 0).await;
    assert!(!o.is_live(9));
    let mut p = Harness::new(&payments, 3);
    payments.rules().force_out(&9usize);
    p.sync();
    p.insert(9);
    p.sync();
    let of_nine: Vec<Seen> = p
        .seen
        .iter()
        .filter(|(_, s)| matches!(s, Seen::Insert(9) | Seen::Remove(9)))
        .map(|(_, s)| s.clone())
        .collect();
    let ejected = p.adaptor.ejected();
    assert!(
        of_nine == vec![Seen::Insert(9), Seen::Remove(9)] && ejected == 1,
        "balancer saw {of_nine:?}; engine counts {ejected} ejected for one endpoint out"
    );
}

// The same in dry run: released, the endpoint comes back into the balancer's set.
#[tokio::test(start_paused = true)]
async fn forced_out_key_joining_on_a_host_held_out_in_dry_run_comes_back_when_released() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.5).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 10);
    o.calls_while_live(9, 10, 0).await;
    let mut p = Harness::new(&payments, 3);
    payments.rules().set_dry_run(true);
    payments.rules().force_out(&9usize);
    p.sync();
    p.insert(9);
    p.sync();
    // Released: it should come back into the balancer's set.
    payments.rules().release(&9usize);
    p.sync();
    let nine = payments.monitor().snapshot().get("9").unwrap().clone();
    assert!(
        p.is_live(9),
        "released, never back in the set: status {:?} would_be {:?} forced {:?}; engine counts {} ejected; seen {:?}",
        nine.status,
        nine.would_be,
        nine.forced,
        p.adaptor.ejected(),
        p.seen.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>()
    );
}

// The same, then the upstream removes everything: the ejection count is one after the insert,
// none after the key's removal, and never underflows.
#[tokio::test(start_paused = true)]
async fn the_ejection_count_never_underflows_as_the_upstream_empties() {
    use tower_outlier::hosts::HostRegistry;
    let hosts = HostRegistry::new();
    let orders = hsf_layer(0.4).share_hosts(hosts.clone(), host_of());
    let payments = hsf_layer(0.5).share_hosts(hosts.clone(), host_of());
    let mut o = Harness::new(&orders, 10);
    o.calls_while_live(9, 10, 0).await;
    let mut p = Harness::new(&payments, 3);
    payments.rules().force_out(&9usize);
    p.sync();
    p.insert(9);
    p.sync();
    let ejected = p.adaptor.ejected();
    p.remove(9);
    p.sync();
    let after = p.adaptor.ejected();
    p.remove(0);
    p.sync();
    p.remove(1);
    p.sync();
    p.remove(2);
    p.sync();
    assert_eq!(
        (ejected, after),
        (1, 0),
        "ejection count after insert, after removal"
    );
}

// A back-off reset asked once is applied once: an adaptor made from the layer later (each starts
// with no reset applied) does not replay it, with an Operator event nobody asked for.
#[tokio::test(start_paused = true)]
async fn a_reset_is_not_replayed_by_a_new_adaptor() {
    let layer = hsf_layer(0.4);
    let rules = layer.rules();
    let actions = Arc::new(Mutex::new(Vec::new()));
    let sink = actions.clone();
    let cb = layer.monitor().on_event(move |e| {
        if let Event::Operator { key, action } = e {
            sink.lock().unwrap().push(format!("{key} {action}"));
        }
    });
    let mut h = Harness::new(&layer, 3);
    rules.reset_backoff(&1usize);
    h.sync();
    drop(h);
    let _h2 = Harness::new(&layer, 3);
    let _h3 = Harness::new(&layer, 3);
    drop(cb);
    assert_eq!(
        *actions.lock().unwrap(),
        vec!["1 reset_backoff"],
        "replayed by new adaptors"
    );
}
