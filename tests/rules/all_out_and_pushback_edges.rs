//! The edges of what the layer does when every endpoint would be out (panic mode's set kept
//! consistent, the fail-fast guard) and of pushback (caps, dry run, overrides, panic), each case
//! from a review that tried to break them.

use crate::support;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Backend, Harness, Seen};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_outlier::fail_fast::NoEndpointAvailable;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, ServerErrors,
};

const SECOND: Duration = Duration::from_secs(1);

fn envoy(pct: u32) -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::envoy()
            .max_ejection_percent(pct)
            .always_eject_one_host(true)
            .build()
            .unwrap(),
        7,
    ))
}

/// Replays what the adaptor yielded; fails on a Remove of a key not in the set, and compares
/// the set with what the monitor says should be in it.
fn check<P: tower_outlier::probe::Probe<usize, Backend> + Clone>(
    layer: &OutlierDetectionLayer,
    h: &Harness<P>,
    forced_out: &[usize],
    what: &str,
) {
    let mut set = BTreeSet::new();
    for (_, s) in &h.seen {
        match s {
            Seen::Insert(k) => {
                set.insert(*k);
            }
            Seen::Remove(k) => {
                assert!(
                    set.remove(k),
                    "{what}: Remove({k}) for one not in the set; seen {:?}",
                    h.seen.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>()
                );
            }
        }
    }
    let snap = layer.monitor().snapshot();
    let panic = snap
        .all_out
        .as_deref()
        .is_some_and(|w| w.starts_with("panic"));
    let expected: BTreeSet<usize> = snap
        .endpoints
        .iter()
        .filter(|e| {
            let k: usize = e.key.as_str().parse().unwrap();
            let held = forced_out.contains(&k) && !e.status.is_available();
            if panic {
                !held
            } else {
                matches!(
                    e.status,
                    EndpointStatus::Available | EndpointStatus::Trial | EndpointStatus::Unready
                ) || e.would_be.is_some()
            }
        })
        .map(|e| e.key.as_str().parse().unwrap())
        .collect();
    assert_eq!(set, expected, "{what}: balancer set vs monitor; {snap:#?}");
}

