//! The probe cadence across the modes it meets, on tokio's paused clock: dry run, operator
//! overrides, reconfiguration, fail-fast and the panic threshold, upstream churn, probes that
//! panic or hang, extreme durations and percentages, one layer in two adaptors; passes toward
//! the healthy threshold are broken by a failed trial; a probe of the user's that tries
//! endpoints on real traffic keeps its policy's timing. Each ends with every endpoint checked
//! again and back once healed (nothing stays out for good).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_outlier::probe::{probe_fn, Probe, ProbeCadence, ProbeFuture};
use tower_outlier::{EndpointStatus, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

use crate::support::{Backend, Harness, Seen};

const S: Duration = Duration::from_secs(1);

fn edas() -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud()
            .recovery_unit(Duration::from_secs(10))
            .max_ejection_ratio(0.4)
            .build()
            .unwrap(),
    ))
}

#[derive(Clone, Default)]
struct Flag {
    healthy: Arc<AtomicBool>,
    checks: Arc<AtomicUsize>,
}

impl Flag {
    fn probe(&self) -> impl Probe<usize, Backend> + Clone {
        let this = self.clone();
        probe_fn(move |_: &usize, _: Backend| -> ProbeFuture {
            this.checks.fetch_add(1, Ordering::SeqCst);
            let healthy = this.healthy.load(Ordering::SeqCst);
            Box::pin(std::future::ready(healthy))
        })
    }
    fn set(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst);
    }
    fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }
}

fn status(
    layer: &OutlierDetectionLayer<tower_outlier::NetworkErrors, impl Sized>,
    key: usize,
) -> EndpointStatus {
    layer
        .monitor()
        .snapshot()
        .get(&key.to_string())
        .unwrap()
        .status
}

fn cadence3() -> ProbeCadence {
    ProbeCadence::new()
        .first_check(S)
        .interval(S)
        .interval_jitter_percent(0)
        .healthy_threshold(3)
}

/// Control: an episode whose passes are not interrupted needs 3 passes after a failed check.
#[tokio::test(start_paused = true)]
async fn control_three_passes() {
    let flag = Flag::default();
    let layer = edas().probe(flag.probe()).probe_cadence(cadence3());
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    assert!(!h.is_live(0));
    h.advance(S).await; // check 1 fails
    assert_eq!(flag.checks(), 1);
    flag.set(true);
    h.advance(S).await; // pass 1
    h.advance(S).await; // pass 2
    assert_eq!(status(&layer, 0), EndpointStatus::Ejected);
    h.advance(S).await; // pass 3
    assert_eq!(status(&layer, 0), EndpointStatus::Available);
}

/// A pass short of the threshold, then the budget takes the endpoint back on trial, it fails
/// the trial (a failed recovery check) and is ejected again: the pass from before the failure
/// still counts toward the threshold.
#[tokio::test(start_paused = true)]
async fn passes_survive_a_failed_trial() {
    let flag = Flag::default();
    let layer = edas().probe(flag.probe()).probe_cadence(cadence3());
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    assert!(!h.is_live(0));
    h.advance(S).await; // check 1 fails
    flag.set(true);
    h.advance(S).await; // pass 1 of 3
    assert_eq!(flag.checks(), 2);
    assert_eq!(status(&layer, 0), EndpointStatus::Ejected);
    // The upstream shrinks: the budget brings 0 back on trial.
    for id in 1..5 {
        h.remove(id);
    }
    h.sync();
    assert!(h.is_live(0), "{:?}", status(&layer, 0));
    assert_eq!(status(&layer, 0), EndpointStatus::Trial);
    // It fails on trial (kept in: last endpoint), then the others come back: ejected again.
    h.calls_while_live(0, 50, 0).await;
    flag.set(false);
    for id in 1..5 {
        h.insert(id);
    }
    h.sync();
    assert!(!h.is_live(0), "{:?}", status(&layer, 0));
    let before = flag.checks();
    flag.set(true);
    h.advance(S).await; // pass 1 after the failed trial
    h.advance(S).await; // pass 2
    assert_eq!(flag.checks(), before + 2);
    assert_eq!(
        status(&layer, 0),
        EndpointStatus::Ejected,
        "back after 2 passes in a row with a healthy_threshold of 3"
    );
}

/// A user probe that returns `None` (a passive trial, as `Probe::probe` documents) and only
/// implements `probe`: the cadence's first check times its trial.
#[derive(Clone)]
struct PassiveWithWatch;

