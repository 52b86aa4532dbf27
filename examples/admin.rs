//! An admin endpoint for the outlier-detection layer: what an operator's dashboard, a script and
//! Prometheus read from a running client.
//!
//! ```text
//! cargo run --example admin             # runs, checks its own pages, exits
//! cargo run --example admin -- --serve  # then keeps serving (and sending traffic) until Ctrl-C
//! ```
//!
//! Four upstream HTTP servers on loopback, one of which answers 503 to every request, behind a
//! hyper-util client, a per-endpoint timeout, the layer (HSF's preset, `ServerErrors`), p2c and a
//! buffer. The example sends traffic until the failing upstream is ejected, then serves, on
//! another loopback port:
//!
//! | path | what |
//! |---|---|
//! | `GET /` | an HTML page refreshing itself every 2 s: one row per endpoint |
//! | `GET /outliers` | JSON: the rules in force, and per endpoint its status, windows, weight, next check, last reason |
//! | `GET /metrics` | the layer's Prometheus metrics (`tower_outlier::metrics`), OpenMetrics text |
//! | `GET /events` | JSON: the layer's last 100 events (`Monitor::on_event`) |
//!
//! It then reads its own pages through a hyper-util client, as any outside client would, checks
//! what they say, and exits 1 (`CLAIM FAILED: ...`) if a claim does not hold.
//!
//! `tests/admin_page.rs` loads this file as a module to show the page to a headless browser.

#[path = "demo/mod.rs"]
mod demo;

use demo::{print_table, received, since, Counted as Upstream};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::error::Error;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;
use axum::routing::get;
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
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::timeout::Timeout;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_outlier::events::Event;
use tower_outlier::hyper_client::PinnedClient;
use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
use tower_outlier::{
    EndpointSnapshot, EndpointStatus, ErrorRateConfig, ErrorRatePolicy, Monitor,
    OutlierDetectionLayer, ServerErrors, Snapshot,
};

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

/// How many events `/events` keeps.
const EVENTS_KEPT: usize = 100;

/// The balanced client, boxed so that its type can be written down.
type Balanced = BoxCloneSyncService<Request<Empty<Bytes>>, Response<Incoming>, BoxError>;

