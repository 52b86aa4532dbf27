//! Recording calls and judging on them: the detectors' side of the policy trait.

use std::sync::atomic::Ordering;

use tower_outlier_core::{
    CallsNeeded, Comparison, Description, EndpointPolicy, FailureKind, Judged, Judgement, Nanos,
    Observation, Outcome, OwnTiming, ProbeGate, Reason, Signal, WindowCounts,
};

use crate::config::DetectorSemantics;
use crate::detector::Detector;
use crate::enforcement::ejection_end;

use super::*;

impl EndpointPolicy for DetectorEndpoint {
    #[inline]
    fn record(&self, observation: &Observation, now: Nanos) -> Signal {
        let kind = match observation.outcome {
            Outcome::Success => None,
            Outcome::Failure(kind) => Some(kind),
            Outcome::Cancelled | Outcome::NotSent => return Signal::None,
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
            return self.record_recent(false, now, Signal::None);
        };
        // Unsplit, Envoy counts a refused connection as a 503 and a timeout as a 504.
        let gateway = local || matches!(kind, FailureKind::Gateway | FailureKind::Overload);
        // Envoy counts the gateway streak first, then the 5xx streak, and handles their
        // detections in that order.
        let mut signal = Signal::None;
        if gateway {
            signal = self.extend_streak(1, now);
        } else {
            self.break_streak(1);
        }
        if self.complete_streak(0) {
            if signal == Signal::Evaluate {
                // The same response condemned it for its gateway failures: the ejection is
                // theirs, and whether this detection counts depends on it (`check_at`,
                // `ejection_refused`).
                self.queued_5xx.store(true, Ordering::Relaxed);
            } else {
                signal = self.detect(0, now);
            }
        }
        self.record_recent(true, now, signal)
    }

    fn judge(&self, now: Nanos) -> Judgement {
        let bits = self.standing(now);
        if bits == 0 {
            return Judgement::Healthy;
        }
        let counts = self.counts();
        let policy = self.shared.name;
        if bits & FAILED_PROBE != 0 {
            // linkerd's probation: the one real request let through after the back-off. Not
            // called a "probe": the layer's active probe (a health check) may have just passed,
            // and "probe succeeded" then "failed probe" read as a contradiction.
            return Judgement::Outlier(Reason {
                policy,
                measure: "failed probation request",
                value: 1.0,
                threshold: 1.0,
                comparison: Comparison::Said,
                counts,
            });
        }
        if bits & CONSECUTIVE != 0 {
            let index = (bits & CONSECUTIVE).trailing_zeros() as usize;
            let threshold = f64::from(self.shared.thresholds[index]);
            return Judgement::Outlier(Reason {
                policy,
                measure: self.shared.config.measure(Detector::CONSECUTIVE[index]),
                value: threshold,
                threshold,
                comparison: Comparison::AtOrAbove,
                counts,
            });
        }
        let detector = Detector::from_bit(bits & STATISTICAL);
        Judgement::Outlier(Reason {
            policy,
            measure: self.shared.config.measure(detector),
            value: f64::from_bits(self.verdict_value.load(Ordering::Relaxed)),
            threshold: f64::from_bits(self.verdict_threshold.load(Ordering::Relaxed)),
            comparison: detector.comparison(),
            counts,
        })
    }

    fn describe(&self, _now: Nanos) -> Description {
        Description {
            counts: self.counts(),
            state: self.state_name(),
            weight: None,
            judged: self.longest_streak(),
        }
    }

    fn reset(&self) {
        for streak in &self.streaks {
            streak.store(0, Ordering::Relaxed);
        }
        self.condemned.store(0, Ordering::Release);
        self.queued_5xx.store(false, Ordering::Relaxed);
        if !self.shared.config.recent_window_kept {
            self.clear_recent();
        }
        self.out.store(false, Ordering::Relaxed);
        if let Some(gate) = self.linkerd_gate() {
            // Back in rotation after the back-off: one real request is the probe.
            if matches!(gate.load(), OPEN | SHUT) {
                self.wake_gate(gate, HALF_OPEN);
            }
        }
    }

    fn calls_needed(&self) -> Option<&dyn CallsNeeded> {
        Some(self)
    }

    fn own_timing(&self) -> Option<&dyn OwnTiming> {
        Some(self)
    }

    fn gate(&self) -> Option<&dyn ProbeGate> {
        self.linkerd_gate().map(|_| self as &dyn ProbeGate)
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

    /// The enforcing streak nearest its threshold, as the rule compares it: the page shows this,
    /// not the interval's failure rate (mostly old successes when a healthy endpoint starts
    /// failing: "1.0 %" for an endpoint that failed its last three calls).
    fn longest_streak(&self) -> Option<Judged> {
        (0..3)
            .filter(|&index| self.shared.thresholds[index] > 0 && self.shared.enforcing[index])
            .map(|index| {
                let streak = self.streaks[index].load(Ordering::Relaxed);
                (index, streak, self.shared.thresholds[index])
            })
            .max_by(|a, b| {
                (u64::from(a.1) * u64::from(b.2)).cmp(&(u64::from(b.1) * u64::from(a.2)))
            })
            .map(|(index, streak, threshold)| Judged {
                measure: self.shared.config.measure(Detector::CONSECUTIVE[index]),
                value: f64::from(streak),
                threshold: f64::from(threshold),
            })
    }

    fn state_name(&self) -> Option<&'static str> {
        // Named as a circuit breaker's states, as the slow-call breaker's are, so one alert reads
        // both: CLOSED lets calls through, OPEN holds them (ejected or waiting), HALF_OPEN lets one
        // probe through. (linkerd's own words run the other way: its gate is "open" when healthy
        // and "shut" when ejected, which made `state="OPEN"` fire for every healthy endpoint.)
        let gate = self.linkerd_gate()?;
        Some(match gate.load() {
            CLOSED => "CLOSED",
            HALF_OPEN | PROBING => "HALF_OPEN",
            _ => "OPEN",
        })
    }
}

