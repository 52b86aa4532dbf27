//! The load report a server sends with a call: `xds.data.orca.v3.OrcaLoadReport`, base64-encoded
//! in the `endpoint-load-metrics-bin` trailer.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use prost::Message;

/// The trailer (or trailers-only header) that carries a call's load report.
pub use tower_outlier_core::LOAD_REPORT_HEADER;

/// The fields of `xds.data.orca.v3.OrcaLoadReport` that weights are computed from. The report's
/// maps (`request_cost`, `utilization`, `named_metrics`) are not declared, so decoding skips them
/// as unknown fields and allocates nothing.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct LoadReport {
    /// CPU utilization, in `[0, 1]` normally (above 1 on a machine that overcommits).
    #[prost(double, tag = "1")]
    pub cpu_utilization: f64,
    /// Memory utilization, in `[0, 1]`.
    #[prost(double, tag = "2")]
    pub mem_utilization: f64,
    /// Requests per second, as a whole number (deprecated for `rps_fractional`).
    #[prost(uint64, tag = "3")]
    pub rps: u64,
    /// Requests per second the server sees.
    #[prost(double, tag = "6")]
    pub rps_fractional: f64,
    /// Errors per second the server sees.
    #[prost(double, tag = "7")]
    pub eps: f64,
    /// The application's own utilization; when above zero, weights use it rather than the CPU's.
    #[prost(double, tag = "9")]
    pub application_utilization: f64,
}

impl LoadReport {
    /// The utilization weights use: the application's if it reported one, else the CPU's.
    pub fn utilization(&self) -> f64 {
        if self.application_utilization > 0.0 {
            self.application_utilization
        } else {
            self.cpu_utilization
        }
    }

    /// The report's weight (gRFC A58): `qps / (utilization + eps / qps × penalty)`, or `None`
    /// for a report that says nothing (no utilization or no queries, or numbers that are not).
    ///
    /// ```
    /// use tower_outlier_orca::LoadReport;
    ///
    /// let report = LoadReport { rps_fractional: 100.0, cpu_utilization: 0.5, eps: 10.0, ..Default::default() };
    /// assert_eq!(report.weight(1.0), Some(100.0 / (0.5 + 0.1)));
    /// assert_eq!(LoadReport::default().weight(1.0), None);
    /// ```
    pub fn weight(&self, error_utilization_penalty: f64) -> Option<f64> {
        let (qps, utilization) = (self.rps_fractional, self.utilization());
        if !(qps.is_finite() && qps > 0.0 && utilization.is_finite() && utilization > 0.0) {
            return None;
        }
        let eps = if self.eps.is_finite() && self.eps > 0.0 {
            self.eps
        } else {
            0.0
        };
        let weight = qps / (utilization + eps / qps * error_utilization_penalty);
        (weight.is_finite() && weight > 0.0).then_some(weight)
    }

    /// Reads a report from the value of the `endpoint-load-metrics-bin` header: base64, padded
    /// or not, then the protobuf message. `None` for a value that is neither.
    ///
    /// ```
    /// use tower_outlier_orca::LoadReport;
    ///
    /// let report = LoadReport { rps_fractional: 50.0, cpu_utilization: 0.25, ..Default::default() };
    /// let header = report.to_header();
    /// assert_eq!(LoadReport::from_header(header.as_bytes()), Some(report));
    /// assert_eq!(LoadReport::from_header(b"not base64!"), None);
    /// ```
    pub fn from_header(value: &[u8]) -> Option<LoadReport> {
        // Reports are small (the scalars take 54 bytes); a larger one carries maps, and is
        // decoded from the heap.
        let mut stack = [0u8; 256];
        let needed = value.len() / 4 * 3 + 3;
        if needed <= stack.len() {
            let len = BASE64.decode_slice(value, &mut stack).ok()?;
            LoadReport::decode(&stack[..len]).ok()
        } else {
            let bytes = BASE64.decode(value).ok()?;
            LoadReport::decode(bytes.as_slice()).ok()
        }
    }

    /// The report as an `endpoint-load-metrics-bin` header value (base64, unpadded), as a
    /// server sends it.
    pub fn to_header(&self) -> String {
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(self.encode_to_vec())
    }
}

/// Standard base64, padding optional: gRPC implementations send binary metadata either way.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_unpadded_and_reports_with_maps_are_read() {
        let report = LoadReport {
            cpu_utilization: 0.4,
            application_utilization: 0.8,
            rps_fractional: 120.5,
            eps: 3.0,
            ..Default::default()
        };
        let bytes = report.encode_to_vec();
        let padded = base64::engine::general_purpose::STANDARD.encode(&bytes);
        assert_eq!(LoadReport::from_header(padded.as_bytes()), Some(report));
        assert_eq!(
            LoadReport::from_header(report.to_header().as_bytes()),
            Some(report)
        );
        assert_eq!(report.utilization(), 0.8, "the application's first");
        // A report with a map field (utilization = 5, a string key and a double value) and more
        // named metrics than the stack buffer holds: the maps are skipped.
        let mut with_maps = bytes.clone();
        for i in 0..40u8 {
            let key = format!("metric-{i}");
            let mut entry = vec![0x0a, key.len() as u8];
            entry.extend_from_slice(key.as_bytes());
            entry.push(0x11);
            entry.extend_from_slice(&0.5f64.to_le_bytes());
            with_maps.push(0x2a);
            with_maps.push(entry.len() as u8);
            with_maps.extend_from_slice(&entry);
        }
        let encoded = base64::engine::general_purpose::STANDARD.encode(&with_maps);
        assert!(encoded.len() > 400);
        assert_eq!(LoadReport::from_header(encoded.as_bytes()), Some(report));
        assert_eq!(LoadReport::from_header(b"@@@@"), None);
        assert_eq!(
            LoadReport::from_header(b"/w=="),
            None,
            "a truncated message"
        );
    }

    #[test]
    fn weights_follow_a58_and_nonsense_has_none() {
        let report = |qps: f64, util: f64, eps: f64| LoadReport {
            rps_fractional: qps,
            cpu_utilization: util,
            eps,
            ..Default::default()
        };
        assert_eq!(report(100.0, 0.2, 0.0).weight(1.0), Some(500.0));
        assert_eq!(report(100.0, 0.5, 50.0).weight(2.0), Some(100.0 / 1.5));
        assert_eq!(report(100.0, 0.5, 50.0).weight(0.0), Some(200.0));
        for nothing in [
            report(0.0, 0.5, 0.0),
            report(100.0, 0.0, 0.0),
            report(f64::NAN, 0.5, 0.0),
            report(100.0, f64::INFINITY, 0.0),
            report(-5.0, 0.5, 0.0),
        ] {
            assert_eq!(nothing.weight(1.0), None, "{nothing:?}");
        }
        assert_eq!(report(100.0, 0.5, f64::NAN).weight(1.0), Some(200.0));
    }
}
