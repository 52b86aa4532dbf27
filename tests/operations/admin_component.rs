//! The admin component (`tower_outlier::admin::Admin`) mounted in a real axum server on loopback,
//! during a scripted incident: three endpoints behind tower's p2c and `Buffer`, one failing for
//! 1.5 s and then healed. Checked as programs read it (events as JSON, the history, live
//! server-sent events) and as a browser shows it: a headless Chromium loads the page, its DOM
//! must draw an out-of-rotation span on the failing endpoint's timeline only, and its screenshot
//! must show that span's colour.
//!
//! The browser part needs a headless Chromium (`apt-get install chromium-headless-shell`;
//! `ADMIN_BROWSER` names another binary). Without one it is skipped and says so, unless
//! `ADMIN_BROWSER_REQUIRED` is set (CI sets it): then the test fails.

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use support::{announce, Backend};
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, ServiceExt};
use tower_outlier::admin::Admin;
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};

/// How long the browser may take to load and render the page.
const BROWSER_PATIENCE: Duration = Duration::from_secs(60);

/// The span's fill as the page draws it (`#f4a6a6`).
const SPAN_RGB: [u8; 3] = [0xf4, 0xa6, 0xa6];

fn browser() -> Option<PathBuf> {
    if let Some(named) = std::env::var_os("ADMIN_BROWSER") {
        return Some(named.into());
    }
    let path = std::env::var_os("PATH")?;
    [
        "chromium-headless-shell",
        "chromium",
        "chromium-browser",
        "google-chrome",
    ]
    .into_iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
    .find(|candidate| candidate.is_file())
}

