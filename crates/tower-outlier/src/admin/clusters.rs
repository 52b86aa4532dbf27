//! Envoy's `/clusters` from a snapshot: the `admin.v3.Clusters` JSON (`?format=json`) and the
//! text format's host lines, as Envoy's `clusters_handler.cc` writes them, for the fields the
//! layer has (the module documentation of [`admin`](super) says which and why).

use std::fmt::Write;
use std::net::SocketAddr;

use serde_json::{json, Map, Value};

use crate::event::EndpointKey;
use crate::monitor::{EndpointSnapshot, EndpointStatus, Snapshot};

/// Whether a `/clusters` query asks for JSON: `format=json`, as Envoy reads it; any other
/// `format`, or none, is the text format. A parameter given twice counts as its last, as
/// `/history`'s do.
pub(super) fn wants_json(query: Option<&str>) -> bool {
    query
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .rfind(|(name, _)| *name == "format")
        .is_some_and(|(_, value)| value == "json")
}

/// Where Envoy would say a host is: an IP and port, or (for a key that is not a socket address)
/// the key's text.
enum Address {
    Socket(SocketAddr),
    Other(String),
}

impl Address {
    fn of(key: &EndpointKey) -> Address {
        if let Some(addr) = key.downcast_ref::<SocketAddr>() {
            return Address::Socket(*addr);
        }
        // A string key is read as the string, not as its `Debug` text (in quotes).
        let text = key
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| key.downcast_ref::<&'static str>().copied())
            .unwrap_or(key.as_str());
        match text.parse() {
            Ok(addr) => Address::Socket(addr),
            Err(_) => Address::Other(text.to_owned()),
        }
    }

    /// `config.core.v3.Address`: `socket_address` with the IP and port, or the key's text and
    /// port 0.
    fn json(&self) -> Value {
        let (address, port) = match self {
            Address::Socket(addr) => (addr.ip().to_string(), addr.port()),
            Address::Other(text) => (text.clone(), 0),
        };
        json!({ "socket_address": { "address": address, "port_value": port } })
    }

    /// As Envoy's `Address::asString` prints it (`[::1]:8080` for IPv6), or the key's text.
    fn text(&self) -> String {
        match self {
            Address::Socket(addr) => addr.to_string(),
            Address::Other(text) => text.clone(),
        }
    }
}

/// One host as `/clusters` shows it, read from its snapshot.
struct Host {
    address: Address,
    success: u64,
    error: u64,
    total: u64,
    active: u64,
    failed_outlier_check: bool,
    failed_active_health_check: bool,
    degraded: bool,
    weight: u32,
}

impl Host {
    fn of(endpoint: &EndpointSnapshot) -> Host {
        let counts = endpoint
            .windows
            .first()
            .map(|window| window.counts)
            .unwrap_or_default();
        let error = counts.failures.min(counts.calls);
        let out = matches!(
            endpoint.status,
            EndpointStatus::Ejected | EndpointStatus::Probing
        );
        let by_active_check = endpoint
            .last_reason
            .as_ref()
            .is_some_and(|reason| reason.policy == crate::events::ACTIVE_CHECK_POLICY);
        Host {
            address: Address::of(&endpoint.key),
            success: counts.calls - error,
            error,
            total: counts.calls,
            active: endpoint.in_flight as u64,
            failed_outlier_check: out && !by_active_check,
            // Its health service says not serving, or it failed its checks while idle: Envoy's
            // active health check's flag.
            failed_active_health_check: endpoint.not_serving || (out && by_active_check),
            degraded: endpoint.degraded_by_server.is_some(),
            // Hundredths of the relative weight: 100 at the endpoint's full weight.
            weight: (endpoint.weight * 100.0)
                .round()
                .clamp(0.0, f64::from(u32::MAX)) as u32,
        }
    }

    /// The window's successes over its calls, in percent; none without calls.
    fn success_rate(&self) -> Option<f64> {
        (self.total > 0).then(|| self.success as f64 * 100.0 / self.total as f64)
    }

    /// Envoy's host stats that the layer counts, counters first, as Envoy lists them.
    fn stats(&self) -> [(&'static str, &'static str, u64); 4] {
        [
            ("rq_error", "COUNTER", self.error),
            ("rq_success", "COUNTER", self.success),
            ("rq_total", "COUNTER", self.total),
            ("rq_active", "GAUGE", self.active),
        ]
    }

    /// `HostUtility::healthFlagsToString`: `healthy`, or each flag set after a slash.
    fn health_flags(&self) -> String {
        let mut flags = String::new();
        for (set, name) in [
            (self.failed_active_health_check, "/failed_active_hc"),
            (self.failed_outlier_check, "/failed_outlier_check"),
            (self.degraded, "/degraded_active_hc"),
        ] {
            if set {
                flags.push_str(name);
            }
        }
        if flags.is_empty() {
            flags.push_str("healthy");
        }
        flags
    }

