//! The latency estimate the balancer reads (peak-EWMA, as tower's), and what the last calls
//! tell it: a fast failure raises the estimate, the first success restores it, a fresh
//! connection's first call is not a peak.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Nanos;

use super::EndpointRecord;

/// How fast an idle endpoint's latency estimate decays toward zero (the time constant of
/// `exp(-idle / τ)`), as in tower's peak-EWMA.
pub const RTT_DECAY: Duration = Duration::from_secs(10);

/// How long after an endpoint's last completed call its latency estimate counts as stale: a
/// successful call after such a gap that comes back well under the estimate replaces it (the
/// endpoint is as fast as it is now, not as it was), and a balancer may explore an endpoint whose
/// last call succeeded this long ago ([`EndpointRecord::estimate_stale`]). Without it, an
/// endpoint that was slow for a while and healed got no call until its estimate decayed below its
/// peers' (p2c never picks the costliest), and then came back an eighth of the way per call:
/// 12 to 20 s to half its share on loopback, where a round-robin proxy gives it its share at
/// once.
pub const STALE_ESTIMATE: Duration = Duration::from_secs(1);
const STALE_ESTIMATE_NANOS: Nanos = STALE_ESTIMATE.as_nanos() as Nanos;

pub(super) const SAMPLE_TIME_GRANULARITY: Nanos = 1_000_000;

// The smallest change of the latency estimate worth a store: far below any network round trip.
pub(super) const RTT_STORE_FLOOR: Nanos = 64;

// What the balancer's load reads need to know of the recorded calls, in one byte written only
// when it changes. The last call's outcome (two bits):
pub(super) const LAST_MASK: u8 = 0b11;
pub(super) const LAST_SUCCEEDED: u8 = 0;
// Failed fast (refused, reset, an error status): a latency-driven balancer would keep sending
// calls, so the estimate is raised (`penalized`) and per-call judges are sent what they need.
pub(super) const LAST_FAILED: u8 = 1;
// Timed out: the balancer already avoids the endpoint for the time the call took, and sending it
// calls on purpose would cost callers a timeout each.
pub(super) const LAST_TIMED_OUT: u8 = 2;
// Refused by the caller's own stack (`Outcome::NotSent`): not the endpoint's failure, so no
// policy judges it and no call is sent on purpose, but the estimate is raised as for a fast
// failure (a shedding stack is a busy one) and the balancer explores the endpoint after it has
// lost `EXPLORE_AFTER` draws in a row: a busy stack clears in moments, and the first success
// restores the estimate.
pub(super) const LAST_NOT_SENT: u8 = 3;
// No call has been sampled since the endpoint was made or re-admitted: the first one may carry a
// connection's set-up (TCP, TLS, an HTTP/2 handshake), which says nothing of the endpoint's speed.
pub(super) const FRESH: u8 = 0b100;
// The estimate rests on one slow sample that jumped above a fresh estimate, not confirmed by
// another: a healthy endpoint's one slow call, or a connection's handshake. The balancer may
// explore such an endpoint: p2c never picks the costliest of three endpoints, so left to the
// estimate's decay (10 s time constant) it would get nothing for seconds, whatever its speed.
pub(super) const PEAK_UNCONFIRMED: u8 = 0b1000;

// A success has been recorded since the endpoint joined or was re-admitted.
pub(super) const SERVED: u8 = 0b1_0000;
// The last two calls failed: with `SERVED`, what it takes before calls are sent on purpose to
// judge the endpoint. One failure of an endpoint that has served may be a gray endpoint's (some
// calls failing, most not), and pulling a call to it after each would hold it at the traffic
// p2c alone gives it.
pub(super) const REPEATED: u8 = 0b10_0000;
// While a peak is unconfirmed: how many calls in a row (up to three) were slow against the
// estimate before the jump but under half the estimate, none of them confirming it. The fourth
// confirms it: an endpoint that jumped once far above its new, steady, slow latency is explored
// four calls at most, not until its estimate comes down to twice that latency.
pub(super) const SLOW_COUNT: u8 = 0b1100_0000;
pub(super) const SLOW_ONE: u8 = 0b0100_0000;