#[tokio::test(start_paused = true)]
async fn panic_force_out_and_release_keep_the_set_consistent() {
    let layer = envoy(100);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    check(&layer, &h, &[], "two out");
    h.advance(15 * SECOND).await;
    h.calls(2, 5, 0).await;
    check(&layer, &h, &[], "panic");
    assert_eq!(h.live_ids(), vec![0, 1, 2, 3]);
    rules.force_out(&1usize);
    h.sync();
    check(&layer, &h, &[1], "forced out an ejected one in panic");
    assert!(!h.is_live(1));
    rules.force_out(&3usize);
    h.sync();
    check(&layer, &h, &[1, 3], "forced out the last healthy in panic");
    rules.release(&1usize);
    h.sync();
    check(&layer, &h, &[3], "released in panic");
    rules.release(&3usize);
    h.sync();
    check(&layer, &h, &[], "released #3");
    for _ in 0..12 {
        h.advance(10 * SECOND).await;
        check(&layer, &h, &[], "timers");
    }
    assert_eq!(h.live_ids(), vec![0, 1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn panic_upstream_remove_and_reinsert() {
    let layer = envoy(100);
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    h.advance(15 * SECOND).await;
    h.calls(2, 5, 0).await;
    check(&layer, &h, &[], "panic");
    h.remove(2);
    h.sync();
    check(&layer, &h, &[], "removed an ejected one in panic");
    h.remove(3);
    h.sync();
    check(&layer, &h, &[], "removed the healthy one in panic");
    h.insert(3);
    h.sync();
    check(&layer, &h, &[], "re-inserted 3");
    h.insert(2);
    h.sync();
    check(&layer, &h, &[], "re-inserted 2");
    h.insert(0);
    h.sync();
    check(&layer, &h, &[], "re-inserted (replaced) 0 while ejected");
    for _ in 0..10 {
        h.advance(10 * SECOND).await;
        check(&layer, &h, &[], "timers");
    }
}

#[tokio::test(start_paused = true)]
async fn panic_and_dry_run_toggles() {
    let layer = envoy(100);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    h.advance(15 * SECOND).await;
    h.calls(2, 5, 0).await;
    check(&layer, &h, &[], "panic");
    rules.set_dry_run(true);
    h.sync();
    check(&layer, &h, &[], "dry run on in panic");
    h.calls(3, 5, 0).await;
    check(&layer, &h, &[], "dry ejection");
    rules.set_dry_run(false);
    h.sync();
    check(&layer, &h, &[], "dry run off");
    h.calls(3, 5, 0).await;
    h.calls(2, 5, 0).await;
    h.calls(1, 5, 0).await;
    check(&layer, &h, &[], "ejections again");
    rules.set_dry_run(true);
    h.sync();
    rules.force_out(&0usize);
    h.sync();
    check(&layer, &h, &[0], "forced out in dry run");
    rules.set_dry_run(false);
    h.sync();
    check(&layer, &h, &[0], "dry run off 2");
    for _ in 0..10 {
        h.advance(10 * SECOND).await;
        check(&layer, &h, &[0], "timers");
    }
}

#[tokio::test(start_paused = true)]
async fn panic_and_reconfiguration() {
    let layer = envoy(100);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    h.advance(15 * SECOND).await;
    h.calls(2, 5, 0).await;
    check(&layer, &h, &[], "panic");
    // Same preset again.
    rules
        .replace(
            0,
            DetectorPolicy::seeded(
                DetectorConfig::envoy()
                    .max_ejection_percent(100)
                    .build()
                    .unwrap(),
                7,
            ),
        )
        .unwrap();
    h.sync();
    check(&layer, &h, &[], "replaced in panic");
    // To keep-the-last.
    rules
        .replace(
            0,
            DetectorPolicy::seeded(
                DetectorConfig::envoy()
                    .max_ejection_percent(100)
                    .when_all_out(tower_outlier::WhenAllOut::KeepLast)
                    .build()
                    .unwrap(),
                7,
            ),
        )
        .unwrap();
    h.sync();
    check(&layer, &h, &[], "replaced with keep-last");
    // To fail fast.
    rules
        .replace(
            0,
            DetectorPolicy::seeded(
                DetectorConfig::envoy()
                    .max_ejection_percent(100)
                    .when_all_out(tower_outlier::WhenAllOut::FailFast)
                    .build()
                    .unwrap(),
                7,
            ),
        )
        .unwrap();
    h.sync();
    check(&layer, &h, &[], "replaced with fail fast");
    rules
        .replace(
            0,
            DetectorPolicy::seeded(
                DetectorConfig::envoy()
                    .max_ejection_percent(100)
                    .build()
                    .unwrap(),
                7,
            ),
        )
        .unwrap();
    h.sync();
    check(&layer, &h, &[], "back to envoy");
    for id in 0..4 {
        h.calls_while_live(id, 6, 0).await;
        check(&layer, &h, &[], "ejecting all");
    }
    for _ in 0..12 {
        h.advance(10 * SECOND).await;
        check(&layer, &h, &[], "timers");
    }
}

#[tokio::test(start_paused = true)]
async fn panic_with_unready_endpoints() {
    let layer = envoy(100);
    let mut h = Harness::new(&layer, 4);
    h.calls(0, 5, 0).await;
    h.calls(1, 5, 0).await;
    check(&layer, &h, &[], "two out");
    h.backend(2).set_broken(true);
    h.poll_ready_all();
    check(&layer, &h, &[], "#2 unready: panic");
    h.backend(3).set_broken(true);
    h.poll_ready_all();
    check(&layer, &h, &[], "#3 unready too");
    h.backend(2).set_broken(false);
    h.backend(3).set_broken(false);
    for _ in 0..40 {
        h.advance(SECOND).await;
        h.poll_ready_all();
        check(&layer, &h, &[], "recovering");
    }
}

#[tokio::test(start_paused = true)]
async fn panic_single_endpoint_forced_out_then_released() {
    let layer = envoy(10);
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 1);
    h.calls(0, 5, 0).await;
    check(&layer, &h, &[], "lone panic");
    rules.force_out(&0usize);
    h.sync();
    check(&layer, &h, &[0], "forced out");
    rules.release(&0usize);
    h.sync();
    check(&layer, &h, &[], "released");
    h.calls(0, 5, 0).await;
    check(&layer, &h, &[], "ejected again");
    h.remove(0);
    h.sync();
    check(&layer, &h, &[], "removed");
    h.insert(0);
    h.sync();
    check(&layer, &h, &[], "back");
}

// ---------------------------------------------------------------- fail fast

use crate::all_out::linkerd;

type Tx = futures::channel::mpsc::UnboundedSender<Result<Change<usize, Backend>, Infallible>>;
type Rx = futures::channel::mpsc::UnboundedReceiver<Result<Change<usize, Backend>, Infallible>>;

fn upstream(backends: &[Backend]) -> (Tx, Rx) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for (id, backend) in backends.iter().enumerate() {
        tx.unbounded_send(Ok(Change::Insert(id, backend.clone())))
            .unwrap();
    }
    (tx, rx)
}

#[tokio::test(start_paused = true)]
async fn fail_fast_behind_buffer() {
    let layer = linkerd();
    let backends: Vec<Backend> = (0..2).map(Backend::new).collect();
    for b in &backends {
        b.set_failing(true);
    }
    let (_tx, rx) = upstream(&backends);
    let mut svc = ServiceBuilder::new()
        .buffer(8)
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let mut calls = 0;
    while layer.monitor().snapshot().ejected() < 2 {
        let _ = svc.ready().await.unwrap().call(()).await;
        calls += 1;
        assert!(calls < 100);
    }
    let r = tokio::time::timeout(SECOND, async { svc.ready().await?.call(()).await }).await;
    let e = r.expect("hung behind buffer").unwrap_err();
    assert!(
        e.is::<NoEndpointAvailable>() || e.to_string().contains("no endpoint"),
        "{e}"
    );
    for b in &backends {
        b.set_failing(false);
    }
    tokio::time::advance(11 * SECOND).await;
    let r = tokio::time::timeout(SECOND, async { svc.ready().await?.call(()).await }).await;
    assert!(matches!(r, Ok(Ok(_))), "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn fail_fast_counter_released_when_balancer_dropped() {
    let layer = linkerd();
    let backends: Vec<Backend> = (0..2).map(Backend::new).collect();
    for b in &backends {
        b.set_failing(true);
    }
    let (_tx, rx) = upstream(&backends);
    let mut svc = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let mut calls = 0;
    while layer.monitor().snapshot().ejected() < 2 {
        let _ = svc.ready().await.unwrap().call(()).await;
        calls += 1;
        assert!(calls < 100);
    }
    let e: BoxError = svc.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(e.is::<NoEndpointAvailable>());
    drop(svc);
    // A new balancer on the same layer, its upstream announcing an endpoint only after 1 s: it
    // must wait, not fail fast.
    let (tx, rx) = upstream(&[]);
    let mut svc = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let b = Backend::new(9);
    tokio::spawn(async move {
        tokio::time::sleep(SECOND).await;
        tx.unbounded_send(Ok(Change::Insert(9, b))).unwrap();
        std::mem::forget(tx);
    });
    let r = svc.ready().await.unwrap().call(()).await;
    assert!(
        r.is_ok(),
        "failed although the adaptor that had none is gone: {r:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn fail_fast_when_upstream_removes_every_ejected_endpoint() {
    let layer = linkerd();
    let backends: Vec<Backend> = (0..2).map(Backend::new).collect();
    for b in &backends {
        b.set_failing(true);
    }
    let (tx, rx) = upstream(&backends);
    let mut svc = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let mut calls = 0;
    while layer.monitor().snapshot().ejected() < 2 {
        let _ = svc.ready().await.unwrap().call(()).await;
        calls += 1;
        assert!(calls < 100);
    }
    tx.unbounded_send(Ok(Change::Remove(0))).unwrap();
    tx.unbounded_send(Ok(Change::Remove(1))).unwrap();
    // An upstream with no endpoint at all is the upstream's state, not the rules': the guard
    // waits with the balancer (as gRPC queues picks while it has no address yet), and a first
    // endpoint is served.
    let r = tokio::time::timeout(5 * SECOND, async { svc.ready().await?.call(()).await }).await;
    assert!(r.is_err(), "an empty upstream is waited for: {r:?}");
    let healthy = Backend::new(7);
    tx.unbounded_send(Ok(Change::Insert(7, healthy))).unwrap();
    let served = svc.ready().await.unwrap().call(()).await;
    assert!(served.is_ok(), "{served:?}");
}

/// A layer shared by two balancers: while one has every endpoint out, the guard of the other
/// fails its calls whenever that one is only busy (the documented limit of a guard per layer:
/// build one layer per balancer, as a `ServiceBuilder` stack does).
#[tokio::test(start_paused = true)]
async fn fail_fast_shared_layer_other_balancer_busy() {
    let layer = linkerd();
    let bad: Vec<Backend> = (0..1).map(Backend::new).collect();
    bad[0].set_failing(true);
    let (_tx, rx) = upstream(&bad);
    let mut a = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    for _ in 0..5 {
        let _ = a.ready().await.unwrap().call(()).await;
    }
    let e = a.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(e.is::<NoEndpointAvailable>());
    // Balancer b has one healthy endpoint behind a concurrency limit of 1 with a call in flight.
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let slow = support::Sleepy::new(5, 100);
    tx.unbounded_send(Ok::<_, Infallible>(Change::Insert(
        5usize,
        tower::limit::ConcurrencyLimit::new(slow, 1),
    )))
    .unwrap();
    std::mem::forget(tx);
    let mut b = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let first = b.ready().await.unwrap().call(());
    let second = async { b.ready().await?.call(()).await };
    let (r1, r2) = futures::join!(first, second);
    assert!(r1.is_ok(), "{r1:?}");
    assert!(
        r2.is_err_and(|e| e.is::<NoEndpointAvailable>()),
        "the documented limit of a guard shared by two balancers"
    );
}

// ---------------------------------------------------------------- pushback

use crate::pushback::{layer as player, Server};

type PTx = futures::channel::mpsc::UnboundedSender<Result<Change<usize, Server>, Infallible>>;

fn pbalance(
    layer: &OutlierDetectionLayer<ServerErrors>,
    servers: &[Server],
) -> (
    PTx,
    impl Service<(), Response = http::Response<()>, Error = BoxError>,
) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for (id, server) in servers.iter().enumerate() {
        tx.unbounded_send(Ok::<_, Infallible>(Change::Insert(id, server.clone())))
            .unwrap();
    }
    (tx, Balance::new(tower::Layer::layer(layer, rx)))
}

async fn traffic<B>(b: &mut B, span: Duration, step: Duration)
where
    B: Service<(), Response = http::Response<()>, Error = BoxError>,
{
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        let r = tokio::time::timeout(10 * SECOND, async { b.ready().await?.call(()).await }).await;
        assert!(r.is_ok(), "a call hung");
        tokio::time::advance(step).await;
    }
}

#[tokio::test(start_paused = true)]
async fn pushback_on_a_forced_in_endpoint_respects_the_cap() {
    let layer = player(0.4).max_pushback(2 * SECOND);
    layer.rules().force_in(&0usize);
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::slow(Duration::from_millis(5)))
        .collect();
    let (_tx, mut b) = pbalance(&layer, &servers);
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    servers[0].busy(Some("3600"));
    while servers[0].served() == 0 {
        let _ = b.ready().await.unwrap().call(()).await;
    }
    let n0 = servers[0].served();
    let _ = b.ready().await.unwrap().call(()).await;
    let n1 = servers[0].served();
    servers[0].busy(None);
    eprintln!("{:#?}", layer.monitor().snapshot().get("0"));
    traffic(&mut b, 10 * SECOND, Duration::from_millis(10)).await;
    let got = servers[0].served() - n1;
    eprintln!("forced-in #0: served {n0} {n1} then {got} in 10 s");
    assert!(
        got > 50,
        "forced in, an hour asked, 2 s cap: #0 got {got} calls in the 10 s after; {:#?}",
        layer.monitor().snapshot().get("0")
    );
}

