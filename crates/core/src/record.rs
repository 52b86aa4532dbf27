//! The per-endpoint record every clone of an endpoint and every response future share.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::task::AtomicWaker;

use crate::clock::{duration_to_nanos, Clock, Nanos};
use crate::outcome::{FailureKind, Observation, Outcome};
use crate::policy::{Admit, EndpointPolicy, Judgement, ProbeGate, Reason, Signal};
use crate::window::SharedWindow;

/// Probe permits an endpoint handle or a call holds: bit `i` for the record's policy `i`. Policies
/// past the 32nd cannot gate readiness.
pub type ProbePermits = u32;

const GATED_POLICIES: usize = ProbePermits::BITS as usize;

/// Wakes the task that drives a layer when any endpoint's record signals.
///
/// One per layer instance. Records set the dirty flag and wake; the layer registers its waker
/// before it checks the flag, so a signal is never missed and no poll spins.
pub struct Notifier {
    dirty: AtomicBool,
    waker: AtomicWaker,
    // Whether the layer could eject one more endpoint now (budget and last-endpoint rules).
    room_to_eject: AtomicBool,
}

impl Default for Notifier {
    fn default() -> Self {
        Notifier {
            dirty: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            room_to_eject: AtomicBool::new(true),
        }
    }
}

impl Notifier {
    /// A notifier with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells the records whether an ejection would be allowed now. While it would not (the budget
    /// is spent, or one endpoint is left), gathering evidence against an endpoint only costs
    /// callers failed requests, so [`EndpointRecord::calls_wanted`] asks for none.
    pub fn set_room_to_eject(&self, room: bool) {
        store_if_changed(&self.room_to_eject, room);
    }

    /// Whether an ejection would be allowed now (true until the layer says otherwise).
    pub fn room_to_eject(&self) -> bool {
        self.room_to_eject.load(Ordering::Relaxed)
    }

    /// Marks work pending and wakes the registered task.
    pub fn notify(&self) {
        self.dirty.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Registers the task to wake on the next [`notify`](Self::notify).
    pub fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    /// Takes the pending mark: true once per burst of notifications.
    pub fn take(&self) -> bool {
        // Checking first keeps the idle poll to a plain load.
        self.dirty.load(Ordering::Acquire) && self.dirty.swap(false, Ordering::AcqRel)
    }
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("dirty", &self.dirty.load(Ordering::Relaxed))
            .field("room_to_eject", &self.room_to_eject())
            .finish()
    }
}

/// Where an endpoint's record marks that it wants the layer to look at it: one bit of a board the
/// layer scans a word (64 endpoints) at a time, so a signal never costs the layer a scan of every
/// record. Handed to the record by the layer that tracks it ([`EndpointRecord::set_signal_slot`]).
#[derive(Clone, Debug)]
pub struct SignalSlot {
    chunk: Arc<SignalChunk>,
    word: u16,
    bit: u64,
}

/// 4 096 signal bits, in 64 words.
pub struct SignalChunk {
    words: [AtomicU64; SignalChunk::WORDS],
}

impl SignalChunk {
    const WORDS: usize = 64;
    /// The endpoints one chunk holds.
    pub const SLOTS: usize = Self::WORDS * 64;

