//! gRPC's standard outlier-detection metrics (gRFC A91) through the `metrics` facade: an ejection
//! counts `ejections_enforced` under its detection method, a detection the budget refuses counts
//! `ejections_unenforced` with A91's `max_ejection_overflow`, the refusal series are there at 0
//! from the moment the layer is watched, and an operator's force-out counts as neither. On metrics-util's recorder, installed for this test
//! binary alone; the layer driven like a balancer on tokio's paused clock.

use crate::support;

use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::Harness;
use tower_outlier::standard_metrics::{
    watch, DETECTION_METHOD, EJECTIONS_ENFORCED, EJECTIONS_UNENFORCED, TARGET, UNENFORCED_REASON,
};
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};

/// Counters as totals: metrics-util's snapshots hand out what was added since the last one.
struct Totals {
    snapshotter: Snapshotter,
    seen: HashMap<(String, Vec<(String, String)>), u64>,
}

impl Totals {
    /// The counter `name` with exactly these labels, if recorded.
    fn get(&mut self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut found: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            found.sort();
            if let DebugValue::Counter(n) = value {
                *self.seen.entry((key.name().to_owned(), found)).or_default() += n;
            }
        }
        let mut wanted: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        wanted.sort();
        self.seen.get(&(name.to_owned(), wanted)).copied()
    }
}

#[tokio::test(start_paused = true)]
async fn ejections_are_counted_under_a91_names() {
    let recorder = DebuggingRecorder::new();
    let mut totals = Totals {
        snapshotter: recorder.snapshotter(),
        seen: HashMap::new(),
    };
    recorder
        .install()
        .expect("the only recorder of this test binary");

    // Three endpoints: the recommended budget ejects at most one.
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ));
    let watching = watch("dns:///orders.internal:50051", &layer.monitor());
    let target = (TARGET, "dns:///orders.internal:50051");
    let overflow = |totals: &mut Totals, method| {
        totals.get(
            EJECTIONS_UNENFORCED,
            &[
                target,
                (DETECTION_METHOD, method),
                (UNENFORCED_REASON, "max_ejection_overflow"),
            ],
        )
    };
    assert_eq!(
        overflow(&mut totals, "success_rate"),
        Some(0),
        "a refusal series is there at 0 before any event"
    );
    assert_eq!(
        totals.get(
            EJECTIONS_ENFORCED,
            &[target, (DETECTION_METHOD, "failure_percentage")]
        ),
        Some(0)
    );

    let mut h = Harness::new(&layer, 3);
    // #0 fails three times in a row: ejected by consecutive failures.
    h.calls(0, 3, 0).await;
    assert!(!h.is_live(0), "#0 ejected");
    let enforced = totals.get(
        EJECTIONS_ENFORCED,
        &[target, (DETECTION_METHOD, "consecutive_5xx")],
    );
    assert_eq!(enforced, Some(1));
    // #1 fails as well: detected, and refused (the budget of one is spent).
    h.calls(1, 3, 0).await;
    assert!(h.is_live(1), "#1 kept in");
    assert_eq!(overflow(&mut totals, "consecutive_5xx"), Some(1));

    // An operator's force-out is no outlier ejection: A91's counters leave it out (before, it
    // counted as an enforced ejection of method `other`).
    layer.rules().force_out(&2usize);
    h.sync();
    assert!(!h.is_live(2), "#2 forced out");
    let counted = totals.get(EJECTIONS_ENFORCED, &[target, (DETECTION_METHOD, "other")]);
    assert_eq!(
        counted, None,
        "the operator's force-out counted as enforced"
    );
    layer.rules().release(&2usize);
    h.sync();

    // Unsubscribed, nothing more is counted.
    watching.unsubscribe();
    h.calls(2, 3, 0).await;
    assert_eq!(overflow(&mut totals, "consecutive_5xx"), Some(1));
}
