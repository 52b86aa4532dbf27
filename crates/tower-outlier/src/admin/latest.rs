//! The sampler's copies of the monitor: the snapshots the page, `/snapshot` and `/clusters` are
//! served from, so that no request builds one on its own task.
//!
//! A request waits for a copy the sampler begins after the request asked: what the caller did
//! before asking (a call, an override) is in it, and every request that asked meanwhile is
//! answered by that one copy. The sampler takes it on tokio's blocking pool at once if it is idle
//! (it does not wait for its next tick). A thousand readers at once cost one snapshot, not a
//! thousand, and none of them stalls the runtime's workers: a snapshot of 100 000 endpoints is
//! about a tenth of a second of one core. A copy is held only until the requests it answers have
//! it: nothing of that size stays between requests.
//!
//! With no sampler (its runtime shut down, or the component used outside one), a request builds
//! its own, on the blocking pool inside a runtime and inline outside one.

use std::sync::Arc;

use tokio::sync::{oneshot, Notify};
use tower_outlier_core::Lock;

use crate::monitor::{Monitor, Snapshot};

/// Where requests ask for a copy and the sampler answers them.
#[derive(Default)]
pub(super) struct Latest {
    asking: Lock<Asking>,
    // A request woke the sampler (a permit is kept if it was busy).
    wake: Notify,
    // The component was dropped.
    closed: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Asking {
    // A sampler answers: set while its task lives (see [`Answering`]).
    open: bool,
    waiting: Vec<oneshot::Sender<Arc<Snapshot>>>,
}

/// The sampler's hold on [`Latest`]: requests are answered while it lives, and when it is
/// dropped (the sampler ended, or its task was dropped unstarted with its runtime) the waiting
/// requests build their own.
pub(super) struct Answering {
    latest: Arc<Latest>,
}

/// Requests a copy about to begin answers.
pub(super) struct Covered(Vec<oneshot::Sender<Arc<Snapshot>>>);

impl Latest {
    /// The sampler's hold, from now on: made before its task is spawned, so that a request made
    /// meanwhile waits for it.
    pub(super) fn answering(self: &Arc<Self>) -> Answering {
        self.asking.lock().open = true;
        Answering {
            latest: self.clone(),
        }
    }

    /// The component was dropped: the sampler ends now, not at its next tick.
    pub(super) fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// A copy of the monitor begun after this call: the sampler's, or built here if there is no
    /// sampler.
    pub(super) async fn copy(&self, monitor: &Monitor) -> Arc<Snapshot> {
        let answer = {
            let mut asking = self.asking.lock();
            asking.open.then(|| {
                let (sender, answer) = oneshot::channel();
                asking.waiting.push(sender);
                answer
            })
        };
        if let Some(answer) = answer {
            self.wake.notify_one();
            if let Ok(snapshot) = answer.await {
                return snapshot;
            }
        }
        Arc::new(own_snapshot(monitor).await)
    }
}

impl Answering {
    /// The next wake-up a request gives the sampler.
    pub(super) fn woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.latest.wake.notified()
    }

    /// Whether the component was dropped.
    pub(super) fn closed(&self) -> bool {
        self.latest
            .closed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a request waits for a copy.
    pub(super) fn wanted(&self) -> bool {
        !self.latest.asking.lock().waiting.is_empty()
    }

    /// The requests waiting now, which a copy begun next answers.
    pub(super) fn cover(&self) -> Covered {
        Covered(std::mem::take(&mut self.latest.asking.lock().waiting))
    }
}

impl Covered {
    /// Answers the requests with `snapshot`.
    pub(super) fn answer(self, snapshot: &Arc<Snapshot>) {
        for sender in self.0 {
            // A request dropped meanwhile does not want it.
            let _ = sender.send(snapshot.clone());
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let mut asking = self.latest.asking.lock();
        asking.open = false;
        // Their answers' ends dropped: they build their own.
        asking.waiting.clear();
    }
}

/// A snapshot built for one request: on the blocking pool inside a runtime, inline outside one.
async fn own_snapshot(monitor: &Monitor) -> Snapshot {
    if tokio::runtime::Handle::try_current().is_ok() {
        let taking = monitor.clone();
        if let Ok(snapshot) = tokio::task::spawn_blocking(move || taking.snapshot()).await {
            return snapshot;
        }
    }
    monitor.snapshot()
}

/// Runs `render` on the blocking pool inside a runtime (a page of 100 000 endpoints is tens of
/// milliseconds of formatting), inline outside one; `None` if the runtime shut down first.
pub(super) async fn off_task<T: Send + 'static>(
    render: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Some(render());
    }
    match tokio::task::spawn_blocking(render).await {
        Ok(value) => Some(value),
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitor() -> Monitor {
        crate::OutlierDetectionLayer::new(crate::ErrorRatePolicy::new(
            crate::ErrorRateConfig::hsf().build().unwrap(),
        ))
        .monitor()
    }

    #[tokio::test]
    async fn the_requests_waiting_share_one_copy_and_later_ones_wait_for_the_next() {
        let latest = Arc::new(Latest::default());
        let monitor = monitor();
        let answering = latest.answering();
        let early: Vec<_> = (0..8)
            .map(|_| {
                let (latest, monitor) = (latest.clone(), monitor.clone());
                tokio::spawn(async move { latest.copy(&monitor).await })
            })
            .collect();
        while latest.asking.lock().waiting.len() < 8 {
            tokio::task::yield_now().await;
        }
        assert!(answering.wanted());
        let covered = answering.cover();
        // Asked after the copy began: not answered by it.
        let late = {
            let (latest, monitor) = (latest.clone(), monitor.clone());
            tokio::spawn(async move { latest.copy(&monitor).await })
        };
        while !answering.wanted() {
            tokio::task::yield_now().await;
        }
        let first = Arc::new(monitor.snapshot());
        covered.answer(&first);
        for copy in early {
            assert!(Arc::ptr_eq(&copy.await.unwrap(), &first));
        }
        let second = Arc::new(monitor.snapshot());
        answering.cover().answer(&second);
        assert!(Arc::ptr_eq(&late.await.unwrap(), &second));
        // Answered, nothing of it is held.
        assert_eq!(Arc::strong_count(&first), 1);
    }

    #[tokio::test]
    async fn with_the_sampler_gone_a_request_builds_its_own() {
        let latest = Arc::new(Latest::default());
        let monitor = monitor();
        // No sampler ever: built here.
        let _ = latest.copy(&monitor).await;
        let answering = latest.answering();
        let waiting = {
            let (latest, monitor) = (latest.clone(), monitor.clone());
            tokio::spawn(async move { latest.copy(&monitor).await })
        };
        while !answering.wanted() {
            tokio::task::yield_now().await;
        }
        drop(answering);
        let _ = waiting.await.unwrap();
    }

    #[tokio::test]
    async fn the_sampler_ends_with_the_component_not_at_its_next_tick() {
        let monitor = monitor();
        let alone = Arc::strong_count(monitor.registry());
        let admin = crate::admin::Admin::builder(&monitor)
            .sample_every(std::time::Duration::from_secs(3600))
            .build();
        // The sampler took its first tick and sleeps for an hour, holding a monitor.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(Arc::strong_count(monitor.registry()) > alone);
        drop(admin);
        let dropped = tokio::time::Instant::now();
        while Arc::strong_count(monitor.registry()) > alone {
            assert!(
                dropped.elapsed() < std::time::Duration::from_secs(5),
                "the sampler still runs"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
