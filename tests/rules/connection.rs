//! Connection state as a signal (`connection::ConnectionWatch`), on tokio's paused clock through a
//! real p2c `Balance`: an endpoint whose connection is refused is picked by no call until it
//! connects again, whatever the rules would do (here they are in dry run, so only the connection
//! keeps it out), and it is back in the picks within the back-off's longest wait (2 s, +20 %
//! jitter) of its server accepting connections. Every endpoint refused: no call is sent to any,
//! and the first to accept again takes the calls. A server that closes its connection and stops
//! listening (killed) costs no call at all: the gate checks it before the next pick.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use http::Uri;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_outlier::connection::{ConnectionWatch, WatchedIo, WhileConnected};
use tower_outlier::{DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer};

const TICK: Duration = Duration::from_millis(5);
const SECOND: Duration = Duration::from_secs(1);

/// One server as its client sees it: whether it accepts connections, the calls it was sent, and
/// the client's one pooled connection to it (opened through the endpoint's watch when a call
/// needs one; dropped when the server is killed, as a client drops a connection its server
/// closed).
#[derive(Clone, Default)]
struct Server {
    down: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    pooled: Arc<Mutex<Option<WatchedIo<()>>>>,
}

type Connector = tower::util::BoxCloneSyncService<Uri, (), io::Error>;
type Endpoint = WhileConnected<tower::util::BoxCloneSyncService<(), (), BoxError>>;

impl Server {
    fn endpoint(&self) -> Endpoint {
        let down = self.down.clone();
        let connector: Connector =
            tower::util::BoxCloneSyncService::new(service_fn(move |_: Uri| {
                let refused = down.load(Ordering::SeqCst);
                async move {
                    if refused {
                        Err(io::Error::from(io::ErrorKind::ConnectionRefused))
                    } else {
                        Ok(())
                    }
                }
            }));
        let watch = ConnectionWatch::new(connector);
        let (sent, connect, pooled) = (self.sent.clone(), watch.clone(), self.pooled.clone());
        let client = service_fn(move |()| {
            sent.fetch_add(1, Ordering::SeqCst);
            let (connect, pooled) = (connect.clone(), pooled.clone());
            async move {
                if pooled.lock().unwrap().is_none() {
                    let connection = connect
                        .oneshot("http://server/".parse().unwrap())
                        .await
                        .map_err(BoxError::from)?;
                    *pooled.lock().unwrap() = Some(connection);
                }
                tokio::time::sleep(TICK).await;
                Ok::<_, BoxError>(())
            }
        });
        watch.gate(
            tower::util::BoxCloneSyncService::new(client),
            "http://server/".parse().unwrap(),
        )
    }

    fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }

    /// Stops accepting connections, and closes the one the client holds.
    fn kill(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.pooled.lock().unwrap().take();
    }
}

/// Three servers behind the recommended layer in dry run (its rules take nothing out) and p2c.
type Balanced = tower::util::BoxService<(), (), BoxError>;
type Discovery = mpsc::UnboundedSender<Result<Change<usize, Endpoint>, std::convert::Infallible>>;

fn fleet() -> (Vec<Server>, Balanced, OutlierDetectionLayer, Discovery) {
    let servers: Vec<Server> = (0..3).map(|_| Server::default()).collect();
    let layer = OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::recommended().build().unwrap(),
        3,
    ));
    layer.rules().set_dry_run(true);
    let (tx, rx) = mpsc::unbounded();
    for (i, server) in servers.iter().enumerate() {
        tx.unbounded_send(Ok(Change::Insert(i, server.endpoint())))
            .unwrap();
    }
    let balancer = Balanced::new(Balance::new(layer.layer(rx)));
    (servers, balancer, layer, tx)
}

