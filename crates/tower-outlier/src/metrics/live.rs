//! The gauges, read from the monitor's snapshot when Prometheus scrapes.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use tower_outlier_core::Lock;

use super::*;

/// How a per-endpoint gauge reads its value from a snapshot.
type EndpointGauge = fn(&crate::EndpointSnapshot) -> f64;

/// The gauges read from the monitors at each scrape.
pub(super) struct Live {
    pub(super) watched: Arc<Lock<Watched>>,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

/// One watched layer's snapshot, with its label values as owned text.
struct Scraped {
    service: String,
    snapshot: crate::Snapshot,
    // Each endpoint's key as text, `None` for a key already seen (two adaptors of one layer).
    names: Vec<Option<String>>,
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let watched = self.watched.lock();
        let layers: Vec<Scraped> = watched
            .layers
            .iter()
            .map(|(service, monitor)| {
                let snapshot = monitor.snapshot();
                let mut seen = std::collections::HashSet::new();
                let names = snapshot
                    .endpoints
                    .iter()
                    .map(|e| {
                        seen.insert(e.key.as_str())
                            .then(|| String::from(e.key.as_str()))
                    })
                    .collect();
                Scraped {
                    service: String::from(service),
                    snapshot,
                    names,
                }
            })
            .collect();
        #[cfg(feature = "detectors")]
        let detectors = watched.detectors.clone();
        drop(watched);

        let mut metric = encoder.encode_descriptor(
            "outlier_endpoints",
            "Endpoints the upstream holds, by status",
            None,
            MetricType::Gauge,
        )?;
        for layer in &layers {
            let mut by_status = [0i64; 5];
            for endpoint in &layer.snapshot.endpoints {
                by_status[status_index(endpoint.status)] += 1;
            }
            for (status, count) in ["available", "trial", "ejected", "probing", "unready"]
                .into_iter()
                .zip(by_status)
            {
                let labels = [("upstream", layer.service.as_str()), ("status", status)];
                ConstGauge::new(count).encode(metric.encode_family(&labels)?)?;
            }
        }
        let mut active = encoder.encode_descriptor(
            "outlier_ejections_active",
            "Endpoints out of the balancer's set now",
            None,
            MetricType::Gauge,
        )?;
        for layer in &layers {
            let labels = [("upstream", layer.service.as_str())];
            ConstGauge::new(layer.snapshot.ejected() as i64)
                .encode(active.encode_family(&labels)?)?;
        }
        let mut avoided = encoder.encode_descriptor(
            "outlier_endpoints_avoided",
            "Endpoints in the balancer's set that it routes around: their last call failed a second ago or more, none since, and no policy judged them",
            None,
            MetricType::Gauge,
        )?;
        for layer in &layers {
            let labels = [("upstream", layer.service.as_str())];
            let count = layer
                .snapshot
                .endpoints
                .iter()
                .filter(|e| e.avoided_for.is_some())
                .count();
            ConstGauge::new(count as i64).encode(avoided.encode_family(&labels)?)?;
        }
        let gauges: [(&str, &str, EndpointGauge); 2] = [
            (
                "outlier_endpoint_weight",
                "Each endpoint's weight relative to its original (1 = full)",
                |e| e.weight,
            ),
            (
                "outlier_endpoint_error_rate",
                "Each endpoint's failure rate in its first policy's window",
                |e| e.error_rate,
            ),
        ];
        for (name, help, value) in gauges {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for layer in &layers {
                for (endpoint, key) in layer.snapshot.endpoints.iter().zip(&layer.names) {
                    let Some(key) = key else { continue };
                    let labels = [
                        ("upstream", layer.service.as_str()),
                        ("upstream_endpoint", key.as_str()),
                    ];
                    ConstGauge::new(value(endpoint)).encode(metric.encode_family(&labels)?)?;
                }
            }
        }
        let mut states = encoder.encode_descriptor(
            "outlier_endpoint_policy_state",
            "The state a policy holds each endpoint in (1 for the current one): a slow-call \
             breaker's (slow-call, or linkerd's probe gate) CLOSED (calls pass), OPEN (calls held) or HALF_OPEN (a probe passes)",
            None,
            MetricType::Gauge,
        )?;
        for layer in &layers {
            for (endpoint, key) in layer.snapshot.endpoints.iter().zip(&layer.names) {
                let Some(key) = key else { continue };
                for window in &endpoint.windows {
                    if let Some(state) = window.state {
                        let (policy, state) = (String::from(window.policy), String::from(state));
                        let labels = [
                            ("upstream", layer.service.as_str()),
                            ("upstream_endpoint", key.as_str()),
                            ("policy", policy.as_str()),
                            ("state", state.as_str()),
                        ];
                        ConstGauge::new(1i64).encode(states.encode_family(&labels)?)?;
                    }
                }
            }
        }
        #[cfg(feature = "detectors")]
        encode_detectors(&mut encoder, &detectors)?;
        Ok(())
    }
}

#[cfg(feature = "detectors")]
fn encode_detectors(
    encoder: &mut DescriptorEncoder,
    detectors: &[(String, crate::DetectorPolicy)],
) -> Result<(), fmt::Error> {
    use prometheus_client::metrics::counter::ConstCounter;
    use tower_outlier_core::OutlierPolicy;
    use tower_outlier_detectors::Detector;
    if detectors.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(
        "outlier_detector_ejections",
        "What each detector found, and what became of it",
        None,
        MetricType::Counter,
    )?;
    for (service, policy) in detectors {
        let stats = policy.stats();
        let service = String::from(service);
        for detector in Detector::ALL {
            for (result, value) in [
                ("detected", stats.detected(detector)),
                ("enforced", stats.enforced(detector)),
                ("unenforced", stats.unenforced(detector)),
                ("overflow", stats.overflow(detector)),
            ] {
                let labels = [
                    ("upstream", service.as_str()),
                    ("policy", policy.name()),
                    ("detector", policy.config().measure(detector)),
                    ("result", result),
                ];
                ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}
