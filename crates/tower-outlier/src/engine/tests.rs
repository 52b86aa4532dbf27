//! The detector's transitions, one by one, without a runtime: time is whatever the test passes,
//! and the policy is a switch the test flips.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower::discover::Change;
use tower_outlier_core::{
    BudgetFloor, Clock, Description, DynOutlierPolicy, EjectionBudget, EndpointPolicy, Judgement,
    Lock, Nanos, NetworkErrors, Observation, Outcome, OutlierPolicy, Reason, RecoverySchedule,
    Signal, WindowCounts,
};

use super::{Engine, Settings, Standing};
use crate::endpoint::OutlierEndpoint;
use crate::monitor::Monitor;
use crate::probe::ProbeFuture;

const UNIT: Duration = Duration::from_secs(30);
const TRIAL: Duration = Duration::from_secs(10);
const MIN_TRIAL_CALLS: u64 = 3;

/// A policy whose endpoints are outliers exactly while the test says so, and count the calls
/// they are told about.
#[derive(Debug, Default)]
struct Switches {
    created: Lock<Vec<Arc<Switch>>>,
}

#[derive(Debug, Default)]
struct Switch {
    outlier: AtomicBool,
    calls: AtomicU64,
}

#[derive(Debug)]
struct SwitchState(Arc<Switch>);

#[derive(Debug)]
struct SwitchPolicy(Arc<Switches>);

impl OutlierPolicy for SwitchPolicy {
    type Endpoint = SwitchState;

    fn name(&self) -> &'static str {
        "switch"
    }

    fn new_endpoint(&self) -> SwitchState {
        let switch = Arc::new(Switch::default());
        self.0.created.lock().push(switch.clone());
        SwitchState(switch)
    }

    fn recovery(&self) -> RecoverySchedule {
        RecoverySchedule::new(UNIT, 3).unwrap()
    }

    fn trial_period(&self) -> Duration {
        TRIAL
    }
}

impl EndpointPolicy for SwitchState {
    fn record(&self, _: &Observation, _: Nanos) -> Signal {
        self.0.calls.fetch_add(1, Ordering::Relaxed);
        if self.0.outlier.load(Ordering::Relaxed) {
            Signal::Evaluate
        } else {
            Signal::None
        }
    }

    fn judge(&self, _: Nanos) -> Judgement {
        if self.0.outlier.load(Ordering::Relaxed) {
            Judgement::Outlier(Reason {
                policy: "switch",
                measure: "switch",
                value: 1.0,
                threshold: 0.0,
                comparison: tower_outlier_core::Comparison::AtOrAbove,
                counts: WindowCounts::default(),
            })
        } else {
            Judgement::Healthy
        }
    }

    fn describe(&self, _: Nanos) -> Description {
        let calls = self.0.calls.swap(0, Ordering::Relaxed);
        Description {
            counts: WindowCounts {
                calls,
                failures: 0,
                slow: 0,
            },
            ..Description::default()
        }
    }

    fn reset(&self) {
        self.0.calls.store(0, Ordering::Relaxed);
    }

    fn calls_needed(&self) -> Option<&dyn tower_outlier_core::CallsNeeded> {
        Some(self)
    }
}

impl tower_outlier_core::CallsNeeded for SwitchState {
    fn calls_wanted(&self, _: Nanos) -> u64 {
        0
    }