async fn get(addr: SocketAddr, path: &str) -> (http::StatusCode, String, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client
        .get(format!("http://{addr}{path}").parse().unwrap())
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// Runs `browser` on `url` with `args`, and its stdout.
async fn browse(browser: &PathBuf, args: &[&str], url: &str) -> Vec<u8> {
    // `--no-sandbox`: Chromium's sandbox refuses to run as root, as CI does. Not
    // `--virtual-time-budget`: it fast-forwards through the page's own reloads.
    let output = tokio::time::timeout(
        BROWSER_PATIENCE,
        tokio::process::Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
            ])
            .args(args)
            .arg(url)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{} took over {BROWSER_PATIENCE:?}", browser.display()))
    .unwrap_or_else(|e| panic!("{} did not run: {e}", browser.display()));
    assert!(
        output.status.success(),
        "{} {}: {}",
        browser.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Pixels of `png` within 6 of `rgb` in every channel.
fn pixels_near(png: &[u8], rgb: [u8; 3]) -> usize {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(png));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buffer = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buffer).expect("a frame");
    let channels = info.color_type.samples();
    buffer[..info.buffer_size()]
        .chunks(channels)
        .filter(|px| channels >= 3 && px[..3].iter().zip(rgb).all(|(a, b)| a.abs_diff(b) <= 6))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_component_shows_a_scripted_incident() {
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let admin = Admin::builder(&layer.monitor())
        .sample_every(Duration::from_millis(100))
        .keep(Duration::from_secs(20))
        .build();
    let app = axum::Router::new().nest_service("/outliers", admin);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // A live follower of the events, from before the incident.
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let stream = client
        .get(
            format!("http://{addr}/outliers/events/stream")
                .parse()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut stream = stream.into_body();

    // The incident: #1 fails from 0.3 s to 1.8 s while requests flow through p2c.
    let backends: Vec<Backend> = (0..3).map(Backend::new).collect();
    let services: Vec<(usize, Backend)> = backends.iter().map(|b| (b.id, b.clone())).collect();
    let balancer = Buffer::new(Balance::new(layer.layer(announce(&services))), 64);
    let traffic = async {
        let started = tokio::time::Instant::now();
        while started.elapsed() < Duration::from_millis(3_500) {
            let _: Result<usize, BoxError> = balancer.clone().oneshot(()).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let script = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        backends[1].set_failing(true);
        // The live stream carries #1's ejection as a JSON event.
        let seen = tokio::time::timeout(Duration::from_secs(5), async {
            let mut text = String::new();
            while !text.contains("\"kind\":\"ejected\"") {
                let frame = stream.frame().await.unwrap().unwrap();
                if let Ok(data) = frame.into_data() {
                    text.push_str(&String::from_utf8_lossy(&data));
                }
            }
            text
        })
        .await
        .expect("an ejection on the live stream within 5 s");
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        backends[1].set_failing(false);
        seen
    };
    let ((), seen) = futures::join!(traffic, script);
    let line = seen
        .lines()
        .find(|l| l.starts_with("data: ") && l.contains("\"kind\":\"ejected\""))
        .unwrap();
    let event: Value = serde_json::from_str(&line["data: ".len()..]).unwrap();
    assert_eq!(event["key"], "1", "{event}");
    // Whichever of the recommended configuration's triggers came first: three failures in a row,
    // or a success rate under 0.8 (a loaded machine sends #1 fewer calls before it fails, so
    // two failures can already weigh that much).
    assert!(
        ["consecutive failures", "success rate"]
            .contains(&event["reason"]["measure"].as_str().unwrap_or("")),
        "{event}"
    );

    // Events as JSON objects.
    let (status, content_type, body) = get(addr, "/outliers/events").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/json");
    let events: Value = serde_json::from_str(&body).unwrap();
    let kinds: Vec<(&str, &str)> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["key"].as_str().unwrap_or("")))
        .collect();
    assert!(kinds.contains(&("ejected", "1")), "{kinds:?}");
    assert!(
        kinds
            .iter()
            .all(|(kind, key)| *kind != "ejected" || *key == "1"),
        "only #1 ejected: {kinds:?}"
    );

    // The history has ticks with #1 out of rotation, and none with the others out.
    let (_, _, body) = get(addr, "/outliers/history").await;
    let history: Value = serde_json::from_str(&body).unwrap();
    let out: Vec<String> = history["ticks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["endpoints"].as_array().unwrap().clone())
        .filter(|e| e["out_of_rotation"] == true)
        .map(|e| e["key"].as_str().unwrap().to_owned())
        .collect();
    assert!(out.iter().any(|k| k == "1"), "{history}");
    assert!(out.iter().all(|k| k == "1"), "{history}");

    // The page, as the server writes it: a span on #1's timeline only.
    let (status, content_type, page) = get(addr, "/outliers").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "text/html; charset=utf-8");
    let row = |html: &str, key: &str| -> String {
        let start = html
            .find(&format!("data-endpoint=\"{key}\""))
            .unwrap_or_else(|| panic!("no row for {key}:\n{html}"));
        let end = html[start..].find("</tr>").unwrap() + start;
        html[start..end].to_owned()
    };
    assert!(
        row(&page, "1").contains("class=\"ejection-span\""),
        "{page}"
    );
    assert!(!row(&page, "0").contains("ejection-span"), "{page}");
    assert!(!row(&page, "2").contains("ejection-span"), "{page}");
    let (status, _, _) = get(addr, "/outliers/nothing-here").await;
    assert_eq!(status, 404);

    // The page as a browser shows it.
    let Some(browser) = browser() else {
        assert!(
            std::env::var_os("ADMIN_BROWSER_REQUIRED").is_none(),
            "ADMIN_BROWSER_REQUIRED is set and no headless Chromium is on PATH"
        );
        eprintln!(
            "SKIPPED the browser part: no headless Chromium on PATH; \
             `apt-get install chromium-headless-shell` to run it"
        );
        return;
    };
    let url = format!("http://{addr}/outliers");
    let dom = String::from_utf8_lossy(&browse(&browser, &["--dump-dom"], &url).await).into_owned();
    let rows = ["0", "1", "2"].map(|key| row(&dom, key));
    assert!(
        rows[1].contains("class=\"ejection-span\""),
        "the browser's DOM has no span on #1:\n{dom}"
    );
    assert!(!rows[0].contains("ejection-span") && !rows[2].contains("ejection-span"));
    let shot = std::env::temp_dir().join(format!("tower-outlier-admin-{}.png", std::process::id()));
    browse(
        &browser,
        &[
            "--window-size=1400,600",
            &format!("--screenshot={}", shot.display()),
        ],
        &url,
    )
    .await;
    let png = std::fs::read(&shot).expect("the screenshot");
    // `ADMIN_SCREENSHOT_TO=path` keeps the picture for a person to look at.
    if let Some(keep) = std::env::var_os("ADMIN_SCREENSHOT_TO") {
        std::fs::copy(&shot, keep).expect("the screenshot kept");
    }
    let _ = std::fs::remove_file(&shot);
    let span_pixels = pixels_near(&png, SPAN_RGB);
    eprintln!("the screenshot shows {span_pixels} pixels of the span's colour");
    // The legend's swatch alone is about 15 × 10 pixels; a span of a second or more on a
    // 480-pixel, 20-second timeline 40 pixels high is several hundred.
    assert!(
        span_pixels > 400,
        "the screenshot shows {span_pixels} pixels of the span's colour"
    );
}

/// A fleet larger than the page's limit: the rows shown are the endpoints out of rotation first,
/// and the page says how many it left out (a page of 100 000 rows helps nobody).
#[tokio::test(start_paused = true)]
async fn the_page_shows_the_endpoints_out_of_rotation_first() {
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended()
            .max_ejection_percent(50)
            .build()
            .unwrap(),
    ));
    let mut h = support::Harness::new(&layer, 6);
    h.calls(4, 3, 0).await;
    assert!(!h.is_live(4), "#4 ejected");
    let admin = Admin::builder(&layer.monitor()).max_endpoints(2).build();
    let response = admin
        .oneshot(http::Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    let page = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let rows: Vec<&str> = page.split("<tr class=").skip(1).collect();
    assert_eq!(rows.len(), 2, "{page}");
    assert!(rows[0].contains("data-endpoint=\"4\""), "{page}");
    assert!(
        page.contains("4 more available endpoints not shown"),
        "{page}"
    );
}

