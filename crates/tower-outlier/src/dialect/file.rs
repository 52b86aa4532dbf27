//! A configuration file followed the way Kubernetes mounts a ConfigMap.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::reconfigure::RulesHandle;
use tower_outlier_core::dialect::Dialect;
use tower_outlier_core::Lock;

/// How long the file must stay quiet before it is read: an editor's save or a ConfigMap update
/// is several events in a few milliseconds.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// How long a document read must stay the same before it is applied: a file rewritten in place
/// (truncated, then written) can be read half written, and half a SOFA properties file is a valid
/// document nobody wrote.
const STABLE: Duration = Duration::from_millis(500);

/// The largest document read: configuration, not data (a path resolving to `/dev/zero` or a log
/// must not be read until memory runs out).
const MAX_DOCUMENT: u64 = 1 << 20;

/// Follows the configuration file at `path`: applies it once now, then again each time it
/// changes, in `dialect`, through `rules`. Run it on a task of its own, and abort the task to
/// stop following; it ends by itself only when the watch fails (the error is returned).
///
/// It watches the file's directory, not the file, so it sees a file replaced as Kubernetes
/// replaces a mounted ConfigMap (the `..data` symlink swapped to a new directory in one rename)
/// as well as a file rewritten in place or renamed over; when the path is a symlink into another
/// directory, that directory is watched too. Reads and changes to other files of the directory
/// are ignored. Changes are read once the directory has been quiet for 200 ms, and a
/// content is applied once two reads 500 ms apart agree (a file rewritten in place may be read
/// half written) and it differs from the last one applied. Only a regular file of at most 1 MiB
/// is read, and never in a way that blocks (a FIFO or a device at the path is refused). A file
/// that is missing, unreadable or refused is logged, shown in the snapshot's `rules_error`, and
/// waited out; a document that does not parse is refused ([`RulesHandle::apply`]) and the rules
/// in force stay.
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
    // The names whose changes matter: the file's, and that of the file a symlink at the path
    // leads to (in its own directory, watched too).
    let names: Arc<Lock<Vec<OsString>>> = Arc::new(Lock::new(
        path.file_name()
            .map(OsStr::to_os_string)
            .into_iter()
            .collect(),
    ));
    let watched_names = names.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Err(_) => true,
            Ok(event) => concerns(event, &watched_names.lock()),
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
    let mut followed = Followed {
        directories: vec![directory],
        names,
    };
    followed.follow_link(&path, &mut watcher).await;
    let mut last = Last::default();
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
        // A symlink at the path may lead elsewhere now.
        followed.follow_link(&path, &mut watcher).await;
        read_and_apply(&path, &dialect, &rules, &mut last).await;
    }
}

/// The directories watched and the file names that matter in them.
struct Followed {
    directories: Vec<PathBuf>,
    names: Arc<Lock<Vec<OsString>>>,
}

impl Followed {
    /// Watches the directory of the file a symlink at `path` leads to, if it is one not watched
    /// yet: a change made there, behind the link, is a change of the file (the Kubernetes
    /// layout's links stay within the watched directory; a link into another directory would
    /// otherwise be missed). Bounded: a path whose links keep moving watches at most 16.
    async fn follow_link(&mut self, path: &Path, watcher: &mut impl Watcher) {
        let Ok(target) = tokio::fs::canonicalize(path).await else {
            return;
        };
        let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
            return;
        };
        {
            let mut names = self.names.lock();
            if !names.iter().any(|known| known == name) && names.len() < 16 {
                names.push(name.to_os_string());
            }
        }
        if self.directories.iter().any(|watched| watched == parent) || self.directories.len() >= 16
        {
            return;
        }
        match watcher.watch(parent, RecursiveMode::NonRecursive) {
            Ok(()) => {
                tracing::debug!(target: "tower_outlier", path = %path.display(), target = %target.display(), "configuration file is a link elsewhere: its directory is watched too");
                self.directories.push(parent.to_path_buf());
            }
            Err(error) => {
                tracing::warn!(target: "tower_outlier", target = %target.display(), %error, "the directory a configuration link leads to cannot be watched");
            }
        }
    }
}

