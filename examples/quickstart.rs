//! Quickstart: four real HTTP servers behind a power-of-two-choices balancer, one of which answers
//! 503 from the start. The layer, built as the README recommends (`DetectorConfig::recommended()`
//! with an active probe), ejects it after three failures in a row, the balancer stops sending it
//! traffic, its `/healthz` is checked meanwhile, and once it answers the server is back.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! Everything runs on loopback (127.0.0.1, ports picked by the OS) and ends by itself in a
//! second or two. The example checks its own claims and exits non-zero if one does not hold, so it
//! doubles as a smoke test.

#[path = "demo/mod.rs"]
mod demo;

use demo::{certainly_ejected, print_table, received, since, status, Counted as Server};
use std::convert::Infallible;
use std::error::Error;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_outlier::hyper_client::PinnedClient;
use tower_outlier::probe::request_probe;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, DiscoverErrors, EndpointStatus, OutlierDetectionLayer,
    ServerErrors,
};

type DynError = Box<dyn Error + Send + Sync>;

/// The servers of the demo; `FLAKY` answers 503 (its `/healthz` too) while the shared `broken`
/// flag is set.
const NAMES: [&str; 4] = ["alpha", "bravo", "charlie", "delta"];
const FLAKY: &str = "charlie";

/// Requests per phase: enough that p2c, which picks at random, sends every server its share many
/// times over, so the checks at the end cannot pass or fail by luck.
const REQUESTS: usize = 200;

/// Requests are sent in concurrent batches of this size. p2c compares loads (latency estimate ×
/// (requests in flight + 1)); one request at a time, nothing is ever in flight, the comparison is
/// latency alone, and an endpoint that drew one slow answer (say, while opening its connection)
/// loses every comparison for a long while. Concurrency spreads the load, as in a real client.
/// Each batch completes before the next starts, so what the monitor shows between two batches
/// holds for every request of the next one.
const BATCH: usize = 20;

/// Once the flaky server is ejected, a batch is sent only while its next check is at least
/// this far off, so every request counted as "sent while it was ejected" certainly was, even on a
/// slow machine.
const MARGIN: Duration = Duration::from_millis(250);

