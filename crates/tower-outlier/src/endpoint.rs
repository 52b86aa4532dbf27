//! The endpoint service: wraps one discovered service, records its outcomes and reports its load.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tower::load::Load;
use tower_outlier_core::lanes::{HasLanes, Lanes};
use tower_outlier_core::{EndpointRecord, Nanos, ProbePermits};
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::response::ResponseClassifier;

/// What the endpoint, its clones and its response futures share.
pub(crate) struct Shared<C> {
    pub(crate) record: EndpointRecord,
    pub(crate) classifier: C,
    // Every lane made for a handle of this endpoint, to sum the calls in flight.
    lanes: Lanes<Shared<C>>,
}

impl<C> Shared<C> {
    pub(crate) fn new(record: EndpointRecord, classifier: C) -> Arc<Self> {
        Arc::new(Shared {
            record,
            classifier,
            lanes: Lanes::new(),
        })
    }

    /// Calls in flight through every handle.
    fn in_flight(&self) -> usize {
        self.lanes.in_flight()
    }
}

impl<C> HasLanes for Shared<C> {
    fn lanes(&self) -> &Lanes<Self> {
        &self.lanes
    }
}

/// The calls one handle has in flight (`tower_outlier_core::lanes`). A handle that calls more
/// than once gets a lane of its own, so cores calling through clones of one endpoint never write
/// the same word per call; copies that never call or are cloned (the layer's own) have none. Not
/// padded to a cache line, though two lanes may then share one: padding cost every called
/// endpoint 32 bytes, and p2c_throughput with `Buffer` on two workers (one thread makes every
/// endpoint's lane, responses complete on both) measured no slower without it.
pub(crate) type Lane<C> = tower_outlier_core::lanes::Lane<Shared<C>>;

/// Lets the monitor read records without knowing the classifier type.
pub(crate) trait HasRecord: Send + Sync {
    fn record(&self) -> &EndpointRecord;
    fn in_flight(&self) -> usize;
}

impl<C: Send + Sync> HasRecord for Shared<C> {
    fn record(&self) -> &EndpointRecord {
        &self.record
    }

    fn in_flight(&self) -> usize {
        Shared::in_flight(self)
    }
}

/// One handle's hold on the record; it also carries the probe permits this handle was granted
/// by `poll_ready` for its next call, and gives them back if it is dropped first (a balancer
/// evicting a ready endpoint).
struct Holder<C> {
    shared: Arc<Shared<C>>,
    // Set while the inner service's `poll_ready` failed and this handle holds the endpoint out
    // of its balancer's picks, retrying after a back-off.
    unready: Option<Box<Unready>>,
    // Set through `&self` too: cloning a handle that has no lane yet gives it one, for the clone
    // to inherit.
    lane: OnceLock<Arc<Lane<C>>>,
    lane_use: LaneUse,
    permits: ProbePermits,
    draws: Draws,
}

/// Whose lane a handle's calls use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LaneUse {
    /// A handle not cloned from another, not called through yet: any lane it has is its own
    /// (made when it was first cloned), or it makes one at its first call.
    Fresh,
    /// The lane of the handle it was cloned from, not called through yet. A handle cloned per
    /// request (`clone().oneshot(..)`) calls once: a lane of its own would only add an
    /// allocation and a lock to every request.
    Inherited,
    /// The inherited lane, called through once.
    InheritedCalled,
    /// Its own.
    Own,
}

impl<C> Holder<C> {
    fn new(shared: Arc<Shared<C>>) -> Self {
        Holder {
            shared,
            unready: None,
            lane: OnceLock::new(),
            lane_use: LaneUse::Fresh,
            permits: 0,
            draws: Draws::default(),
        }
    }

    /// The lane this call's response future holds.
    #[inline]
    fn lane(&mut self) -> Arc<Lane<C>> {
        match (self.lane.get(), self.lane_use) {
            (Some(lane), LaneUse::Own) => lane.clone(),
            _ => self.early_lane(),
        }
    }

    /// This handle's lane, made now if it has none.
    fn lane_or_new(&self) -> &Arc<Lane<C>> {
        self.lane.get_or_init(|| Lane::new(self.shared.clone()))
    }

