//! One endpoint's detector state: its failure streaks, its interval tallies, what it was condemned
//! for, its ejection counter and, for linkerd, its probe gate.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use tower_outlier_core::{
    duration_to_nanos, Admit, Clock, Description, EndpointPolicy, FailureKind, Judgement, Nanos,
    Observation, Outcome, ProbeGate, Reason, Signal, WindowCounts,
};

use crate::config::DetectorSemantics;
use crate::enforcement::ejection_end;
use crate::policy::{Detector, Shared};
use crate::statistics::Tally;

const NONE: Nanos = Nanos::MAX;

// Bits of `condemned`: one per detector (`Detector as u8`), and the failed probe.
const CONSECUTIVE: u8 = 0b0000_0111;
const STATISTICAL: u8 = 0b0111_1000;
const FAILED_PROBE: u8 = 0b1000_0000;

/// The detector whose condemnation an ejection acts on (the one `judge` reports first), if a
/// detector's: a failed linkerd probe is none.
fn ejecting(bits: u8) -> Option<Detector> {
    let detectors = bits & (CONSECUTIVE | STATISTICAL);
    (detectors != 0 && bits & FAILED_PROBE == 0).then(|| Detector::from_bit(detectors))
}

// The probe gate's states (linkerd).
const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;
const PROBING: u8 = 3;
// The probe failed: every call is held until the layer ejects the endpoint or refuses to.
const SHUT: u8 = 4;

// The most calls a streak asks the balancer for at once: one, the next of the streak. An endpoint
// failing every call is judged as fast (each failure comes fast and asks for the next), and a
// gray one, whose streaks a success breaks, is not sent a burst that would mostly fail: with the
// remaining calls asked at once linkerd's 7 in a row pulled a 30 % gray failure to 23.9 % of the
// traffic (1 718 failed requests against 1 492 with no detection).
const MOST_CALLS_WANTED: u64 = 1;

/// One endpoint's state under a [`DetectorPolicy`](crate::DetectorPolicy).
pub struct DetectorEndpoint {
    pub(crate) shared: Arc<Shared>,
    // Copied from the configuration so a call touches only this endpoint's memory.
    split: bool,
    thresholds: [u32; 3],
    // Which consecutive detectors may eject (enforcement above 0): only those want calls.
    enforcing: [bool; 3],
    streaks: [AtomicU32; 3],
    // This interval's calls (low 32 bits) and failures (high 32 bits), swapped out on each tick:
    // one atomic add per call. More than 2³² − 1 calls in one interval would carry into the
    // failure count.
    external: AtomicU64,
    local: AtomicU64,
    condemned: AtomicU8,
    // When the consecutive or probe condemnation was made (statistical ones last one tick).
    condemned_at: AtomicU64,
    // A condemnation whose refusal by the layer has not been counted yet.
    overflow_pending: AtomicBool,
    // Out of rotation: set when ejected, cleared when re-admitted. Calls still in flight then
    // complete a streak without detecting anything (Envoy skips ejected hosts).
    out: AtomicBool,
    // The tick a multiplier decay was held back at (the endpoint was condemned then), and the
    // time of the last ejection: the decay is owed if no ejection came at that tick.
    deferred_decay: AtomicU64,
    ejected_at: AtomicU64,
    // The statistical verdict behind a statistical condemnation (f64 bits), for the reason.
    verdict_value: AtomicU64,
    verdict_threshold: AtomicU64,
    // Envoy's and gRPC's ejection multiplier; linkerd's failed probes in this trip.
    pub(crate) ejections: AtomicU32,
    pub(crate) ejected_until: AtomicU64,
    pub(crate) last_tick: AtomicU64,
    gate: Option<Gate>,
}

struct Gate {
    state: AtomicU8,
    waker: AtomicWaker,
}

#[inline]
fn tally_of(failed: bool) -> u64 {
    1 | u64::from(failed) << 32
}

pub(crate) fn unpack(packed: u64) -> Tally {
    Tally {
        calls: packed & u64::from(u32::MAX),
        failures: packed >> 32,
    }
}

