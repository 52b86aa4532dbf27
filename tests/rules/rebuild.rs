//! Fresh services on return (`OutlierDetectionLayer::rebuild_on_return`), on tokio's paused clock
//! through a real p2c `Balance`: an endpoint ejected after transport failures or timeouts comes
//! back as a service made anew (its probe runs on it too); one ejected for server errors comes
//! back as a clone; a rebuild that panics keeps the service.

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::{Service, ServiceExt};
use tower_outlier::probe::probe_fn;
use tower_outlier::rebuild::rebuild_fn;
use tower_outlier::{
    DetectorConfig, DetectorPolicy, EndpointStatus, OutlierDetectionLayer, ServerErrors,
};

use crate::support::SeededRng;

/// What a service of the fleet does, shared by every service made for its key.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    /// A refused connection: a transport failure.
    Refused,
    /// A 500: a server error.
    ServerError,
}

/// One service made for a key: answers with its generation (0 for the first one made).
#[derive(Clone)]
struct Made {
    generation: usize,
    fault: Arc<Mutex<Fault>>,
}

impl Service<()> for Made {
    type Response = http::Response<usize>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<http::Response<usize>, io::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ()) -> Self::Future {
        std::future::ready(match *self.fault.lock().unwrap() {
            Fault::None => Ok(http::Response::new(self.generation)),
            Fault::Refused => Err(io::ErrorKind::ConnectionRefused.into()),
            Fault::ServerError => Ok(http::Response::builder()
                .status(500)
                .body(self.generation)
                .unwrap()),
        })
    }
}

/// Three keys; key 0's fault is switchable. The factory counts what it made.
struct Fleet {
    fault: Arc<Mutex<Fault>>,
    made: Arc<AtomicUsize>,
}

