//! The layer's decisions as Prometheus metrics, through `prometheus-client` (the client
//! linkerd2-proxy uses: typed metric families in a registry the application owns, encoded in the
//! Prometheus text format with no exporter process of its own).
//!
//! Every series has an `upstream` label: one [`OutlierMetrics`] per registry watches any number
//! of layers ([`OutlierMetrics::watch`]), each under the name of the upstream service it balances.
//! The per-endpoint gauges add `upstream_endpoint`. Neither is a label Prometheus attaches to a
//! scraped target (`job`, `instance`, and `service`, `endpoint`, `pod`, `namespace` from
//! Kubernetes service discovery), which would rename ours to `exported_*` or overwrite them.
//!
//! | metric | type | labels (besides `upstream`) |
//! |---|---|---|
//! | `outlier_ejections_total` | counter | `policy`, `measure` |
//! | `outlier_ejections_refused_total` | counter | `refusal` (`budget`, `last_endpoint`) |
//! | `outlier_readmissions_total` | counter | `cause` |
//! | `outlier_recoveries_total`, `outlier_trials_failed_total` | counter | — |
//! | `outlier_probes_total` | counter | `result` (`started`, `failed`, `succeeded`) |
//! | `outlier_weight_changes_total` | counter | — |
//! | `outlier_rules_total` | counter | `result` (`applied`, `rejected`) |
//! | `outlier_policy_state_changes_total` | counter | `policy`, `to` |
//! | `outlier_removals_total` | counter | `status` (where the endpoint stood) |
//! | `outlier_connection_attempts_total` ([`OutlierMetrics::watch_connections`]) | counter | `result` (`succeeded`, `failed`) |
//! | `outlier_disconnections_total` ([`OutlierMetrics::watch_connections`]) | counter | `reason` ([`DISCONNECT_REASONS`](crate::connection::DISCONNECT_REASONS)) |
//! | `outlier_connections_open` ([`OutlierMetrics::watch_connections`]) | gauge | — |
//! | `outlier_endpoints` | gauge | `status` (`unready` is linkerd's `pending`: in the set, its service not ready) |
//! | `outlier_ejections_active` | gauge | — |
//! | `outlier_endpoints_avoided` | gauge | — (in the set, failing, routed around: [`EndpointSnapshot::avoided_for`](crate::EndpointSnapshot::avoided_for)) |
//! | `outlier_endpoint_weight`, `outlier_endpoint_error_rate` | gauge | `upstream_endpoint` |
//! | `outlier_endpoint_policy_state` | gauge (1) | `upstream_endpoint`, `policy`, `state` |
//! | `outlier_detector_ejections_total` ([`OutlierMetrics::watch_detectors`]) | counter | `policy`, `detector`, `result` |
//!
//! # The same figures in Envoy's and gRPC's names
//!
//! For dashboards and alerts written against Envoy's cluster statistics
//! (`cluster.<name>.outlier_detection.*`) or gRPC's outlier-detection metrics (gRFC A91,
//! `grpc.lb.outlier_detection.*`, exported through OpenTelemetry by gRPC libraries):
//!
//! | Envoy | gRPC A91 | here |
//! |---|---|---|
//! | `ejections_active` | — | `outlier_ejections_active` |
//! | `ejections_enforced_total` | `grpc.lb.outlier_detection.ejections_enforced` | `outlier_ejections_total` (every policy); per Envoy detector `outlier_detector_ejections_total{result="enforced"}` |
//! | `ejections_enforced_consecutive_5xx`, `_success_rate`, `_failure_percentage`, … | `ejections_enforced{grpc.lb.outlier_detection.detection_method}` (`success_rate`, `failure_percentage`) | `outlier_detector_ejections_total{detector, result="enforced"}` |
//! | `ejections_detected_*` | — | `outlier_detector_ejections_total{detector, result="detected"}` |
//! | `ejections_overflow` | `grpc.lb.outlier_detection.ejections_unenforced{grpc.lb.outlier_detection.unenforced_reason="max_ejection_overflow"}` | `outlier_ejections_refused_total{refusal="budget"}`; per detector `outlier_detector_ejections_total{result="overflow"}` |
//! | (an ejection below `enforcing_*`'s dice) | `ejections_unenforced{unenforced_reason="enforcement_percentage"}` | `outlier_detector_ejections_total{result="unenforced"}` |
//! | — (Envoy never ejects its last host only through the overflow rule) | — | `outlier_ejections_refused_total{refusal="last_endpoint"}` |
//! | `cluster.<name>` | `grpc.target` | `upstream` |
//!
//! Every counter but `outlier_ejections_total` and `outlier_policy_state_changes_total` is
//! exported at 0 for each of its label values from the moment a layer is watched, so an alert on
//! its rate reads 0 rather than no data; those two are labelled with what a policy names when it
//! reports (its measure, its state) and appear with their first event.
//!
//! Label sets stay bounded under endpoint churn: the counters' labels are policy names,
//! measures, causes and results, never endpoints; the per-endpoint gauges are read from the
//! monitor at each scrape, so an endpoint the upstream removed is gone from the next scrape (and
//! an endpoint two adaptors of one layer share a key with is shown once). Label values are
//! escaped for the text format by prometheus-client.

