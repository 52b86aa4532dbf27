//! The admin component (`tower_outlier::admin::Admin`, feature `admin`) mounted in an axum
//! server: what an operator's browser, a script and Prometheus read from a running client.
//!
//! ```text
//! cargo run --example admin             # runs, checks its own pages, exits
//! cargo run --example admin -- --serve  # then keeps serving (and sending traffic) until Ctrl-C
//! ```
//!
//! Four upstream HTTP servers on loopback, one of which answers 503 to every request, behind a
//! hyper-util client, a per-endpoint timeout, the layer (the recommended configuration with a probe
//! of `/healthz`, `ServerErrors`), p2c and a buffer. The example sends traffic until the failing upstream is ejected, then serves the
//! component under `/outliers` on another loopback port:
//!
//! | path | what |
//! |---|---|
//! | `GET /outliers` | the page: per endpoint its status, since when it is out, next check, reason, and a timeline of the last minutes |
//! | `GET /outliers/snapshot` | the monitor's snapshot as JSON |
//! | `GET /outliers/history` | the sampled history as JSON (`?since=<seq>&limit=<n>` for a page) |
//! | `GET /outliers/events` | the layer's last events as JSON |
//! | `GET /outliers/events/stream` | the events live, as server-sent events |
//! | `GET /outliers/metrics` | the layer's Prometheus metrics (`tower_outlier::metrics`), OpenMetrics text |
//!
//! It then reads its own pages through a hyper-util client, as any outside client would, checks
//! what they say, and exits 1 (`CLAIM FAILED: ...`) if a claim does not hold.

#[path = "demo/mod.rs"]
mod demo;

use demo::{print_table, received, since, Counted as Upstream};
use std::convert::Infallible;
use std::error::Error;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::header::CONTENT_TYPE;
use axum::Router;
use bytes::Bytes;
use futures::channel::mpsc;
use futures::TryStreamExt;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::net::TcpListener;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::timeout::Timeout;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_outlier::admin::Admin;
use tower_outlier::hyper_client::PinnedClient;
use tower_outlier::probe::request_probe;
use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, DiscoverErrors, EndpointStatus, Monitor, OutlierDetectionLayer,
    ServerErrors,
};

/// The path the layer's probe checks; the upstreams count the clients' requests only.
const HEALTH: &str = "/healthz";

/// One upstream, as discovery hands it to the balancer.
type Endpoint = PinnedClient<Empty<Bytes>>;

type DynError = Box<dyn Error + Send + Sync>;

/// The upstreams; `FAILING` answers 503 to every request.
const NAMES: [&str; 4] = ["alpha", "bravo", "charlie", "delta"];
const FAILING: &str = "charlie";

/// How long one upstream may take to answer before the call counts as a failure.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// Requests go out in concurrent batches of this size (p2c needs requests in flight to spread
/// them); each batch completes before the next starts.
const BATCH: usize = 20;

/// Batches sent after the ejection shows, to check that the failing upstream gets none of them.
const BATCHES_WHILE_EJECTED: usize = 5;

/// How long to wait for anything (the ejection, a page) before calling it a failure: generous,
/// for a loaded machine. The whole run takes well under a second when nothing is wrong.
const PATIENCE: Duration = Duration::from_secs(10);

/// The content type of what `prometheus_client::encoding::text::encode` writes: OpenMetrics
/// text, ending in `# EOF`.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The balanced client, boxed so that its type can be written down.
type Balanced = BoxCloneSyncService<Request<Empty<Bytes>>, Response<Incoming>, BoxError>;

#[tokio::main]
async fn main() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_target(false)
        .try_init();
    let serve = std::env::args().any(|a| a == "--serve");
    let started = Instant::now();
    let failures = match run(serve).await {
        Ok(failures) => failures,
        Err(error) => vec![format!("the demo stopped: {error}")],
    };
    if !failures.is_empty() {
        for failure in &failures {
            eprintln!("CLAIM FAILED: {failure}");
        }
        std::process::exit(1);
    }
    println!("\nOK in {:.1?}", started.elapsed());
}

