//! `dialect::watch_etcd` against a real etcd server (Debian's `etcd-server`; `.ci/run` installs
//! it): a fleet of three layers follows one key; a changed value is in force on every layer
//! within a second; a deleted key and a stopped etcd keep the last good rules (and say so); a
//! restarted etcd is followed again and a value put meanwhile applied.
//!
//! ```sh
//! cargo test --features etcd --test etcd_source
//! ```
#![cfg(feature = "etcd")]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tower_outlier::dialect::etcd_client::Client;
use tower_outlier::dialect::{watch_etcd, Hsf};
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer, RulesHandle};

const SERVICE: &str = "com.example.Orders:1.0.0";
const KEY: &str = "/config/orders/hsf.json";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An etcd server of one member on loopback, its data in a directory of its own.
struct Etcd {
    client: SocketAddr,
    peer: SocketAddr,
    data: PathBuf,
    process: Option<Child>,
    extra: Vec<&'static str>,
}

impl Etcd {
    fn start() -> Self {
        Etcd::start_with("", Vec::new())
    }

    /// A server with `extra` arguments, its data directory named with `tag`.
    fn start_with(tag: &str, extra: Vec<&'static str>) -> Self {
        let data =
            std::env::temp_dir().join(format!("tower-outlier-etcd-{}{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        let mut etcd = Etcd {
            client: SocketAddr::from(([127, 0, 0, 1], free_port())),
            peer: SocketAddr::from(([127, 0, 0, 1], free_port())),
            data,
            process: None,
            extra,
        };
        etcd.run();
        etcd
    }

    fn url(&self) -> String {
        format!("http://{}", self.client)
    }

    /// Starts the server (again, on the same ports and data) and waits until it answers.
    fn run(&mut self) {
        let peer = format!("http://{}", self.peer);
        let process = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(&self.data)
            .args(["--listen-client-urls", &self.url()])
            .args(["--advertise-client-urls", &self.url()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd is installed (Debian: apt-get install etcd-server)");
        self.process = Some(process);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&self.client, Duration::from_millis(100)).is_err() {
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    async fn client(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut client) = Client::connect([self.url()], None).await {
                // Ready once it serves a read (a leader elected).
                if client.get("probe", None).await.is_ok() {
                    return client;
                }
            }
            assert!(Instant::now() < deadline, "etcd does not serve");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

fn document(threshold: f64) -> String {
    format!(r#"{{"DEFAULT": {{"qosEnabled": true, "errorRateThreshold": {threshold}}}}}"#)
}

/// The error-rate threshold each layer's policy has now.
fn thresholds(fleet: &[(OutlierDetectionLayer, RulesHandle)]) -> Vec<f64> {
    fleet
        .iter()
        .map(|(_, rules)| {
            let policy = rules
                .policy::<ErrorRatePolicy>()
                .expect("the error-rate policy");
            policy.config().error_rate_threshold()
        })
        .collect()
}

/// Waits up to `within` for every layer to hold `threshold`; how long it took.
async fn in_force(
    fleet: &[(OutlierDetectionLayer, RulesHandle)],
    threshold: f64,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        if thresholds(fleet).iter().all(|t| *t == threshold) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "not in force on every layer within {within:?}: {:?}",
            thresholds(fleet)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_follows_a_key_through_changes_deletions_and_restarts() {
    let mut etcd = Etcd::start();
    let mut client = etcd.client().await;
    client.put(KEY, document(0.3), None).await.unwrap();

    let fleet: Vec<(OutlierDetectionLayer, RulesHandle)> = (0..3)
        .map(|_| {
            let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
                ErrorRateConfig::hsf().build().unwrap(),
            ));
            let rules = layer.rules();
            (layer, rules)
        })
        .collect();
    let sources: Vec<_> = fleet
        .iter()
        .map(|(_, rules)| {
            tokio::spawn(watch_etcd(
                [etcd.url()],
                KEY,
                Hsf::service(SERVICE),
                rules.clone(),
                None,
            ))
        })
        .collect();
    in_force(&fleet, 0.3, Duration::from_secs(5)).await;

    // A change is in force on every layer within a second.
    client.put(KEY, document(0.2), None).await.unwrap();
    let took = in_force(&fleet, 0.2, Duration::from_secs(1)).await;
    eprintln!("a changed key in force on three layers after {took:?}");

    // A document that does not parse is refused: the rules stay, the monitor says why.
    client
        .put(KEY, r#"{"DEFAULT": {"errorRateThreshold": 7}}"#, None)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while fleet
        .iter()
        .any(|(layer, _)| layer.monitor().snapshot().rules_error.is_none())
    {
        assert!(Instant::now() < deadline, "the refusal is not shown");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(thresholds(&fleet), [0.2; 3]);

    // A deleted key keeps the last good rules, and says so.
    client.put(KEY, document(0.25), None).await.unwrap();
    in_force(&fleet, 0.25, Duration::from_secs(1)).await;
    client.delete(KEY, None).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let said = fleet.iter().all(|(layer, _)| {
            layer
                .monitor()
                .snapshot()
                .rules_error
                .is_some_and(|e| e.contains("missing"))
        });
        if said {
            break;
        }
        assert!(Instant::now() < deadline, "the deletion is not shown");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(thresholds(&fleet), [0.25; 3], "the last good rules stay");

    // etcd stopped: the rules in force stay, the sources keep trying.
    etcd.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(thresholds(&fleet), [0.25; 3]);
    assert!(sources.iter().all(|s| !s.is_finished()), "a source gave up");

    // etcd back (same data): a value put now is followed again on every layer.
    etcd.run();
    let mut client = etcd.client().await;
    client.put(KEY, document(0.15), None).await.unwrap();
    let took = in_force(&fleet, 0.15, Duration::from_secs(10)).await;
    eprintln!("after etcd's restart, a new value in force on three layers after {took:?}");
    for (layer, _) in &fleet {
        assert_eq!(
            layer.monitor().snapshot().rules_error,
            None,
            "the missing key is no longer shown"
        );
    }
    for source in sources {
        source.abort();
    }
}

/// A value larger than 1 MiB is refused and said so in the snapshot, not taken for etcd being
/// unreachable; one over the gRPC client's 4 MiB, which cannot be read at all, too (before, it was
/// reported as "etcd cannot be reached" and read again every 2 s). A good value put afterwards
/// is applied and the error goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_too_large_is_refused_and_said_so() {
    // etcd takes requests of up to 1.5 MiB unless told otherwise.
    let etcd = Etcd::start_with("-large", vec!["--max-request-bytes", "10485760"]);
    let mut client = etcd.client().await;
    client.put(KEY, document(0.3), None).await.unwrap();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let rules = layer.rules();
    let fleet = vec![(layer.clone(), rules.clone())];
    let source = tokio::spawn(watch_etcd(
        [etcd.url()],
        KEY,
        Hsf::service(SERVICE),
        rules,
        None,
    ));
    in_force(&fleet, 0.3, Duration::from_secs(5)).await;
    let shown = |what: &'static str| {
        let monitor = layer.monitor();
        async move {
            let started = Instant::now();
            loop {
                let error = monitor.snapshot().rules_error;
                if error.as_deref().is_some_and(|e| e.contains(what)) {
                    return error.unwrap();
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "{what:?} not shown: {error:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // 2 MiB: read, and refused.
    client.put(KEY, " ".repeat(2 << 20), None).await.unwrap();
    let error = shown("larger than 1 MiB").await;
    assert!(!error.contains("reached"), "{error}");
    // 5 MiB: too large to read at all.
    client.put(KEY, " ".repeat(5 << 20), None).await.unwrap();
    let error = shown("over 4 MiB").await;
    assert!(!error.contains("reached"), "{error}");
    assert!(thresholds(&fleet) == [0.3], "the rules in force stay");
    // A good value again: applied (read again after the back-off), the error gone.
    client.put(KEY, document(0.2), None).await.unwrap();
    in_force(&fleet, 0.2, Duration::from_secs(10)).await;
    assert_eq!(layer.monitor().snapshot().rules_error, None);
    source.abort();
}
