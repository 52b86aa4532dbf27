//! The load p2c reads: the endpoint's cost, and the draws that decide when a suspect gets a call.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tower::load::Load;
use tower_outlier_core::Nanos;

use super::*;

/// The load of an [`OutlierEndpoint`]: (latency estimate + 1 µs) × (in-flight + 1) ÷ relative weight,
/// in nanoseconds — or zero while the endpoint needs calls to be judged; infinite while its
/// server asked to be left alone ([`pushback`](crate::pushback)) or its health service says it is
/// not serving, and the layer kept it in; 10¹⁸ more in the draws a slow-starting or weighted
/// endpoint sits out
/// ([`OutlierDetectionLayer::slow_start`](crate::OutlierDetectionLayer::slow_start)), so that it
/// wins one only against another sitting out (while weights from load reports are in force, the
/// latency estimate counts as zero, so that calls in flight alone decide between endpoints taking
/// part); 10²⁰ more while its server says it is degraded
/// ([`degraded`](crate::degraded)), so that it wins a draw only against another degraded
/// endpoint (or one avoided altogether).
///
/// Lower is better. The microsecond keeps requests in flight and weights meaningful between
/// endpoints whose measured latency rounds to zero (an in-process service, or tokio's paused
/// clock). A weight of zero makes the cost infinite, so such an endpoint never wins a
/// power-of-two-choices pair against one with a finite cost.
///
/// The latency estimate follows the endpoint's calls, with three rules of its own
/// ([`EndpointRecord`]): the first call after the endpoint joins or is re-admitted, which may set
/// up a connection, moves it as an average (not as a peak); a call that fails fast doubles it, up
/// to 16 times what it was before the failures began, so that failing fast never makes an endpoint
/// the cheapest pick; the first success after failures restores it.
///
/// A latency-driven balancer then starves an endpoint whose calls fail or time out. That is
/// deliberate (it is how p2c alone protects callers), but it would keep a policy that judges each
/// call from ever judging it, and one slow call from a healthy endpoint would shut it out for the
/// estimate's decay time. Two rules report a cost of zero instead (neither applies to an endpoint
/// whose weight a policy lowered on purpose):
/// * **Evidence.** While its last call failed fast (any failure but a timeout), a policy wants
///   more calls before it can judge (the rest of a streak of consecutive failures, or an error
///   rate above the threshold on fewer calls than the minimum), and the layer could eject it, the
///   endpoint wins until that many calls are in flight: exactly the failures the policy asks for,
///   no more. Such episodes begin 10 s apart at the least, the gap doubling with each one up to
///   320 s: a gray endpoint whose streaks keep breaking is not sent much more than p2c alone
///   would send it. A policy that judges on a timer wants none. After a timeout nothing is wanted: each
///   call sent on purpose would cost a caller a timeout, and p2c avoids the endpoint on its own.
/// * **Exploration.** An endpoint with no call in flight whose estimate rests on one slow call
///   more than twice what it was, not yet confirmed by another, wins a draw after losing 16 in a
///   row. A genuinely slow endpoint's next call (begun after the slow one ended, and as slow as
///   half the estimate) confirms it and
///   ends the exploration, so it gets no more traffic than p2c alone gives it (one call more
///   each time p2c tries it again; four at most when it jumped far above its new latency); a
///   healthy one's fast calls bring its estimate back down. An endpoint whose last call
///   succeeded a second ago or more wins a draw after losing 64 in a row, and a fast answer then
///   replaces its estimate ([`STALE_ESTIMATE`](tower_outlier_core::STALE_ESTIMATE)): one that
///   was slow and healed is back in about a second instead of after its estimate's decay.
///
/// So reading the load counts a draw: it is meant for the balancer that holds this handle (p2c
/// reads both candidates of every draw). The count lives in the handle, not the shared record.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct EndpointCost(f64);

impl EndpointCost {
    /// The cost as a number.
    pub fn value(&self) -> f64 {
        self.0
    }
}

pub(super) const COST_FLOOR_NANOS: f64 = 1_000.0;

/// Added to the cost of an endpoint its server says is degraded: more than any cost a live
/// endpoint reaches (a thousand calls in flight at a latency of a year), less than the infinite
/// cost of one avoided altogether.
pub(super) const DEGRADED_COST: f64 = 1e20;

/// Added to the cost of an endpoint in a draw it sits out (slow start, weights from load
/// reports): more than any cost a live endpoint reaches, less than a degraded endpoint's.
pub(super) const SIT_OUT_COST: f64 = 1e18;

impl<S, C> Load for OutlierEndpoint<S, C> {
    type Metric = EndpointCost;

