//! An axum reverse proxy that balances every request over four upstream servers, with outlier
//! detection: one upstream accepts connections but resets each one as its request arrives (an
//! instance that crashes on every request); the layer, on the README's recommended configuration,
//! ejects it at its third failed request in a row, the proxy stops sending it traffic, the
//! layer's probe checks its `/healthz` while it is out, and brings it back once that answers. (An upstream that refuses or resets
//! connections outright is held out sooner, as unready, by `PinnedClient`'s connection watch:
//! its rules need no failed request to see it.)
//!
//! ```text
//! cargo run --example axum_proxy
//! ```
//!
//! The stack behind the axum handler, from the handler down:
//!
//! ```text
//! Buffer -> p2c Balance -> OutlierDetectionLayer -> per-endpoint Timeout -> hyper-util Client
//! ```
//!
//! The proxy answers 502 Bad Gateway when the balancer returns an error (here: the upstream reset
//! the connection) and passes every upstream response through as it is.
//!
//! Everything runs on loopback (127.0.0.1, ports picked by the OS) and ends by itself in a second
//! or two. The example is also its own client: it sends requests to the proxy, prints what each
//! upstream received and what the layer decided, checks its claims and exits non-zero if one does
//! not hold.

#[path = "demo/mod.rs"]
mod demo;

use demo::{certainly_ejected, print_table, received, since, status, Counted as Upstream};
use std::convert::Infallible;
use std::error::Error;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use futures::channel::mpsc;
use futures::TryStreamExt;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::timeout::Timeout;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_outlier::hyper_client::PinnedClient;
use tower_outlier::probe::request_probe;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, DiscoverErrors, EndpointStatus, OutlierDetectionLayer,
    ServerErrors,
};

type DynError = Box<dyn Error + Send + Sync>;

/// The upstreams; `FLAKY` resets every request's connection while the shared `broken` flag is set.
const NAMES: [&str; 4] = ["alpha", "bravo", "charlie", "delta"];
const FLAKY: &str = "charlie";

/// The path the layer's probe checks; the tables count the clients' requests only.
const HEALTH: &str = "/healthz";

/// How long one upstream may take to answer before the call counts as a failure (a timeout).
/// Without it, a hung upstream would never produce a failure the layer could count.
const UPSTREAM_TIMEOUT: Duration = Duration::from_millis(500);

/// Requests per phase: enough that p2c, which picks at random, sends every upstream its share
/// many times over, so the checks at the end cannot pass or fail by luck.
const REQUESTS: usize = 200;

/// Requests are sent to the proxy in concurrent batches of this size, as many clients would; p2c
/// compares loads (latency × (in flight + 1)), which needs requests in flight to spread traffic.
/// Each batch completes before the next starts, so what the monitor shows between two batches
/// holds for every request of the next one.
const BATCH: usize = 20;

/// Once the flaky upstream is ejected, a batch is sent only while its recovery check is at least
/// this far off, so every request counted as "sent while it was ejected" certainly was.
const MARGIN: Duration = Duration::from_millis(250);

/// What the axum handler holds in its state: the balancer behind a `Buffer`, which makes it
/// `Clone` (one clone per request) and drives it from its own task, boxed so that its type can
/// be written down. (`BoxCloneSyncService` is `Sync`, as axum state must be, and spares the
/// handler `Buffer`'s generic bounds, which trip the compiler inside an `async fn` handler.)
type Upstreams = BoxCloneSyncService<Request, http::Response<Incoming>, BoxError>;

