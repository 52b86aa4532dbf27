//! What the layer hands the balancer: the discover adaptor ([`OutlierDetectionDiscover`]) and
//! the endpoints it yields ([`OutlierEndpoint`], whose load is an [`EndpointCost`]).
//!
//! Most code never names these types: [`OutlierDetectionLayer`](crate::OutlierDetectionLayer)
//! builds the adaptor and tower's `Balance` takes it as it is.
//!
//! Upstream changes are authoritative and forwarded first. Ejections are event-driven: a record
//! that crosses a threshold wakes the adaptor, and the adaptor judges the flagged endpoints when it
//! is next polled (the balancer polls discovery before it picks an endpoint, so no request is
//! routed by a stale set). Recovery checks and trial ends run on one timer set to the earliest
//! deadline.

pub use crate::endpoint::{EndpointCost, OutlierEndpoint};

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{AbortHandle, Abortable, FutureExt};
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::discover::{Change, Discover};

use crate::engine::{Engine, ProbeStart, Settings};
use crate::monitor::Registry;
use crate::probe::Probe;

pin_project! {
    /// A [`Discover`] stream of [`OutlierEndpoint`]s: the upstream's endpoints minus the ejected ones.
    ///
    /// Built by [`OutlierDetectionLayer`](crate::OutlierDetectionLayer). Upstream `Insert`s and
    /// `Remove`s pass through (wrapped); an ejection yields `Change::Remove`, a re-admission
    /// `Change::Insert` with a clone of the endpoint (so `S: Clone`).
    ///
    /// Upstream behaviour:
    /// * `Insert` of a known key replaces the service but keeps the key's history: an available
    ///   endpoint is re-inserted with the new service, an ejected one stays out and is re-admitted
    ///   with the new service when it recovers.
    /// * `Remove` forgets the key at once (its record, timers and probe); removing an unknown key
    ///   is ignored. If the removal leaves only ejected endpoints, or more ejected than the budget
    ///   allows, the earliest-due ejected endpoints are re-admitted on trial.
    /// * An upstream error is passed through and nothing is forgotten, or, with
    ///   [`DiscoverErrors::KeepServing`], logged and counted while the stream is read on.
    /// * When the upstream ends, the last known set stays under detection; this stream ends only
    ///   once the upstream has ended and holds no endpoint.
    pub struct OutlierDetectionDiscover<D, C, P>
    where
        D: Discover,
    {
        #[pin]
        discover: D,
        upstream_done: bool,
        engine: Engine<D::Key, D::Service>,
        classifier: C,
        probe: P,
        timer: Option<Pin<Box<Sleep>>>,
        timer_at: Option<Instant>,
        probes: FuturesUnordered<ProbeTask<D::Key>>,
        aborts: HashMap<u64, AbortHandle>,
        watches: Watches<D::Key>,
        discover_errors: DiscoverErrors,
        registry: Arc<Registry>,
        // With `KeepServing`: the upstream is not read again until this fires, after an error
        // (100 ms, doubling with each error in a row up to 5 s), so a stream that fails on every
        // poll is not polled in a loop.
        error_backoff: Option<Pin<Box<Sleep>>>,
        errors_in_a_row: u32,
        // Said once: the adaptor was polled outside a tokio runtime, so no keeper of idle
        // endpoints could start yet.
        no_runtime_said: bool,
    }
}

/// The first wait after an upstream error served through, doubled with each error in a row.
const FIRST_ERROR_BACKOFF: Duration = Duration::from_millis(100);
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(5);

type ProbeTask<K> = Abortable<Pin<Box<dyn Future<Output = (K, u64, bool)> + Send>>>;

