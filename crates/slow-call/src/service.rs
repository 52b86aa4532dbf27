//! The standalone breaker service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_outlier_core::Clock;
use tower_service::Service;

use crate::breaker::{Admission, Breaker, State};
use crate::classify::BreakerClassifier;
use crate::error::BrokenCircuit;
use crate::future::ResponseFuture;
use crate::shared::{Lane, Shared};

/// Whose lane a handle's futures hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LaneUse {
    /// The lane of the handle it was cloned from (the layer's handle: the lane made with the
    /// breaker); no call yet. A clone already wrote that lane's counts, so a handle cloned per
    /// request (`clone().oneshot(..)`) gains nothing from a lane of its own: it calls once.
    Inherited,
    /// The inherited lane, through which it called once.
    InheritedCalled,
    /// Its own, made at its second admitted call (a rejected call holds nothing).
    Own,
}

/// A service guarded by a circuit breaker; built by
/// [`CircuitBreakerLayer`](crate::CircuitBreakerLayer).
///
/// Its error type is `tower::BoxError`: the inner service's errors, boxed, or
/// [`BrokenCircuit`] when the breaker rejected the call.
pub struct CircuitBreaker<S, C> {
    inner: S,
    // The handle reaches the shared state through its lane too: cloning a handle then writes one
    // reference count, as cloning the shared state did.
    lane: Arc<Lane<C>>,
    lane_use: LaneUse,
}

impl<S, C> CircuitBreaker<S, C> {
    pub(crate) fn new(inner: S, breaker: Breaker, classifier: C, clock: Clock) -> Self {
        CircuitBreaker {
            inner,
            lane: Lane::new(Arc::new(Shared::new(breaker, classifier, clock))),
            lane_use: LaneUse::Inherited,
        }
    }

    #[inline]
    fn shared(&self) -> &Shared<C> {
        self.lane.owner()
    }

    /// The lane this admitted call's response future holds: the inherited one on the handle's
    /// first call, its own from the second on.
    #[inline]
    fn lane(&mut self) -> Arc<Lane<C>> {
        if self.lane_use == LaneUse::Own {
            return self.lane.clone();
        }
        self.first_calls()
    }

    // Cold: a handle comes here on its first two calls only (a handle cloned per request, on
    // every request, where the clone itself costs more).
    #[cold]
    fn first_calls(&mut self) -> Arc<Lane<C>> {
        if self.lane_use == LaneUse::Inherited {
            self.lane_use = LaneUse::InheritedCalled;
        } else {
            self.lane = Lane::new(self.lane.owner().clone());
            self.lane_use = LaneUse::Own;
        }
        self.lane.clone()
    }

    /// The breaker's current state.
    pub fn state(&self) -> State {
        self.shared().breaker.state()
    }

    /// The breaker's statistics interval as it stands now.
    pub fn counts(&self) -> tower_outlier_core::WindowCounts {
        self.shared().breaker.counts(self.shared().clock.now())
    }

    /// The breaker itself.
    pub fn breaker(&self) -> &Breaker {
        &self.shared().breaker
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

/// Gives the probe slot back unless disarmed (the response future then holds the duty).
struct ProbeSlot<C> {
    shared: Option<Arc<Shared<C>>>,
}

impl<C> ProbeSlot<C> {
    fn disarm(mut self) {
        self.shared = None;
    }
}

impl<C> Drop for ProbeSlot<C> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.breaker.probe_cancelled(shared.clock.now());
        }
    }
}

