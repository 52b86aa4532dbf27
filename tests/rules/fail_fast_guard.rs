//! The fail-fast guard (`OutlierDetectionLayer::fail_fast`) fails a call only when the rules left
//! the balancer nothing to call, on tokio's paused clock through a real p2c `Balance`: it does not
//! hang behind a buffer, its count of adaptors with every endpoint out is released when a
//! balancer is dropped, an upstream with no endpoint at all is waited for, a new endpoint still
//! connecting is waited for, and a guard shared by two balancers has its documented limit.

use crate::support;

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::Backend;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_outlier::fail_fast::NoEndpointAvailable;

use crate::all_out::linkerd;

const SECOND: Duration = Duration::from_secs(1);

type Tx = futures::channel::mpsc::UnboundedSender<Result<Change<usize, Backend>, Infallible>>;
type Rx = futures::channel::mpsc::UnboundedReceiver<Result<Change<usize, Backend>, Infallible>>;

fn upstream(backends: &[Backend]) -> (Tx, Rx) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for (id, backend) in backends.iter().enumerate() {
        tx.unbounded_send(Ok(Change::Insert(id, backend.clone())))
            .unwrap();
    }
    (tx, rx)
}

#[tokio::test(start_paused = true)]
async fn fail_fast_behind_buffer() {
    let layer = linkerd();
    let backends: Vec<Backend> = (0..2).map(Backend::new).collect();
    for b in &backends {
        b.set_failing(true);
    }
    let (_tx, rx) = upstream(&backends);
    let mut svc = ServiceBuilder::new()
        .buffer(8)
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let mut calls = 0;
    while layer.monitor().snapshot().ejected() < 2 {
        let _ = svc.ready().await.unwrap().call(()).await;
        calls += 1;
        assert!(calls < 100);
    }
    let r = tokio::time::timeout(SECOND, async { svc.ready().await?.call(()).await }).await;
    let e = r.expect("hung behind buffer").unwrap_err();
    assert!(
        e.is::<NoEndpointAvailable>() || e.to_string().contains("no endpoint"),
        "{e}"
    );
    for b in &backends {
        b.set_failing(false);
    }
    tokio::time::advance(11 * SECOND).await;
    let r = tokio::time::timeout(SECOND, async { svc.ready().await?.call(()).await }).await;
    assert!(matches!(r, Ok(Ok(_))), "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn fail_fast_counter_released_when_balancer_dropped() {
    let layer = linkerd();
    let backends: Vec<Backend> = (0..2).map(Backend::new).collect();
    for b in &backends {
        b.set_failing(true);
    }
    let (_tx, rx) = upstream(&backends);
    let mut svc = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let mut calls = 0;
    while layer.monitor().snapshot().ejected() < 2 {
        let _ = svc.ready().await.unwrap().call(()).await;
        calls += 1;
        assert!(calls < 100);
    }
    let e: BoxError = svc.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(e.is::<NoEndpointAvailable>());
    drop(svc);
    // A new balancer on the same layer, its upstream announcing an endpoint only after 1 s: it
    // must wait, not fail fast.
    let (tx, rx) = upstream(&[]);
    let mut svc = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let b = Backend::new(9);
    tokio::spawn(async move {
        tokio::time::sleep(SECOND).await;
        tx.unbounded_send(Ok(Change::Insert(9, b))).unwrap();
        std::mem::forget(tx);
    });
    let r = svc.ready().await.unwrap().call(()).await;
    assert!(
        r.is_ok(),
        "failed although the adaptor that had none is gone: {r:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn fail_fast_when_upstream_removes_every_ejected_endpoint() {
    let layer = linkerd();
    let backends: Vec<Backend> = (0..2).map(Backend::new).collect();
    for b in &backends {
        b.set_failing(true);
    }
    let (tx, rx) = upstream(&backends);
    let mut svc = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let mut calls = 0;
    while layer.monitor().snapshot().ejected() < 2 {
        let _ = svc.ready().await.unwrap().call(()).await;
        calls += 1;
        assert!(calls < 100);
    }
    tx.unbounded_send(Ok(Change::Remove(0))).unwrap();
    tx.unbounded_send(Ok(Change::Remove(1))).unwrap();
    // An upstream with no endpoint at all is the upstream's state, not the rules': the guard
    // waits with the balancer (as gRPC queues picks while it has no address yet), and a first
    // endpoint is served.
    let r = tokio::time::timeout(5 * SECOND, async { svc.ready().await?.call(()).await }).await;
    assert!(r.is_err(), "an empty upstream is waited for: {r:?}");
    let healthy = Backend::new(7);
    tx.unbounded_send(Ok(Change::Insert(7, healthy))).unwrap();
    let served = svc.ready().await.unwrap().call(()).await;
    assert!(served.is_ok(), "{served:?}");
}

/// A layer shared by two balancers: while one has every endpoint out, the guard of the other
/// fails its calls whenever that one is only busy (the documented limit of a guard per layer:
/// build one layer per balancer, as a `ServiceBuilder` stack does).
#[tokio::test(start_paused = true)]
async fn fail_fast_shared_layer_other_balancer_busy() {
    let layer = linkerd();
    let bad: Vec<Backend> = (0..1).map(Backend::new).collect();
    bad[0].set_failing(true);
    let (_tx, rx) = upstream(&bad);
    let mut a = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    for _ in 0..5 {
        let _ = a.ready().await.unwrap().call(()).await;
    }
    let e = a.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(e.is::<NoEndpointAvailable>());
    // Balancer b has one healthy endpoint behind a concurrency limit of 1 with a call in flight.
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let slow = support::Sleepy::new(5, 100);
    tx.unbounded_send(Ok::<_, Infallible>(Change::Insert(
        5usize,
        tower::limit::ConcurrencyLimit::new(slow, 1),
    )))
    .unwrap();
    std::mem::forget(tx);
    let mut b = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    let first = b.ready().await.unwrap().call(());
    let second = async { b.ready().await?.call(()).await };
    let (r1, r2) = futures::join!(first, second);
    assert!(r1.is_ok(), "{r1:?}");
    assert!(
        r2.is_err_and(|e| e.is::<NoEndpointAvailable>()),
        "the documented limit of a guard shared by two balancers"
    );
}

/// A service that is not ready until `at` (a connection being set up).
#[derive(Clone)]
struct Connecting {
    at: tokio::time::Instant,
    sleep: Arc<Mutex<Option<std::pin::Pin<Box<tokio::time::Sleep>>>>>,
    inner: Backend,
}

impl Service<()> for Connecting {
    type Response = usize;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<usize, std::io::Error>>;
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::io::Error>> {
        if tokio::time::Instant::now() >= self.at {
            return self.inner.poll_ready(cx);
        }
        let mut sleep = self.sleep.lock().unwrap();
        let s = sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(self.at)));
        match s.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => self.inner.poll_ready(cx),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
    fn call(&mut self, r: ()) -> Self::Future {
        self.inner.call(r)
    }
}

#[tokio::test(start_paused = true)]
async fn fail_fast_waits_for_a_new_endpoint_that_is_connecting() {
    let layer = linkerd();
    let (tx, rx) =
        futures::channel::mpsc::unbounded::<Result<Change<usize, Connecting>, Infallible>>();
    let now = tokio::time::Instant::now();
    let b0 = Backend::new(0);
    b0.set_failing(true);
    tx.unbounded_send(Ok(Change::Insert(
        0,
        Connecting {
            at: now,
            sleep: Arc::default(),
            inner: b0,
        },
    )))
    .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer.fail_fast())
        .layer_fn(Balance::new)
        .layer(layer.clone())
        .service(rx);
    for _ in 0..5 {
        let _ = svc.ready().await.unwrap().call(()).await;
    }
    assert_eq!(layer.monitor().snapshot().ejected(), 1);
    let e = svc.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(e.is::<NoEndpointAvailable>());
    tx.unbounded_send(Ok(Change::Insert(
        1,
        Connecting {
            at: now + SECOND,
            sleep: Arc::default(),
            inner: Backend::new(1),
        },
    )))
    .unwrap();
    let r = svc.ready().await.unwrap().call(()).await;
    assert!(
        r.is_ok(),
        "failed fast while a new endpoint was connecting: {r:?}"
    );
}