fn status(layer: &OutlierDetectionLayer, key: usize) -> EndpointStatus {
    layer.monitor().snapshot().get_key(&key).unwrap().status
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_picked_by_no_call_until_it_connects() {
    let (servers, mut balancer, layer, _tx) = fleet();
    let mut failed = 0;
    let call = async |balancer: &mut Balanced| {
        let ok = match tokio::time::timeout(SECOND, balancer.ready()).await {
            Ok(Ok(ready)) => ready.call(()).await.is_ok(),
            _ => false,
        };
        tokio::time::sleep(TICK).await;
        ok
    };
    // 2 s of serial traffic, every server up.
    let until = tokio::time::Instant::now() + 2 * SECOND;
    while tokio::time::Instant::now() < until {
        assert!(call(&mut balancer).await);
    }
    assert!(servers.iter().all(|s| s.sent() > 50));

    // Server 0 refuses connections for 4 s; the client's connection to it is lost without its
    // knowing (a path that failed while it was idle): the next call finds out.
    servers[0].down.store(true, Ordering::SeqCst);
    if let Some(connection) = servers[0].pooled.lock().unwrap().take() {
        let () = connection.into_inner();
    }
    let before = servers[0].sent();
    let until = tokio::time::Instant::now() + 4 * SECOND;
    while tokio::time::Instant::now() < until {
        if !call(&mut balancer).await {
            failed += 1;
        }
    }
    assert_eq!(
        servers[0].sent() - before,
        1,
        "calls sent to a server refusing connections (the first finds out)"
    );
    assert_eq!(failed, 1);
    assert_eq!(status(&layer, 0), EndpointStatus::Unready);

    // Accepting again: back in the picks within the longest wait, at its share.
    servers[0].down.store(false, Ordering::SeqCst);
    let healed = tokio::time::Instant::now();
    while servers[0].sent() == before + 1 {
        assert!(call(&mut balancer).await, "a call failed after the heal");
        assert!(
            healed.elapsed() <= Duration::from_millis(2_400) + 2 * TICK,
            "not back within 2.4 s of healing"
        );
    }
    assert_eq!(status(&layer, 0), EndpointStatus::Available);
    let counts: Vec<usize> = servers.iter().map(Server::sent).collect();
    let until = tokio::time::Instant::now() + 2 * SECOND;
    while tokio::time::Instant::now() < until {
        assert!(call(&mut balancer).await);
    }
    let got: Vec<usize> = servers
        .iter()
        .zip(&counts)
        .map(|(s, before)| s.sent() - before)
        .collect();
    let all: usize = got.iter().sum();
    assert!(
        got[0] * 3 * 2 >= all,
        "less than half its share after coming back: {got:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn with_every_connection_refused_no_call_is_sent_and_the_first_back_takes_them() {
    let (servers, mut balancer, layer, _tx) = fleet();
    for _ in 0..30 {
        balancer.ready().await.unwrap().call(()).await.unwrap();
    }
    for server in &servers {
        server.down.store(true, Ordering::SeqCst);
        if let Some(connection) = server.pooled.lock().unwrap().take() {
            let () = connection.into_inner();
        }
    }
    // Each server finds out on one call at most; then no call is sent anywhere, and a caller
    // waits for a server to accept (a fail-fast guard would answer at once instead).
    let mut failures = 0;
    for _ in 0..20 {
        match tokio::time::timeout(SECOND, balancer.ready()).await {
            Ok(Ok(ready)) => {
                if ready.call(()).await.is_err() {
                    failures += 1;
                }
            }
            Ok(Err(error)) => panic!("the balancer failed: {error}"),
            Err(_) => {}
        }
    }
    assert!(failures <= 3, "{failures} calls failed");
    let sent: Vec<usize> = servers.iter().map(Server::sent).collect();
    for key in 0..3 {
        assert_eq!(status(&layer, key), EndpointStatus::Unready);
    }
    // Server 2 accepts again: the next callers are served by it.
    servers[2].down.store(false, Ordering::SeqCst);
    let healed = tokio::time::Instant::now();
    let ready = tokio::time::timeout(3 * SECOND, balancer.ready())
        .await
        .expect("no server back within 3 s of one accepting")
        .unwrap();
    ready.call(()).await.unwrap();
    assert!(healed.elapsed() <= Duration::from_millis(2_400) + 2 * TICK);
    assert_eq!(servers[0].sent(), sent[0]);
    assert_eq!(servers[1].sent(), sent[1]);
    assert_eq!(servers[2].sent(), sent[2] + 1);
}

#[tokio::test(start_paused = true)]
async fn a_server_that_closes_its_connection_and_stops_listening_costs_no_call() {
    let (servers, mut balancer, layer, _tx) = fleet();
    for _ in 0..300 {
        balancer.ready().await.unwrap().call(()).await.unwrap();
        tokio::time::sleep(TICK).await;
    }
    assert!(servers.iter().all(|s| s.sent() > 50));
    // Killed: its connection closes, so the gate checks the server before the next pick, and
    // finds it refusing.
    servers[0].kill();
    let before = servers[0].sent();
    for _ in 0..400 {
        balancer.ready().await.unwrap().call(()).await.unwrap();
        tokio::time::sleep(TICK).await;
    }
    assert_eq!(
        servers[0].sent(),
        before,
        "a call was sent to the killed server"
    );
    assert_eq!(status(&layer, 0), EndpointStatus::Unready);
    // Listening again: back within the longest wait.
    servers[0].down.store(false, Ordering::SeqCst);
    let healed = tokio::time::Instant::now();
    while servers[0].sent() == before {
        balancer.ready().await.unwrap().call(()).await.unwrap();
        tokio::time::sleep(TICK).await;
        assert!(healed.elapsed() <= Duration::from_millis(2_400) + 2 * TICK);
    }
}
