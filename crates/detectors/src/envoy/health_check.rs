//! Envoy's `config.core.v3.HealthCheck`: the cadence of the active checks, read from proto3 JSON.

use std::time::Duration;

use serde_json::Value;
use tower_outlier_core::DocumentError;

use super::read::{count, millis, NON_NEGATIVE_ALLOWED, POSITIVE_ALLOWED};
use crate::json_reader::{self, child, Problem};

const DOCUMENT: &str = "Envoy health_check";

const TOP_ALLOWED: &str = "a JSON object: an envoy.config.core.v3.HealthCheck message";
const THRESHOLD_ALLOWED: &str =
    "a whole number from 1 to 4294967295: a JSON number or a string of decimal digits";
const UNKNOWN_HINT: &str = "not a field of envoy.config.core.v3.HealthCheck; fields are spelt in \
                            snake_case or lowerCamelCase, as unhealthy_interval or \
                            unhealthyInterval";

/// What a field does here.
#[derive(Clone, Copy)]
enum Use {
    /// Read: a duration greater than zero.
    Positive,
    /// Read: a duration of zero or more.
    NonNegative,
    /// Read: a count of one or more.
    Threshold,
    /// Read: a percentage (any whole number, as Envoy's `uint32`).
    Percent,
    /// Accepted and noted: the reason it has no effect here.
    Noted(&'static str),
}

const NO_HEALTHY_CHECKS: &str = "this layer checks endpoints in service only while they get no \
                                 traffic (`no_traffic_interval`); calls judge the others";
const PROBE_DECIDES: &str = "the layer's probe decides what a check sends";

/// The fields of `HealthCheck`, in both spellings.
const FIELDS: &[(&str, &str, Use)] = &[
    ("timeout", "timeout", Use::Positive),
    ("interval", "interval", Use::Positive),
    ("initial_jitter", "initialJitter", Use::NonNegative),
    ("interval_jitter", "intervalJitter", Use::NonNegative),
    (
        "interval_jitter_percent",
        "intervalJitterPercent",
        Use::Percent,
    ),
    ("unhealthy_threshold", "unhealthyThreshold", Use::Threshold),
    ("healthy_threshold", "healthyThreshold", Use::Threshold),
    ("unhealthy_interval", "unhealthyInterval", Use::Positive),
    (
        "unhealthy_edge_interval",
        "unhealthyEdgeInterval",
        Use::Positive,
    ),
    (
        "healthy_edge_interval",
        "healthyEdgeInterval",
        Use::Noted(NO_HEALTHY_CHECKS),
    ),
    ("no_traffic_interval", "noTrafficInterval", Use::Positive),
    (
        "no_traffic_healthy_interval",
        "noTrafficHealthyInterval",
        Use::Noted(NO_HEALTHY_CHECKS),
    ),
    ("alt_port", "altPort", Use::Noted(PROBE_DECIDES)),
    (
        "reuse_connection",
        "reuseConnection",
        Use::Noted(PROBE_DECIDES),
    ),
    (
        "http_health_check",
        "httpHealthCheck",
        Use::Noted(PROBE_DECIDES),
    ),
    (
        "tcp_health_check",
        "tcpHealthCheck",
        Use::Noted(PROBE_DECIDES),
    ),
    (
        "grpc_health_check",
        "grpcHealthCheck",
        Use::Noted(PROBE_DECIDES),
    ),
    (
        "custom_health_check",
        "customHealthCheck",
        Use::Noted(PROBE_DECIDES),
    ),
    ("tls_options", "tlsOptions", Use::Noted(PROBE_DECIDES)),
    (
        "transport_socket_match_criteria",
        "transportSocketMatchCriteria",
        Use::Noted(PROBE_DECIDES),
    ),
    (
        "event_log_path",
        "eventLogPath",
        Use::Noted("checks are logged through `tracing`"),
    ),
    (
        "event_logger",
        "eventLogger",
        Use::Noted("checks are logged through `tracing`"),
    ),
    (
        "event_service",
        "eventService",
        Use::Noted("checks are logged through `tracing`"),
    ),
    (
        "always_log_health_check_failures",
        "alwaysLogHealthCheckFailures",
        Use::Noted("checks are logged through `tracing`"),
    ),
    (
        "always_log_health_check_success",
        "alwaysLogHealthCheckSuccess",
        Use::Noted("checks are logged through `tracing`"),
    ),
];

/// An Envoy `HealthCheck` message (`envoy.config.core.v3.HealthCheck`), read from proto3 JSON for
/// the cadence of a layer's active checks (`tower_outlier::probe::ProbeCadence::from_envoy`).
///
/// Read, as in Envoy: `timeout`, `interval`, `unhealthy_interval` (the interval while an
/// endpoint fails its checks; `interval` where it is not given), `unhealthy_edge_interval` (the
/// first check after an endpoint is taken out; the unhealthy interval where it is not given),
/// `interval_jitter`, `interval_jitter_percent`, `initial_jitter`, `healthy_threshold`
/// (passes in a row that bring back an endpoint after a failed check), `no_traffic_interval`
/// (checks of endpoints in service that get no traffic) and `unhealthy_threshold` (failures in
/// a row of those that take one out). Envoy requires `timeout`, `interval`,
/// `unhealthy_threshold` and `healthy_threshold`; here a field left out keeps the layer's
/// default.
///
/// Accepted with a [note](Self::notes) each, without effect: the fields for endpoints in
/// service that get traffic (`healthy_edge_interval`, `no_traffic_healthy_interval`: this layer
/// checks endpoints in service only while they get none; calls judge the others), what a check sends (`http_health_check`, `grpc_health_check`, `tcp_health_check`,
/// `custom_health_check`, `alt_port`, `reuse_connection`, TLS: the probe given to the layer
/// decides), and the event log fields. An unknown field, a field under both spellings, or a
/// value out of range is an error naming it, with the grammar of
/// [`EnvoyOutlierDetection`](crate::EnvoyOutlierDetection).
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_detectors::EnvoyHealthCheck;
///
/// let check = EnvoyHealthCheck::from_json(
///     r#"{"timeout": "0.5s", "interval": "5s", "unhealthyInterval": "2s",
///         "intervalJitterPercent": 10, "healthyThreshold": 2, "unhealthyThreshold": 3,
///         "httpHealthCheck": {"path": "/healthz"}}"#,
/// )?;
/// assert_eq!(check.unhealthy_interval(), Some(Duration::from_secs(2)));
/// assert_eq!(check.first_check(), Some(Duration::from_secs(2)));
/// assert_eq!(check.healthy_threshold(), Some(2));
/// assert_eq!(check.unhealthy_threshold(), Some(3));
/// assert_eq!(check.notes().len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvoyHealthCheck {
    timeout: Option<Duration>,
    interval: Option<Duration>,
    unhealthy_interval: Option<Duration>,
    unhealthy_edge_interval: Option<Duration>,
    interval_jitter: Option<Duration>,
    interval_jitter_percent: Option<u32>,
    initial_jitter: Option<Duration>,
    healthy_threshold: Option<u32>,
    unhealthy_threshold: Option<u32>,
    no_traffic_interval: Option<Duration>,
    notes: Vec<String>,
}

