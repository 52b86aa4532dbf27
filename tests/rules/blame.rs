//! Blame where it belongs: an error that is the caller's own decision — its stack shedding
//! load, the layer's fail-fast guard, its own h2 closing the connection (a GOAWAY raised by the
//! client's library) — is not the endpoint's failure and does not count toward
//! an ejection (`Outcome::NotSent`), on tokio's paused clock through a real p2c `Balance`. It
//! steers p2c away for a moment, as a busy endpoint should be; a stack that refuses every call
//! for 2 s with no success between is stuck, not busy, and its refusals count.

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

/// The case load shedding is for: each endpoint's stack takes one call at a time
/// (`load_shed().concurrency_limit(1)`, 5 ms a call) and open-loop traffic at 555 calls a second
/// over three of them keeps finding one busy. Its refusals are its own stack's, between the
/// calls it serves: no endpoint is ejected for them, and the 2 s a stuck stack is given never
/// runs out (on real sockets, where the same stacks did eject endpoints before, see
/// `tests/loopback/load_shed.rs`).
#[tokio::test(start_paused = true)]
async fn a_load_shedding_endpoint_is_not_ejected_for_its_own_stack() {
    let layer = recommended();
    let ejected = ejections(&layer);
    let gates: Vec<Gate> = (0..3).map(|_| Gate::default()).collect();
    let services: Vec<_> = gates
        .iter()
        .enumerate()
        .map(|(key, gate)| {
            let stack = ServiceBuilder::new()
                .load_shed()
                .concurrency_limit(1)
                .service(gate.clone());
            (key, stack)
        })
        .collect();
    let mut balancer = Balance::new(layer.layer(announce(&services)));
    let shed = Arc::new(AtomicUsize::new(0));
    let mut answers = tokio::task::JoinSet::new();
    let start = tokio::time::Instant::now();
    for i in 0..4_000u32 {
        tokio::time::sleep_until(start + Duration::from_micros(1_800) * i).await;
        let answer = balancer.ready().await.unwrap().call(());
        let shed = shed.clone();
        answers.spawn(async move {
            match answer.await {
                Ok(()) => {}
                Err(error) if error.is::<Overloaded>() => {
                    shed.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => panic!("only the stacks' own refusals: {error}"),
            }
        });
        while answers.try_join_next().is_some() {}
    }
    while answers.join_next().await.is_some() {}
    let shed = shed.load(Ordering::Relaxed);
    let served: Vec<usize> = gates
        .iter()
        .map(|g| g.served.load(Ordering::SeqCst))
        .collect();
    eprintln!("{shed} of 4 000 calls shed; served per endpoint {served:?}");
    assert!(shed > 0, "the stacks shed some");
    assert!(
        ejected.lock().unwrap().is_empty(),
        "ejected for their own stacks' refusals: {:?} after {shed} shed calls",
        ejected.lock().unwrap()
    );
}

/// A stack that refuses every call for good (a connection that never comes up behind a load
/// shedder) is not busy but stuck: after 2 s of refusals with no success between, they count
/// against its endpoint, which is ejected. Before, it stayed in and failed about a sixth of the
/// calls of five endpoints for as long as it lasted.
#[tokio::test(start_paused = true)]
async fn a_stack_that_never_becomes_ready_is_blamed_after_two_seconds() {
    let layer = recommended();
    let ejected = ejections(&layer);
    let gates: Vec<Gate> = (0..5).map(|_| Gate::default()).collect();
    let services: Vec<_> = gates
        .iter()
        .enumerate()
        .map(|(key, gate)| (key, ServiceBuilder::new().load_shed().service(gate.clone())))
        .collect();
    let mut balancer = Balance::new(layer.layer(announce(&services)));
    gates[0].set_closed(true);
    let mut shed_per_second = Vec::new();
    for _ in 0..10 {
        let mut shed = 0;
        for _ in 0..200 {
            if let Err(error) = balancer.ready().await.unwrap().call(()).await {
                assert!(error.is::<Overloaded>(), "{error}");
                shed += 1;
            }
            tokio::time::sleep(TICK).await;
        }
        shed_per_second.push(shed);
    }
    assert!(
        ejected.lock().unwrap().iter().any(|key| key == "0"),
        "never ejected; shed per second: {shed_per_second:?}"
    );
    // Then its passive trials are what it costs: a few calls each.
    let all: usize = shed_per_second.iter().sum();
    assert!(all <= 60, "shed per second: {shed_per_second:?}");
}

/// An endpoint that is itself a balancer behind the layer's fail-fast guard (a tier of its
/// own): its `NoEndpointAvailable` for a moment (1.5 s, every inner endpoint out) is the inner
/// layer's decision, not a failure of the outer endpoint. (A tier that fails fast for 2 s with
/// no success is one that cannot serve: its refusals then count, as a stuck stack's do.)
#[tokio::test(start_paused = true)]
async fn an_inner_fail_fast_guard_is_not_an_endpoint_failure() {
    let layer = recommended();
    let ejected = ejections(&layer);
    let start = tokio::time::Instant::now();
    let inner = |failing: bool| {
        tower::util::BoxCloneSyncService::new(tower::service_fn(move |()| async move {
            if failing && start.elapsed() < Duration::from_millis(1_500) {
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

/// A raw HTTP/2 peer on an in-memory pipe, for hyper's HTTP/2 client: it answers the client's
/// first request with `answer` (whole frames) and reads on until the client's GOAWAY.
fn raw_h2_peer(mut io: tokio::io::DuplexStream, answer: &'static [u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::spawn(async move {
        // The server's preface: an empty SETTINGS frame.
        io.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await?;
        // The client's preface, then its frames up to the request's HEADERS (type 1): an answer
        // before the stream is open would be a connection error of another kind.
        let mut preface = [0u8; 24];
        io.read_exact(&mut preface).await?;
        let mut answered = false;
        loop {
            let mut header = [0u8; 9];
            io.read_exact(&mut header).await?;
            let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let mut payload = vec![0u8; length];
            io.read_exact(&mut payload).await?;
            match header[3] {
                1 if !answered => {
                    answered = true;
                    io.write_all(answer).await?;
                }
                7 => return Ok::<_, std::io::Error>(()),
                _ => {}
            }
        }
    });
}

/// hyper's HTTP/2 client sends one request to a raw peer that answers `answer`; returns the
/// connection's error, which hyper gives the requests that connection fails (a `hyper::Error`
/// whose cause is h2's).
async fn h2_connection_error(max_local_error_resets: usize, answer: &'static [u8]) -> BoxError {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    raw_h2_peer(server_io, answer);
    let (mut sender, connection) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .max_local_error_reset_streams(max_local_error_resets)
            .handshake::<_, http_body_util::Empty<bytes::Bytes>>(hyper_util::rt::TokioIo::new(
                client_io,
            ))
            .await
            .unwrap();
    let request = http::Request::get("http://peer/")
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = sender.send_request(request);
    // The connection's own error says why it ended; the request in flight is dropped (h2 fails
    // it with the stream's own reset, or leaves it to the connection).
    tokio::spawn(async move {
        let _ = response.await;
    });
    Box::new(connection.await.unwrap_err())
}

/// The client's own GOAWAY: hyper's HTTP/2 client allowed no locally reset stream (h2's
/// `max_local_error_reset_streams`, 1024 by default) gets a response that h2 resets on its own
/// (`content-length: 1` and no body), and closes the connection with `ENHANCE_YOUR_CALM`
/// "too_many_internal_resets" — the error hyperium/h2#856 reports, raised by the client's
/// library, not received from the server.
async fn own_goaway() -> BoxError {
    // A HEADERS frame on stream 1 (END_STREAM | END_HEADERS): ":status: 200" (HPACK's static
    // entry 8) and "content-length: 1" (entry 28's name, a literal value).
    const ANSWER: &[u8] = &[0, 0, 5, 1, 5, 0, 0, 0, 1, 0x88, 0x0f, 0x0d, 1, b'1'];
    h2_connection_error(0, ANSWER).await
}

/// The server's GOAWAY with the same code (as a gRPC server says "too_many_pings").
async fn servers_goaway() -> BoxError {
    // GOAWAY (type 7) on stream 0: last stream 0, ENHANCE_YOUR_CALM (0xb).
    const ANSWER: &[u8] = &[0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xb];
    h2_connection_error(1024, ANSWER).await
}

/// An HTTP/2 connection the client's own h2 closed (GOAWAY `ENHANCE_YOUR_CALM` raised by the
/// library) is the caller's, as a load shedder's refusal is; the same GOAWAY received from the
/// server is the server's word, a transport failure.
#[tokio::test]
async fn an_h2_goaway_the_client_sent_itself_is_not_the_endpoints_failure() {
    use tower_outlier::classify::{error_outcome, FailureKind, Outcome};

    let own = own_goaway().await;
    let cause = own.source().and_then(|e| e.downcast_ref::<h2::Error>());
    assert!(
        cause.is_some_and(|h2| h2.is_library() && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM)),
        "{own:?}"
    );
    assert_eq!(error_outcome(&own), Outcome::NotSent, "{own:?}");
    let servers = servers_goaway().await;
    let cause = servers.source().and_then(|e| e.downcast_ref::<h2::Error>());
    assert!(cause.is_some_and(|h2| h2.is_remote()), "{servers:?}");
    assert_eq!(
        error_outcome(&servers),
        Outcome::Failure(FailureKind::Transport),
        "{servers:?}"
    );
}

/// Through p2c under the recommended configuration: an endpoint whose calls fail for 1.5 s with
/// the client's own GOAWAY (one real hyper connection per call) is not ejected and its window
/// counts no failure; the same endpoint failing with the server's GOAWAY is ejected.
#[tokio::test(start_paused = true)]
async fn an_endpoint_is_not_ejected_for_its_clients_own_goaways() {
    for servers in [false, true] {
        let layer = recommended();
        let ejected = ejections(&layer);
        let start = tokio::time::Instant::now();
        let inner = |failing: bool| {
            tower::util::BoxCloneSyncService::new(tower::service_fn(move |()| async move {
                if failing && start.elapsed() < Duration::from_millis(1_500) {
                    Err::<(), BoxError>(if servers {
                        servers_goaway().await
                    } else {
                        own_goaway().await
                    })
                } else {
                    tokio::time::sleep(TICK).await;
                    Ok(())
                }
            }))
        };
        let services = vec![(0usize, inner(true)), (1, inner(false)), (2, inner(false))];
        let mut balancer = Balance::new(layer.layer(announce(&services)));
        let mut failed = 0;
        for _ in 0..600 {
            if balancer.ready().await.unwrap().call(()).await.is_err() {
                failed += 1;
            }
            tokio::time::sleep(TICK).await;
        }
        assert!(failed > 0, "p2c tried the endpoint");
        let ejected = ejected.lock().unwrap().clone();
        if servers {
            assert!(
                !ejected.is_empty(),
                "the server's GOAWAYs eject it ({failed} failed)"
            );
            continue;
        }
        assert!(ejected.is_empty(), "{ejected:?}");
        let snapshot = layer.monitor().snapshot();
        let endpoint = snapshot
            .endpoints
            .iter()
            .find(|e| e.key.as_str() == "0")
            .unwrap();
        assert_eq!(endpoint.windows[0].counts.failures, 0, "{endpoint:#?}");
    }
}

/// A gRPC response whose body fails with the client's own GOAWAY (the connection closed under a
/// stream) counts nothing against the endpoint under `GrpcErrors`; with the server's GOAWAY it
/// is a transport failure, as any body error.
#[tokio::test]
async fn a_grpc_body_cut_by_the_clients_own_goaway_is_not_a_failure() {
    use bytes::Bytes;
    use futures::stream::{self, StreamExt};
    use http_body_util::{BodyExt, StreamBody};
    use tower_outlier::grpc::GrpcErrors;
    use tower_outlier::{ErrorRateConfig, ErrorRatePolicy};

    for servers in [false, true] {
        let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::hsf().build().unwrap(),
        ))
        .classifier(GrpcErrors::default());
        let mut endpoint = layer.endpoint(tower::service_fn(move |()| async move {
            let error = if servers {
                servers_goaway().await
            } else {
                own_goaway().await
            };
            let frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> = vec![
                Ok(http_body::Frame::data(Bytes::from_static(b"\0\0\0\0\0"))),
                Err(error),
            ];
            Ok::<_, BoxError>(http::Response::new(StreamBody::new(
                stream::iter(frames).boxed(),
            )))
        }));
        let response = endpoint.ready().await.unwrap().call(()).await.unwrap();
        assert!(response.into_body().collect().await.is_err());
        let record = endpoint.record();
        let counts = record.policies()[0].describe(record.clock().now()).counts;
        assert_eq!(
            counts.failures,
            u64::from(servers),
            "server's: {servers}, {counts:?}"
        );
    }
}