// A sample more than this many times a fresh estimate is a jump to confirm; a later sample more
// than this many times the estimate before the jump confirms it (the endpoint is slow) when the
// estimate after it is at most this many times the sample, or when it is the fourth such sample
// in a row (`SLOW_COUNT`).
pub(super) const PEAK_JUMP: u64 = 2;
// A failed call raises the estimate to at least this multiple of what it was ...
pub(super) const FAILURE_STEP: u64 = 2;
// ... up to this multiple of the estimate before the failures began: past it, the endpoint
// already loses every pairing with a healthy one, and the cap bounds how long its estimate takes
// to decay once it heals (about 10 s × ln 16 ≈ 28 s).
pub(super) const FAILURE_CAP: u64 = 16;
// The cap for an endpoint never measured, in nanoseconds.
pub(super) const UNMEASURED_FAILURE_CAP: u64 = 16_000_000;

/// Peak-sensitive EWMA of latencies, in nanoseconds, and when it last took a sample.
pub(super) struct Latency {
    pub(super) rtt_nanos: AtomicU64,
    pub(super) last_sample: AtomicU64,
    // The estimate before the current streak of failures began (restored by the first success),
    // or before an unconfirmed peak (what a confirming sample is measured against).
    pub(super) anchor: AtomicU64,
    // When the sample that set an unconfirmed peak completed. A call already in flight then
    // shares the jump's cause (the process, the server or the path stalled for all of them) and
    // neither confirms the peak nor counts toward `SLOW_COUNT`: after one stall, the calls that
    // waited through it would confirm each other and starve a healthy endpoint for the decay
    // time. Only read while a peak is unconfirmed.
    pub(super) peak_at: AtomicU64,
}

