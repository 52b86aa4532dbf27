use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::outcome::Observation;
use crate::policy::{Admit, Description, Judgement, OwnTiming, ProbeGate, Reason, Signal};
use crate::window::WindowCounts;

const SECOND: Nanos = 1_000_000_000;

/// A member whose judgement a test sets, out for `unit` × (failed checks + 1) up to `cap` units;
/// with `own`, timing its ejections itself at `own` seconds (counting how often it was asked).
#[derive(Debug)]
struct Switch {
    name: &'static str,
    outlier: Arc<AtomicBool>,
    unit: u64,
    cap: u32,
    own: Option<u64>,
    asked: Arc<AtomicU32>,
}

impl Switch {
    fn new(name: &'static str, unit: u64) -> Self {
        Switch {
            name,
            outlier: Arc::default(),
            unit,
            cap: 10,
            own: None,
            asked: Arc::default(),
        }
    }
}

#[derive(Debug)]
struct SwitchState {
    name: &'static str,
    outlier: Arc<AtomicBool>,
    own: Option<u64>,
    asked: Arc<AtomicU32>,
    recorded: AtomicU32,
}

impl EndpointPolicy for SwitchState {
    fn record(&self, _: &Observation, _: Nanos) -> Signal {
        self.recorded.fetch_add(1, Ordering::Relaxed);
        if self.outlier.load(Ordering::Relaxed) {
            Signal::Evaluate
        } else {
            Signal::None
        }
    }

    fn judge(&self, _: Nanos) -> Judgement {
        if !self.outlier.load(Ordering::Relaxed) {
            return Judgement::Healthy;
        }
        Judgement::Outlier(Reason {
            policy: self.name,
            measure: "switch",
            value: 1.0,
            threshold: 0.5,
            comparison: crate::Comparison::AtOrAbove,
            counts: WindowCounts::default(),
        })
    }

    fn describe(&self, _: Nanos) -> Description {
        Description {
            counts: WindowCounts {
                calls: u64::from(self.recorded.load(Ordering::Relaxed)),
                failures: 0,
                slow: 0,
            },
            state: Some(self.name),
            weight: None,
            judged: None,
        }
    }

    fn reset(&self) {}

    fn own_timing(&self) -> Option<&dyn OwnTiming> {
        self.own.map(|_| self as &dyn OwnTiming)
    }
}

impl OwnTiming for SwitchState {
    fn check_at(&self, now: Nanos) -> Option<Nanos> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        Some(now + self.own? * SECOND)
    }
}

impl OutlierPolicy for Switch {
    type Endpoint = SwitchState;

    fn name(&self) -> &'static str {
        self.name
    }

    fn new_endpoint(&self) -> SwitchState {
        SwitchState {
            name: self.name,
            outlier: self.outlier.clone(),
            own: self.own,
            asked: self.asked.clone(),
            recorded: AtomicU32::new(0),
        }
    }

    fn recovery(&self) -> RecoverySchedule {
        RecoverySchedule::new(Duration::from_secs(self.unit), self.cap).unwrap()
    }

    fn trial_period(&self) -> Duration {
        Duration::from_secs(self.unit)
    }
}

fn switches(
    units: &[u64],
) -> (
    Vec<Arc<AtomicBool>>,
    ComposedPolicyBuilder,
    ComposedPolicyBuilder,
) {
    let names = ["a", "b", "c", "d"];
    let members: Vec<Switch> = units
        .iter()
        .zip(names)
        .map(|(unit, name)| Switch::new(name, *unit))
        .collect();
    let flags = members.iter().map(|m| m.outlier.clone()).collect();
    let shared: Vec<Arc<dyn DynOutlierPolicy>> = members
        .into_iter()
        .map(<dyn DynOutlierPolicy>::from_policy)
        .collect();
    let build = |builder: ComposedPolicyBuilder| {
        shared
            .iter()
            .cloned()
            .fold(builder, |builder, member| builder.member_shared(member))
    };
    (
        flags,
        build(ComposedPolicy::any_of()),
        build(ComposedPolicy::all_of()),
    )
}

fn is_outlier(judgement: &Judgement) -> bool {
    matches!(judgement, Judgement::Outlier(_))
}

#[test]
fn any_of_judges_on_one_member_and_all_of_on_every_member() {
    let (flags, any, all) = switches(&[5, 30]);
    let (any, all) = (any.build().unwrap(), all.build().unwrap());
    let (one, every) = (any.new_endpoint(), all.new_endpoint());
    assert!(!is_outlier(&one.judge(0)) && !is_outlier(&every.judge(0)));
    flags[1].store(true, Ordering::Relaxed);
    assert!(is_outlier(&one.judge(0)), "OR: one member is enough");
    assert!(!is_outlier(&every.judge(0)), "AND: one member is not");
    flags[0].store(true, Ordering::Relaxed);
    assert!(is_outlier(&every.judge(0)), "AND: both");
}

#[test]
fn k_of_n_judges_on_k_members() {
    let (flags, _, _) = switches(&[1, 2, 3]);
    let policy = flags
        .iter()
        .zip(["a", "b", "c"])
        .fold(ComposedPolicy::at_least(2), |builder, (flag, name)| {
            let mut member = Switch::new(name, 1);
            member.outlier = flag.clone();
            builder.member(member)
        })
        .build()
        .unwrap();
    let endpoint = policy.new_endpoint();
    flags[2].store(true, Ordering::Relaxed);
    assert!(!is_outlier(&endpoint.judge(0)), "1 of 3");
    flags[0].store(true, Ordering::Relaxed);
    let Judgement::Outlier(reason) = endpoint.judge(0) else {
        panic!("2 of 3 is an outlier");
    };
    assert_eq!(reason.policy, "a", "the first member that judged it");
    assert_eq!(policy.name(), "k-of-n");
}

