//! The fields of `envoy.config.cluster.v3.OutlierDetection` (Envoy's
//! `api/envoy/config/cluster/v3/outlier_detection.proto`, fields 1 to 25), their two JSON
//! spellings, and the builder setting each feeds.

use std::time::Duration;

use crate::config::DetectorBuilder;

/// How a field's value is read and applied.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    /// A `google.protobuf.UInt32Value` without bounds.
    Count(fn(DetectorBuilder, u32) -> DetectorBuilder),
    /// A `UInt32Value` with `lte: 100`.
    Percent(fn(DetectorBuilder, u32) -> DetectorBuilder),
    /// A `google.protobuf.Duration` with `gt: {}`.
    Positive(fn(DetectorBuilder, Duration) -> DetectorBuilder),
    /// A `Duration` without bounds of its own (Envoy still rejects negative durations).
    NonNegative(fn(DetectorBuilder, Duration) -> DetectorBuilder),
    /// A `bool` or `google.protobuf.BoolValue`.
    Flag(fn(DetectorBuilder, bool) -> DetectorBuilder),
    /// A `BoolValue` read and dropped: it only matters with active health checking.
    UnusedFlag,
    /// `repeated core.v3.TypedExtensionConfig monitors`, which Envoy does not implement.
    Monitors,
}

/// One field: its proto name, its lowerCamelCase JSON name and its kind.
#[derive(Clone, Copy)]
pub(super) struct Spec {
    pub(super) proto: &'static str,
    pub(super) json: &'static str,
    pub(super) kind: Kind,
}

impl Spec {
    /// The position in [`FIELDS`] of the field whose proto or JSON name is `key` (names are
    /// case-sensitive, as in protobuf).
    pub(super) fn position(key: &str) -> Option<usize> {
        FIELDS
            .iter()
            .position(|spec| spec.proto == key || spec.json == key)
    }
}

pub(super) const BASE_EJECTION_TIME: &str = "base_ejection_time";
pub(super) const MAX_EJECTION_TIME: &str = "max_ejection_time";

const fn spec(proto: &'static str, json: &'static str, kind: Kind) -> Spec {
    Spec { proto, json, kind }
}

/// Every field, in field-number order, which is the order values are checked in.
pub(super) const FIELDS: [Spec; 25] = [
    spec(
        "consecutive_5xx",
        "consecutive5xx",
        Kind::Count(DetectorBuilder::consecutive_5xx),
    ),
    spec(
        "interval",
        "interval",
        Kind::Positive(DetectorBuilder::interval),
    ),
    spec(
        BASE_EJECTION_TIME,
        "baseEjectionTime",
        Kind::Positive(DetectorBuilder::base_ejection_time),
    ),
    spec(
        "max_ejection_percent",
        "maxEjectionPercent",
        Kind::Percent(DetectorBuilder::max_ejection_percent),
    ),
    spec(
        "enforcing_consecutive_5xx",
        "enforcingConsecutive5xx",
        Kind::Percent(DetectorBuilder::enforcing_consecutive_5xx),
    ),
    spec(
        "enforcing_success_rate",
        "enforcingSuccessRate",
        Kind::Percent(DetectorBuilder::enforcing_success_rate),
    ),
    spec(
        "success_rate_minimum_hosts",
        "successRateMinimumHosts",
        Kind::Count(DetectorBuilder::success_rate_minimum_hosts),
    ),
    spec(
        "success_rate_request_volume",
        "successRateRequestVolume",
        Kind::Count(DetectorBuilder::success_rate_request_volume),
    ),
    spec(
        "success_rate_stdev_factor",
        "successRateStdevFactor",
        Kind::Count(DetectorBuilder::success_rate_stdev_factor),
    ),
    spec(
        "consecutive_gateway_failure",
        "consecutiveGatewayFailure",
        Kind::Count(DetectorBuilder::consecutive_gateway_failure),
    ),
    spec(
        "enforcing_consecutive_gateway_failure",
        "enforcingConsecutiveGatewayFailure",
        Kind::Percent(DetectorBuilder::enforcing_consecutive_gateway_failure),
    ),
    spec(
        "split_external_local_origin_errors",
        "splitExternalLocalOriginErrors",
        Kind::Flag(DetectorBuilder::split_external_local_origin_errors),
    ),
    spec(
        "consecutive_local_origin_failure",
        "consecutiveLocalOriginFailure",
        Kind::Count(DetectorBuilder::consecutive_local_origin_failure),
    ),
    spec(
        "enforcing_consecutive_local_origin_failure",
        "enforcingConsecutiveLocalOriginFailure",
        Kind::Percent(DetectorBuilder::enforcing_consecutive_local_origin_failure),
    ),
    spec(
        "enforcing_local_origin_success_rate",
        "enforcingLocalOriginSuccessRate",
        Kind::Percent(DetectorBuilder::enforcing_local_origin_success_rate),
    ),
    spec(
        "failure_percentage_threshold",
        "failurePercentageThreshold",
        Kind::Percent(DetectorBuilder::failure_percentage_threshold),
    ),
    spec(
        "enforcing_failure_percentage",
        "enforcingFailurePercentage",
        Kind::Percent(DetectorBuilder::enforcing_failure_percentage),
    ),
    spec(
        "enforcing_failure_percentage_local_origin",
        "enforcingFailurePercentageLocalOrigin",
        Kind::Percent(DetectorBuilder::enforcing_failure_percentage_local_origin),
    ),
    spec(
        "failure_percentage_minimum_hosts",
        "failurePercentageMinimumHosts",
        Kind::Count(DetectorBuilder::failure_percentage_minimum_hosts),
    ),
    spec(
        "failure_percentage_request_volume",
        "failurePercentageRequestVolume",
        Kind::Count(DetectorBuilder::failure_percentage_request_volume),
    ),
    spec(
        MAX_EJECTION_TIME,
        "maxEjectionTime",
        Kind::Positive(DetectorBuilder::max_ejection_time),
    ),
    spec(
        "max_ejection_time_jitter",
        "maxEjectionTimeJitter",
        Kind::NonNegative(DetectorBuilder::max_ejection_time_jitter),
    ),
    spec(
        "successful_active_health_check_uneject_host",
        "successfulActiveHealthCheckUnejectHost",
        Kind::UnusedFlag,
    ),
    spec("monitors", "monitors", Kind::Monitors),
    spec(
        "always_eject_one_host",
        "alwaysEjectOneHost",
        Kind::Flag(DetectorBuilder::always_eject_one_host),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// protobuf's JSON name: each `_` dropped and the next character upper-cased (a digit stays
    /// a digit, so `consecutive_5xx` is `consecutive5xx`).
    fn lower_camel(proto: &str) -> String {
        let mut json = String::new();
        let mut upper = false;
        for c in proto.chars() {
            if c == '_' {
                upper = true;
            } else if upper {
                json.extend(c.to_uppercase());
                upper = false;
            } else {
                json.push(c);
            }
        }
        json
    }

    #[test]
    fn json_names_are_protobufs() {
        for spec in &FIELDS {
            assert_eq!(spec.json, lower_camel(spec.proto), "{}", spec.proto);
        }
        let mut names: Vec<&str> = FIELDS.iter().flat_map(|s| [s.proto, s.json]).collect();
        names.sort_unstable();
        names.dedup();
        // interval and monitors are spelt the same both ways.
        assert_eq!(names.len(), 2 * FIELDS.len() - 2);
    }
}