    // Cold: a handle comes here on its first two calls only.
    #[cold]
    fn early_lane(&mut self) -> Arc<Lane<C>> {
        match self.lane_use {
            LaneUse::Fresh | LaneUse::Own => {
                self.lane_use = LaneUse::Own;
                self.lane_or_new().clone()
            }
            LaneUse::Inherited => {
                self.lane_use = LaneUse::InheritedCalled;
                self.lane_or_new().clone()
            }
            LaneUse::InheritedCalled => {
                if let Some(inherited) = self.lane.take() {
                    inherited.release();
                }
                self.lane_use = LaneUse::Own;
                self.lane_or_new().clone()
            }
        }
    }

    /// How long this handle's calls in flight have been waited for with no call completing: from
    /// the later of when its lane last became busy and the endpoint's last completion, less the
    /// millisecond by which completions are dated.
    #[inline]
    fn waiting(&self, record: &EndpointRecord, now: Nanos) -> Nanos {
        let Some(lane) = self.lane.get() else {
            return 0;
        };
        let busy = lane.busy_since();
        if busy == Nanos::MAX {
            return 0;
        }
        let since = busy.max(record.last_completed());
        now.saturating_sub(since)
            .saturating_sub(WAITING_GRANULARITY)
    }

    /// Calls in flight through every handle of the endpoint.
    #[inline]
    fn in_flight(&self) -> usize {
        match self.lane.get() {
            // This handle's lane is the endpoint's only one: no need to look at the others.
            Some(lane) if self.shared.lanes.live() == 1 => Lane::in_flight(lane),
            None if self.shared.lanes.live() == 0 => 0,
            _ => self.shared.in_flight(),
        }
    }
}

/// How many power-of-two-choices draws in a row an endpoint whose estimate rests on one
/// unconfirmed slow call may lose before it wins one anyway (at most one in 17 of its draws).
const EXPLORE_AFTER: u32 = 16;

/// How long an endpoint avoided after one fast failure waits, once it has lost
/// [`EXPLORE_AFTER`] draws, for a call that tells a server gone (a second failure in a row, which
/// its policies then judge) from a blip (a success, which restores its estimate), when a policy
/// would judge on it: without it, serial traffic left a killed server avoided and unjudged under
/// the recommended configuration, and once restarted unfed until its estimate decayed, half a
/// minute or more.
const RETRY_AFTER_FAST_FAILURE: Nanos = 1_000_000_000;

/// How far the record's time of the last completion may lag (it is written at most once a
/// millisecond, so that cores calling one endpoint do not share a written line).
const WAITING_GRANULARITY: Nanos = 1_000_000;

/// How long a computed evidence request stays good while no call completes: the windows it reads
/// move by whole buckets, far slower than the balancer draws.
const EVIDENCE_REFRESH: Nanos = 10_000_000;

/// What the balancer's load reads need to remember about this handle. It belongs to the handle
/// the balancer holds, not to the shared record, so the reads write no memory other cores use.
/// Atomic only so that `OutlierEndpoint` stays `Sync`: the balancer holding the handle is normally its
/// only reader; concurrent reads through a shared reference could only blur the counts.
#[derive(Debug)]
struct Draws {
    lost: AtomicU32,
    // When the follow-up of a fast failure was last asked for and refused: asked again only
    // [`EVIDENCE_REFRESH`] later, as it reads the policies' windows.
    follow_up_refused_at: AtomicU64,
    wanted: AtomicU64,
    wanted_at: AtomicU64,
    wanted_in_flight: AtomicU64,
}

impl Default for Draws {
    fn default() -> Self {
        Draws {
            lost: AtomicU32::new(0),
            follow_up_refused_at: AtomicU64::new(Nanos::MAX),
            wanted: AtomicU64::new(0),
            wanted_at: AtomicU64::new(Nanos::MAX),
            wanted_in_flight: AtomicU64::new(0),
        }
    }
}