    fn load(&self) -> EndpointCost {
        let record = self.record();
        let weight = record.weight();
        if weight <= 0.0 {
            return EndpointCost(f64::INFINITY);
        }
        let now = record.clock().now();
        // Its server asked to be left alone and the budget kept it in: picked only against
        // another that asked too.
        if record.avoided_until(now).is_some() {
            return EndpointCost(f64::INFINITY);
        }
        let in_flight = self.in_flight();
        let draws = &self.holder.draws;
        let degraded = record.degraded_until(now).is_some();
        // Slow start, and weights from load reports: the endpoint takes part in only its share
        // of the draws and loses the others, whatever its cost (the evidence and exploration
        // below come first: they ask for a few calls a policy needs).
        let draws_share = record.ramp_draws(now) * record.draw_share();
        let weighted = record.draws_weighted();
        // Exploration re-checks a healthy endpoint's one slow call, and follows up a fast
        // failure; an endpoint whose server says it is degraded is avoided on purpose, not for a
        // slow call, so only the follow-up applies (ejection wins over degradation). A stale
        // estimate is explored only where latency decides the draws: an endpoint sitting out
        // draws, or weighted by load reports, loses them for another reason.
        let stale_ok = !degraded && draws_share >= 1.0 && !weighted;
        if weight >= 1.0
            && (draws.wanted(&self.holder.shared, now, in_flight as u64) > in_flight as u64
                || draws.explore(&self.holder.shared, in_flight, now, !degraded, stale_ok))
        {
            return EndpointCost(0.0);
        }
        let sits_out = draws_share < 1.0 && !draws.takes_part(draws_share);
        // Weights from load reports stand for the servers' load (as in gRPC's weighted round
        // robin): latency would decide every draw between two endpoints taking part, and the
        // calls would no longer split as the weights say.
        let mut rtt = if weighted {
            0.0
        } else {
            record.rtt_estimate(now)
        };
        if in_flight > 0 {
            // Calls in flight count at their age so far: one that has waited far longer than
            // the estimate (a black hole, a hung call) says more of the endpoint than samples
            // from before it. Measured from when the calls began or the last call completed,
            // whichever is later (a busy endpoint completes calls all the time).
            rtt = rtt.max(self.holder.waiting(record, now) as f64);
        }
        let rtt = rtt + COST_FLOOR_NANOS;
        let mut cost = rtt * (in_flight as f64 + 1.0) / weight;
        if sits_out {
            // Behind every endpoint taking part in the draw, ahead of a degraded one.
            cost += SIT_OUT_COST;
        }
        if degraded {
            // Its server says it is degraded: behind every endpoint that is not, ordered by its
            // own cost among the degraded ones.
            cost += DEGRADED_COST;
        }
        EndpointCost(cost)
    }
}

/// How many power-of-two-choices draws in a row an endpoint whose estimate rests on one
/// unconfirmed slow call may lose before it wins one anyway (at most one in 17 of its draws).
pub(super) const EXPLORE_AFTER: u32 = 16;

/// How many draws in a row an endpoint whose estimate has gone stale
/// ([`EndpointRecord::estimate_stale`]: its last call succeeded a second ago or more) may lose
/// before it wins one anyway. p2c reads two of n endpoints a request, so an endpoint p2c avoids
/// for its latency gets at most one call in 32·n (two in 64 draws), and at most one a second: at
/// 200 requests a second over five endpoints, half a percent of the calls; over two or three
/// endpoints at low traffic, 1.6 or 1 % each, near a p99. The price of feeding a healed endpoint
/// again within a second at high traffic.
pub(super) const STALE_EXPLORE_AFTER: u32 = 64;

/// How long an endpoint avoided after one fast failure waits, once it has lost
/// [`EXPLORE_AFTER`] draws, for a call that tells a server gone (a second failure in a row, which
/// its policies then judge) from a blip (a success, which restores its estimate), when a policy
/// would judge on it: without it, serial traffic left a killed server avoided and unjudged under
/// the recommended configuration, and once restarted unfed until its estimate decayed, half a
/// minute or more.
pub(super) const RETRY_AFTER_FAST_FAILURE: Nanos = 1_000_000_000;

/// How far the record's time of the last completion may lag (it is written at most once a
/// millisecond, so that cores calling one endpoint do not share a written line).
pub(super) const WAITING_GRANULARITY: Nanos = 1_000_000;

/// How long a computed evidence request stays good while no call completes: the windows it reads
/// move by whole buckets, far slower than the balancer draws.
pub(super) const EVIDENCE_REFRESH: Nanos = 10_000_000;

/// What the balancer's load reads need to remember about this handle. It belongs to the handle
/// the balancer holds, not to the shared record, so the reads write no memory other cores use.
/// Atomic only so that `OutlierEndpoint` stays `Sync`: the balancer holding the handle is normally its
/// only reader; concurrent reads through a shared reference could only blur the counts.
#[derive(Debug)]
pub(super) struct Draws {
    lost: AtomicU32,
    // When the follow-up of a fast failure was last asked for and refused: asked again only
    // [`EVIDENCE_REFRESH`] later, as it reads the policies' windows.
    follow_up_refused_at: AtomicU64,
    wanted: AtomicU64,
    wanted_at: AtomicU64,
    wanted_in_flight: AtomicU64,
    // Slow start's credit (f64 bits): each draw adds the endpoint's share of draws, and it takes
    // part in one whenever a whole draw's credit is there, so it takes part in exactly that share
    // of its draws, evenly spread and without a random number.
    ramp_credit: AtomicU64,
}