impl<S: Clone, C> Clone for CircuitBreaker<S, C> {
    fn clone(&self) -> Self {
        CircuitBreaker {
            inner: self.inner.clone(),
            // The clone makes a lane of its own if it calls more than once.
            lane: self.lane.clone(),
            lane_use: LaneUse::Inherited,
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for CircuitBreaker<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("breaker", &self.shared().breaker)
            .finish()
    }
}

impl<S, C, Req> Service<Req> for CircuitBreaker<S, C>
where
    S: Service<Req>,
    S::Error: Into<tower_outlier_core::BoxError>,
    C: BreakerClassifier<S::Response, S::Error>,
{
    type Response = C::Response;
    type Error = tower_outlier_core::BoxError;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is the inner service's: an open breaker fails calls, it does not stall them.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        let shared = self.shared();
        let now = shared.clock.now();
        match shared.breaker.acquire(now) {
            Admission::Rejected => {
                ResponseFuture::rejected(BrokenCircuit::new(shared.breaker.state()))
            }
            admission => {
                // The probe slot is taken: should the inner service panic in `call`, the slot
                // goes back, or the breaker would stay HALF_OPEN with no probe to decide it.
                let slot = ProbeSlot {
                    shared: (admission == Admission::Probe).then(|| self.lane.owner().clone()),
                };
                let future = self.inner.call(request);
                slot.disarm();
                ResponseFuture::called(future, self.lane(), admission, now)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tower::{service_fn, Layer, Service};

    use crate::{BreakerConfig, CircuitBreakerLayer, State};

    #[derive(Clone, Copy)]
    enum Reply {
        Succeed,
        Fail,
        Hang,
    }

    fn layer() -> CircuitBreakerLayer {
        CircuitBreakerLayer::new(
            BreakerConfig::error_count(0)
                .min_calls(1)
                .open_duration(Duration::from_secs(10))
                .build()
                .unwrap(),
        )
    }

    async fn answer(reply: Reply) -> Result<(), std::io::Error> {
        match reply {
            Reply::Succeed => Ok(()),
            Reply::Fail => Err(std::io::ErrorKind::ConnectionReset.into()),
            Reply::Hang => std::future::pending().await,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn futures_hold_their_handle_s_own_lane_from_its_second_call() {
        let mut service = layer().layer(service_fn(answer));
        let inherited = service.lane.clone();
        let shared = service.lane.owner().clone();
        let lanes = || Arc::strong_count(&shared) - 1;
        let mut clone = service.clone();
        assert_eq!(Arc::strong_count(&inherited), 3, "handles share a lane");
        let first = service.call(Reply::Hang);
        assert_eq!(
            Arc::strong_count(&inherited),
            4,
            "a first call holds the inherited lane"
        );
        let more: Vec<_> = (0..3).map(|_| service.call(Reply::Hang)).collect();
        assert!(!Arc::ptr_eq(&service.lane, &inherited));
        assert_eq!(
            Arc::strong_count(&service.lane),
            4,
            "the handle and 3 calls"
        );
        assert_eq!(
            Arc::strong_count(&inherited),
            3,
            "the clone, the test, the first call"
        );
        assert_eq!(lanes(), 2, "futures hold lanes, not the shared state");
        assert_eq!(shared.lanes.live(), 2);
        let theirs: Vec<_> = (0..2).map(|_| clone.call(Reply::Hang)).collect();
        assert_eq!(lanes(), 3, "a clone makes a lane of its own");
        drop((first, more, theirs, service, clone));
        assert_eq!(Arc::strong_count(&inherited), 1);
        drop(inherited);
        assert_eq!(lanes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_holding_a_lane_decides_and_gives_back_its_permit() {
        let mut service = layer().layer(service_fn(answer));
        // The first call goes through the inherited lane and opens the breaker.
        assert!(service.call(Reply::Fail).await.is_err());
        assert_eq!(service.state(), State::Open);
        tokio::time::advance(Duration::from_secs(10)).await;
        // The second makes the lane: a probe dropped unfinished lets the next call probe.
        drop(service.call(Reply::Hang));
        assert_eq!(service.state(), State::Open);
        assert_eq!(service.lane_use, super::LaneUse::Own);
        let probe = service.call(Reply::Succeed);
        assert_eq!(service.state(), State::HalfOpen);
        assert!(
            service.call(Reply::Succeed).await.is_err(),
            "one probe at a time"
        );
        assert!(probe.await.is_ok());
        assert_eq!(service.state(), State::Closed);
    }
}
