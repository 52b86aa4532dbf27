//! Rules followed from a key in etcd, the way a fleet of clients takes its configuration from a
//! store instead of a redeploy.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, EventType, WatchOptions};

use crate::reconfigure::RulesHandle;
use tower_outlier_core::dialect::Dialect;

/// The first wait before connecting again after etcd could not be reached or a watch ended.
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between attempts: a restarted etcd is followed again within this.
const MAX_RETRY: Duration = Duration::from_secs(2);
/// The longest wait between reads of a value too large to read: each read of one moves
/// megabytes.
const MAX_RETRY_TOO_LARGE: Duration = Duration::from_secs(60);
/// A watch that stayed up this long was a good one: the back-off starts over.
const GOOD_WATCH: Duration = Duration::from_secs(10);

/// The largest value applied, as the file source's largest document: configuration, not data.
const MAX_VALUE: usize = 1 << 20;

/// The waits between attempts to follow the key: doubling after each attempt that failed or
/// whose watch ended soon (etcd, or a proxy in front of it, cancelling every watch would
/// otherwise be read in a tight loop), starting over after a watch that stayed up.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

/// How an attempt to follow the key ended.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ended {
    /// The watch was cancelled or ended after `lasted`.
    Watch { lasted: Duration },
    /// etcd could not be reached, or the watch failed.
    Unreachable,
    /// The value is too large to read.
    TooLarge,
}

impl Backoff {
    fn new() -> Self {
        Backoff { next: FIRST_RETRY }
    }

    /// How long to wait after an attempt that ended so.
    fn after(&mut self, ended: Ended) -> Duration {
        if let Ended::Watch { lasted } = ended {
            if lasted >= GOOD_WATCH {
                self.next = FIRST_RETRY;
            }
        }
        let wait = self.next;
        let max = if ended == Ended::TooLarge {
            MAX_RETRY_TOO_LARGE
        } else {
            MAX_RETRY
        };
        self.next = (self.next * 2).min(max);
        wait.min(max)
    }
}

/// The connection settings [`watch_etcd`] uses unless given others: a one-second connect
/// timeout, a two-second request timeout, and HTTP/2 keep-alives every 5 s (a silent network
/// partition ends the watch within about 10 s, and it is resumed).
pub fn etcd_connect_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2))
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5))
        .with_keep_alive_while_idle(true)
}

/// Follows the key `key` in the etcd cluster at `endpoints` (`"http://10.0.0.1:2379"`, …): applies
/// its value now, then each new value as etcd announces it, in `dialect`, through `rules`. Run it
/// on a task of its own and abort the task to stop following; it never ends by itself.
///
/// * A value is read (a range request), then watched from the revision after that read, so no
///   change between the two is missed; a value identical to the last one applied is not applied
///   again. A document that does not parse is refused ([`RulesHandle::apply`]): the rules in
///   force stay and the monitor's `Snapshot::rules_error` says why.
/// * **A deleted or missing key keeps the last good rules**, logged at WARN and shown in
///   `Snapshot::rules_error` (`etcd key "…" is missing: the rules in force stay`), until a value is
///   put again.
/// * **A value larger than 1 MiB** is refused, logged at WARN and shown in
///   `Snapshot::rules_error`; the rules in force stay (one over the gRPC client's 4 MiB cannot be
///   read at all: it is read again after a back-off up to a minute, not taken for an outage).
/// * **etcd unreachable, restarted or compacted past the watch**: logged at WARN once per outage,
///   and the source connects again after a back-off (100 ms doubling to 2 s; a watch that ends
///   within 10 s of its start counts as a failed attempt, so a watch cancelled again and again is
///   not followed in a loop), reads the key and watches again; the rules in force stay
///   meanwhile. Changes made while it was away are applied
///   once it is back (only the latest value: etcd's read gives the current one).
///
/// `connect` gives the client's settings (TLS, user and password, timeouts); `None` uses
/// [`etcd_connect_options`].
///
/// ```no_run
/// # #[cfg(feature = "hsf")] {
/// use tower_outlier::dialect::{watch_etcd, Hsf};
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// # async fn run() -> Result<(), tower::BoxError> {
/// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
/// tokio::spawn(watch_etcd(
///     ["http://127.0.0.1:2379"],
///     "/config/orders/hsf.json",
///     Hsf::service("com.example.Orders:1.0.0"),
///     layer.rules(),
///     None,
/// ));
/// # Ok(()) }
/// # }
/// ```
pub async fn watch_etcd<E, S, D>(
    endpoints: S,
    key: impl Into<String>,
    dialect: D,
    rules: RulesHandle,
    connect: Option<ConnectOptions>,
) where
    E: AsRef<str>,
    S: AsRef<[E]>,
    D: Dialect,
{
    let endpoints: Vec<String> = endpoints
        .as_ref()
        .iter()
        .map(|e| e.as_ref().to_owned())
        .collect();
    let mut source = Source {
        key: key.into(),
        dialect,
        rules,
        last: None,
        trouble_shown: false,
        outage: None,
    };
    let mut backoff = Backoff::new();
    loop {
        let started = tokio::time::Instant::now();
        let ended = match source
            .follow_once(
                &endpoints,
                connect.clone().unwrap_or_else(etcd_connect_options),
            )
            .await
        {
            // The watch was cancelled by etcd (compaction) or ended: read and watch again.
            Ok(()) => Ended::Watch {
                lasted: started.elapsed(),
            },
            Err(error) if too_large(&error) => {
                source.too_large(None);
                Ended::TooLarge
            }
            Err(error) => {
                source.unreachable(&error);
                Ended::Unreachable
            }
        };
        tokio::time::sleep(backoff.after(ended)).await;
    }
}

