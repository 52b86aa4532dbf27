use super::*;
use std::time::Duration;
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

#[test]
fn place_puts_items_where_their_rank_says() {
    // Every permutation of 0..6, and a few long ones from a seeded shuffle, against a copy: the
    // item at `from[k]` is to end up `k`th.
    fn check(from: &[usize]) {
        let items: Vec<u32> = (0..from.len() as u32).map(|i| i * 10).collect();
        let wanted: Vec<u64> = from.iter().map(|&i| u64::from(items[i]) + 1).collect();
        let mut rank = vec![0; from.len()];
        for (k, &i) in from.iter().enumerate() {
            rank[i] = k;
        }
        let mut made = 0;
        let placed = super::building::place(items, &rank, |item| {
            made += 1;
            u64::from(item) + 1
        });
        assert_eq!(placed, wanted, "{from:?}");
        assert_eq!(made, from.len(), "each item made once");
    }
    fn all(prefix: &mut Vec<usize>, left: &mut Vec<usize>) {
        if left.is_empty() {
            check(prefix);
            return;
        }
        for i in 0..left.len() {
            let item = left.remove(i);
            prefix.push(item);
            all(prefix, left);
            prefix.pop();
            left.insert(i, item);
        }
    }
    all(&mut Vec::new(), &mut (0..6).collect());
    let mut state = 7u64;
    for n in [1, 2, 100, 1000] {
        let mut from: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            from.swap(i, (state >> 33) as usize % (i + 1));
        }
        check(&from);
    }
}

#[test]
fn key_prefixes_order_as_the_texts_do() {
    let texts = [
        "",
        "a",
        "a\u{0}",
        "ab",
        "abc",
        "b",
        "10.0.0.1:8080",
        "10.0.0.10:8080",
        "10.0.0.2:80",
        "0123456789abcdef",
        "0123456789abcdef0",
        "0123456789abcdeg",
        "z",
        "é",
    ];
    for a in texts {
        for b in texts {
            let (pa, pb) = (super::key_prefix(a), super::key_prefix(b));
            // Where the prefixes differ they order as the texts; where they tie the texts decide.
            if pa != pb {
                assert_eq!(pa.cmp(&pb), a.cmp(b), "{a:?} {b:?}");
            }
        }
    }
}
