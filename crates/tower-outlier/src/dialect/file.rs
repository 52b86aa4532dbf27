//! A configuration file followed the way Kubernetes mounts a ConfigMap.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::reconfigure::{Dialect, RulesHandle};

/// How long the file must stay quiet before it is read: an editor's save or a ConfigMap update
/// is several events in a few milliseconds.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Follows the configuration file at `path`: applies it once now, then again each time it
/// changes, in `dialect`, through `rules`. Run it on a task of its own, and abort the task to
/// stop following; it ends by itself only when the watch fails (the error is returned).
///
/// It watches the file's directory, not the file, so it sees a file replaced as Kubernetes
/// replaces a mounted ConfigMap (the `..data` symlink swapped to a new directory in one rename)
/// as well as a file rewritten in place or renamed over. Reads and changes to other files of the
/// directory are ignored. Changes are read once the directory has been quiet for 200 ms, and
/// only a content different from the last one read is applied. A file
/// that is missing or unreadable for a moment is logged and waited out; a document that does not
/// parse is refused ([`RulesHandle::apply`]) and the rules in force stay.
///
/// ```no_run
/// # #[cfg(feature = "hsf")] {
/// use tower_outlier::dialect::{watch_file, Hsf};
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// # async fn run() -> Result<(), tower::BoxError> {
/// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
/// tokio::spawn(watch_file(
///     "/etc/config/hsf.json",
///     Hsf::service("com.example.Orders:1.0.0"),
///     layer.rules(),
/// ));
/// # Ok(()) }
/// # }
/// ```
pub async fn watch_file<D: Dialect>(
    path: impl AsRef<Path>,
    dialect: D,
    rules: RulesHandle,
) -> io::Result<()> {
    let path = path.as_ref().to_path_buf();
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (events, mut changed) = mpsc::unbounded_channel();
    let name = path.file_name().map(|name| name.to_os_string());
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Err(_) => true,
            Ok(event) => concerns(event, name.as_deref()),
        };
        if relevant {
            // The receiver gone means the source stopped; nothing to tell.
            let _ = events.send(event.map(|_| ()));
        }
    })
    .map_err(io::Error::other)?;
    watcher
        .watch(&directory, RecursiveMode::NonRecursive)
        .map_err(io::Error::other)?;
    let mut last: Option<String> = None;
    read_and_apply(&path, &dialect, &rules, &mut last).await;
    loop {
        match changed.recv().await {
            None => return Ok(()),
            Some(Err(error)) => return Err(io::Error::other(error)),
            Some(Ok(())) => {}
        }
        // Let the burst of events settle.
        while let Ok(Some(event)) = tokio::time::timeout(DEBOUNCE, changed.recv()).await {
            if let Err(error) = event {
                return Err(io::Error::other(error));
            }
        }
        read_and_apply(&path, &dialect, &rules, &mut last).await;
    }
}

/// Whether `event` in the watched directory may have changed the file called `name`: not a mere
/// read (reading the file ourselves must not trigger another read), and about the file itself or
/// Kubernetes' `..data` links and directories (a ConfigMap update renames `..data_tmp` over
/// `..data`).
fn concerns(event: &notify::Event, name: Option<&std::ffi::OsStr>) -> bool {
    if matches!(event.kind, notify::EventKind::Access(_)) {
        return false;
    }
    event.paths.is_empty()
        || event.paths.iter().any(|path| {
            path.file_name()
                .is_some_and(|file| Some(file) == name || file.to_string_lossy().starts_with(".."))
        })
}

async fn read_and_apply<D: Dialect>(
    path: &Path,
    dialect: &D,
    rules: &RulesHandle,
    last: &mut Option<String>,
) {
    tracing::trace!(target: "tower_outlier", path = %path.display(), "configuration file read");
    match tokio::fs::read_to_string(path).await {
        Ok(text) if last.as_deref() == Some(text.as_str()) => {}
        Ok(text) => {
            if let Ok(version) = rules.apply(dialect, &text) {
                tracing::info!(target: "tower_outlier", path = %path.display(), version, "configuration file applied");
            }
            // A refused document is not read again until it changes.
            *last = Some(text);
        }
        Err(error) => {
            tracing::warn!(target: "tower_outlier", path = %path.display(), %error, "configuration file unreadable; waiting for it")
        }
    }
}