impl<D, C, P> OutlierDetectionDiscover<D, C, P>
where
    D: Discover,
{
    pub(crate) fn new(
        discover: D,
        settings: Arc<Settings>,
        classifier: C,
        probe: P,
        registry: Arc<Registry>,
    ) -> Self {
        OutlierDetectionDiscover {
            discover,
            upstream_done: false,
            engine: Engine::new(settings, registry.clone(), Instant::now()),
            classifier,
            probe,
            timer: None,
            timer_at: None,
            probes: FuturesUnordered::new(),
            aborts: HashMap::new(),
            watches: Watches::default(),
            discover_errors: DiscoverErrors::PassThrough,
            registry,
            error_backoff: None,
            errors_in_a_row: 0,
            no_runtime_said: false,
        }
    }

    pub(crate) fn with_discover_errors(mut self, choice: DiscoverErrors) -> Self {
        self.discover_errors = choice;
        self
    }

    pub(crate) fn with_rebuild(
        mut self,
        rebuild: Box<dyn crate::rebuild::Rebuild<D::Key, D::Service> + Send + Sync>,
    ) -> Self {
        self.engine.set_rebuild(rebuild);
        self
    }

    /// How many endpoints this adaptor tracks (every key the upstream holds).
    pub fn tracked(&self) -> usize {
        self.engine.tracked()
    }

    /// How many of them are out of the balancer's set (ejected or probing).
    pub fn ejected(&self) -> usize {
        self.engine.ejected()
    }

    /// Probes in flight.
    pub fn probes_in_flight(&self) -> usize {
        self.probes.len()
    }
}

/// What the discover adaptor does with an error from the upstream stream
/// ([`OutlierDetectionLayer::discover_errors`](crate::OutlierDetectionLayer::discover_errors)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DiscoverErrors {
    /// Pass the error on to the balancer, as tower's discover adaptors do. tower's `Balance`
    /// takes it for a broken upstream: every later call fails, and a `Buffer` in front fails with
    /// it.
    #[default]
    PassThrough,
    /// Log the error (with its type, at WARN), count it in the monitor
    /// ([`Snapshot::discover_errors`](crate::Snapshot)), lose nothing, and read the stream on
    /// after a back-off (100 ms, doubling with each error in a row up to 5 s, so a stream that
    /// fails on every poll is not polled in a loop): the balancer keeps the endpoints the
    /// upstream gave so far, as linkerd's discovery survives a resolver error. A stream that ends
    /// after its error leaves the last set under detection.
    KeepServing,
}