    /// A chunk with no bit set.
    pub fn new() -> Arc<Self> {
        Arc::new(SignalChunk {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }

    /// The slot `index` (below [`SLOTS`](Self::SLOTS)) of `chunk`.
    pub fn slot(chunk: &Arc<Self>, index: usize) -> SignalSlot {
        let index = index % Self::SLOTS;
        SignalSlot {
            chunk: chunk.clone(),
            word: (index / 64) as u16,
            bit: 1 << (index % 64),
        }
    }

    /// Takes every bit set, calling `signalled` with each slot's index, lowest first.
    pub fn take(&self, mut signalled: impl FnMut(usize)) {
        for (word_index, word) in self.words.iter().enumerate() {
            // Checking first keeps a quiet word to a plain load.
            if word.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                signalled(word_index * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
    }
}

impl fmt::Debug for SignalChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set: u32 = self
            .words
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones())
            .sum();
        f.debug_struct("SignalChunk").field("set", &set).finish()
    }
}

impl SignalSlot {
    #[inline]
    fn raise(&self) {
        self.chunk.words[self.word as usize].fetch_or(self.bit, Ordering::Release);
    }
}

/// Stores `value` in `flag` unless it already holds it.
///
/// A flag that per-call paths read stays in every reading core's cache while it does not change;
/// an unconditional store would take the line away from all of them each time.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use tower_outlier_core::store_if_changed;
///
/// let suspect = AtomicBool::new(false);
/// store_if_changed(&suspect, true);
/// assert!(suspect.load(Ordering::Relaxed));
/// ```
#[inline]
pub fn store_if_changed(flag: &AtomicBool, value: bool) {
    if flag.load(Ordering::Relaxed) != value {
        flag.store(value, Ordering::Relaxed);
    }
}

/// How fast an idle endpoint's latency estimate decays toward zero (the time constant of
/// `exp(-idle / τ)`), as in tower's peak-EWMA.
pub const RTT_DECAY: Duration = Duration::from_secs(10);

const SAMPLE_TIME_GRANULARITY: Nanos = 1_000_000;

// The smallest change of the latency estimate worth a store: far below any network round trip.
const RTT_STORE_FLOOR: Nanos = 64;

// What the balancer's load reads need to know of the recorded calls, in one byte written only
// when it changes. The last call's outcome (two bits):
const LAST_MASK: u8 = 0b11;
const LAST_SUCCEEDED: u8 = 0;
// Failed fast (refused, reset, an error status): a latency-driven balancer would keep sending
// calls, so the estimate is raised (`penalized`) and per-call judges are sent what they need.
const LAST_FAILED: u8 = 1;
// Timed out: the balancer already avoids the endpoint for the time the call took, and sending it
// calls on purpose would cost callers a timeout each.
const LAST_TIMED_OUT: u8 = 2;
// No call has been sampled since the endpoint was made or re-admitted: the first one may carry a
// connection's set-up (TCP, TLS, an HTTP/2 handshake), which says nothing of the endpoint's speed.
const FRESH: u8 = 0b100;
// The estimate rests on one slow sample that jumped above a fresh estimate, not confirmed by
// another: a healthy endpoint's one slow call, or a connection's handshake. The balancer may
// explore such an endpoint: p2c never picks the costliest of three endpoints, so left to the
// estimate's decay (10 s time constant) it would get nothing for seconds, whatever its speed.
const PEAK_UNCONFIRMED: u8 = 0b1000;

// A success has been recorded since the endpoint joined or was re-admitted.
const SERVED: u8 = 0b1_0000;
// The last two calls failed: with `SERVED`, what it takes before calls are sent on purpose to
// judge the endpoint. One failure of an endpoint that has served may be a gray endpoint's (some
// calls failing, most not), and pulling a call to it after each would hold it at the traffic
// p2c alone gives it.
const REPEATED: u8 = 0b10_0000;

// A sample more than this many times a fresh estimate is a jump to confirm; a later sample more
// than this many times the estimate before the jump confirms it (the endpoint is slow).
const PEAK_JUMP: u64 = 2;
// A failed call raises the estimate to at least this multiple of what it was ...
const FAILURE_STEP: u64 = 2;
// ... up to this multiple of the estimate before the failures began: past it, the endpoint
// already loses every pairing with a healthy one, and the cap bounds how long its estimate takes
// to decay once it heals (about 10 s × ln 16 ≈ 28 s).
const FAILURE_CAP: u64 = 16;
// The cap for an endpoint never measured, in nanoseconds.
const UNMEASURED_FAILURE_CAP: u64 = 16_000_000;

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
    policies: Box<[Box<dyn EndpointPolicy>]>,
    // The shared window of the first policy that has one (among the first 256), and that
    // policy's index: successes are counted there without calling the policy while it is not
    // watching. Fixed at creation.
    shared_window: Option<Arc<SharedWindow>>,
    shared_index: u8,
    // Bit i: policy i (of the first 32) has a readiness gate. Fixed at creation.
    gated: ProbePermits,
    latency: Latency,
    // f64 bits of the weight relative to the endpoint's original weight (1.0 = full weight).
    weight: AtomicU64,
    flagged: AtomicBool,
    // The bit the layer reads the flag by, once a layer tracks the record.
    signal_slot: OnceLock<SignalSlot>,
    // A handle's `poll_ready` failed and it holds the endpoint out of its balancer's picks until
    // the service is ready again (cold path: written on the transitions only).
    unready: AtomicBool,
    notifier: Arc<Notifier>,
}

