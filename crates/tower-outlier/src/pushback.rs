//! What a server says of when to come back: `Retry-After` on a 429 or 503 (RFC 9110, section
//! 10.2.3: seconds, or an HTTP date) and gRPC's `grpc-retry-pushback-ms` (gRFC A6). The
//! classifiers read them ([`ServerErrors`](crate::ServerErrors),
//! [`GrpcErrors`](crate::grpc::GrpcErrors)); the layer then avoids the endpoint for that long,
//! capped ([`OutlierDetectionLayer::max_pushback`](crate::OutlierDetectionLayer::max_pushback)).

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

/// How long a response asks its client to wait before the next request: `Retry-After` on a 429
/// or 503, in seconds or as an HTTP date (one in the past asks for nothing). Other statuses, a
/// missing or unreadable header: `None`.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier::pushback::retry_after;
///
/// let busy = http::Response::builder().status(503).header("retry-after", "5").body(()).unwrap();
/// assert_eq!(retry_after(&busy), Some(Duration::from_secs(5)));
/// let ok = http::Response::builder().header("retry-after", "5").body(()).unwrap();
/// assert_eq!(retry_after(&ok), None, "only a 429 or a 503 asks");
/// ```
pub fn retry_after<B>(response: &http::Response<B>) -> Option<Duration> {
    let status = response.status();
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let value = response
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Absurd values saturate; the layer's cap applies anyway.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    // The date is the server's wall clock; only the difference from ours is used, once.
    #[allow(clippy::disallowed_methods)]
    let now = SystemTime::now();
    at.duration_since(now).ok().filter(|wait| !wait.is_zero())
}

/// gRPC's pushback (`grpc-retry-pushback-ms`, gRFC A6) in `headers` (trailers, or the headers
/// of a trailers-only response): a non-negative number of milliseconds. A negative or
/// unreadable value, which tells a gRPC client not to retry at all, asks the layer for nothing.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier::pushback::grpc_pushback;
///
/// let mut trailers = http::HeaderMap::new();
/// trailers.insert("grpc-retry-pushback-ms", "1500".parse().unwrap());
/// assert_eq!(grpc_pushback(&trailers), Some(Duration::from_millis(1500)));
/// trailers.insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
/// assert_eq!(grpc_pushback(&trailers), None);
/// ```
pub fn grpc_pushback(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-retry-pushback-ms")?.to_str().ok()?.trim();
    let millis: u64 = value.parse().ok()?;
    (millis > 0).then(|| Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, retry_after: &str) -> http::Response<()> {
        http::Response::builder()
            .status(status)
            .header("retry-after", retry_after)
            .body(())
            .unwrap()
    }

    #[test]
    fn seconds_and_dates_are_read_and_nonsense_is_not() {
        assert_eq!(retry_after(&response(429, "0")), Some(Duration::ZERO));
        assert_eq!(
            retry_after(&response(429, " 30 ")),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after(&response(503, "99999999999999999999999")),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(retry_after(&response(503, "-5")), None);
        assert_eq!(retry_after(&response(503, "soon")), None);
        assert_eq!(retry_after(&response(500, "5")), None);
        // A date in the past asks for nothing; one ahead asks for the difference.
        assert_eq!(
            retry_after(&response(503, "Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        #[allow(clippy::disallowed_methods)]
        let ahead = SystemTime::now() + Duration::from_secs(120);
        let wait = retry_after(&response(503, &httpdate::fmt_http_date(ahead))).unwrap();
        assert!(
            wait > Duration::from_secs(110) && wait <= Duration::from_secs(120),
            "{wait:?}"
        );
    }

    #[test]
    fn grpc_pushback_is_milliseconds_and_a_negative_one_is_none() {
        let mut headers = HeaderMap::new();
        assert_eq!(grpc_pushback(&headers), None);
        headers.insert("grpc-retry-pushback-ms", "0".parse().unwrap());
        assert_eq!(grpc_pushback(&headers), None);
        headers.insert("grpc-retry-pushback-ms", "250".parse().unwrap());
        assert_eq!(grpc_pushback(&headers), Some(Duration::from_millis(250)));
        headers.insert("grpc-retry-pushback-ms", "x".parse().unwrap());
        assert_eq!(grpc_pushback(&headers), None);
    }
}
