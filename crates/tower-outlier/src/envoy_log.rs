//! Envoy's outlier ejection event log: the layer's ejections and re-admissions written as
//! `envoy.data.cluster.v3.OutlierDetectionEvent` JSON lines, the format Envoy writes to its
//! `event_log_path` and that Istio and log tooling read.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tower_outlier_core::{Lock, WindowCounts};

use crate::event::Event;
use crate::monitor::{EventCallback, Monitor};

/// Writes a layer's ejection events as Envoy writes its outlier event log: one JSON object per
/// line, field names and enum spellings as in Envoy's `OutlierDetectionEvent` proto, every field
/// printed (as Envoy prints them):
///
/// ```text
/// {"type":"CONSECUTIVE_5XX","cluster_name":"orders","upstream_url":"10.0.0.1:443","action":"EJECT","num_ejections":1,"enforced":true,"eject_consecutive_event":{},"timestamp":"2026-12-01T09:00:00Z"}
/// ```
///
/// * An ejection is an `EJECT` with `enforced: true`; a judgement the budget or the last-endpoint
///   rule refused is an `EJECT` with `enforced: false` (Envoy logs detections it does not
///   enforce); a re-admission is an `UNEJECT`, with the type of the ejection it ends.
/// * `num_ejections` counts this endpoint's ejections so far, this one included (Envoy's
///   `num_ejections` is its back-off multiplier, which also decays: a count is what the layer
///   knows for every policy). `secs_since_last_action` (a string, as protobuf's JSON writes a
///   `UInt64Value`) is the time since the endpoint's last re-admission for an `EJECT`, since its
///   last ejection for an `UNEJECT`, and absent the first time.
/// * `type` from the measure that judged: Envoy's detectors map to their own types; linkerd's
///   consecutive failures and failed probes to `CONSECUTIVE_5XX`; an error rate over a window
///   (EDAS, HSF) and every other measure (a slow-call breaker, a host ejected in another service)
///   to `FAILURE_PERCENTAGE`, the closest Envoy has. A success-rate ejection carries
///   `eject_success_rate_event` with the host's rate and the threshold, in percent
///   (`cluster_average_success_rate` is left out: the layer does not keep the fleet's average); a
///   failure-percentage one carries `eject_failure_percentage_event` with the host's success rate
///   in percent (for a measure that is not a failure percentage, from the calls and failures of
///   the window that judged it; left out when that window had no calls).
///
/// Lines are written and flushed one by one on the task that makes the decision (the
/// balancer's), as events are: a local file is fine (ejections are rare); a slow sink should be a
/// writer that hands lines to a task of its own. A write that fails is counted
/// ([`write_errors`](Self::write_errors)) and logged once, not retried. One log per layer: its
/// `cluster_name` is the layer's service, and two layers' hosts of the same key would mix.
///
#[cfg_attr(feature = "detectors", doc = "```")]
#[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
/// use tower_outlier::events::EnvoyEventLog;
/// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
///
/// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::envoy().build()?));
/// let log = EnvoyEventLog::new("orders", std::io::sink());
/// let subscription = log.attach(&layer.monitor());
/// # let _ = subscription;
/// # Ok::<(), tower_outlier::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct EnvoyEventLog {
    state: Arc<Lock<LogState>>,
}

struct LogState {
    cluster: String,
    writer: Box<dyn Write + Send>,
    hosts: HashMap<String, HostLog>,
    write_errors: u64,
}

#[derive(Default)]
struct HostLog {
    ejections: u32,
    ejected_as: Option<&'static str>,
    last_ejection: Option<Instant>,
    last_unejection: Option<Instant>,
}

impl EnvoyEventLog {
    /// A log of the cluster (Envoy's `cluster_name`: the service) `cluster_name`, written to
    /// `writer`.
    pub fn new(cluster_name: impl Into<String>, writer: impl Write + Send + 'static) -> Self {
        EnvoyEventLog {
            state: Arc::new(Lock::new(LogState {
                cluster: cluster_name.into(),
                writer: Box::new(writer),
                hosts: HashMap::new(),
                write_errors: 0,
            })),
        }
    }

    /// Writes the events of the layer `monitor` watches from now on; the handle unsubscribes.
    pub fn attach(&self, monitor: &Monitor) -> EventCallback {
        let log = self.clone();
        monitor.on_event(move |event| log.record(event))
    }

    /// Lines that could not be written.
    pub fn write_errors(&self) -> u64 {
        self.state.lock().write_errors
    }

