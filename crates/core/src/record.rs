//! The per-endpoint record every clone of an endpoint and every response future share.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use once_cell::race::OnceBox;

use crate::clock::{duration_to_nanos, Clock, Nanos};
use crate::outcome::{FailureKind, Observation, Outcome};
use crate::policy::{Admit, EndpointPolicy, Judgement, ProbeGate, Reason, Signal};
use crate::window::SharedWindow;

/// Probe permits an endpoint handle or a call holds: bit `i` for the record's policy `i`. Policies
/// past the 32nd cannot gate readiness.
pub type ProbePermits = u32;

const GATED_POLICIES: usize = ProbePermits::BITS as usize;

// The record's marks (`EndpointRecord::marks`).
// The layer is to judge the endpoint (its signal bit is raised with it).
const FLAGGED: u8 = 1;
// A handle's `poll_ready` failed and it holds the endpoint out of its balancer's picks until the
// service is ready again.
const UNREADY: u8 = 2;
// A call timed out or failed in transport since the endpoint joined or was re-admitted: its
// connections may be dead.
const CONNECTION_FAILED: u8 = 4;
// A policy of the record hears what the server says (a load report is read only then). Fixed at
// creation.
const HEARS: u8 = 8;

/// Everything the layer knows about one endpoint: its policies' state, its latency estimate and
/// its relative weight.
///
/// Shared through an `Arc` by the endpoint service, its clones and its in-flight response
/// futures. Recording ([`observe`](Self::observe)) takes no lock and allocates nothing.
// Not padded to cache lines: per call, the record is only read (the calls in flight are counted
// on each handle's own lane, the windows split per core when cores contend, and the latency
// estimate and last outcome are written only when they change), so cores sharing an endpoint do
// not write the lines they share.
pub struct EndpointRecord {
    clock: Clock,
    policies: Policies,
    // The shared window of the first policy that has one (among the first 256), and that
    // policy's index: successes are counted there without calling the policy while it is not
    // watching. Fixed at creation.
    shared_window: Option<Arc<SharedWindow>>,
    shared_index: u8,
    // Bit i: policy i (of the first 32) has a readiness gate. Fixed at creation.
    gated: ProbePermits,
    latency: Latency,
    // The latency estimate's `LAST_*`, `FRESH`, `PEAK_UNCONFIRMED`, `SERVED`, `REPEATED`
    // (`record/latency.rs`). Written only when it changes, so steady success or steady failure
    // costs one load per call. Beside the record's other bytes, not in `Latency`, where it was
    // padded to a word: 8 bytes in every record.
    latency_flags: AtomicU8,
    // f64 bits of the weight relative to the endpoint's original weight (1.0 = full weight).
    weight: AtomicU64,
    // `FLAGGED`, `UNREADY`, `CONNECTION_FAILED`, and `HEARS`, fixed at creation: one byte, not
    // four padded beside the others (8 bytes in every record). Each is written on its
    // transitions only, never per call, and only by `fetch_or` and `fetch_and`.
    marks: AtomicU8,
    // The bit the layer reads the flag by (a chunk of the board and the bit's place in it), given
    // by the layer that tracks the record before it shares it (an `Option`, not a `OnceLock`: 8
    // bytes less in every record; the place apart, among the record's other bytes, 8 more).
    signal_chunk: Option<Arc<SignalChunk>>,
    signal_index: u8,
    // What the layer's options keep beside the calls, made the first time one acts (most
    // endpoints never need it): what the server said of itself, the shares of the balancer's
    // draws, the evidence episodes. Apart, so that the fields every call touches stay together.
    // One pointer, not std's `OnceLock<Box<_>>` (two words): 8 bytes in every record.
    options: OnceBox<Options>,
    notifier: Arc<Notifier>,
}