#[tokio::main]
async fn main() -> Result<(), DynError> {
    // The layer reports ejections (WARN) and re-admissions (INFO) through `tracing`.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_target(false)
        .try_init()?;

    // 1. Four upstream HTTP/1 servers on loopback. `broken` is set from the start: the flaky one
    //    resets every request's connection from the first, like an instance that crashes on each.
    let broken = Arc::new(AtomicBool::new(true));
    let mut upstreams = Vec::new();
    for name in NAMES {
        let flag = (name == FLAKY).then(|| broken.clone());
        upstreams.push(Upstream::start(name, flag).await?);
    }
    let flaky = upstreams
        .iter()
        .position(|u| u.name == FLAKY)
        .ok_or("no flaky upstream")?;
    // The monitor names endpoints by their discover key, as `Debug` prints it.
    let flaky_key = format!("{:?}", upstreams[flaky].addr);

    // 2. The balancer, on the recommended configuration: three failures in a row (or under 80 %
    //    success over 10 s) eject, at most half the upstreams are out, and an ejected one is
    //    checked after a back-off of 1 s growing to 5 s. `ServerErrors` counts transport errors,
    //    timeouts and 5xx responses as failures. The probe sends `GET /healthz` through a clone
    //    of the ejected upstream's service (its timeout included): it is back once that answers,
    //    and no client's request is spent finding out.
    let outliers =
        OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?))
            .classifier(ServerErrors)
            .discover_errors(DiscoverErrors::KeepServing)
            .probe(request_probe(
                || Request::get(HEALTH).body(Body::empty()).unwrap(),
                ServerErrors,
            ));
    // Taken before the layer is consumed; it shows what the layer decided.
    let monitor = outliers.monitor();

    // Service discovery: a channel of changes keyed by address. A real proxy feeds it from DNS,
    // Consul, Kubernetes...; keeping `discovery` alive keeps the stream open for more changes.
    let (discovery, changes) =
        mpsc::unbounded::<Result<Change<SocketAddr, PinnedClient<Body>>, Infallible>>();
    for upstream in &upstreams {
        discovery.unbounded_send(Ok(Change::Insert(
            upstream.addr,
            PinnedClient::new(upstream.addr),
        )))?;
    }
    // A timeout per endpoint, under the outlier layer, so that it sees timeouts as failures.
    let changes = changes.map_ok(|change| match change {
        Change::Insert(addr, backend) => {
            Change::Insert(addr, Timeout::new(backend, UPSTREAM_TIMEOUT))
        }
        Change::Remove(addr) => Change::Remove(addr),
    });
    let balancer: Upstreams = ServiceBuilder::new()
        .layer(BoxCloneSyncService::layer())
        .buffer(1024)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(changes);

    // 3. The axum proxy: every method, every path goes to `proxy`.
    let app = Router::new().fallback(proxy).with_state(balancer);
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let proxy_addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the proxy stopped");
        }
    });
    println!("proxy listening on http://{proxy_addr}");

    // 4. From here on the example is the proxy's client.
    let client = ProxyClient::new(proxy_addr);

    // 4a. Warm-up, with the flaky upstream broken from the start. Its resets reach the client as
    //     502s until the layer ejects it, at the third in a row; the monitor is read after each
    //     batch to catch that.
    println!("\n== (a) warm-up: {FLAKY} resets every request from the start ==");
    let before = received(&upstreams);
    let mut warm_up_statuses = Statuses::default();
    // (requests the flaky upstream had received, requests sent) when the ejection showed.
    let mut ejection = None;
    let mut sent = 0;
    while sent < REQUESTS {
        if ejection.is_some() && !certainly_ejected(&monitor, &flaky_key, MARGIN) {
            println!("(stopping early: the recovery check is about to run)");
            break;
        }
        warm_up_statuses.add(client.send_batch(sent).await?);
        sent += BATCH;
        if ejection.is_none() && status(&monitor, &flaky_key) == Some(EndpointStatus::Ejected) {
            ejection = Some((since(&upstreams, &before)[flaky], sent));
        }
    }
    let warm_up = since(&upstreams, &before);
    print_table(&upstreams, &warm_up, &monitor, "upstream", "requests");
    println!("the client got: {warm_up_statuses}");
    let Some((before_ejection, sent_before_ejection)) = ejection else {
        return Err(format!("{FLAKY} was never ejected during the warm-up").into());
    };
    // Only whole batches sent after the monitor showed the ejection count as "after".
    let sent_while_ejected_a = sent - sent_before_ejection;
    let after_ejection_a = warm_up[flaky] - before_ejection;

    // 4b. More traffic while it is ejected: the balancer no longer sees it, the others share it.
    println!("\n== (b) {FLAKY} is ejected ==");
    let before = received(&upstreams);
    let mut ejected_statuses = Statuses::default();
    let mut sent_while_ejected_b = 0;
    while sent_while_ejected_b < REQUESTS {
        if !certainly_ejected(&monitor, &flaky_key, MARGIN) {
            println!("(stopping early: the recovery check is about to run)");
            break;
        }
        ejected_statuses.add(client.send_batch(sent_while_ejected_b).await?);
        sent_while_ejected_b += BATCH;
    }
    let while_ejected = since(&upstreams, &before);
    print_table(&upstreams, &while_ejected, &monitor, "upstream", "requests");
    println!("the client got: {ejected_statuses}");

    // 4c. The upstream heals. At its next check the probe's `/healthz` answers 200 and the layer
    //     puts it back in the balancer's set.
    broken.store(false, Ordering::SeqCst);
    let due_in = monitor
        .snapshot()
        .get(&flaky_key)
        .and_then(|e| e.next_check_in)
        .unwrap_or_default();
    println!("\n== (c) {FLAKY} heals; its recovery check is due in {due_in:.1?} ==");
    tokio::time::sleep(due_in + Duration::from_millis(100)).await;
    let before = received(&upstreams);
    let mut healed_statuses = Statuses::default();
    for batch in 0..REQUESTS / BATCH {
        healed_statuses.add(client.send_batch(batch * BATCH).await?);
    }
    let healed = since(&upstreams, &before);
    print_table(&upstreams, &healed, &monitor, "upstream", "requests");
    println!("the client got: {healed_statuses}");
    let final_status = status(&monitor, &flaky_key);

    // 5. The demo's claims, checked: this example doubles as a smoke test.
    let mut failures = Vec::new();
    let sent_while_ejected = sent_while_ejected_a + sent_while_ejected_b;
    let received_while_ejected = after_ejection_a + while_ejected[flaky];
    if before_ejection == 0 {
        failures.push(format!("{FLAKY} received nothing before its ejection"));
    }
    if warm_up_statuses.bad_gateway == 0 || warm_up_statuses.other > 0 {
        failures.push(format!(
            "the warm-up should give only 200s and 502s: {warm_up_statuses}"
        ));
    }
    if sent_while_ejected == 0 {
        failures.push("no request was sent while it was ejected".to_string());
    }
    if received_while_ejected > 0 {
        failures.push(format!(
            "{FLAKY} received {received_while_ejected} requests while ejected"
        ));
    }
    if ejected_statuses.ok != sent_while_ejected_b {
        failures.push(format!(
            "errors while {FLAKY} was ejected: {ejected_statuses}"
        ));
    }
    for (upstream, &n) in upstreams.iter().zip(&while_ejected) {
        if upstream.name != FLAKY && n == 0 && sent_while_ejected_b > 0 {
            failures.push(format!(
                "{} received nothing while {FLAKY} was out",
                upstream.name
            ));
        }
    }
    if healed[flaky] == 0 {
        failures.push(format!("{FLAKY} received no request after it healed"));
    }
    if !final_status.is_some_and(|s| s.is_available()) {
        failures.push(format!("{FLAKY} is {final_status:?} after it healed"));
    }
    if healed_statuses.ok != REQUESTS {
        failures.push(format!("errors after {FLAKY} healed: {healed_statuses}"));
    }
    drop(discovery);
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    println!(
        "\nOK: {FLAKY} failed {before_ejection} requests (the client got {} 502s), was ejected, \
         received none of the {sent_while_ejected} sent while it was out, and {} of {REQUESTS} \
         once it had healed.",
        warm_up_statuses.bad_gateway, healed[flaky]
    );
    Ok(())
}

