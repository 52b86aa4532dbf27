//! linkerd's probation: the readiness gate that admits one probe after the back-off.

use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tower_outlier_core::{Admit, Clock, EndpointPolicy, Nanos, Observation, ProbeGate, Signal};

use super::*;

/// linkerd's probation: after the back-off the endpoint admits exactly one call, the probe, and
/// holds the others back until it decides.
impl ProbeGate for DetectorEndpoint {
    fn poll_admit(&self, armed: bool, clock: &Clock, cx: &mut Context<'_>) -> Poll<Admit> {
        if armed {
            return Poll::Ready(Admit::Probe);
        }
        let Some(gate) = self.linkerd_gate() else {
            return Poll::Ready(Admit::Call);
        };
        loop {
            match gate.load() {
                HALF_OPEN => {
                    if gate.compare_exchange(HALF_OPEN, PROBING).is_ok() {
                        return Poll::Ready(Admit::Probe);
                    }
                }
                held @ (PROBING | SHUT) => {
                    if held == SHUT && self.standing(clock.now()) == 0 {
                        // The layer never answered (its condemnation lapsed): serve again.
                        let _ = gate.compare_exchange(SHUT, CLOSED);
                        continue;
                    }
                    gate.register(cx.waker());
                    // The state may have changed between the load and the registration.
                    if gate.load() == held {
                        return Poll::Pending;
                    }
                }
                // Closed, or open but kept in rotation (the layer refused the ejection): serve.
                _ => return Poll::Ready(Admit::Call),
            }
        }
    }

    fn record_probe(&self, observation: &Observation, now: Nanos) -> Signal {
        let Some(gate) = self.linkerd_gate() else {
            return self.record(observation, now);
        };
        if observation.outcome.is_failure() {
            // Calls wait until the layer ejects the endpoint again or refuses to (then it
            // serves as usual): none may slip through to an endpoint that just failed its probe.
            self.condemn(FAILED_PROBE, now);
            gate.store(SHUT);
            Signal::Evaluate
        } else {
            // The trip is over: the next one starts at the shortest back-off (under a relapse
            // window, unless it comes within the window: `trip_so_far`). The layer looks, to
            // report the breaker closed (one wake-up per probe).
            if self.shared.config.relapse_window.is_zero() {
                self.ejections.store(0, Ordering::Relaxed);
            }
            self.wake_gate(gate, CLOSED);
            Signal::Evaluate
        }
    }

    fn probe_cancelled(&self, _now: Nanos) {
        if let Some(gate) = self.linkerd_gate() {
            if gate.load() == PROBING {
                self.wake_gate(gate, HALF_OPEN);
            }
        }
    }
}