impl Fleet {
    fn new() -> Self {
        Fleet {
            fault: Arc::new(Mutex::new(Fault::None)),
            made: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn first(&self, key: usize) -> Made {
        Made {
            generation: 0,
            fault: if key == 0 {
                self.fault.clone()
            } else {
                Arc::new(Mutex::new(Fault::None))
            },
        }
    }

    /// The factory: a new generation for key 0 (healthy once the fault is lifted, as a new
    /// connection to a restarted server is).
    fn factory(&self) -> impl Fn(&usize) -> Made + Clone + Send + Sync + 'static {
        let (fault, made) = (self.fault.clone(), self.made.clone());
        move |key: &usize| {
            assert_eq!(*key, 0, "only the failing endpoint is rebuilt");
            Made {
                generation: made.fetch_add(1, Ordering::SeqCst) + 1,
                fault: fault.clone(),
            }
        }
    }
}

fn layer() -> OutlierDetectionLayer<ServerErrors> {
    OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(ServerErrors)
}

/// Serial calls, one every 10 ms, for `span`; the generations key 0 answered with.
async fn traffic<B>(balancer: &mut B, span: Duration) -> Vec<usize>
where
    B: Service<(), Response = http::Response<usize>, Error = tower::BoxError>,
{
    let mut generations = Vec::new();
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        if let Ok(response) = balancer.ready().await.unwrap().call(()).await {
            generations.push(*response.body());
        }
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    generations
}

fn upstream(
    fleet: &Fleet,
) -> futures::channel::mpsc::UnboundedReceiver<Result<Change<usize, Made>, Infallible>> {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for key in 0..3 {
        tx.unbounded_send(Ok(Change::Insert(key, fleet.first(key))))
            .unwrap();
    }
    std::mem::forget(tx);
    rx
}

/// Runs `fault` on key 0 until it is ejected, lifts it, and runs 10 s more: the generations key 0
/// answered with after the fault.
async fn eject_and_return<B>(
    balancer: &mut B,
    fleet: &Fleet,
    monitor: &tower_outlier::Monitor,
    fault: Fault,
) -> Vec<usize>
where
    B: Service<(), Response = http::Response<usize>, Error = tower::BoxError>,
{
    traffic(balancer, Duration::from_secs(1)).await;
    *fleet.fault.lock().unwrap() = fault;
    let mut waited = 0;
    while monitor.snapshot().get("0").unwrap().status != EndpointStatus::Ejected {
        traffic(balancer, Duration::from_millis(10)).await;
        waited += 1;
        assert!(waited < 1000, "never ejected");
    }
    *fleet.fault.lock().unwrap() = Fault::None;
    traffic(balancer, Duration::from_secs(10)).await
}

#[tokio::test(start_paused = true)]
async fn after_transport_failures_the_endpoint_returns_as_a_new_service() {
    let fleet = Fleet::new();
    let layer = layer().rebuild_on_return(rebuild_fn(fleet.factory()));
    let monitor = layer.monitor();
    let mut balancer =
        Balance::from_rng(tower::Layer::layer(&layer, upstream(&fleet)), SeededRng(5));
    let generations = eject_and_return(&mut balancer, &fleet, &monitor, Fault::Refused).await;
    assert_eq!(
        fleet.made.load(Ordering::SeqCst),
        1,
        "one rebuild per ejection"
    );
    assert!(
        generations.iter().filter(|&&g| g == 1).count() > 100,
        "the new service served {} calls",
        generations.iter().filter(|&&g| g == 1).count()
    );
}

#[tokio::test(start_paused = true)]
async fn after_server_errors_the_endpoint_returns_as_a_clone() {
    let fleet = Fleet::new();
    let layer = layer().rebuild_on_return(rebuild_fn(fleet.factory()));
    let monitor = layer.monitor();
    let mut balancer =
        Balance::from_rng(tower::Layer::layer(&layer, upstream(&fleet)), SeededRng(5));
    eject_and_return(&mut balancer, &fleet, &monitor, Fault::ServerError).await;
    assert_eq!(fleet.made.load(Ordering::SeqCst), 0, "rebuilt after 500s");
}

#[tokio::test(start_paused = true)]
async fn the_probe_runs_on_the_rebuilt_service() {
    let fleet = Fleet::new();
    let probed = Arc::new(Mutex::new(Vec::new()));
    let seen = probed.clone();
    let layer = layer()
        .probe(probe_fn(move |_: &usize, mut service: Made| {
            let seen = seen.clone();
            Box::pin(async move {
                seen.lock().unwrap().push(service.generation);
                service
                    .call(())
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }) as tower_outlier::probe::ProbeFuture
        }))
        .rebuild_on_return(rebuild_fn(fleet.factory()));
    let monitor = layer.monitor();
    let mut balancer =
        Balance::from_rng(tower::Layer::layer(&layer, upstream(&fleet)), SeededRng(5));
    eject_and_return(&mut balancer, &fleet, &monitor, Fault::Refused).await;
    assert_eq!(*probed.lock().unwrap(), vec![1], "the probe's service");
}

#[tokio::test(start_paused = true)]
async fn a_rebuild_that_panics_keeps_the_service() {
    let fleet = Fleet::new();
    let calls = Arc::new(AtomicBool::new(false));
    let called = calls.clone();
    let layer = layer().rebuild_on_return(rebuild_fn(move |_: &usize| -> Made {
        called.store(true, Ordering::SeqCst);
        panic!("no connection to be had")
    }));
    let monitor = layer.monitor();
    let mut balancer =
        Balance::from_rng(tower::Layer::layer(&layer, upstream(&fleet)), SeededRng(5));
    let generations = eject_and_return(&mut balancer, &fleet, &monitor, Fault::Refused).await;
    assert!(calls.load(Ordering::SeqCst), "the rebuild was not asked");
    assert!(
        generations.iter().filter(|&&g| g == 0).count() > 100,
        "the kept service served {} calls after the panic",
        generations.len()
    );
    let status = monitor.snapshot().get("0").unwrap().status;
    assert!(
        matches!(status, EndpointStatus::Available | EndpointStatus::Trial),
        "{status:?}"
    );
}

/// In dry run the endpoint never leaves the balancer's set, so nothing is rebuilt: no factory
/// runs for what dry run only reports, its probe included (before, the check of a dry-run
/// ejection made a new service).
#[tokio::test(start_paused = true)]
async fn dry_run_makes_no_new_service() {
    let fleet = Fleet::new();
    let probed = Arc::new(Mutex::new(Vec::new()));
    let seen = probed.clone();
    let layer = layer()
        .probe(probe_fn(move |_: &usize, service: Made| {
            seen.lock().unwrap().push(service.generation);
            Box::pin(std::future::ready(true)) as tower_outlier::probe::ProbeFuture
        }))
        .rebuild_on_return(rebuild_fn(fleet.factory()));
    layer.rules().set_dry_run(true);
    let monitor = layer.monitor();
    let mut balancer =
        Balance::from_rng(tower::Layer::layer(&layer, upstream(&fleet)), SeededRng(5));
    traffic(&mut balancer, Duration::from_secs(1)).await;
    *fleet.fault.lock().unwrap() = Fault::Refused;
    let mut waited = 0;
    while monitor.snapshot().get("0").unwrap().would_be != Some(EndpointStatus::Ejected) {
        traffic(&mut balancer, Duration::from_millis(10)).await;
        waited += 1;
        assert!(waited < 1000, "dry run never reported the ejection");
    }
    *fleet.fault.lock().unwrap() = Fault::None;
    traffic(&mut balancer, Duration::from_secs(60)).await;
    assert!(
        !probed.lock().unwrap().is_empty(),
        "dry run's recovery check never ran"
    );
    assert_eq!(
        fleet.made.load(Ordering::SeqCst),
        0,
        "dry run made a new service"
    );
}
