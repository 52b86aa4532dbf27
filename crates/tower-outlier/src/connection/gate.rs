//! The gate: the readiness of an endpoint's handle from its [`ConnectionWatch`] — refused, it
//! fails `poll_ready` once with [`Disconnected`] and stays `Pending` while it reconnects with a
//! back-off; a connection that ended is replaced before the endpoint is picked again.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_outlier_core::Lock;
use tower_service::Service;

use super::{
    ConnectionWatch, State, ATTEMPT_TIMEOUT, FIRST_WAIT, GROWTH, JITTER, MAX_WAIT, REFUSED,
};

/// The error a [`WhileConnected`] service's `poll_ready` returns once when its endpoint's
/// connection is refused: the layer then holds the endpoint out of the balancer's picks until the
/// service is ready again (the gate stays `Pending` while it reconnects).
#[derive(Debug)]
pub struct Disconnected(());

impl fmt::Display for Disconnected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the endpoint's connection was refused; reconnecting with a back-off")
    }
}

impl std::error::Error for Disconnected {}

type Attempt = Pin<Box<dyn Future<Output = bool> + Send>>;
type StartAttempt = Arc<dyn Fn() -> Attempt + Send + Sync>;

/// The readiness of one handle on an endpoint, from its [`ConnectionWatch`]: what
/// [`WhileConnected`] and `PinnedClient` ask before anything else in `poll_ready`.
pub(crate) struct Gate {
    state: Arc<State>,
    start: StartAttempt,
    // The attempt in flight. In a lock only so that the handle stays `Sync`: it is reached
    // through `&mut self` (`Lock::get_mut`), never locked.
    attempt: Lock<Option<Attempt>>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    failed: u32,
    // Whether this handle told its owner (the layer) with `Disconnected` since it was refused.
    told: bool,
    // Whether this handle has been through an episode (an attempt, a wait, a report) since its
    // last reset: the fast path resets it once the endpoint is connected again.
    dirty: bool,
}

impl Gate {
    pub(crate) fn new<C>(watch: ConnectionWatch<C>, target: Uri) -> Self
    where
        C: Service<Uri> + Clone + Send + Sync + 'static,
        C::Future: Send,
        C::Response: Send,
    {
        let state = watch.state.clone();
        let start: StartAttempt = Arc::new(move || {
            let mut watch = watch.clone();
            let target = target.clone();
            let state = watch.state.clone();
            Box::pin(async move {
                let attempt = async {
                    futures::future::poll_fn(|cx| watch.poll_ready(cx))
                        .await
                        .ok()?;
                    // The connection is dropped (unwatched: its end says nothing of the server):
                    // the client opens its own when a call needs one.
                    watch
                        .call(target.clone())
                        .await
                        .ok()
                        .map(|io| drop(io.into_inner()))
                };
                match tokio::time::timeout(ATTEMPT_TIMEOUT, attempt).await {
                    Ok(Some(())) => true,
                    Ok(None) => {
                        // The connector's own failure marked it refused; its readiness error
                        // did not go through it.
                        state.refused();
                        false
                    }
                    Err(_) => {
                        // No answer within the attempt's time: as refused as a reset says (the
                        // attempt dropped counts itself failed).
                        state.refused();
                        false
                    }
                }
            })
        });
        Gate {
            state,
            start,
            attempt: Lock::new(None),
            wait: None,
            failed: 0,
            told: false,
            dirty: false,
        }
    }

    /// Ready while connected. While refused: an attempt to connect at once (a handle that has
    /// not tried yet), then `Err(Disconnected)` once if it fails, then `Pending` with the
    /// back-off's timer or the attempt registered, until an attempt (this handle's or another's)
    /// connects.
    #[inline]
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Disconnected>> {
        if self.state.bits() == 0 {
            if self.dirty {
                // An attempt, a wait or a report of an earlier episode: none of it holds now (a
                // half-run attempt kept would be trusted in the next episode).
                self.reset();
            }
            return Poll::Ready(Ok(()));
        }
        self.poll_suspect(cx)
    }