impl Draws {
    /// The calls the policies want ([`EndpointRecord::calls_wanted`]), read from the windows at
    /// most every [`EVIDENCE_REFRESH`] unless a call completed since (the in-flight count fell).
    fn wanted(&self, record: &EndpointRecord, now: Nanos, in_flight: u64) -> u64 {
        if !record.may_want_calls() {
            return 0;
        }
        let at = self.wanted_at.load(Ordering::Relaxed);
        if at != Nanos::MAX
            && now.saturating_sub(at) < EVIDENCE_REFRESH
            && in_flight >= self.wanted_in_flight.load(Ordering::Relaxed)
        {
            return self.wanted.load(Ordering::Relaxed);
        }
        let wanted = record.calls_wanted(now);
        self.wanted.store(wanted, Ordering::Relaxed);
        self.wanted_at.store(now, Ordering::Relaxed);
        self.wanted_in_flight.store(in_flight, Ordering::Relaxed);
        wanted
    }

    /// Counts one draw; true when the endpoint has lost enough in a row to win this one: its
    /// estimate rests on one unconfirmed slow call, or its last call failed fast a second ago or
    /// more and a policy would judge on the next ([`EndpointRecord::follow_up_wanted`]). Never while a call is in flight: a sample is on its way, and a black hole (whose
    /// calls never complete) would otherwise be sent one more call each time it lost 16 draws
    /// until its first timeout came back. Never after a timeout either: that call would cost a
    /// caller a timeout too.
    fn explore(&self, record: &EndpointRecord, in_flight: usize, now: Nanos) -> bool {
        let lost = self.lost.load(Ordering::Relaxed);
        if lost >= EXPLORE_AFTER
            && in_flight == 0
            && (record.peak_unconfirmed() || self.follow_up(record, now))
        {
            return true;
        }
        self.lost.store(lost.saturating_add(1), Ordering::Relaxed);
        false
    }

    /// [`EndpointRecord::follow_up_wanted`], asked at most every [`EVIDENCE_REFRESH`] after a
    /// refusal: it reads the policies' windows, and an avoided endpoint is drawn on every request.
    fn follow_up(&self, record: &EndpointRecord, now: Nanos) -> bool {
        let refused_at = self.follow_up_refused_at.load(Ordering::Relaxed);
        if refused_at != Nanos::MAX && now.saturating_sub(refused_at) < EVIDENCE_REFRESH {
            return false;
        }
        let wanted = record.follow_up_wanted(RETRY_AFTER_FAST_FAILURE, now);
        self.follow_up_refused_at
            .store(if wanted { Nanos::MAX } else { now }, Ordering::Relaxed);
        wanted
    }

    #[inline]
    fn dispatched(&self) {
        if self.lost.load(Ordering::Relaxed) != 0 {
            self.lost.store(0, Ordering::Relaxed);
        }
    }
}

/// A handle's hold on an endpoint whose service failed `poll_ready`: when it asks again.
struct Unready {
    retry: Pin<Box<tokio::time::Sleep>>,
    failures: u32,
}

/// The first wait after a readiness error, doubled after each one in a row, up to the cap.
const UNREADY_FIRST_RETRY: Duration = Duration::from_millis(100);
const UNREADY_MAX_RETRY: Duration = Duration::from_secs(30);

impl<C> Holder<C> {
    /// The inner service's `poll_ready` failed. A balancer given the error would drop the
    /// endpoint for good (p2c does), out of step with the layer, which would still count it as
    /// one to fall back on; so the handle keeps it, reports it not ready, tells the layer, and
    /// asks the service again after a back-off (a reconnecting service recovers; a dead one is
    /// asked every 30 s at most). `Pending` with the retry timer registered.
    #[cold]
    fn readiness_failed<E>(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        let failures = self
            .unready
            .as_ref()
            .map_or(0, |u| u.failures)
            .saturating_add(1);
        let wait = UNREADY_FIRST_RETRY
            .saturating_mul(1 << (failures - 1).min(16))
            .min(UNREADY_MAX_RETRY);
        if failures == 1 {
            tracing::warn!(
                target: "tower_outlier",
                error = std::any::type_name::<E>(),
                "an endpoint's service failed poll_ready: held out of the balancer's picks and asked again after a back-off"
            );
        }
        self.shared.record.set_unready(true);
        let mut retry = Box::pin(tokio::time::sleep(wait));
        // Registers the timer: woken when it is time to ask the service again.
        let _ = retry.as_mut().poll(cx);
        self.unready = Some(Box::new(Unready { retry, failures }));
        Poll::Pending
    }
}

