//! A generated tonic client balanced over three tonic servers, one of which answers UNAVAILABLE.
//! The outlier-detection layer, on the README's recommended configuration and classifying with
//! the gRPC status, ejects it at its third failure in a row; the balancer stops sending it calls;
//! the layer's gRPC health probe checks it while it is out, and brings it back once it heals.
//!
//! ```text
//! cargo run --example tonic_client
//! ```
//!
//! The servers implement the standard gRPC health service (`grpc.health.v1.Health`), whose
//! generated client and server come with the `tonic-health` crate, so no `protoc` is needed. Each
//! server gets its own tonic `Channel`; the channels are fed as `Change::Insert`s through a
//! channel-backed discover stream into the layer, p2c and a buffer, and the generated
//! `HealthClient` calls through that stack as it would through a single `Channel`.
//!
//! Everything runs on loopback (127.0.0.1, ports picked by the OS) and ends by itself in a few
//! seconds. The example checks its own claims and exits non-zero if one does not hold, so it
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

use futures::channel::mpsc;
use futures::stream::BoxStream;
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder};
use tower_outlier::grpc::{GrpcBody, GrpcErrors};
use tower_outlier::grpc_health::GrpcHealth;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, DiscoverErrors, EndpointStatus, OutlierDetectionLayer,
};

type DynError = Box<dyn Error + Send + Sync>;

/// The servers of the demo; `FLAKY` answers UNAVAILABLE while the shared `broken` flag is set.
const NAMES: [&str; 3] = ["alpha", "bravo", "charlie"];
const FLAKY: &str = "charlie";

/// The service the layer's health probe asks about; the client's own calls ask about `""`.
const PROBED: &str = "demo";

/// Calls per phase: enough that p2c, which picks at random, sends every server its share many
/// times over, so the checks at the end cannot pass or fail by luck.
const REQUESTS: usize = 200;

/// Calls are sent in concurrent batches of this size, so p2c sees load (calls in flight) when it
/// compares two endpoints, and spreads the batch. The monitor is read between batches; each batch
/// is sent only after the previous one has completed.
const BATCH: usize = 20;

/// Once the flaky server is ejected, a batch is sent only while its recovery check is at least
/// this far off, so every call counted as "sent while it was ejected" certainly was, even on a
/// slow machine.
const MARGIN: Duration = Duration::from_millis(250);

/// The client stack, boxed so that helper functions can name it: an HTTP/2 request with a tonic
/// body in, a response whose body records the gRPC status from the trailers out.
type Balanced = BoxCloneService<http::Request<Body>, http::Response<GrpcBody<Body>>, BoxError>;