impl DetectorEndpoint {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        let config = &shared.config;
        let thresholds = [
            config.consecutive_5xx.threshold,
            config.consecutive_gateway_failure.threshold,
            if config.split_external_local_origin_errors {
                config.consecutive_local_origin_failure.threshold
            } else {
                0
            },
        ];
        let enforcing = [
            config.consecutive_5xx.enforcement > 0,
            config.consecutive_gateway_failure.enforcement > 0,
            config.consecutive_local_origin_failure.enforcement > 0,
        ];
        let gate = (config.semantics == DetectorSemantics::Linkerd).then(|| Gate {
            state: AtomicU8::new(CLOSED),
            waker: AtomicWaker::new(),
        });
        DetectorEndpoint {
            split: config.split_external_local_origin_errors,
            thresholds,
            enforcing,
            streaks: Default::default(),
            external: AtomicU64::new(0),
            local: AtomicU64::new(0),
            condemned: AtomicU8::new(0),
            condemned_at: AtomicU64::new(0),
            overflow_pending: AtomicBool::new(false),
            out: AtomicBool::new(false),
            deferred_decay: AtomicU64::new(NONE),
            ejected_at: AtomicU64::new(NONE),
            verdict_value: AtomicU64::new(0),
            verdict_threshold: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
            ejected_until: AtomicU64::new(NONE),
            last_tick: AtomicU64::new(NONE),
            gate,
            shared,
        }
    }

    /// One more failure in detector `index`'s streak: detected at exactly its threshold (then
    /// the streak starts over, as Envoy's does), and ejecting with its enforcement chance.
    #[inline]
    fn extend_streak(&self, index: usize, now: Nanos) -> Signal {
        let threshold = self.thresholds[index];
        if threshold == 0 {
            return Signal::None;
        }
        if self.streaks[index].fetch_add(1, Ordering::Relaxed) + 1 != threshold {
            return Signal::None;
        }
        self.streaks[index].store(0, Ordering::Relaxed);
        if self.out.load(Ordering::Relaxed) {
            return Signal::None;
        }
        let detector = Detector::CONSECUTIVE[index];
        if self.shared.detected(detector) {
            self.condemn(1 << index, now);
            Signal::Evaluate
        } else {
            Signal::None
        }
    }

    #[inline]
    fn break_streak(&self, index: usize) {
        // Steady success reads and does not write.
        if self.streaks[index].load(Ordering::Relaxed) != 0 {
            self.streaks[index].store(0, Ordering::Relaxed);
        }
    }

    fn condemn(&self, bits: u8, now: Nanos) {
        if bits & STATISTICAL == 0 {
            self.condemned_at.store(now, Ordering::Relaxed);
        }
        self.overflow_pending.store(true, Ordering::Relaxed);
        self.condemned.fetch_or(bits, Ordering::AcqRel);
    }

    /// The condemnations that still stand at `now`: statistical ones until the next tick,
    /// consecutive and probe ones for one interval (an ejection the layer refused is retried
    /// when room appears within that time; after it, only fresh evidence counts).
    fn standing(&self, now: Nanos) -> u8 {
        let bits = self.condemned.load(Ordering::Acquire);
        if bits & !STATISTICAL == 0 {
            return bits;
        }
        let age = now.saturating_sub(self.condemned_at.load(Ordering::Relaxed));
        if age <= duration_to_nanos(self.shared.config.interval) {
            bits
        } else {
            bits & STATISTICAL
        }
    }

    /// Condemns the endpoint for a statistical detector's verdict (cold path).
    pub(crate) fn condemn_statistically(
        &self,
        detector: Detector,
        value: f64,
        threshold: f64,
        now: Nanos,
    ) {
        self.verdict_value.store(value.to_bits(), Ordering::Relaxed);
        self.verdict_threshold
            .store(threshold.to_bits(), Ordering::Relaxed);
        self.condemn(detector.bit(), now);
    }

    /// Forgets last interval's statistical verdicts (each interval judges afresh) and the other
    /// condemnations that no longer stand.
    pub(crate) fn clear_stale(&self, now: Nanos) {
        let standing = self.standing(now) & !STATISTICAL;
        self.condemned.fetch_and(standing, Ordering::AcqRel);
    }

    /// Whether a condemnation stands at `now`: the layer is to judge the endpoint.
    pub(crate) fn is_condemned(&self, now: Nanos) -> bool {
        self.standing(now) != 0
    }

    /// One interval tick for an endpoint in rotation: decays its ejection multiplier if `decays`,
    /// unless it stands condemned (both systems eject before they decay; if the layer refuses
    /// the ejection, the decay is owed and paid at the next tick).
    pub(crate) fn tick(&self, decays: bool, now: Nanos) {
        let deferred = self.deferred_decay.swap(NONE, Ordering::Relaxed);
        if deferred != NONE && self.ejected_at.load(Ordering::Relaxed) != deferred {
            self.decay();
        }
        if !decays {
            return;
        }
        if self.is_condemned(now) {
            self.deferred_decay.store(now, Ordering::Relaxed);
        } else {
            self.decay();
        }
    }

    fn decay(&self) {
        let _ = self
            .ejections
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| m.checked_sub(1));
    }

    /// This interval's tallies (external, local), and a fresh start for the next.
    pub(crate) fn take_tallies(&self) -> (Tally, Tally) {
        (
            unpack(self.external.swap(0, Ordering::Relaxed)),
            unpack(self.local.swap(0, Ordering::Relaxed)),
        )
    }

    /// Takes over `previous`'s streaks, tallies, ejection counter and tick (a reconfiguration of
    /// a running layer). Its standing condemnations are not carried: the new rules judge anew.
    /// A probe in flight answers to `previous`, so its gate is taken over ready for a new probe.
    pub(crate) fn take_over(&self, previous: &DetectorEndpoint) {
        for (to, from) in self.streaks.iter().zip(previous.streaks.iter()) {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        for (to, from) in [
            (&self.external, &previous.external),
            (&self.local, &previous.local),
            (&self.ejected_until, &previous.ejected_until),
            (&self.ejected_at, &previous.ejected_at),
            (&self.last_tick, &previous.last_tick),
            (&self.deferred_decay, &previous.deferred_decay),
        ] {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.ejections.store(
            previous.ejections.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.out
            .store(previous.out.load(Ordering::Relaxed), Ordering::Relaxed);
        if let (Some(gate), Some(old)) = (&self.gate, &previous.gate) {
            let state = match old.state.load(Ordering::Acquire) {
                PROBING => HALF_OPEN,
                SHUT => CLOSED,
                state => state,
            };
            gate.state.store(state, Ordering::Release);
        }
    }

    fn wake_gate(&self, gate: &Gate, state: u8) {
        gate.state.store(state, Ordering::Release);
        gate.waker.wake();
    }
}

impl EndpointPolicy for DetectorEndpoint {
    #[inline]
    fn record(&self, observation: &Observation, now: Nanos) -> Signal {
        let kind = match observation.outcome {
            Outcome::Success => None,
            Outcome::Failure(kind) => Some(kind),
            Outcome::Cancelled => return Signal::None,
        };
        // Raised before any response: the connection was refused or reset, or no answer came.
        let local = matches!(kind, Some(FailureKind::Transport | FailureKind::Timeout));
        if self.split {
            self.local.fetch_add(tally_of(local), Ordering::Relaxed);
            if local {
                return self.extend_streak(2, now);
            }
            // A response came, so the connection worked.
            self.break_streak(2);
        }
        self.external
            .fetch_add(tally_of(kind.is_some()), Ordering::Relaxed);
        let Some(kind) = kind else {
            self.break_streak(0);
            self.break_streak(1);
            return Signal::None;
        };
        // Unsplit, Envoy counts a refused connection as a 503 and a timeout as a 504.
        let gateway = local || matches!(kind, FailureKind::Gateway | FailureKind::Overload);
        let mut signal = Signal::None;
        if gateway {
            if self.extend_streak(1, now) == Signal::Evaluate {
                signal = Signal::Evaluate;
            }
        } else {
            self.break_streak(1);
        }
        if self.extend_streak(0, now) == Signal::Evaluate {
            signal = Signal::Evaluate;
        }
        signal
    }

    fn judge(&self, now: Nanos) -> Judgement {
        let bits = self.standing(now);
        if bits == 0 {
            return Judgement::Healthy;
        }
        let counts = self.counts();
        let policy = self.shared.name;
        if bits & FAILED_PROBE != 0 {
            return Judgement::Outlier(Reason {
                policy,
                measure: "failed probe",
                value: 1.0,
                threshold: 1.0,
                counts,
            });
        }
        if bits & CONSECUTIVE != 0 {
            let index = (bits & CONSECUTIVE).trailing_zeros() as usize;
            let threshold = f64::from(self.thresholds[index]);
            return Judgement::Outlier(Reason {
                policy,
                measure: Detector::CONSECUTIVE[index].measure(),
                value: threshold,
                threshold,
                counts,
            });
        }
        let detector = Detector::from_bit(bits & STATISTICAL);
        Judgement::Outlier(Reason {
            policy,
            measure: detector.measure(),
            value: f64::from_bits(self.verdict_value.load(Ordering::Relaxed)),
            threshold: f64::from_bits(self.verdict_threshold.load(Ordering::Relaxed)),
            counts,
        })
    }

    fn describe(&self, _now: Nanos) -> Description {
        Description {
            counts: self.counts(),
            state: self.state_name(),
            weight: None,
        }
    }

    fn reset(&self) {
        for streak in &self.streaks {
            streak.store(0, Ordering::Relaxed);
        }
        self.condemned.store(0, Ordering::Release);
        self.out.store(false, Ordering::Relaxed);
        if let Some(gate) = &self.gate {
            // Back in rotation after the back-off: one real request is the probe.
            if matches!(gate.state.load(Ordering::Acquire), OPEN | SHUT) {
                self.wake_gate(gate, HALF_OPEN);
            }
        }
    }

    fn calls_wanted(&self, _now: Nanos) -> u64 {
        // A streak needs exactly the rest of its calls to be judged: the record raises the
        // estimate of an endpoint failing fast, so a latency-driven balancer would otherwise stop
        // sending them. (The layer asks only after a fast failure: a streak of timeouts is left to
        // the balancer, which avoids it at less cost to callers than judging it would.) The
        // statistical detectors judge on a timer and want nothing: calls pulled to them would
        // only fail.
        (0..3)
            .filter(|&index| self.thresholds[index] > 0 && self.enforcing[index])
            .map(|index| {
                let streak = self.streaks[index].load(Ordering::Relaxed);
                if streak == 0 {
                    0
                } else {
                    u64::from(self.thresholds[index].saturating_sub(streak))
                }
            })
            .max()
            .unwrap_or(0)
            .min(MOST_CALLS_WANTED)
    }

    fn check_at(&self, now: Nanos) -> Option<Nanos> {
        let last_tick = match self.last_tick.load(Ordering::Relaxed) {
            NONE => None,
            tick => Some(tick),
        };
        let (end, ejections) = ejection_end(
            &self.shared.config,
            self.ejections.load(Ordering::Relaxed),
            now,
            last_tick,
            self.shared.dice(),
        );
        self.ejections.store(ejections, Ordering::Relaxed);
        self.ejected_until.store(end, Ordering::Relaxed);
        self.ejected_at.store(now, Ordering::Relaxed);
        self.out.store(true, Ordering::Relaxed);
        // The detection has been acted on: count it under the detector that made it.
        let bits = self.standing(now);
        if let Some(detector) = ejecting(bits) {
            self.shared.ejected(detector);
        }
        self.overflow_pending.store(false, Ordering::Relaxed);
        self.condemned.store(0, Ordering::Release);
        if let Some(gate) = &self.gate {
            self.wake_gate(gate, OPEN);
        }
        Some(end)
    }

    fn ejection_refused(&self, now: Nanos) {
        let bits = self.standing(now);
        if self.overflow_pending.swap(false, Ordering::Relaxed) {
            if let Some(detector) = ejecting(bits) {
                self.shared.overflowed(detector);
            }
        }
        if let Some(gate) = &self.gate {
            // Kept in rotation: it serves again.
            if gate.state.load(Ordering::Acquire) == SHUT {
                self.wake_gate(gate, CLOSED);
            }
        }
    }

    fn gate(&self) -> Option<&dyn ProbeGate> {
        self.gate.as_ref().map(|_| self as &dyn ProbeGate)
    }
}

impl DetectorEndpoint {
    fn counts(&self) -> WindowCounts {
        let tally = unpack(self.external.load(Ordering::Relaxed));
        let local = unpack(self.local.load(Ordering::Relaxed));
        let (calls, failures) = if self.split {
            // Local-origin failures never reached the external tally.
            (local.calls, tally.failures + local.failures)
        } else {
            (tally.calls, tally.failures)
        };
        WindowCounts {
            calls,
            failures,
            slow: 0,
        }
    }

    fn state_name(&self) -> Option<&'static str> {
        // linkerd's breaker: open (counting), shut (ejected or waiting), probation (one probe).
        let gate = self.gate.as_ref()?;
        Some(match gate.state.load(Ordering::Acquire) {
            CLOSED => "OPEN",
            HALF_OPEN | PROBING => "PROBATION",
            _ => "SHUT",
        })
    }
}

/// linkerd's probation: after the back-off the endpoint admits exactly one call, the probe, and
/// holds the others back until it decides.
impl ProbeGate for DetectorEndpoint {
    fn poll_admit(&self, armed: bool, clock: &Clock, cx: &mut Context<'_>) -> Poll<Admit> {
        if armed {
            return Poll::Ready(Admit::Probe);
        }
        let Some(gate) = &self.gate else {
            return Poll::Ready(Admit::Call);
        };
        loop {
            match gate.state.load(Ordering::Acquire) {
                HALF_OPEN => {
                    if gate
                        .state
                        .compare_exchange(HALF_OPEN, PROBING, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return Poll::Ready(Admit::Probe);
                    }
                }
                held @ (PROBING | SHUT) => {
                    if held == SHUT && self.standing(clock.now()) == 0 {
                        // The layer never answered (its condemnation lapsed): serve again.
                        let _ = gate.state.compare_exchange(
                            SHUT,
                            CLOSED,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                        continue;
                    }
                    gate.waker.register(cx.waker());
                    // The state may have changed between the load and the registration.
                    if gate.state.load(Ordering::Acquire) == held {
                        return Poll::Pending;
                    }
                }
                // Closed, or open but kept in rotation (the layer refused the ejection): serve.
                _ => return Poll::Ready(Admit::Call),
            }
        }
    }

    fn record_probe(&self, observation: &Observation, now: Nanos) -> Signal {
        let Some(gate) = &self.gate else {
            return self.record(observation, now);
        };
        if observation.outcome.is_failure() {
            // Calls wait until the layer ejects the endpoint again or refuses to (then it
            // serves as usual): none may slip through to an endpoint that just failed its probe.
            self.condemn(FAILED_PROBE, now);
            gate.state.store(SHUT, Ordering::Release);
            Signal::Evaluate
        } else {
            // The trip is over: the next one starts at the shortest back-off. The layer looks,
            // to report the breaker closed (one wake-up per probe).
            self.ejections.store(0, Ordering::Relaxed);
            self.wake_gate(gate, CLOSED);
            Signal::Evaluate
        }
    }

    fn probe_cancelled(&self, _now: Nanos) {
        if let Some(gate) = &self.gate {
            if gate.state.load(Ordering::Acquire) == PROBING {
                self.wake_gate(gate, HALF_OPEN);
            }
        }
    }
}

impl fmt::Debug for DetectorEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DetectorEndpoint")
            .field("streaks", &self.streaks)
            .field("tally", &unpack(self.external.load(Ordering::Relaxed)))
            .field("condemned", &self.condemned.load(Ordering::Relaxed))
            .field("ejections", &self.ejections.load(Ordering::Relaxed))
            .field(
                "gate",
                &self.gate.as_ref().map(|g| g.state.load(Ordering::Relaxed)),
            )
            .finish()
    }
}
