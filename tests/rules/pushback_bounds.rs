//! Pushback (`Retry-After`) at its bounds, on tokio's paused clock through a real p2c `Balance`:
//! the layer's cap bounds what a server asks for, whether its endpoint is forced in, kept in with
//! a load penalty beyond the budget, or ejected in Envoy's panic, and a cap of zero ignores it; a
//! number past any duration and an HTTP date in the year 9999 are capped; dry run changes nothing
//! however often a server asks; pushback from every endpoint keeps the last; an endpoint that
//! asked comes back after an upstream removal and re-insert, a force-out and release, and dry run
//! switched on and off.

use std::convert::Infallible;
use std::time::Duration;

use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{BoxError, Service, ServiceExt};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, ServerErrors,
};

use crate::pushback::{layer as player, Server};

const SECOND: Duration = Duration::from_secs(1);

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

/// An endpoint forced in whose server asks for time: the layer's cap bounds how long its load
/// keeps p2c away, and a cap of zero ignores what it asks.
#[tokio::test(start_paused = true)]
async fn pushback_on_a_forced_in_endpoint_respects_the_cap() {
    struct Case {
        name: &'static str,
        cap: Duration,
        retry_after: &'static str,
        /// Traffic before #0 asks.
        warm_up: Duration,
        /// Calls made after #0's first answer while it still asks.
        calls_while_asking: usize,
        /// How long #0's calls are counted once it stops asking, and how many it must get.
        span: Duration,
        more_than: usize,
    }
    let cases = [
        Case {
            name: "an hour asked, 2 s cap",
            cap: 2 * SECOND,
            retry_after: "3600",
            warm_up: SECOND,
            calls_while_asking: 1,
            span: 10 * SECOND,
            more_than: 50,
        },
        Case {
            name: "5 s asked, max_pushback(0) ignores pushback",
            cap: Duration::ZERO,
            retry_after: "5",
            warm_up: Duration::ZERO,
            calls_while_asking: 0,
            span: 2 * SECOND,
            more_than: 20,
        },
    ];
    for case in cases {
        let name = case.name;
        let layer = player(0.4).max_pushback(case.cap);
        layer.rules().force_in(&0usize);
        let servers: Vec<Server> = (0..3)
            .map(|_| Server::slow(Duration::from_millis(5)))
            .collect();
        let (_tx, mut b) = pbalance(&layer, &servers);
        traffic(&mut b, case.warm_up, Duration::from_millis(10)).await;
        servers[0].busy(Some(case.retry_after));
        while servers[0].served() == 0 {
            let _ = b.ready().await.unwrap().call(()).await;
        }
        let first = servers[0].served();
        for _ in 0..case.calls_while_asking {
            let _ = b.ready().await.unwrap().call(()).await;
        }
        let n = servers[0].served();
        servers[0].busy(None);
        eprintln!("{name}: {:#?}", layer.monitor().snapshot().get("0"));
        traffic(&mut b, case.span, Duration::from_millis(10)).await;
        let got = servers[0].served() - n;
        eprintln!(
            "{name}: forced-in #0: served {first} {n} then {got} in {:?}",
            case.span
        );
        assert!(
            got > case.more_than,
            "{name}: forced in, #0 got {got} calls in the {:?} after (expected more than {}); {:#?}",
            case.span,
            case.more_than,
            layer.monitor().snapshot().get("0")
        );
    }
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

/// A server asks for longer than the cap allows (a number past any duration, an HTTP date in the
/// year 9999): its endpoint is ejected for no longer than the cap, then called again.
#[tokio::test(start_paused = true)]
async fn a_retry_after_far_ahead_is_capped() {
    struct Case {
        name: &'static str,
        /// The layer's `max_pushback`; `None` leaves the default (300 s).
        cap: Option<Duration>,
        /// How long the servers take to answer.
        latency: Duration,
        retry_after: &'static str,
        /// The longest the ejection may last.
        bound: Duration,
        /// Traffic after the ejection, and its step, in which #0 must be called again.
        span: Duration,
        step: Duration,
    }
    let cases = [
        Case {
            name: "a number past any duration, the default cap",
            cap: None,
            latency: Duration::ZERO,
            retry_after: "99999999999999999999999",
            bound: 300 * SECOND,
            span: 310 * SECOND,
            step: Duration::from_millis(100),
        },
        Case {
            name: "an HTTP date in the year 9999, a 3 s cap",
            cap: Some(3 * SECOND),
            latency: Duration::from_millis(5),
            retry_after: "Fri, 31 Dec 9999 23:59:59 GMT",
            bound: 3 * SECOND,
            span: 5 * SECOND,
            step: Duration::from_millis(10),
        },
    ];
    for case in cases {
        let name = case.name;
        let mut layer = player(0.4);
        if let Some(cap) = case.cap {
            layer = layer.max_pushback(cap);
        }
        // `Server::slow(Duration::ZERO)` is `Server::new()`.
        let servers: Vec<Server> = (0..3).map(|_| Server::slow(case.latency)).collect();
        let (_tx, mut b) = pbalance(&layer, &servers);
        servers[0].busy(Some(case.retry_after));
        while servers[0].served() == 0 {
            let _ = b.ready().await.unwrap().call(()).await;
        }
        servers[0].busy(None);
        let _ = b.ready().await.unwrap().call(()).await;
        let s = layer.monitor().snapshot().get("0").unwrap().clone();
        assert_eq!(s.status, EndpointStatus::Ejected, "{name}: {s:#?}");
        assert!(s.next_check_in.unwrap() <= case.bound, "{name}: {s:#?}");
        let n = servers[0].served();
        traffic(&mut b, case.span, case.step).await;
        assert!(
            servers[0].served() > n,
            "{name}: never back after the {:?} cap",
            case.bound
        );
    }
}

/// Beyond the budget (one of three may be out) two servers ask for longer than the cap allows:
/// the second is kept in with a load penalty, which lasts no longer than the cap either.
#[tokio::test(start_paused = true)]
async fn beyond_the_budget_the_load_penalty_obeys_the_cap() {
    struct Case {
        name: &'static str,
        /// The layer's `max_pushback`; `None` leaves the default (300 s).
        cap: Option<Duration>,
        retry_after: &'static str,
        /// Traffic after both stop asking, and its step, in which both must be called again.
        span: Duration,
        step: Duration,
    }
    let cases = [
        Case {
            name: "a number past any duration, the default cap",
            cap: None,
            retry_after: "99999999999999999999999",
            span: 310 * SECOND,
            step: Duration::from_millis(100),
        },
        Case {
            name: "an hour, a 2 s cap",
            cap: Some(2 * SECOND),
            retry_after: "3600",
            span: 10 * SECOND,
            step: Duration::from_millis(10),
        },
    ];
    for case in cases {
        let name = case.name;
        let mut layer = player(0.2);
        if let Some(cap) = case.cap {
            layer = layer.max_pushback(cap);
        }
        let servers: Vec<Server> = (0..3)
            .map(|_| Server::slow(Duration::from_millis(5)))
            .collect();
        let (_tx, mut b) = pbalance(&layer, &servers);
        servers[0].busy(Some(case.retry_after));
        servers[1].busy(Some(case.retry_after));
        while servers[0].served() == 0 || servers[1].served() == 0 {
            let _ = b.ready().await.unwrap().call(()).await;
        }
        servers[0].busy(None);
        servers[1].busy(None);
        let (n0, n1) = (servers[0].served(), servers[1].served());
        traffic(&mut b, case.span, case.step).await;
        let snap = layer.monitor().snapshot();
        assert!(
            servers[0].served() > n0 && servers[1].served() > n1,
            "{name}: not both back after {:?}: {} {}; {:?}",
            case.span,
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