#[tokio::test(start_paused = true)]
async fn pushback_on_a_forced_in_endpoint_with_zero_cap_is_ignored() {
    let layer = player(0.4).max_pushback(Duration::ZERO);
    layer.rules().force_in(&0usize);
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::slow(Duration::from_millis(5)))
        .collect();
    let (_tx, mut b) = pbalance(&layer, &servers);
    servers[0].busy(Some("5"));
    while servers[0].served() == 0 {
        let _ = b.ready().await.unwrap().call(()).await;
    }
    servers[0].busy(None);
    let n = servers[0].served();
    traffic(&mut b, 2 * SECOND, Duration::from_millis(10)).await;
    let got = servers[0].served() - n;
    assert!(
        got > 20,
        "max_pushback(0) ignores pushback, yet forced-in #0 got {got} calls in 2 s"
    );
}

#[tokio::test(start_paused = true)]
async fn dry_run_repeated_pushback_changes_nothing() {
    let layer = player(0.4);
    layer.rules().set_dry_run(true);
    let servers = vec![
        Server::new(),
        Server::slow(Duration::from_millis(5)),
        Server::slow(Duration::from_millis(5)),
    ];
    let (_tx, mut b) = pbalance(&layer, &servers);
    // #0 keeps asking.
    servers[0].busy(Some("5"));
    while servers[0].served() < 2 {
        let _ = b.ready().await.unwrap().call(()).await;
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    let n = servers[0].served();
    traffic(&mut b, 2 * SECOND, Duration::from_millis(10)).await;
    // Still failing, it is avoided by p2c for its failures as without detection, but never held
    // off by a load penalty, which would leave it nothing for the 5 s.
    let got = servers[0].served() - n;
    assert!(
        got > 0,
        "dry run: #0 asked again and was kept from traffic: {got} calls in 2 s"
    );
}

#[tokio::test(start_paused = true)]
async fn huge_retry_after_is_capped_at_the_default() {
    let layer = player(0.4);
    let servers: Vec<Server> = (0..3).map(|_| Server::new()).collect();
    let (_tx, mut b) = pbalance(&layer, &servers);
    servers[0].busy(Some("99999999999999999999999"));
    while servers[0].served() == 0 {
        let _ = b.ready().await.unwrap().call(()).await;
    }
    servers[0].busy(None);
    let _ = b.ready().await.unwrap().call(()).await;
    let s = layer.monitor().snapshot().get("0").unwrap().clone();
    assert_eq!(s.status, EndpointStatus::Ejected, "{s:#?}");
    assert!(s.next_check_in.unwrap() <= 300 * SECOND, "{s:#?}");
    let n = servers[0].served();
    traffic(&mut b, 310 * SECOND, Duration::from_millis(100)).await;
    assert!(servers[0].served() > n, "never back after the 300 s cap");
}

#[tokio::test(start_paused = true)]
async fn huge_retry_after_beyond_the_budget_load_penalty_is_capped() {
    // One of three may be out: the second asker is kept in with an infinite load.
    let layer = player(0.2);
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::slow(Duration::from_millis(5)))
        .collect();
    let (_tx, mut b) = pbalance(&layer, &servers);
    servers[0].busy(Some("99999999999999999999999"));
    servers[1].busy(Some("99999999999999999999999"));
    while servers[0].served() == 0 || servers[1].served() == 0 {
        let _ = b.ready().await.unwrap().call(()).await;
    }
    servers[0].busy(None);
    servers[1].busy(None);
    let (n0, n1) = (servers[0].served(), servers[1].served());
    traffic(&mut b, 310 * SECOND, Duration::from_millis(100)).await;
    let snap = layer.monitor().snapshot();
    assert!(
        servers[0].served() > n0 && servers[1].served() > n1,
        "not both back after 310 s: {} {}; {snap:#?}",
        servers[0].served() - n0,
        servers[1].served() - n1
    );
}