/// Runs the demo; returns the claims that did not hold (none: success).
async fn run(serve: bool) -> Result<Vec<String>, DynError> {
    let mut failures = Vec::new();

    let demo = Demo::start().await?;
    let failing_key = demo.failing_key();
    println!(
        "admin on http://{0}/outliers  (/outliers/snapshot, /outliers/events, /outliers/metrics)",
        demo.admin
    );

    // 1. Traffic until the failing upstream is ejected, then more while it is out.
    let before = received(&demo.upstreams);
    let (ejected_after, statuses) = demo.eject().await?;
    println!("\n== {FAILING} answers 503 to every request ==");
    print_table(
        &demo.upstreams,
        &since(&demo.upstreams, &before),
        &demo.monitor,
        "upstream",
        "requests",
    );
    println!("ejected after {ejected_after} requests; the client got {statuses}");
    let before = received(&demo.upstreams);
    let mut while_ejected = Statuses::default();
    for _ in 0..BATCHES_WHILE_EJECTED {
        while_ejected.add(demo.send_batch().await?);
    }
    let counts = since(&demo.upstreams, &before);
    if counts[demo.failing] > 0 {
        failures.push(format!(
            "{FAILING} received {} requests while ejected",
            counts[demo.failing]
        ));
    }
    if while_ejected.ok != BATCHES_WHILE_EJECTED * BATCH {
        failures.push(format!(
            "errors while {FAILING} was ejected: {while_ejected}"
        ));
    }

    // 2. The admin pages, read over HTTP.
    let admin = AdminClient::new(demo.admin);
    let checks: [(&str, Check); 4] = [
        ("/outliers/snapshot", check_snapshot),
        ("/outliers", check_page),
        ("/outliers/metrics", check_metrics),
        ("/outliers/events", check_events),
    ];
    let mut pages = Vec::new();
    // The monitor and the counters are up to date once the ejection shows; the retries are for
    // a machine too loaded to answer in time, within one deadline for all the pages.
    let deadline = Instant::now() + PATIENCE;
    for (path, check) in checks {
        let outcome = loop {
            let outcome = match admin.get(path).await {
                Ok(page) => check(&page, &demo).map(|()| page),
                Err(error) => Err(vec![format!("GET {path}: {error}")]),
            };
            if outcome.is_ok() || Instant::now() >= deadline {
                break outcome;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        match outcome {
            Ok(page) => pages.push((path, page)),
            Err(problems) => failures.extend(problems.into_iter().map(|p| format!("{path}: {p}"))),
        }
    }

    // 3. What the pages said.
    println!("\n== the admin pages ==");
    for (path, page) in &pages {
        println!(
            "GET {path}: {} {}, {} bytes",
            page.status,
            page.content_type,
            page.body.len()
        );
        match *path {
            "/outliers/snapshot" => {
                let json: Value = serde_json::from_str(&page.body)?;
                let failing = endpoints(&json)
                    .into_iter()
                    .find(|e| e["key"] == failing_key.as_str());
                if let Some(e) = failing {
                    println!("  {failing_key}: {e}");
                }
            }
            "/outliers/metrics" => {
                for line in page.body.lines().filter(|l| {
                    l.starts_with("outlier_ejections_total")
                        || l.starts_with("outlier_ejections_active")
                        || l.starts_with("outlier_endpoints{")
                }) {
                    println!("  {line}");
                }
            }
            _ => {}
        }
    }

    if serve && failures.is_empty() {
        println!(
            "\nserving http://{}/outliers until Ctrl-C (a batch of requests every second)",
            demo.admin
        );
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    demo.send_batch().await?;
                }
            }
        }
    }
    Ok(failures)
}

/// The running demo: the upstreams, the balanced client, the layer's monitor and the admin
/// server's address.
struct Demo {
    upstreams: Vec<Upstream>,
    /// The index of the failing upstream in `upstreams`.
    failing: usize,
    balancer: Balanced,
    monitor: Monitor,
    admin: SocketAddr,
    /// Keeps the discover stream open.
    _discovery: mpsc::UnboundedSender<Result<Change<SocketAddr, Endpoint>, Infallible>>,
}

