//! Reconfiguration: the rules of a running outlier-detection layer follow an HSF configuration
//! file mounted the way Kubernetes mounts a ConfigMap, and change while traffic flows.
//!
//! ```text
//! cargo run --example reconfigure
//! ```
//!
//! Four HTTP servers on loopback sit behind a power-of-two-choices balancer; one of them answers
//! 503 to 3 requests out of 10. `dialect::watch_file` follows `hsf.json` in a temporary directory
//! laid out as the kubelet lays out a ConfigMap volume (`hsf.json -> ..data/hsf.json`,
//! `..data -> ..<timestamp>`), and applies it through the layer's `RulesHandle`:
//!
//! 1. under `errorRateThreshold` 0.5, the server failing 30 % of its requests stays in rotation;
//! 2. the ConfigMap is updated as the kubelet does it (a new data directory, a `..data_tmp`
//!    symlink renamed over `..data`) to a threshold of 0.2 for our service: the watcher applies
//!    it, and the layer ejects the server at once, judged on the calls its window already holds;
//! 3. an invalid update (`errorRateThreshold: 7`) is refused: the rules in force stay, the
//!    monitor shows the error, and the server stays out.
//!
//! Why HSF's preset and not `DetectorConfig::recommended()`, which the other examples run: this
//! example shows a layer following a document in a production system's own dialect, and a
//! document replaces a policy of its own kind only (HSF's error-rate policy here). A layer on the
//! recommended configuration is changed with `RulesHandle::replace` and a new `DetectorConfig`;
//! it refuses HSF, Envoy and gRPC documents, and says what it runs.
//!
//! Everything runs on loopback and in a temporary directory (removed at the end), and ends by
//! itself in a few seconds. The example checks its own claims and exits non-zero if one does not
//! hold, so it doubles as a smoke test. It needs symlinks, so it runs on unix only.

// Everything but `main` is used only by the unix `main`.
#![cfg_attr(not(unix), allow(dead_code, unused_imports))]

#[path = "demo/mod.rs"]
mod demo;

use demo::{certainly_ejected, print_table, received, since, status, Counted as Server};
use std::convert::Infallible;
use std::error::Error;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use std::{fs, io};

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::{Interval, MissedTickBehavior};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_outlier::dialect::{watch_file, Hsf};
use tower_outlier::hyper_client::PinnedClient;
use tower_outlier::{
    EndpointStatus, ErrorRateConfig, ErrorRatePolicy, Monitor, OutlierDetectionLayer, RulesHandle,
    ServerErrors,
};

type DynError = Box<dyn Error + Send + Sync>;

/// The servers of the demo; `FLAKY` answers 503 to 3 requests of every 10.
const NAMES: [&str; 4] = ["alpha", "bravo", "charlie", "delta"];
const FLAKY: &str = "charlie";

/// The HSF service whose block `Hsf::service` reads (over `DEFAULT`, key by key).
const SERVICE: &str = "com.example.Orders:1.0.0";

/// The ConfigMap's key: the file the application reads.
const FILE: &str = "hsf.json";

/// The first configuration: HSF's documented keys, ejecting above 50 % errors. `isolationTime`
/// (30 s) is far beyond the example's run, so an ejected server stays out until the end; one
/// server in four may be out (`maxIsolationRate`).
const CONFIG_A: &str = r#"{
  "DEFAULT": {
    "qosEnabled": true,
    "errorRateThreshold": 0.5,
    "requestThreshold": 10,
    "timeWindowInSeconds": 10,
    "isolationTime": 30000,
    "maxIsolationRate": 0.25
  }
}"#;

/// The update: a block for our service lowers its threshold to 20 %; every other key still comes
/// from `DEFAULT`.
const CONFIG_B: &str = r#"{
  "DEFAULT": {
    "qosEnabled": true,
    "errorRateThreshold": 0.5,
    "requestThreshold": 10,
    "timeWindowInSeconds": 10,
    "isolationTime": 30000,
    "maxIsolationRate": 0.25
  },
  "com.example.Orders:1.0.0": {
    "errorRateThreshold": 0.2
  }
}"#;