    /// `admin.v3.HostStatus`, with proto3 JSON's omissions for the flags (a `false` is left
    /// out) and its decimal strings for the 64-bit stat values.
    fn json(&self) -> Value {
        let stats: Vec<Value> = self
            .stats()
            .iter()
            .map(|&(name, kind, value)| {
                json!({ "name": name, "type": kind, "value": value.to_string() })
            })
            .collect();
        let mut health = Map::new();
        for (set, name) in [
            (
                self.failed_active_health_check,
                "failed_active_health_check",
            ),
            (self.failed_outlier_check, "failed_outlier_check"),
            (self.degraded, "failed_active_degraded_check"),
        ] {
            if set {
                health.insert(name.to_owned(), Value::Bool(true));
            }
        }
        // The discover stream says nothing of health: every host it gives is healthy to it.
        health.insert("eds_health_status".to_owned(), json!("HEALTHY"));
        let mut host = json!({
            "address": self.address.json(),
            "stats": stats,
            "health_status": health,
            "weight": self.weight,
        });
        if let (Some(rate), Value::Object(host)) = (self.success_rate(), &mut host) {
            host.insert("success_rate".to_owned(), json!({ "value": rate }));
        }
        host
    }
}

/// `admin.v3.Clusters` with one cluster, `name`, holding every endpoint of the snapshot.
pub(super) fn json(snapshot: &Snapshot, name: &str) -> Value {
    let hosts: Vec<Value> = snapshot
        .endpoints
        .iter()
        .map(|endpoint| Host::of(endpoint).json())
        .collect();
    json!({ "cluster_statuses": [{ "name": name, "host_statuses": hosts }] })
}

/// Envoy's text format, the host lines: `cluster::host::stat::value`, the stats in name order,
/// then `health_flags`, `weight` and `success_rate` (-1 without calls, as Envoy prints a rate it
/// did not compute).
pub(super) fn text(snapshot: &Snapshot, name: &str) -> String {
    let mut text = String::new();
    for endpoint in &snapshot.endpoints {
        let host = Host::of(endpoint);
        let address = host.address.text();
        let mut stats = host.stats();
        stats.sort_by_key(|&(stat, _, _)| stat);
        for (stat, _, value) in stats {
            let _ = writeln!(text, "{name}::{address}::{stat}::{value}");
        }
        let _ = writeln!(
            text,
            "{name}::{address}::health_flags::{}",
            host.health_flags()
        );
        let _ = writeln!(text, "{name}::{address}::weight::{}", host.weight);
        let _ = writeln!(
            text,
            "{name}::{address}::success_rate::{}",
            host.success_rate().unwrap_or(-1.0)
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_json_is_read_as_envoy_reads_it() {
        assert!(wants_json(Some("format=json")));
        assert!(wants_json(Some("filter=x&format=json")));
        assert!(!wants_json(Some("format=text")));
        assert!(!wants_json(Some("format=json&format=text")));
        assert!(!wants_json(Some("json")));
        assert!(!wants_json(None));
    }

    #[test]
    fn a_host_is_its_socket_address_or_its_key_with_port_zero() {
        let v4: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let v6: SocketAddr = "[::1]:9090".parse().unwrap();
        let address = Address::of(&EndpointKey::new(&v4));
        assert_eq!(
            address.json(),
            json!({ "socket_address": { "address": "127.0.0.1", "port_value": 8080 } })
        );
        assert_eq!(address.text(), "127.0.0.1:8080");
        let address = Address::of(&EndpointKey::new(&v6));
        assert_eq!(address.json()["socket_address"]["address"], "::1");
        assert_eq!(address.text(), "[::1]:9090");
        // A string that is a socket address is one; any other key is its text, on port 0.
        let address = Address::of(&EndpointKey::new(&String::from("10.0.0.2:443")));
        assert_eq!(address.json()["socket_address"]["port_value"], 443);
        let address = Address::of(&EndpointKey::new(&"orders-1"));
        assert_eq!(
            address.json(),
            json!({ "socket_address": { "address": "orders-1", "port_value": 0 } })
        );
        assert_eq!(address.text(), "orders-1");
        let address = Address::of(&EndpointKey::new(&7usize));
        assert_eq!(address.json()["socket_address"]["address"], "7");
        assert_eq!(address.json()["socket_address"]["port_value"], 0);
    }

    #[test]
    fn health_flags_read_as_envoy_prints_them() {
        let mut host = Host {
            address: Address::Other(String::from("a")),
            success: 3,
            error: 1,
            total: 4,
            active: 0,
            failed_outlier_check: false,
            failed_active_health_check: false,
            degraded: false,
            weight: 100,
        };
        assert_eq!(host.health_flags(), "healthy");
        assert_eq!(host.success_rate(), Some(75.0));
        assert!(host.json()["health_status"]
            .get("failed_outlier_check")
            .is_none());
        host.failed_outlier_check = true;
        assert_eq!(host.health_flags(), "/failed_outlier_check");
        host.failed_active_health_check = true;
        assert_eq!(
            host.health_flags(),
            "/failed_active_hc/failed_outlier_check"
        );
        assert_eq!(host.json()["health_status"]["failed_outlier_check"], true);
        host.total = 0;
        assert_eq!(host.success_rate(), None);
        assert!(host.json().get("success_rate").is_none());
    }
}