impl Demo {
    /// Starts the upstreams, the balanced client and the admin server; sends no request.
    async fn start() -> Result<Demo, DynError> {
        let mut upstreams = Vec::new();
        for name in NAMES {
            upstreams.push(Upstream::start(name, name == FAILING).await?);
        }
        let failing = upstreams
            .iter()
            .position(|u| u.name == FAILING)
            .ok_or("no failing upstream")?;

        // The recommended configuration: three failures in a row (or under 80 % success over
        // 10 s) eject, at most half the fleet is out; an ejected upstream's `/healthz` is checked
        // after a back-off of 1 s growing to 5 s, and it stays out while that answers 503 (here:
        // for as long as the example runs).
        // Beside it, a Sentinel breaker whose state the page shows: it needs 1 000 calls a second
        // to judge, so here it stays CLOSED and the recommended policy does the ejecting.
        let breaker = SlowCallPolicy::new(
            BreakerConfig::error_ratio(0.5)
                .min_calls(1_000)
                .open_duration(Duration::from_secs(10))
                .build()?,
        );
        let outliers =
            OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?))
                .with_policy(breaker)
                .classifier(ServerErrors)
                .discover_errors(DiscoverErrors::KeepServing)
                .probe(request_probe(
                    || Request::get(HEALTH).body(Empty::new()).unwrap(),
                    ServerErrors,
                ));
        let monitor = outliers.monitor();
        // Registered before any traffic: the counters count events from now on.
        let mut registry = Registry::default();
        tower_outlier::metrics::OutlierMetrics::register(&mut registry).watch("orders", &monitor);
        // The admin component keeps its events and history from now on.
        let admin = Admin::builder(&monitor)
            .metrics(Arc::new(registry))
            .sample_every(Duration::from_millis(100))
            .build();

        let (discovery, changes) = mpsc::unbounded();
        for upstream in &upstreams {
            discovery.unbounded_send(Ok(Change::Insert(
                upstream.addr,
                PinnedClient::new(upstream.addr),
            )))?;
        }
        let changes = changes.map_ok(|change| match change {
            Change::Insert(addr, backend) => {
                Change::Insert(addr, Timeout::new(backend, UPSTREAM_TIMEOUT))
            }
            Change::Remove(addr) => Change::Remove(addr),
        });
        let balancer: Balanced = ServiceBuilder::new()
            .layer(BoxCloneSyncService::layer())
            .buffer(1024)
            .layer_fn(Balance::new)
            .layer(outliers)
            .service(changes);

        let app = Router::new().nest_service("/outliers", admin);
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let admin = listener.local_addr()?;
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "the admin server stopped");
            }
        });
        Ok(Demo {
            upstreams,
            failing,
            balancer,
            monitor,
            admin,
            _discovery: discovery,
        })
    }

    /// The failing upstream's key, as the monitor prints it (`Debug` of its `SocketAddr`).
    fn failing_key(&self) -> String {
        format!("{:?}", self.upstreams[self.failing].addr)
    }

    /// Sends batches until the monitor shows the failing upstream ejected; returns how many
    /// requests that took and what the client got.
    async fn eject(&self) -> Result<(usize, Statuses), DynError> {
        let key = self.failing_key();
        let deadline = Instant::now() + PATIENCE;
        let mut statuses = Statuses::default();
        let mut sent = 0;
        loop {
            statuses.add(self.send_batch().await?);
            sent += BATCH;
            let status = self.monitor.snapshot().get(&key).map(|e| e.status);
            if status == Some(EndpointStatus::Ejected) {
                return Ok((sent, statuses));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{FAILING} not ejected after {sent} requests ({status:?}); the client got \
                     {statuses}"
                )
                .into());
            }
        }
    }

    /// Sends `BATCH` requests through the balancer at once and reads every body.
    async fn send_batch(&self) -> Result<Statuses, DynError> {
        let requests = (0..BATCH).map(|_| {
            let balancer = self.balancer.clone();
            async move {
                let request = Request::get("/work").body(Empty::new())?;
                let response = tokio::time::timeout(PATIENCE, balancer.oneshot(request)).await?;
                Ok::<_, DynError>(match response {
                    Ok(response) => {
                        let status = response.status();
                        response.into_body().collect().await?;
                        Some(status)
                    }
                    Err(_) => None,
                })
            }
        });
        let mut counts = Statuses::default();
        for status in futures::future::try_join_all(requests).await? {
            match status {
                Some(StatusCode::OK) => counts.ok += 1,
                Some(StatusCode::SERVICE_UNAVAILABLE) => counts.unavailable += 1,
                _ => counts.other += 1,
            }
        }
        Ok(counts)
    }
}