/// A broken update: a threshold of 7 (700 %) is out of range, so the document is refused whole.
const CONFIG_C: &str = r#"{
  "DEFAULT": {
    "qosEnabled": true,
    "errorRateThreshold": 0.5,
    "requestThreshold": 10,
    "timeWindowInSeconds": 10,
    "isolationTime": 30000,
    "maxIsolationRate": 0.25
  },
  "com.example.Orders:1.0.0": {
    "errorRateThreshold": 7
  }
}"#;

/// Requests go out in concurrent batches of this size, one batch every `PACE`: a steady load.
/// p2c compares loads (latency × (in flight + 1)); one request at a time, nothing is ever in
/// flight and an endpoint that drew one slow answer loses every comparison for a while, so
/// batches spread the traffic as real concurrent callers do. Each batch completes before the next
/// starts, so what the monitor shows between two batches holds for every request of the next.
const BATCH: usize = 8;
const PACE: Duration = Duration::from_millis(50);

/// Batches per measured phase: about 1.5 s and 240 requests, of which the flaky server gets its
/// share (about 60) many times over the 10 calls HSF's `requestThreshold` asks for.
const PHASE_BATCHES: usize = 30;

/// How long to wait for the watcher or the layer to act before calling it a failure. The watcher
/// reads a change once the directory has been quiet for 200 ms; the rest is generosity for a
/// loaded machine.
const PATIENCE: Duration = Duration::from_secs(15);

/// Once the flaky server is ejected, a batch counts as "sent while it was ejected" only if its
/// recovery check is at least this far off (it is 30 s off: this never bites in practice).
const MARGIN: Duration = Duration::from_millis(500);

#[cfg(not(unix))]
fn main() {
    println!("This example lays out a Kubernetes ConfigMap volume with symlinks: unix only.");
}

#[cfg(unix)]
#[tokio::main]
async fn main() {
    // The watcher logs each file it applies, the handle each accepted or refused document, the
    // layer its new rules and ejections: the log narrates what the tables show.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_target(false)
        .try_init();
    // `run` removes its temporary directory whatever happens; only then do we exit.
    match run().await {
        Ok(failures) if failures.is_empty() => {}
        Ok(failures) => {
            for failure in &failures {
                eprintln!("CLAIM FAILED: {failure}");
            }
            std::process::exit(1);
        }
        Err(error) => {
            eprintln!("ERROR: {error}");
            std::process::exit(1);
        }
    }
}