#[tokio::test(start_paused = true)]
async fn pushback_on_every_endpoint_keeps_the_last_and_calls_flow() {
    let layer = player(1.0);
    let servers: Vec<Server> = (0..3).map(|_| Server::new()).collect();
    let (_tx, mut b) = pbalance(&layer, &servers);
    for s in &servers {
        s.busy(Some("5"));
    }
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    let snap = layer.monitor().snapshot();
    assert!(snap.ejected() <= 2, "{snap:#?}");
    for s in &servers {
        s.busy(None);
    }
    traffic(&mut b, 10 * SECOND, Duration::from_millis(10)).await;
    let snap = layer.monitor().snapshot();
    assert_eq!(snap.ejected(), 0, "{snap:#?}");
    let before: Vec<usize> = servers.iter().map(Server::served).collect();
    traffic(&mut b, 2 * SECOND, Duration::from_millis(10)).await;
    for (i, s) in servers.iter().enumerate() {
        assert!(s.served() > before[i], "#{i} not served again");
    }
}

#[tokio::test(start_paused = true)]
async fn pushback_then_upstream_remove_and_reinsert() {
    let layer = player(0.4);
    let servers: Vec<Server> = (0..3).map(|_| Server::new()).collect();
    let (tx, mut b) = pbalance(&layer, &servers);
    servers[0].busy(Some("60"));
    while servers[0].served() == 0 {
        let _ = b.ready().await.unwrap().call(()).await;
    }
    servers[0].busy(None);
    let _ = b.ready().await.unwrap().call(()).await;
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().status,
        EndpointStatus::Ejected
    );
    // Replaced while out: stays out.
    tx.unbounded_send(Ok(Change::Insert(0, servers[0].clone())))
        .unwrap();
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    assert_eq!(
        layer.monitor().snapshot().get("0").unwrap().status,
        EndpointStatus::Ejected
    );
    tx.unbounded_send(Ok(Change::Remove(0))).unwrap();
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    tx.unbounded_send(Ok(Change::Insert(0, servers[0].clone())))
        .unwrap();
    let n = servers[0].served();
    traffic(&mut b, 2 * SECOND, Duration::from_millis(10)).await;
    assert!(servers[0].served() > n, "re-inserted but no traffic");
    // And a second ejection at once works.
    servers[1].busy(Some("3"));
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    servers[1].busy(None);
    traffic(&mut b, 5 * SECOND, Duration::from_millis(10)).await;
    assert_eq!(layer.monitor().snapshot().ejected(), 0);
}