impl EndpointRecord {
    #[inline]
    pub(super) fn sample_rtt(&self, rtt: u64, now: Nanos, last: u8) {
        let flags = self.latency_flags.load(Ordering::Relaxed);
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
                // The steady state: a success after a success. A call begun a stale gap after the
                // last completion (an explored one, or one p2c sent as the estimate decayed) that
                // comes back well under the decayed estimate replaces it: it is news of the
                // endpoint's speed now. A genuinely slow endpoint's next slow call is a peak again
                // (an unconfirmed one, explored until confirmed). Calls begun before the gap ended
                // (racing completions) move the estimate as usual.
                let next = if idle.saturating_sub(rtt) >= STALE_ESTIMATE_NANOS
                    && rtt.saturating_mul(PEAK_JUMP) < old
                {
                    rtt
                } else {
                    peak_ewma(old, rtt)
                };
                (next, self.peak_flags(flags, old, next, rtt, now))
            } else {
                self.sample_unusual(flags, old, rtt, last, now)
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
            self.latency_flags.store(flags_next, Ordering::Relaxed);
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
    /// that jumps as far above that and leaves the estimate within twice itself (the endpoint is
    /// as slow as the estimate says: a genuinely slow endpoint that p2c tries again as its
    /// estimate decays gets one explored call more), by the fourth such slow sample in a row
    /// that leaves it higher (an endpoint now steadily slow, but far below the jump: four
    /// explored calls at most), or once the estimate is back within a quarter of where it was.
    /// An endpoint starved by p2c is sampled rarely, so one noisy sample must not be enough to
    /// keep it out: on a loaded machine a healthy endpoint's calls often take twice their usual
    /// time, and such a call used to confirm a peak ten times higher, starving the endpoint for
    /// the estimate's decay time (twenty seconds and more). A sample of a call begun before the
    /// jump was sampled counts for none of this unless it settles the estimate: calls that waited
    /// through one stall (of the process, the server or the path) are one piece of evidence.
    #[inline]
    fn peak_flags(&self, flags: u8, old: u64, next: u64, rtt: u64, now: Nanos) -> u8 {
        if flags & PEAK_UNCONFIRMED != 0 {
            let anchor = self.latency.anchor.load(Ordering::Relaxed);
            let slow = rtt > anchor.saturating_mul(PEAK_JUMP);
            let settled = next.saturating_mul(4) <= anchor.saturating_mul(5);
            if slow
                && !settled
                && now.saturating_sub(rtt) < self.latency.peak_at.load(Ordering::Relaxed)
            {
                // In flight when the jump was sampled: not independent evidence.
                return flags;
            }
            let confirmed =
                slow && (next <= rtt.saturating_mul(PEAK_JUMP) || flags & SLOW_COUNT == SLOW_COUNT);
            if confirmed || settled {
                return flags & !(PEAK_UNCONFIRMED | SLOW_COUNT);
            }
            return if slow {
                flags + SLOW_ONE
            } else {
                flags & !SLOW_COUNT
            };
        } else if old > 0 && rtt > old.saturating_mul(PEAK_JUMP) {
            self.latency.anchor.store(old, Ordering::Relaxed);
            self.latency.peak_at.store(now, Ordering::Relaxed);
            return (flags | PEAK_UNCONFIRMED) & !SLOW_COUNT;
        }
        flags
    }

    /// The estimate and flags after a sample that is not a success following a success: the
    /// first sample of a fresh endpoint, a failure, or the success that ends failures.
    #[cold]
    fn sample_unusual(&self, flags: u8, old: u64, rtt: u64, last: u8, now: Nanos) -> (u64, u8) {
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
                self.latency.peak_at.store(now, Ordering::Relaxed);
                next_flags = (next_flags | PEAK_UNCONFIRMED) & !SLOW_COUNT;
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
            next_flags &= !(PEAK_UNCONFIRMED | SLOW_COUNT);
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

    /// Whether a call has succeeded since the endpoint joined or was re-admitted.
    pub fn has_served(&self) -> bool {
        self.latency_flags.load(Ordering::Relaxed) & SERVED != 0
    }

    /// Whether the last recorded call failed (in any way).
    pub fn last_call_failed(&self) -> bool {
        self.latency_flags.load(Ordering::Relaxed) & LAST_MASK != LAST_SUCCEEDED
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
    /// [`CallsNeeded::calls_wanted`](crate::CallsNeeded::calls_wanted): a streak under way) and the layer has room to eject.
    /// Otherwise the call would only fail again for nothing.
    pub fn follow_up_wanted(&self, quiet: Nanos, now: Nanos) -> bool {
        self.latency_flags.load(Ordering::Relaxed) & LAST_MASK == LAST_FAILED
            && now.saturating_sub(self.latency.last_sample.load(Ordering::Relaxed)) >= quiet
            && self.notifier.room_to_eject()
            && self.policies.iter().any(|policy| {
                policy
                    .calls_needed()
                    .is_some_and(|needs| needs.calls_wanted(now) > 0)
            })
    }

    /// Whether the endpoint's last call succeeded [`STALE_ESTIMATE`] or more before `now` and none
    /// completed since: the estimate p2c reads of it is that old. An endpoint avoided for
    /// slowness is then worth one call (its next fast success replaces the estimate); one whose
    /// last call failed or timed out has rules of its own, and one with no call since it joined
    /// or was re-admitted has a seed, not a measurement (its trial is its rules' business: a
    /// re-admitted black hole is not sent a call for its estimate's sake).
    pub fn estimate_stale(&self, now: Nanos) -> bool {
        self.latency_flags.load(Ordering::Relaxed) & (LAST_MASK | FRESH) == LAST_SUCCEEDED
            && now.saturating_sub(self.latency.last_sample.load(Ordering::Relaxed))
                >= STALE_ESTIMATE_NANOS
    }

    /// Whether the last recorded call timed out: the balancer avoids the endpoint for the time
    /// the call took, its estimate decaying from there.
    pub fn last_timed_out(&self) -> bool {
        self.latency_flags.load(Ordering::Relaxed) & LAST_MASK == LAST_TIMED_OUT
    }

    /// Ends the avoidance a timeout left once the endpoint answered a check at no caller's
    /// expense (the layer restarts the estimate first, [`seed_rtt`](Self::seed_rtt)): the last
    /// call counts as answered, so the next success is no success after failures.
    pub fn end_timeout_avoidance(&self) {
        let flags = self.latency_flags.load(Ordering::Relaxed);
        if flags & LAST_MASK == LAST_TIMED_OUT {
            self.latency_flags
                .store(flags & !(LAST_MASK | REPEATED), Ordering::Relaxed);
        }
    }

    /// Whether the last recorded call was refused by the caller's own stack
    /// ([`Outcome::NotSent`](crate::Outcome::NotSent)): the balancer steers away from the
    /// endpoint for a moment and then tries it again.
    pub fn last_not_sent(&self) -> bool {
        self.latency_flags.load(Ordering::Relaxed) & LAST_MASK == LAST_NOT_SENT
    }

    /// Whether the estimate rests on one slow sample that jumped far above a fresh estimate and
    /// that no later sample confirmed: a healthy endpoint's one slow call, which a balancer may
    /// explore past rather than wait for the estimate to decay.
    pub fn peak_unconfirmed(&self) -> bool {
        self.latency_flags.load(Ordering::Relaxed) & (PEAK_UNCONFIRMED | LAST_MASK)
            == PEAK_UNCONFIRMED
    }

    /// The cheap half of [`calls_wanted`](Self::calls_wanted): whether its policies could want
    /// calls at all (two relaxed loads, no window read).
    #[inline]
    pub fn may_want_calls(&self) -> bool {
        let flags = self.latency_flags.load(Ordering::Relaxed);
        flags & LAST_MASK == LAST_FAILED
            && (flags & REPEATED != 0 || flags & SERVED == 0)
            && self.notifier.room_to_eject()
    }

    /// How many more calls this endpoint should get before its policies can judge it: the most
    /// any policy wants ([`CallsNeeded::calls_wanted`](crate::CallsNeeded::calls_wanted)). Asked only while the last call failed
    /// fast (any failure but a timeout: 503 and UNAVAILABLE included, which behind a proxy are what
    /// a dead upstream looks like), the one before it failed too or the endpoint has served
    /// nothing since it joined or was re-admitted (one failure of a serving endpoint may be a gray
    /// endpoint's: pulling a call after each would hold it at the traffic p2c alone gives it),
    /// and the layer has room to eject ([`Notifier::room_to_eject`](crate::Notifier::room_to_eject)); 0 otherwise, without reading
    /// any window. After a timeout nothing is wanted: the balancer
    /// already avoids the endpoint for the time the call took, and each call sent on purpose would
    /// cost a caller a timeout.
    pub fn calls_wanted(&self, now: Nanos) -> u64 {
        if !self.may_want_calls() {
            return 0;
        }
        self.policies
            .iter()
            .map(|policy| {
                policy
                    .calls_needed()
                    .map_or(0, |needs| needs.calls_wanted(now))
            })
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
        let flags = self.latency_flags.load(Ordering::Relaxed);
        self.latency_flags.store(
            (flags | FRESH) & !(SERVED | REPEATED | SLOW_COUNT),
            Ordering::Relaxed,
        );
    }
}

/// The peak-sensitive moving average: a sample above the estimate replaces it, one below moves
/// it an eighth of the way down.
#[inline]
pub(super) fn peak_ewma(old: u64, rtt: u64) -> u64 {
    if rtt >= old {
        rtt
    } else {
        old - (old - rtt) / 8
    }
}

/// `exp(-idle / RTT_DECAY)`. Calls a few milliseconds apart (the common case) take the series, which
/// is accurate to 1e-6 there and much cheaper than `exp`.
#[inline]
pub(super) fn decay(idle: Nanos) -> f64 {
    let x = idle as f64 / RTT_DECAY.as_nanos() as f64;
    if x < 1.0 / 64.0 {
        1.0 - x + x * x / 2.0
    } else {
        (-x).exp()
    }
}