#[allow(dead_code)] // `tests/admin_page.rs` includes this file as a module and runs no `main`.
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
    self_check(&mut failures);

    let demo = Demo::start().await?;
    let failing_key = demo.failing_key();
    println!(
        "admin on http://{0}/  (JSON: /outliers, metrics: /metrics, events: /events)",
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
        ("/outliers", check_outliers),
        ("/", check_page),
        ("/metrics", check_metrics),
        ("/events", check_events),
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
            "/outliers" => {
                let json: Value = serde_json::from_str(&page.body)?;
                let failing = endpoints(&json)
                    .into_iter()
                    .find(|e| e["key"] == failing_key.as_str());
                if let Some(e) = failing {
                    println!("  {failing_key}: {e}");
                }
            }
            "/metrics" => {
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
            "\nserving http://{}/ until Ctrl-C (a batch of requests every second)",
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
pub(crate) struct Demo {
    pub(crate) upstreams: Vec<Upstream>,
    /// The index of the failing upstream in `upstreams`.
    pub(crate) failing: usize,
    balancer: Balanced,
    monitor: Monitor,
    pub(crate) admin: SocketAddr,
    /// Keeps the discover stream open.
    _discovery: mpsc::UnboundedSender<Result<Change<SocketAddr, Endpoint>, Infallible>>,
}

impl Demo {
    /// Starts the upstreams, the balanced client and the admin server; sends no request.
    pub(crate) async fn start() -> Result<Demo, DynError> {
        let mut upstreams = Vec::new();
        for name in NAMES {
            upstreams.push(Upstream::start(name, name == FAILING).await?);
        }
        let failing = upstreams
            .iter()
            .position(|u| u.name == FAILING)
            .ok_or("no failing upstream")?;

        // HSF's preset: more than 50 % errors over at least 10 calls in a 10 s window ejects; at
        // most 20 % of the endpoints are out, and at least one; the first check comes 60 s after
        // the ejection (so here: never, while the example runs).
        // Beside it, a Sentinel breaker whose state the page shows: it needs 1 000 calls a second
        // to judge, so here it stays CLOSED and the error-rate policy does the ejecting.
        let breaker = SlowCallPolicy::new(
            BreakerConfig::error_ratio(0.5)
                .min_requests(1_000)
                .open_duration(Duration::from_secs(10))
                .build()?,
        );
        let outliers =
            OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?))
                .with_policy(breaker)
                .classifier(ServerErrors);
        let monitor = outliers.monitor();
        // Registered before any traffic: the counters count events from now on.
        let mut registry = Registry::default();
        tower_outlier::metrics::OutlierMetrics::register(&mut registry).watch("orders", &monitor);
        let events = Arc::new(Mutex::new(VecDeque::new()));
        let kept = events.clone();
        monitor.on_event(move |event| {
            // On the adaptor's task: keep it short.
            let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() == EVENTS_KEPT {
                kept.pop_front();
            }
            kept.push_back((SystemTime::now(), event.clone()));
        });

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

        let app = admin_router(AdminState {
            monitor: monitor.clone(),
            registry: Arc::new(registry),
            events,
        });
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
    pub(crate) fn failing_key(&self) -> String {
        format!("{:?}", self.upstreams[self.failing].addr)
    }

    /// Sends batches until the monitor shows the failing upstream ejected; returns how many
    /// requests that took and what the client got.
    pub(crate) async fn eject(&self) -> Result<(usize, Statuses), DynError> {
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
// The admin server.

/// What the admin handlers read.
#[derive(Clone)]
struct AdminState {
    monitor: Monitor,
    registry: Arc<Registry>,
    events: Arc<Mutex<VecDeque<(SystemTime, Event)>>>,
}

fn admin_router(state: AdminState) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/outliers", get(outliers))
        .route("/metrics", get(metrics))
        .route("/events", get(events))
        .with_state(state)
}

/// `GET /outliers`: the snapshot as JSON.
async fn outliers(State(state): State<AdminState>) -> impl IntoResponse {
    let json = snapshot_json(&state.monitor.snapshot(), SystemTime::now());
    (
        [
            (CONTENT_TYPE, "application/json"),
            (CACHE_CONTROL, "no-store"),
        ],
        json.to_string(),
    )
}

/// `GET /metrics`: the registry in the text format `prometheus_client` writes (OpenMetrics).
async fn metrics(State(state): State<AdminState>) -> axum::response::Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        Ok(()) => ([(CONTENT_TYPE, OPENMETRICS)], text).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

/// `GET /events`: the last events, oldest first, as JSON.
async fn events(State(state): State<AdminState>) -> impl IntoResponse {
    let events: Vec<Value> = state
        .events
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(at, event)| event_json(*at, event))
        .collect();
    (
        [
            (CONTENT_TYPE, "application/json"),
            (CACHE_CONTROL, "no-store"),
        ],
        Value::Array(events).to_string(),
    )
}

/// `GET /`: one table row per endpoint; the page reloads itself every 2 s.
async fn page(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CACHE_CONTROL, "no-store"),
        ],
        render_page(&state.monitor.snapshot()),
    )
}

/// The snapshot as JSON, built by hand to choose its shape (with the feature `serde`,
/// `serde_json::to_value(&snapshot)` gives the snapshot as it is). `now` turns
/// each relative next check into an absolute time.
fn snapshot_json(snapshot: &Snapshot, now: SystemTime) -> Value {
    let endpoints: Vec<Value> = snapshot
        .endpoints
        .iter()
        .map(|e| endpoint_json(e, now))
        .collect();
    json!({
        "generated_at": rfc3339(unix_ms(now)),
        "rules": { "version": snapshot.rules_version, "error": snapshot.rules_error },
        "ejected": snapshot.ejected(),
        "endpoints": endpoints,
    })
}

fn endpoint_json(e: &EndpointSnapshot, now: SystemTime) -> Value {
    let windows: Vec<Value> = e
        .windows
        .iter()
        .map(|w| {
            json!({
                "policy": w.policy,
                "state": w.state,
                "calls": w.counts.calls,
                "failures": w.counts.failures,
                "slow": w.counts.slow,
            })
        })
        .collect();
    let next_check = e.next_check_in.map(|due| {
        let at = unix_ms(now + due);
        json!({ "in_seconds": due.as_secs_f64(), "at_unix_ms": at, "at": rfc3339(at) })
    });
    let last_reason = e.last_reason.as_ref().map(|r| {
        json!({
            "policy": r.policy,
            "measure": r.measure,
            "value": r.value,
            "threshold": r.threshold,
            "calls": r.counts.calls,
            "failures": r.counts.failures,
            "slow": r.counts.slow,
        })
    });
    json!({
        "key": e.key.as_str(),
        "status": status_name(e.status),
        "available": e.status.is_available(),
        "error_rate": e.error_rate,
        "windows": windows,
        "weight": e.weight,
        "absolute_weight": e.absolute_weight,
        "degraded": e.degraded,
        "in_flight": e.in_flight,
        "next_check": next_check,
        "failed_checks": e.failed_checks,
        "last_reason": last_reason,
    })
}