/// Dry run and an operator's override on the page: what would be beside where each endpoint is,
/// and the snapshot's JSON saying the same.
#[tokio::test(start_paused = true)]
async fn the_page_shows_what_dry_run_would_do_and_the_operators_overrides() {
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended()
            .max_ejection_percent(50)
            .build()
            .unwrap(),
    ));
    // Before the incident: its history starts when it is built.
    let admin = Admin::builder(&layer.monitor()).build();
    let rules = layer.rules();
    rules.set_dry_run(true);
    rules.force_out(&2usize);
    let mut h = support::Harness::new(&layer, 6);
    h.calls(4, 3, 0).await;
    assert!(h.is_live(4), "dry run ejects nothing");
    assert!(
        !h.is_live(2),
        "an operator's override is enforced in dry run"
    );
    let fetch = |path: &'static str| {
        let admin = admin.clone();
        async move {
            let response = admin
                .oneshot(http::Request::get(path).body(()).unwrap())
                .await
                .unwrap();
            String::from_utf8(
                response
                    .into_body()
                    .collect()
                    .await
                    .unwrap()
                    .to_bytes()
                    .to_vec(),
            )
            .unwrap()
        }
    };
    let page = fetch("/").await;
    assert!(page.contains("Dry run: nothing is ejected"), "{page}");
    let row = |key: &str| {
        page.split("<tr class=")
            .find(|row| row.contains(&format!("data-endpoint=\"{key}\"")))
            .unwrap_or_else(|| panic!("no row for {key}: {page}"))
            .to_owned()
    };
    assert!(
        row("4").contains("available (dry run: would be ejected)"),
        "{}",
        row("4")
    );
    assert!(
        row("2").contains("ejected (forced out by an operator)"),
        "{}",
        row("2")
    );
    let json: serde_json::Value = serde_json::from_str(&fetch("/snapshot").await).unwrap();
    assert_eq!(json["dry_run"], true);
    let four = json["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "4")
        .unwrap();
    assert_eq!(four["would_be"], "Ejected");
    let events = fetch("/events").await;
    assert!(events.contains("\"kind\":\"dry_run\""), "{events}");
    assert!(events.contains("\"action\":\"force_out\""), "{events}");
}

