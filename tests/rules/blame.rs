//! Blame where it belongs: an error that is the caller's own decision — its stack shedding
//! load, the layer's fail-fast guard — is not the endpoint's failure and never counts toward an
//! ejection (`Outcome::NotSent`), on tokio's paused clock through a real p2c `Balance`. It may
//! steer p2c away for a moment, as a busy endpoint should be.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use support::announce;
use tower::balance::p2c::Balance;
use tower::load_shed::error::Overloaded;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_outlier::events::Event;
use tower_outlier::fail_fast::NoEndpointAvailable;
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};

const TICK: Duration = Duration::from_millis(5);

/// The endpoint's own stack: not ready while `closed` (a connection pool used up, a local
/// concurrency limit reached), waking its waiter when opened; answers after 5 ms.
#[derive(Clone, Default)]
struct Gate {
    closed: Arc<AtomicBool>,
    waiter: Arc<Mutex<Option<Waker>>>,
    served: Arc<AtomicUsize>,
}

impl Gate {
    fn set_closed(&self, closed: bool) {
        self.closed.store(closed, Ordering::SeqCst);
        if !closed {
            if let Some(waker) = self.waiter.lock().unwrap().take() {
                waker.wake();
            }
        }
    }
}

impl Service<()> for Gate {
    type Response = ();
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<(), BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.closed.load(Ordering::SeqCst) {
            *self.waiter.lock().unwrap() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        self.served.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            tokio::time::sleep(TICK).await;
            Ok(())
        })
    }
}

fn recommended() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(DetectorPolicy::seeded(
        DetectorConfig::recommended().build().unwrap(),
        1,
    ))
}

/// Every ejection the layer reports, by key.
fn ejections(layer: &OutlierDetectionLayer) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    layer.monitor().on_event(move |event| {
        if let Event::Ejected { key, .. } = event {
            kept.lock().unwrap().push(key.as_str().to_owned());
        }
    });
    seen
}

#[tokio::test(start_paused = true)]
async fn a_load_shedding_endpoint_is_not_ejected_for_its_own_stack() {
    let layer = recommended();
    let ejected = ejections(&layer);
    let gates: Vec<Gate> = (0..3).map(|_| Gate::default()).collect();
    let services: Vec<_> = gates
        .iter()
        .enumerate()
        .map(|(key, gate)| (key, ServiceBuilder::new().load_shed().service(gate.clone())))
        .collect();
    let mut balancer = Balance::new(layer.layer(announce(&services)));
    // #0's stack sheds every call for 10 s, 200 calls a second.
    gates[0].set_closed(true);
    let (mut shed, mut other) = (0, 0);
    for _ in 0..2_000 {
        match balancer.ready().await.unwrap().call(()).await {
            Ok(()) => {}
            Err(error) if error.is::<Overloaded>() => shed += 1,
            Err(error) => {
                other += 1;
                eprintln!("{error}");
            }
        }
        tokio::time::sleep(TICK).await;
    }
    assert_eq!(other, 0);
    assert!(shed > 0, "p2c tried the shedding endpoint");
    assert!(
        ejected.lock().unwrap().is_empty(),
        "ejected for its own stack's refusals: {:?} after {shed} shed calls",
        ejected.lock().unwrap()
    );
    // Steered away meanwhile: a shed call doubles its estimate until a success restores it.
    assert!(shed < 200, "{shed} of 2 000 calls shed");
    // Open again: it gets its share back at once.
    gates[0].set_closed(false);
    let before = gates[0].served.load(Ordering::SeqCst);
    for _ in 0..400 {
        balancer.ready().await.unwrap().call(()).await.unwrap();
        tokio::time::sleep(TICK).await;
    }
    let served = gates[0].served.load(Ordering::SeqCst) - before;
    eprintln!("shed {shed} of 2 000 calls while closed; served {served} of 400 after");
    assert!(
        served >= 400 / 6,
        "{served} of 400 calls in the 2 s after it opened"
    );
}

/// An endpoint that is itself a balancer behind the layer's fail-fast guard (a tier of its
/// own): its `NoEndpointAvailable` is the inner layer's decision, not a failure of the outer
/// endpoint.
#[tokio::test(start_paused = true)]
async fn an_inner_fail_fast_guard_is_not_an_endpoint_failure() {
    let layer = recommended();
    let ejected = ejections(&layer);
    let inner = |failing: bool| {
        tower::util::BoxCloneSyncService::new(tower::service_fn(move |()| async move {
            if failing {
                Err::<(), BoxError>(Box::new(NoEndpointAvailable::new()))
            } else {
                Ok(())
            }
        }))
    };
    let services = vec![(0usize, inner(true)), (1, inner(false)), (2, inner(false))];
    let mut balancer = Balance::new(layer.layer(announce(&services)));
    let mut refused = 0;
    for _ in 0..600 {
        if let Err(error) = balancer.ready().await.unwrap().call(()).await {
            assert!(error.is::<NoEndpointAvailable>(), "{error}");
            refused += 1;
        }
        tokio::time::sleep(TICK).await;
    }
    assert!(refused > 0, "p2c tried the inner tier that fails fast");
    assert!(
        ejected.lock().unwrap().is_empty(),
        "{:?}",
        ejected.lock().unwrap()
    );
    let snapshot = layer.monitor().snapshot();
    let tier = snapshot
        .endpoints
        .iter()
        .find(|e| e.key.as_str() == "0")
        .unwrap();
    assert_eq!(tier.windows[0].counts.failures, 0, "{tier:#?}");
}