fn event_json(at: SystemTime, event: &Event) -> Value {
    let (kind, key) = match event {
        Event::Ejected { key, .. } => ("ejected", Some(key)),
        Event::EjectionRefused { key, .. } => ("ejection_refused", Some(key)),
        Event::Readmitted { key, .. } => ("readmitted", Some(key)),
        Event::Recovered { key } => ("recovered", Some(key)),
        Event::TrialFailed { key, .. } => ("trial_failed", Some(key)),
        Event::ProbeStarted { key } => ("probe_started", Some(key)),
        Event::ProbeFailed { key, .. } => ("probe_failed", Some(key)),
        Event::WeightChanged { key, .. } => ("weight_changed", Some(key)),
        Event::RulesApplied { .. } => ("rules_applied", None),
        Event::RulesRejected { .. } => ("rules_rejected", None),
        Event::PolicyStateChanged { key, .. } => ("policy_state_changed", Some(key)),
        Event::Removed { key, .. } => ("removed", Some(key)),
        _ => ("other", None),
    };
    json!({
        "at": rfc3339(unix_ms(at)),
        "kind": kind,
        "key": key.map(|k| k.as_str()),
        "detail": format!("{event:?}"),
    })
}

fn status_name(status: EndpointStatus) -> &'static str {
    match status {
        EndpointStatus::Available => "Available",
        EndpointStatus::Trial => "Trial",
        EndpointStatus::Ejected => "Ejected",
        EndpointStatus::Probing => "Probing",
        EndpointStatus::Unready => "Unready",
        _ => "Unknown",
    }
}

fn render_page(snapshot: &Snapshot) -> String {
    let mut html = String::from(concat!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        "<meta http-equiv=\"refresh\" content=\"2\">\n<title>Outlier detection</title>\n",
        "<style>\n",
        "body { font-family: system-ui, sans-serif; margin: 2em; }\n",
        "table { border-collapse: collapse; }\n",
        "th, td { border: 1px solid #ccc; padding: .3em .7em; text-align: left; }\n",
        "td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }\n",
        "tr.out td.status { color: #b00; font-weight: bold; }\n",
        "tr.trial td.status { color: #a60; }\n",
        "</style>\n</head>\n<body>\n<h1>Outlier detection</h1>\n",
    ));
    let _ = writeln!(
        html,
        "<p>{} endpoints, {} out of rotation. Rules version {}{}.</p>",
        snapshot.endpoints.len(),
        snapshot.ejected(),
        snapshot.rules_version,
        snapshot
            .rules_error
            .as_deref()
            .map(|e| format!("; last change refused: {}", escape(e)))
            .unwrap_or_default()
    );
    html.push_str(concat!(
        "<table>\n<thead><tr><th>endpoint</th><th>status</th><th>error rate</th>",
        "<th>failed / calls</th><th>weight</th><th>breaker</th><th>next check</th>",
        "<th>failed checks</th>",
        "<th>last reason</th></tr></thead>\n<tbody>\n",
    ));
    for e in &snapshot.endpoints {
        let class = match e.status {
            EndpointStatus::Available => "in",
            EndpointStatus::Trial => "trial",
            _ => "out",
        };
        let counts = e.windows.first().map(|w| w.counts).unwrap_or_default();
        let next = e.next_check_in.map_or_else(
            || "-".to_string(),
            |d| format!("in {:.1} s", d.as_secs_f64()),
        );
        // A policy with a state of its own (a slow-call breaker) shows it; "-" otherwise.
        let breaker = e
            .windows
            .iter()
            .find_map(|w| w.state.map(|state| format!("{}: {state}", w.policy)))
            .unwrap_or_else(|| "-".to_string());
        let reason = e.last_reason.as_ref().map_or_else(
            || "-".to_string(),
            |r| escape(&format!("{}: {r}", r.policy)),
        );
        let _ = writeln!(
            html,
            "<tr class=\"{class}\"><td><code>{}</code></td><td class=\"status\">{}</td>\
             <td class=\"num\">{:.1} %</td><td class=\"num\">{} / {}</td>\
             <td class=\"num\">{:.2}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td>\
             <td>{}</td></tr>",
            escape(e.key.as_str()),
            status_name(e.status),
            e.error_rate * 100.0,
            counts.failures,
            counts.calls,
            e.weight,
            breaker,
            next,
            e.failed_checks,
            reason,
        );
    }
    html.push_str(concat!(
        "</tbody>\n</table>\n<p><a href=\"/outliers\">JSON</a> · <a href=\"/metrics\">metrics</a>",
        " · <a href=\"/events\">events</a></p>\n</body>\n</html>\n",
    ));
    html
}

