use super::*;
use tower_outlier_core::WindowCounts;

#[test]
fn snapshots_serialize_with_typed_keys_as_text() {
    let monitor = Monitor::new();
    let key = EndpointKey::new(&std::net::SocketAddr::from(([10, 0, 0, 7], 8080)));
    let snapshot = Snapshot {
        endpoints: vec![EndpointSnapshot {
            key,
            status: EndpointStatus::Ejected,
            windows: vec![PolicyWindow {
                policy: "error-rate",
                counts: WindowCounts {
                    calls: 10,
                    failures: 6,
                    slow: 0,
                },
                state: None,
                judged: None,
                members: Vec::new(),
            }],
            error_rate: 0.6,
            next_check_in: Some(Duration::from_secs(30)),
            next_check_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(60)),
            failed_checks: 0,
            last_reason: None,
            in_flight: 0,
            latency_estimate: Duration::ZERO,
            weight: 1.0,
            absolute_weight: None,
            avoided_for: None,
            refused: None,
            degraded: false,
            ramp_share: None,
            degraded_by_server: None,
            not_serving: false,
            would_be: None,
            forced: Some(crate::controls::Override::ForcedOut),
        }],
        rules_version: 3,
        rules_error: None,
        rules_notes: Vec::new(),
        discover_errors: 0,
        no_ejection: None,
        all_out: None,
        dry_run: false,
        dry_run_policies: Vec::new(),
    };
    let json = serde_json::to_value(&snapshot).unwrap();
    assert_eq!(json["endpoints"][0]["forced"], "ForcedOut");
    assert_eq!(json["endpoints"][0]["key"], "10.0.0.7:8080");
    assert_eq!(json["endpoints"][0]["status"], "Ejected");
    assert_eq!(json["endpoints"][0]["windows"][0]["counts"]["failures"], 6);
    assert_eq!(json["rules_version"], 3);
    assert_eq!(
        serde_json::to_value(monitor.snapshot()).unwrap()["endpoints"],
        serde_json::json!([])
    );
}