impl EnvoyHealthCheck {
    /// Reads a `HealthCheck` message from proto3 JSON.
    ///
    /// ```
    /// use tower_outlier_detectors::EnvoyHealthCheck;
    ///
    /// let error = EnvoyHealthCheck::from_json(r#"{"interval": "0s"}"#).unwrap_err();
    /// assert!(error.to_string().contains("`interval`"), "{error}");
    /// ```
    pub fn from_json(text: &str) -> Result<Self, DocumentError> {
        read(text).map_err(|problem| problem.into_error(DOCUMENT))
    }

    /// `timeout`: how long a check may take.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// `interval`: the time between checks.
    pub fn interval(&self) -> Option<Duration> {
        self.interval
    }

    /// The time between checks of an endpoint that fails them: `unhealthy_interval`, or
    /// `interval`.
    pub fn unhealthy_interval(&self) -> Option<Duration> {
        self.unhealthy_interval.or(self.interval)
    }

    /// The first check after an endpoint is taken out: `unhealthy_edge_interval`, or the
    /// [`unhealthy_interval`](Self::unhealthy_interval).
    pub fn first_check(&self) -> Option<Duration> {
        self.unhealthy_edge_interval
            .or_else(|| self.unhealthy_interval())
    }

    /// `interval_jitter`.
    pub fn interval_jitter(&self) -> Option<Duration> {
        self.interval_jitter
    }

