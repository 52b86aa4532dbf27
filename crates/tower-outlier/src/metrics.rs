//! The layer's decisions as Prometheus metrics, through `prometheus-client` (the client
//! linkerd2-proxy uses: typed metric families in a registry the application owns, encoded in the
//! Prometheus text format with no exporter process of its own).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `outlier_ejections_total` | counter | `policy`, `measure` |
//! | `outlier_ejections_refused_total` | counter | `refusal` (`budget`, `last_endpoint`) |
//! | `outlier_readmissions_total` | counter | `cause` |
//! | `outlier_recoveries_total`, `outlier_trials_failed_total` | counter | — |
//! | `outlier_probes_total` | counter | `result` (`started`, `failed`) |
//! | `outlier_weight_changes_total` | counter | — |
//! | `outlier_rules_total` | counter | `result` (`applied`, `rejected`) |
//! | `outlier_policy_state_changes_total` | counter | `policy`, `to` |
//! | `outlier_endpoints` | gauge | `status` |
//! | `outlier_ejections_active` | gauge | — |
//! | `outlier_endpoint_weight`, `outlier_endpoint_error_rate` | gauge | `endpoint` |
//! | `outlier_endpoint_policy_state` | gauge (1) | `endpoint`, `policy`, `state` |
//! | `outlier_detector_ejections_total` ([`register_detectors`]) | counter | `policy`, `detector`, `result` |
//!
//! Label sets stay bounded under endpoint churn: the counters' labels are policy names,
//! measures, causes and results, never endpoints; the per-endpoint gauges are read from the
//! monitor at each scrape, so an endpoint the upstream removed is gone from the next scrape.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::events::{Event, Refusal};
use crate::monitor::{EndpointStatus, Monitor};

type Labels = Vec<(&'static str, String)>;

/// Registers the metrics of the layer `monitor` watches in an application's `prometheus_client`
/// `registry` (the table in the module's documentation), and keeps them up to date from its
/// events from now on (on the adaptor's task; the per-call path is untouched). Register once per
/// layer; for several layers in one registry, give each a sub-registry
/// (`registry.sub_registry_with_label(("service".into(), "orders".into()))`).
///
/// ```
/// use prometheus_client::registry::Registry;
/// # #[cfg(feature = "ejection")] {
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build().unwrap()));
/// let mut registry = Registry::default();
/// tower_outlier::metrics::register(&mut registry, &layer.monitor());
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains("outlier_ejections_active 0"));
/// # }
/// ```
pub fn register(registry: &mut Registry, monitor: &Monitor) {
    let counters = Arc::new(Counters::default());
    registry.register(
        "outlier_ejections",
        "Endpoints ejected, by the policy and the measure that judged them",
        counters.ejections.clone(),
    );
    registry.register(
        "outlier_ejections_refused",
        "Outliers kept in by the budget or as the last endpoint",
        counters.refused.clone(),
    );
    registry.register(
        "outlier_readmissions",
        "Ejected endpoints re-admitted, by cause",
        counters.readmissions.clone(),
    );
    registry.register(
        "outlier_recoveries",
        "Re-admitted endpoints whose trial passed",
        counters.recoveries.clone(),
    );
    registry.register(
        "outlier_trials_failed",
        "Re-admitted endpoints judged outliers again during their trial",
        counters.trials_failed.clone(),
    );
    registry.register(
        "outlier_probes",
        "Active probes of ejected endpoints, by result",
        counters.probes.clone(),
    );
    registry.register(
        "outlier_weight_changes",
        "Endpoint weights changed by a policy",
        counters.weight_changes.clone(),
    );
    registry.register(
        "outlier_rules",
        "Reconfigurations, by result",
        counters.rules.clone(),
    );
    registry.register(
        "outlier_policy_state_changes",
        "Policy states entered (a breaker's OPEN, CLOSED...), as the layer saw them",
        counters.state_changes.clone(),
    );
    registry.register_collector(Box::new(Live {
        monitor: monitor.clone(),
    }));
    monitor.on_event(move |event| counters.count(event));
}

#[derive(Debug, Default)]
struct Counters {
    ejections: Family<Labels, Counter>,
    refused: Family<Labels, Counter>,
    readmissions: Family<Labels, Counter>,
    recoveries: Counter,
    trials_failed: Counter,
    probes: Family<Labels, Counter>,
    weight_changes: Counter,
    rules: Family<Labels, Counter>,
    state_changes: Family<Labels, Counter>,
}

impl Counters {
    fn count(&self, event: &Event) {
        match event {
            Event::Ejected { reason, .. } => {
                self.ejections
                    .get_or_create(&vec![
                        ("policy", reason.policy.to_string()),
                        ("measure", reason.measure.to_string()),
                    ])
                    .inc();
            }
            Event::EjectionRefused { refusal, .. } => {
                let refusal = match refusal {
                    Refusal::LastEndpoint => "last_endpoint",
                    _ => "budget",
                };
                self.refused
                    .get_or_create(&vec![("refusal", refusal.to_string())])
                    .inc();
            }
            Event::Readmitted { cause, .. } => {
                self.readmissions
                    .get_or_create(&vec![("cause", format!("{cause:?}"))])
                    .inc();
            }
            Event::Recovered { .. } => {
                self.recoveries.inc();
            }
            Event::TrialFailed { .. } => {
                self.trials_failed.inc();
            }
            Event::ProbeStarted { .. } => {
                self.probes
                    .get_or_create(&vec![("result", "started".to_string())])
                    .inc();
            }
            Event::ProbeFailed { .. } => {
                self.probes
                    .get_or_create(&vec![("result", "failed".to_string())])
                    .inc();
            }
            Event::WeightChanged { .. } => {
                self.weight_changes.inc();
            }
            Event::RulesApplied { .. } => {
                self.rules
                    .get_or_create(&vec![("result", "applied".to_string())])
                    .inc();
            }
            Event::RulesRejected { .. } => {
                self.rules
                    .get_or_create(&vec![("result", "rejected".to_string())])
                    .inc();
            }
            Event::PolicyStateChanged { policy, to, .. } => {
                self.state_changes
                    .get_or_create(&vec![
                        ("policy", policy.to_string()),
                        ("to", to.unwrap_or("none").to_string()),
                    ])
                    .inc();
            }
        }
    }
}