    /// Refused, or a connection ended: an attempt to connect decides (this handle's, or any
    /// connection made meanwhile).
    #[cold]
    fn poll_suspect(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Disconnected>> {
        self.dirty = true;
        loop {
            let slot = self.attempt.get_mut();
            if let Some(running) = slot.as_mut() {
                let connected = std::task::ready!(running.as_mut().poll(cx));
                *slot = None;
                if connected || self.state.bits() == 0 {
                    self.reset();
                    return Poll::Ready(Ok(()));
                }
                self.failed = self.failed.saturating_add(1);
                let wait = self.next_wait();
                self.wait = Some(Box::pin(tokio::time::sleep(wait)));
                if !self.told {
                    self.told = true;
                    return Poll::Ready(Err(Disconnected(())));
                }
                continue;
            }
            if let Some(wait) = self.wait.as_mut() {
                std::task::ready!(wait.as_mut().poll(cx));
                self.wait = None;
                if self.state.bits() == 0 {
                    self.reset();
                    return Poll::Ready(Ok(()));
                }
            }
            let attempt = (self.start)();
            *self.attempt.get_mut() = Some(attempt);
        }
    }

    fn next_wait(&self) -> Duration {
        let grown =
            FIRST_WAIT.as_secs_f64() * GROWTH.powi(self.failed.saturating_sub(1).min(16) as i32);
        let capped = grown.min(MAX_WAIT.as_secs_f64());
        let jitter = 1.0 + JITTER * (2.0 * self.state.dice.unit() - 1.0);
        Duration::from_secs_f64(capped * jitter)
    }

    fn reset(&mut self) {
        *self.attempt.get_mut() = None;
        self.wait = None;
        self.failed = 0;
        self.told = false;
        self.dirty = false;
    }
}

impl Clone for Gate {
    /// A fresh handle on the same endpoint: it tries to connect at once if the endpoint is
    /// refused (a probe's handle on an ejected endpoint finds out for itself).
    fn clone(&self) -> Self {
        Gate {
            state: self.state.clone(),
            start: self.start.clone(),
            attempt: Lock::new(None),
            wait: None,
            failed: 0,
            told: false,
            dirty: false,
        }
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("refused", &(self.state.bits() & REFUSED != 0))
            .field("failed_attempts", &self.failed)
            .finish_non_exhaustive()
    }
}

/// A service picked only while its endpoint is connected: see the [module](super). Made by
/// [`ConnectionWatch::gate`]. Its errors are boxed (its own [`Disconnected`] beside the
/// service's), as tower's middleware boxes them.
#[derive(Clone, Debug)]
pub struct WhileConnected<S> {
    pub(super) inner: S,
    pub(super) gate: Gate,
}

impl<S> WhileConnected<S> {
    /// The service inside.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, Req> Service<Req> for WhileConnected<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        std::task::ready!(self.gate.poll(cx))?;
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project! {
    /// The response of a [`WhileConnected`] service (or a `PinnedClient`), its error boxed.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F> ResponseFuture<F> {
    #[cfg(feature = "hyper-client")]
    pub(crate) fn new(inner: F) -> Self {
        ResponseFuture { inner }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map_err(Into::into)
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::ServiceExt;

    /// A connector that decides when called whether the server accepts, and answers 10 ms later.
    fn connector(
        up: Arc<AtomicBool>,
    ) -> impl Service<Uri, Response = (), Error = std::io::Error, Future: Send> + Clone + Send + Sync
    {
        tower::service_fn(move |_: Uri| {
            let accepts = up.load(Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if accepts {
                    Ok(())
                } else {
                    Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
                }
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_left_half_run_is_not_trusted_in_a_later_episode() {
        let up = Arc::new(AtomicBool::new(true));
        let watch = ConnectionWatch::new(connector(up.clone()));
        let target: Uri = "http://server/".parse().unwrap();
        let mut gate = Gate::new(watch.clone(), target.clone());
        // A connection ended: the gate starts an attempt (which would succeed) and waits on it.
        watch.state.closed();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(gate.poll(&mut cx).is_pending());
        // Another handle connects meanwhile: the gate is ready without its attempt.
        let connection = watch.clone().oneshot(target.clone()).await.unwrap();
        let () = connection.into_inner();
        assert!(matches!(gate.poll(&mut cx), Poll::Ready(Ok(()))));
        // The server is killed later and its connection closes: a fresh attempt decides, and it
        // is refused (the first attempt, had it been kept, would say it connected).
        up.store(false, Ordering::SeqCst);
        watch.state.closed();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let outcome = futures::future::poll_fn(|cx| gate.poll(cx)).await;
        assert!(outcome.is_err(), "a stale attempt was trusted");
        assert!(watch.is_refused());
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_times_out_marks_the_endpoint_refused() {
        let watch = ConnectionWatch::new(tower::service_fn(|_: Uri| {
            futures::future::pending::<Result<(), std::io::Error>>()
        }));
        let mut gate = Gate::new(watch.clone(), "http://server/".parse().unwrap());
        watch.state.closed();
        let outcome = futures::future::poll_fn(|cx| gate.poll(cx)).await;
        assert!(outcome.is_err());
        assert!(watch.is_refused());
    }
}