/// Runs the demo; returns the claims that did not hold (none: success).
#[cfg(unix)]
async fn run() -> Result<Vec<String>, DynError> {
    let mut failures = Vec::new();

    // 1. The ConfigMap volume, first version: threshold 0.5.
    let config_map = ConfigMap::create("..2026_11_30_a", CONFIG_A)?;
    println!("\nConfigMap volume at {}", config_map.dir.display());
    println!("  {}", config_map.layout());

    // 2. Four HTTP/1 servers on loopback; the flaky one fails 30 % of its requests.
    let mut servers = Vec::new();
    for name in NAMES {
        servers.push(Server::start(name, name == FLAKY).await?);
    }
    let flaky = servers
        .iter()
        .position(|s| s.name == FLAKY)
        .ok_or("no flaky server")?;
    // The monitor names endpoints by their discover key, as `Debug` prints it.
    let flaky_key = format!("{:?}", servers[flaky].addr);

    // 3. The layer starts from HSF's preset; the file's rules replace it once read. `ServerErrors`
    //    counts 5xx responses as failures (the default counts transport errors only).
    let outliers =
        OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?))
            .classifier(ServerErrors);
    // Both are taken before the layer is consumed, and keep working once it runs.
    let monitor = outliers.monitor();
    let rules = outliers.rules();

    // Service discovery: a channel of changes keyed by address; `discovery` lives to the end of
    // `run`, which keeps the stream open.
    let (discovery, changes) =
        mpsc::unbounded::<Result<Change<SocketAddr, PinnedClient<Empty<Bytes>>>, Infallible>>();
    for server in &servers {
        discovery.unbounded_send(Ok(Change::Insert(
            server.addr,
            PinnedClient::new(server.addr),
        )))?;
    }
    // discovery -> outlier detection -> p2c balancer -> buffer, as in the quickstart.
    let client = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(changes);

    // The watcher runs on a task of its own, as a real service would start it next to its client.
    // It reads the file right away (version 1), then after every change of its directory.
    let watcher = tokio::spawn(watch_file(
        config_map.file(),
        Hsf::service(SERVICE),
        rules.clone(),
    ));
    let mut world = World {
        client,
        servers,
        monitor,
        rules,
        watcher,
        pace: steady_pace(),
        errors: 0,
    };
    // No traffic yet: the first requests go out under the file's rules.
    let applied = world.wait(false, |w| w.rules.version() >= 1).await?;
    if !applied {
        return Err("the watcher did not apply the first configuration".into());
    }
    let v1 = world.rules.version();
    println!("the watcher applied {FILE}: rules version {v1}");

    // 4. (a) Threshold 0.5: the flaky server's 30 % is not above it.
    println!("\n== (a) errorRateThreshold 0.5: {FLAKY} fails 30 % of its requests ==");
    let before = received(&world.servers);
    let mut ejected_under_a = false;
    // The phase's batches, and more until the flaky server's window holds the 10 calls the
    // rules need to judge it: p2c steers away from a server whose last calls failed (the layer
    // raises its latency estimate so that failing fast never makes it the cheapest pick), so on
    // a loaded machine a server failing 30 % of its calls may take longer to see ten.
    let started = tokio::time::Instant::now();
    let mut sent = 0;
    loop {
        world.batch().await?;
        sent += 1;
        ejected_under_a |= !world.is_available(&flaky_key);
        let judged = world
            .endpoint(&flaky_key)
            .and_then(|e| e.windows.first().map(|w| w.counts.calls >= 10))
            .unwrap_or(false);
        if sent >= PHASE_BATCHES && (judged || started.elapsed() > PATIENCE) {
            break;
        }
    }
    let phase_a = since(&world.servers, &before);
    world.table(&phase_a);
    let flaky_a = world.endpoint(&flaky_key);
    let window_a = flaky_a
        .as_ref()
        .and_then(|e| e.windows.first())
        .map(|w| w.counts)
        .unwrap_or_default();
    let version_in_force = world.monitor.snapshot().rules_version;
    if version_in_force != v1 {
        failures.push(format!(
            "the monitor shows rules version {version_in_force} in force, not the file's {v1}"
        ));
    }
    if ejected_under_a || flaky_a.as_ref().is_some_and(|e| e.last_reason.is_some()) {
        failures.push(format!("{FLAKY} was ejected under errorRateThreshold 0.5"));
    }
    // The claim only means something if the window held enough calls to be judged, at a rate
    // the next threshold will catch.
    if window_a.calls < 10 {
        failures.push(format!(
            "{FLAKY}'s window held {} calls, fewer than requestThreshold 10: it was never judged",
            window_a.calls
        ));
    }
    if !(window_a.failure_rate() > 0.2 && window_a.failure_rate() <= 0.5) {
        failures.push(format!(
            "{FLAKY}'s error rate was {:.2}, not in (0.2, 0.5]",
            window_a.failure_rate()
        ));
    }
    println!(
        "{FLAKY}: {}/{} calls failed in its window ({:.0} %), not above 50 %: it stays in",
        window_a.failures,
        window_a.calls,
        window_a.failure_rate() * 100.0
    );

    // 5. (b) The ConfigMap update, as the kubelet makes it; traffic keeps flowing meanwhile.
    println!("\n== (b) the ConfigMap is updated: errorRateThreshold 0.2 for {SERVICE} ==");
    let before = received(&world.servers);
    let swapped_at = Instant::now();
    config_map.update("..2026_11_30_b", CONFIG_B)?;
    println!("  {}", config_map.layout());
    // The watcher publishes the update once the directory has been quiet for 200 ms; the layer
    // applies it at its next poll (the next request) and judges every endpoint by it at once, on
    // the calls their windows already hold. So the flaky server gets requests until the update is
    // published and none from the first batch sent after: batches start only once the previous
    // one has finished, so every request of a batch that starts after the publication is routed
    // under the new rules.
    let mut published_after = None;
    let mut ejected_after = None;
    // What the flaky server received in batches that started after the publication.
    let mut after_publication = 0;
    while ejected_after.is_none() && swapped_at.elapsed() < PATIENCE {
        world.check_watcher().await?;
        let published = world.rules.version() > v1;
        let flaky_before = received(&world.servers)[flaky];
        world.batch().await?;
        if published {
            after_publication += received(&world.servers)[flaky] - flaky_before;
        }
        if published_after.is_none() && world.rules.version() > v1 {
            published_after = Some(swapped_at.elapsed());
        }
        if status(&world.monitor, &flaky_key) == Some(EndpointStatus::Ejected) {
            ejected_after = Some(swapped_at.elapsed());
        }
    }
    let v2 = world.rules.version();
    let swap = since(&world.servers, &before);
    world.table(&swap);
    let Some(published_after) = published_after else {
        failures.push(format!(
            "the watcher did not apply the update within {PATIENCE:?}"
        ));
        return Ok(world.finish(config_map, failures).await);
    };
    println!(
        "the watcher had applied the update {published_after:.0?} after the swap (rules version \
         {v1} -> {v2}); {FLAKY} received {} requests before and {after_publication} after",
        swap[flaky] - after_publication,
    );
    let Some(ejected_after) = ejected_after else {
        failures.push(format!(
            "{FLAKY} was not ejected under errorRateThreshold 0.2"
        ));
        return Ok(world.finish(config_map, failures).await);
    };
    println!("{FLAKY} was seen ejected {ejected_after:.0?} after the swap");
    if v2 != v1 + 1 {
        failures.push(format!("one update made the rules go from {v1} to {v2}"));
    }
    if after_publication > 0 {
        failures.push(format!(
            "{FLAKY} received {after_publication} requests after the update was published"
        ));
    }

    // 6. (c) Under 0.2, the flaky server is out: the others take all the traffic.
    println!("\n== (c) errorRateThreshold 0.2: {FLAKY} is ejected ==");
    let before = received(&world.servers);
    let mut sent_while_ejected = 0;
    for _ in 0..PHASE_BATCHES {
        if !certainly_ejected(&world.monitor, &flaky_key, MARGIN) {
            failures.push(format!("{FLAKY} came back during phase (c)"));
            break;
        }
        world.batch().await?;
        sent_while_ejected += BATCH;
    }
    let phase_c = since(&world.servers, &before);
    world.table(&phase_c);
    let snapshot = world.monitor.snapshot();
    match snapshot
        .get(&flaky_key)
        .and_then(|e| e.last_reason.as_ref())
    {
        Some(reason) => {
            println!("{FLAKY}'s last ejection: {reason}");
            if reason.policy != "error-rate" || (reason.threshold - 0.2).abs() > 1e-9 {
                failures.push(format!(
                    "{FLAKY} was ejected by {} at threshold {}, not error-rate at 0.2",
                    reason.policy, reason.threshold
                ));
            }
        }
        None => failures.push(format!("{FLAKY} has no ejection reason")),
    }
    if snapshot.rules_version != v2 || snapshot.rules_error.is_some() {
        failures.push(format!(
            "the monitor shows rules version {} and error {:?}, not {v2} and none",
            snapshot.rules_version, snapshot.rules_error
        ));
    }
    if phase_c[flaky] > 0 {
        failures.push(format!(
            "{FLAKY} received {} of the {sent_while_ejected} requests sent while it was ejected",
            phase_c[flaky]
        ));
    }
    for (server, &n) in world.servers.iter().zip(&phase_c) {
        if server.name != FLAKY && n == 0 {
            failures.push(format!(
                "{} received nothing while {FLAKY} was out",
                server.name
            ));
        }
    }

    // 7. (d) A broken update through the same file: refused, the rules in force stay.
    println!("\n== (d) the ConfigMap is updated with errorRateThreshold 7 (invalid) ==");
    let before = received(&world.servers);
    config_map.update("..2026_11_30_c", CONFIG_C)?;
    println!("  {}", config_map.layout());
    // A refusal changes no version: the monitor's error is the sign the watcher read the file.
    let refused = world
        .wait(true, |w| w.monitor.snapshot().rules_error.is_some())
        .await?;
    for _ in 0..PHASE_BATCHES / 2 {
        if !certainly_ejected(&world.monitor, &flaky_key, MARGIN) {
            break;
        }
        world.batch().await?;
    }
    let phase_d = since(&world.servers, &before);
    world.table(&phase_d);
    let snapshot = world.monitor.snapshot();
    match &snapshot.rules_error {
        Some(error) => println!("rules_error: {error}"),
        None => failures.push(format!(
            "the invalid document left no rules_error within {PATIENCE:?} (refused: {refused})"
        )),
    }
    if let Some(error) = &snapshot.rules_error {
        if !error.contains("errorRateThreshold") {
            failures.push(format!("rules_error does not name the key: {error}"));
        }
    }
    let version = world.rules.version();
    if version != v2 || snapshot.rules_version != v2 {
        failures.push(format!(
            "the invalid document changed the rules: version {version} (monitor {}), was {v2}",
            snapshot.rules_version
        ));
    }
    // The policy in force is still the one read from the update: error-rate at 0.2.
    let in_force = world
        .rules
        .policy::<ErrorRatePolicy>()
        .map(|p| p.config().error_rate_threshold());
    println!("rules in force: version {version}, errorRateThreshold {in_force:?}");
    if in_force != Some(0.2) {
        failures.push(format!(
            "the error-rate threshold in force is {in_force:?}, not 0.2"
        ));
    }
    if status(&world.monitor, &flaky_key) != Some(EndpointStatus::Ejected) {
        failures.push(format!(
            "{FLAKY} is {:?} after the invalid update, not Ejected",
            status(&world.monitor, &flaky_key)
        ));
    }
    if phase_d[flaky] > 0 {
        failures.push(format!(
            "{FLAKY} received {} requests after the invalid update",
            phase_d[flaky]
        ));
    }

    let errors = world.errors;
    let failures = world.finish(config_map, failures).await;
    if failures.is_empty() {
        println!(
            "\nOK: under 0.5 {FLAKY} stayed in ({}/{} calls failed); the ConfigMap swap to 0.2 \
             was applied (version {v1} -> {v2}) and ejected it; it received none of the \
             {sent_while_ejected} requests sent while it was out; the invalid update was refused \
             and the rules in force stayed (version {v2}). Callers saw {errors} errors (503).",
            window_a.failures, window_a.calls
        );
    }
    Ok(failures)
}

