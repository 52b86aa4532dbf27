//! An admin component to mount in the application's HTTP server: the layer's state for people
//! and programs, with a bounded history of the last minutes.
//!
//! [`Admin`] is a tower `Service` of `http::Request`s, so it mounts in axum
//! (`Router::new().nest_service("/outliers", admin)`), in a hyper server (through
//! `hyper_util::service::TowerToHyperService`) or behind any tower router. It answers `GET` (and
//! `HEAD`) on the paths below, relative to where it is mounted (axum's `nest_service` strips the
//! prefix; mounted on its own, it serves from `/`); any other path is a 404:
//!
//! | path | what |
//! |---|---|
//! | `/` | an HTML page: per endpoint its status, since when it is out, its next check and why, its error rate and share of the traffic, and a timeline of the last minutes with the spans it spent out of rotation drawn in; it reloads itself |
//! | `/snapshot` | the monitor's [`Snapshot`] as JSON |
//! | `/history` | the sampled history as JSON: each tick (numbered `seq`) with every endpoint's status, error rate and window calls; `?since=<seq>` gives only the ticks after that one and `&limit=<n>` at most `n` of them, and the answer's `next_since` is the `since` of the next page (`more` says whether the kept history goes further; a `since` past the newest tick, from before the process restarted, starts over from the oldest with `restarted`; a malformed value is a 400 that names it) |
//! | `/events` | the latest events as JSON objects (`at`, `kind`, `key` and the event's fields), oldest first |
//! | `/events/stream` | the events as they happen, as server-sent events (`text/event-stream`), one JSON object per `data:` line, with a comment every 15 s to keep the connection open |
//! | `/metrics` | the Prometheus registry given to [`AdminBuilder::metrics`], in the text format (404 without one) |
//! | `/clusters` | Envoy's `/clusters`, for Envoy-literate tooling: with `?format=json`, Envoy's `admin.v3.Clusters` JSON; otherwise Envoy's text format, a line `cluster::host::stat::value` per value (below) |
//!
//! Memory is bounded: a tick every second kept for five minutes (300 ticks) of at most 256
//! endpoints (the others are counted, not drawn; the page shows the endpoints out of rotation
//! first, up to that many rows), and the last 256 events (all configurable). A tick is one
//! monitor snapshot, taken on tokio's blocking pool outside the history's lock; the next tick
//! waits at least ten times as long as a snapshot took (at 100 000 endpoints a snapshot takes
//! about a tenth of a second), so sampling takes at most a tenth of a core.
//!
//! The page, `/snapshot` and `/clusters` are made from the sampler's copy of the monitor, never
//! on the request's task: a request waits for a snapshot the sampler begins after it asked (at
//! once when the sampler is idle, not at its next tick), so what the caller did before asking is
//! in it, and every request that asked meanwhile shares that one snapshot; the document is then
//! written on the blocking pool. A burst of readers costs one snapshot, and a page of 100 000
//! endpoints does not stall the runtime's workers. The component must be built inside a tokio
//! runtime to start sampling at once; built outside one, it starts on its first request (a
//! request answered outside any runtime builds its own snapshot, inline).
//!
//! ```
//! use tower::ServiceExt;
//! use tower_outlier::admin::Admin;
//! use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?));
//! let admin = Admin::new(&layer.monitor());
//! // With axum: `Router::new().nest_service("/outliers", admin.clone())`.
//! let request = http::Request::get("/events").body(())?;
//! let response = admin.oneshot(request).await?;
//! assert_eq!(response.status(), http::StatusCode::OK);
//! assert_eq!(response.headers()["content-type"], "application/json");
//! # Ok(()) }
//! ```
//!
//! ## Envoy's `/clusters`
//!
//! `/clusters` answers what Envoy's admin `/clusters` does (`clusters_handler.cc`,
//! `admin.v3.Clusters` in `api/envoy/admin/v3/clusters.proto`), from the same snapshot, for the
//! fields the layer has. It shows one cluster holding every endpoint of the layer, named by
//! [`AdminBuilder::cluster_name`] (`default` unless named: the monitor has no name of its own).
//! Per host:
//!
//! * `address.socket_address`: the endpoint's key, when it is a `SocketAddr` (or a string that
//!   reads as one): `address` its IP, `port_value` its port. Any other key (an index, a name, a
//!   URI) has its text in `address` and `port_value` 0; the text format prints the text alone.
//! * `stats`: `rq_success`, `rq_error` and `rq_total` (`COUNTER`) are the counts of the
//!   endpoint's first policy window (the snapshot's `windows[0]`, whose failure rate is its
//!   `error_rate`): they fall as old calls leave the window or it starts again, where Envoy's
//!   count from the host's start, so read them as a window's counts, not as counters to take a
//!   rate of. `rq_active`
//!   (`GAUGE`) is the calls in flight. Values are decimal strings, as proto3 JSON writes 64-bit
//!   integers (Envoy's own output does); unlike Envoy, a stat's `type` and a 0 `value` are
//!   written out (a proto3 reader reads both).
//! * `health_status`: `failed_outlier_check` while the endpoint is out of the balancer's set
//!   (ejected or probing), `failed_active_health_check` while its health service says it is not
//!   serving, `failed_active_degraded_check` while its server says it is degraded
//!   ([`OutlierDetectionLayer::detect_degraded`](crate::OutlierDetectionLayer::detect_degraded),
//!   read from any response, not from health checks alone); each left out when false, as proto3
//!   JSON leaves out a default. `eds_health_status` is always `HEALTHY`: a discover stream says
//!   nothing of health. An endpoint out only in dry run has no flag, as Envoy flags no
//!   unenforced ejection; an unready one (its `poll_ready` failed) has none either, Envoy having
//!   no flag for it. The text format's `health_flags` is `healthy` or the flags set, each after a
//!   slash (`/failed_outlier_check`), as Envoy prints them.
//! * `success_rate`: the window's successes over its calls, in percent (0 to 100); left out
//!   (the text format's -1) with no calls. Envoy reports it only for a host over its success-rate
//!   detector's request volume in the last interval, which the snapshot does not carry.
//! * `weight`: the endpoint's relative weight in hundredths (100 at its full weight, 50 when a
//!   weight policy halved it): Envoy's weights are relative to each other, and a whole number.
//!
//! Left out: the cluster's `success_rate_ejection_threshold` and
//! `local_origin_success_rate_ejection_threshold` (and the text format's `outlier::` lines),
//! since the threshold Envoy reports is `mean - stdev_factor / 1000 × stdev` over the hosts that
//! had the detector's request volume in its last interval, and the snapshot carries neither the
//! detector's settings nor the interval it judged; a threshold made up from the live windows
//! would not be the one the layer acts on. A host's `local_origin_success_rate`: the snapshot's
//! window merges local-origin failures with the others (as Envoy does without
//! `split_external_local_origin_errors`). `hostname`, `locality`, `priority`, the circuit
//! breakers, `added_via_api`, and the connection stats (`cx_*`, `rq_timeout`): the layer has none
//! of them. The text format has the host lines (stats in name order, then `health_flags`,
//! `weight`, `success_rate`), not Envoy's cluster-wide ones.