#[tokio::test(start_paused = true)]
async fn pushback_forced_out_then_released_and_dry_run_toggle() {
    let layer = player(0.4);
    let rules = layer.rules();
    // The others answer in 5 ms: #0's one failure does not leave it the costlier pick for good
    // against servers answering in no time at all.
    let servers = vec![
        Server::new(),
        Server::slow(Duration::from_millis(5)),
        Server::slow(Duration::from_millis(5)),
    ];
    let (_tx, mut b) = pbalance(&layer, &servers);
    servers[0].busy(Some("30"));
    while servers[0].served() == 0 {
        let _ = b.ready().await.unwrap().call(()).await;
    }
    servers[0].busy(None);
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    rules.set_dry_run(true);
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    let n = servers[0].served();
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    assert!(
        servers[0].served() > n,
        "dry run: pushed-back #0 is back in the set but gets nothing"
    );
    rules.set_dry_run(false);
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    rules.force_out(&0usize);
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    rules.release(&0usize);
    let n = servers[0].served();
    traffic(&mut b, 2 * SECOND, Duration::from_millis(10)).await;
    assert!(servers[0].served() > n);
    // Pushback while forced out: ignored, and gone when released.
    rules.force_out(&1usize);
    traffic(&mut b, SECOND, Duration::from_millis(10)).await;
    rules.release(&1usize);
    traffic(&mut b, 40 * SECOND, Duration::from_millis(50)).await;
    assert_eq!(
        layer.monitor().snapshot().ejected(),
        0,
        "{:#?}",
        layer.monitor().snapshot()
    );
}