#[tokio::main]
async fn main() -> Result<(), DynError> {
    // The layer reports ejections (WARN) and re-admissions (INFO) through `tracing`.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_target(false)
        .try_init()?;

    // 1. Four HTTP/1 servers on loopback. `broken` is set from the start: the flaky one fails
    //    from its first request, like an instance that came up without its database.
    let broken = Arc::new(AtomicBool::new(true));
    // The health checks each server answered, counted apart from the callers' requests.
    let checks = Arc::new(AtomicUsize::new(0));
    let mut servers = Vec::new();
    for name in NAMES {
        let flag = (name == FLAKY).then(|| broken.clone());
        let checked = (name == FLAKY).then(|| checks.clone());
        servers.push(Server::start(name, flag, checked).await?);
    }
    let flaky = servers
        .iter()
        .position(|s| s.name == FLAKY)
        .ok_or("no flaky server")?;
    // The monitor names endpoints by their discover key, as `Debug` prints it.
    let flaky_key = format!("{:?}", servers[flaky].addr);

    // 2. The layer, as the README recommends: three failures in a row (or under 80 % success over
    //    10 s) eject, for 1 s growing to 5 s while the server stays bad; at most half the set is
    //    out, never the last endpoint. `ServerErrors` counts 5xx responses as failures (the
    //    default, `NetworkErrors`, counts only transport errors and would take a 503 for a
    //    perfectly good answer). The probe checks an ejected server's `/healthz` through a clone
    //    of its service: it is back once that answers, and no caller's request pays to find out.
    let outliers =
        OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?))
            .classifier(ServerErrors)
            .discover_errors(DiscoverErrors::KeepServing)
            .probe(request_probe(
                || Request::get("/healthz").body(Empty::new()).unwrap(),
                ServerErrors,
            ));
    // Taken before the layer is consumed; it shows what the layer decided.
    let monitor = outliers.monitor();

    // Service discovery: a channel of changes keyed by address. A real client feeds it from DNS,
    // Consul, Kubernetes...; keeping `discovery` alive keeps the stream open for more changes.
    let (discovery, changes) =
        mpsc::unbounded::<Result<Change<SocketAddr, PinnedClient<Empty<Bytes>>>, Infallible>>();
    for server in &servers {
        discovery.unbounded_send(Ok(Change::Insert(
            server.addr,
            PinnedClient::new(server.addr),
        )))?;
    }

    // discovery -> outlier detection -> p2c balancer -> buffer. The buffer makes the balancer
    // `Clone` (one clone per request) and drives it from its own task.
    let client = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(changes);

    // 3a. Warm-up, with the flaky server broken from the start. The layer ejects it on its third
    //     failure in a row. Requests go one at a time until then (in a batch, the ones already
    //     in flight to it when the third failed would fail too); we read the monitor after each.
    println!("\n== (a) warm-up: {FLAKY} answers 503 from the start ==");
    let before = received(&servers);
    let mut errors_seen = 0;
    // (requests the flaky server had received, requests sent) when the ejection showed.
    let mut ejection = None;
    let mut sent = 0;
    while sent < REQUESTS {
        if ejection.is_some() && !certainly_ejected(&monitor, &flaky_key, MARGIN) {
            println!("(stopping early: its next check is about to run)");
            break;
        }
        if ejection.is_none() {
            errors_seen += usize::from(send(&client).await?.is_server_error());
            sent += 1;
        } else {
            errors_seen += send_batch(&client).await?;
            sent += BATCH;
        }
        if ejection.is_none() && status(&monitor, &flaky_key) == Some(EndpointStatus::Ejected) {
            ejection = Some((since(&servers, &before)[flaky], sent));
        }
    }
    let warm_up = since(&servers, &before);
    print_table(&servers, &warm_up, &monitor, "server", "requests");
    let Some((before_ejection, sent_before_ejection)) = ejection else {
        return Err(format!("{FLAKY} was never ejected during the warm-up").into());
    };
    // Only whole batches sent after the monitor showed the ejection count as "after".
    let sent_while_ejected_a = sent - sent_before_ejection;
    let after_ejection_a = warm_up[flaky] - before_ejection;
    println!(
        "{FLAKY} received {before_ejection} requests before its ejection and {after_ejection_a} \
         of the {sent_while_ejected_a} sent after it; the callers saw {errors_seen} errors (503)"
    );

    // 3b. More traffic while it is ejected: the balancer no longer sees it, the others share it.
    println!("\n== (b) {FLAKY} is ejected ==");
    let before = received(&servers);
    let mut sent_while_ejected_b = 0;
    while sent_while_ejected_b < REQUESTS {
        if !certainly_ejected(&monitor, &flaky_key, MARGIN) {
            println!("(stopping early: its next check is about to run)");
            break;
        }
        errors_seen += send_batch(&client).await?;
        sent_while_ejected_b += BATCH;
    }
    let while_ejected = since(&servers, &before);
    print_table(&servers, &while_ejected, &monitor, "server", "requests");

    // 3c. The server heals. The probe's next check of `/healthz` passes, and the layer puts the
    //     server back in the balancer's set; no caller's request was spent finding out. The
    //     layer works when the balancer polls it, so the callers' traffic goes on meanwhile.
    broken.store(false, Ordering::SeqCst);
    let healed = std::time::Instant::now();
    println!("\n== (c) {FLAKY} heals ==");
    while status(&monitor, &flaky_key) == Some(EndpointStatus::Ejected) {
        if healed.elapsed() > Duration::from_secs(10) {
            return Err(format!("{FLAKY} was not back within 10 s of healing").into());
        }
        errors_seen += send_batch(&client).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "{FLAKY} back in the set {:.1?} after it healed (checks of its /healthz so far: {})",
        healed.elapsed(),
        checks.load(Ordering::SeqCst)
    );
    let before = received(&servers);
    let errors_before = errors_seen;
    for _ in 0..REQUESTS / BATCH {
        errors_seen += send_batch(&client).await?;
    }
    let recovered = since(&servers, &before);
    print_table(&servers, &recovered, &monitor, "server", "requests");
    let final_status = status(&monitor, &flaky_key);

    // 4. The demo's claims, checked: this example doubles as a smoke test.
    let mut failures = Vec::new();
    let sent_while_ejected = sent_while_ejected_a + sent_while_ejected_b;
    let received_while_ejected = after_ejection_a + while_ejected[flaky];
    if sent_while_ejected == 0 {
        failures.push("no request was sent while it was ejected".to_string());
    }
    if received_while_ejected > 0 {
        failures.push(format!(
            "{FLAKY} received {received_while_ejected} requests while ejected"
        ));
    }
    for (server, &n) in servers.iter().zip(&while_ejected) {
        if server.name != FLAKY && n == 0 && sent_while_ejected_b > 0 {
            failures.push(format!(
                "{} received nothing while {FLAKY} was out",
                server.name
            ));
        }
    }
    if recovered[flaky] == 0 {
        failures.push(format!("{FLAKY} received no request after it healed"));
    }
    if !final_status.is_some_and(|s| s.is_available()) {
        failures.push(format!("{FLAKY} is {final_status:?} after it healed"));
    }
    if errors_seen != errors_before {
        failures.push(format!(
            "{} errors after it healed",
            errors_seen - errors_before
        ));
    }
    drop(discovery);
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    println!(
        "\nOK: {FLAKY} failed {before_ejection} requests, was ejected, received none of the \
         {sent_while_ejected} sent while it was out (its /healthz was checked instead), and {} \
         of {REQUESTS} once it had healed.",
        recovered[flaky]
    );
    Ok(())
}