mod body;
mod clusters;
mod history;
mod json;
mod latest;
mod page;
mod query;

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use tokio::sync::broadcast::error::RecvError;
use tower_service::Service;

pub use body::AdminBody;
use history::{Limits, Memory, Parts};
use latest::Latest;
use query::TickPage;

use crate::monitor::EventCallback;
use crate::monitor::{Monitor, Snapshot};

/// How often a server-sent event stream with nothing to say sends a comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The admin component: see the [module documentation](self). Clones share one history.
#[derive(Clone)]
pub struct Admin {
    inner: Arc<Inner>,
}

struct Inner {
    monitor: Monitor,
    history: Arc<Memory>,
    // Where requests get the sampler's copies of the monitor.
    latest: Arc<Latest>,
    callback: Option<EventCallback>,
    sampling: AtomicBool,
    every: Duration,
    refresh: u64,
    cluster_name: String,
    #[cfg(feature = "prometheus")]
    metrics: Option<Arc<prometheus_client::registry::Registry>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(callback) = self.callback.take() {
            callback.unsubscribe();
        }
        // The sampler ends now, not at its next tick.
        self.latest.close();
    }
}

/// Settings of an [`Admin`] before it is built.
#[derive(Clone)]
pub struct AdminBuilder {
    monitor: Monitor,
    every: Duration,
    keep: Duration,
    endpoints: usize,
    events: usize,
    refresh: u64,
    cluster_name: String,
    #[cfg(feature = "prometheus")]
    metrics: Option<Arc<prometheus_client::registry::Registry>>,
}