// ---------------------------------------------------------------------------------------------
// Reading the admin pages, and what they must say.

/// One page as the admin client read it.
struct Page {
    status: StatusCode,
    content_type: String,
    body: String,
}

type Check = fn(&Page, &Demo) -> Result<(), Vec<String>>;

struct AdminClient {
    client: Client<HttpConnector, Empty<Bytes>>,
    admin: SocketAddr,
}

impl AdminClient {
    fn new(admin: SocketAddr) -> Self {
        AdminClient {
            client: Client::builder(TokioExecutor::new()).build_http(),
            admin,
        }
    }

    async fn get(&self, path: &str) -> Result<Page, DynError> {
        let uri: Uri = format!("http://{}{path}", self.admin).parse()?;
        let response = tokio::time::timeout(PATIENCE, self.client.get(uri)).await??;
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = tokio::time::timeout(PATIENCE, response.into_body().collect())
            .await??
            .to_bytes();
        Ok(Page {
            status,
            content_type,
            body: String::from_utf8(body.to_vec())?,
        })
    }
}

fn endpoints(json: &Value) -> Vec<&Value> {
    json["endpoints"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn expect_ok(page: &Page, content_type: &str, problems: &mut Vec<String>) {
    if page.status != StatusCode::OK {
        problems.push(format!("status {}", page.status));
    }
    if page.content_type != content_type {
        problems.push(format!(
            "content type {:?}, not {content_type:?}",
            page.content_type
        ));
    }
}

fn done(problems: Vec<String>) -> Result<(), Vec<String>> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// `/outliers/snapshot`: the snapshot as JSON; the failing upstream ejected by its streak of
/// failures, with its reason, its gate OPEN (calls held) and its next check; the others
/// available, their gates CLOSED.
fn check_snapshot(page: &Page, demo: &Demo) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    expect_ok(page, "application/json", &mut problems);
    let json: Value = serde_json::from_str(&page.body)
        .map_err(|e| vec![format!("not JSON ({e}): {}", page.body)])?;
    if json["rules_version"] != 0 || !json["rules_error"].is_null() {
        problems.push(format!(
            "rules: {} {}",
            json["rules_version"], json["rules_error"]
        ));
    }
    let endpoints = endpoints(&json);
    if endpoints.len() != NAMES.len() {
        problems.push(format!(
            "{} endpoints, not {}",
            endpoints.len(),
            NAMES.len()
        ));
    }
    for (i, upstream) in demo.upstreams.iter().enumerate() {
        let key = format!("{:?}", upstream.addr);
        let Some(e) = endpoints.iter().find(|e| e["key"] == key.as_str()) else {
            problems.push(format!("no endpoint {key} ({})", upstream.name));
            continue;
        };
        if i != demo.failing {
            if e["status"] != "Available"
                || e["last_reason"] != Value::Null
                || e["windows"][0]["state"] != "CLOSED"
            {
                problems.push(format!(
                    "{} should be Available, never ejected: {e}",
                    upstream.name
                ));
            }
            continue;
        }
        if e["windows"][1]["policy"] != "slow-call" || e["windows"][1]["state"] != "CLOSED" {
            problems.push(format!(
                "{}'s breaker should show CLOSED: {e}",
                upstream.name
            ));
        }
        let reason = &e["last_reason"];
        let next_in = e["next_check_in"]["secs"].as_u64().unwrap_or(u64::MAX);
        let calls = e["windows"][0]["counts"]["calls"].as_u64().unwrap_or(0);
        let failures = e["windows"][0]["counts"]["failures"].as_u64().unwrap_or(0);
        let ok = e["status"] == "Ejected"
            && reason["policy"] == "recommended"
            && reason["measure"] == "consecutive failures"
            && reason["comparison"] == "at_or_above"
            && reason["value"] == 3.0
            && reason["threshold"] == 3.0
            && next_in <= 5
            && e["next_check_at"]["secs_since_epoch"].as_u64().is_some()
            && e["windows"][0]["policy"] == "recommended"
            && e["windows"][0]["state"] == "OPEN"
            && failures == calls
            && e["weight"] == 1.0;
        if !ok {
            problems.push(format!(
                "{} should be Ejected by 3 consecutive failures with a check within 5 s: {e}",
                upstream.name
            ));
        }
    }
    done(problems)
}

/// `/outliers`: HTML that refreshes itself, one row per endpoint, the failing one ejected.
fn check_page(page: &Page, demo: &Demo) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    expect_ok(page, "text/html; charset=utf-8", &mut problems);
    let html = &page.body;
    if !html.starts_with("<!doctype html>")
        || !html.contains(r#"<meta http-equiv="refresh" content="2">"#)
    {
        problems.push("no doctype or no refresh".to_string());
    }
    for (i, upstream) in demo.upstreams.iter().enumerate() {
        // Keys are socket addresses: nothing in them to escape.
        let key = format!("{:?}", upstream.addr);
        let Some(row) = html
            .lines()
            .find(|l| l.contains(&format!("data-endpoint=\"{key}\"")))
        else {
            problems.push(format!("no row for {key} ({})", upstream.name));
            continue;
        };
        let expected = if i == demo.failing {
            "<tr class=\"out\""
        } else {
            "<tr class=\"in\""
        };
        if !row.starts_with(expected) {
            problems.push(format!("{}'s row is not {expected}: {row}", upstream.name));
        }
    }
    if html.matches("<td class=\"status\">ejected</td>").count() != 1 {
        problems.push("one endpoint should show as ejected".to_string());
    }
    done(problems)
}

/// `/metrics`: OpenMetrics text with one ejection by a streak of failures, one endpoint out.
fn check_metrics(page: &Page, _: &Demo) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    expect_ok(page, OPENMETRICS, &mut problems);
    let text = &page.body;
    if !text.ends_with("# EOF\n") {
        problems.push("does not end in # EOF".to_string());
    }
    let sample = |series: &str| -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    for (series, expected) in [
        (
            r#"outlier_ejections_total{upstream="orders",policy="recommended",measure="consecutive failures"}"#,
            1.0,
        ),
        (r#"outlier_ejections_active{upstream="orders"}"#, 1.0),
        (
            r#"outlier_endpoints{upstream="orders",status="ejected"}"#,
            1.0,
        ),
        (
            r#"outlier_endpoints{upstream="orders",status="available"}"#,
            3.0,
        ),
    ] {
        let value = sample(series);
        if value != Some(expected) {
            problems.push(format!("{series} is {value:?}, not {expected}"));
        }
    }
    done(problems)
}

/// `/events`: JSON, with the failing upstream's ejection.
fn check_events(page: &Page, demo: &Demo) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    expect_ok(page, "application/json", &mut problems);
    let json: Value = serde_json::from_str(&page.body)
        .map_err(|e| vec![format!("not JSON ({e}): {}", page.body)])?;
    let key = demo.failing_key();
    let ejections = json.as_array().map_or(0, |a| {
        a.iter()
            .filter(|e| e["kind"] == "ejected" && e["key"] == key.as_str())
            .count()
    });
    if ejections != 1 {
        problems.push(format!("{ejections} ejections of {key}, not 1: {json}"));
    }
    done(problems)
}