impl<D, C, P> Stream for OutlierDetectionDiscover<D, C, P>
where
    D: Discover,
    D::Key: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    D::Service: Clone,
    C: Clone,
    P: Probe<D::Key, D::Service>,
{
    type Item = Result<Change<D::Key, OutlierEndpoint<D::Service, C>>, D::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        // Read on every poll (a bool): the engine times checks by the cadence only if they are
        // sent, and nothing is ejected before the first poll.
        this.engine.set_checks_sent(this.probe.sends_checks());
        if let Some(board) = this.engine.idle_keeper_wanted() {
            start_keeper(this.engine, this.probe, board, this.no_runtime_said);
        }
        loop {
            if let Some(change) = this.engine.pop_change() {
                let change = match change {
                    Change::Insert(key, parts) => {
                        Change::Insert(key, parts.classified(this.classifier.clone()))
                    }
                    Change::Remove(key) => Change::Remove(key),
                };
                return Poll::Ready(Some(Ok(change)));
            }
            if let Some(sleep) = this.error_backoff.as_mut() {
                if sleep.as_mut().poll(cx).is_ready() {
                    *this.error_backoff = None;
                }
            }
            if !*this.upstream_done && this.error_backoff.is_none() {
                match this.discover.as_mut().poll_discover(cx) {
                    Poll::Ready(Some(Ok(Change::Insert(key, service)))) => {
                        *this.errors_in_a_row = 0;
                        match start_user_watch(this.probe, &key, &service) {
                            Some(stream) => this.watches.start(key.clone(), stream),
                            None => this.watches.stop(&key),
                        }
                        this.engine.insert(key, service, Instant::now());
                        continue;
                    }
                    Poll::Ready(Some(Ok(Change::Remove(key)))) => {
                        *this.errors_in_a_row = 0;
                        this.watches.stop(&key);
                        this.engine.remove(&key, Instant::now());
                        continue;
                    }
                    Poll::Ready(Some(Err(error))) => match this.discover_errors {
                        DiscoverErrors::KeepServing => {
                            this.registry.discover_error();
                            *this.errors_in_a_row = this.errors_in_a_row.saturating_add(1);
                            let wait = FIRST_ERROR_BACKOFF
                                .saturating_mul(1 << (*this.errors_in_a_row - 1).min(6))
                                .min(MAX_ERROR_BACKOFF);
                            tracing::warn!(
                                target: "tower_outlier",
                                error = std::any::type_name::<D::Error>(),
                                in_a_row = *this.errors_in_a_row,
                                read_again_in = ?wait,
                                tracked = this.engine.tracked(),
                                "the upstream discover stream failed; serving the endpoints it gave so far"
                            );
                            *this.error_backoff = Some(Box::pin(tokio::time::sleep(wait)));
                            continue;
                        }
                        _ => return Poll::Ready(Some(Err(error))),
                    },
                    Poll::Ready(None) => {
                        tracing::debug!(target: "tower_outlier", "upstream discovery ended");
                        *this.upstream_done = true;
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            while let Poll::Ready((key, health)) = this.watches.poll_word(cx) {
                this.engine.health(&key, health, Instant::now());
            }
            poll_events(
                this.engine,
                this.probe,
                this.timer,
                this.timer_at,
                this.probes,
                this.aborts,
                cx,
            );
            // Panic may hand the balancer every endpoint, or take the ejected ones back.
            for (key, service) in this.engine.take_rebuilt() {
                // A rebuilt endpoint's health is watched on its new service.
                if let Some(stream) = start_user_watch(this.probe, &key, &service) {
                    this.watches.start(key, stream);
                }
            }
            if this.engine.settle() {
                continue;
            }
            if *this.upstream_done && this.engine.tracked() == 0 {
                return Poll::Ready(None);
            }
            // The notifier, the probes and the timer have all registered the waker.
            return Poll::Pending;
        }
    }
}

/// Starts the task that checks endpoints without traffic (`engine/idle.rs`) on the tokio runtime
/// polling the adaptor. Polled outside one, it is started on a later poll inside one (said once);
/// a probe without an idle checker checks none (said once).
fn start_keeper<K, S, P>(
    engine: &mut Engine<K, S>,
    probe: &mut P,
    board: Arc<crate::engine::IdleBoard<K, S>>,
    no_runtime_said: &mut bool,
) where
    K: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    S: Clone,
    P: Probe<K, S>,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        if !std::mem::replace(no_runtime_said, true) {
            tracing::warn!(
                target: "tower_outlier",
                "no tokio runtime polls the adaptor: endpoints without traffic are checked once one does"
            );
        }
        return;
    };
    match probe.idle_checker() {
        Some(checker) => checker.start(board, &runtime),
        None => tracing::warn!(
            target: "tower_outlier",
            "no_traffic_interval is set but the layer's probe has no idle checker \
             (Probe::idle_checker): endpoints without traffic are not checked"
        ),
    }
    engine.idle_keeper_settled();
}

/// Drives the engine from everything but the upstream until nothing more is ready: the
/// notifier's signals, the timer, and finished probes; starts the probes the engine asks for and
/// aborts the ones it gave up.
fn poll_events<K, S, P>(
    engine: &mut Engine<K, S>,
    probe: &mut P,
    timer: &mut Option<Pin<Box<Sleep>>>,
    timer_at: &mut Option<Instant>,
    probes: &mut FuturesUnordered<ProbeTask<K>>,
    aborts: &mut HashMap<u64, AbortHandle>,
    cx: &mut Context<'_>,
) where
    K: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    S: Clone,
    P: Probe<K, S>,
{
    loop {
        // Register before taking the mark, so a record that signals in between still wakes us.
        engine.notifier().register(cx.waker());
        // Rules, controls, records' signals and hosts all wake the adaptor through it.
        let notified = engine.notifier().take();
        engine.catch_up(notified, Instant::now);
        let mut progressed = false;
        let next = engine.next_deadline();
        if next != *timer_at {
            *timer_at = next;
            if let Some(at) = next {
                match timer.as_mut() {
                    Some(timer) => timer.as_mut().reset(at),
                    // Created on first use, inside the runtime that polls us: building the layer
                    // needs no runtime.
                    None => *timer = Some(Box::pin(tokio::time::sleep_until(at))),
                }
            }
        }
        if let (Some(_), Some(sleep)) = (*timer_at, timer.as_mut()) {
            if sleep.as_mut().poll(cx).is_ready() {
                *timer_at = None;
                engine.advance(Instant::now(), &mut |key, service| {
                    start_user_probe(probe, key, service)
                });
                progressed = true;
            }
        }
        for id in engine.take_cancelled() {
            if let Some(abort) = aborts.remove(&id) {
                abort.abort();
            }
        }
        while let Some(start) = engine.pop_probe() {
            start_probe(start, probes, aborts);
        }
        // An empty set has nothing to poll (probes started above are polled here, so each
        // registers the waker on its first poll).
        while !probes.is_empty() {
            let Poll::Ready(Some(done)) = probes.poll_next_unpin(cx) else {
                break;
            };
            if let Ok((key, id, healthy)) = done {
                aborts.remove(&id);
                engine.probe_done(key, id, healthy, Instant::now());
            }
            progressed = true;
        }
        if !progressed {
            return;
        }
    }
}