impl Probe<usize, Backend> for PassiveWithWatch {
    fn probe(&mut self, _: &usize, _: Backend) -> Option<ProbeFuture> {
        None
    }
}

#[tokio::test(start_paused = true)]
async fn a_passive_probe_of_the_users_is_timed_by_the_cadence() {
    let layer = edas()
        .probe(PassiveWithWatch)
        .probe_cadence(ProbeCadence::new().first_check(Duration::ZERO));
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    let of_0: Vec<_> = h
        .seen
        .iter()
        .filter(|(_, s)| matches!(s, Seen::Insert(0) | Seen::Remove(0)))
        .map(|(at, s)| (at.elapsed(), s.clone()))
        .collect();
    assert_eq!(
        of_0.len(),
        2,
        "joined, ejected, and nothing more within the policy's 10 s: {of_0:?}"
    );
}

/// The same with PassiveTrial itself: control.
#[tokio::test(start_paused = true)]
async fn control_passive_trial() {
    let layer = edas().probe_cadence(ProbeCadence::new().first_check(Duration::ZERO));
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    h.advance(Duration::from_millis(100)).await;
    assert_eq!(status(&layer, 0), EndpointStatus::Ejected);
}

/// Huge durations and percentages: no panic, the endpoint is probed never (30 years).
#[tokio::test(start_paused = true)]
async fn huge_values_do_not_panic() {
    let flag = Flag::default();
    let layer = edas().probe(flag.probe()).probe_cadence(
        ProbeCadence::new()
            .first_check(Duration::MAX)
            .interval(Duration::MAX)
            .interval_jitter_percent(u32::MAX)
            .interval_jitter(Duration::MAX)
            .initial_jitter(Duration::MAX)
            .timeout(Duration::MAX)
            .healthy_threshold(u32::MAX),
    );
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    assert!(!h.is_live(0));
    h.advance(Duration::from_secs(3600)).await;
    assert_eq!(flag.checks(), 0);
    // And with huge percentages of ordinary times.
    let flag = Flag::default();
    let layer = edas().probe(flag.probe()).probe_cadence(
        ProbeCadence::new()
            .interval_jitter_percent(u32::MAX)
            .timeout(Duration::MAX)
            .healthy_threshold(u32::MAX),
    );
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    assert!(!h.is_live(0));
    h.advance(Duration::from_secs(3600)).await;
}

/// Zero everywhere, a probe that always fails: checks every millisecond, no busy poll, no panic.
#[tokio::test(start_paused = true)]
async fn zero_values() {
    let flag = Flag::default();
    let layer = edas().probe(flag.probe()).probe_cadence(
        ProbeCadence::new()
            .first_check(Duration::ZERO)
            .interval(Duration::ZERO)
            .interval_jitter_percent(0)
            .timeout(Duration::ZERO)
            .healthy_threshold(0),
    );
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    assert!(!h.is_live(0));
    let first = flag.checks();
    assert!(first >= 1, "first check at once: {first}");
    for _ in 0..10 {
        h.advance(Duration::from_millis(1)).await;
    }
    assert!(flag.checks() >= first + 9, "{}", flag.checks());
    flag.set(true);
    h.advance(Duration::from_millis(1)).await;
    assert!(h.is_live(0), "healthy_threshold(0) counts as 1");
}

/// Dry run: the shadow ejection goes through the threshold too, and dry run switched off in the
/// middle forgets it; switched on in the middle of a real episode keeps its passes.
#[tokio::test(start_paused = true)]
async fn dry_run_and_threshold() {
    let flag = Flag::default();
    let layer = edas().probe(flag.probe()).probe_cadence(cadence3());
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    assert!(!h.is_live(0));
    h.advance(S).await; // fails
    flag.set(true);
    h.advance(S).await; // pass 1
    eprintln!(
        "before dry: {:?} checks {}",
        status(&layer, 0),
        flag.checks()
    );
    rules.set_dry_run(true);
    h.sync();
    eprintln!(
        "after dry: {:?} checks {} snap {:?}",
        status(&layer, 0),
        flag.checks(),
        layer.monitor().snapshot().get("0")
    );
    assert!(h.is_live(0));
    h.advance(S).await; // pass 2
    eprintln!(
        "after pass2: {:?} checks {}",
        status(&layer, 0),
        flag.checks()
    );
    let would = |layer: &OutlierDetectionLayer<tower_outlier::NetworkErrors, _>| {
        layer.monitor().snapshot().get("0").unwrap().would_be
    };
    assert_eq!(would(&layer), Some(EndpointStatus::Ejected), "shadow");
    h.advance(S).await; // pass 3
    assert_eq!(would(&layer), None);
    rules.set_dry_run(false);
    h.sync();
    assert!(h.is_live(0));
}