// ---------------------------------------------------------------------------------------------
// The upstreams and the client's backend for each.

impl Upstream {
    /// Binds 127.0.0.1 on a port the OS picks and serves every path (`/healthz` too): 200 with
    /// the upstream's name, or 503 if `failing`.
    async fn start(name: &'static str, failing: bool) -> Result<Self, DynError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(AtomicUsize::new(0));
        let counter = received.clone();
        let app = Router::new().fallback(move |uri: Uri| {
            // The clients' requests only: the layer's checks of /healthz are not theirs.
            if uri.path() != HEALTH {
                counter.fetch_add(1, Ordering::SeqCst);
            }
            async move {
                if failing {
                    (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
                } else {
                    (StatusCode::OK, name)
                }
            }
        });
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(upstream = name, %error, "the upstream stopped");
            }
        });
        Ok(Upstream {
            name,
            addr,
            received,
        })
    }
}

/// What the client got back in one phase.
#[derive(Clone, Copy, Debug, Default)]
struct Statuses {
    ok: usize,
    unavailable: usize,
    other: usize,
}

impl Statuses {
    fn add(&mut self, other: Statuses) {
        self.ok += other.ok;
        self.unavailable += other.unavailable;
        self.other += other.other;
    }
}

impl std::fmt::Display for Statuses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} × 200, {} × 503, {} other",
            self.ok, self.unavailable, self.other
        )
    }
}
