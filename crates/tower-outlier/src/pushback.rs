//! What a server says of when to come back: `Retry-After` on a 429 or 503 (RFC 9110, section
//! 10.2.3: seconds, or an HTTP date), the rate limiters' reset headers on the same statuses
//! (`x-ratelimit-reset` and its kin: [`rate_limit_reset`]) and gRPC's `grpc-retry-pushback-ms`
//! (gRFC A6). The classifiers read them ([`ServerErrors`](crate::ServerErrors),
//! [`GrpcErrors`](crate::grpc::GrpcErrors)) through [`asked_wait`]; the layer then avoids the
//! endpoint for that long, capped
//! ([`OutlierDetectionLayer::max_pushback`](crate::OutlierDetectionLayer::max_pushback)).

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
    until(httpdate::parse_http_date(value).ok()?)
}

/// The wait until `at`, a time on the server's wall clock: only its difference from ours is
/// used, once. A time already past asks for nothing.
fn until(at: SystemTime) -> Option<Duration> {
    #[allow(clippy::disallowed_methods)]
    let now = SystemTime::now();
    at.duration_since(now).ok().filter(|wait| !wait.is_zero())
}

/// How long a 429 or 503 asks its client to wait: its `Retry-After` ([`retry_after`]) when it
/// has a readable one (the server's explicit word), else the soonest of its rate limiter's reset
/// headers ([`rate_limit_reset`]). What the layer's classifiers read from every HTTP response.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier::pushback::asked_wait;
///
/// let limited = http::Response::builder()
///     .status(429)
///     .header("x-ratelimit-reset-requests", "2s")
///     .body(())
///     .unwrap();
/// assert_eq!(asked_wait(&limited), Some(Duration::from_secs(2)));
/// ```
pub fn asked_wait<B>(response: &http::Response<B>) -> Option<Duration> {
    retry_after(response).or_else(|| rate_limit_reset(response))
}

/// When a 429 or 503's rate limit resets, from the headers API and model providers send
/// beside (or instead of) `Retry-After`; the soonest of those present and readable:
///
/// * `x-ratelimit-reset-requests`, `x-ratelimit-reset-tokens` (OpenAI, Groq): a duration as Go
///   writes one (`1s`, `6m0s`, `2m59.56s`, `20ms`), or plain seconds;
/// * `x-ratelimit-reset` (GitHub, Discord, many gateways) and `x-rate-limit-reset` (X): a Unix
///   time in seconds (from 10⁹ on) or milliseconds (from 10¹²), fractions allowed, or else
///   seconds from now;
/// * `x-ratelimit-reset-after` (Discord) and `ratelimit-reset` (the IETF draft): seconds from
///   now.
///
/// A wait that is not a finite, non-negative number, or a reset time already past, asks for
/// nothing: a header is never an error for the caller. Other statuses: `None`. Taking the
/// soonest assumes the limit that is out resets first; a server that knows better says so with
/// `Retry-After`, which [`asked_wait`] reads first.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier::pushback::rate_limit_reset;
///
/// let limited = http::Response::builder()
///     .status(429)
///     .header("x-ratelimit-reset-requests", "1s")
///     .header("x-ratelimit-reset-tokens", "6m0s")
///     .body(())
///     .unwrap();
/// assert_eq!(rate_limit_reset(&limited), Some(Duration::from_secs(1)));
/// ```
pub fn rate_limit_reset<B>(response: &http::Response<B>) -> Option<Duration> {
    let status = response.status();
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let headers = response.headers();
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let durations = ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]
        .into_iter()
        .filter_map(|name| text(name).and_then(go_duration));
    let times = ["x-ratelimit-reset", "x-rate-limit-reset"]
        .into_iter()
        .filter_map(|name| text(name).and_then(reset_time));
    let seconds = ["x-ratelimit-reset-after", "ratelimit-reset"]
        .into_iter()
        .filter_map(|name| text(name).and_then(seconds));
    durations.chain(times).chain(seconds).min()
}