impl EndpointRecord {
    /// A fresh record with one state per policy, reporting to `notifier`.
    pub fn new(
        clock: Clock,
        policies: Box<[Box<dyn EndpointPolicy>]>,
        notifier: Arc<Notifier>,
    ) -> Self {
        let now = clock.now();
        let gated = policies
            .iter()
            .take(GATED_POLICIES)
            .enumerate()
            .filter(|(_, policy)| policy.gate().is_some())
            .fold(0, |gated, (index, _)| gated | 1 << index);
        let hears = policies.iter().any(|policy| policy.hears());
        let (shared_index, shared_window) = policies
            .iter()
            .enumerate()
            .find_map(|(index, policy)| Some((u8::try_from(index).ok()?, policy.shared_window()?)))
            .map_or((0, None), |(index, shared)| (index, Some(shared)));
        EndpointRecord {
            clock,
            policies: Policies::from(policies),
            shared_window,
            shared_index,
            gated,
            // Zero: an endpoint nobody has measured yet is tried first (the layer seeds endpoints
            // that join a measured fleet with the fleet's mean instead).
            latency: Latency {
                rtt_nanos: AtomicU64::new(0),
                last_sample: AtomicU64::new(now),
                anchor: AtomicU64::new(0),
                peak_at: AtomicU64::new(0),
            },
            latency_flags: AtomicU8::new(LAST_SUCCEEDED | FRESH),
            weight: AtomicU64::new(1.0f64.to_bits()),
            marks: AtomicU8::new(if hears { HEARS } else { 0 }),
            signal_chunk: None,
            signal_index: 0,
            options: OnceBox::new(),
            notifier,
        }
    }

    /// The record of the same endpoint under `policies`, which replace the ones this record was
    /// made for (same number, same order, same names): each state made by
    /// [`DynOutlierPolicy::new_endpoint_from`](crate::DynOutlierPolicy::new_endpoint_from) from this record's, with
    /// the latency estimate, the weight and the last outcome carried over. Cold path.
    pub fn successor(&self, policies: &[Arc<dyn crate::DynOutlierPolicy>]) -> EndpointRecord {
        let now = self.clock.now();
        let states: Box<[Box<dyn EndpointPolicy>]> = policies
            .iter()
            .enumerate()
            .map(|(index, policy)| match self.policies.get(index) {
                Some(previous) => policy.new_endpoint_from(&**previous, now),
                None => policy.new_endpoint(),
            })
            .collect();
        self.successor_with(states)
    }