impl Admin {
    /// The component for the layer `monitor` watches, with the default settings.
    pub fn new(monitor: &Monitor) -> Self {
        Admin::builder(monitor).build()
    }

    /// Settings for the component of the layer `monitor` watches: a tick every second, kept five
    /// minutes, at most 256 endpoints on the timeline, the last 256 events, a page that reloads
    /// every 2 s.
    pub fn builder(monitor: &Monitor) -> AdminBuilder {
        AdminBuilder {
            monitor: monitor.clone(),
            every: Duration::from_secs(1),
            keep: Duration::from_secs(300),
            endpoints: 256,
            events: 256,
            refresh: 2,
            cluster_name: String::from("default"),
            #[cfg(feature = "prometheus")]
            metrics: None,
        }
    }

    fn start_sampling(&self) {
        if self.inner.sampling.load(Ordering::Relaxed) {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if !self.inner.sampling.swap(true, Ordering::Relaxed) {
            tokio::spawn(history::sample_while_kept(
                Arc::downgrade(&self.inner.history),
                self.inner.monitor.clone(),
                self.inner.every,
                self.inner.latest.answering(),
            ));
        }
    }

    /// The answer to a request: at once, or from a copy of the monitor.
    fn respond(&self, method: &Method, path: &str, query: Option<&str>) -> Answer {
        if method != Method::GET && method != Method::HEAD {
            return Answer::Now(
                Response::builder()
                    .status(StatusCode::METHOD_NOT_ALLOWED)
                    .header(ALLOW, "GET, HEAD")
                    .body(AdminBody::full("GET or HEAD\n"))
                    .unwrap_or_else(|_| Response::new(AdminBody::full(""))),
            );
        }
        let path = path.trim_end_matches('/');
        let (content_type, body) = if path == "/events/stream" {
            ("text/event-stream", self.event_stream())
        } else {
            match path.strip_prefix('/').unwrap_or(path) {
                "snapshot" => return Answer::From(View::Snapshot),
                "clusters" if clusters::wants_json(query) => {
                    return Answer::From(View::ClustersJson)
                }
                "clusters" => return Answer::From(View::ClustersText),
                "history" => match TickPage::parse(query) {
                    Ok(page) => (
                        "application/json",
                        AdminBody::full(
                            json::history(&self.inner.history.history(Parts::Timeline), page)
                                .to_string(),
                        ),
                    ),
                    Err(bad) => return Answer::Now(bad_request(format!("{bad}\n"))),
                },
                "events" => (
                    "application/json",
                    AdminBody::full(
                        json::events(&self.inner.history.history(Parts::Journal)).to_string(),
                    ),
                ),
                "metrics" => match self.metrics_text() {
                    // What prometheus-client's text encoder writes: OpenMetrics, ending in `# EOF`.
                    Some(text) => (
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        AdminBody::full(text),
                    ),
                    None => {
                        return Answer::Now(not_found(
                            "no Prometheus registry was given to this admin component\n",
                        ))
                    }
                },
                "" if path.is_empty() => return Answer::From(View::Page),
                _ => return Answer::Now(not_found("not an admin path\n")),
            }
        };
        Answer::Now(ok(method, content_type, body))
    }

    /// `view` of a copy of the monitor begun after the request: the sampler's, rendered on the
    /// blocking pool (`latest.rs`), so that neither step runs on the request's task.
    fn answer_from(&self, method: &Method, view: View) -> AdminFuture {
        let inner = self.inner.clone();
        let method = method.clone();
        AdminFuture::waiting(Box::pin(async move {
            let snapshot = inner.latest.copy(&inner.monitor).await;
            let rendering = inner.clone();
            match latest::off_task(move || view.render(&rendering, &snapshot)).await {
                Some((content_type, text)) => ok(&method, content_type, AdminBody::full(text)),
                None => plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the runtime is shutting down\n",
                ),
            }
        }))
    }

    #[cfg(feature = "prometheus")]
    fn metrics_text(&self) -> Option<String> {
        let registry = self.inner.metrics.as_ref()?;
        let mut text = String::new();
        match prometheus_client::encoding::text::encode(&mut text, registry) {
            Ok(()) => Some(text),
            Err(_) => Some(String::from("# the registry could not be encoded\n")),
        }
    }

    #[cfg(not(feature = "prometheus"))]
    fn metrics_text(&self) -> Option<String> {
        None
    }

