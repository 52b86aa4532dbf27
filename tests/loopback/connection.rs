//! Connection state on real sockets: three hyper servers, eight concurrent callers through the
//! recommended layer (in dry run, so that its rules take nothing out) and p2c, one `PinnedClient`
//! per server. A server killed (its listener and connections closed) costs the calls in flight
//! and the one that finds its connection refused; then no call is sent to it until it listens
//! again, and it has half its share back within 2.5 s of its restart. The same run with clients
//! that do not watch their connection keeps sending it calls that fail.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::timeout::Timeout;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_outlier::hyper_client::PinnedClient;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, ServerErrors,
};

use crate::network_faults::serve;

type Body = Full<Bytes>;
type Balanced = BoxCloneService<http::Request<Body>, http::Response<Incoming>, BoxError>;

/// What one run saw: each call's end (since the start) and whether it got a 200; the requests
/// each server answered; the killed server's status while it was down.
struct Run {
    calls: Vec<(Duration, bool)>,
    killed_at: Duration,
    restarted_at: Duration,
    served_after_restart: Vec<(Duration, usize)>,
    status_while_down: EndpointStatus,
}

type EndpointService =
    tower::util::BoxCloneSyncService<http::Request<Body>, http::Response<Incoming>, BoxError>;

const CALLERS: usize = 8;
const KILL_AT: Duration = Duration::from_secs(1);
const RESTART_AT: Duration = Duration::from_secs(3);
const END_AT: Duration = Duration::from_secs(6);