    fn trial_calls(&self) -> u64 {
        MIN_TRIAL_CALLS
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Svc(u32);

type TestEngine = Engine<u32, Svc>;

/// Settings running `policy` alone with `budget`, on tokio's clock.
fn settings(
    policy: Arc<dyn DynOutlierPolicy>,
    budget: EjectionBudget,
    registry: &Arc<crate::monitor::Registry>,
) -> Settings {
    let cell = crate::reconfigure::RulesCell::new(vec![policy], registry.clone());
    Settings::new(
        &cell,
        Some(budget),
        None,
        super::settings::DEFAULT_MAX_PUSHBACK,
        Clock::tokio(),
        None,
    )
}

/// The engine, the switches of its endpoints (in insertion order), and the balancer's view.
struct Bench {
    engine: TestEngine,
    switches: Arc<Switches>,
    live: std::collections::HashMap<u32, OutlierEndpoint<Svc, NetworkErrors>>,
    start: Instant,
}

impl Bench {
    /// `n` endpoints, keys 0..n, with a budget of `max_ratio` of them (at least one).
    fn new(n: u32, max_ratio: f64) -> Self {
        let switches = Arc::new(Switches::default());
        let registry = Monitor::new().registry().clone();
        let settings = settings(
            <dyn DynOutlierPolicy>::from_policy(SwitchPolicy(switches.clone())),
            EjectionBudget::new(max_ratio, BudgetFloor::One).unwrap(),
            &registry,
        );
        let start = Instant::now();
        let engine = Engine::new(Arc::new(settings), registry, start);
        let mut bench = Bench {
            engine,
            switches,
            live: Default::default(),
            start,
        };
        for key in 0..n {
            bench.engine.insert(key, Svc(key), start);
        }
        bench.drain();
        bench
    }

    fn at(&self, secs: u64) -> Instant {
        self.start + Duration::from_secs(secs)
    }

    /// Applies every change the engine has for the balancer; returns them as (key, inserted).
    fn drain(&mut self) -> Vec<(u32, bool)> {
        let mut seen = Vec::new();
        while let Some(change) = self.engine.pop_change() {
            match change {
                Change::Insert(key, parts) => {
                    self.live.insert(key, parts.classified(NetworkErrors));
                    seen.push((key, true));
                }
                Change::Remove(key) => {
                    self.live.remove(&key);
                    seen.push((key, false));
                }
            }
        }
        seen
    }

    fn switch(&self, key: u32) -> Arc<Switch> {
        self.switches.created.lock()[key as usize].clone()
    }

    /// Makes `key` an outlier and has one of its calls signal it, as a failing call would.
    fn fail(&mut self, key: u32, now: Instant) {
        self.switch(key).outlier.store(true, Ordering::Relaxed);
        self.record_call(key);
        self.engine.signalled(now);
    }

    fn heal(&self, key: u32) {
        self.switch(key).outlier.store(false, Ordering::Relaxed);
    }

    fn record_call(&self, key: u32) {
        let endpoint = self.endpoint(key);
        let record = endpoint.record();
        let observation = Observation {
            outcome: Outcome::Success,
            latency: Duration::from_millis(1),
        };
        record.observe(&observation, record.clock().now(), 0);
    }

    fn endpoint(&self, key: u32) -> OutlierEndpoint<Svc, NetworkErrors> {
        self.engine.entries[&key]
            .endpoint()
            .classified(NetworkErrors)
    }

    fn status(&self, key: u32) -> Standing {
        self.engine.entries[&key].standing()
    }

    fn failed_checks(&self, key: u32) -> u32 {
        self.engine.entries[&key].failed_checks()
    }

    fn advance_passive(&mut self, now: Instant) {
        self.engine.advance(now, &mut |_, _| None);
    }
}

fn probe_with(result: bool) -> impl FnMut(&u32, &Svc) -> Option<ProbeFuture> {
    move |_, _| Some(Box::pin(std::future::ready(result)) as ProbeFuture)
}

#[test]
fn a_new_endpoint_is_yielded_and_a_known_one_replaced_keeping_its_history() {
    let mut b = Bench::new(3, 0.5);
    assert_eq!(b.engine.tracked(), 3);
    assert_eq!(b.live.len(), 3);
    b.fail(0, b.start);
    assert_eq!(b.drain(), vec![(0, false)]);
    // An ejected endpoint's replacement stays out; an available one's is yielded again.
    b.engine.insert(0, Svc(10), b.start);
    b.engine.insert(1, Svc(11), b.start);
    assert_eq!(b.drain(), vec![(1, true)]);
    assert_eq!(b.live[&1].get_ref(), &Svc(11));
    assert!(matches!(b.status(0), Standing::Ejected { .. }));
    assert_eq!(b.endpoint(0).get_ref(), &Svc(10));
}

#[test]
fn removal_forgets_the_endpoint_and_cancels_its_probe() {
    let mut b = Bench::new(4, 0.5);
    b.engine.remove(&3, b.start);
    assert_eq!(b.drain(), vec![(3, false)]);
    b.engine.remove(&3, b.start);
    assert!(b.drain().is_empty(), "an unknown key is ignored");

    b.fail(0, b.start);
    b.drain();
    b.engine.advance(b.at(30), &mut probe_with(false));
    let probe = b.engine.pop_probe().expect("a probe is due");
    assert!(matches!(b.status(0), Standing::Probing));
    b.engine.remove(&0, b.at(31));
    assert!(
        b.drain().is_empty(),
        "an endpoint out of the set leaves no change"
    );
    assert_eq!(b.engine.take_cancelled(), vec![probe.id]);
    assert_eq!(b.engine.ejected(), 0);
    assert_eq!(b.engine.tracked(), 2);
}

#[test]
fn an_outlier_is_ejected_with_its_first_check_one_unit_later() {
    let mut b = Bench::new(4, 0.5);
    b.fail(2, b.at(5));
    assert_eq!(b.drain(), vec![(2, false)]);
    assert!(matches!(b.status(2), Standing::Ejected { next_check } if next_check == b.at(35)));
    assert_eq!(b.engine.next_deadline(), Some(b.at(35)));
    assert_eq!(b.engine.ejected(), 1);
}

#[test]
fn the_budget_and_the_last_endpoint_refuse_and_a_larger_set_retries() {
    let mut b = Bench::new(2, 0.5);
    b.fail(0, b.start);
    assert_eq!(b.drain(), vec![(0, false)]);
    b.fail(1, b.start);
    assert!(b.drain().is_empty(), "the last available endpoint stays");
    assert_eq!(b.engine.refused.values().collect::<Vec<_>>(), vec![&1]);
    // Four endpoints allow two out: the refused one goes now.
    b.engine.insert(2, Svc(2), b.at(1));
    b.engine.insert(3, Svc(3), b.at(1));
    assert_eq!(b.drain(), vec![(2, true), (3, true), (1, false)]);
    assert!(b.engine.refused.is_empty());
}

#[test]
fn a_passive_check_readmits_on_trial_and_a_clean_trial_with_calls_recovers() {
    let mut b = Bench::new(4, 0.5);
    b.fail(0, b.start);
    b.drain();
    b.heal(0);
    b.advance_passive(b.at(29));
    assert!(b.drain().is_empty(), "not before its check");
    b.advance_passive(b.at(30));
    assert_eq!(b.drain(), vec![(0, true)]);
    assert!(matches!(b.status(0), Standing::Trial { until } if until == b.at(40)));
    for _ in 0..MIN_TRIAL_CALLS {
        b.record_call(0);
    }
    b.advance_passive(b.at(40));
    assert!(matches!(b.status(0), Standing::Available));
    assert_eq!(b.failed_checks(0), 0);
    assert!(
        b.engine.entries[&0].episode().is_none(),
        "a recovered endpoint holds nothing of its ejection"
    );
}

#[test]
fn a_trial_goes_on_until_its_calls_add_up() {
    let mut b = Bench::new(4, 0.5);
    b.fail(0, b.start);
    b.drain();
    b.heal(0);
    b.advance_passive(b.at(30));
    b.advance_passive(b.at(40));
    assert!(matches!(b.status(0), Standing::Trial { until } if until == b.at(50)));
    b.record_call(0);
    b.advance_passive(b.at(50));
    assert!(
        matches!(b.status(0), Standing::Trial { .. }),
        "1 of 3 calls"
    );
    b.record_call(0);
    b.record_call(0);
    b.advance_passive(b.at(60));
    assert!(matches!(b.status(0), Standing::Available), "1 + 2 calls");
}

#[test]
fn a_relapse_on_trial_is_a_failed_check_with_a_longer_interval() {
    let mut b = Bench::new(4, 0.5);
    b.fail(0, b.start);
    b.drain();
    b.advance_passive(b.at(30));
    b.drain();
    b.fail(0, b.at(31));
    assert_eq!(b.drain(), vec![(0, false)]);
    assert_eq!(b.failed_checks(0), 1);
    assert!(matches!(b.status(0), Standing::Ejected { next_check } if next_check == b.at(91)));
}

#[test]
fn a_breach_the_budget_keeps_in_counts_once_and_ejects_when_room_comes() {
    let mut b = Bench::new(4, 0.25);
    b.fail(0, b.start);
    b.drain();
    b.advance_passive(b.at(30));
    b.drain();
    b.fail(1, b.at(31));
    assert_eq!(b.drain(), vec![(1, false)], "1 takes the only slot");
    b.fail(0, b.at(32));
    assert!(b.drain().is_empty(), "the budget keeps 0 in");
    assert_eq!(b.failed_checks(0), 1);
    b.advance_passive(b.at(40));
    assert!(
        matches!(b.status(0), Standing::Trial { .. }),
        "a breached trial is not a recovery"
    );
    assert_eq!(b.failed_checks(0), 1, "one re-admission, one failed check");
    // 1's check re-admits it and frees the slot: 0 goes out two units later.
    b.advance_passive(b.at(61));
    assert_eq!(b.drain(), vec![(1, true), (0, false)]);
    assert!(matches!(b.status(0), Standing::Ejected { next_check } if next_check == b.at(121)));
}

#[test]
fn an_active_probe_readmits_or_lengthens_the_interval() {
    let mut b = Bench::new(4, 0.5);
    b.fail(0, b.start);
    b.drain();
    b.engine.advance(b.at(30), &mut probe_with(false));
    let probe = b.engine.pop_probe().expect("a probe is due");
    assert_eq!((probe.key, probe.timeout), (0, UNIT));
    assert!(b.drain().is_empty(), "a probing endpoint stays out");
    b.engine.probe_done(0, probe.id, false, b.at(31));
    assert_eq!(b.failed_checks(0), 1);
    assert!(matches!(b.status(0), Standing::Ejected { next_check } if next_check == b.at(91)));
    // A result for another probe (an older id) changes nothing.
    b.engine.probe_done(0, probe.id + 100, true, b.at(32));
    assert!(matches!(b.status(0), Standing::Ejected { .. }));

    b.heal(0);
    b.engine.advance(b.at(91), &mut probe_with(true));
    let probe = b.engine.pop_probe().expect("a probe is due");
    b.engine.probe_done(0, probe.id, true, b.at(92));
    assert_eq!(b.drain(), vec![(0, true)]);
    assert!(matches!(b.status(0), Standing::Available));
    assert_eq!(b.failed_checks(0), 0);
    assert!(b.engine.entries[&0].episode().is_none());
}

#[test]
fn removing_the_available_endpoints_readmits_the_earliest_due() {
    let mut b = Bench::new(4, 0.5);
    b.fail(0, b.start);
    b.fail(1, b.at(1));
    assert_eq!(b.drain(), vec![(0, false), (1, false)]);
    b.engine.remove(&2, b.at(2));
    // Three endpoints allow one out: the one due first comes back on trial.
    assert_eq!(b.drain(), vec![(2, false), (0, true)]);
    assert!(matches!(b.status(0), Standing::Trial { .. }));
    b.engine.remove(&3, b.at(3));
    assert_eq!(
        b.drain(),
        vec![(3, false)],
        "0 (on trial) is available; one of two may be out"
    );
    b.engine.remove(&0, b.at(4));
    // Only an ejected one would be left: it comes back too.
    assert_eq!(b.drain(), vec![(0, false), (1, true)]);
    assert_eq!(b.engine.ejected(), 0);
}

#[test]
fn the_next_deadline_is_the_earliest_current_one() {
    let mut b = Bench::new(5, 0.6);
    assert_eq!(b.engine.next_deadline(), None);
    b.fail(0, b.at(10));
    b.fail(1, b.at(5));
    assert_eq!(b.engine.next_deadline(), Some(b.at(35)));
    b.engine.remove(&1, b.at(6));
    assert_eq!(
        b.engine.next_deadline(),
        Some(b.at(40)),
        "a removed endpoint's is dropped"
    );
}

#[test]
fn an_endpoint_ejected_during_a_wake_up_waits_for_its_own_check() {
    // 1 is on trial and kept in by the budget, which 0 holds. 0's check and 1's trial end come
    // due in one wake-up; 0 (discovered first) comes back, which lets 1 out, and 1 must then wait
    // its interval instead of being checked in the same wake-up.
    let mut b = Bench::new(4, 0.25);
    b.fail(1, b.start);
    b.drain();
    b.advance_passive(b.at(30));
    assert_eq!(b.drain(), vec![(1, true)]);
    b.fail(0, b.at(31));
    assert_eq!(b.drain(), vec![(0, false)]);
    b.fail(1, b.at(32));
    assert!(b.drain().is_empty(), "the budget keeps 1 in");
    b.heal(0);
    b.advance_passive(b.at(61));
    assert_eq!(b.drain(), vec![(0, true), (1, false)]);
    assert!(matches!(b.status(1), Standing::Ejected { next_check } if next_check == b.at(121)));
}

#[test]
fn a_probe_abandoned_when_the_budget_shrinks_is_cancelled_and_its_result_ignored() {
    let mut b = Bench::new(4, 0.5);
    b.fail(0, b.start);
    b.drain();
    b.engine.advance(b.at(30), &mut probe_with(true));
    let probe = b.engine.pop_probe().expect("a probe is due");
    // Two endpoints left allow one out, but only 0 is out: removing 1 and 2 leaves 3 alone
    // available, and then removing 3 leaves none — 0 comes back and its probe is abandoned.
    b.engine.remove(&1, b.at(31));
    b.engine.remove(&2, b.at(31));
    b.engine.remove(&3, b.at(31));
    assert_eq!(
        b.drain(),
        vec![(1, false), (2, false), (3, false), (0, true)]
    );
    assert_eq!(b.engine.take_cancelled(), vec![probe.id]);
    assert!(matches!(b.status(0), Standing::Trial { .. }));
    // The abandoned probe's result, should it still arrive, changes nothing.
    b.engine.probe_done(0, probe.id, false, b.at(32));
    assert!(matches!(b.status(0), Standing::Trial { .. }));
    assert_eq!(b.failed_checks(0), 0);
}

/// A fleet policy that counts its evaluations and the members it saw.
#[derive(Debug, Default)]
struct Census {
    evaluations: AtomicU64,
    members: AtomicU64,
}

#[derive(Debug)]
struct CensusPolicy(Arc<Census>);

#[derive(Debug)]
struct CensusState;

impl EndpointPolicy for CensusState {
    fn record(&self, _: &Observation, _: Nanos) -> Signal {
        Signal::None
    }

    fn judge(&self, _: Nanos) -> Judgement {
        Judgement::Healthy
    }

    fn describe(&self, _: Nanos) -> Description {
        Description::default()
    }

    fn reset(&self) {}
}

impl OutlierPolicy for CensusPolicy {
    type Endpoint = CensusState;

    fn name(&self) -> &'static str {
        "census"
    }

    fn new_endpoint(&self) -> CensusState {
        CensusState
    }

    fn recovery(&self) -> RecoverySchedule {
        RecoverySchedule::fixed(UNIT)
    }

    fn trial_period(&self) -> Duration {
        TRIAL
    }

    fn fleet(&self) -> Option<&dyn tower_outlier_core::FleetPolicy<State = CensusState>> {
        Some(self)
    }
}

impl tower_outlier_core::FleetPolicy for CensusPolicy {
    type State = CensusState;