    /// The events as they happen, as server-sent events.
    fn event_stream(&self) -> AdminBody {
        let events = self.inner.monitor.subscribe();
        let stream = futures::stream::unfold(events, |mut events| async move {
            let frame = match tokio::time::timeout(KEEP_ALIVE, events.recv()).await {
                Ok(Ok(event)) => {
                    // Wall-clock time for the people reading the events.
                    #[allow(clippy::disallowed_methods)]
                    let at = SystemTime::now();
                    let kept = history::Kept { at, event };
                    format!("event: outlier\ndata: {}\n\n", json::event(&kept))
                }
                Ok(Err(RecvError::Lagged(missed))) => {
                    format!(": {missed} events missed (the reader was slow)\n\n")
                }
                Ok(Err(RecvError::Closed)) => return None,
                Err(_) => String::from(": keep-alive\n\n"),
            };
            Some((Bytes::from(frame), events))
        });
        AdminBody::events(stream)
    }
}

/// What a request is answered with.
enum Answer {
    Now(Response<AdminBody>),
    From(View),
}

/// A document made from a copy of the monitor.
#[derive(Clone, Copy)]
enum View {
    Page,
    Snapshot,
    ClustersJson,
    ClustersText,
}

impl View {
    /// The document's content type and text (on the blocking pool).
    fn render(self, inner: &Inner, snapshot: &Snapshot) -> (&'static str, String) {
        match self {
            View::Snapshot => (
                "application/json",
                serde_json::to_string(snapshot).unwrap_or_else(|error| {
                    serde_json::json!({ "error": error.to_string() }).to_string()
                }),
            ),
            View::ClustersJson => (
                "application/json",
                clusters::json(snapshot, &inner.cluster_name).to_string(),
            ),
            View::ClustersText => (
                "text/plain; charset=utf-8",
                clusters::text(snapshot, &inner.cluster_name),
            ),
            View::Page => {
                // Wall-clock time for the people reading the page; nothing is measured with it.
                #[allow(clippy::disallowed_methods)]
                let now = SystemTime::now();
                let html = page::render(
                    snapshot,
                    &inner.history.history(Parts::Both),
                    now,
                    inner.refresh,
                );
                ("text/html; charset=utf-8", html)
            }
        }
    }
}

/// A successful answer: `body` with its content type (none for `HEAD`), never cached.
fn ok(method: &Method, content_type: &'static str, body: AdminBody) -> Response<AdminBody> {
    let body = if method == Method::HEAD {
        AdminBody::full(Bytes::new())
    } else {
        body
    };
    Response::builder()
        .header(CONTENT_TYPE, content_type)
        .header(CACHE_CONTROL, "no-store")
        .body(body)
        .unwrap_or_else(|_| Response::new(AdminBody::full("")))
}

/// The future of an [`Admin`] answer: ready at once, or once the sampler's copy of the monitor
/// that the page, `/snapshot` or `/clusters` is made from is rendered.
pub struct AdminFuture {
    state: FutureState,
}

enum FutureState {
    Ready(Option<Response<AdminBody>>),
    Waiting(Pin<Box<dyn Future<Output = Response<AdminBody>> + Send>>),
}

impl AdminFuture {
    fn ready(response: Response<AdminBody>) -> Self {
        AdminFuture {
            state: FutureState::Ready(Some(response)),
        }
    }

    fn waiting(future: Pin<Box<dyn Future<Output = Response<AdminBody>> + Send>>) -> Self {
        AdminFuture {
            state: FutureState::Waiting(future),
        }
    }
}

// Nothing in it is pinned in place: the waiting future is boxed, the response moved out.
impl Unpin for AdminFuture {}

impl Future for AdminFuture {
    type Output = Result<Response<AdminBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            FutureState::Ready(response) => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("AdminFuture polled after it completed"),
            },
            FutureState::Waiting(future) => future.as_mut().poll(cx).map(Ok),
        }
    }
}

impl fmt::Debug for AdminFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            FutureState::Ready(_) => "ready",
            FutureState::Waiting(_) => "waiting for a copy of the monitor",
        };
        f.debug_struct("AdminFuture")
            .field("state", &state)
            .finish()
    }
}

fn bad_request(text: String) -> Response<AdminBody> {
    plain(StatusCode::BAD_REQUEST, text)
}

fn not_found(text: &'static str) -> Response<AdminBody> {
    plain(StatusCode::NOT_FOUND, text)
}