async fn run(watched: bool) -> Run {
    let mut addrs = Vec::new();
    let mut counts = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        tasks.push(serve(listener, requests.clone()));
        counts.push(requests);
    }
    let shared = Client::builder(TokioExecutor::new()).build_http();
    let (discovery, changes) =
        mpsc::unbounded::<Result<Change<SocketAddr, EndpointService>, Infallible>>();
    for &addr in &addrs {
        let service = if watched {
            EndpointService::new(Timeout::new(
                PinnedClient::new(addr),
                Duration::from_secs(1),
            ))
        } else {
            // A client pinned to a shared pool: nothing watches its connection.
            let authority = addr.to_string().parse().unwrap();
            let client =
                PinnedClient::with_client(shared.clone(), http::uri::Scheme::HTTP, authority);
            EndpointService::new(Timeout::new(client, Duration::from_secs(1)))
        };
        discovery
            .unbounded_send(Ok(Change::Insert(addr, service)))
            .unwrap();
    }
    let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(ServerErrors);
    outliers.rules().set_dry_run(true);
    let monitor = outliers.monitor();
    let balancer: Balanced = BoxCloneService::new(
        ServiceBuilder::new()
            .buffer(64)
            .layer_fn(Balance::new)
            .layer(outliers)
            .service(changes),
    );

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let (balancer, stop, calls) = (balancer.clone(), stop.clone(), calls.clone());
        callers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let request = http::Request::get("/").body(Body::default()).unwrap();
                let answer =
                    tokio::time::timeout(Duration::from_secs(3), balancer.clone().oneshot(request))
                        .await;
                let ok = match answer {
                    Ok(Ok(response)) => {
                        let ok = response.status() == 200;
                        ok && response.into_body().collect().await.is_ok()
                    }
                    _ => false,
                };
                calls.lock().unwrap().push((start.elapsed(), ok));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    tokio::time::sleep_until((start + KILL_AT).into()).await;
    // Killed: its listener and kept-alive connections close.
    tasks[0].abort();
    let _ = (&mut tasks[0]).await;
    let killed_at = start.elapsed();
    tokio::time::sleep_until((start + RESTART_AT - Duration::from_millis(200)).into()).await;
    let status_while_down = monitor.snapshot().get_key(&addrs[0]).unwrap().status;
    tokio::time::sleep_until((start + RESTART_AT).into()).await;
    let listener = TcpListener::bind(addrs[0]).await.unwrap();
    tasks[0] = serve(listener, counts[0].clone());
    let restarted_at = start.elapsed();
    // Every 100 ms: the share of the calls the restarted server answered.
    let mut served_after_restart = Vec::new();
    while start.elapsed() < END_AT {
        let before: Vec<usize> = counts.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let got: Vec<usize> = counts
            .iter()
            .zip(&before)
            .map(|(c, b)| c.load(Ordering::SeqCst) - b)
            .collect();
        served_after_restart.push((
            start.elapsed(),
            got[0] * 1000 / got.iter().sum::<usize>().max(1),
        ));
    }
    stop.store(true, Ordering::SeqCst);
    for caller in callers {
        caller.await.unwrap();
    }
    drop(discovery);
    let calls = calls.lock().unwrap().clone();
    Run {
        calls,
        killed_at,
        restarted_at,
        served_after_restart,
        status_while_down,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_picked_by_no_call_until_it_listens_again() {
    let _turn = crate::timed_turn().await;
    let watched = run(true).await;
    let unwatched = run(false).await;
    // Failed calls ending after the kill's first 200 ms (the calls in flight and the one that
    // finds the connection refused end within it) and before the restart.
    let failed_while_down = |run: &Run| {
        run.calls
            .iter()
            .filter(|(at, ok)| {
                !ok && *at > run.killed_at + Duration::from_millis(200) && *at < run.restarted_at
            })
            .count()
    };
    let failed = |run: &Run| run.calls.iter().filter(|(_, ok)| !ok).count();
    let (with, without) = (failed_while_down(&watched), failed_while_down(&unwatched));
    eprintln!(
        "failed calls while down: watched {with} (of {} in all), unwatched {without} (of {}); \
         watched status {:?}; share of the restarted server per 100 ms (‰): {:?}",
        failed(&watched),
        failed(&unwatched),
        watched.status_while_down,
        watched.served_after_restart
    );
    assert_eq!(with, 0, "calls sent to a server refusing connections");
    assert!(
        failed(&watched) <= CALLERS + 1,
        "{} calls failed in all",
        failed(&watched)
    );
    assert_eq!(watched.status_while_down, EndpointStatus::Unready);
    assert!(
        without > 0,
        "the unwatched clients sent the dead server no failing call: the comparison shows nothing"
    );
    // Half its share (a third of the calls) back within 2.5 s of the restart, and kept.
    let back = watched
        .served_after_restart
        .iter()
        .find(|(_, share)| *share >= 1000 / 6)
        .map(|(at, _)| *at - watched.restarted_at);
    assert!(
        back.is_some_and(|back| back <= Duration::from_millis(2_500)),
        "not at half its share within 2.5 s of the restart: {:?}",
        watched.served_after_restart
    );
}

/// gRFC A94's subchannel metrics from a real server killed and restarted on loopback: a watched
/// `PinnedClient` counts its connection attempts (succeeded, failed while the server is down),
/// the connection the kill ended by reason, and the connections open — in its own counters
/// (`ConnectionWatch::stats`), through the `metrics` facade under A94's names (metrics-util's
/// recorder, local to this test's thread: the runtime is single-threaded, so every connection
/// event runs here) and as Prometheus series.
#[tokio::test]
async fn a_killed_and_restarted_server_shows_in_the_connection_metrics() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tower::Service;
    use tower_outlier::connection::DISCONNECT_REASONS;
    use tower_outlier::metrics::OutlierMetrics;
    use tower_outlier::standard_metrics::{
        CONNECTION_ATTEMPTS_FAILED, CONNECTION_ATTEMPTS_SUCCEEDED, DISCONNECTIONS,
        DISCONNECT_ERROR, OPEN_CONNECTIONS,
    };

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let mut server = serve(listener, served.clone());
    let mut client = PinnedClient::<Body>::new(addr);
    let watch = client.watch().unwrap().clone();
    let mut registry = prometheus_client::registry::Registry::default();
    let prometheus = OutlierMetrics::register(&mut registry);
    prometheus.watch_connections("orders", &watch);

    // One call, one connection kept alive. `ready` is bounded: while the server is down, the
    // client's gate stays pending as it reconnects.
    async fn call(client: &mut PinnedClient<Body>) -> bool {
        let ready = tokio::time::timeout(
            Duration::from_millis(300),
            futures::future::poll_fn(|cx| client.poll_ready(cx)),
        )
        .await;
        if !matches!(ready, Ok(Ok(()))) {
            return false;
        }
        let request = http::Request::get("/").body(Body::default()).unwrap();
        match tokio::time::timeout(Duration::from_secs(1), client.call(request)).await {
            Ok(Ok(response)) => response.into_body().collect().await.is_ok(),
            _ => false,
        }
    }
    for _ in 0..3 {
        assert!(call(&mut client).await);
    }
    let up = watch.stats();
    assert_eq!(up.attempts_succeeded, 1, "{up:?}");
    assert_eq!(up.open_connections, 1, "{up:?}");

    // Killed: its listener and its connection close; the calls meanwhile fail or wait.
    server.abort();
    let _ = (&mut server).await;
    for _ in 0..4 {
        let _ = call(&mut client).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let down = watch.stats();
    assert!(down.attempts_failed >= 1, "{down:?}");
    assert_eq!(down.open_connections, 0, "{down:?}");
    // Its server closed it: an end of stream, or an error on the next write.
    let ended = down.disconnections_for("unknown") + down.disconnections_for("connection reset");
    assert!(ended >= 1, "{down:?}");

    // Restarted on its port: a call gets through again within the gate's back-off.
    let listener = TcpListener::bind(addr).await.unwrap();
    let _server = serve(listener, served.clone());
    let restarted = tokio::time::Instant::now();
    while !call(&mut client).await {
        assert!(
            restarted.elapsed() < Duration::from_secs(5),
            "never reconnected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let back = watch.stats();
    assert!(back.attempts_succeeded >= 2, "{back:?}");
    assert_eq!(back.open_connections, 1, "{back:?}");

    // The facade saw the same, under A94's names and the connect address as `grpc.target`.
    let mut facade: std::collections::HashMap<(String, Option<String>), f64> = Default::default();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut target = None;
        let mut reason = None;
        for label in key.labels() {
            match label.key() {
                "grpc.target" => target = Some(label.value().to_owned()),
                k if k == DISCONNECT_ERROR => reason = Some(label.value().to_owned()),
                _ => {}
            }
        }
        let target = target.expect("every A94 series has grpc.target");
        assert!(target.starts_with(&format!("http://{addr}")), "{target}");
        let value = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(_) => continue,
        };
        *facade.entry((key.name().to_owned(), reason)).or_default() += value;
    }
    let get = |name: &str, reason: Option<&str>| {
        facade
            .get(&(name.to_owned(), reason.map(str::to_owned)))
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(
        get(CONNECTION_ATTEMPTS_SUCCEEDED, None),
        back.attempts_succeeded as f64
    );
    assert_eq!(
        get(CONNECTION_ATTEMPTS_FAILED, None),
        back.attempts_failed as f64
    );
    assert_eq!(get(OPEN_CONNECTIONS, None), 1.0);
    for (i, reason) in DISCONNECT_REASONS.iter().enumerate() {
        assert_eq!(
            get(DISCONNECTIONS, Some(reason)),
            back.disconnections[i] as f64,
            "{reason}: {facade:?}"
        );
    }

    // And Prometheus, summed under the upstream's name.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(&format!(
            "outlier_connection_attempts_total{{upstream=\"orders\",result=\"failed\"}} {}",
            back.attempts_failed
        )),
        "{text}"
    );
    assert!(
        text.contains("outlier_connections_open{upstream=\"orders\"} 1"),
        "{text}"
    );
    for (i, reason) in DISCONNECT_REASONS.iter().enumerate() {
        assert!(
            text.contains(&format!(
                "outlier_disconnections_total{{upstream=\"orders\",reason=\"{reason}\"}} {}",
                back.disconnections[i]
            )),
            "{text}"
        );
    }
}