/// Whether `event` in a watched directory may have changed a file called one of `names`: not a mere
/// read (reading the file ourselves must not trigger another read), and about the file itself or
/// Kubernetes' `..data` links and directories (a ConfigMap update renames `..data_tmp` over
/// `..data`).
fn concerns(event: &notify::Event, names: &[OsString]) -> bool {
    if matches!(event.kind, notify::EventKind::Access(_)) {
        return false;
    }
    event.paths.is_empty()
        || event.paths.iter().any(|path| {
            path.file_name().is_some_and(|file| {
                names.iter().any(|name| name == file) || file.to_string_lossy().starts_with("..")
            })
        })
}

/// What the source last did with the file: the document it last applied or refused, and
/// whether the file could not be read since (shown in the snapshot's `rules_error`).
#[derive(Default)]
struct Last {
    text: Option<String>,
    troubled: bool,
}

async fn read_and_apply<D: Dialect>(
    path: &Path,
    dialect: &D,
    rules: &RulesHandle,
    last: &mut Last,
) {
    tracing::trace!(target: "tower_outlier", path = %path.display(), "configuration file read");
    match read_stable(path).await {
        Ok(text) if !last.troubled && last.text.as_deref() == Some(text.as_str()) => {}
        Ok(text) => {
            // Applied (or refused) anew after a trouble, so that the snapshot says what is true
            // of this document rather than of the trouble.
            last.troubled = false;
            if let Ok(version) = rules.apply(dialect, &text) {
                tracing::info!(target: "tower_outlier", path = %path.display(), version, "configuration file applied");
            }
            // A refused document is not read again until it changes.
            last.text = Some(text);
        }
        Err(error) => {
            tracing::warn!(target: "tower_outlier", path = %path.display(), %error, "configuration file unreadable; waiting for it");
            last.troubled = true;
            rules.source_trouble(Some(format!(
                "configuration file {} not read: {error}; the rules in force stay",
                path.display()
            )));
        }
    }
}

/// The document at `path` once two reads `STABLE` apart agree (five tries).
async fn read_stable(path: &Path) -> io::Result<String> {
    let mut text = read_document(path).await?;
    for _ in 0..5 {
        tokio::time::sleep(STABLE).await;
        let again = read_document(path).await?;
        if again == text {
            return Ok(text);
        }
        text = again;
    }
    Err(io::Error::other("the file kept changing while it was read"))
}

/// Reads the regular file at `path`, of at most `MAX_DOCUMENT` bytes, without blocking on a FIFO.
async fn read_document(path: &Path) -> io::Result<String> {
    use tokio::io::AsyncReadExt;

    let refuse = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_owned());
    // `metadata` follows links, as the read would: a symlink to `/dev/zero` is a device.
    let metadata = tokio::fs::metadata(path).await?;
    if !metadata.is_file() {
        return Err(refuse("not a regular file"));
    }
    if metadata.len() > MAX_DOCUMENT {
        return Err(refuse("larger than 1 MiB"));
    }
    let mut options = tokio::fs::OpenOptions::new();
    options.read(true);
    // Should the path become a FIFO between the check and the open, opening it must not wait
    // for a writer.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    options.custom_flags(0o4000);
    #[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
    options.custom_flags(0x0004);
    let file = options.open(path).await?;
    if !file.metadata().await?.is_file() {
        return Err(refuse("not a regular file"));
    }
    let mut text = String::new();
    file.take(MAX_DOCUMENT + 1)
        .read_to_string(&mut text)
        .await?;
    if text.len() as u64 > MAX_DOCUMENT {
        return Err(refuse("larger than 1 MiB"));
    }
    Ok(text)
}
