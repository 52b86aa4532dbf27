//! The endpoint service: wraps one discovered service, records its outcomes and reports its load.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tower_outlier_core::{EndpointRecord, Nanos, ProbePermits};
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::response::ResponseClassifier;
use crate::shared::{Lane, Shared};

/// One handle's hold on the record; it also carries the probe permits this handle was granted
/// by `poll_ready` for its next call, and gives them back if it is dropped first (a balancer
/// evicting a ready endpoint).
struct Holder {
    shared: Arc<Shared>,
    // Set while the inner service's `poll_ready` failed and this handle holds the endpoint out
    // of its balancer's picks, retrying after a back-off.
    unready: Option<Box<Unready>>,
    // Set through `&self` too: cloning a handle that has no lane yet gives it one, for the clone
    // to inherit.
    lane: OnceLock<Arc<Lane>>,
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

impl Holder {
    fn new(shared: Arc<Shared>) -> Self {
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
    fn lane(&mut self) -> Arc<Lane> {
        match (self.lane.get(), self.lane_use) {
            (Some(lane), LaneUse::Own) => lane.clone(),
            _ => self.early_lane(),
        }
    }

    /// This handle's lane, made now if it has none.
    fn lane_or_new(&self) -> &Arc<Lane> {
        self.lane.get_or_init(|| Lane::new(self.shared.clone()))
    }

    // Cold: a handle comes here on its first two calls only.
    #[cold]
    fn early_lane(&mut self) -> Arc<Lane> {
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
            Some(lane) if self.shared.live_lanes() == 1 => Lane::in_flight(lane),
            None if self.shared.live_lanes() == 0 => 0,
            _ => self.shared.in_flight(),
        }
    }
}

impl Clone for Holder {
    fn clone(&self) -> Self {
        let lane = self.lane_or_new();
        lane.hold();
        let mut clone = Holder::new(self.shared.clone());
        clone.lane = OnceLock::from(lane.clone());
        clone.lane_use = LaneUse::Inherited;
        clone
    }
}

impl Drop for Holder {
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
/// Clones share the record, so all of them (and the handles the layer makes on re-admission)
/// count the same calls. Each holds a copy of the layer's classifier.
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
    holder: Holder,
    classifier: C,
}

/// What a handle for the balancer is made of, as the engine hands it out: the layer adds its
/// classifier ([`EndpointParts::classified`]), so the engine does not depend on its type.
pub(crate) struct EndpointParts<S> {
    service: S,
    shared: Arc<Shared>,
}

impl<S> EndpointParts<S> {
    pub(crate) fn new(service: S, shared: Arc<Shared>) -> Self {
        EndpointParts { service, shared }
    }

    /// The handle, classifying with `classifier`.
    pub(crate) fn classified<C>(self, classifier: C) -> OutlierEndpoint<S, C> {
        OutlierEndpoint::new(self.service, self.shared, classifier)
    }
}

impl<S, C> OutlierEndpoint<S, C> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, classifier: C) -> Self {
        OutlierEndpoint {
            inner,
            holder: Holder::new(shared),
            classifier,
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

impl<S: Clone, C: Clone> Clone for OutlierEndpoint<S, C> {
    fn clone(&self) -> Self {
        OutlierEndpoint {
            inner: self.inner.clone(),
            holder: self.holder.clone(),
            classifier: self.classifier.clone(),
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
    C: ResponseClassifier<S::Response, S::Error> + Clone,
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
        // User code, cloned before the permits are taken: a clone that panics loses none.
        let classifier = self.classifier.clone();
        self.holder.draws.dispatched();
        let start = self.record().clock().now();
        let probes = std::mem::take(&mut self.holder.permits);
        let lane = self.holder.lane();
        if Lane::in_flight(&lane) == 1 {
            // The first call in flight on this lane: it is waited for from now.
            lane.set_busy_since(start);
        }
        ResponseFuture::new(self.inner.call(request), lane, classifier, start, probes)
    }
}

mod cost;
pub use cost::EndpointCost;
use cost::*;

mod unready;
use unready::*;

#[cfg(all(test, feature = "error-rate"))]
mod tests;