/// A consecutive-failure streak needs the rest of its calls to be judged.
impl CallsNeeded for DetectorEndpoint {
    fn calls_wanted(&self, _now: Nanos) -> u64 {
        // A streak needs exactly the rest of its calls to be judged: the record raises the
        // estimate of an endpoint failing fast, so a latency-driven balancer would otherwise stop
        // sending them. (The layer asks only after a fast failure: a streak of timeouts is left to
        // the balancer, which avoids it at less cost to callers than judging it would.) The
        // statistical detectors judge on a timer and want nothing: calls pulled to them would
        // only fail.
        (0..3)
            .filter(|&index| self.shared.thresholds[index] > 0 && self.shared.enforcing[index])
            .map(|index| {
                let streak = self.streaks[index].load(Ordering::Relaxed);
                if streak == 0 {
                    0
                } else {
                    u64::from(self.shared.thresholds[index].saturating_sub(streak))
                }
            })
            .max()
            .unwrap_or(0)
            .min(MOST_CALLS_WANTED)
    }
}

impl DetectorEndpoint {
    /// The ejection counter an ejection at `now` starts from. Under a relapse window
    /// ([`DetectorBuilder::relapse_window`](crate::DetectorBuilder::relapse_window)) a passed
    /// probe leaves linkerd's count as it was, and it is dropped here unless the endpoint's last
    /// ejection ended within the window: a relapse continues the trip's back-off, a new trip
    /// starts at the base. An endpoint ejected for failing its probe (`bits`, its standing
    /// condemnations) is in the same trip, however long after its return the probe came: at low
    /// traffic linkerd's probe is the next request, whenever it comes.
    fn trip_so_far(&self, now: Nanos, bits: u8) -> u32 {
        let ejections = self.ejections.load(Ordering::Relaxed);
        let window = self.shared.config.relapse_window;
        if window.is_zero() || bits & FAILED_PROBE != 0 {
            return ejections;
        }
        let last_end = self.ejected_until.load(Ordering::Relaxed);
        let relapse = last_end != NONE && now.saturating_sub(last_end) <= duration_to_nanos(window);
        if relapse {
            ejections
        } else {
            0
        }
    }
}

/// The detectors time their own ejections (Envoy's and gRPC's ejection time, linkerd's back-off).
impl OwnTiming for DetectorEndpoint {
    fn check_at(&self, now: Nanos) -> Option<Nanos> {
        // The last tick, or before the first one the timer's start: the ticks are that time
        // plus whole intervals (a reconfiguration that changes the interval starts them again).
        let last_tick = match self.last_tick.load(Ordering::Relaxed) {
            NONE => None,
            tick => Some(tick),
        }
        .max(self.shared.ticks_from());
        let bits = self.standing(now);
        // A statistical detector condemned it on the last tick (its verdicts stand until the
        // next): the ejection is that tick's, as in Envoy's and gRPC's interval callbacks, not
        // the moment the layer got to it a few microseconds later, which would end it on the
        // tick after the one due.
        let ejected_at = match last_tick {
            Some(tick) if bits & STATISTICAL != 0 && tick <= now => tick,
            _ => now,
        };
        let (end, ejections) = ejection_end(
            &self.shared.config,
            self.trip_so_far(now, bits),
            ejected_at,
            last_tick,
            self.shared.dice(),
        );
        self.ejections.store(ejections, Ordering::Relaxed);
        self.ejected_until.store(end, Ordering::Relaxed);
        self.ejected_at.store(ejected_at, Ordering::Relaxed);
        self.out.store(true, Ordering::Relaxed);
        // The detection has been acted on: count it under the detector that made it.
        if let Some(detector) = ejecting(bits) {
            self.shared.ejected(detector);
        }
        self.overflow_pending.store(false, Ordering::Relaxed);
        // A 5xx detection behind the gateway one finds the endpoint out: Envoy drops it
        // uncounted.
        self.queued_5xx.store(false, Ordering::Relaxed);
        self.condemned.store(0, Ordering::Release);
        if let Some(gate) = self.linkerd_gate() {
            self.wake_gate(gate, OPEN);
        }
        Some(end)
    }

    fn reset_backoff(&self) {
        // Envoy's and gRPC's multiplier, linkerd's failed probes in this trip.
        self.ejections.store(0, Ordering::Relaxed);
    }

    fn ejection_refused(&self, now: Nanos) {
        let bits = self.standing(now);
        if self.overflow_pending.swap(false, Ordering::Relaxed) {
            if let Some(detector) = ejecting(bits) {
                self.shared.overflowed(detector);
            }
            // The 5xx detection behind a refused gateway one is Envoy's next event: detected,
            // and refused in turn (the layer's room has not changed).
            if self.queued_5xx.swap(false, Ordering::Relaxed)
                && self.shared.detected(Detector::Consecutive5xx)
            {
                self.shared.overflowed(Detector::Consecutive5xx);
            }
        }
        if matches!(
            self.shared.config.semantics,
            DetectorSemantics::Envoy | DetectorSemantics::Grpc
        ) {
            // Envoy resets the streak and forgets the detection (a new streak is needed), and
            // gRPC stops ejecting for the interval: neither ejects later on it when room
            // appears.
            self.condemned.store(0, Ordering::Release);
        }
        if let Some(gate) = self.linkerd_gate() {
            // Kept in rotation: it serves again.
            if gate.load() == SHUT {
                self.wake_gate(gate, CLOSED);
            }
        }
    }
}
