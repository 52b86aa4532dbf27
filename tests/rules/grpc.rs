//! gRPC classification: the status in the headers (trailers-only) decides at once; otherwise the
//! body records when its trailers arrive, on tokio's paused clock.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use http_body_util::{BodyExt, StreamBody};
use tower::{service_fn, Service, ServiceExt};
use tower_outlier::discover::OutlierEndpoint;
use tower_outlier::grpc::{Code, GrpcErrors};
use tower_outlier::policy::WindowCounts;
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

type TestBody = StreamBody<BoxStream<'static, Result<http_body::Frame<Bytes>, io::Error>>>;

/// How the test server answers.
#[derive(Clone)]
struct Answer {
    http_status: u16,
    header_status: Option<&'static str>,
    trailer_status: Option<&'static str>,
    trailers: bool,
    body_error: bool,
    headers_after: Duration,
    trailers_after: Duration,
}

impl Answer {
    fn trailers(status: &'static str) -> Self {
        Answer {
            http_status: 200,
            header_status: None,
            trailer_status: Some(status),
            trailers: true,
            body_error: false,
            headers_after: Duration::ZERO,
            trailers_after: Duration::ZERO,
        }
    }

    fn trailers_only(status: &'static str) -> Self {
        Answer {
            header_status: Some(status),
            trailers: false,
            trailer_status: None,
            ..Answer::trailers("0")
        }
    }
}

fn endpoint(
    classifier: GrpcErrors,
) -> OutlierEndpoint<
    impl Service<
            Answer,
            Response = http::Response<TestBody>,
            Error = io::Error,
            Future = impl std::future::Future<Output = Result<http::Response<TestBody>, io::Error>>
                         + Send,
        > + Clone,
    GrpcErrors,
> {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ))
    .classifier(classifier);
    layer.endpoint(service_fn(|answer: Answer| async move {
        tokio::time::sleep(answer.headers_after).await;
        let mut frames: Vec<Result<http_body::Frame<Bytes>, io::Error>> = vec![Ok(
            http_body::Frame::data(Bytes::from_static(b"\0\0\0\0\0")),
        )];
        if answer.body_error {
            frames.push(Err(io::Error::from(io::ErrorKind::ConnectionReset)));
        } else if answer.trailers {
            let mut trailers = http::HeaderMap::new();
            if let Some(status) = answer.trailer_status {
                trailers.insert("grpc-status", status.parse().unwrap());
            }
            frames.push(Ok(http_body::Frame::trailers(trailers)));
        }
        let delay = answer.trailers_after;
        let body = stream::iter(frames)
            .then(move |frame| async move {
                if frame.as_ref().map_or(true, |f| !f.is_data()) {
                    tokio::time::sleep(delay).await;
                }
                frame
            })
            .boxed();
        let mut response = http::Response::builder().status(answer.http_status);
        if let Some(status) = answer.header_status {
            response = response.header("grpc-status", status);
        }
        Ok::<_, io::Error>(response.body(StreamBody::new(body)).unwrap())
    }))
}

fn counts<S>(endpoint: &OutlierEndpoint<S, GrpcErrors>) -> WindowCounts {
    let record = endpoint.record();
    record.policies()[0].describe(record.clock().now()).counts
}

async fn call_and_read(classifier: GrpcErrors, answer: Answer) -> WindowCounts {
    let mut endpoint = endpoint(classifier);
    let response = endpoint.ready().await.unwrap().call(answer).await.unwrap();
    let _ = response.into_body().collect().await;
    counts(&endpoint)
}

fn failures(counts: WindowCounts) -> (u64, u64) {
    (counts.calls, counts.failures)
}