#[tokio::main]
async fn main() -> Result<(), DynError> {
    // The layer reports ejections (WARN) and re-admissions (INFO) through `tracing`.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_target(false)
        .try_init()?;

    // 1. Three tonic servers on loopback. `broken` is set from the start: the flaky one fails
    //    from its first call, like an instance that came up without its database.
    let broken = Arc::new(AtomicBool::new(true));
    let mut servers = Vec::new();
    for name in NAMES {
        let flag = (name == FLAKY).then(|| broken.clone());
        servers.push(Server::start(name, flag).await?);
    }
    let flaky = servers
        .iter()
        .position(|s| s.name == FLAKY)
        .ok_or("no flaky server")?;
    // The monitor names endpoints by their discover key, as `Debug` prints it.
    let flaky_key = format!("{:?}", servers[flaky].addr);

    // 2. The recommended configuration: three failures in a row (or under 80 % success over
    //    10 s) eject, at most half the fleet is out, and an ejected server is checked after a
    //    back-off of 1 s growing to 5 s.
    let config = DetectorConfig::recommended().build()?;
    // `GrpcErrors` reads the gRPC status (from the headers of a trailers-only response, else from
    // the trailers) and counts UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN,
    // RESOURCE_EXHAUSTED and DATA_LOSS as failures. The default classifier, `NetworkErrors`,
    // counts only transport errors: to it every gRPC error is a good HTTP/2 response.
    //
    // The probe is gRPC health checking (gRFC A17): `Health/Check` for the service named, each
    // time an ejected server's check is due, and `Health/Watch` on every server (these servers
    // do not implement Watch, which counts as serving). It asks about the `demo` service so the
    // servers can tell its checks from the client's calls (service `""`), which are the only
    // ones the tables count.
    let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(config))
        .classifier(GrpcErrors::default())
        .discover_errors(DiscoverErrors::KeepServing)
        .probe(GrpcHealth::new(PROBED));
    // Taken before the layer is consumed; it shows what the layer decided.
    let monitor = outliers.monitor();

    // Service discovery: a channel of changes keyed by address, one tonic `Channel` per server. A
    // real client feeds it from DNS, Consul, Kubernetes...; keeping `discovery` alive keeps the
    // stream open for more changes. `connect_lazy` connects on the first call, so a server that
    // is down shows up as failed calls rather than as an error here.
    let (discovery, changes) = mpsc::unbounded::<Result<Change<SocketAddr, Channel>, Infallible>>();
    for server in &servers {
        let channel = Endpoint::from_shared(format!("http://{}", server.addr))?.connect_lazy();
        discovery.unbounded_send(Ok(Change::Insert(server.addr, channel)))?;
    }

    // discovery -> outlier detection -> p2c balancer -> buffer, under the generated client. The
    // buffer makes the stack `Clone` (one clone per call) and drives the balancer from its own
    // task; each `Channel` sets its own server's authority on the requests it sends.
    let stack = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(changes);
    let client: HealthClient<Balanced> = HealthClient::new(BoxCloneService::new(stack));

    // 3a. Warm-up, with the flaky server broken from the start. The layer ejects it at its third
    //     failure in a row; we read the monitor after each batch to catch that.
    println!("\n== (a) warm-up: {FLAKY} answers UNAVAILABLE from the start ==");
    let before = received(&servers);
    let mut errors_seen = 0;
    // (calls the flaky server had received, calls sent) when the ejection showed.
    let mut ejection = None;
    let mut sent = 0;
    while sent < REQUESTS {
        if ejection.is_some() && !certainly_ejected(&monitor, &flaky_key, MARGIN) {
            println!("(stopping early: the recovery check is about to run)");
            break;
        }
        errors_seen += send_batch(&client).await?;
        sent += BATCH;
        if ejection.is_none() && status(&monitor, &flaky_key) == Some(EndpointStatus::Ejected) {
            ejection = Some((since(&servers, &before)[flaky], sent));
        }
    }
    let warm_up = since(&servers, &before);
    print_table(&servers, &warm_up, &monitor, "server", "calls");
    let Some((before_ejection, sent_before_ejection)) = ejection else {
        return Err(format!("{FLAKY} was never ejected during the warm-up").into());
    };
    // Only whole batches sent after the monitor showed the ejection count as "after".
    let sent_while_ejected_a = sent - sent_before_ejection;
    let after_ejection_a = warm_up[flaky] - before_ejection;
    println!(
        "{FLAKY} received {before_ejection} calls before its ejection and {after_ejection_a} of \
         the {sent_while_ejected_a} sent after it; the client saw {errors_seen} UNAVAILABLE errors"
    );

    // 3b. More calls while it is ejected: the balancer no longer sees it, the others share them.
    println!("\n== (b) {FLAKY} is ejected ==");
    let before = received(&servers);
    let mut sent_while_ejected_b = 0;
    while sent_while_ejected_b < REQUESTS {
        if !certainly_ejected(&monitor, &flaky_key, MARGIN) {
            println!("(stopping early: the recovery check is about to run)");
            break;
        }
        errors_seen += send_batch(&client).await?;
        sent_while_ejected_b += BATCH;
    }
    let while_ejected = since(&servers, &before);
    print_table(&servers, &while_ejected, &monitor, "server", "calls");

    // 3c. The server heals. At its next check the probe's `Health/Check` answers SERVING and
    //     the layer re-admits it; no client call is spent finding out.
    broken.store(false, Ordering::SeqCst);
    let due_in = monitor
        .snapshot()
        .get(&flaky_key)
        .and_then(|e| e.next_check_in)
        .unwrap_or_default();
    println!("\n== (c) {FLAKY} heals; its recovery check is due in {due_in:.1?} ==");
    tokio::time::sleep(due_in + Duration::from_millis(100)).await;
    let before = received(&servers);
    let errors_before = errors_seen;
    for _ in 0..REQUESTS / BATCH {
        errors_seen += send_batch(&client).await?;
    }
    let recovered = since(&servers, &before);
    print_table(&servers, &recovered, &monitor, "server", "calls");
    let final_status = status(&monitor, &flaky_key);

    // 4. The demo's claims, checked: this example doubles as a smoke test.
    let mut failures = Vec::new();
    let sent_while_ejected = sent_while_ejected_a + sent_while_ejected_b;
    let received_while_ejected = after_ejection_a + while_ejected[flaky];
    if sent_while_ejected == 0 {
        failures.push("no call was sent while it was ejected".to_string());
    }
    if received_while_ejected > 0 {
        failures.push(format!(
            "{FLAKY} received {received_while_ejected} calls while ejected"
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
        failures.push(format!("{FLAKY} received no call after it healed"));
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
        "\nOK: {FLAKY} failed {before_ejection} calls, was ejected, received none of the \
         {sent_while_ejected} sent while it was out, and {} of {REQUESTS} once it had healed.",
        recovered[flaky]
    );
    Ok(())
}

impl Server {
    /// Binds 127.0.0.1 on a port the OS picks and serves the gRPC health service from a
    /// background task: SERVING, or UNAVAILABLE while `broken` is given and set.
    async fn start(name: &'static str, broken: Option<Arc<AtomicBool>>) -> Result<Self, DynError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(AtomicUsize::new(0));
        let health = DemoHealth {
            received: received.clone(),
            broken,
        };
        // tonic accepts any stream of connections; this one is the listener's.
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.map(|(stream, _)| {
                // Small calls on a kept-alive connection: don't let Nagle delay them.
                let _ = stream.set_nodelay(true);
                stream
            });
            Some((accepted, listener))
        });
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(HealthServer::new(health))
                .serve_with_incoming(incoming)
                .await;
            if let Err(error) = served {
                tracing::warn!(server = name, %error, "server stopped");
            }
        });
        Ok(Server {
            name,
            addr,
            received,
        })
    }
}