    /// `interval_jitter_percent`.
    pub fn interval_jitter_percent(&self) -> Option<u32> {
        self.interval_jitter_percent
    }

    /// `initial_jitter`.
    pub fn initial_jitter(&self) -> Option<Duration> {
        self.initial_jitter
    }

    /// `healthy_threshold`.
    pub fn healthy_threshold(&self) -> Option<u32> {
        self.healthy_threshold
    }

    /// `unhealthy_threshold`.
    pub fn unhealthy_threshold(&self) -> Option<u32> {
        self.unhealthy_threshold
    }

    /// `no_traffic_interval`: the time between checks of an endpoint in service that gets no
    /// traffic.
    pub fn no_traffic_interval(&self) -> Option<Duration> {
        self.no_traffic_interval
    }

    /// A sentence for each field given that has no effect here, naming it and why.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
}

fn read(text: &str) -> Result<EnvoyHealthCheck, Problem> {
    let document = json_reader::parse(text)?;
    let message = json_reader::object(&document, &[], TOP_ALLOWED)?;
    let mut given: Vec<Option<(&str, &Value)>> = vec![None; FIELDS.len()];
    for (key, value) in message {
        let Some(index) = FIELDS
            .iter()
            .position(|(proto, json, _)| key == proto || key == json)
        else {
            return Err(Problem::unknown(child(&[], key), UNKNOWN_HINT));
        };
        if given[index].is_some() {
            let (proto, json, _) = FIELDS[index];
            return Err(Problem::alias(child(&[], proto), json));
        }
        given[index] = Some((key, value));
    }
    let mut check = EnvoyHealthCheck::default();
    for ((proto, _, what), entry) in FIELDS.iter().zip(given) {
        let Some((key, value)) = entry else { continue };
        if value.is_null() {
            continue;
        }
        let path = child(&[], key);
        match *what {
            Use::Positive => {
                let read = millis(value, &path, POSITIVE_ALLOWED)?;
                if read.is_zero() {
                    return Err(Problem::invalid(path, value, POSITIVE_ALLOWED));
                }
                match *proto {
                    "timeout" => check.timeout = Some(read),
                    "interval" => check.interval = Some(read),
                    "unhealthy_interval" => check.unhealthy_interval = Some(read),
                    "no_traffic_interval" => check.no_traffic_interval = Some(read),
                    _ => check.unhealthy_edge_interval = Some(read),
                }
            }
            Use::NonNegative => {
                let read = millis(value, &path, NON_NEGATIVE_ALLOWED)?;
                match *proto {
                    "initial_jitter" => check.initial_jitter = Some(read),
                    _ => check.interval_jitter = Some(read),
                }
            }
            Use::Percent => {
                check.interval_jitter_percent =
                    Some(count(value, &path, super::read::COUNT_ALLOWED, u32::MAX)?);
            }
            Use::Threshold => {
                let read = count(value, &path, THRESHOLD_ALLOWED, u32::MAX)?;
                if read == 0 {
                    return Err(Problem::invalid(path, value, THRESHOLD_ALLOWED));
                }
                match *proto {
                    "unhealthy_threshold" => check.unhealthy_threshold = Some(read),
                    _ => check.healthy_threshold = Some(read),
                }
            }
            Use::Noted(why) => check
                .notes
                .push(format!("`{proto}` has no effect here: {why}")),
        }
    }
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_read_and_the_unhealthy_interval_falls_back_to_the_interval() {
        let proto = EnvoyHealthCheck::from_json(
            r#"{"timeout": "0.25s", "interval": "4s", "initial_jitter": "1s",
                "interval_jitter": "0.1s", "interval_jitter_percent": 15,
                "healthy_threshold": "3"}"#,
        )
        .unwrap();
        let json = EnvoyHealthCheck::from_json(
            r#"{"timeout": "0.25s", "interval": "4s", "initialJitter": "1s",
                "intervalJitter": "0.1s", "intervalJitterPercent": 15,
                "healthyThreshold": 3}"#,
        )
        .unwrap();
        assert_eq!(proto, json);
        assert_eq!(proto.timeout(), Some(Duration::from_millis(250)));
        assert_eq!(proto.unhealthy_interval(), Some(Duration::from_secs(4)));
        assert_eq!(proto.first_check(), Some(Duration::from_secs(4)));
        assert_eq!(proto.initial_jitter(), Some(Duration::from_secs(1)));
        assert_eq!(proto.interval_jitter(), Some(Duration::from_millis(100)));
        assert_eq!(proto.interval_jitter_percent(), Some(15));
        assert_eq!(proto.healthy_threshold(), Some(3));
        assert!(proto.notes().is_empty());
    }

    #[test]
    fn the_edge_and_unhealthy_intervals_win_over_the_interval() {
        let check = EnvoyHealthCheck::from_json(
            r#"{"interval": "10s", "unhealthyInterval": "2s", "unhealthyEdgeInterval": "0.5s"}"#,
        )
        .unwrap();
        assert_eq!(check.interval(), Some(Duration::from_secs(10)));
        assert_eq!(check.unhealthy_interval(), Some(Duration::from_secs(2)));
        assert_eq!(check.first_check(), Some(Duration::from_millis(500)));
    }

    #[test]
    fn fields_without_effect_are_noted_and_null_leaves_a_field_unset() {
        let check = EnvoyHealthCheck::from_json(
            r#"{"interval": null, "unhealthy_threshold": 2, "no_traffic_interval": "60s",
                "healthy_edge_interval": "1s", "no_traffic_healthy_interval": "60s",
                "grpc_health_check": {"service_name": "demo"}}"#,
        )
        .unwrap();
        assert_eq!(check.interval(), None);
        assert_eq!(check.unhealthy_threshold(), Some(2));
        assert_eq!(check.no_traffic_interval(), Some(Duration::from_secs(60)));
        assert_eq!(
            check.notes(),
            [
                format!("`healthy_edge_interval` has no effect here: {NO_HEALTHY_CHECKS}"),
                format!("`no_traffic_healthy_interval` has no effect here: {NO_HEALTHY_CHECKS}"),
                format!("`grpc_health_check` has no effect here: {PROBE_DECIDES}"),
            ]
        );
    }

    #[test]
    fn bad_fields_are_errors_naming_them() {
        for (text, field) in [
            (r#"{"interval": "0s"}"#, "`interval`"),
            (r#"{"timeout": "-1s"}"#, "`timeout`"),
            (r#"{"healthyThreshold": 0}"#, "`healthyThreshold`"),
            (r#"{"unhealthyThreshold": 0}"#, "`unhealthyThreshold`"),
            (r#"{"no_traffic_interval": "0s"}"#, "`no_traffic_interval`"),
            (
                r#"{"intervalJitterPercent": -5}"#,
                "`intervalJitterPercent`",
            ),
            (r#"{"intervall": "1s"}"#, "`intervall`"),
            (r#"{"interval": "1s", "interval": "2s"}"#, "`interval`"),
            (
                r#"{"unhealthy_interval": "1s", "unhealthyInterval": "2s"}"#,
                "unhealthy",
            ),
        ] {
            let error = EnvoyHealthCheck::from_json(text).unwrap_err().to_string();
            assert!(error.contains(field), "{text}: {error}");
            assert!(error.contains("Envoy health_check"), "{text}: {error}");
        }
        assert!(EnvoyHealthCheck::from_json("[1]").is_err());
    }
}