/// A non-negative, finite number of seconds (fractions allowed); absurd values saturate.
fn seconds(value: &str) -> Option<Duration> {
    let secs: f64 = value.parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

/// `x-ratelimit-reset`: a Unix time (seconds from 10⁹ on, milliseconds from 10¹²), else seconds
/// from now. A time already past asks for nothing.
fn reset_time(value: &str) -> Option<Duration> {
    let number: f64 = value.parse().ok()?;
    if !number.is_finite() || number < 0.0 {
        return None;
    }
    let epoch_secs = if number >= 1e12 {
        number / 1e3
    } else if number >= 1e9 {
        number
    } else {
        return seconds(value);
    };
    until(SystemTime::UNIX_EPOCH.checked_add(Duration::try_from_secs_f64(epoch_secs).ok()?)?)
}

/// A duration as Go formats one (`time.Duration.String`): numbers with units `h`, `m`, `s`,
/// `ms`, `us` / `µs`, `ns`, in any sequence (`6m0s`, `2m59.56s`, `1h2m`); a bare number is
/// seconds. Negative or unreadable: `None`; absurd values saturate.
fn go_duration(value: &str) -> Option<Duration> {
    if value.is_empty() {
        return None;
    }
    if let Some(plain) = seconds(value) {
        return Some(plain);
    }
    let mut rest = value;
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    if !total.is_finite() {
        return None;
    }
    Some(Duration::try_from_secs_f64(total).unwrap_or(Duration::MAX))
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

    fn limited(status: u16, headers: &[(&str, &str)]) -> Option<Duration> {
        let mut response = http::Response::builder().status(status);
        for (name, value) in headers {
            response = response.header(*name, *value);
        }
        rate_limit_reset(&response.body(()).unwrap())
    }

    #[allow(clippy::disallowed_methods)]
    fn unix_now() -> f64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    }

    /// The providers' documented examples, and what the layer makes of them.
    #[test]
    fn providers_reset_headers_are_read() {
        let ms = Duration::from_millis;
        type Headers<'a> = &'a [(&'a str, &'a str)];
        let table: &[(Headers, Option<Duration>)] = &[
            // OpenAI's rate-limit headers guide: requests reset in 1 s, tokens in 6 min.
            (
                &[
                    ("x-ratelimit-reset-requests", "1s"),
                    ("x-ratelimit-reset-tokens", "6m0s"),
                ],
                Some(ms(1_000)),
            ),
            (&[("x-ratelimit-reset-tokens", "6m0s")], Some(ms(360_000))),
            // Groq's documentation: fractional seconds after minutes.
            (
                &[
                    ("x-ratelimit-reset-requests", "2m59.56s"),
                    ("x-ratelimit-reset-tokens", "7.66s"),
                ],
                Some(ms(7_660)),
            ),
            (&[("x-ratelimit-reset-requests", "20ms")], Some(ms(20))),
            (
                &[("x-ratelimit-reset-requests", "1h2m3s")],
                Some(ms(3_723_000)),
            ),
            (&[("x-ratelimit-reset-requests", "3")], Some(ms(3_000))),
            // Discord: seconds until the bucket resets, with a fraction.
            (&[("x-ratelimit-reset-after", "1.234")], Some(ms(1_234))),
            // The IETF draft's RateLimit-Reset: seconds from now.
            (&[("ratelimit-reset", "50")], Some(ms(50_000))),
            // Small x-ratelimit-reset values are seconds from now.
            (&[("x-ratelimit-reset", "30")], Some(ms(30_000))),
            // Nonsense asks for nothing.
            (&[("x-ratelimit-reset-requests", "-1s")], None),
            (&[("x-ratelimit-reset-requests", "soon")], None),
            (&[("x-ratelimit-reset-requests", "5d")], None),
            (&[("x-ratelimit-reset-requests", "")], None),
            (&[("x-ratelimit-reset-requests", "s")], None),
            (&[("ratelimit-reset", "NaN")], None),
            (&[("ratelimit-reset", "inf")], None),
            (&[("x-ratelimit-reset", "-5")], None),
            // One readable header among unreadable ones still counts.
            (
                &[
                    ("x-ratelimit-reset-requests", "garbage"),
                    ("x-ratelimit-reset-tokens", "250ms"),
                ],
                Some(ms(250)),
            ),
        ];
        for (headers, expected) in table {
            assert_eq!(limited(429, headers), *expected, "{headers:?}");
        }
        // Only a 429 or a 503 asks.
        assert_eq!(limited(200, &[("x-ratelimit-reset-requests", "1s")]), None);
        assert_eq!(
            limited(503, &[("x-ratelimit-reset-requests", "1s")]),
            Some(ms(1_000))
        );
        // Absurd values saturate; the layer's cap applies anyway.
        assert_eq!(
            limited(429, &[("ratelimit-reset", "1e300")]),
            Some(Duration::MAX)
        );
    }

    /// GitHub's and X's `x-ratelimit-reset`: a Unix time, in seconds or milliseconds; a past
    /// one asks for nothing.
    #[test]
    fn a_reset_time_is_the_difference_from_now() {
        let ahead = unix_now() + 120.0;
        for value in [
            format!("{}", ahead as u64),
            format!("{}", (ahead * 1e3) as u64),
        ] {
            for name in ["x-ratelimit-reset", "x-rate-limit-reset"] {
                let wait = limited(429, &[(name, &value)]).unwrap();
                assert!(
                    wait > Duration::from_secs(110) && wait <= Duration::from_secs(120),
                    "{name}: {value}: {wait:?}"
                );
            }
        }
        // GitHub's documented example, long past.
        assert_eq!(limited(429, &[("x-ratelimit-reset", "1372700873")]), None);
        // Discord's, with a fraction, also past.
        assert_eq!(
            limited(429, &[("x-ratelimit-reset", "1470173023.123")]),
            None
        );
    }

    /// `Retry-After` is the server's explicit word: read first.
    #[test]
    fn retry_after_comes_first() {
        let response = http::Response::builder()
            .status(429)
            .header("retry-after", "5")
            .header("x-ratelimit-reset-requests", "1s")
            .body(())
            .unwrap();
        assert_eq!(asked_wait(&response), Some(Duration::from_secs(5)));
        let response = http::Response::builder()
            .status(429)
            .header("retry-after", "soon")
            .header("x-ratelimit-reset-requests", "1s")
            .body(())
            .unwrap();
        assert_eq!(asked_wait(&response), Some(Duration::from_secs(1)));
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
