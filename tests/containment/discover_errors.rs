//! An error from the discover stream, on loopback: two hyper servers discovered through a
//! channel, then one `Err` from the channel, behind the README's stack (the layer, p2c, a
//! buffer). Passed through (the default, as tower's adaptors do), it takes the whole stack down:
//! every later call fails. With `DiscoverErrors::KeepServing` the calls go on to the endpoints
//! discovered so far, the error is counted in the monitor, and endpoints discovered after it are
//! served too.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::future::BoxFuture;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::timeout::Timeout;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, DiscoverErrors, OutlierDetectionLayer, ServerErrors,
};

/// A server on 127.0.0.1 answering 200 and counting what it answers.
async fn server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_: http::Request<Incoming>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<_, Infallible>(http::Response::new(Empty::<Bytes>::new())) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, requests)
}

/// A hyper-util client pinned to one server.
#[derive(Clone)]
struct Upstream {
    addr: SocketAddr,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Service<http::Request<Empty<Bytes>>> for Upstream {
    type Response = http::Response<Incoming>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<Empty<Bytes>>) -> Self::Future {
        *request.uri_mut() = format!("http://{}/", self.addr).parse().unwrap();
        let client = self.client.clone();
        Box::pin(async move { client.request(request).await.map_err(BoxError::from) })
    }
}

type Endpoint = Timeout<Upstream>;
type Sender = mpsc::UnboundedSender<Result<Change<SocketAddr, Endpoint>, std::io::Error>>;

fn insert(tx: &Sender, client: &Client<HttpConnector, Empty<Bytes>>, addr: SocketAddr) {
    let upstream = Upstream {
        addr,
        client: client.clone(),
    };
    tx.unbounded_send(Ok(Change::Insert(
        addr,
        Timeout::new(upstream, Duration::from_secs(1)),
    )))
    .unwrap();
}

/// Builds the stack over a channel holding two servers then an error; returns what the calls
/// after the error got (`Ok` status or the error's text), the third server's share of calls
/// sent after it was discovered, and the monitor's count of errors served through.
async fn after_an_error(choice: DiscoverErrors) -> (Vec<Result<u16, String>>, usize, u64) {
    let (a, _) = server().await;
    let (b, _) = server().await;
    let (c, c_requests) = server().await;
    let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let (tx, rx) = mpsc::unbounded();
    insert(&tx, &client, a);
    insert(&tx, &client, b);
    tx.unbounded_send(Err(std::io::Error::other("the resolver is unreachable")))
        .unwrap();
    let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(ServerErrors)
    .discover_errors(choice);
    let monitor = outliers.monitor();
    let balancer = ServiceBuilder::new()
        .buffer(64)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(rx);
    let call = || {
        let balancer = balancer.clone();
        tokio::spawn(tokio::time::timeout(
            Duration::from_secs(5),
            balancer.oneshot(http::Request::get("/").body(Empty::new()).unwrap()),
        ))
    };
    let mut results = Vec::new();
    for _ in 0..20 {
        let result = match call().await.unwrap() {
            Ok(Ok(response)) => Ok(response.status().as_u16()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("no answer within 5 s".into()),
        };
        results.push(result);
    }
    // The stream is read on after the error (or not): a server discovered now.
    let sent_to_c = if tx.is_closed() {
        0
    } else {
        insert(&tx, &client, c);
        // The upstream is read again once the error's back-off (100 ms) is over.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..60 {
            let _ = call().await;
        }
        c_requests.load(Ordering::SeqCst)
    };
    (results, sent_to_c, monitor.snapshot().discover_errors)
}

#[tokio::test]
async fn an_error_passed_through_fails_every_later_call() {
    let (results, _, counted) = after_an_error(DiscoverErrors::PassThrough).await;
    assert!(
        results.iter().all(Result::is_err),
        "tower's Balance fails once its discover stream has: {results:?}"
    );
    assert_eq!(counted, 0, "an error passed on is the balancer's to report");
}

#[tokio::test]
async fn keep_serving_serves_the_endpoints_discovered_so_far_and_later() {
    let (results, sent_to_c, counted) = after_an_error(DiscoverErrors::KeepServing).await;
    assert!(
        results.iter().all(|r| *r == Ok(200)),
        "every call after the error is answered: {results:?}"
    );
    assert_eq!(counted, 1, "the error is counted in the monitor");
    assert!(
        sent_to_c > 0,
        "a server discovered after the error gets traffic"
    );
}

/// An upstream that fails on every poll (a resolver that cannot reach its registry) is read
/// again only after a back-off (100 ms doubling to 5 s), not in a loop: on tokio's paused clock,
/// a minute of serving reads it a few dozen times, and the endpoints it gave first keep serving.
#[tokio::test(start_paused = true)]
async fn an_upstream_failing_on_every_poll_is_read_with_a_back_off() {
    use std::pin::Pin;
    use std::sync::atomic::AtomicU64;
    use std::task::Context;

    /// Two endpoints, then an error on every poll.
    struct Failing {
        given: usize,
        polls: Arc<AtomicU64>,
    }

    impl futures::Stream for Failing {
        type Item = Result<Change<usize, tower::util::ServiceFn<Answer>>, std::io::Error>;

        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.given < 2 {
                self.given += 1;
                let id = self.given;
                return Poll::Ready(Some(Ok(Change::Insert(id, tower::service_fn(answer)))));
            }
            Poll::Ready(Some(Err(std::io::Error::other("unreachable registry"))))
        }
    }

    type Answer = fn(()) -> std::future::Ready<Result<usize, std::io::Error>>;
    fn answer(_: ()) -> std::future::Ready<Result<usize, std::io::Error>> {
        std::future::ready(Ok(7))
    }

    let polls = Arc::new(AtomicU64::new(0));
    let upstream = Failing {
        given: 0,
        polls: polls.clone(),
    };
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .discover_errors(DiscoverErrors::KeepServing);
    let monitor = layer.monitor();
    let discover = tower::Layer::layer(&layer, upstream);
    let balancer = tower::buffer::Buffer::new(Balance::new(discover), 16);
    for _ in 0..60 {
        let answered = balancer.clone().oneshot(()).await.unwrap();
        assert_eq!(answered, 7);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let read = polls.load(Ordering::SeqCst);
    assert!(
        (5..=40).contains(&read),
        "the failing upstream was read {read} times in a minute"
    );
    assert_eq!(monitor.snapshot().discover_errors, read - 2);
}