use std::fmt;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tower_outlier_core::Lock;

use crate::controls::OperatorAction;
use crate::event::{Event, Readmission, Refusal};
use crate::monitor::{EndpointStatus, Monitor};

/// The `prometheus_client` this module is built on, so that a registry passed to
/// [`OutlierMetrics::register`] or [`register`] is of the same crate version without a matching
/// line in your own `Cargo.toml`.
pub use prometheus_client;

type Labels = Vec<(&'static str, String)>;

/// The outlier metrics of one `prometheus_client` registry: register once
/// ([`register`](Self::register)), then [`watch`](Self::watch) each layer's [`Monitor`] under a
/// service name. Counters follow the layers' events (on their adaptors' tasks; the per-call path
/// is untouched); gauges are read from the monitors at each scrape.
///
/// ```
/// use prometheus_client::registry::Registry;
/// use tower_outlier::metrics::OutlierMetrics;
/// # #[cfg(feature = "error-rate")] {
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// let orders = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build().unwrap()));
/// let payments = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build().unwrap()));
/// let mut registry = Registry::default();
/// let metrics = OutlierMetrics::register(&mut registry);
/// metrics.watch("orders", &orders.monitor());
/// metrics.watch("payments", &payments.monitor());
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains(r#"outlier_ejections_active{upstream="payments"} 0"#));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct OutlierMetrics {
    counters: Arc<Counters>,
    watched: Arc<Lock<Watched>>,
}

#[derive(Default)]
struct Watched {
    layers: Vec<(String, Monitor)>,
    #[cfg(feature = "detectors")]
    detectors: Vec<(String, crate::DetectorPolicy)>,
}

impl fmt::Debug for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

impl OutlierMetrics {
    /// Registers the metric families (the table in the module's documentation) in `registry`.
    /// Once per registry: the names would repeat otherwise.
    pub fn register(registry: &mut Registry) -> Self {
        let counters = Arc::new(Counters::default());
        for (name, help, family) in [
            (
                "outlier_ejections",
                "Endpoints ejected, by the policy and the measure that judged them",
                &counters.ejections,
            ),
            (
                "outlier_ejections_refused",
                "Outliers kept in by the budget or as the last endpoint",
                &counters.refused,
            ),
            (
                "outlier_would_eject",
                "Ejections a policy in dry run would have made, by the policy and the measure",
                &counters.would_eject,
            ),
            (
                "outlier_operator_actions",
                "Operator overrides and back-off resets that took effect, by action",
                &counters.operator,
            ),
            (
                "outlier_readmissions",
                "Ejected endpoints re-admitted, by cause",
                &counters.readmissions,
            ),
            (
                "outlier_recoveries",
                "Re-admitted endpoints whose trial passed",
                &counters.recoveries,
            ),
            (
                "outlier_trials_failed",
                "Re-admitted endpoints judged outliers again during their trial",
                &counters.trials_failed,
            ),
            (
                "outlier_probes",
                "Active probes of ejected endpoints, by result",
                &counters.probes,
            ),
            (
                "outlier_weight_changes",
                "Endpoint weights changed by a policy",
                &counters.weight_changes,
            ),
            (
                "outlier_rules",
                "Reconfigurations, by result",
                &counters.rules,
            ),
            (
                "outlier_policy_state_changes",
                "Policy states entered (a breaker's OPEN, CLOSED...), as the layer saw them",
                &counters.state_changes,
            ),
            (
                "outlier_removals",
                "Endpoints the upstream removed, by where they stood",
                &counters.removals,
            ),
            (
                "outlier_connection_attempts",
                "Attempts to connect to the endpoints, by result (gRFC A94's grpc.subchannel.connection_attempts_*)",
                &counters.connection_attempts,
            ),
            (
                "outlier_disconnections",
                "Connections to the endpoints that ended, by reason (gRFC A94's grpc.subchannel.disconnections)",
                &counters.disconnections,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "outlier_connections_open",
            "Connections to the endpoints open now (gRFC A94's grpc.subchannel.open_connections)",
            counters.connections_open.clone(),
        );
        let watched = Arc::new(Lock::new(Watched::default()));
        registry.register_collector(Box::new(Live {
            watched: watched.clone(),
        }));
        OutlierMetrics { counters, watched }
    }

    /// Counts the events of the layer `monitor` watches, and reads its gauges at each scrape,
    /// under `upstream="<service>"`.
    pub fn watch(&self, service: &str, monitor: &Monitor) {
        let mut watched = self.watched.lock();
        if let Some((already, _)) = watched.layers.iter().find(|(_, m)| m.same_as(monitor)) {
            // Counted twice, every event would be: the first name stays.
            tracing::warn!(
                target: "tower_outlier",
                service,
                already = already.as_str(),
                "this layer's monitor is already watched; the second watch is ignored"
            );
            return;
        }
        watched.layers.push((service.to_owned(), monitor.clone()));
        drop(watched);
        self.counters.start_at_zero(service);
        let (counters, service) = (self.counters.clone(), String::from(service));
        let _ = monitor.on_event(move |event| counters.count(&service, event));
    }

    /// Counts the connections of an endpoint's [`ConnectionWatch`](crate::connection::ConnectionWatch)
    /// under `upstream="<service>"` (gRFC A94's subchannel metrics, summed over the endpoints
    /// watched under one service): `outlier_connection_attempts_total{result}` (`succeeded`,
    /// `failed`), `outlier_disconnections_total{reason}` (one of
    /// [`DISCONNECT_REASONS`](crate::connection::DISCONNECT_REASONS)) and
    /// `outlier_connections_open`. Watch each endpoint's watch once; an endpoint dropped keeps
    /// what it counted in the totals, and holds nothing here.
    ///
    /// ```
    /// use http::Uri;
    /// use prometheus_client::registry::Registry;
    /// use tower::service_fn;
    /// use tower_outlier::connection::ConnectionWatch;
    /// use tower_outlier::metrics::OutlierMetrics;
    ///
    /// let mut registry = Registry::default();
    /// let metrics = OutlierMetrics::register(&mut registry);
    /// let watch = ConnectionWatch::new(service_fn(|_: Uri| async { Ok::<_, std::io::Error>(()) }));
    /// metrics.watch_connections("orders", &watch);
    /// let mut text = String::new();
    /// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    /// assert!(text.contains(r#"outlier_connection_attempts_total{upstream="orders",result="failed"} 0"#));
    /// ```
    pub fn watch_connections<C>(
        &self,
        service: &str,
        watch: &crate::connection::ConnectionWatch<C>,
    ) {
        let labels = |pairs: &[(&'static str, &str)]| -> Labels {
            let mut labels = vec![("upstream", service.to_owned())];
            labels.extend(pairs.iter().map(|(k, v)| (*k, String::from(*v))));
            labels
        };
        // One series at a time: `get_or_create` hands out a read guard on its family, which a
        // second call in the same statement would wait on for good.
        let c = &self.counters;
        let counter = |family: &Family<Labels, Counter>, pairs: &[(&'static str, &str)]| {
            let series = family.get_or_create(&labels(pairs)).clone();
            series
        };
        let succeeded = counter(&c.connection_attempts, &[("result", "succeeded")]);
        let failed = counter(&c.connection_attempts, &[("result", "failed")]);
        let ended = crate::connection::DISCONNECT_REASONS
            .map(|reason| counter(&c.disconnections, &[("reason", reason)]));
        let open = {
            let series = c.connections_open.get_or_create(&labels(&[])).clone();
            series
        };
        let sink = ConnectionCounts {
            counters: Arc::as_ptr(&self.counters) as usize,
            service: service.to_owned(),
            succeeded,
            failed,
            ended,
            open,
        };
        watch.add_sink(Arc::new(sink));
    }

    /// Exports the counters of a [`DetectorPolicy`](crate::DetectorPolicy) (Envoy's
    /// `ejections_detected_*`, `ejections_enforced_*` and overflow, per detector) under
    /// `upstream="<service>"`, read from the policy at each scrape as
    /// `outlier_detector_ejections_total{upstream, policy, detector, result}`, `result` being
    /// `detected`, `enforced`, `unenforced` or `overflow`.
    #[cfg(feature = "detectors")]
    #[cfg_attr(docsrs, doc(cfg(feature = "detectors")))]
    pub fn watch_detectors(&self, service: &str, policy: &crate::DetectorPolicy) {
        self.watched
            .lock()
            .detectors
            .push((service.to_owned(), policy.clone()));
    }
}

/// [`OutlierMetrics::register`] and [`OutlierMetrics::watch`] for a registry with one layer,
/// under the service name `default`.
pub fn register(registry: &mut Registry, monitor: &Monitor) -> OutlierMetrics {
    let metrics = OutlierMetrics::register(registry);
    metrics.watch("default", monitor);
    metrics
}

#[derive(Debug, Default)]
struct Counters {
    ejections: Family<Labels, Counter>,
    refused: Family<Labels, Counter>,
    readmissions: Family<Labels, Counter>,
    recoveries: Family<Labels, Counter>,
    trials_failed: Family<Labels, Counter>,
    probes: Family<Labels, Counter>,
    weight_changes: Family<Labels, Counter>,
    rules: Family<Labels, Counter>,
    state_changes: Family<Labels, Counter>,
    removals: Family<Labels, Counter>,
    would_eject: Family<Labels, Counter>,
    operator: Family<Labels, Counter>,
    connection_attempts: Family<Labels, Counter>,
    disconnections: Family<Labels, Counter>,
    connections_open: Family<Labels, prometheus_client::metrics::gauge::Gauge>,
}

/// One watched endpoint's series: its connection events counted there.
struct ConnectionCounts {
    // Which registry's counters and which upstream: a watch counts in each once.
    counters: usize,
    service: String,
    succeeded: Counter,
    failed: Counter,
    ended: [Counter; crate::connection::DISCONNECT_REASONS.len()],
    open: prometheus_client::metrics::gauge::Gauge,
}

impl crate::connection::ConnectionSink for ConnectionCounts {
    fn attempted(&self, connected: bool) {
        if connected {
            self.succeeded.inc();
            self.open.inc();
        } else {
            self.failed.inc();
        }
    }

    fn joined(&self, open: u64) {
        self.open.inc_by(i64::try_from(open).unwrap_or(i64::MAX));
    }

    fn same_as(&self, other: &dyn crate::connection::ConnectionSink) -> bool {
        other
            .as_any()
            .downcast_ref::<ConnectionCounts>()
            .is_some_and(|other| other.counters == self.counters && other.service == self.service)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn ended(&self, reason: Option<&'static str>) {
        self.open.dec();
        if let Some(index) = reason.and_then(|r| {
            crate::connection::DISCONNECT_REASONS
                .iter()
                .position(|known| *known == r)
        }) {
            self.ended[index].inc();
        }
    }
}

impl Counters {
    /// Creates the series whose labels are known before any event, at 0, so that an alert on
    /// their rate sees 0 rather than no data. Ejections and policy states are labelled with the
    /// measure or state that a policy names when it reports, and appear with their first event.
    fn start_at_zero(&self, service: &str) {
        let with = |pairs: &[(&'static str, &str)]| -> Labels {
            let mut labels = vec![("upstream", service.to_owned())];
            labels.extend(pairs.iter().map(|(k, v)| (*k, String::from(*v))));
            labels
        };
        for refusal in ["budget", "last_endpoint", "forced_in"] {
            let _ = self.refused.get_or_create(&with(&[("refusal", refusal)]));
        }
        for action in [
            OperatorAction::ForceOut,
            OperatorAction::ForceIn,
            OperatorAction::Release,
            OperatorAction::ResetBackoff,
        ] {
            let _ = self
                .operator
                .get_or_create(&with(&[("action", action.as_str())]));
        }
        for cause in [
            Readmission::ProbeSucceeded,
            Readmission::PassiveTrial,
            Readmission::BudgetShrank,
            Readmission::LastEndpoint,
            Readmission::PolicyOff,
            Readmission::HostBack,
            Readmission::Operator,
            Readmission::DryRun,
            Readmission::PushbackOver,
            Readmission::Serving,
        ] {
            let _ = self
                .readmissions
                .get_or_create(&with(&[("cause", cause_label(cause))]));
        }
        let _ = self.recoveries.get_or_create(&with(&[]));
        let _ = self.trials_failed.get_or_create(&with(&[]));
        for result in ["started", "failed", "succeeded"] {
            let _ = self.probes.get_or_create(&with(&[("result", result)]));
        }
        let _ = self.weight_changes.get_or_create(&with(&[]));
        for result in ["applied", "rejected"] {
            let _ = self.rules.get_or_create(&with(&[("result", result)]));
        }
        for status in ["available", "trial", "ejected", "probing", "unready"] {
            let _ = self.removals.get_or_create(&with(&[("status", status)]));
        }
    }

    fn count(&self, service: &str, event: &Event) {
        let with = |pairs: &[(&'static str, &str)]| -> Labels {
            let mut labels = vec![("upstream", service.to_owned())];
            labels.extend(pairs.iter().map(|(k, v)| (*k, String::from(*v))));
            labels
        };
        let (family, labels) = match event {
            Event::Ejected { reason, .. } => (
                &self.ejections,
                with(&[("policy", reason.policy), ("measure", reason.measure)]),
            ),
            Event::EjectionRefused { refusal, .. } => {
                let refusal = match refusal {
                    Refusal::LastEndpoint => "last_endpoint",
                    Refusal::ForcedIn => "forced_in",
                    _ => "budget",
                };
                (&self.refused, with(&[("refusal", refusal)]))
            }
            Event::Readmitted { cause, .. } => {
                (&self.readmissions, with(&[("cause", cause_label(*cause))]))
            }
            Event::Recovered { .. } => (&self.recoveries, with(&[])),
            Event::TrialFailed { .. } => (&self.trials_failed, with(&[])),
            Event::ProbeStarted { .. } => (&self.probes, with(&[("result", "started")])),
            Event::ProbeFailed { .. } => (&self.probes, with(&[("result", "failed")])),
            Event::WeightChanged { .. } => (&self.weight_changes, with(&[])),
            Event::RulesApplied { .. } => (&self.rules, with(&[("result", "applied")])),
            Event::RulesRejected { .. } => (&self.rules, with(&[("result", "rejected")])),
            Event::PolicyStateChanged { policy, to, .. } => (
                &self.state_changes,
                with(&[("policy", policy), ("to", to.unwrap_or("none"))]),
            ),
            Event::Removed { status, .. } => {
                (&self.removals, with(&[("status", status_label(*status))]))
            }
            Event::Operator { action, .. } => {
                (&self.operator, with(&[("action", action.as_str())]))
            }
            // Dry run counts what it would eject; the rest of what it reports is no change.
            Event::DryRun(inner) => match &**inner {
                Event::Ejected { reason, .. } => (
                    &self.would_eject,
                    with(&[("policy", reason.policy), ("measure", reason.measure)]),
                ),
                _ => return,
            },
        };
        family.get_or_create(&labels).inc();
        // A probe that succeeded re-admits: counted under both.
        if let Event::Readmitted {
            cause: Readmission::ProbeSucceeded,
            ..
        } = event
        {
            self.probes
                .get_or_create(&with(&[("result", "succeeded")]))
                .inc();
        }
    }
}

fn cause_label(cause: Readmission) -> &'static str {
    match cause {
        Readmission::ProbeSucceeded => "probe_succeeded",
        Readmission::PassiveTrial => "passive_trial",
        Readmission::BudgetShrank => "budget_shrank",
        Readmission::LastEndpoint => "last_endpoint",
        Readmission::PolicyOff => "policy_off",
        Readmission::HostBack => "host_back",
        Readmission::Operator => "operator",
        Readmission::DryRun => "dry_run",
        Readmission::PushbackOver => "pushback_over",
        Readmission::Serving => "serving",
    }
}

fn status_label(status: EndpointStatus) -> &'static str {
    ["available", "trial", "ejected", "probing", "unready"][status_index(status)]
}

fn status_index(status: EndpointStatus) -> usize {
    match status {
        EndpointStatus::Available => 0,
        EndpointStatus::Trial => 1,
        EndpointStatus::Ejected => 2,
        EndpointStatus::Probing => 3,
        EndpointStatus::Unready => 4,
    }
}

mod live;
use live::*;