impl Server {
    /// Binds 127.0.0.1 on a port the OS picks and serves HTTP/1 from a background task: 200 with
    /// the server's name, or 503 while `broken` is given and set. Requests for `/healthz` (the
    /// probe's) are counted in `checks`, not as received requests.
    async fn start(
        name: &'static str,
        broken: Option<Arc<AtomicBool>>,
        checks: Option<Arc<AtomicUsize>>,
    ) -> Result<Self, DynError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(AtomicUsize::new(0));
        let counter = received.clone();
        let handler = hyper::service::service_fn(move |request: Request<Incoming>| {
            // Counted here, on the server, so the tables show what the servers actually saw.
            if request.uri().path() == "/healthz" {
                if let Some(checks) = &checks {
                    checks.fetch_add(1, Ordering::SeqCst);
                }
            } else {
                counter.fetch_add(1, Ordering::SeqCst);
            }
            let failing = broken.as_ref().is_some_and(|b| b.load(Ordering::SeqCst));
            let mut response = Response::new(Full::new(Bytes::from(name)));
            if failing {
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        tracing::warn!(server = name, %error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let handler = handler.clone();
                tokio::spawn(async move {
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), handler);
                    if let Err(error) = connection.await {
                        tracing::debug!(server = name, %error, "connection ended with an error");
                    }
                });
            }
        });
        Ok(Server {
            name,
            addr,
            received,
        })
    }
}

/// Sends one request through the balancer and reads the whole body, so the connection goes back
/// to its pool. A 503 is an `Ok` response: the layer counts it, the caller gets it.
async fn send<S>(client: &S) -> Result<StatusCode, DynError>
where
    S: Service<Request<Empty<Bytes>>, Response = Response<Incoming>, Error = BoxError> + Clone,
{
    let request = Request::get("/").body(Empty::new())?;
    let response = client.clone().oneshot(request).await?;
    let status = response.status();
    response.into_body().collect().await?;
    Ok(status)
}

/// Sends `BATCH` requests at once, waits for all of them and returns how many got a 5xx.
async fn send_batch<S>(client: &S) -> Result<usize, DynError>
where
    S: Service<Request<Empty<Bytes>>, Response = Response<Incoming>, Error = BoxError> + Clone,
{
    let statuses = futures::future::try_join_all((0..BATCH).map(|_| send(client))).await?;
    Ok(statuses.iter().filter(|s| s.is_server_error()).count())
}