/// Whether `error` says a message was larger than the client reads (a value over 4 MiB: tonic's
/// limit), which is no outage of etcd.
fn too_large(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::OutOfRange)
}

/// What the source keeps between connections.
struct Source<D> {
    key: String,
    dialect: D,
    rules: RulesHandle,
    // The last value applied or refused (a value re-read after a reconnection is not re-applied).
    last: Option<Vec<u8>>,
    // Whether `rules_error` shows this source's trouble now (a missing key, a value not text).
    trouble_shown: bool,
    // The error that began the current outage, if etcd is unreachable.
    outage: Option<String>,
}

impl<D: Dialect> Source<D> {
    /// Connects, reads the key and watches it until the watch ends (`Ok`) or fails (`Err`).
    async fn follow_once(
        &mut self,
        endpoints: &[String],
        options: ConnectOptions,
    ) -> Result<(), etcd_client::Error> {
        let mut client = Client::connect(endpoints, Some(options)).await?;
        let read = client.get(self.key.as_str(), None).await?;
        let revision = read.header().map_or(0, |h| h.revision());
        self.reachable();
        match read.kvs().first() {
            Some(kv) => self.value(kv.value()),
            None => self.missing(),
        }
        let mut watch = client
            .watch(
                self.key.as_str(),
                Some(WatchOptions::new().with_start_revision(revision + 1)),
            )
            .await?;
        while let Some(response) = watch.message().await? {
            if response.canceled() {
                tracing::info!(
                    target: "tower_outlier",
                    key = self.key.as_str(),
                    reason = response.cancel_reason(),
                    compact_revision = response.compact_revision(),
                    "the etcd watch was cancelled: reading the key again"
                );
                return Ok(());
            }
            for event in response.events() {
                match (event.event_type(), event.kv()) {
                    (EventType::Put, Some(kv)) => self.value(kv.value()),
                    (EventType::Delete, _) => self.missing(),
                    (EventType::Put, None) => {}
                }
            }
        }
        Ok(())
    }

    /// The key holds `value`.
    fn value(&mut self, value: &[u8]) {
        if self.trouble_shown {
            self.trouble_shown = false;
            self.rules.source_trouble(None);
        }
        if self.last.as_deref() == Some(value) {
            return;
        }
        if value.len() > MAX_VALUE {
            self.too_large(Some(value.len()));
            return;
        }
        self.last = Some(value.to_owned());
        match std::str::from_utf8(value) {
            Ok(text) => {
                // Logged and shown by the handle when refused.
                let _ = self.rules.apply(&self.dialect, text);
            }
            Err(_) => {
                tracing::warn!(
                    target: "tower_outlier",
                    key = self.key.as_str(),
                    "the etcd key's value is not UTF-8 text: the rules in force stay"
                );
                self.rules.source_trouble(Some(format!(
                    "etcd key {:?} holds a value that is not UTF-8 text: the rules in force stay",
                    self.key
                )));
                self.trouble_shown = true;
            }
        }
    }

    /// The key is missing (never put, or deleted).
    fn missing(&mut self) {
        if self.trouble_shown {
            return;
        }
        tracing::warn!(
            target: "tower_outlier",
            key = self.key.as_str(),
            "the etcd key is missing: the rules in force stay"
        );
        self.rules.source_trouble(Some(format!(
            "etcd key {:?} is missing: the rules in force stay",
            self.key
        )));
        self.trouble_shown = true;
        // A value put again after a deletion is applied, even if it is the one applied before.
        self.last = None;
    }

    /// The key holds a value too large to apply (of `bytes`, when it could be read at all).
    fn too_large(&mut self, bytes: Option<usize>) {
        let size = bytes.map_or_else(|| "over 4 MiB".to_owned(), |n| format!("of {n} bytes"));
        tracing::warn!(
            target: "tower_outlier",
            key = self.key.as_str(),
            size = size.as_str(),
            "the etcd key's value is larger than 1 MiB: the rules in force stay"
        );
        self.rules.source_trouble(Some(format!(
            "etcd key {:?} holds a value {size}, larger than 1 MiB: the rules in force stay",
            self.key
        )));
        self.trouble_shown = true;
        // etcd is reachable: this is no outage.
        self.outage = None;
        // Applied once it is put again, even if it is the value applied before.
        self.last = None;
    }

    fn unreachable(&mut self, error: &etcd_client::Error) {
        if self.outage.is_none() {
            tracing::warn!(
                target: "tower_outlier",
                key = self.key.as_str(),
                %error,
                "etcd cannot be reached or the watch failed: the rules in force stay; connecting again"
            );
            self.outage = Some(error.to_string());
        }
    }

    fn reachable(&mut self) {
        if let Some(error) = self.outage.take() {
            tracing::info!(
                target: "tower_outlier",
                key = self.key.as_str(),
                was = error.as_str(),
                "etcd reached again: following the key"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_cancelled_at_once_again_and_again_backs_off() {
        let mut backoff = Backoff::new();
        let quick = Ended::Watch {
            lasted: Duration::from_millis(1),
        };
        let waits: Vec<Duration> = (0..6).map(|_| backoff.after(quick)).collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1600, 2000].map(Duration::from_millis),
            "waits after watches cancelled at once"
        );
        // A watch that stayed up starts the back-off over.
        let wait = backoff.after(Ended::Watch { lasted: GOOD_WATCH });
        assert_eq!(wait, FIRST_RETRY);
        // A value too large to read is read again after waits up to a minute.
        let waits: Vec<Duration> = (0..12).map(|_| backoff.after(Ended::TooLarge)).collect();
        assert_eq!(waits.last(), Some(&MAX_RETRY_TOO_LARGE));
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
    }
}