/// Peak-sensitive EWMA of latencies, in nanoseconds, and when it last took a sample.
struct Latency {
    rtt_nanos: AtomicU64,
    last_sample: AtomicU64,
    // The estimate before the current streak of failures began (restored by the first success),
    // or before an unconfirmed peak (what a confirming sample is measured against).
    anchor: AtomicU64,
    // `LAST_*`, `FRESH`, `PEAK_UNCONFIRMED`, `SERVED`, `REPEATED`. Written only when it changes, so steady success or
    // steady failure costs one load per call; it sits on the line completions already write, away
    // from the read-mostly fields.
    flags: AtomicU8,
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
        let (shared_index, shared_window) = policies
            .iter()
            .enumerate()
            .find_map(|(index, policy)| Some((u8::try_from(index).ok()?, policy.shared_window()?)))
            .map_or((0, None), |(index, shared)| (index, Some(shared)));
        EndpointRecord {
            clock,
            policies,
            shared_window,
            shared_index,
            gated,
            // Zero: an endpoint nobody has measured yet is tried first (the layer seeds endpoints
            // that join a measured fleet with the fleet's mean instead).
            latency: Latency {
                rtt_nanos: AtomicU64::new(0),
                last_sample: AtomicU64::new(now),
                anchor: AtomicU64::new(0),
                flags: AtomicU8::new(LAST_SUCCEEDED | FRESH),
            },
            weight: AtomicU64::new(1.0f64.to_bits()),
            flagged: AtomicBool::new(false),
            signal_slot: OnceLock::new(),
            unready: AtomicBool::new(false),
            notifier,
        }
    }

    /// The record of the same endpoint under `policies`, which replace the ones this record was
    /// made for (same number, same order, same names): each state made by
    /// [`Policy::new_endpoint_from`](crate::Policy::new_endpoint_from) from this record's, with
    /// the latency estimate, the weight and the last outcome carried over. Cold path.
    pub fn successor(&self, policies: &[Arc<dyn crate::Policy>]) -> EndpointRecord {
        let now = self.clock.now();
        let states: Box<[Box<dyn EndpointPolicy>]> = policies
            .iter()
            .enumerate()
            .map(|(index, policy)| match self.policies.get(index) {
                Some(previous) => policy.new_endpoint_from(&**previous, now),
                None => policy.new_endpoint(),
            })
            .collect();
        let next = EndpointRecord::new(self.clock.clone(), states, self.notifier.clone());
        if let Some(slot) = self.signal_slot.get() {
            next.set_signal_slot(slot.clone());
        }
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
        next.latency.flags.store(
            self.latency.flags.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        next.weight
            .store(self.weight.load(Ordering::Relaxed), Ordering::Relaxed);
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
        if observation.outcome == Outcome::Cancelled {
            self.cancel_probes(probes);
            return;
        }
        let last = match observation.outcome {
            Outcome::Failure(FailureKind::Timeout) => LAST_TIMED_OUT,
            Outcome::Failure(_) => LAST_FAILED,
            Outcome::Success | Outcome::Cancelled => LAST_SUCCEEDED,
        };
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
        if signal
            && !self.flagged.load(Ordering::Relaxed)
            && !self.flagged.swap(true, Ordering::AcqRel)
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

    #[inline]
    fn sample_rtt(&self, rtt: u64, now: Nanos, last: u8) {
        let flags = self.latency.flags.load(Ordering::Relaxed);
        // A racing sample may overwrite this one; for a load estimate that is harmless and it
        // keeps the hot path free of compare-and-swap loops.
        let stored = self.latency.rtt_nanos.load(Ordering::Relaxed);
        let idle = now.saturating_sub(self.latency.last_sample.load(Ordering::Relaxed));
        // The stored value is the estimate as of the last sample: blend the new sample with what
        // it has decayed to since, or one slow call followed by an idle stretch would be revived
        // by the next fast call and keep the endpoint out of a latency-driven balancer's picks.
        // Idle decay has a 10 s time constant; a millisecond of staleness does not matter.
        let recent = idle < SAMPLE_TIME_GRANULARITY;
        let old = if recent {
            stored
        } else {
            (stored as f64 * decay(idle)) as u64
        };
        let (next, flags_next) =
            if flags & (FRESH | LAST_MASK) == LAST_SUCCEEDED && last == LAST_SUCCEEDED {
                // The steady state: a success after a success.
                let next = peak_ewma(old, rtt);
                (next, self.peak_flags(flags, old, next, rtt))
            } else {
                self.sample_unusual(flags, old, rtt, last)
            };
        let flags_next = if last == LAST_SUCCEEDED {
            (flags_next | SERVED) & !REPEATED
        } else if flags & LAST_MASK != LAST_SUCCEEDED && flags & FRESH == 0 {
            flags_next | REPEATED
        } else {
            flags_next
        };
        // After a failure the flags are stored even when unchanged: a success completing at the
        // same time on another core may have just cleared them, and its restored estimate lost
        // to this failure's penalty; the failure's flags then say what the estimate holds (the
        // next success restores it). Failures are the rare path; successes store only changes.
        if flags_next != flags || last != LAST_SUCCEEDED {
            self.latency.flags.store(flags_next, Ordering::Relaxed);
        }
        if !recent {
            self.latency.rtt_nanos.store(next, Ordering::Relaxed);
            self.latency.last_sample.store(now, Ordering::Relaxed);
        } else if next.abs_diff(stored) > (stored >> 6).max(RTT_STORE_FLOOR) {
            // Changes under 1/64 (1.6 %), or under 64 ns, are not stored, so callers on several
            // cores do not fight over the cache line in steady state (without the floor, a
            // service answering in tens of nanoseconds would store on nearly every call).
            self.latency.rtt_nanos.store(next, Ordering::Relaxed);
        }
    }

    /// `PEAK_UNCONFIRMED` after a success of latency `rtt` moved the estimate from `old` to `next`.
    /// Set by a jump above the estimate, remembering the estimate before it; cleared by a sample
    /// that jumps as far above that (the endpoint is slow: a genuinely slow endpoint that p2c
    /// tries again as its estimate decays gets one explored call more, no more), or once the
    /// estimate is back within a quarter of it. An endpoint starved by p2c is sampled rarely, so
    /// one noisy sample must not be enough to keep it out.
    #[inline]
    fn peak_flags(&self, flags: u8, old: u64, next: u64, rtt: u64) -> u8 {
        if flags & PEAK_UNCONFIRMED != 0 {
            let anchor = self.latency.anchor.load(Ordering::Relaxed);
            let confirmed = rtt > anchor.saturating_mul(PEAK_JUMP);
            let settled = next.saturating_mul(4) <= anchor.saturating_mul(5);
            if confirmed || settled {
                return flags & !PEAK_UNCONFIRMED;
            }
        } else if old > 0 && rtt > old.saturating_mul(PEAK_JUMP) {
            self.latency.anchor.store(old, Ordering::Relaxed);
            return flags | PEAK_UNCONFIRMED;
        }
        flags
    }

    /// The estimate and flags after a sample that is not a success following a success: the
    /// first sample of a fresh endpoint, a failure, or the success that ends failures.
    #[cold]
    fn sample_unusual(&self, flags: u8, old: u64, rtt: u64, last: u8) -> (u64, u8) {
        let anchor = &self.latency.anchor;
        let mut next_flags = (flags & !(LAST_MASK | FRESH)) | last;
        let next = if flags & FRESH != 0 && last == LAST_SUCCEEDED {
            // The first call may have set up the connection: it moves the estimate as an
            // ordinary average would, without the peak rule. (A failure is no such sample: it
            // takes the failure rules below, so that an endpoint refusing from its first call
            // is not the cheapest pick, and a black hole does not look fast.)
            let blended = if old == 0 {
                // Never measured and not seeded (the fleet's first endpoints): nothing to average
                // with, and an eighth of a 40 ms handshake is still fifty times a 0.1 ms call. The
                // next call is the first sample.
                0
            } else if rtt >= old {
                old + (rtt - old) / 8
            } else {
                old - (old - rtt) / 8
            };
            if old > 0 && rtt > old.saturating_mul(PEAK_JUMP) {
                // Even an eighth of a handshake can make the endpoint the costliest pick.
                anchor.store(old, Ordering::Relaxed);
                next_flags |= PEAK_UNCONFIRMED;
            }
            return (blended, next_flags);
        } else if last == LAST_SUCCEEDED {
            // The first success after failures: the endpoint is back, at the speed it had before
            // they began (their penalties and timeouts say nothing of it).
            let before = anchor.load(Ordering::Relaxed);
            peak_ewma(old.min(before.max(rtt)), rtt)
        } else {
            // A failure ends an unconfirmed peak, whose anchor (the estimate before it) is then
            // the estimate before the failures too.
            if flags & (LAST_MASK | PEAK_UNCONFIRMED) == LAST_SUCCEEDED || flags & FRESH != 0 {
                anchor.store(old, Ordering::Relaxed);
            }
            next_flags &= !PEAK_UNCONFIRMED;
            if last == LAST_TIMED_OUT {
                peak_ewma(old, rtt)
            } else {
                // A fast failure must not make the endpoint the balancer's cheapest pick: each one
                // doubles the estimate (from at least a microsecond), up to a cap. An endpoint
                // never measured (failing from its first call, before the fleet had an estimate
                // to seed it with) has nothing to scale the cap by: 16 ms then.
                let before = anchor.load(Ordering::Relaxed);
                let cap = if before == 0 {
                    UNMEASURED_FAILURE_CAP
                } else {
                    before.saturating_mul(FAILURE_CAP)
                };
                rtt.max(old.saturating_mul(FAILURE_STEP).max(1_000).min(cap))
            }
        };
        (next, next_flags)
    }

    /// The latency estimate at `now`, in nanoseconds: the peak-sensitive EWMA of observed
    /// latencies, decayed toward zero by `exp(-idle / 10 s)` while the endpoint is idle.
    pub fn rtt_estimate(&self, now: Nanos) -> f64 {
        let rtt = self.latency.rtt_nanos.load(Ordering::Relaxed) as f64;
        let idle = now.saturating_sub(self.latency.last_sample.load(Ordering::Relaxed));
        rtt * decay(idle)
    }

    /// Whether the last recorded call failed (in any way).
    pub fn last_call_failed(&self) -> bool {
        self.latency.flags.load(Ordering::Relaxed) & LAST_MASK != LAST_SUCCEEDED
    }

    /// When a call of the endpoint last completed (or its estimate was seeded), on the layer's
    /// clock, to a millisecond.
    #[inline]
    pub fn last_completed(&self) -> Nanos {
        self.latency.last_sample.load(Ordering::Relaxed)
    }

    /// How long ago the endpoint's last call completed, if that call failed: while this grows the
    /// balancer is routing around the endpoint (its estimate carries the failures) without its
    /// policies having judged it. Approximate to a millisecond.
    pub fn failing_for(&self, now: Nanos) -> Option<Duration> {
        if !self.last_call_failed() {
            return None;
        }
        let last = self.latency.last_sample.load(Ordering::Relaxed);
        Some(Duration::from_nanos(now.saturating_sub(last)))
    }

    /// Whether the endpoint should get one call to follow up a fast failure (any failure but a
    /// timeout) of `quiet` ago or more, after which no call has completed: the balancer is
    /// avoiding it on that one failure, which may be a server gone for good or a blip, and only a
    /// call tells them apart — when a policy would judge on it (one wants calls,
    /// [`EndpointPolicy::calls_wanted`]: a streak under way) and the layer has room to eject.
    /// Otherwise the call would only fail again for nothing.
    pub fn follow_up_wanted(&self, quiet: Nanos, now: Nanos) -> bool {
        self.latency.flags.load(Ordering::Relaxed) & LAST_MASK == LAST_FAILED
            && now.saturating_sub(self.latency.last_sample.load(Ordering::Relaxed)) >= quiet
            && self.notifier.room_to_eject()
            && self
                .policies
                .iter()
                .any(|policy| policy.calls_wanted(now) > 0)
    }

    /// Whether the estimate rests on one slow sample that jumped far above a fresh estimate and
    /// that no later sample confirmed: a healthy endpoint's one slow call, which a balancer may
    /// explore past rather than wait for the estimate to decay.
    pub fn peak_unconfirmed(&self) -> bool {
        self.latency.flags.load(Ordering::Relaxed) & (PEAK_UNCONFIRMED | LAST_MASK)
            == PEAK_UNCONFIRMED
    }

    /// The cheap half of [`calls_wanted`](Self::calls_wanted): whether its policies could want
    /// calls at all (two relaxed loads, no window read).
    #[inline]
    pub fn may_want_calls(&self) -> bool {
        let flags = self.latency.flags.load(Ordering::Relaxed);
        flags & LAST_MASK == LAST_FAILED
            && (flags & REPEATED != 0 || flags & SERVED == 0)
            && self.notifier.room_to_eject()
    }

    /// How many more calls this endpoint should get before its policies can judge it: the most
    /// any policy wants ([`EndpointPolicy::calls_wanted`]). Asked only while the last call failed
    /// fast (any failure but a timeout: 503 and UNAVAILABLE included, which behind a proxy are what
    /// a dead upstream looks like), the one before it failed too or the endpoint has served
    /// nothing since it joined or was re-admitted (one failure of a serving endpoint may be a gray
    /// endpoint's: pulling a call after each would hold it at the traffic p2c alone gives it),
    /// and the layer has room to eject ([`Notifier::room_to_eject`]); 0 otherwise, without reading
    /// any window. After a timeout nothing is wanted: the balancer
    /// already avoids the endpoint for the time the call took, and each call sent on purpose would
    /// cost a caller a timeout.
    pub fn calls_wanted(&self, now: Nanos) -> u64 {
        if !self.may_want_calls() {
            return 0;
        }
        self.policies
            .iter()
            .map(|policy| policy.calls_wanted(now))
            .max()
            .unwrap_or(0)
    }

    /// Restarts the latency estimate at `rtt_nanos` as of `now`.
    ///
    /// The layer seeds new and re-admitted endpoints with the mean estimate of the available ones,
    /// so a power-of-two-choices balancer gives them a fair share instead of judging them by stale
    /// samples (or by none).
    pub fn seed_rtt(&self, rtt_nanos: f64, now: Nanos) {
        let rtt = if rtt_nanos.is_finite() && rtt_nanos >= 0.0 {
            rtt_nanos as u64
        } else {
            0
        };
        self.latency.rtt_nanos.store(rtt, Ordering::Relaxed);
        self.latency.last_sample.store(now, Ordering::Relaxed);
        self.latency.anchor.store(rtt, Ordering::Relaxed);
        // Its next call may set up a connection again, and it has served nothing since.
        let flags = self.latency.flags.load(Ordering::Relaxed);
        self.latency
            .flags
            .store((flags | FRESH) & !(SERVED | REPEATED), Ordering::Relaxed);
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

    /// Asks the layer to judge this endpoint soon, as a call that crossed a threshold does: for a
    /// fleet policy whose evaluation found the endpoint an outlier (cold path).
    pub fn request_evaluation(&self) {
        if !self.flagged.swap(true, Ordering::AcqRel) {
            self.raise_flag();
        }
    }

    /// The flag was just set: mark the record's bit and wake the layer.
    #[cold]
    fn raise_flag(&self) {
        if let Some(slot) = self.signal_slot.get() {
            slot.raise();
        }
        self.notifier.notify();
    }

    /// Gives the record the bit its layer reads its flag by (once; later calls are ignored).
    /// A flag already set is marked at once.
    pub fn set_signal_slot(&self, slot: SignalSlot) {
        if self.signal_slot.set(slot).is_ok() && self.flagged.load(Ordering::Acquire) {
            self.raise_flag();
        }
    }

    /// Marks the endpoint's service not ready (its `poll_ready` failed) or ready again, and tells
    /// the layer when that changes: an endpoint the balancer cannot pick must not count as one it
    /// could fall back on (cold path).
    pub fn set_unready(&self, unready: bool) {
        if self.unready.swap(unready, Ordering::AcqRel) != unready {
            self.request_evaluation();
        }
    }

    /// Whether a handle holds the endpoint out for a readiness error.
    pub fn is_unready(&self) -> bool {
        self.unready.load(Ordering::Acquire)
    }

    /// Clears the signal mark and says whether it was set.
    pub fn take_flag(&self) -> bool {
        self.flagged.swap(false, Ordering::AcqRel)
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
        self.flagged.store(false, Ordering::Release);
        let flags = self.latency.flags.load(Ordering::Relaxed);
        self.latency.flags.store(
            flags & !(LAST_MASK | PEAK_UNCONFIRMED | REPEATED),
            Ordering::Relaxed,
        );
    }
}

/// The peak-sensitive moving average: a sample above the estimate replaces it, one below moves
/// it an eighth of the way down.
#[inline]
fn peak_ewma(old: u64, rtt: u64) -> u64 {
    if rtt >= old {
        rtt
    } else {
        old - (old - rtt) / 8
    }
}

/// `exp(-idle / RTT_DECAY)`. Calls a few milliseconds apart (the common case) take the series, which
/// is accurate to 1e-6 there and much cheaper than `exp`.
#[inline]
fn decay(idle: Nanos) -> f64 {
    let x = idle as f64 / RTT_DECAY.as_nanos() as f64;
    if x < 1.0 / 64.0 {
        1.0 - x + x * x / 2.0
    } else {
        (-x).exp()
    }
}

impl fmt::Debug for EndpointRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointRecord")
            .field("policies", &self.policies)
            .field("rtt_nanos", &self.latency.rtt_nanos.load(Ordering::Relaxed))
            .field("weight", &self.weight())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::FailureKind;

    const MS: Nanos = 1_000_000;

    fn record() -> EndpointRecord {
        EndpointRecord::new(Clock::tokio(), Box::new([]), Arc::new(Notifier::new()))
    }

    fn call(record: &EndpointRecord, outcome: Outcome, latency_ms: u64, now: Nanos) {
        let observation = Observation {
            outcome,
            latency: Duration::from_millis(latency_ms),
        };
        record.observe(&observation, now, 0);
    }

    /// A record whose first call (which may set up a connection) is behind it.
    fn warm_record() -> EndpointRecord {
        let record = record();
        call(&record, Outcome::Success, 0, record.clock().now());
        record
    }

    #[test]
    fn a_fast_call_after_an_idle_stretch_blends_with_the_decayed_estimate() {
        let record = warm_record();
        let start = record.clock().now();
        call(&record, Outcome::Success, 1000, start);
        assert!((record.rtt_estimate(start) - 1e9).abs() < 1e6);
        // A minute idle: the estimate has decayed to 1 s × e^-6 ≈ 2.5 ms. A 1 ms call blends
        // with that, not with the 1 s stored before the idle stretch.
        let later = start + 60_000 * MS;
        call(&record, Outcome::Success, 1, later);
        let estimate = record.rtt_estimate(later);
        assert!(
            (2.0 * MS as f64..2.5 * MS as f64).contains(&estimate),
            "estimate {estimate} ns"
        );
    }

    #[test]
    fn estimates_of_tens_of_nanoseconds_are_not_rewritten_on_every_call() {
        let record = warm_record();
        let start = record.clock().now();
        let nanos = |ns| Observation {
            outcome: Outcome::Success,
            latency: Duration::from_nanos(ns),
        };
        // A sample after an idle stretch is always stored: 100 ns.
        record.observe(&nanos(100), start + 2 * MS, 0);
        assert_eq!(record.latency.rtt_nanos.load(Ordering::Relaxed), 100);
        // Then, within the millisecond, calls of 60 to 90 ns move the estimate by less than 64 ns
        // each: no store, so several cores calling do not share a written cache line.
        for ns in [60, 90, 70, 80] {
            record.observe(&nanos(ns), start + 2 * MS + 10, 0);
        }
        assert_eq!(record.latency.rtt_nanos.load(Ordering::Relaxed), 100);
        // A change of more than 64 ns is stored.
        record.observe(&nanos(1_000), start + 2 * MS + 20, 0);
        assert_eq!(record.latency.rtt_nanos.load(Ordering::Relaxed), 1_000);
    }

    #[test]
    fn decay_matches_exp_on_both_branches() {
        for idle_ms in [0, 1, 10, 100, 156, 157, 1_000, 10_000, 100_000] {
            let idle = idle_ms * MS;
            let exact = (-(idle as f64) / RTT_DECAY.as_nanos() as f64).exp();
            assert!((decay(idle) - exact).abs() < 1e-6, "{idle_ms} ms");
        }
    }

    /// A policy that always wants five more calls.
    #[derive(Debug)]
    struct WantsFive;

    impl EndpointPolicy for WantsFive {
        fn record(&self, _: &Observation, _: Nanos) -> Signal {
            Signal::None
        }
        fn judge(&self, _: Nanos) -> Judgement {
            Judgement::Healthy
        }
        fn counts(&self, _: Nanos) -> crate::window::WindowCounts {
            Default::default()
        }
        fn reset(&self) {}
        fn calls_wanted(&self, _: Nanos) -> u64 {
            5
        }
    }

    #[test]
    fn calls_are_wanted_after_a_failure_while_an_ejection_is_possible() {
        let notifier = Arc::new(Notifier::new());
        let record = EndpointRecord::new(
            Clock::tokio(),
            Box::new([Box::new(WantsFive) as Box<dyn EndpointPolicy>]),
            notifier.clone(),
        );
        let now = record.clock().now();
        assert_eq!(record.calls_wanted(now), 0, "not after a success");
        call(&record, Outcome::Failure(FailureKind::Overload), 1, now);
        assert_eq!(
            record.calls_wanted(now),
            5,
            "503 and UNAVAILABLE are judged like any fast failure"
        );
        notifier.set_room_to_eject(false);
        assert_eq!(
            record.calls_wanted(now),
            0,
            "not when no ejection is possible"
        );
        notifier.set_room_to_eject(true);
        call(&record, Outcome::Failure(FailureKind::Transport), 1, now);
        assert_eq!(record.calls_wanted(now), 5);
        call(&record, Outcome::Failure(FailureKind::Timeout), 1000, now);
        assert_eq!(
            record.calls_wanted(now),
            0,
            "not after a timeout: each call sent on purpose would cost a caller a timeout"
        );
    }

    fn estimate_ms(record: &EndpointRecord, now: Nanos) -> f64 {
        record.rtt_estimate(now) / MS as f64
    }

    #[test]
    fn the_first_call_moves_the_estimate_as_an_average_not_as_a_peak() {
        let record = record();
        let now = record.clock().now();
        record.seed_rtt(MS as f64, now);
        // A 41 ms first call (a TCP and HTTP/2 handshake against 1 ms calls): an eighth of the
        // way, not all of it.
        call(&record, Outcome::Success, 41, now);
        assert!((estimate_ms(&record, now) - 6.0).abs() < 0.01);
        // The second is a sample like any other.
        call(&record, Outcome::Success, 41, now);
        assert!((estimate_ms(&record, now) - 41.0).abs() < 0.01);
        // Re-admission (a new seed) makes the next call a first call again.
        record.seed_rtt(MS as f64, now);
        call(&record, Outcome::Success, 41, now);
        assert!((estimate_ms(&record, now) - 6.0).abs() < 0.01);
        // A first call that times out is taken as it is: a black hole must not look fast.
        record.seed_rtt(MS as f64, now);
        call(&record, Outcome::Failure(FailureKind::Timeout), 1000, now);
        assert!((estimate_ms(&record, now) - 1000.0).abs() < 0.01);
    }

    #[test]
    fn fast_failures_double_the_estimate_up_to_a_cap_and_a_success_restores_it() {
        let record = warm_record();
        let now = record.clock().now();
        record.seed_rtt(MS as f64, now);
        call(&record, Outcome::Success, 1, now);
        // Refused connections answer in microseconds: each doubles the estimate instead of
        // lowering it, so the endpoint loses every pairing with a healthy 1 ms one.
        let mut expected = 1.0;
        for _ in 0..4 {
            call(&record, Outcome::Failure(FailureKind::Transport), 0, now);
            expected *= 2.0;
            assert!((estimate_ms(&record, now) - expected).abs() < 0.01);
        }
        for _ in 0..10 {
            call(&record, Outcome::Failure(FailureKind::ServerError), 0, now);
        }
        assert!(
            (estimate_ms(&record, now) - 16.0).abs() < 0.01,
            "capped at 16 times the estimate before the failures"
        );
        // Back: the speed it had before, not an eighth of the way down from the penalty.
        call(&record, Outcome::Success, 1, now);
        assert!((estimate_ms(&record, now) - 1.0).abs() < 0.01);
        // A failure slower than the cap is taken as it is.
        call(&record, Outcome::Failure(FailureKind::ServerError), 50, now);
        assert!((estimate_ms(&record, now) - 50.0).abs() < 0.01);
    }

    #[test]
    fn one_slow_call_is_a_peak_to_confirm() {
        let record = warm_record();
        let now = record.clock().now();
        record.seed_rtt(MS as f64, now);
        call(&record, Outcome::Success, 1, now);
        assert!(!record.peak_unconfirmed());
        call(&record, Outcome::Success, 1000, now);
        assert!(
            record.peak_unconfirmed(),
            "a jump far above a fresh estimate"
        );
        call(&record, Outcome::Success, 1, now);
        assert!(record.peak_unconfirmed(), "a fast call does not confirm it");
        call(&record, Outcome::Success, 800, now);
        assert!(!record.peak_unconfirmed(), "a slow one does");
        // An idle endpoint's decayed estimate: a slow call then is how a balancer tries a slow
        // endpoint again, not a healthy endpoint's accident.
        let later = now + 120_000 * MS;
        call(&record, Outcome::Success, 1, later);
        let much_later = later + 120_000 * MS;
        call(&record, Outcome::Success, 1000, much_later);
        assert!(!record.peak_unconfirmed());
        call(
            &record,
            Outcome::Failure(FailureKind::Transport),
            1,
            much_later,
        );
        assert!(
            !record.peak_unconfirmed(),
            "never while the last call failed"
        );
    }

    #[test]
    fn evidence_is_wanted_only_after_a_failure_other_than_overload() {
        let record = record();
        let now = record.clock().now();
        assert!(!record.last_call_failed());
        call(&record, Outcome::Failure(FailureKind::Timeout), 1000, now);
        assert!(record.last_call_failed());
        call(&record, Outcome::Failure(FailureKind::Overload), 1, now);
        assert!(record.last_call_failed());
        call(&record, Outcome::Cancelled, 1, now);
        assert!(
            record.last_call_failed(),
            "a cancelled call is not recorded"
        );
        record.reset();
        assert!(!record.last_call_failed(), "re-admission starts afresh");
    }

    /// A policy that shares its window and counts the calls that reach its `record`.
    #[derive(Debug)]
    struct Sharing {
        shared: Arc<SharedWindow>,
        recorded: AtomicU64,
    }

    impl EndpointPolicy for Sharing {
        fn record(&self, observation: &Observation, now: Nanos) -> Signal {
            self.recorded.fetch_add(1, Ordering::Relaxed);
            self.shared
                .window()
                .record(now, observation.outcome.is_failure(), false);
            Signal::None
        }
        fn judge(&self, _: Nanos) -> Judgement {
            Judgement::Healthy
        }
        fn counts(&self, now: Nanos) -> crate::window::WindowCounts {
            self.shared.window().counts(now)
        }
        fn reset(&self) {}
        fn shared_window(&self) -> Option<Arc<SharedWindow>> {
            Some(self.shared.clone())
        }
    }

    #[test]
    fn successes_not_watched_are_counted_once_without_the_policy() {
        let shared = Arc::new(SharedWindow::new(
            crate::window::Window::new(Duration::from_secs(10), 10).unwrap(),
        ));
        let sharing = Box::new(Sharing {
            shared: shared.clone(),
            recorded: AtomicU64::new(0),
        });
        let record = EndpointRecord::new(
            Clock::tokio(),
            Box::new([Box::new(WantsFive) as Box<dyn EndpointPolicy>, sharing]),
            Arc::new(Notifier::new()),
        );
        let now = record.clock().now();
        let recorded = |record: &EndpointRecord| {
            record.policies()[1]
                .as_any()
                .downcast_ref::<Sharing>()
                .unwrap()
                .recorded
                .load(Ordering::Relaxed)
        };
        call(&record, Outcome::Success, 1, now);
        call(&record, Outcome::Success, 1, now);
        assert_eq!(recorded(&record), 0, "plain successes skip the policy");
        call(&record, Outcome::Failure(FailureKind::Timeout), 1, now);
        assert_eq!(recorded(&record), 1, "failures reach it");
        shared.set_watching(true);
        call(&record, Outcome::Success, 1, now);
        assert_eq!(recorded(&record), 2, "successes reach it while it watches");
        shared.set_watching(false);
        record.observe(
            &Observation {
                outcome: Outcome::Success,
                latency: Duration::from_millis(1),
            },
            now,
            1,
        );
        assert_eq!(
            recorded(&record),
            3,
            "a call holding probe permits reaches it"
        );
        call(&record, Outcome::Cancelled, 1, now);
        let counts = shared.window().counts(now);
        assert_eq!(
            (counts.calls, counts.failures),
            (5, 1),
            "each call counted once"
        );
    }
}