fn plain(status: StatusCode, text: impl Into<Bytes>) -> Response<AdminBody> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(AdminBody::full(text))
        .unwrap_or_else(|_| Response::new(AdminBody::full("")))
}

impl AdminBuilder {
    /// How often the history samples every endpoint (default 1 s; at least 10 ms).
    pub fn sample_every(mut self, every: Duration) -> Self {
        self.every = every.max(Duration::from_millis(10));
        self
    }

    /// How long the history goes back (default 5 minutes; at most 10 000 ticks).
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }

    /// At most this many endpoints on the timeline (default 256); the others are counted.
    pub fn max_endpoints(mut self, endpoints: usize) -> Self {
        self.endpoints = endpoints.max(1);
        self
    }

    /// The last this many events are kept for `events` (default 256).
    pub fn max_events(mut self, events: usize) -> Self {
        self.events = events.max(1);
        self
    }

    /// How often the page reloads itself, in seconds (default 2).
    pub fn page_refresh(mut self, seconds: u64) -> Self {
        self.refresh = seconds.max(1);
        self
    }

    /// The cluster's name in Envoy's `/clusters`: the upstream the layer balances, as Envoy's
    /// `cluster_name` (default `default`, the service name the Prometheus metrics give a layer
    /// registered alone). The monitor has no name of its own to take it from.
    ///
    /// ```
    /// use tower::ServiceExt;
    /// use tower_outlier::admin::Admin;
    /// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::envoy().build()?));
    /// let admin = Admin::builder(&layer.monitor()).cluster_name("orders").build();
    /// let request = http::Request::get("/clusters?format=json").body(())?;
    /// let response = admin.oneshot(request).await?;
    /// assert_eq!(response.headers()["content-type"], "application/json");
    /// # use http_body_util::BodyExt;
    /// let body = response.into_body().collect().await?.to_bytes();
    /// let clusters: serde_json::Value = serde_json::from_slice(&body)?;
    /// // No endpoint discovered yet: the cluster, with no host.
    /// assert_eq!(
    ///     clusters,
    ///     serde_json::json!({ "cluster_statuses": [{ "name": "orders", "host_statuses": [] }] })
    /// );
    /// # Ok(()) }
    /// ```
    pub fn cluster_name(mut self, name: impl Into<String>) -> Self {
        self.cluster_name = name.into();
        self
    }

    /// Serves `registry` (for example the one [`OutlierMetrics`](crate::metrics::OutlierMetrics)
    /// registers in) at `metrics`.
    #[cfg(feature = "prometheus")]
    #[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
    pub fn metrics(mut self, registry: Arc<prometheus_client::registry::Registry>) -> Self {
        self.metrics = Some(registry);
        self
    }

    /// The component; it starts sampling now if built inside a tokio runtime.
    pub fn build(self) -> Admin {
        let ticks = (self.keep.as_nanos() / self.every.as_nanos().max(1)).clamp(1, 10_000) as usize;
        let history = Arc::new(Memory::new(Limits {
            every: self.every,
            ticks,
            endpoints: self.endpoints,
            events: self.events,
        }));
        let kept: Weak<Memory> = Arc::downgrade(&history);
        let callback = self.monitor.on_event(move |event| {
            if let Some(history) = kept.upgrade() {
                // Wall-clock time for the people reading the events.
                #[allow(clippy::disallowed_methods)]
                let at = SystemTime::now();
                history.record(at, event);
            }
        });
        let admin = Admin {
            inner: Arc::new(Inner {
                monitor: self.monitor,
                history,
                latest: Arc::default(),
                callback: Some(callback),
                sampling: AtomicBool::new(false),
                every: self.every,
                refresh: self.refresh,
                cluster_name: self.cluster_name,
                #[cfg(feature = "prometheus")]
                metrics: self.metrics,
            }),
        };
        admin.start_sampling();
        admin
    }
}

impl<B> Service<Request<B>> for Admin {
    type Response = Response<AdminBody>;
    type Error = Infallible;
    type Future = AdminFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.start_sampling();
        let uri = request.uri();
        match self.respond(request.method(), uri.path(), uri.query()) {
            Answer::Now(response) => AdminFuture::ready(response),
            Answer::From(view) => self.answer_from(request.method(), view),
        }
    }
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("sample_every", &self.inner.every)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for AdminBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminBuilder")
            .field("sample_every", &self.every)
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}