    /// The record of the same endpoint with `states` (one per policy, made by the caller), the
    /// latency estimate, the weight and the last outcome carried over, as
    /// [`successor`](Self::successor) does. Cold path.
    pub fn successor_with(&self, states: Box<[Box<dyn EndpointPolicy>]>) -> EndpointRecord {
        let mut next = EndpointRecord::new(self.clock.clone(), states, self.notifier.clone());
        next.signal_chunk = self.signal_chunk.clone();
        next.signal_index = self.signal_index;
        next.latency.rtt_nanos.store(
            self.latency.rtt_nanos.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        next.latency.last_sample.store(
            self.latency.last_sample.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        next.latency.anchor.store(
            self.latency.anchor.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        next.latency.peak_at.store(
            self.latency.peak_at.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        next.latency_flags.store(
            self.latency_flags.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        next.weight
            .store(self.weight.load(Ordering::Relaxed), Ordering::Relaxed);
        if let Some(options) = self.options.get() {
            let copy = next.options_or_new();
            copy.heard.copy_from(&options.heard);
            copy.draws.copy_from(&options.draws);
            copy.evidence.copy_from(&options.evidence);
        }
        if self.has_mark(CONNECTION_FAILED) {
            next.marks.fetch_or(CONNECTION_FAILED, Ordering::Relaxed);
        }
        next
    }

    /// The clock timestamps come from.
    #[inline]
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The per-policy states, in the layer's policy order.
    pub fn policies(&self) -> &[Box<dyn EndpointPolicy>] {
        &self.policies
    }

    /// The policy at `index`'s readiness gate, if it has one among the first 32.
    #[inline]
    fn gate(&self, index: usize) -> Option<&dyn ProbeGate> {
        if self.gated & (1 << index) == 0 {
            return None;
        }
        self.policies[index].gate()
    }

    /// Asks every policy's readiness gate; `permits` holds the probe permits this handle has
    /// and gains the ones granted now. `Pending` when any gate waits (its waker registered).
    /// Without a gated policy this is one comparison.
    #[inline]
    pub fn poll_admit(&self, permits: &mut ProbePermits, cx: &mut Context<'_>) -> Poll<()> {
        let mut gated = self.gated;
        while gated != 0 {
            let index = gated.trailing_zeros() as usize;
            gated &= gated - 1;
            let bit = 1 << index;
            let Some(gate) = self.gate(index) else {
                continue;
            };
            match gate.poll_admit(*permits & bit != 0, &self.clock, cx) {
                Poll::Ready(Admit::Call) => *permits &= !bit,
                Poll::Ready(Admit::Probe) => *permits |= bit,
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(())
    }

    /// Gives back probe permits that will not be used.
    pub fn cancel_probes(&self, permits: ProbePermits) {
        if permits == 0 {
            return;
        }
        let now = self.clock.now();
        for index in 0..self.policies.len().min(GATED_POLICIES) {
            if permits & (1 << index) != 0 {
                if let Some(gate) = self.gate(index) {
                    gate.probe_cancelled(now);
                }
            }
        }
    }

    /// Records one finished call that ended at `now`, which held the probe permits `probes`.
    /// Lock-free and allocation-free.
    ///
    /// Cancelled calls are not recorded: they count as neither success nor failure (their probe
    /// permits are given back).
    #[inline]
    pub fn observe(&self, observation: &Observation, now: Nanos, probes: ProbePermits) {
        self.record_observation(
            observation,
            duration_to_nanos(observation.latency),
            now,
            probes,
        );
    }

    /// As [`observe`](Self::observe), for a call whose latency is already in nanoseconds (the
    /// layer's own path: it saves converting the latency back from the observation's
    /// `Duration`).
    #[inline]
    pub fn observe_call(&self, outcome: Outcome, latency: Nanos, now: Nanos, probes: ProbePermits) {
        // `Duration::from_nanos` divides by 10^9 (as a multiply-high, but a long chain on every
        // call); a call under a second needs no division.
        let latency_duration = match u32::try_from(latency) {
            Ok(nanos) if nanos < 1_000_000_000 => Duration::new(0, nanos),
            _ => Duration::from_nanos(latency),
        };
        let observation = Observation {
            outcome,
            latency: latency_duration,
        };
        self.record_observation(&observation, latency, now, probes);
    }

    #[inline]
    fn record_observation(
        &self,
        observation: &Observation,
        latency: Nanos,
        now: Nanos,
        probes: ProbePermits,
    ) {
        let stuck;
        let observation = match observation.outcome {
            Outcome::Cancelled => {
                self.cancel_probes(probes);
                return;
            }
            Outcome::NotSent if self.refusing_for(now) < STUCK_AFTER => {
                // The caller's own stack refused it: no window counts it against the endpoint,
                // and it tested nothing (a probe's permit goes back), but the balancer is steered
                // away for a moment (`LAST_NOT_SENT`).
                self.cancel_probes(probes);
                self.sample_rtt(latency, now, LAST_NOT_SENT);
                return;
            }
            Outcome::NotSent => {
                // Refusing every call for `STUCK_AFTER` with no success between: not a busy
                // stack but a stuck one (a connection that never comes up behind a load
                // shedder). Its endpoint cannot serve: counted as a transport failure.
                stuck = Observation {
                    outcome: Outcome::Failure(FailureKind::Transport),
                    latency: observation.latency,
                };
                &stuck
            }
            _ => observation,
        };
        let last = match observation.outcome {
            Outcome::Failure(FailureKind::Timeout) => {
                self.note_connection_failed();
                LAST_TIMED_OUT
            }
            Outcome::Failure(FailureKind::Transport) => {
                self.note_connection_failed();
                LAST_FAILED
            }
            Outcome::Failure(_) => LAST_FAILED,
            Outcome::Success | Outcome::Cancelled | Outcome::NotSent => LAST_SUCCEEDED,
        };
        // The first timeout after an answer wakes the layer: the endpoint is avoided from now,
        // and only a check at no caller's expense brings it back before its estimate decays.
        let timed_out_anew = last == LAST_TIMED_OUT && !self.last_timed_out();
        self.sample_rtt(latency, now, last);
        let counted = self.count_shared_success(observation, now, probes);
        if counted.is_some() && self.policies.len() == 1 {
            return;
        }
        let mut signal = false;
        for (index, policy) in self.policies.iter().enumerate() {
            if counted == Some(index) {
                continue;
            }
            let gate = if index < GATED_POLICIES && probes & (1 << index) != 0 {
                self.gate(index)
            } else {
                None
            };
            let outcome = match gate {
                Some(gate) => gate.record_probe(observation, now),
                None => policy.record(observation, now),
            };
            signal |= outcome == Signal::Evaluate;
        }
        if (signal || timed_out_anew)
            && !self.has_mark(FLAGGED)
            && !self.mark(FLAGGED, true, Ordering::AcqRel)
        {
            self.raise_flag();
        }
    }

    /// Counts a success in the shared window, without a call into its policy, when that policy
    /// is not watching (see [`SharedWindow`] for who counts what); the policy's index when it did.
    /// Calls holding probe permits go the usual way.
    #[inline]
    fn count_shared_success(
        &self,
        observation: &Observation,
        now: Nanos,
        probes: ProbePermits,
    ) -> Option<usize> {
        let shared = self.shared_window.as_ref()?;
        if observation.outcome != Outcome::Success || probes != 0 {
            return None;
        }
        shared
            .count_success(now)
            .then_some(self.shared_index as usize)
    }

    /// The weight relative to the endpoint's original weight (1.0 until a weight policy sets it).
    pub fn weight(&self) -> f64 {
        f64::from_bits(self.weight.load(Ordering::Relaxed))
    }

    /// Sets the relative weight. Negative and non-numeric weights are stored as 0.
    pub fn set_weight(&self, weight: f64) {
        let weight = if weight.is_finite() && weight > 0.0 {
            weight
        } else {
            0.0
        };
        self.weight.store(weight.to_bits(), Ordering::Relaxed);
    }

    #[cold]
    fn note_connection_failed(&self) {
        if !self.has_mark(CONNECTION_FAILED) {
            self.mark(CONNECTION_FAILED, true, Ordering::Relaxed);
        }
    }

    /// Whether a call timed out or failed in transport (refused, reset, a protocol error) since
    /// the endpoint joined, was re-admitted or this was last asked; asking forgets it.
    pub fn take_connection_failed(&self) -> bool {
        self.has_mark(CONNECTION_FAILED) && self.mark(CONNECTION_FAILED, false, Ordering::Relaxed)
    }

    /// Asks the layer to judge this endpoint soon, as a call that crossed a threshold does: for a
    /// fleet policy whose evaluation found the endpoint an outlier (cold path).
    pub fn request_evaluation(&self) {
        if !self.mark(FLAGGED, true, Ordering::AcqRel) {
            self.raise_flag();
        }
    }

    /// Whether `mark` is set (a relaxed read: each caller orders what it acts on with the
    /// read-modify-write that follows, as the separate flags did).
    #[inline]
    fn has_mark(&self, mark: u8) -> bool {
        self.marks.load(Ordering::Relaxed) & mark != 0
    }

    /// Sets or clears `mark`; whether it was set before.
    #[inline]
    fn mark(&self, mark: u8, set: bool, order: Ordering) -> bool {
        let before = if set {
            self.marks.fetch_or(mark, order)
        } else {
            self.marks.fetch_and(!mark, order)
        };
        before & mark != 0
    }

    /// Marks the endpoint's service not ready (its `poll_ready` failed) or ready again, and tells
    /// the layer when that changes: an endpoint the balancer cannot pick must not count as one it
    /// could fall back on (cold path).
    pub fn set_unready(&self, unready: bool) {
        if self.mark(UNREADY, unready, Ordering::AcqRel) != unready {
            self.request_evaluation();
        }
    }

    /// Whether a handle holds the endpoint out for a readiness error.
    pub fn is_unready(&self) -> bool {
        self.marks.load(Ordering::Acquire) & UNREADY != 0
    }

    /// Clears the signal mark and says whether it was set.
    pub fn take_flag(&self) -> bool {
        self.mark(FLAGGED, false, Ordering::AcqRel)
    }

    /// The first policy that judges this endpoint an outlier, with its reason.
    pub fn judge(&self, now: Nanos) -> Option<(usize, Reason)> {
        self.policies
            .iter()
            .enumerate()
            .find_map(|(index, policy)| match policy.judge(now) {
                Judgement::Outlier(reason) => Some((index, reason)),
                Judgement::Healthy => None,
            })
    }

    /// Forgets every policy's history (the endpoint is re-admitted).
    pub fn reset(&self) {
        for policy in self.policies.iter() {
            policy.reset();
        }
        self.mark(FLAGGED, false, Ordering::Release);
        if let Some(options) = self.options.get() {
            options.heard.forget_pushback();
        }
        self.mark(CONNECTION_FAILED, false, Ordering::Relaxed);
        // No call sampled since: its estimate is not a measurement of its speed now, whether or
        // not the layer finds a fleet estimate to seed it with (none is there while it is the
        // last endpoint in, or when dry run ends), so a stale-estimate exploration never sends a
        // re-admitted black hole a call.
        let flags = self.latency_flags.load(Ordering::Relaxed);
        self.latency_flags.store(
            (flags | FRESH) & !(LAST_MASK | PEAK_UNCONFIRMED | REPEATED),
            Ordering::Relaxed,
        );
    }
}

impl fmt::Debug for EndpointRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointRecord")
            .field("policies", &&*self.policies)
            .field("rtt_nanos", &self.latency.rtt_nanos.load(Ordering::Relaxed))
            .field("weight", &self.weight())
            .finish_non_exhaustive()
    }
}

mod draws;
mod evidence;
mod heard;
mod latency;
mod notify;
mod policies;

use draws::Draws;
use evidence::Evidence;
use heard::Heard;
use policies::Policies;

/// What the layer's options keep for an endpoint beside its calls, each part owned by its file:
/// made the first time one acts, and then for good (one allocation, off the per-call path).
#[derive(Default)]
struct Options {
    heard: Heard,
    draws: Draws,
    evidence: Evidence,
    // When the caller's stack began refusing every call (`Outcome::NotSent`) with no success
    // since, plus one (0: it is not).
    refusing_since: AtomicU64,
}

/// How long the caller's own stack may refuse every call of an endpoint, with no success
/// between, before its refusals count against the endpoint: a busy stack clears in moments.
const STUCK_AFTER: Nanos = 2_000_000_000;

impl EndpointRecord {
    /// How long the caller's stack has refused every call, this one included, with no success
    /// between (cold path: a refusal).
    fn refusing_for(&self, now: Nanos) -> Nanos {
        let since = &self.options_or_new().refusing_since;
        // A success since the last refusal ends the run; another failure does not.
        let answered = self.latency_flags.load(Ordering::Relaxed) & LAST_MASK == LAST_SUCCEEDED;
        let began = since.load(Ordering::Relaxed);
        if began == 0 || answered {
            since.store(now.saturating_add(1), Ordering::Relaxed);
            return 0;
        }
        now.saturating_sub(began - 1)
    }

    /// The options' state, made now if the endpoint has none yet (cold path: one allocation).
    fn options_or_new(&self) -> &Options {
        self.options.get_or_init(Box::default)
    }
}
use latency::*;
pub use latency::{RTT_DECAY, STALE_ESTIMATE};
pub use notify::{store_if_changed, Notifier, SignalChunk, SignalSlot};

#[cfg(test)]
mod tests;