#[tokio::test(start_paused = true)]
async fn beyond_the_budget_load_penalty_obeys_a_small_cap() {
    let layer = player(0.2).max_pushback(2 * SECOND);
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::slow(Duration::from_millis(5)))
        .collect();
    let (_tx, mut b) = pbalance(&layer, &servers);
    servers[0].busy(Some("3600"));
    servers[1].busy(Some("3600"));
    while servers[0].served() == 0 || servers[1].served() == 0 {
        let _ = b.ready().await.unwrap().call(()).await;
    }
    servers[0].busy(None);
    servers[1].busy(None);
    let (n0, n1) = (servers[0].served(), servers[1].served());
    traffic(&mut b, 10 * SECOND, Duration::from_millis(10)).await;
    let snap = layer.monitor().snapshot();
    assert!(
        servers[0].served() > n0 && servers[1].served() > n1,
        "cap 2 s, not both back after 10 s: {} {}; {:?}",
        servers[0].served() - n0,
        servers[1].served() - n1,
        snap.endpoints
            .iter()
            .map(|e| (
                e.key.as_str().to_owned(),
                e.status,
                e.avoided_for,
                e.refused.clone(),
                e.next_check_in,
                e.latency_estimate
            ))
            .collect::<Vec<_>>()
    );
}