/// A check's outcome, `probe` guarded: one that takes longer than `timeout` failed, and one that
/// panics failed too (logged). The probe is user code polled inside the balancer's `poll_ready`
/// (behind `Buffer`, in its worker) or in the keeper's task: a panic is never the caller's
/// service gone.
pub(crate) async fn guarded(probe: crate::probe::ProbeFuture, timeout: Duration) -> bool {
    let probe = std::panic::AssertUnwindSafe(probe).catch_unwind();
    match tokio::time::timeout(timeout, probe).await {
        Ok(Ok(healthy)) => healthy,
        Ok(Err(panic)) => {
            tracing::error!(
                target: "tower_outlier",
                panic = tower_outlier_core::panic_message(&*panic),
                "a probe panicked: counted as a failed check"
            );
            tower_outlier_core::drop_panic(panic);
            false
        }
        Err(_) => false,
    }
}

/// The user's probe for `key`; a probe that panics while it starts is a check that failed.
pub(crate) fn start_user_probe<K, S, P>(
    probe: &mut P,
    key: &K,
    service: &S,
) -> Option<crate::probe::ProbeFuture>
where
    S: Clone,
    P: Probe<K, S>,
{
    let start = std::panic::AssertUnwindSafe(|| probe.probe(key, service.clone()));
    match std::panic::catch_unwind(start) {
        Ok(started) => started,
        Err(panic) => {
            tracing::error!(
                target: "tower_outlier",
                panic = tower_outlier_core::panic_message(&*panic),
                "a probe panicked as it started: counted as a failed check"
            );
            tower_outlier_core::drop_panic(panic);
            Some(Box::pin(std::future::ready(false)))
        }
    }
}

/// The probe's health watch of a joining endpoint, if it has one; a `watch` that panics starts
/// none (logged).
fn start_user_watch<K, S, P>(
    probe: &mut P,
    key: &K,
    service: &S,
) -> Option<crate::probe::HealthStream>
where
    P: Probe<K, S>,
{
    let start = std::panic::AssertUnwindSafe(|| probe.watch(key, service));
    match std::panic::catch_unwind(start) {
        Ok(stream) => stream,
        Err(panic) => {
            tracing::error!(
                target: "tower_outlier",
                panic = tower_outlier_core::panic_message(&*panic),
                "a health watch panicked as it started: the endpoint is not watched"
            );
            tower_outlier_core::drop_panic(panic);
            None
        }
    }
}

fn start_probe<K: Send + 'static>(
    start: ProbeStart<K>,
    probes: &mut FuturesUnordered<ProbeTask<K>>,
    aborts: &mut HashMap<u64, AbortHandle>,
) {
    let ProbeStart {
        key,
        id,
        probe,
        timeout,
    } = start;
    let (abort, registration) = AbortHandle::new_pair();
    let guarded = guarded(probe, timeout);
    let task: Pin<Box<dyn Future<Output = (K, u64, bool)> + Send>> =
        Box::pin(async move { (key, id, guarded.await) });
    probes.push(Abortable::new(task, registration));
    aborts.insert(id, abort);
}

impl<D, C, P> fmt::Debug for OutlierDetectionDiscover<D, C, P>
where
    D: Discover + fmt::Debug,
    D::Key: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutlierDetectionDiscover")
            .field("discover", &self.discover)
            .field("tracked", &self.engine.tracked())
            .field("ejected", &self.engine.ejected())
            .field("policies", self.engine.policies())
            .finish_non_exhaustive()
    }
}

mod watches;
use watches::Watches;