impl<C> Clone for Holder<C> {
    fn clone(&self) -> Self {
        let lane = self.lane_or_new();
        lane.hold();
        let mut clone = Holder::new(self.shared.clone());
        clone.lane = OnceLock::from(lane.clone());
        clone.lane_use = LaneUse::Inherited;
        clone
    }
}

impl<C> Drop for Holder<C> {
    fn drop(&mut self) {
        self.shared.record.cancel_probes(self.permits);
        if self.unready.is_some() {
            // Its balancer dropped it (the endpoint was ejected or removed): nobody holds it out.
            self.shared.record.set_unready(false);
        }
        if let Some(lane) = self.lane.get() {
            lane.release();
        }
    }
}

/// A discovered service wrapped by the outlier-detection layer.
///
/// Every call is timed and, when its response future completes, classified and recorded in the
/// endpoint's shared [`EndpointRecord`] (lock-free). A response future dropped before completion
/// counts as cancelled: neither success nor failure.
///
/// `OutlierEndpoint` implements [`tower::load::Load`] with a peak-EWMA-style [`EndpointCost`]: the latency
/// estimate (a peak-sensitive moving average of the latencies it measures, decaying toward zero
/// while idle), times the requests in flight plus one, divided by the endpoint's relative weight.
///
/// Clones share the record, so all of them (and the copy the layer keeps for re-admission) count
/// the same calls.
///
#[cfg_attr(feature = "error-rate", doc = "```")]
#[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
/// use tower::{service_fn, Service, ServiceExt};
/// use tower::load::Load;
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
/// let mut endpoint = layer.endpoint(service_fn(|x: u32| async move {
///     Ok::<_, std::io::Error>(x + 1)
/// }));
/// assert_eq!(endpoint.ready().await?.call(1).await?, 2);
/// assert!(endpoint.load().value() > 0.0);
/// # Ok(()) }
/// ```
pub struct OutlierEndpoint<S, C> {
    inner: S,
    holder: Holder<C>,
}

impl<S, C> OutlierEndpoint<S, C> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<C>>) -> Self {
        OutlierEndpoint {
            inner,
            holder: Holder::new(shared),
        }
    }

    /// The endpoint's record: its policies' windows, latency estimate and weight.
    pub fn record(&self) -> &EndpointRecord {
        &self.holder.shared.record
    }

    /// Requests sent through this endpoint (or its clones) whose response futures are still alive.
    pub fn in_flight(&self) -> usize {
        self.holder.in_flight()
    }

    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, C> Clone for OutlierEndpoint<S, C> {
    fn clone(&self) -> Self {
        OutlierEndpoint {
            inner: self.inner.clone(),
            holder: self.holder.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for OutlierEndpoint<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutlierEndpoint")
            .field("inner", &self.inner)
            .field("record", self.record())
            .finish()
    }
}

impl<S, C, Req> Service<Req> for OutlierEndpoint<S, C>
where
    S: Service<Req>,
    C: ResponseClassifier<S::Response, S::Error>,
{
    type Response = C::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(unready) = self.holder.unready.as_mut() {
            std::task::ready!(unready.retry.as_mut().poll(cx));
        }
        match self.inner.poll_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(_)) => return self.holder.readiness_failed(cx),
            Poll::Ready(Ok(())) => {
                if self.holder.unready.take().is_some() {
                    tracing::info!(target: "tower_outlier", "an endpoint's service is ready again");
                    self.holder.shared.record.set_unready(false);
                }
            }
        }
        // Policies gate readiness only while one of them probes (a half-open breaker admits one
        // call and keeps the others waiting until that call decides).
        let holder = &mut self.holder;
        holder
            .shared
            .record
            .poll_admit(&mut holder.permits, cx)
            .map(Ok)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        self.holder.draws.dispatched();
        let start = self.record().clock().now();
        let probes = std::mem::take(&mut self.holder.permits);
        let lane = self.holder.lane();
        if Lane::in_flight(&lane) == 1 {
            // The first call in flight on this lane: it is waited for from now.
            lane.set_busy_since(start);
        }
        ResponseFuture::new(self.inner.call(request), lane, start, probes)
    }
}