/// Operator actions in the middle of the passes: force out holds it without a check; release
/// brings it back (the episode ends); force in brings it back.
#[tokio::test(start_paused = true)]
async fn operator_in_the_middle_of_the_passes() {
    let flag = Flag::default();
    let layer = edas().probe(flag.probe()).probe_cadence(cadence3());
    let rules = layer.rules();
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    h.advance(S).await; // fails
    flag.set(true);
    h.advance(S).await; // pass 1
    rules.force_out(&0usize);
    h.sync();
    let checks = flag.checks();
    h.advance(10 * S).await;
    assert_eq!(flag.checks(), checks, "no check while forced out");
    rules.release(&0usize);
    h.sync();
    assert!(h.is_live(0));
    // Ejected again: a new episode, back at its first pass.
    flag.set(true);
    h.calls_while_live(0, 50, 0).await;
    assert!(!h.is_live(0));
    h.advance(S).await;
    assert!(
        h.is_live(0),
        "new episode, no failed check: back at the first pass"
    );
}

/// A probe that panics as it runs, and one that hangs past the timeout: failed checks, the
/// endpoint checked again, and back after the threshold once it heals.
#[tokio::test(start_paused = true)]
async fn panicking_and_hanging_probes() {
    #[derive(Clone)]
    struct Bad(Arc<AtomicUsize>, Arc<AtomicBool>);
    impl Probe<usize, Backend> for Bad {
        fn sends_checks(&self) -> bool {
            true
        }

        fn probe(&mut self, _: &usize, _: Backend) -> Option<ProbeFuture> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            if self.1.load(Ordering::SeqCst) {
                return Some(Box::pin(std::future::ready(true)));
            }
            match n % 3 {
                0 => panic!("probe start panics"),
                1 => Some(Box::pin(async { panic!("probe panics") })),
                _ => Some(Box::pin(futures::future::pending())),
            }
        }
    }
    let bad = Bad(Arc::default(), Arc::default());
    let layer = edas().probe(bad.clone()).probe_cadence(
        ProbeCadence::new()
            .first_check(S)
            .interval(S)
            .timeout(Duration::from_millis(300))
            .interval_jitter_percent(0)
            .healthy_threshold(2),
    );
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    for _ in 0..40 {
        h.advance(Duration::from_millis(100)).await;
    }
    let n = bad.0.load(Ordering::SeqCst);
    assert!(n >= 3, "{n}");
    assert!(!h.is_live(0));
    bad.1.store(true, Ordering::SeqCst);
    for _ in 0..25 {
        h.advance(Duration::from_millis(100)).await;
    }
    assert!(h.is_live(0), "{:?}", status(&layer, 0));
}

/// Upstream churn mid-probe and mid-passes: removed and re-inserted, the key starts afresh;
/// re-inserted without removal, the episode goes on.
#[tokio::test(start_paused = true)]
async fn churn() {
    let flag = Flag::default();
    let layer = edas().probe(flag.probe()).probe_cadence(cadence3());
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    h.advance(S).await; // fails
    flag.set(true);
    h.advance(S).await; // pass 1
    h.insert(0); // same key again
    h.sync();
    assert!(!h.is_live(0));
    h.advance(S).await; // pass 2
    assert!(!h.is_live(0));
    h.advance(S).await; // pass 3
    assert!(h.is_live(0));
    // Removed while ejected and re-inserted: available.
    flag.set(false);
    h.calls_while_live(0, 50, 0).await;
    assert!(!h.is_live(0));
    h.remove(0);
    h.sync();
    h.insert(0);
    h.sync();
    assert!(h.is_live(0));
}