/// A demo server's implementation of the generated `Health` trait.
struct DemoHealth {
    received: Arc<AtomicUsize>,
    broken: Option<Arc<AtomicBool>>,
}

#[tonic::async_trait]
impl Health for DemoHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        // Counted here, on the server, so the tables show what the servers actually saw: the
        // client's calls, not the layer's health checks.
        if request.get_ref().service != PROBED {
            self.received.fetch_add(1, Ordering::SeqCst);
        }
        if self
            .broken
            .as_ref()
            .is_some_and(|b| b.load(Ordering::SeqCst))
        {
            return Err(Status::unavailable("lost its database"));
        }
        Ok(Response::new(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        }))
    }

    type WatchStream = BoxStream<'static, Result<HealthCheckResponse, Status>>;

    async fn watch(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("the demo only answers Check"))
    }
}

/// One `Check` call through the balancer. UNAVAILABLE is an answer the layer counts and the
/// caller sees (`Ok(false)`); any other error ends the demo.
async fn call(client: &HealthClient<Balanced>) -> Result<bool, DynError> {
    let mut client = client.clone();
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let answer = tokio::time::timeout(Duration::from_secs(5), client.check(request))
        .await
        .map_err(|_| "a call took more than 5 s")?;
    match answer {
        Ok(response) if response.get_ref().status() == ServingStatus::Serving => Ok(true),
        Ok(response) => Err(format!("unexpected answer {:?}", response.get_ref().status()).into()),
        Err(status) if status.code() == Code::Unavailable => Ok(false),
        Err(status) => Err(status.into()),
    }
}

/// Sends `BATCH` calls at once, waits for all of them and returns how many got UNAVAILABLE.
async fn send_batch(client: &HealthClient<Balanced>) -> Result<usize, DynError> {
    let answers = futures::future::try_join_all((0..BATCH).map(|_| call(client))).await?;
    Ok(answers.iter().filter(|ok| !**ok).count())
}