/// Envoy's panic hands the balancer both ejected endpoints; one of them then asks for an hour
/// (cap 2 s): avoided past the cap, until its re-admission?
#[tokio::test(start_paused = true)]
async fn pushback_from_an_ejected_endpoint_in_panic_obeys_the_cap() {
    let layer = OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::envoy()
            .max_ejection_percent(100)
            .build()
            .unwrap(),
        7,
    ))
    .classifier(ServerErrors)
    .max_pushback(2 * SECOND);
    let servers: Vec<Server> = (0..2)
        .map(|_| Server::slow(Duration::from_millis(5)))
        .collect();
    let (_tx, mut b) = pbalance_any(&layer, &servers);
    servers[0].busy(Some("0"));
    servers[1].busy(Some("0"));
    let mut calls = 0;
    while layer.monitor().snapshot().ejected() < 2 {
        let _ = b.ready().await.unwrap().call(()).await;
        calls += 1;
        assert!(calls < 200, "{:#?}", layer.monitor().snapshot());
    }
    assert!(layer
        .monitor()
        .snapshot()
        .all_out
        .unwrap()
        .starts_with("panic"));
    servers[1].busy(None);
    servers[0].busy(Some("3600"));
    let n = servers[0].served();
    while servers[0].served() == n {
        let _ = b.ready().await.unwrap().call(()).await;
    }
    // #0 healthy from now on, #1 failing (without asking): p2c prefers #0 unless a load
    // penalty beyond the cap keeps it away.
    servers[0].busy(None);
    servers[1].busy(Some("0"));
    let n = servers[0].served();
    traffic(&mut b, 10 * SECOND, Duration::from_millis(10)).await;
    let got = servers[0].served() - n;
    let s = layer.monitor().snapshot();
    assert!(
        got > 50,
        "#0 got {got} calls in the 10 s after asking (cap 2 s); {:?}",
        s.endpoints
            .iter()
            .map(|e| (e.key.as_str().to_owned(), e.status, e.next_check_in))
            .collect::<Vec<_>>()
    );
}