#[test]
fn the_longest_time_out_of_the_members_that_judged_wins() {
    let (flags, any, _) = switches(&[5, 30]);
    let any = any.build().unwrap();
    let endpoint = any.new_endpoint();
    let timing = endpoint.own_timing().unwrap();
    // Only the 5 s member judged it: 5 s, then its schedule after failed checks.
    flags[0].store(true, Ordering::Relaxed);
    assert!(is_outlier(&endpoint.judge(0)));
    assert_eq!(timing.check_at_after(0, 100), Some(100 + 5 * SECOND));
    assert_eq!(timing.check_at_after(2, 100), Some(100 + 15 * SECOND));
    assert_eq!(
        timing.check_after_failed_probe(1, 100),
        Some(100 + 10 * SECOND)
    );
    // Both: the 30 s member's.
    flags[1].store(true, Ordering::Relaxed);
    assert!(is_outlier(&endpoint.judge(0)));
    assert_eq!(timing.check_at_after(0, 0), Some(30 * SECOND));
    assert_eq!(timing.check_after_failed_probe(3, 0), Some(120 * SECOND));
    // A healthy judgement leaves the last ejection's members in charge of its checks.
    flags[0].store(false, Ordering::Relaxed);
    flags[1].store(false, Ordering::Relaxed);
    assert!(!is_outlier(&endpoint.judge(0)));
    assert_eq!(timing.check_after_failed_probe(0, 0), Some(30 * SECOND));
}

#[test]
fn a_member_timing_itself_is_asked_once_and_weighed_with_the_others() {
    let mut own = Switch::new("own", 1);
    own.own = Some(40);
    let (own_flag, asked) = (own.outlier.clone(), own.asked.clone());
    let scheduled = Switch::new("scheduled", 60);
    let scheduled_flag = scheduled.outlier.clone();
    let policy = ComposedPolicy::any_of()
        .member(own)
        .member(scheduled)
        .build()
        .unwrap();
    let endpoint = policy.new_endpoint();
    own_flag.store(true, Ordering::Relaxed);
    assert!(is_outlier(&endpoint.judge(0)));
    assert_eq!(
        endpoint.own_timing().unwrap().check_at(0),
        Some(40 * SECOND)
    );
    assert_eq!(asked.load(Ordering::Relaxed), 1);
    scheduled_flag.store(true, Ordering::Relaxed);
    assert!(is_outlier(&endpoint.judge(0)));
    assert_eq!(
        endpoint.own_timing().unwrap().check_at(0),
        Some(60 * SECOND)
    );
    assert_eq!(asked.load(Ordering::Relaxed), 2, "asked once per ejection");
}

#[test]
fn every_member_records_every_call_and_shows_in_members() {
    let (flags, any, _) = switches(&[1, 2]);
    let endpoint = any.build().unwrap().new_endpoint();
    let call = Observation {
        outcome: crate::Outcome::Success,
        latency: Duration::from_millis(1),
    };
    assert_eq!(endpoint.record(&call, 0), Signal::None);
    flags[1].store(true, Ordering::Relaxed);
    assert_eq!(
        endpoint.record(&call, 0),
        Signal::Evaluate,
        "any member's signal"
    );
    let shown = endpoint.members(0);
    assert_eq!(
        shown
            .iter()
            .map(|(name, d)| (*name, d.counts.calls, d.state))
            .collect::<Vec<_>>(),
        vec![("a", 2, Some("a")), ("b", 2, Some("b"))]
    );
    assert_eq!(
        endpoint.describe(0).counts.calls,
        2,
        "the first member's counts"
    );
}

#[derive(Debug)]
struct Gated;

#[derive(Debug)]
struct GatedState;

impl ProbeGate for GatedState {
    fn poll_admit(
        &self,
        _: bool,
        _: &crate::Clock,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Admit> {
        std::task::Poll::Ready(Admit::Call)
    }
    fn record_probe(&self, _: &Observation, _: Nanos) -> Signal {
        Signal::None
    }
    fn probe_cancelled(&self, _: Nanos) {}
}

impl EndpointPolicy for GatedState {
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
    fn gate(&self) -> Option<&dyn ProbeGate> {
        Some(self)
    }
}

impl OutlierPolicy for Gated {
    type Endpoint = GatedState;
    fn name(&self) -> &'static str {
        "gated"
    }
    fn new_endpoint(&self) -> GatedState {
        GatedState
    }
    fn recovery(&self) -> RecoverySchedule {
        RecoverySchedule::fixed(Duration::from_secs(1))
    }
    fn trial_period(&self) -> Duration {
        Duration::from_secs(1)
    }
}

#[test]
fn bad_compositions_are_typed_errors() {
    let error = ComposedPolicy::any_of().build().unwrap_err();
    assert_eq!(error.field(), "members");
    let error = ComposedPolicy::at_least(3)
        .member(Switch::new("a", 1))
        .member(Switch::new("b", 1))
        .build()
        .unwrap_err();
    assert_eq!((error.field(), error.value()), ("at_least", "3"));
    assert!(ComposedPolicy::at_least(0)
        .member(Switch::new("a", 1))
        .build()
        .is_err());
    let error = ComposedPolicy::any_of()
        .member(Gated)
        .member(Gated)
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("gate readiness"), "{error}");
    // One gate is forwarded.
    let one = ComposedPolicy::any_of()
        .member(Switch::new("a", 1))
        .member(Gated)
        .build()
        .unwrap();
    assert!(one.new_endpoint().gate().is_some());
    let too_many = (0..65).fold(ComposedPolicy::any_of(), |b, _| {
        b.member(Switch::new("a", 1))
    });
    assert!(too_many.build().is_err());
}
