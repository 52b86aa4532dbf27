//! A composition's state for one endpoint: each member's state, judged together by the
//! composition's agreement, timed by the members that judged it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::clock::{duration_to_nanos, Nanos};
use crate::outcome::Observation;
use crate::policy::{
    CallsNeeded, Description, EndpointPolicy, Judgement, OwnTiming, ProbeGate, RecoverySchedule,
    Signal,
};

/// A [`ComposedPolicy`](crate::ComposedPolicy)'s state for one endpoint: each member's state, in order.
pub struct ComposedEndpoint {
    pub(super) states: Box<[Box<dyn EndpointPolicy>]>,
    pub(super) names: Box<[&'static str]>,
    pub(super) needed: usize,
    pub(super) schedules: Arc<[RecoverySchedule]>,
    pub(super) gate: Option<usize>,
    pub(super) asks_calls: bool,
    // The members that judged the endpoint an outlier in the last judgement that found it one
    // (bit `i`: member `i`): they time its ejection.
    pub(super) judged: AtomicU64,
}

impl fmt::Debug for ComposedEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComposedEndpoint")
            .field("members", &self.names)
            .field("states", &self.states)
            .finish()
    }
}

impl ComposedEndpoint {
    /// Each member's state, in order.
    pub fn states(&self) -> &[Box<dyn EndpointPolicy>] {
        &self.states
    }

    /// The latest time out any member that judged the endpoint proposes: `own` for a member's
    /// own timing, else its schedule after `failed_checks`.
    fn longest(
        &self,
        failed_checks: u32,
        now: Nanos,
        own: impl Fn(&dyn OwnTiming) -> Option<Nanos>,
    ) -> Option<Nanos> {
        let judged = self.judged.load(Ordering::Relaxed);
        // None recorded (an ejection the layer asked for otherwise): every member proposes.
        let judged = if judged == 0 { u64::MAX } else { judged };
        self.states
            .iter()
            .enumerate()
            .filter(|(index, _)| judged & (1 << index) != 0)
            .map(|(index, state)| {
                state.own_timing().and_then(&own).unwrap_or_else(|| {
                    let delay = self.schedules[index].delay(failed_checks);
                    now.saturating_add(duration_to_nanos(delay))
                })
            })
            .max()
    }
}

impl EndpointPolicy for ComposedEndpoint {
    fn record(&self, observation: &Observation, now: Nanos) -> Signal {
        let mut signal = Signal::None;
        for state in self.states.iter() {
            if state.record(observation, now) == Signal::Evaluate {
                signal = Signal::Evaluate;
            }
        }
        signal
    }

    fn judge(&self, now: Nanos) -> Judgement {
        let mut judged = 0u64;
        let mut first = None;
        for (index, state) in self.states.iter().enumerate() {
            if let Judgement::Outlier(reason) = state.judge(now) {
                judged |= 1 << index;
                first.get_or_insert(reason);
            }
        }
        match first {
            Some(reason) if judged.count_ones() as usize >= self.needed => {
                self.judged.store(judged, Ordering::Relaxed);
                Judgement::Outlier(reason)
            }
            _ => Judgement::Healthy,
        }
    }

    fn describe(&self, now: Nanos) -> Description {
        // The counts of the member that saw the most calls (a passive trial adds them up to see
        // whether it has seen enough: a streak's counts end at each success); the first weight
        // any member gives it. Each member's own are in `members`.
        let shown: Vec<Description> = self.states.iter().map(|s| s.describe(now)).collect();
        Description {
            counts: shown
                .iter()
                .map(|d| d.counts)
                .max_by_key(|counts| counts.calls)
                .unwrap_or_default(),
            state: None,
            weight: shown.iter().find_map(|d| d.weight),
            judged: shown.iter().find_map(|d| d.judged),
        }
    }

    fn reset(&self) {
        for state in self.states.iter() {
            state.reset();
        }
    }

    fn calls_needed(&self) -> Option<&dyn CallsNeeded> {
        if self.asks_calls {
            Some(self)
        } else {
            None
        }
    }

    fn own_timing(&self) -> Option<&dyn OwnTiming> {
        Some(self)
    }

    fn gate(&self) -> Option<&dyn ProbeGate> {
        self.states.get(self.gate?)?.gate()
    }

    fn hears(&self) -> bool {
        self.states.iter().any(|state| state.hears())
    }

    fn hear(&self, signal: &crate::ServerSignal<'_>, now: Nanos) {
        for state in self.states.iter().filter(|state| state.hears()) {
            state.hear(signal, now);
        }
    }

    fn members(&self, now: Nanos) -> Vec<(&'static str, Description)> {
        self.names
            .iter()
            .zip(self.states.iter())
            .map(|(name, state)| (*name, state.describe(now)))
            .collect()
    }
}

impl CallsNeeded for ComposedEndpoint {
    fn calls_wanted(&self, now: Nanos) -> u64 {
        self.states
            .iter()
            .filter_map(|state| state.calls_needed())
            .map(|needs| needs.calls_wanted(now))
            .max()
            .unwrap_or(0)
    }

    fn trial_calls(&self) -> u64 {
        self.states
            .iter()
            .filter_map(|state| state.calls_needed())
            .map(|needs| needs.trial_calls())
            .max()
            .unwrap_or(0)
    }
}

impl OwnTiming for ComposedEndpoint {
    fn check_at(&self, now: Nanos) -> Option<Nanos> {
        self.check_at_after(0, now)
    }

    fn check_at_after(&self, failed_checks: u32, now: Nanos) -> Option<Nanos> {
        self.longest(failed_checks, now, |own| {
            own.check_at_after(failed_checks, now)
        })
    }

    fn check_after_failed_probe(&self, failed_checks: u32, now: Nanos) -> Option<Nanos> {
        self.longest(failed_checks, now, |own| {
            own.check_after_failed_probe(failed_checks, now)
        })
    }

    fn ejection_refused(&self, now: Nanos) {
        for state in self.states.iter() {
            if let Some(own) = state.own_timing() {
                own.ejection_refused(now);
            }
        }
    }

    fn reset_backoff(&self) {
        for state in self.states.iter() {
            if let Some(own) = state.own_timing() {
                own.reset_backoff();
            }
        }
    }
}
