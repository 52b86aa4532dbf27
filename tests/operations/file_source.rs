//! `dialect::watch_file` on a real directory (real time): a file rewritten in place and a
//! ConfigMap-style symlink swap are both applied; the watcher's own reads do not wake it again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower::BoxError;
use tower_outlier::dialect::{watch_file, Dialect, Hsf};
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

/// HSF JSON, counting the documents it is given.
struct Counting(Hsf, Arc<AtomicUsize>);

impl Dialect for Counting {
    type Policy = ErrorRatePolicy;

    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn policy_name(&self) -> &'static str {
        self.0.policy_name()
    }
    fn parse(
        &self,
        text: &str,
        current: &ErrorRatePolicy,
        notes: &mut Vec<String>,
    ) -> Result<ErrorRatePolicy, BoxError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.parse(text, current, notes)
    }
}

/// Counts the watcher's reads of the file (its `trace` events), on this thread.
struct CountReads(Arc<AtomicUsize>);

impl tracing::Subscriber for CountReads {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        if *meta.level() == tracing::Level::TRACE
            && meta.file().is_some_and(|f| f.ends_with("file.rs"))
        {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn document(threshold: f64) -> String {
    format!(r#"{{"DEFAULT": {{"errorRateThreshold": {threshold}}}}}"#)
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_plain_file_and_a_configmap_swap_are_followed() {
    let dir =
        std::env::temp_dir().join(format!("tower-outlier-file-source-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let rules = layer.rules();
    let parsed = Arc::new(AtomicUsize::new(0));
    let reads = Arc::new(AtomicUsize::new(0));
    let _counting = tracing::subscriber::set_default(CountReads(reads.clone()));

    // A plain file, rewritten in place.
    let plain = dir.join("plain.json");
    std::fs::write(&plain, document(0.4)).unwrap();
    let dialect = Counting(Hsf::service("svc:1.0"), parsed.clone());
    let task = tokio::spawn(watch_file(plain.clone(), dialect, rules.clone()));
    until("the first read", || rules.version() == 1).await;
    std::fs::write(&plain, document(0.3)).unwrap();
    until("the rewrite", || rules.version() == 2).await;
    // Quiet for a while: the watcher's own reads must not trigger more reads, nor reads of the
    // directory's other files.
    let read_so_far = reads.load(Ordering::SeqCst);
    assert!(read_so_far >= 2);
    std::fs::write(dir.join("other.json"), "{}").unwrap();
    let _ = std::fs::read_to_string(dir.join("other.json")).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(reads.load(Ordering::SeqCst), read_so_far);
    assert_eq!(parsed.load(Ordering::SeqCst), 2);
    task.abort();

    // Envoy's JSON through the same source.
    let envoy = OutlierDetectionLayer::new(tower_outlier::DetectorPolicy::new(
        tower_outlier::DetectorConfig::envoy().build().unwrap(),
    ));
    let envoy_rules = envoy.rules();
    let cluster = dir.join("cluster.json");
    std::fs::write(
        &cluster,
        r#"{"consecutive5xx": 3, "baseEjectionTime": "10s"}"#,
    )
    .unwrap();
    let task = tokio::spawn(watch_file(
        cluster.clone(),
        tower_outlier::dialect::Envoy,
        envoy_rules.clone(),
    ));
    until("Envoy's document", || envoy_rules.version() == 1).await;
    let policies = envoy_rules.policies();
    let text = format!("{:?}", policies[0]);
    assert!(
        text.contains("threshold: 3") && text.contains("10s"),
        "{text}"
    );
    task.abort();

    #[cfg(unix)]
    {
        // The ConfigMap layout: hsf.json -> ..data/hsf.json, ..data -> ..v1, swapped by a rename.
        use std::os::unix::fs::symlink;
        let mount = dir.join("mount");
        std::fs::create_dir_all(mount.join("..v1")).unwrap();
        std::fs::write(mount.join("..v1/hsf.json"), document(0.25)).unwrap();
        symlink("..v1", mount.join("..data")).unwrap();
        symlink("..data/hsf.json", mount.join("hsf.json")).unwrap();
        let task = tokio::spawn(watch_file(
            mount.join("hsf.json"),
            Hsf::service("svc:1.0"),
            rules.clone(),
        ));
        until("the ConfigMap's first read", || rules.version() == 3).await;
        std::fs::create_dir_all(mount.join("..v2")).unwrap();
        std::fs::write(mount.join("..v2/hsf.json"), document(0.2)).unwrap();
        symlink("..v2", mount.join("..data_tmp")).unwrap();
        std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
        std::fs::remove_dir_all(mount.join("..v1")).unwrap();
        until("the swap", || rules.version() == 4).await;
        let policies = rules.policies();
        assert!(
            format!("{:?}", policies[0]).contains("threshold: 0.2"),
            "{policies:?}"
        );
        task.abort();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// HSF JSON, remembering every document it is given.
struct Recording(Hsf, Arc<std::sync::Mutex<Vec<String>>>);

impl Dialect for Recording {
    type Policy = ErrorRatePolicy;

    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn policy_name(&self) -> &'static str {
        self.0.policy_name()
    }
    fn parse(
        &self,
        text: &str,
        current: &ErrorRatePolicy,
        notes: &mut Vec<String>,
    ) -> Result<ErrorRatePolicy, BoxError> {
        self.1.lock().unwrap().push(text.to_owned());
        self.0.parse(text, current, notes)
    }
}

#[cfg(unix)]
#[tokio::test]
async fn only_a_stable_regular_file_of_bounded_size_is_read() {
    use std::io::Write;

    let dir = std::env::temp_dir().join(format!(
        "tower-outlier-file-source-hostile-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let rules = layer.rules();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let path = dir.join("hsf.json");

    // A FIFO at the path: no writer will ever come. The watcher must not wait for one.
    let status = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
    let task = tokio::spawn(watch_file(
        path.clone(),
        Recording(Hsf::service("svc:1.0"), seen.clone()),
        rules.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rules.version(), 0);
    // Replaced by a link to /dev/zero: a device, never read.
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(rules.version(), 0);
    assert!(seen.lock().unwrap().is_empty(), "nothing parsed");
    // Then a regular file: followed as usual.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, document(0.4)).unwrap();
    until("the regular file", || rules.version() == 1).await;

    // A torn rewrite in place: truncated, half written, a pause, the rest. Half a document is
    // never parsed, only the whole one once it stays the same.
    let whole = document(0.3);
    let (first, second) = whole.split_at(whole.len() / 2);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.write_all(first.as_bytes()).unwrap();
    file.flush().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    file.write_all(second.as_bytes()).unwrap();
    drop(file);
    until("the whole rewrite", || rules.version() == 2).await;
    let parsed = seen.lock().unwrap().clone();
    assert!(!parsed.iter().any(|t| t == first), "{parsed:?}");

    // Larger than 1 MiB: refused, the rules in force stay.
    let mut big = document(0.2);
    big.push_str(&" ".repeat(2 << 20));
    std::fs::write(&path, big).unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(rules.version(), 2);
    task.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file refused for its size is shown in the snapshot's `rules_error`, not only logged, and the
/// error goes once a readable document is in place (finding: refusals were only logged).
#[tokio::test]
async fn a_refused_file_is_shown_in_the_rules_error() {
    let dir =
        std::env::temp_dir().join(format!("tower-outlier-file-refused-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let rules = layer.rules();
    let monitor = layer.monitor();
    let file = dir.join("rules.json");
    std::fs::write(&file, " ".repeat(2 << 20)).unwrap();
    let task = tokio::spawn(watch_file(
        file.clone(),
        Hsf::service("svc:1.0"),
        rules.clone(),
    ));
    until("the refusal shown", || {
        monitor
            .snapshot()
            .rules_error
            .is_some_and(|error| error.contains("1 MiB"))
    })
    .await;
    assert_eq!(rules.version(), 0, "nothing applied");
    std::fs::write(&file, document(0.3)).unwrap();
    until("the document applied", || rules.version() == 1).await;
    assert_eq!(monitor.snapshot().rules_error, None);
    task.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A path that is a symlink into another directory: a change made there, behind the link, is
/// applied (finding: only the link's own directory was watched, and the change was missed).
#[tokio::test]
async fn a_change_behind_a_symlink_into_another_directory_is_applied() {
    let base = std::env::temp_dir().join(format!("tower-outlier-file-link-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (links, targets) = (base.join("links"), base.join("elsewhere"));
    std::fs::create_dir_all(&links).unwrap();
    std::fs::create_dir_all(&targets).unwrap();
    let target = targets.join("real.json");
    std::fs::write(&target, document(0.4)).unwrap();
    let link = links.join("rules.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let rules = layer.rules();
    let task = tokio::spawn(watch_file(
        link.clone(),
        Hsf::service("svc:1.0"),
        rules.clone(),
    ));
    until("the first read", || rules.version() == 1).await;
    std::fs::write(&target, document(0.3)).unwrap();
    until("the change behind the link", || rules.version() == 2).await;
    task.abort();
    let _ = std::fs::remove_dir_all(&base);
}