fn pbalance_any(
    layer: &OutlierDetectionLayer<ServerErrors>,
    servers: &[Server],
) -> (
    PTx,
    impl Service<(), Response = http::Response<()>, Error = BoxError>,
) {
    pbalance(layer, servers)
}

#[tokio::test(start_paused = true)]
async fn retry_after_http_date_far_ahead_is_capped() {
    let layer = player(0.4).max_pushback(3 * SECOND);
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::slow(Duration::from_millis(5)))
        .collect();
    let (_tx, mut b) = pbalance(&layer, &servers);
    servers[0].busy(Some("Fri, 31 Dec 9999 23:59:59 GMT"));
    while servers[0].served() == 0 {
        let _ = b.ready().await.unwrap().call(()).await;
    }
    servers[0].busy(None);
    let _ = b.ready().await.unwrap().call(()).await;
    let s = layer.monitor().snapshot().get("0").unwrap().clone();
    assert!(
        s.status == EndpointStatus::Ejected && s.next_check_in.unwrap() <= 3 * SECOND,
        "{s:#?}"
    );
    let n = servers[0].served();
    traffic(&mut b, 5 * SECOND, Duration::from_millis(10)).await;
    assert!(servers[0].served() > n);
}

/// A service that is not ready until `at` (a connection being set up).
#[derive(Clone)]
struct Connecting {
    at: tokio::time::Instant,
    sleep: Arc<Mutex<Option<std::pin::Pin<Box<tokio::time::Sleep>>>>>,
    inner: Backend,
}

impl Service<()> for Connecting {
    type Response = usize;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<usize, std::io::Error>>;
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::io::Error>> {
        if tokio::time::Instant::now() >= self.at {
            return self.inner.poll_ready(cx);
        }
        let mut sleep = self.sleep.lock().unwrap();
        let s = sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(self.at)));
        match s.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => self.inner.poll_ready(cx),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
    fn call(&mut self, r: ()) -> Self::Future {
        self.inner.call(r)
    }
}

use std::future::Future;

#[tokio::test(start_paused = true)]
async fn fail_fast_waits_for_a_new_endpoint_that_is_connecting() {
    let layer = linkerd();
    let (tx, rx) =
        futures::channel::mpsc::unbounded::<Result<Change<usize, Connecting>, Infallible>>();
    let now = tokio::time::Instant::now();
    let b0 = Backend::new(0);
    b0.set_failing(true);
    tx.unbounded_send(Ok(Change::Insert(
        0,
        Connecting {
            at: now,
            sleep: Arc::default(),
            inner: b0,
        },
    )))
    .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    for _ in 0..5 {
        let _ = svc.ready().await.unwrap().call(()).await;
    }
    assert_eq!(layer.monitor().snapshot().ejected(), 1);
    let e = svc.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(e.is::<NoEndpointAvailable>());
    tx.unbounded_send(Ok(Change::Insert(
        1,
        Connecting {
            at: now + SECOND,
            sleep: Arc::default(),
            inner: Backend::new(1),
        },
    )))
    .unwrap();
    let r = svc.ready().await.unwrap().call(()).await;
    assert!(
        r.is_ok(),
        "failed fast while a new endpoint was connecting: {r:?}"
    );
}
