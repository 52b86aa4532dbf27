//! What a server says of its own state: Envoy's `x-envoy-degraded` response header marks an
//! endpoint that still serves but should get traffic only when the others cannot take it (a
//! draining instance, one whose dependency is impaired, one out of its preferred zone). With
//! [`OutlierDetectionLayer::detect_degraded`](crate::OutlierDetectionLayer::detect_degraded) on,
//! [`ServerErrors`](crate::ServerErrors) and [`GrpcErrors`](crate::grpc::GrpcErrors) read it on
//! every response; a classifier of your own reports the signal it reads through
//! [`Recorder::degraded`](crate::classify::Recorder::degraded).

use http::header::HeaderName;
use http::HeaderMap;

/// The header a server sends to say it is degraded (its value is not read).
pub const DEGRADED_HEADER: HeaderName = HeaderName::from_static("x-envoy-degraded");

/// Whether `headers` say their server is degraded: `x-envoy-degraded` is present, whatever its
/// value (Envoy reads it so).
///
/// ```
/// use tower_outlier::degraded::says_degraded;
///
/// let mut headers = http::HeaderMap::new();
/// assert!(!says_degraded(&headers));
/// headers.insert("x-envoy-degraded", http::HeaderValue::from_static(""));
/// assert!(says_degraded(&headers));
/// ```
#[inline]
pub fn says_degraded(headers: &HeaderMap) -> bool {
    headers.contains_key(DEGRADED_HEADER)
}