/// The proxy's only handler: forwards the request through the balancer. An upstream's response,
/// whatever its status, goes back as it is; a balancer error (the upstream reset the connection,
/// timed out, or no upstream is left) becomes a 502.
async fn proxy(State(upstreams): State<Upstreams>, request: Request) -> Response {
    match upstreams.oneshot(request).await {
        Ok(response) => response.map(Body::new),
        Err(error) => {
            tracing::debug!(%error, "upstream call failed");
            (StatusCode::BAD_GATEWAY, format!("bad gateway: {error}\n")).into_response()
        }
    }
}

impl Upstream {
    /// Binds 127.0.0.1 on a port the OS picks and serves HTTP/1 from a background task: 200 with
    /// the upstream's name, or, while `broken` is given and set, a reset for every request.
    async fn start(name: &'static str, broken: Option<Arc<AtomicBool>>) -> Result<Self, DynError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(AtomicUsize::new(0));
        let counter = received.clone();
        let handler = hyper::service::service_fn(move |request: http::Request<Incoming>| {
            // Counted here, on the upstream, so the tables show what the upstreams actually saw
            // of the clients' requests (the layer's checks of /healthz are not theirs).
            if request.uri().path() != HEALTH {
                counter.fetch_add(1, Ordering::SeqCst);
            }
            let response = http::Response::new(Full::new(Bytes::from(name)));
            async move { Ok::<_, Infallible>(response) }
        });
        let counter = received.clone();
        tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        tracing::warn!(upstream = name, %error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if broken.as_ref().is_some_and(|b| b.load(Ordering::SeqCst)) {
                    // The process dies on every request: the connection is accepted (a check
                    // that only connects finds the port open), and reset once a request arrives.
                    // A reset costs the client its request (the client opens a fresh connection
                    // per attempt here: a reset one never goes back to its pool), so it counts as
                    // one request received.
                    let counter = counter.clone();
                    tokio::spawn(async move {
                        let mut stream = stream;
                        let mut head = [0u8; 64];
                        if let Ok(n @ 1..) = stream.read(&mut head).await {
                            let check = format!("GET {HEALTH} ");
                            if !head[..n].starts_with(check.as_bytes()) {
                                counter.fetch_add(1, Ordering::SeqCst);
                            }
                            reset(stream);
                        }
                    });
                    continue;
                }
                let handler = handler.clone();
                tokio::spawn(async move {
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), handler);
                    if let Err(error) = connection.await {
                        tracing::debug!(upstream = name, %error, "connection ended with an error");
                    }
                });
            }
        });
        Ok(Upstream {
            name,
            addr,
            received,
        })
    }
}