/// What the phases share: the client, the servers, the layer's handles and the watcher's task.
struct World<S> {
    client: S,
    servers: Vec<Server>,
    monitor: Monitor,
    rules: RulesHandle,
    watcher: tokio::task::JoinHandle<io::Result<()>>,
    pace: Interval,
    /// 5xx answers the callers got.
    errors: usize,
}

impl<S> World<S>
where
    S: Service<Request<Empty<Bytes>>, Response = Response<Incoming>, Error = BoxError> + Clone,
{
    /// Waits for the next tick of the pace, then sends one batch.
    async fn batch(&mut self) -> Result<(), DynError> {
        self.pace.tick().await;
        self.errors += send_batch(&self.client).await?;
        Ok(())
    }

    /// Waits until `done` holds (true) or `PATIENCE` runs out (false), sending a batch at each
    /// tick if `traffic`. The layer acts when the balancer polls it, that is on requests; the
    /// watcher and the rules handle need no traffic.
    async fn wait(
        &mut self,
        traffic: bool,
        done: impl Fn(&Self) -> bool,
    ) -> Result<bool, DynError> {
        let start = Instant::now();
        loop {
            if done(self) {
                return Ok(true);
            }
            self.check_watcher().await?;
            if start.elapsed() > PATIENCE {
                return Ok(false);
            }
            if traffic {
                self.batch().await?;
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// An error if the watcher has ended: it runs until the watch fails, and nothing it was
    /// meant to apply would ever come.
    async fn check_watcher(&mut self) -> Result<(), DynError> {
        if self.watcher.is_finished() {
            let result = (&mut self.watcher).await;
            return Err(format!("the file watcher ended: {result:?}").into());
        }
        Ok(())
    }

    fn endpoint(&self, key: &str) -> Option<tower_outlier::EndpointSnapshot> {
        self.monitor.snapshot().get(key).cloned()
    }

    fn is_available(&self, key: &str) -> bool {
        status(&self.monitor, key).is_some_and(|s| s.is_available())
    }

    fn table(&self, counts: &[usize]) {
        print_table(&self.servers, counts, &self.monitor, "server", "requests");
        let snapshot = self.monitor.snapshot();
        // The monitor's version is the one in force: the newest the layer has applied.
        println!(
            "monitor: rules version {} in force, rules_error {:?}",
            snapshot.rules_version, snapshot.rules_error
        );
    }

    /// Stops the watcher (it would otherwise follow the file forever) and checks it was still
    /// running: a watcher that died would explain any failure above.
    async fn finish(self, config_map: ConfigMap, mut failures: Vec<String>) -> Vec<String> {
        if self.watcher.is_finished() {
            failures.push(format!(
                "the file watcher ended early: {:?}",
                self.watcher.await
            ));
        } else {
            self.watcher.abort();
            let _ = self.watcher.await;
        }
        drop(config_map);
        failures
    }
}

fn steady_pace() -> Interval {
    let mut pace = tokio::time::interval(PACE);
    // A late batch (a loaded machine) delays the next ones instead of bursting to catch up.
    pace.set_missed_tick_behavior(MissedTickBehavior::Delay);
    pace
}

/// A temporary directory laid out as the kubelet lays out a ConfigMap volume:
///
/// ```text
/// hsf.json -> ..data/hsf.json
/// ..data -> ..2026_11_30_a
/// ..2026_11_30_a/hsf.json
/// ```
///
/// Removed when dropped.
struct ConfigMap {
    dir: PathBuf,
}

#[cfg(unix)]
impl ConfigMap {
    fn create(data_dir: &str, text: &str) -> io::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "tower-outlier-reconfigure-{}-{nanos}",
            std::process::id()
        ));
        // `create_dir`, not `create_dir_all`: never adopt (and later delete) a directory we did
        // not make.
        fs::create_dir(&dir)?;
        let config_map = ConfigMap { dir };
        fs::create_dir(config_map.dir.join(data_dir))?;
        fs::write(config_map.dir.join(data_dir).join(FILE), text)?;
        // Relative targets, as the kubelet writes them: the volume can be mounted anywhere.
        std::os::unix::fs::symlink(data_dir, config_map.dir.join("..data"))?;
        std::os::unix::fs::symlink(Path::new("..data").join(FILE), config_map.file())?;
        Ok(config_map)
    }

    /// The path the application reads.
    fn file(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Where the symlinks point, for the log: `hsf.json -> ..data/hsf.json, ..data -> ..<dir>`.
    fn layout(&self) -> String {
        let target = |name: &str| match fs::read_link(self.dir.join(name)) {
            Ok(target) => target.display().to_string(),
            Err(error) => format!("({error})"),
        };
        format!("{FILE} -> {}, ..data -> {}", target(FILE), target("..data"))
    }

    /// Publishes `text` as the kubelet's atomic writer does: a complete new data directory, a
    /// `..data_tmp` symlink to it renamed over `..data` (one atomic rename: a reader sees the old
    /// file or the new one, never a mix), then the old data directory removed.
    fn update(&self, data_dir: &str, text: &str) -> io::Result<()> {
        let old = fs::read_link(self.dir.join("..data"))?;
        fs::create_dir(self.dir.join(data_dir))?;
        fs::write(self.dir.join(data_dir).join(FILE), text)?;
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(data_dir, &tmp)?;
        fs::rename(&tmp, self.dir.join("..data"))?;
        fs::remove_dir_all(self.dir.join(old))
    }
}

impl Drop for ConfigMap {
    fn drop(&mut self) {
        // Symlinks are removed, not followed.
        if let Err(error) = fs::remove_dir_all(&self.dir) {
            eprintln!("could not remove {}: {error}", self.dir.display());
        }
    }
}

impl Server {
    /// Binds 127.0.0.1 on a port the OS picks and serves HTTP/1 from a background task: 200 with
    /// the server's name, or, if `flaky`, 503 to requests 0, 3 and 6 of every 10 it receives.
    /// Spread out so, any run of 10 or more consecutive requests holds 23 % to 40 % failures:
    /// above 0.2 and below 0.5 whatever part of its history the 10 s window holds.
    async fn start(name: &'static str, flaky: bool) -> Result<Self, DynError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(AtomicUsize::new(0));
        let counter = received.clone();
        let handler = hyper::service::service_fn(move |_request: Request<Incoming>| {
            // Counted here, on the server, so the tables show what the servers actually saw.
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let mut response = Response::new(Full::new(Bytes::from(name)));
            if flaky && matches!(n % 10, 0 | 3 | 6) {
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
