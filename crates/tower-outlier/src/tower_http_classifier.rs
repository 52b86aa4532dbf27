//! Using a `tower_http::classify::ClassifyResponse` as the layer's classifier (feature
//! `tower-http`), for code that already classifies with tower-http's `Trace` middleware.
//!
//! A response tower-http classifies at once is recorded at once; one that `RequiresEos` (gRPC
//! statuses in trailers) has its body wrapped in an [`EosBody`] that records at the end of the
//! stream, with the latency to the response headers. Any failure class counts as
//! [`FailureKind::ServerError`]; errors of the service keep their transport or timeout kind. A
//! body dropped before its end counts as cancelled. What the server says of itself is read as
//! with the layer's own classifiers, whatever the class: a 429 or 503's `Retry-After`,
//! `x-envoy-degraded` (with `detect_degraded` on), a load report while a policy hears them.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_http::classify::{ClassifiedResponse, ClassifyEos, ClassifyResponse};
use tower_outlier_core::classify::error_outcome;
use tower_outlier_core::{FailureKind, Outcome};

use crate::response::{Recorder, ResponseClassifier};

/// tower-http's classifiers, from the tower-http version this module is built on: a classifier
/// taken from here always satisfies [`TowerHttp`]'s bounds.
pub use ::tower_http::classify;

/// A tower-http classifier as the layer's classifier.
///
/// ```
/// use tower_http::classify::ServerErrorsAsFailures;
/// use tower_outlier::tower_http_classifier::TowerHttp;
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?))
///     .classifier(TowerHttp(ServerErrorsAsFailures::new()));
/// # let _ = layer;
/// # Ok::<(), tower_outlier::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TowerHttp<C>(pub C);

fn outcome<F>(result: Result<(), F>) -> Outcome {
    match result {
        Ok(()) => Outcome::Success,
        Err(_) => Outcome::Failure(FailureKind::ServerError),
    }
}

impl<C, B, E> ResponseClassifier<http::Response<B>, E> for TowerHttp<C>
where
    C: ClassifyResponse + Clone,
    E: 'static,
{
    type Response = http::Response<EosBody<B, C>>;

    fn complete(
        result: Result<http::Response<B>, E>,
        mut recorder: Recorder<Self>,
    ) -> Result<Self::Response, E> {
        let response = match result {
            Ok(response) => response,
            Err(error) => {
                recorder.record(error_outcome(&error));
                return Err(error);
            }
        };
        // What the server says of itself, whatever tower-http's classifier makes of the status.
        recorder.read_response(&response);
        let pending = match recorder.classifier().0.clone().classify_response(&response) {
            ClassifiedResponse::Ready(result) => {
                recorder.record(outcome(result));
                None
            }
            ClassifiedResponse::RequiresEos(eos) => {
                recorder.freeze_latency();
                Some((eos, recorder))
            }
        };
        Ok(response.map(|inner| EosBody { inner, pending }))
    }
}

pin_project! {
    /// A response body that records its call's outcome when it ends, as tower-http's
    /// `ClassifyEos` decides.
    pub struct EosBody<B, C: ClassifyResponse> {
        #[pin]
        inner: B,
        pending: Option<(C::ClassifyEos, Recorder<TowerHttp<C>>)>,
    }
}

impl<B: Body, C: ClassifyResponse> Body for EosBody<B, C> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        let ended = match &frame {
            Some(Ok(frame)) => frame.is_trailers(),
            Some(Err(_)) | None => true,
        };
        if ended {
            if let Some((eos, recorder)) = this.pending.take() {
                let result = match &frame {
                    Some(Ok(frame)) => outcome(eos.classify_eos(frame.trailers_ref())),
                    None => outcome(eos.classify_eos(None)),
                    Some(Err(_)) => Outcome::Failure(FailureKind::Transport),
                };
                recorder.record(result);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug, C: ClassifyResponse> fmt::Debug for EosBody<B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EosBody")
            .field("inner", &self.inner)
            .field("pending", &self.pending.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};
    use tower::{service_fn, Service, ServiceExt};
    use tower_http::classify::{GrpcCode, GrpcErrorsAsFailures, ServerErrorsAsFailures};

    fn layer() -> OutlierDetectionLayer {
        OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::hsf().build().unwrap(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn server_errors_as_failures_decides_at_once() {
        let mut endpoint = layer()
            .classifier(TowerHttp(ServerErrorsAsFailures::new()))
            .endpoint(service_fn(|status: u16| async move {
                Ok::<_, std::io::Error>(
                    http::Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
            }));
        for status in [200, 404, 500, 503] {
            let _ = endpoint.ready().await.unwrap().call(status).await.unwrap();
        }
        let record = endpoint.record();
        let counts = record.policies()[0].describe(record.clock().now()).counts;
        assert_eq!((counts.calls, counts.failures), (4, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn grpc_statuses_in_trailers_are_read_at_the_end() {
        let mut endpoint = layer()
            .classifier(TowerHttp(
                GrpcErrorsAsFailures::new().with_success(GrpcCode::NotFound),
            ))
            .endpoint(service_fn(|status: &'static str| async move {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", status.parse().unwrap());
                let frames = futures::stream::iter(vec![
                    Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"x"))),
                    Ok(Frame::trailers(trailers)),
                ]);
                Ok::<_, std::io::Error>(http::Response::new(StreamBody::new(frames)))
            }));
        let counts = |endpoint: &crate::discover::OutlierEndpoint<_, _>| {
            let record = endpoint.record();
            record.policies()[0].describe(record.clock().now()).counts
        };
        let response = endpoint.ready().await.unwrap().call("14").await.unwrap();
        assert_eq!(
            counts(&endpoint).calls,
            0,
            "not decided before the trailers"
        );
        let _ = response.into_body().collect().await;
        let response = endpoint.ready().await.unwrap().call("5").await.unwrap();
        let _ = response.into_body().collect().await;
        let counts = counts(&endpoint);
        assert_eq!((counts.calls, counts.failures), (2, 1));
    }
}