    fn record(&self, event: &Event) {
        let (key, measure, action, enforced, verdict) = match event {
            Event::Ejected { key, reason, .. } => (
                key,
                Some(reason.measure),
                "EJECT",
                true,
                Some((reason.value, reason.threshold, reason.counts)),
            ),
            Event::EjectionRefused { key, reason, .. } => (
                key,
                Some(reason.measure),
                "EJECT",
                false,
                Some((reason.value, reason.threshold, reason.counts)),
            ),
            Event::Readmitted { key, .. } => (key, None, "UNEJECT", false, None),
            // What dry run would eject: detected, not enforced, as with `enforcing_*` at 0.
            Event::DryRun(inner) => match &**inner {
                Event::Ejected { key, reason, .. } => (
                    key,
                    Some(reason.measure),
                    "EJECT",
                    false,
                    Some((reason.value, reason.threshold, reason.counts)),
                ),
                _ => return,
            },
            Event::Removed { key, .. } => {
                self.state.lock().hosts.remove(key.as_str());
                return;
            }
            _ => return,
        };
        let now = Instant::now();
        // Wall-clock time for the people and programs reading the log; nothing is measured with
        // it.
        #[allow(clippy::disallowed_methods)]
        let wall = SystemTime::now();
        let mut state = self.state.lock();
        let cluster = state.cluster.clone();
        let host = state.hosts.entry(key.as_str().to_owned()).or_default();
        let (kind, since) = match measure {
            Some(measure) => {
                let kind = ejection_type(measure);
                if enforced {
                    host.ejections = host.ejections.saturating_add(1);
                    host.ejected_as = Some(kind);
                }
                let since = host.last_unejection;
                if enforced {
                    host.last_ejection = Some(now);
                }
                (kind, since)
            }
            None => {
                let since = host.last_ejection;
                host.last_unejection = Some(now);
                (host.ejected_as.unwrap_or("CONSECUTIVE_5XX"), since)
            }
        };
        let mut line = String::with_capacity(256);
        let _ = write!(
            line,
            r#"{{"type":"{kind}","cluster_name":{},"upstream_url":{},"action":"{action}","num_ejections":{},"enforced":{enforced}"#,
            Json(&cluster),
            Json(key.as_str()),
            host.ejections,
        );
        if action == "EJECT" {
            let (value, threshold, counts) = verdict.unwrap_or_default();
            let _ = match kind {
                "SUCCESS_RATE" | "SUCCESS_RATE_LOCAL_ORIGIN" => write!(
                    line,
                    r#","eject_success_rate_event":{{"host_success_rate":{},"cluster_success_rate_ejection_threshold":{}}}"#,
                    percent(measure.unwrap_or_default(), value),
                    percent(measure.unwrap_or_default(), threshold)
                ),
                "FAILURE_PERCENTAGE" | "FAILURE_PERCENTAGE_LOCAL_ORIGIN" => {
                    match host_success_rate(measure.unwrap_or_default(), value, counts) {
                        Some(rate) => write!(
                            line,
                            r#","eject_failure_percentage_event":{{"host_success_rate":{rate}}}"#
                        ),
                        // Nothing to compute it from (a host ejected in another service): left
                        // out, as protobuf's JSON leaves out a field it has no value for.
                        None => write!(line, r#","eject_failure_percentage_event":{{}}"#),
                    }
                }
                _ => write!(line, r#","eject_consecutive_event":{{}}"#),
            };
        }
        let _ = write!(line, r#","timestamp":"{}""#, Rfc3339(wall));
        if let Some(since) = since {
            let _ = write!(
                line,
                r#","secs_since_last_action":"{}""#,
                now.saturating_duration_since(since).as_secs()
            );
        }
        line.push_str("}\n");
        // Flushed line by line: ejections are rare, and a line held in a buffer for days, or lost
        // with the process, is no log.
        let written = state
            .writer
            .write_all(line.as_bytes())
            .and_then(|()| state.writer.flush());
        if let Err(error) = written {
            state.write_errors += 1;
            if state.write_errors == 1 {
                tracing::warn!(
                    target: "tower_outlier",
                    %error,
                    "the Envoy event log could not be written; later failures are only counted"
                );
            }
        }
    }
}

impl fmt::Debug for EnvoyEventLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("EnvoyEventLog")
            .field("cluster_name", &state.cluster)
            .field("write_errors", &state.write_errors)
            .finish_non_exhaustive()
    }
}

/// Envoy's `OutlierEjectionType` for the measure that judged.
fn ejection_type(measure: &str) -> &'static str {
    match measure {
        "consecutive gateway failures" => "CONSECUTIVE_GATEWAY_FAILURE",
        "consecutive local-origin failures" => "CONSECUTIVE_LOCAL_ORIGIN_FAILURE",
        "success rate" => "SUCCESS_RATE",
        "local-origin success rate" => "SUCCESS_RATE_LOCAL_ORIGIN",
        "failure percentage" => "FAILURE_PERCENTAGE",
        "local-origin failure percentage" => "FAILURE_PERCENTAGE_LOCAL_ORIGIN",
        m if m.starts_with("consecutive") || m == "failed probation request" => "CONSECUTIVE_5XX",
        _ => "FAILURE_PERCENTAGE",
    }
}

