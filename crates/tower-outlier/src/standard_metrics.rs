//! The layer's ejections as gRPC's standard outlier-detection metrics (gRFC A91), and the
//! endpoints' connections as its subchannel metrics (gRFC A94), through the
//! [`metrics`] facade: whatever recorder the application installs (Prometheus, an
//! OpenTelemetry bridge, StatsD) receives them under the names gRPC libraries export, so one
//! dashboard covers tower clients and gRPC's own.
//!
//! | metric | labels |
//! |---|---|
//! | `grpc.lb.outlier_detection.ejections_enforced` | `grpc.target`, `grpc.lb.outlier_detection.detection_method` |
//! | `grpc.lb.outlier_detection.ejections_unenforced` | `grpc.target`, `grpc.lb.outlier_detection.detection_method`, `grpc.lb.outlier_detection.unenforced_reason` |
//! | `grpc.subchannel.connection_attempts_succeeded`, `grpc.subchannel.connection_attempts_failed` | `grpc.target` |
//! | `grpc.subchannel.disconnections` | `grpc.target`, `grpc.disconnect_error` |
//! | `grpc.subchannel.open_connections` (a gauge) | `grpc.target` |
//!
//! * `grpc.target` is the name given to [`watch`] (gRPC uses the channel's target URI); for the
//!   connection metrics (gRFC A94's, recorded by every
//!   [`ConnectionWatch`](crate::connection::ConnectionWatch) as its connections open and end,
//!   with no `watch` needed), the name given to
//!   [`ConnectionWatch::named`](crate::connection::ConnectionWatch::named), or the first address
//!   it connected to.
//! * `grpc.disconnect_error` is one of
//!   [`connection::DISCONNECT_REASONS`](crate::connection::DISCONNECT_REASONS).
//! * `grpc.subchannel.open_connections` moves by one as each connection opens and ends: install
//!   the recorder before the first connection (a connection opened before ends as −1).
//! * `detection_method` is A91's `success_rate` and `failure_percentage` for those detectors, and,
//!   for what gRPC does not have, the judging measure in the same spelling:
//!   `consecutive_5xx`, `consecutive_gateway_failure`, `consecutive_local_origin_failure`,
//!   `local_origin_success_rate`, `local_origin_failure_percentage` (Envoy's detectors, and
//!   linkerd's and the recommended configuration's consecutive failures as `consecutive_5xx`),
//!   `error_rate` (EDAS / HSF), `slow_call_ratio`, `error_ratio`, `error_count` (a Sentinel
//!   breaker's strategies), `failed_probe`, `host_ejected` (a host ejected in a service sharing
//!   hosts), and `other` for a policy of your own.
//! * `unenforced_reason` is A91's `max_ejection_overflow` for an ejection the budget refused, and
//!   `last_endpoint` (not in A91: gRPC has no such rule) for one refused because the endpoint was
//!   the balancer's last. A detection let go by an Envoy or gRPC enforcement percentage (A91's
//!   `enforcement_percentage`) reaches no event; `metrics::OutlierMetrics::watch_detectors` (the
//!   Prometheus module) counts those.
//!
//! Both counters are registered at 0 for A91's two detection methods (and, unenforced, both
//! refusal reasons) as soon as a layer is watched, so that an alert on their rate sees 0 rather
//! than no data; other methods appear with their first event. Counting runs in
//! the layer's event callback, on its adaptor's task, never on the per-call path.
//!
//! ```
//! use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
//!
//! // With a recorder installed (`metrics::set_global_recorder`, or an exporter crate's
//! // `install()`), the layer's ejections are counted under A91's names.
//! let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?));
//! let _watching = tower_outlier::standard_metrics::watch("dns:///orders.internal:50051", &layer.monitor());
//! # Ok::<(), tower_outlier::ConfigError>(())
//! ```

use metrics::{counter, describe_counter, Unit};

use crate::event::{is_outlier_judgement, Event, Refusal};
use crate::monitor::EventCallback;
use crate::monitor::Monitor;

/// A91's counter of ejections made.
pub const EJECTIONS_ENFORCED: &str = "grpc.lb.outlier_detection.ejections_enforced";
/// A91's counter of ejections detected and not made.
pub const EJECTIONS_UNENFORCED: &str = "grpc.lb.outlier_detection.ejections_unenforced";
/// The label naming the channel (here: the name given to [`watch`]).
pub const TARGET: &str = "grpc.target";
/// The label naming what judged the endpoint.
pub const DETECTION_METHOD: &str = "grpc.lb.outlier_detection.detection_method";
/// The label naming why a detection was not enforced.
pub const UNENFORCED_REASON: &str = "grpc.lb.outlier_detection.unenforced_reason";