/// A program polling `/history` on a real server reads each tick once: pages of `limit` ticks
/// after `since`, in order, without a gap or a repeat, as the sampler goes on adding ticks and
/// dropping the oldest; a reader that fell behind sees how many it missed; a malformed page is a
/// 400 that says which parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_is_read_in_pages_that_follow_each_other() {
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let backends: Vec<Backend> = (0..3).map(Backend::new).collect();
    let services: Vec<(usize, Backend)> = backends.iter().map(|b| (b.id, b.clone())).collect();
    let balancer = Buffer::new(Balance::new(layer.layer(announce(&services))), 64);
    balancer.clone().oneshot(()).await.unwrap();
    let admin = Admin::builder(&layer.monitor())
        .sample_every(Duration::from_millis(10))
        .keep(Duration::from_millis(400))
        .build();
    let app = axum::Router::new().nest_service("/outliers", admin);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let history = |query: String| async move {
        let (status, _, body) = get(addr, &format!("/outliers/history{query}")).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()
    };

    // More ticks than are kept: the oldest have been dropped.
    tokio::time::timeout(Duration::from_secs(20), async {
        while history(String::new()).await["newest_seq"]
            .as_u64()
            .unwrap_or(0)
            < 80
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("80 ticks within 20 s");

    // From the start, in pages of 7: numbered one after the other from the oldest kept.
    let first = history("?since=0&limit=7".into()).await;
    let oldest = first["oldest_seq"].as_u64().unwrap();
    assert!(oldest > 1, "the oldest ticks are dropped: {first}");
    let kept = first["kept_ticks"].as_u64().unwrap();
    assert_eq!(kept, 40);
    let mut seen: Vec<u64> = Vec::new();
    let mut page = first;
    for _ in 0..1_000 {
        let ticks = page["ticks"].as_array().unwrap();
        assert!(ticks.len() <= 7, "{page}");
        seen.extend(ticks.iter().map(|t| t["seq"].as_u64().unwrap()));
        for tick in ticks {
            assert_eq!(tick["endpoints"].as_array().unwrap().len(), 3, "{tick}");
        }
        if page["more"] == false {
            break;
        }
        let since = page["next_since"].as_u64().unwrap();
        page = history(format!("?since={since}&limit=7")).await;
    }
    assert!(seen.len() >= 7, "{seen:?}");
    assert_eq!(seen[0], oldest, "{seen:?}");
    // The sampler went on while the pages were read: some pages began after ticks were
    // dropped, so a page may start later than the last ended, never earlier and never with a
    // gap within it.
    assert!(
        seen.windows(2).all(|w| w[1] > w[0]),
        "each tick once, in order: {seen:?}"
    );
    let gaps = seen.windows(2).filter(|w| w[1] != w[0] + 1).count();
    assert!(gaps <= seen.len() / 7, "gaps only between pages: {seen:?}");

    // Polling from the newest: only the ticks sampled since.
    let newest = *seen.last().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let next = history(format!("?since={newest}")).await;
    let ticks: Vec<u64> = next["ticks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["seq"].as_u64().unwrap())
        .collect();
    assert!(!ticks.is_empty(), "ticks sampled in 100 ms: {next}");
    assert_eq!(ticks[0], newest + 1, "{next}");
    assert_eq!(next["next_since"].as_u64(), ticks.last().copied());
    assert_eq!(next["more"], false);
    // A place past the newest tick is from before a restart: back to the oldest kept.
    let far = newest + 1_000_000;
    let over = history(format!("?since={far}&limit=3")).await;
    assert_eq!(over["restarted"], true, "{over}");
    assert_eq!(over["ticks"][0]["seq"], over["oldest_seq"], "{over}");
    assert_eq!(next["restarted"], false, "{next}");

    // A malformed page is refused, naming its parameter; another parameter is left alone.
    for (query, says) in [
        ("since=last", "`since`"),
        ("limit=0", "`limit`"),
        ("since=1&limit=-5", "`limit`"),
    ] {
        let (status, content_type, body) = get(addr, &format!("/outliers/history?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(content_type, "text/plain; charset=utf-8");
        assert!(body.contains(says), "{query}: {body}");
    }
    let (status, _, _) = get(addr, "/outliers/history?cache=123").await;
    assert_eq!(status, 200);
}

/// The words an operator reads for the recommended configuration, the same on the page, in the
/// snapshot and in Prometheus: a healthy endpoint's gate is `CLOSED` (a circuit breaker's word
/// for "calls pass"; linkerd's "OPEN" made an alert on `state="OPEN"` fire for every healthy
/// endpoint), an ejected one's `OPEN`; and an endpoint two failures into its streak shows the
/// streak the rule judges, not the interval's failure rate (it read "1.0 %" after 200 successes).
#[tokio::test(start_paused = true)]
async fn the_page_the_snapshot_and_the_metrics_say_what_the_rule_judges() {
    use prometheus_client::registry::Registry;

    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let admin = Admin::builder(&layer.monitor()).build();
    let mut registry = Registry::default();
    let _metrics = tower_outlier::metrics::register(&mut registry, &layer.monitor());
    let mut h = support::Harness::new(&layer, 3);
    h.calls(0, 0, 200).await;
    h.calls(0, 2, 0).await;
    h.calls(1, 3, 0).await;
    assert!(!h.is_live(1), "three in a row eject");

    let fetch = |path: &'static str| {
        let admin = admin.clone();
        async move {
            let response = admin
                .oneshot(http::Request::get(path).body(()).unwrap())
                .await
                .unwrap();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(body.to_vec()).unwrap()
        }
    };
    let page = fetch("/").await;
    let row = |key: &str| {
        page.split("<tr class=")
            .find(|row| row.contains(&format!("data-endpoint=\"{key}\"")))
            .unwrap_or_else(|| panic!("no row for {key}: {page}"))
            .to_owned()
    };
    assert!(page.contains("<th>judged on</th>"), "{page}");
    assert!(
        row("0").contains("consecutive failures 2 (ejects at 3)"),
        "{}",
        row("0")
    );
    assert!(!row("0").contains("1.0 %"), "{}", row("0"));

    let json: Value = serde_json::from_str(&fetch("/snapshot").await).unwrap();
    let endpoint = |key: &str| {
        json["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == key)
            .unwrap_or_else(|| panic!("no {key}: {json}"))["windows"][0]
            .clone()
    };
    assert_eq!(endpoint("0")["policy"], "recommended");
    assert_eq!(endpoint("0")["state"], "CLOSED");
    assert_eq!(endpoint("0")["judged"]["measure"], "consecutive failures");
    assert_eq!(endpoint("0")["judged"]["value"], 2.0);
    assert_eq!(endpoint("0")["judged"]["threshold"], 3.0);
    assert_eq!(endpoint("2")["state"], "CLOSED");
    assert_eq!(endpoint("1")["state"], "OPEN");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for (key, state) in [("0", "CLOSED"), ("1", "OPEN"), ("2", "CLOSED")] {
        let series = format!(
            "outlier_endpoint_policy_state{{upstream=\"default\",upstream_endpoint=\"{key}\",policy=\"recommended\",state=\"{state}\"}} 1"
        );
        assert!(text.contains(&series), "{series} in {text}");
    }
    assert!(!text.contains("SHUT"), "{text}");
}

/// A hyper server on loopback answering every request with `status`.
async fn answering(status: u16) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |_: hyper::Request<hyper::body::Incoming>| async move {
                        let response = hyper::Response::builder()
                            .status(status)
                            .body(Empty::<Bytes>::new())
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(response)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// A hyper client pinned to one server: the discover item, keyed by the server's address.
#[derive(Clone)]
struct Pinned {
    addr: SocketAddr,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
}

impl tower::Service<http::Request<Empty<Bytes>>> for Pinned {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<Empty<Bytes>>) -> Self::Future {
        *request.uri_mut() = format!("http://{}/", self.addr).parse().unwrap();
        let client = self.client.clone();
        Box::pin(async move { client.request(request).await.map_err(BoxError::from) })
    }
}

/// Envoy's `/clusters`, from the admin component mounted in a hyper server on loopback: three
/// hyper servers behind the layer with Envoy's detectors (five 5xx in a row eject, for 30 s), one
/// answering 500 until it is ejected. `?format=json` reads as Envoy's `admin.v3.Clusters`: the
/// ejected host alone has `failed_outlier_check`, each host's `rq_*` stats are its window's
/// counts in the snapshot, its success rate a percentage; the text format has the ejected host's
/// `health_flags::/failed_outlier_check` line. HEAD answers as GET without the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_clusters_show_the_ejected_host_as_envoy_does() {
    use futures::channel::mpsc;
    use tower::discover::Change;
    use tower::Service;
    use tower_outlier::ServerErrors;

    let failing = answering(500).await;
    let healthy = [answering(200).await, answering(200).await];
    let client = Client::builder(TokioExecutor::new()).build_http();
    let (tx, rx) =
        mpsc::unbounded::<Result<Change<SocketAddr, Pinned>, std::convert::Infallible>>();
    for addr in [failing, healthy[0], healthy[1]] {
        tx.unbounded_send(Ok(Change::Insert(
            addr,
            Pinned {
                addr,
                client: client.clone(),
            },
        )))
        .unwrap();
    }
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::envoy()
            .max_ejection_percent(50)
            .build()
            .unwrap(),
    ))
    .classifier(ServerErrors);
    let monitor = layer.monitor();

    // The admin component in a hyper server of its own.
    let admin = Admin::builder(&monitor).cluster_name("orders").build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper_util::service::TowerToHyperService::new(admin.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });

    // Serial traffic through p2c until the failing server is ejected and the healthy ones have
    // answered some calls each; then none, so that nothing changes while the admin is read.
    let mut balance = Balance::new(layer.layer(rx));
    let settled = |snapshot: &tower_outlier::Snapshot| {
        snapshot
            .get_key(&failing)
            .is_some_and(|e| e.status == tower_outlier::EndpointStatus::Ejected)
            && healthy.iter().all(|addr| {
                snapshot
                    .get_key(addr)
                    .is_some_and(|e| e.windows[0].counts.calls >= 5)
            })
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        while !settled(&monitor.snapshot()) {
            let request = http::Request::get("http://placeholder/")
                .body(Empty::new())
                .unwrap();
            let _ = balance.ready().await.unwrap().call(request).await;
        }
    })
    .await
    .expect("the failing server ejected within 20 s");

    let (status, content_type, body) = get(addr, "/clusters?format=json").await;
    let snapshot = monitor.snapshot();
    assert_eq!(status, 200, "{body}");
    assert_eq!(content_type, "application/json");
    let json: Value = serde_json::from_str(&body).unwrap();
    let clusters = json["cluster_statuses"].as_array().unwrap();
    assert_eq!(clusters.len(), 1, "{json}");
    assert_eq!(clusters[0]["name"], "orders");
    // Not computed from what the snapshot has: left out, as Envoy leaves out one it lacks.
    assert!(clusters[0].get("success_rate_ejection_threshold").is_none());
    let hosts = clusters[0]["host_statuses"].as_array().unwrap();
    assert_eq!(hosts.len(), 3, "{json}");
    for host in hosts {
        let socket = &host["address"]["socket_address"];
        assert_eq!(socket["address"], "127.0.0.1", "{host}");
        let port = socket["port_value"].as_u64().unwrap() as u16;
        let key = SocketAddr::from(([127, 0, 0, 1], port));
        let endpoint = snapshot
            .get_key(&key)
            .unwrap_or_else(|| panic!("{key} not in the snapshot"));
        let health = &host["health_status"];
        assert_eq!(health["eds_health_status"], "HEALTHY", "{host}");
        if key == failing {
            assert_eq!(health["failed_outlier_check"], true, "{host}");
        } else {
            assert!(
                health.get("failed_outlier_check").is_none(),
                "a healthy host leaves the flag out: {host}"
            );
        }
        let stat = |name: &str| -> u64 {
            let stat = host["stats"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == name)
                .unwrap_or_else(|| panic!("no {name}: {host}"));
            assert_eq!(stat["type"], "COUNTER", "{stat}");
            // proto3 JSON's 64-bit integers are decimal strings.
            stat["value"].as_str().unwrap().parse().unwrap()
        };
        let counts = endpoint.windows[0].counts;
        assert_eq!(stat("rq_total"), counts.calls, "{host}");
        assert_eq!(stat("rq_error"), counts.failures, "{host}");
        assert_eq!(stat("rq_success"), counts.calls - counts.failures, "{host}");
        assert!(counts.calls > 0, "{host}");
        let rate = host["success_rate"]["value"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&rate), "{host}");
        let expected = (counts.calls - counts.failures) as f64 * 100.0 / counts.calls as f64;
        assert!((rate - expected).abs() < 1e-9, "{host}");
        assert_eq!(host["weight"], 100, "{host}");
    }
    let rate_of = |key: SocketAddr| {
        hosts
            .iter()
            .find(|h| h["address"]["socket_address"]["port_value"] == key.port())
            .unwrap()["success_rate"]["value"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(rate_of(failing), 0.0);
    assert_eq!(rate_of(healthy[0]), 100.0);

    // Envoy's text format: the same values, a line each.
    let (status, content_type, text) = get(addr, "/clusters").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "text/plain; charset=utf-8");
    let failures = snapshot.get_key(&failing).unwrap().windows[0]
        .counts
        .failures;
    for line in [
        format!("orders::{failing}::health_flags::/failed_outlier_check"),
        format!("orders::{failing}::rq_error::{failures}"),
        format!("orders::{failing}::success_rate::0"),
        format!("orders::{failing}::weight::100"),
        format!("orders::{}::health_flags::healthy", healthy[0]),
        format!("orders::{}::success_rate::100", healthy[1]),
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    assert_eq!(
        text.lines()
            .filter(|l| l.ends_with("::health_flags::/failed_outlier_check"))
            .count(),
        1,
        "{text}"
    );

    // HEAD: the GET's status and content type, no body.
    let head = client
        .request(
            http::Request::head(format!("http://{addr}/clusters?format=json"))
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(head.headers()["content-type"], "application/json");
    let body = head.into_body().collect().await.unwrap().to_bytes();
    assert!(body.is_empty());
    drop(tx);
}