/// The load of an [`OutlierEndpoint`]: (latency estimate + 1 µs) × (in-flight + 1) ÷ relative weight,
/// in nanoseconds — or zero while the endpoint needs calls to be judged.
///
/// Lower is better. The microsecond keeps requests in flight and weights meaningful between
/// endpoints whose measured latency rounds to zero (an in-process service, or tokio's paused
/// clock). A weight of zero makes the cost infinite, so such an endpoint never wins a
/// power-of-two-choices pair against one with a finite cost.
///
/// The latency estimate follows the endpoint's calls, with three rules of its own
/// ([`EndpointRecord`]): the first call after the endpoint joins or is re-admitted, which may set
/// up a connection, moves it as an average (not as a peak); a call that fails fast doubles it, up
/// to 16 times what it was before the failures began, so that failing fast never makes an endpoint
/// the cheapest pick; the first success after failures restores it.
///
/// A latency-driven balancer then starves an endpoint whose calls fail or time out. That is
/// deliberate (it is how p2c alone protects callers), but it would keep a policy that judges each
/// call from ever judging it, and one slow call from a healthy endpoint would shut it out for the
/// estimate's decay time. Two rules report a cost of zero instead (neither applies to an endpoint
/// whose weight a policy lowered on purpose):
/// * **Evidence.** While its last call failed fast (any failure but a timeout), a policy wants
///   more calls before it can judge (the rest of a streak of consecutive failures, or an error
///   rate above the threshold on fewer calls than the minimum), and the layer could eject it, the
///   endpoint wins until that many calls are in flight: exactly the failures the policy asks for,
///   no more. A policy that judges on a timer wants none. After a timeout nothing is wanted: each
///   call sent on purpose would cost a caller a timeout, and p2c avoids the endpoint on its own.
/// * **Exploration.** An endpoint with no call in flight whose estimate rests on one slow call
///   more than twice what it was, not yet confirmed by another, wins a draw after losing 16 in a
///   row. A genuinely slow endpoint's next call confirms it and ends the exploration, so it gets
///   no more traffic than p2c alone gives it (one call more each time p2c tries it again); a
///   healthy one's fast calls bring its estimate back down.
///
/// So reading the load counts a draw: it is meant for the balancer that holds this handle (p2c
/// reads both candidates of every draw). The count lives in the handle, not the shared record.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct EndpointCost(f64);

impl EndpointCost {
    /// The cost as a number.
    pub fn value(&self) -> f64 {
        self.0
    }
}

const COST_FLOOR_NANOS: f64 = 1_000.0;

impl<S, C> Load for OutlierEndpoint<S, C> {
    type Metric = EndpointCost;

    fn load(&self) -> EndpointCost {
        let record = self.record();
        let weight = record.weight();
        if weight <= 0.0 {
            return EndpointCost(f64::INFINITY);
        }
        let now = record.clock().now();
        let in_flight = self.in_flight();
        let draws = &self.holder.draws;
        if weight >= 1.0
            && (draws.wanted(record, now, in_flight as u64) > in_flight as u64
                || draws.explore(record, in_flight, now))
        {
            return EndpointCost(0.0);
        }
        let mut rtt = record.rtt_estimate(now);
        if in_flight > 0 {
            // Calls in flight count at their age so far: one that has waited far longer than
            // the estimate (a black hole, a hung call) says more of the endpoint than samples
            // from before it. Measured from when the calls began or the last call completed,
            // whichever is later (a busy endpoint completes calls all the time).
            rtt = rtt.max(self.holder.waiting(record, now) as f64);
        }
        let rtt = rtt + COST_FLOOR_NANOS;
        EndpointCost(rtt * (in_flight as f64 + 1.0) / weight)
    }
}

#[cfg(all(test, feature = "error-rate"))]
mod tests;