/// Counts the ejections of the layer `monitor` watches under `target`, as A91's metrics, through
/// the recorder installed in the [`metrics`] facade when each event happens. Returns the event
/// callback: [`EventCallback::unsubscribe`] stops the counting (dropping it keeps it).
pub fn watch(target: &str, monitor: &Monitor) -> EventCallback {
    describe_counter!(
        EJECTIONS_ENFORCED,
        Unit::Count,
        "EXPERIMENTAL. Number of outlier ejections enforced by detection method"
    );
    describe_counter!(
        EJECTIONS_UNENFORCED,
        Unit::Count,
        "EXPERIMENTAL. Number of unenforced outlier ejections due to either max ejection percentage or enforcement_percentage"
    );
    let target = target.to_owned();
    for method in ["success_rate", "failure_percentage"] {
        counter!(EJECTIONS_ENFORCED, TARGET => target.clone(), DETECTION_METHOD => method)
            .increment(0);
        for reason in ["max_ejection_overflow", "last_endpoint"] {
            counter!(
                EJECTIONS_UNENFORCED,
                TARGET => target.clone(),
                DETECTION_METHOD => method,
                UNENFORCED_REASON => reason
            )
            .increment(0);
        }
    }
    monitor.on_event(move |event| match event {
        // An operator's force-out, a server's pushback or a health service's NOT_SERVING is no
        // outlier ejection (A91 counts the detectors').
        Event::Ejected { reason, .. } if is_outlier_judgement(reason) => {
            counter!(
                EJECTIONS_ENFORCED,
                TARGET => target.clone(),
                DETECTION_METHOD => detection_method(reason.measure)
            )
            .increment(1);
        }
        Event::EjectionRefused {
            reason, refusal, ..
        } if is_outlier_judgement(reason) => {
            let why = match refusal {
                Refusal::Budget => "max_ejection_overflow",
                Refusal::LastEndpoint => "last_endpoint",
                Refusal::ForcedIn => "forced_in",
            };
            counter!(
                EJECTIONS_UNENFORCED,
                TARGET => target.clone(),
                DETECTION_METHOD => detection_method(reason.measure),
                UNENFORCED_REASON => why
            )
            .increment(1);
        }
        // Dry run's ejections were detected and not enforced.
        Event::DryRun(inner) => {
            if let Event::Ejected { reason, .. } = &**inner {
                if !is_outlier_judgement(reason) {
                    return;
                }
                counter!(
                    EJECTIONS_UNENFORCED,
                    TARGET => target.clone(),
                    DETECTION_METHOD => detection_method(reason.measure),
                    UNENFORCED_REASON => "dry_run"
                )
                .increment(1);
            }
        }
        _ => {}
    })
}

/// A94's counter of connection attempts that succeeded.
pub const CONNECTION_ATTEMPTS_SUCCEEDED: &str = "grpc.subchannel.connection_attempts_succeeded";
/// A94's counter of connection attempts that failed.
pub const CONNECTION_ATTEMPTS_FAILED: &str = "grpc.subchannel.connection_attempts_failed";
/// A94's counter of connections that ended, by `grpc.disconnect_error`.
pub const DISCONNECTIONS: &str = "grpc.subchannel.disconnections";
/// A94's up-down counter of connections open (a gauge here).
pub const OPEN_CONNECTIONS: &str = "grpc.subchannel.open_connections";
/// A94's label naming why a connection ended (one of
/// [`connection::DISCONNECT_REASONS`](crate::connection::DISCONNECT_REASONS)).
pub const DISCONNECT_ERROR: &str = "grpc.disconnect_error";

/// A connection attempt of a [`ConnectionWatch`](crate::connection::ConnectionWatch) ended:
/// A94's attempt counters and open connections, under `grpc.target` = `target`. On the connect
/// path, never per call.
pub(crate) fn connection_attempted(target: &str, connected: bool) {
    let target = target.to_owned();
    if connected {
        counter!(CONNECTION_ATTEMPTS_SUCCEEDED, TARGET => target.clone()).increment(1);
        metrics::gauge!(OPEN_CONNECTIONS, TARGET => target).increment(1.0);
    } else {
        counter!(CONNECTION_ATTEMPTS_FAILED, TARGET => target).increment(1);
    }
}

/// A watched connection ended, for `reason` (`None`: it is no longer watched, and no
/// disconnection is counted).
pub(crate) fn connection_ended(target: &str, reason: Option<&'static str>) {
    let target = target.to_owned();
    metrics::gauge!(OPEN_CONNECTIONS, TARGET => target.clone()).decrement(1.0);
    if let Some(reason) = reason {
        counter!(DISCONNECTIONS, TARGET => target, DISCONNECT_ERROR => reason).increment(1);
    }
}

/// A91's `detection_method` for the measure that judged, in A91's spelling for what gRPC has.
pub fn detection_method(measure: &str) -> &'static str {
    match measure {
        "success rate" => "success_rate",
        "failure percentage" => "failure_percentage",
        // linkerd's and the recommended configuration's streak (and Finagle's) count every
        // failure, as A50's would-be consecutive detector would.
        "consecutive 5xx" | "consecutive failures" => "consecutive_5xx",
        "consecutive gateway failures" => "consecutive_gateway_failure",
        "consecutive local-origin failures" => "consecutive_local_origin_failure",
        "local-origin success rate" => "local_origin_success_rate",
        "local-origin failure percentage" => "local_origin_failure_percentage",
        "error rate" => "error_rate",
        "slow-call ratio" => "slow_call_ratio",
        "error ratio" => "error_ratio",
        "error count" => "error_count",
        // linkerd's first request after its back-off failed.
        "failed probation request" => "failed_probe",
        "host ejected in another service" => "host_ejected",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::detection_method;

    #[test]
    fn measures_map_to_a91_spellings() {
        assert_eq!(detection_method("success rate"), "success_rate");
        assert_eq!(detection_method("failure percentage"), "failure_percentage");
        assert_eq!(detection_method("consecutive 5xx"), "consecutive_5xx");
        assert_eq!(detection_method("consecutive failures"), "consecutive_5xx");
        assert_eq!(detection_method("error rate"), "error_rate");
        assert_eq!(detection_method("slow-call ratio"), "slow_call_ratio");
        assert_eq!(detection_method("something of mine"), "other");
    }
}