    fn interval(&self) -> Duration {
        Duration::from_secs(20)
    }

    fn evaluate(&self, fleet: &[tower_outlier_core::FleetMember<'_, CensusState>], _: Nanos) {
        self.0.evaluations.fetch_add(1, Ordering::Relaxed);
        self.0
            .members
            .fetch_add(fleet.len() as u64, Ordering::Relaxed);
    }
}

#[test]
fn fleet_evaluations_run_on_their_interval_from_when_they_ran() {
    let census = Arc::new(Census::default());
    let start = Instant::now();
    let registry = Monitor::new().registry().clone();
    let settings = settings(
        <dyn DynOutlierPolicy>::from_policy(CensusPolicy(census.clone())),
        EjectionBudget::new(0.5, BudgetFloor::One).unwrap(),
        &registry,
    );
    let mut engine: TestEngine = Engine::new(Arc::new(settings), registry, start);
    for key in 0..3 {
        engine.insert(key, Svc(key), start);
    }
    let at = |secs| start + Duration::from_secs(secs);
    assert_eq!(engine.next_deadline(), Some(at(20)));
    engine.advance(at(19), &mut |_, _| None);
    assert_eq!(census.evaluations.load(Ordering::Relaxed), 0);
    // Late by 15 s: one evaluation, and the next one interval after it ran, not a burst.
    engine.advance(at(35), &mut |_, _| None);
    assert_eq!(census.evaluations.load(Ordering::Relaxed), 1);
    assert_eq!(
        census.members.load(Ordering::Relaxed),
        3,
        "every endpoint, typed"
    );
    assert_eq!(engine.next_deadline(), Some(at(55)));
}

#[test]
fn a_removed_refused_endpoint_leaves_nothing_behind() {
    let mut b = Bench::new(2, 0.5);
    b.fail(0, b.start);
    assert_eq!(b.drain(), vec![(0, false)]);
    b.fail(1, b.start);
    assert!(b.drain().is_empty());
    assert_eq!(b.engine.refused.len(), 1);
    b.engine.remove(&1, b.at(1));
    assert!(b.engine.refused.is_empty());
    assert!(b.engine.mirror_refused.is_empty());
    // A new endpoint under the same key is judged afresh.
    b.engine.insert(1, Svc(1), b.at(2));
    assert!(b.engine.refused.is_empty());
}

/// `decide` writes nothing, whatever it decides: the record's signals (its server's pushback, the
/// layer's avoidance of its load) are as they were, and deciding again gives the same verdict;
/// what the record is to be told comes back in the verdict, for `apply` to write.
#[tokio::test(start_paused = true)]
async fn deciding_writes_nothing_and_says_what_to_tell() {
    use crate::controls::{Controls, Override};

    let b = Bench::new(4, 0.25);
    let clock_now = b.engine.entries[&0].record().clock().now();
    // #0 asks for an hour (beyond the layer's bound), #1 says it is not serving, #2 is judged an
    // outlier by the rules: one of four may be out, so what comes second is refused.
    let hour = Duration::from_secs(3600).as_nanos() as u64;
    b.engine.entries[&0]
        .record()
        .push_back(clock_now.saturating_add(hour));
    b.engine.entries[&1].record().set_not_serving(true);
    b.switch(2).outlier.store(true, Ordering::Relaxed);
    let mut engine = b.engine;
    let mut told_something = 0;
    let modes: [(&str, Option<Override>, bool); 3] = [
        ("enforcing", None, false),
        ("forced in", Some(Override::ForcedIn), false),
        ("dry run", None, true),
    ];
    for (mode, forced, dry_run) in modes {
        engine.controls = Arc::new(Controls {
            dry_run,
            ..Controls::default()
        });
        for key in 0..4u32 {
            let id = engine.entries[&key].id;
            match forced {
                Some(value) => engine.forced.insert(id, value),
                None => engine.forced.remove(&id),
            };
            let record = engine.entries[&key].record();
            let before = (record.pushed_back_until(0), record.avoided_until(0));
            let verdict = engine.decide(&key);
            let record = engine.entries[&key].record();
            assert_eq!(
                (record.pushed_back_until(0), record.avoided_until(0)),
                before,
                "{mode}: deciding on #{key} wrote its record"
            );
            assert_eq!(engine.decide(&key), verdict, "{mode}: #{key} decided twice");
            if verdict.told != super::decide::Told::default() {
                told_something += 1;
            }
        }
    }
    assert!(told_something >= 3, "the verdicts said nothing to tell");
}