/// Registers the counters of a [`DetectorPolicy`](crate::DetectorPolicy) (Envoy's
/// `ejections_detected_*`, `ejections_enforced_*` and overflow, per detector) in `registry`,
/// read from the policy at each scrape as `outlier_detector_ejections_total{policy, detector,
/// result}`, `result` being `detected`, `enforced`, `unenforced` or `overflow`.
#[cfg(feature = "detectors")]
#[cfg_attr(docsrs, doc(cfg(feature = "detectors")))]
pub fn register_detectors(registry: &mut Registry, policy: &crate::DetectorPolicy) {
    registry.register_collector(Box::new(Detectors {
        policy: policy.clone(),
    }));
}

#[cfg(feature = "detectors")]
#[derive(Debug)]
struct Detectors {
    policy: crate::DetectorPolicy,
}

#[cfg(feature = "detectors")]
impl Collector for Detectors {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        use prometheus_client::metrics::counter::ConstCounter;
        use tower_outlier_core::Policy;
        use tower_outlier_detectors::Detector;
        let stats = self.policy.stats();
        let mut metric = encoder.encode_descriptor(
            "outlier_detector_ejections",
            "What each detector found, and what became of it",
            None,
            MetricType::Counter,
        )?;
        for detector in Detector::ALL {
            for (result, value) in [
                ("detected", stats.detected(detector)),
                ("enforced", stats.enforced(detector)),
                ("unenforced", stats.unenforced(detector)),
                ("overflow", stats.overflow(detector)),
            ] {
                let labels = [
                    ("policy", self.policy.name()),
                    ("detector", detector.measure()),
                    ("result", result),
                ];
                ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The gauges read from the monitor at each scrape.
struct Live {
    monitor: Monitor,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let snapshot = self.monitor.snapshot();
        let mut by_status = [0i64; 4];
        for endpoint in &snapshot.endpoints {
            by_status[status_index(endpoint.status)] += 1;
        }
        let mut metric = encoder.encode_descriptor(
            "outlier_endpoints",
            "Endpoints the upstream holds, by status",
            None,
            MetricType::Gauge,
        )?;
        for (status, count) in ["available", "trial", "ejected", "probing"]
            .into_iter()
            .zip(by_status)
        {
            let labels = [("status", status)];
            ConstGauge::new(count).encode(metric.encode_family(&labels)?)?;
        }
        let active = ConstGauge::new(snapshot.ejected() as i64);
        active.encode(encoder.encode_descriptor(
            "outlier_ejections_active",
            "Endpoints out of the balancer's set now",
            None,
            active.metric_type(),
        )?)?;
        let mut weights = encoder.encode_descriptor(
            "outlier_endpoint_weight",
            "Each endpoint's weight relative to its original (1 = full)",
            None,
            MetricType::Gauge,
        )?;
        let names: Vec<String> = snapshot
            .endpoints
            .iter()
            .map(|e| label_value(e.key.as_str()))
            .collect();
        for (endpoint, name) in snapshot.endpoints.iter().zip(&names) {
            let labels = [("endpoint", name.as_str())];
            ConstGauge::new(endpoint.weight).encode(weights.encode_family(&labels)?)?;
        }
        let mut rates = encoder.encode_descriptor(
            "outlier_endpoint_error_rate",
            "Each endpoint's failure rate in its first policy's window",
            None,
            MetricType::Gauge,
        )?;
        for (endpoint, name) in snapshot.endpoints.iter().zip(&names) {
            let labels = [("endpoint", name.as_str())];
            ConstGauge::new(endpoint.error_rate).encode(rates.encode_family(&labels)?)?;
        }
        let mut states = encoder.encode_descriptor(
            "outlier_endpoint_policy_state",
            "The state a policy holds each endpoint in (1 for the current one): a slow-call \
             breaker's CLOSED, OPEN or HALF_OPEN, linkerd's OPEN, SHUT or PROBATION",
            None,
            MetricType::Gauge,
        )?;
        for (endpoint, name) in snapshot.endpoints.iter().zip(&names) {
            for window in &endpoint.windows {
                if let Some(state) = window.state {
                    let labels = [
                        ("endpoint", name.as_str()),
                        ("policy", window.policy),
                        ("state", state),
                    ];
                    ConstGauge::new(1i64).encode(states.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

/// A label value as the text format needs it: the encoder writes values as they are, and a key's
/// text (a `String` key prints with its quotes) may hold `"`, `\` or a line break.
fn label_value(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

fn status_index(status: EndpointStatus) -> usize {
    match status {
        EndpointStatus::Available => 0,
        EndpointStatus::Trial => 1,
        EndpointStatus::Ejected => 2,
        EndpointStatus::Probing => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::label_value;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("10.0.0.7:8080"), "10.0.0.7:8080");
        assert_eq!(label_value("\"plain\""), "\\\"plain\\\"");
        assert_eq!(label_value("a\\b\nc"), "a\\\\b\\nc");
    }
}