/// A measure's value as a whole percentage: Envoy's detectors report percentages already, the
/// other policies ratios (an error rate of 0.42).
fn percent(measure: &str, value: f64) -> u32 {
    let in_percent = matches!(
        measure,
        "success rate"
            | "local-origin success rate"
            | "failure percentage"
            | "local-origin failure percentage"
    );
    let value = if in_percent { value } else { value * 100.0 };
    value.clamp(0.0, 100.0).round() as u32
}

/// The host's success rate in percent for a failure-percentage event: from Envoy's
/// failure-percentage detectors' own figure, else from the judging window's counts (a slow-call
/// ratio or an error count is not a failure percentage), or none when the judgement had no calls.
fn host_success_rate(measure: &str, value: f64, counts: WindowCounts) -> Option<u32> {
    if matches!(
        measure,
        "failure percentage" | "local-origin failure percentage"
    ) {
        return Some(100u32.saturating_sub(percent(measure, value)));
    }
    (counts.calls > 0).then(|| {
        let succeeded = counts.calls.saturating_sub(counts.failures) as f64;
        (succeeded * 100.0 / counts.calls as f64).round() as u32
    })
}

/// A JSON string literal.
struct Json<'a>(&'a str);

impl fmt::Display for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}

/// A wall-clock time as protobuf's JSON writes a `Timestamp`: RFC 3339 in UTC, with 0, 3, 6 or 9
/// fractional digits.
pub(crate) struct Rfc3339(pub(crate) SystemTime);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let since = self
            .0
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let secs = since.as_secs();
        let (days, rest) = (secs / 86_400, secs % 86_400);
        // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
            rest / 3_600,
            rest % 3_600 / 60,
            rest % 60
        )?;
        let nanos = since.subsec_nanos();
        if nanos == 0 {
        } else if nanos.is_multiple_of(1_000_000) {
            write!(f, ".{:03}", nanos / 1_000_000)?;
        } else if nanos.is_multiple_of(1_000) {
            write!(f, ".{:06}", nanos / 1_000)?;
        } else {
            write!(f, ".{nanos:09}")?;
        }
        f.write_char('Z')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_as_protobuf_writes_them() {
        let at = |secs: u64, nanos: u32| {
            Rfc3339(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)).to_string()
        };
        // Envoy's own test: 1545123600000 ms is 2018-12-18T09:00:00Z.
        assert_eq!(at(1_545_123_600, 0), "2018-12-18T09:00:00Z");
        assert_eq!(at(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400, 5_000_000), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(4_102_444_799, 1_000), "2099-12-31T23:59:59.000001Z");
        assert_eq!(at(1_764_547_200, 7), "2025-12-01T00:00:00.000000007Z");
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(Json("a\"b\\c\n\u{1}").to_string(), r#""a\"b\\c\n\u0001""#);
    }

    #[test]
    fn measures_map_to_envoy_types() {
        assert_eq!(ejection_type("consecutive 5xx"), "CONSECUTIVE_5XX");
        assert_eq!(ejection_type("failed probation request"), "CONSECUTIVE_5XX");
        assert_eq!(ejection_type("success rate"), "SUCCESS_RATE");
        assert_eq!(ejection_type("error rate"), "FAILURE_PERCENTAGE");
        assert_eq!(percent("error rate", 0.42), 42);
        assert_eq!(percent("success rate", 87.5), 88);
        assert_eq!(percent("failure percentage", 0.5), 1);
    }

    #[test]
    fn a_host_success_rate_is_a_success_rate_whatever_judged() {
        let counts = |calls, failures| WindowCounts {
            calls,
            failures,
            ..WindowCounts::default()
        };
        // Envoy's failure percentage: its own figure.
        assert_eq!(
            host_success_rate("failure percentage", 30.0, counts(10, 3)),
            Some(70)
        );
        // An error count of 7 is not 700 %: the window's calls say 7 of 20 failed.
        assert_eq!(
            host_success_rate("error count", 7.0, counts(20, 7)),
            Some(65)
        );
        // A slow-call ratio of 0.9 with every call answered: a success rate of 100 %.
        assert_eq!(
            host_success_rate("slow-call ratio", 0.9, counts(10, 0)),
            Some(100)
        );
        assert_eq!(
            host_success_rate("host ejected in another service", 0.0, counts(0, 0)),
            None
        );
    }
}