#[tokio::test(start_paused = true)]
async fn a_trailers_only_status_decides_at_once() {
    let mut ok = endpoint(GrpcErrors::default());
    let response = ok
        .ready()
        .await
        .unwrap()
        .call(Answer::trailers_only("0"))
        .await
        .unwrap();
    assert_eq!(
        failures(counts(&ok)),
        (1, 0),
        "recorded before the body is read"
    );
    drop(response);
    let mut unavailable = endpoint(GrpcErrors::default());
    let _response = unavailable
        .ready()
        .await
        .unwrap()
        .call(Answer::trailers_only("14"))
        .await
        .unwrap();
    assert_eq!(failures(counts(&unavailable)), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_status_in_the_trailers_is_recorded_when_the_body_ends() {
    let mut endpoint = endpoint(GrpcErrors::default());
    let response = endpoint
        .ready()
        .await
        .unwrap()
        .call(Answer::trailers("14"))
        .await
        .unwrap();
    assert_eq!(
        failures(counts(&endpoint)),
        (0, 0),
        "not decided before the trailers"
    );
    let _ = response.into_body().collect().await;
    assert_eq!(failures(counts(&endpoint)), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn the_caller_s_faults_are_not_failures_unless_configured() {
    for status in ["5", "3", "0"] {
        assert_eq!(
            failures(call_and_read(GrpcErrors::default(), Answer::trailers(status)).await),
            (1, 0),
            "grpc-status {status}"
        );
    }
    for status in ["14", "4", "13", "2", "8", "15"] {
        assert_eq!(
            failures(call_and_read(GrpcErrors::default(), Answer::trailers(status)).await),
            (1, 1),
            "grpc-status {status}"
        );
    }
    let strict = GrpcErrors::default().with_failure(Code::NotFound);
    assert_eq!(
        failures(call_and_read(strict, Answer::trailers("5")).await),
        (1, 1)
    );
    let lenient = GrpcErrors::default().without_failure(Code::Unavailable);
    assert_eq!(
        failures(call_and_read(lenient, Answer::trailers("14")).await),
        (1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn no_status_at_all_is_unavailable() {
    let no_trailers = Answer {
        trailers: false,
        ..Answer::trailers("0")
    };
    assert_eq!(
        failures(call_and_read(GrpcErrors::default(), no_trailers).await),
        (1, 1)
    );
    let empty_trailers = Answer {
        trailer_status: None,
        ..Answer::trailers("0")
    };
    assert_eq!(
        failures(call_and_read(GrpcErrors::default(), empty_trailers).await),
        (1, 1)
    );
    let garbage = Answer::trailers("fourteen");
    assert_eq!(
        failures(call_and_read(GrpcErrors::default(), garbage).await),
        (1, 1),
        "an unparsable status is UNKNOWN"
    );
}

#[tokio::test(start_paused = true)]
async fn a_503_from_a_proxy_is_unavailable() {
    for (status, failed) in [(503, 1), (502, 1), (429, 1), (504, 1), (404, 0)] {
        let answer = Answer {
            http_status: status,
            trailers: false,
            ..Answer::trailers("0")
        };
        // 404 maps to UNIMPLEMENTED, which is not a failure by default.
        assert_eq!(
            failures(call_and_read(GrpcErrors::default(), answer).await),
            (1, failed),
            "HTTP {status}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_early_is_cancelled_and_a_broken_body_fails() {
    let mut endpoint = endpoint(GrpcErrors::default());
    let response = endpoint
        .ready()
        .await
        .unwrap()
        .call(Answer::trailers("14"))
        .await
        .unwrap();
    drop(response);
    assert_eq!(
        failures(counts(&endpoint)),
        (0, 0),
        "cancelled: neither success nor failure"
    );

    let broken = Answer {
        body_error: true,
        ..Answer::trailers("0")
    };
    assert_eq!(
        failures(call_and_read(GrpcErrors::default(), broken).await),
        (1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn latency_is_the_time_to_the_response_headers() {
    let mut endpoint = endpoint(GrpcErrors::default());
    let answer = Answer {
        headers_after: Duration::from_millis(10),
        trailers_after: Duration::from_secs(5),
        ..Answer::trailers("0")
    };
    // Twice: an endpoint's first call moves the estimate only as an average would (it may have
    // set up the connection).
    for _ in 0..2 {
        let response = endpoint
            .ready()
            .await
            .unwrap()
            .call(answer.clone())
            .await
            .unwrap();
        let _ = response.into_body().collect().await;
    }
    let record = endpoint.record();
    let estimate = record.rtt_estimate(record.clock().now());
    assert_eq!(
        estimate, 10_000_000.0,
        "10 ms to the headers, not 5 s to the trailers"
    );
}

#[tokio::test(start_paused = true)]
async fn transport_errors_fail() {
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ))
    .classifier(GrpcErrors::default());
    let mut endpoint = layer.endpoint(service_fn(|_: ()| async {
        Err::<http::Response<TestBody>, _>(io::Error::from(io::ErrorKind::ConnectionRefused))
    }));
    assert!(endpoint.ready().await.unwrap().call(()).await.is_err());
    let record = endpoint.record();
    assert_eq!(
        failures(record.policies()[0].describe(record.clock().now()).counts),
        (1, 1)
    );
}

/// With `stalled_after`, a body dropped after its reader waited on the server that long is a
/// timeout; one dropped sooner, or never read, is cancelled as before.
#[tokio::test(start_paused = true)]
async fn a_body_dropped_after_a_long_wait_is_a_timeout_with_stalled_after() {
    let classifier = GrpcErrors::default().stalled_after(Duration::from_secs(1));
    let slow_trailers = Answer {
        trailers_after: Duration::from_secs(10),
        ..Answer::trailers("0")
    };
    for (wait, expected) in [
        (None, (0, 0)),
        (Some(Duration::from_millis(500)), (0, 0)),
        (Some(Duration::from_secs(2)), (1, 1)),
    ] {
        let mut endpoint = endpoint(classifier);
        let response = endpoint
            .ready()
            .await
            .unwrap()
            .call(slow_trailers.clone())
            .await
            .unwrap();
        if let Some(wait) = wait {
            let mut body = response.into_body();
            let read = async {
                while let Some(frame) = body.frame().await {
                    let _ = frame;
                }
            };
            assert!(tokio::time::timeout(wait, read).await.is_err());
        } else {
            drop(response);
        }
        assert_eq!(failures(counts(&endpoint)), expected, "waited {wait:?}");
    }
}

/// Every code converts to tonic's and back unchanged.
#[test]
fn codes_convert_to_and_from_tonic() {
    for value in 0..=16 {
        let code = Code::from_i32(value);
        let theirs = tonic::Code::from(code);
        assert_eq!(theirs as i32, value);
        assert_eq!(Code::from(theirs), code);
    }
}

/// The standalone breaker with `GrpcErrors`: its half-open probe that is a server stream (a
/// message, then the stream stays open) is decided at its first message. Decided only at the
/// trailers, it held the breaker half open, every other call refused, for the stream's life.
#[tokio::test]
async fn a_streaming_probe_does_not_hold_the_breaker_half_open() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tower::Layer;
    use tower_outlier::slow_call::{BreakerConfig, CircuitBreakerLayer, State};

    let failing = Arc::new(AtomicBool::new(true));
    let state = failing.clone();
    let service = service_fn(move |_: ()| {
        let failing = state.load(Ordering::SeqCst);
        async move {
            let response = if failing {
                http::Response::builder()
                    .header("grpc-status", "14")
                    .body(StreamBody::new(stream::empty().boxed()))
            } else {
                // One message, then a stream that never ends.
                let message: Result<http_body::Frame<Bytes>, io::Error> =
                    Ok(http_body::Frame::data(Bytes::from_static(b"\0\0\0\0\0")));
                let frames = stream::iter([message]).chain(stream::pending()).boxed();
                http::Response::builder().body(StreamBody::new(frames))
            };
            Ok::<_, io::Error>(response.unwrap())
        }
    });
    let states = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = states.clone();
    let layer = CircuitBreakerLayer::new(
        BreakerConfig::error_count(0)
            .min_calls(1)
            .open_duration(Duration::from_millis(50))
            .build()
            .unwrap(),
    )
    .classifier(GrpcErrors::default())
    .on_state_change(move |change| seen.lock().unwrap().push(change.to));
    let mut breaker = layer.layer(service);

    let _ = breaker.ready().await.unwrap().call(()).await;
    tower_outlier::slow_call::wait_for_state_observers();
    assert_eq!(*states.lock().unwrap(), [State::Open]);
    failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(80)).await;

    // The probe: a stream whose first message arrives and which then stays open.
    let probe = breaker.ready().await.unwrap().call(()).await.unwrap();
    let mut body = probe.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    tower_outlier::slow_call::wait_for_state_observers();
    assert_eq!(
        *states.lock().unwrap(),
        [State::Open, State::HalfOpen, State::Closed],
        "decided at its first message"
    );
    // With the stream still open, other calls go through.
    for _ in 0..3 {
        let response = breaker.ready().await.unwrap().call(()).await;
        assert!(response.is_ok(), "refused while the probe's stream is open");
    }
    drop(body);
}
