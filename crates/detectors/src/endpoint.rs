//! One endpoint's detector state: its failure streaks, its interval tallies, what it was condemned
//! for, its ejection counter and, for linkerd, its probe gate.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::Waker;

use once_cell::race::OnceBox;
use tower_outlier_core::{duration_to_nanos, Lock, Nanos, Signal, Window, WindowShape};

use crate::config::{DetectorSemantics, MIN_RECENT_WINDOW, RECENT_BUCKETS};
use crate::detector::{Detector, Shared};
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
    // Copied from the configuration: every call reads it. (The thresholds are read from the
    // shared state, on failures only: copied, they cost every endpoint 16 bytes.)
    split: bool,
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
    // A 5xx streak completed by the response whose gateway streak condemned the endpoint:
    // Envoy handles the 5xx detection after the gateway one, and drops it when that one ejected
    // (the host is out already); when the layer refuses, it is detected and refused in turn.
    queued_5xx: AtomicBool,
    // Out of rotation: set when ejected, cleared when re-admitted. Calls still in flight then
    // complete a streak without detecting anything (Envoy skips ejected hosts).
    out: AtomicBool,
    // The tick a multiplier decay was held back at (the endpoint was condemned then), and the
    // time of the last ejection: the decay is owed if no ejection came at that tick.
    deferred_decay: AtomicU64,
    ejected_at: AtomicU64,
    // The window linkerd's success-rate trigger reads (boxed: only a preset with the trigger has
    // one). The trigger itself is read from the configuration when a failure may trip it: held
    // here it cost every endpoint of every preset 32 bytes.
    recent: Option<Box<Window>>,
    // The statistical verdict behind a statistical condemnation (f64 bits), for the reason.
    verdict_value: AtomicU64,
    verdict_threshold: AtomicU64,
    // Envoy's and gRPC's ejection multiplier; linkerd's failed probes in this trip.
    pub(crate) ejections: AtomicU32,
    pub(crate) ejected_until: AtomicU64,
    pub(crate) last_tick: AtomicU64,
    // linkerd's probe gate, read only under its semantics (`linkerd_gate`), made the first time
    // it leaves `CLOSED` (the endpoint's first ejection): closed, it needs no state, and held in
    // every endpoint its state and waker cost every endpoint of every preset 32 bytes.
    gate: OnceBox<GateCell>,
}

/// linkerd's probe gate of an endpoint that has been ejected: its state and the handles waiting
/// on it. Every waiting handle is woken, not the last to wait: clones of one handle parked in
/// several tasks (a handle cloned per request) each wait for the probe, and a single waker slot
/// left all but one asleep for good. The gate changes a few times per ejection, so a lock here
/// costs nothing a call sees.
struct GateCell {
    state: AtomicU8,
    waiters: Lock<Vec<Waker>>,
}

/// linkerd's probe gate, `CLOSED` until its cell is made.
struct Gate<'a> {
    cell: &'a OnceBox<GateCell>,
}