/// Escapes text for HTML element content and quoted attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A Unix time in milliseconds as RFC 3339 in UTC (`2023-11-14T22:13:20.000Z`).
fn rfc3339(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        unix_ms % 1000
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The helpers' own claims, checked before anything starts.
fn self_check(failures: &mut Vec<String>) {
    for (ms, expected) in [
        (0, "1970-01-01T00:00:00.000Z"),
        (951_782_400_000, "2000-02-29T00:00:00.000Z"),
        (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
    ] {
        if rfc3339(ms) != expected {
            failures.push(format!("rfc3339({ms}) = {}, not {expected}", rfc3339(ms)));
        }
    }
    let escaped = escape(r#"<a href="x">&'"#);
    if escaped != "&lt;a href=&quot;x&quot;&gt;&amp;&#39;" {
        failures.push(format!("escape gave {escaped}"));
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

/// `/outliers`: JSON; the failing upstream ejected by the error rate, with its reason and next
/// check; the others available.
fn check_outliers(page: &Page, demo: &Demo) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    expect_ok(page, "application/json", &mut problems);
    let json: Value = serde_json::from_str(&page.body)
        .map_err(|e| vec![format!("not JSON ({e}): {}", page.body)])?;
    if json["rules"]["version"] != 0 || !json["rules"]["error"].is_null() {
        problems.push(format!("rules: {}", json["rules"]));
    }
    let endpoints = endpoints(&json);
    if endpoints.len() != NAMES.len() {
        problems.push(format!(
            "{} endpoints, not {}",
            endpoints.len(),
            NAMES.len()
        ));
    }
    let now = unix_ms(SystemTime::now());
    for (i, upstream) in demo.upstreams.iter().enumerate() {
        let key = format!("{:?}", upstream.addr);
        let Some(e) = endpoints.iter().find(|e| e["key"] == key.as_str()) else {
            problems.push(format!("no endpoint {key} ({})", upstream.name));
            continue;
        };
        if i != demo.failing {
            if e["status"] != "Available" || e["last_reason"] != Value::Null {
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
        let next_in = e["next_check"]["in_seconds"].as_f64().unwrap_or(-1.0);
        let next_at = e["next_check"]["at_unix_ms"].as_u64().unwrap_or(0);
        let calls = e["windows"][0]["calls"].as_u64().unwrap_or(0);
        let failures = e["windows"][0]["failures"].as_u64().unwrap_or(0);
        let ok = e["status"] == "Ejected"
            && e["available"] == false
            && reason["policy"] == "error-rate"
            && reason["measure"] == "error rate"
            && reason["value"].as_f64() > reason["threshold"].as_f64()
            && reason["threshold"] == 0.5
            && reason["calls"].as_u64() >= Some(10)
            && (0.0..=60.0).contains(&next_in)
            && next_at > now
            && next_at <= now + 61_000
            && e["next_check"]["at"].as_str().is_some_and(|s| s.ends_with('Z'))
            && e["windows"][0]["policy"] == "error-rate"
            // The window is 10 s: on a machine slow enough, the ejection's calls have left it.
            && failures == calls
            && e["error_rate"] == if calls > 0 { 1.0 } else { 0.0 }
            && e["weight"] == 1.0;
        if !ok {
            problems.push(format!(
                "{} should be Ejected by the error rate with a check within 60 s: {e}",
                upstream.name
            ));
        }
    }
    done(problems)
}

/// `/`: HTML that refreshes itself, one row per endpoint, the failing one Ejected.
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
        let key = escape(&format!("{:?}", upstream.addr));
        let Some(row) = html
            .lines()
            .find(|l| l.contains(&format!("<code>{key}</code>")))
        else {
            problems.push(format!("no row for {key} ({})", upstream.name));
            continue;
        };
        let expected = if i == demo.failing {
            "<td class=\"status\">Ejected</td>"
        } else {
            "<td class=\"status\">Available</td>"
        };
        if !row.contains(expected) {
            problems.push(format!("{}'s row lacks {expected}: {row}", upstream.name));
        }
    }
    if html.matches("Ejected").count() != 1 {
        problems.push("\"Ejected\" should appear exactly once".to_string());
    }
    done(problems)
}

/// `/metrics`: OpenMetrics text with one ejection by the error rate, one endpoint out.
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
            r#"outlier_ejections_total{upstream="orders",policy="error-rate",measure="error rate"}"#,
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
    /// Binds 127.0.0.1 on a port the OS picks and serves every path: 200 with the upstream's
    /// name, or 503 if `failing`.
    async fn start(name: &'static str, failing: bool) -> Result<Self, DynError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(AtomicUsize::new(0));
        let counter = received.clone();
        let app = Router::new().fallback(move || {
            counter.fetch_add(1, Ordering::SeqCst);
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
pub(crate) struct Statuses {
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