/// Closes a connection with a reset (RST) instead of an orderly close.
fn reset(stream: TcpStream) {
    // Linger 0 turns the close into a reset. The deprecation is about lingering closes blocking
    // the thread, which a zero linger does not do.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// The example's own HTTP client, which talks to the proxy as any outside client would.
struct ProxyClient {
    client: Client<HttpConnector, Empty<Bytes>>,
    proxy: SocketAddr,
}

impl ProxyClient {
    fn new(proxy: SocketAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        ProxyClient {
            client: Client::builder(TokioExecutor::new()).build(connector),
            proxy,
        }
    }

    /// Sends one request to the proxy and reads the whole body, so the connection goes back to
    /// its pool. Any path will do: the proxy forwards them all.
    async fn send(&self, n: usize) -> Result<StatusCode, DynError> {
        let uri: Uri = format!("http://{}/orders/{n}", self.proxy).parse()?;
        let response = self.client.get(uri).await?;
        let status = response.status();
        response.into_body().collect().await?;
        Ok(status)
    }

    /// Sends `BATCH` requests at once and waits for all of them; `first` numbers their paths.
    async fn send_batch(&self, first: usize) -> Result<Statuses, DynError> {
        let statuses =
            futures::future::try_join_all((first..first + BATCH).map(|n| self.send(n))).await?;
        let mut counts = Statuses::default();
        for status in statuses {
            match status {
                StatusCode::OK => counts.ok += 1,
                StatusCode::BAD_GATEWAY => counts.bad_gateway += 1,
                _ => counts.other += 1,
            }
        }
        Ok(counts)
    }
}

/// What the client got back from the proxy in one phase.
#[derive(Clone, Copy, Debug, Default)]
struct Statuses {
    ok: usize,
    bad_gateway: usize,
    other: usize,
}

impl Statuses {
    fn add(&mut self, other: Statuses) {
        self.ok += other.ok;
        self.bad_gateway += other.bad_gateway;
        self.other += other.other;
    }
}

impl std::fmt::Display for Statuses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} × 200, {} × 502, {} other",
            self.ok, self.bad_gateway, self.other
        )
    }
}