impl Gate<'_> {
    fn load(&self) -> u8 {
        self.cell
            .get()
            .map_or(CLOSED, |cell| cell.state.load(Ordering::Acquire))
    }

    fn store(&self, state: u8) {
        let cell = match self.cell.get() {
            Some(cell) => cell,
            // Closed already.
            None if state == CLOSED => return,
            None => self.cell.get_or_init(|| {
                Box::new(GateCell {
                    state: AtomicU8::new(CLOSED),
                    waiters: Lock::new(Vec::new()),
                })
            }),
        };
        cell.state.store(state, Ordering::Release);
    }

    /// From `current` (never `CLOSED`: a gate leaves it only by `store`) to `new`.
    fn compare_exchange(&self, current: u8, new: u8) -> Result<u8, u8> {
        match self.cell.get() {
            Some(cell) => {
                cell.state
                    .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            }
            None => Err(CLOSED),
        }
    }

    /// Wakes `waker` at the gate's next change (a gate that holds calls has its cell). A task
    /// that waits again is listed once.
    fn register(&self, waker: &Waker) {
        if let Some(cell) = self.cell.get() {
            let mut waiters = cell.waiters.lock();
            if !waiters.iter().any(|waiting| waiting.will_wake(waker)) {
                waiters.push(waker.clone());
            }
        }
    }

    /// Wakes every handle waiting (they look at the gate again, and wait again if they must).
    fn wake(&self) {
        if let Some(cell) = self.cell.get() {
            let waiters = std::mem::take(&mut *cell.waiters.lock());
            for waiter in waiters {
                waiter.wake();
            }
        }
    }
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
        let recent = config
            .recent_success_rate
            .filter(|trigger| config.semantics == DetectorSemantics::Linkerd && trigger.is_on())
            .and_then(|trigger| {
                // Ten buckets of at least a millisecond always make a shape (the builder refuses
                // windows under 10 ms while the trigger is on). Slow calls are not counted: the
                // trigger reads calls and failures only.
                let shape =
                    WindowShape::new(trigger.window.max(MIN_RECENT_WINDOW), RECENT_BUCKETS).ok()?;
                Some(Box::new(shape.window()))
            });
        DetectorEndpoint {
            split: config.split_external_local_origin_errors,
            streaks: Default::default(),
            external: AtomicU64::new(0),
            local: AtomicU64::new(0),
            condemned: AtomicU8::new(0),
            condemned_at: AtomicU64::new(0),
            overflow_pending: AtomicBool::new(false),
            queued_5xx: AtomicBool::new(false),
            out: AtomicBool::new(false),
            deferred_decay: AtomicU64::new(NONE),
            ejected_at: AtomicU64::new(NONE),
            recent,
            verdict_value: AtomicU64::new(0),
            verdict_threshold: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
            ejected_until: AtomicU64::new(NONE),
            last_tick: AtomicU64::new(NONE),
            gate: OnceBox::new(),
            shared,
        }
    }

    /// One more failure in detector `index`'s streak: detected at exactly its threshold (then
    /// the streak starts over, as Envoy's does), and ejecting with its enforcement chance.
    #[inline]
    fn extend_streak(&self, index: usize, now: Nanos) -> Signal {
        if self.complete_streak(index) {
            self.detect(index, now)
        } else {
            Signal::None
        }
    }

    /// One more failure in detector `index`'s streak; true when it reaches the threshold (the
    /// streak then starts over) while the endpoint is in rotation (Envoy skips ejected hosts).
    #[inline]
    fn complete_streak(&self, index: usize) -> bool {
        let threshold = self.shared.thresholds[index];
        if threshold == 0 || self.streaks[index].fetch_add(1, Ordering::Relaxed) + 1 != threshold {
            return false;
        }
        self.streaks[index].store(0, Ordering::Relaxed);
        !self.out.load(Ordering::Relaxed)
    }

    /// Consecutive detector `index` detected the endpoint: it is condemned if its enforcement
    /// chance says so.
    fn detect(&self, index: usize, now: Nanos) -> Signal {
        if self.shared.detected(Detector::CONSECUTIVE[index]) {
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

    /// Whether interval ticks end statistical condemnations: every semantics but linkerd's,
    /// which has no interval (its success-rate trips age as consecutive ones do).
    fn ticked(&self) -> bool {
        self.shared.config.semantics != DetectorSemantics::Linkerd
    }

    fn condemn(&self, bits: u8, now: Nanos) {
        if bits & STATISTICAL == 0 || !self.ticked() {
            self.condemned_at.store(now, Ordering::Relaxed);
        }
        self.overflow_pending.store(true, Ordering::Relaxed);
        self.condemned.fetch_or(bits, Ordering::AcqRel);
    }

    /// The condemnations that still stand at `now`: statistical ones until the next tick,
    /// consecutive and probe ones for one interval. Under Envoy's and gRPC's semantics a refusal
    /// ends them at once (`ejection_refused`), as those systems forget a refused detection;
    /// under linkerd's an ejection the layer refused is retried when room appears within that
    /// time; after it, only fresh evidence counts.
    fn standing(&self, now: Nanos) -> u8 {
        let bits = self.condemned.load(Ordering::Acquire);
        let ticked = self.ticked();
        if bits & !STATISTICAL == 0 && ticked {
            return bits;
        }
        let age = now.saturating_sub(self.condemned_at.load(Ordering::Relaxed));
        if age <= duration_to_nanos(self.shared.config.running_interval()) {
            bits
        } else if ticked {
            bits & STATISTICAL
        } else {
            0
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
        // Rules with a relapse window keep linkerd's count past a passed probe, for a relapse;
        // rules without one start the next trip at the base once the endpoint is back in.
        let back_in = !previous.out.load(Ordering::Relaxed);
        let stale = !previous.shared.config.relapse_window.is_zero()
            && self.shared.config.relapse_window.is_zero()
            && self.shared.config.semantics == DetectorSemantics::Linkerd
            && back_in;
        let ejections = if stale {
            0
        } else {
            previous.ejections.load(Ordering::Relaxed)
        };
        self.ejections.store(ejections, Ordering::Relaxed);
        self.out
            .store(previous.out.load(Ordering::Relaxed), Ordering::Relaxed);
        if let (Some(gate), Some(old)) = (self.linkerd_gate(), previous.linkerd_gate()) {
            let state = match old.load() {
                PROBING => HALF_OPEN,
                SHUT => CLOSED,
                state => state,
            };
            gate.store(state);
        }
    }

    /// linkerd's success-rate trigger after a call (`failed` or not), unless the same call
    /// tripped a consecutive detector (linkerd checks those first and reports them).
    #[inline]
    pub(crate) fn record_recent(&self, failed: bool, now: Nanos, signal: Signal) -> Signal {
        let Some(window) = &self.recent else {
            return signal;
        };
        window.record(now, failed, false);
        if !failed || signal == Signal::Evaluate || self.out.load(Ordering::Relaxed) {
            return signal;
        }
        self.recent_trip(window, now).unwrap_or(signal)
    }

    #[cold]
    fn recent_trip(&self, window: &Window, now: Nanos) -> Option<Signal> {
        let trigger = self.shared.config.recent_success_rate?;
        let counts = window.counts(now);
        if counts.calls == 0 || counts.calls < u64::from(trigger.min_requests) {
            return None;
        }
        let rate = (counts.calls - counts.failures) as f64 / counts.calls as f64;
        // Strictly below; one detection per trip (the layer acts on it at once). A condemnation
        // the layer refused lapses after an interval (`standing`), as linkerd's retry does;
        // after that a new trip counts.
        if rate >= trigger.threshold || self.standing(now) != 0 {
            return None;
        }
        if self.shared.detected(Detector::SuccessRate) {
            self.condemn_statistically(Detector::SuccessRate, rate, trigger.threshold, now);
            Some(Signal::Evaluate)
        } else {
            None
        }
    }

    /// Empties linkerd's success-rate window: the endpoint starts cold when it comes back.
    pub(crate) fn clear_recent(&self) {
        if let Some(window) = &self.recent {
            window.clear();
        }
    }

    /// linkerd's probe gate, under its semantics.
    #[inline]
    fn linkerd_gate(&self) -> Option<Gate<'_>> {
        (self.shared.config.semantics == DetectorSemantics::Linkerd)
            .then_some(Gate { cell: &self.gate })
    }

    fn wake_gate(&self, gate: Gate<'_>, state: u8) {
        gate.store(state);
        gate.wake();
    }
}

impl fmt::Debug for DetectorEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DetectorEndpoint")
            .field("streaks", &self.streaks)
            .field("tally", &unpack(self.external.load(Ordering::Relaxed)))
            .field("condemned", &self.condemned.load(Ordering::Relaxed))
            .field("ejections", &self.ejections.load(Ordering::Relaxed))
            .field("gate", &self.linkerd_gate().map(|g| g.load()))
            .finish()
    }
}

mod probation;

mod judging;