/// A layer cloned into two adaptors shares the cadence's dice: both still jitter, and not in
/// step.
#[tokio::test(start_paused = true)]
async fn two_adaptors_one_layer() {
    let a = Flag::default();
    let layer = edas()
        .probe(a.probe())
        .probe_cadence(ProbeCadence::new().seed(5));
    let mut h1 = Harness::new(&layer, 5);
    let mut h2 = Harness::new(&layer, 5);
    h1.calls_while_live(0, 50, 0).await;
    h2.calls_while_live(0, 50, 0).await;
    assert!(!h1.is_live(0) && !h2.is_live(0));
    let mut at = Vec::new();
    for step in 0..1300 {
        let before = a.checks();
        tokio::time::advance(Duration::from_millis(10)).await;
        h1.sync();
        h2.sync();
        for _ in before..a.checks() {
            at.push(step);
        }
    }
    assert_eq!(at.len(), 2, "{at:?}");
    assert!(at[0] >= 1000 && at[1] <= 1200, "{at:?}");
    assert_ne!(at[0], at[1], "{at:?}");
}

/// The default cadence (nothing set) on a user's passive probe: its trial comes later than the
/// policy's 10 s, by the 20 % default jitter.
#[tokio::test(start_paused = true)]
async fn default_jitter_on_a_users_passive_probe() {
    let mut late = 0;
    for seed in 0..5 {
        let layer = edas()
            .probe(PassiveWithWatch)
            .probe_cadence(ProbeCadence::new().seed(seed));
        let mut h = Harness::new(&layer, 5);
        h.calls_while_live(0, 50, 0).await;
        assert!(!h.is_live(0));
        h.advance(Duration::from_millis(10_050)).await;
        if status(&layer, 0) == EndpointStatus::Ejected {
            late += 1;
        }
    }
    // Control: PassiveTrial, same seeds.
    for seed in 0..5 {
        let layer = edas().probe_cadence(ProbeCadence::new().seed(seed));
        let mut h = Harness::new(&layer, 5);
        h.calls_while_live(0, 50, 0).await;
        h.advance(Duration::from_millis(10_050)).await;
        assert_eq!(status(&layer, 0), EndpointStatus::Trial);
    }
    assert_eq!(
        late, 0,
        "{late} of 5 user-passive trials later than the policy's 10 s"
    );
}

fn edas_all(choice: tower_outlier::WhenAllOut) -> OutlierDetectionLayer {
    OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::edas_spring_cloud()
            .recovery_unit(Duration::from_secs(10))
            .max_ejection_ratio(1.0)
            .build()
            .unwrap(),
    ))
    .when_all_out(choice)
}

/// Fail fast and panic: every endpoint out, the checks go on, the threshold holds, and all come
/// back once healed.
#[tokio::test(start_paused = true)]
async fn fail_fast_and_panic() {
    for choice in [
        tower_outlier::WhenAllOut::FailFast,
        tower_outlier::WhenAllOut::panic_below(0.5).unwrap(),
    ] {
        let flag = Flag::default();
        let layer = edas_all(choice)
            .probe(flag.probe())
            .probe_cadence(cadence3().healthy_threshold(2));
        let mut h = Harness::new(&layer, 2);
        h.calls_while_live(0, 50, 0).await;
        h.calls_while_live(1, 50, 0).await;
        let out = |l: &OutlierDetectionLayer<_, _>| crate::support::ejected(&l.monitor());
        assert_eq!(out(&layer).len(), 2, "{choice:?}");
        h.advance(S).await; // both fail
        flag.set(true);
        h.advance(S).await; // pass 1
        assert_eq!(out(&layer).len(), 2, "{choice:?}");
        h.advance(S).await; // pass 2
        assert_eq!(out(&layer).len(), 0, "{choice:?}");
        assert!(h.is_live(0) && h.is_live(1));
    }
}

/// Reconfiguration in the middle of the passes (same policy, new threshold): the episode and its
/// checks go on.
#[tokio::test(start_paused = true)]
async fn reconfigure_mid_passes() {
    let flag = Flag::default();
    let layer = edas().probe(flag.probe()).probe_cadence(cadence3());
    let mut h = Harness::new(&layer, 5);
    h.calls_while_live(0, 50, 0).await;
    h.advance(S).await; // fails
    flag.set(true);
    h.advance(S).await; // pass 1
    layer
        .rules()
        .replace(
            0,
            ErrorRatePolicy::new(
                ErrorRateConfig::edas_spring_cloud()
                    .recovery_unit(Duration::from_secs(20))
                    .max_ejection_ratio(0.4)
                    .build()
                    .unwrap(),
            ),
        )
        .unwrap();
    h.sync();
    assert!(!h.is_live(0));
    h.advance(S).await; // pass 2
    assert!(!h.is_live(0));
    h.advance(S).await; // pass 3
    assert!(h.is_live(0));
}