impl Default for Draws {
    fn default() -> Self {
        Draws {
            lost: AtomicU32::new(0),
            follow_up_refused_at: AtomicU64::new(Nanos::MAX),
            wanted: AtomicU64::new(0),
            wanted_at: AtomicU64::new(Nanos::MAX),
            wanted_in_flight: AtomicU64::new(0),
            ramp_credit: AtomicU64::new(0f64.to_bits()),
        }
    }
}

impl Draws {
    /// The calls the policies want ([`EndpointRecord::calls_wanted`]), read from the windows at
    /// most every [`EVIDENCE_REFRESH`] unless a call completed since (the in-flight count fell).
    pub(super) fn wanted(&self, shared: &Shared, now: Nanos, in_flight: u64) -> u64 {
        let record = &shared.record;
        if !record.may_want_calls() {
            shared.record.end_evidence_episode();
            return 0;
        }
        let at = self.wanted_at.load(Ordering::Relaxed);
        if at != Nanos::MAX
            && now.saturating_sub(at) < EVIDENCE_REFRESH
            && in_flight >= self.wanted_in_flight.load(Ordering::Relaxed)
        {
            return self.wanted.load(Ordering::Relaxed);
        }
        let wanted = record.evidence_episode(record.calls_wanted(now), now);
        self.wanted.store(wanted, Ordering::Relaxed);
        self.wanted_at.store(now, Ordering::Relaxed);
        self.wanted_in_flight.store(in_flight, Ordering::Relaxed);
        wanted
    }

    /// Counts one draw; true when the endpoint has lost enough in a row to win this one: its
    /// estimate rests on one unconfirmed slow call (when `slow_call` asks it), or its last call
    /// failed fast a second ago or more and a policy would judge on the next
    /// ([`EndpointRecord::follow_up_wanted`]), or, after [`STALE_EXPLORE_AFTER`] lost draws
    /// (when `stale` allows it), its last call succeeded long enough ago that its estimate is
    /// stale ([`EndpointRecord::estimate_stale`]): an endpoint that was slow and healed is then
    /// back in about a second, not after its estimate decays. Never while a call is in flight: a sample is on
    /// its way, and a black hole (whose calls never complete) would otherwise be sent one more
    /// call each time it lost 16 draws until its first timeout came back. Never after a timeout
    /// either: that call would cost a caller a timeout too.
    pub(super) fn explore(
        &self,
        shared: &Shared,
        in_flight: usize,
        now: Nanos,
        slow_call: bool,
        stale: bool,
    ) -> bool {
        let lost = self.lost.load(Ordering::Relaxed);
        if lost >= EXPLORE_AFTER
            && in_flight == 0
            && ((slow_call && shared.record.peak_unconfirmed())
                || shared.record.last_not_sent()
                || (stale && lost >= STALE_EXPLORE_AFTER && shared.record.estimate_stale(now))
                || self.follow_up(shared, now))
        {
            return true;
        }
        self.lost.store(lost.saturating_add(1), Ordering::Relaxed);
        false
    }

    /// [`EndpointRecord::follow_up_wanted`], asked at most every [`EVIDENCE_REFRESH`] after a
    /// refusal: it reads the policies' windows, and an avoided endpoint is drawn on every request.
    pub(super) fn follow_up(&self, shared: &Shared, now: Nanos) -> bool {
        let refused_at = self.follow_up_refused_at.load(Ordering::Relaxed);
        if refused_at != Nanos::MAX && now.saturating_sub(refused_at) < EVIDENCE_REFRESH {
            return false;
        }
        // A follow-up is evidence sent on purpose too: within the episodes.
        let wanted = shared
            .record
            .follow_up_wanted(RETRY_AFTER_FAST_FAILURE, now)
            && (shared.record.evidence_episode_under_way()
                || shared.record.evidence_episode(1, now) > 0);
        self.follow_up_refused_at
            .store(if wanted { Nanos::MAX } else { now }, Ordering::Relaxed);
        wanted
    }

    /// Counts one draw of a ramping endpoint that takes part in `share` of them; whether it
    /// takes part in this one.
    pub(super) fn takes_part(&self, share: f64) -> bool {
        let credit = f64::from_bits(self.ramp_credit.load(Ordering::Relaxed)) + share;
        let part = credit >= 1.0;
        let left = if part { credit - 1.0 } else { credit };
        self.ramp_credit.store(left.to_bits(), Ordering::Relaxed);
        part
    }

    #[inline]
    pub(super) fn dispatched(&self) {
        if self.lost.load(Ordering::Relaxed) != 0 {
            self.lost.store(0, Ordering::Relaxed);
        }
    }
}
