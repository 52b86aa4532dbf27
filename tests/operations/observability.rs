//! What operators check after a change (EDAS and HSF call it "verify the result"): `tracing` events and monitor snapshots tell what the
//! layer did, with the endpoint, the reason, the error rate and the next check.

use crate::support;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::Harness;
use tower_outlier::probe::{probe_fn, ProbeFuture};
use tower_outlier::{EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test(start_paused = true)]
async fn events_and_snapshots_tell_what_happened() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let healthy = Arc::new(Mutex::new(false));
    let answer = healthy.clone();
    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud()
            .max_ejection_ratio(0.4)
            .build()
            .unwrap(),
    ))
    .probe(probe_fn(
        move |_: &usize, _: support::Backend| -> ProbeFuture {
            let healthy = *answer.lock().unwrap();
            Box::pin(async move { healthy })
        },
    ));
    let monitor = layer.monitor();
    let mut h = Harness::new(&layer, 5);

    h.calls(3, 6, 4).await;
    let log = captured.text();
    assert!(log.contains("endpoint ejected"), "{log}");
    assert!(log.contains("endpoint=3"), "{log}");
    assert!(log.contains("error_rate=0.6"), "{log}");
    assert!(log.contains("next_check_in=30s"), "{log}");
    assert!(
        log.contains("error rate 0.600 over threshold 0.500 (10 calls: 6 failed, 0 slow)"),
        "{log}"
    );

    // 5 × 40 % = 2: the third outlier is refused, and says why.
    h.calls(1, 10, 0).await;
    h.calls(2, 10, 0).await;
    assert!(captured
        .text()
        .contains("ejection refused: ejection budget of 2 for 5 endpoints at 40 % is spent"));
    assert!(captured.text().contains("endpoint=2"));
    let snapshot = monitor.snapshot();
    assert_eq!(snapshot.ejected(), 2);
    assert_eq!(snapshot.get("2").unwrap().status, EndpointStatus::Available);
    assert_eq!(snapshot.get("2").unwrap().error_rate, 1.0);
    assert_eq!(
        snapshot.get("3").unwrap().next_check_in,
        Some(Duration::from_secs(30))
    );

    h.advance(Duration::from_secs(30)).await;
    let log = captured.text();
    assert!(log.contains("probing ejected endpoint"), "{log}");
    assert!(
        log.contains("probe failed: endpoint stays ejected"),
        "{log}"
    );
    assert!(log.contains("next_check_in=60s"), "{log}");
    assert_eq!(monitor.snapshot().get("3").unwrap().failed_checks, 1);

    *healthy.lock().unwrap() = true;
    h.advance(Duration::from_secs(60)).await;
    let log = captured.text();
    assert!(log.contains("endpoint re-admitted"), "{log}");
    assert!(log.contains("cause=probe succeeded"), "{log}");
    let snapshot = monitor.snapshot();
    assert_eq!(snapshot.get("3").unwrap().status, EndpointStatus::Available);
    assert_eq!(snapshot.get("3").unwrap().failed_checks, 0);
    assert_eq!(snapshot.get("3").unwrap().next_check_in, None);
}

#[tokio::test(start_paused = true)]
async fn a_monitor_taken_before_with_policy_still_shows_every_endpoint() {
    use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};

    let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf().build().unwrap(),
    ));
    let early = layer.monitor();
    let layer = layer.with_policy(SlowCallPolicy::new(
        BreakerConfig::slow_ratio(Duration::from_millis(100))
            .open_duration(Duration::from_secs(10))
            .build()
            .unwrap(),
    ));
    let mut h = Harness::new(&layer, 3);
    h.calls(0, 2, 0).await;
    let snapshot = early.snapshot();
    assert_eq!(snapshot.endpoints.len(), 3);
    let windows = &snapshot.get_key(&0).unwrap().windows;
    let names: Vec<&str> = windows.iter().map(|w| w.policy).collect();
    assert_eq!(names, ["error-rate", "slow-call"]);
    assert_eq!(windows[0].counts.failures, 2);
    assert_eq!(layer.monitor().snapshot().endpoints.len(), 3);
}
