//! Blame where it belongs, on real sockets: three hyper servers on loopback, each endpoint's own
//! stack limited to one request at a time and shedding the rest (`load_shed` over
//! `concurrency_limit(1)` over a `PinnedClient`), 16 concurrent callers (on one task) through `Buffer` and p2c.
//! The stacks shed all the time; the servers never fail. No endpoint is ejected for its own
//! stack's `Overloaded` (before, the recommended configuration ejected two of the three and kept
//! the last only by its rule).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::Change;
use tower::load_shed::error::Overloaded;
use tower::{BoxError, Layer, ServiceBuilder, ServiceExt};
use tower_outlier::events::Event;
use tower_outlier::hyper_client::PinnedClient;
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer, ServerErrors};

/// A server answering 200 after 2 ms.
async fn server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_: http::Request<Incoming>| async {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    Ok::<_, Infallible>(http::Response::new(Full::<Bytes>::from("ok")))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_whose_own_stacks_shed_load_are_not_ejected() {
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(ServerErrors);
    let ejected = Arc::new(Mutex::new(Vec::new()));
    let seen = ejected.clone();
    layer.monitor().on_event(move |event| {
        if let Event::Ejected { key, .. } = event {
            seen.lock().unwrap().push(key.as_str().to_owned());
        }
    });
    let (tx, rx) = futures::channel::mpsc::unbounded();
    for key in 0..3usize {
        let stack = ServiceBuilder::new()
            .load_shed()
            .concurrency_limit(1)
            .service(PinnedClient::<Empty<Bytes>>::new(server().await));
        tx.unbounded_send(Ok::<_, Infallible>(Change::Insert(key, stack)))
            .unwrap();
    }
    let balancer = Buffer::new(Balance::new(layer.layer(rx)), 64);
    let callers = (0..16).map(|_| {
        let balancer = balancer.clone();
        async move {
            let (mut ok, mut shed) = (0, 0);
            let started = tokio::time::Instant::now();
            while started.elapsed() < Duration::from_secs(2) {
                let request = http::Request::get("/").body(Empty::new()).unwrap();
                let result: Result<_, BoxError> = balancer.clone().oneshot(request).await;
                match result {
                    Ok(response) => {
                        assert_eq!(response.status(), 200);
                        response.into_body().collect().await.unwrap();
                        ok += 1;
                    }
                    Err(error) if error.is::<Overloaded>() => {
                        shed += 1;
                        // A caller backs off a little before retrying, as one should.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(error) => panic!("only the stacks' own refusals: {error}"),
                }
            }
            (ok, shed)
        }
    });
    let (mut ok, mut shed) = (0, 0);
    for caller in futures::future::join_all(callers).await {
        let (o, s) = caller;
        ok += o;
        shed += s;
    }
    eprintln!("{ok} answered, {shed} shed by the endpoints' own stacks");
    assert!(
        shed > 0,
        "16 callers on three stacks of one slot each shed some"
    );
    assert!(ok > 100, "{ok} answered");
    assert!(
        ejected.lock().unwrap().is_empty(),
        "ejected for their own stacks' refusals: {:?}",
        ejected.lock().unwrap()
    );
    drop(tx);
}
