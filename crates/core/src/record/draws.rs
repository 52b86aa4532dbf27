//! How the balancer's draws are shared out for the endpoint, as the record keeps it: the share
//! a slow start ramps up, and the share a fleet policy's weights give it (ORCA).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::EndpointRecord;
use crate::clock::Nanos;
use crate::slow_start::SlowStart;

/// The endpoint's shares of the draws, made the first time one is set: a layer with neither slow
/// start nor weights holds none (cold: read by the balancer's load, written when a ramp starts or
/// an evaluation sets a weight).
pub(super) struct Draws {
    // Slow start: when the endpoint's ramp began, on the record's clock (`Nanos::MAX`: it is not
    // ramping), the size of the set it joined then, and the layer's ramp (written when a ramp
    // starts and once when it ends).
    ramp_since: AtomicU64,
    ramp_fleet: AtomicU64,
    ramp: OnceLock<SlowStart>,
    // The share of the balancer's draws a fleet policy weighting endpoints by their servers'
    // load reports gives the endpoint (f64 bits; not a number: no weights are in force). Written
    // once per evaluation.
    draw_share: AtomicU64,
}

impl Default for Draws {
    fn default() -> Self {
        Draws {
            ramp_since: AtomicU64::new(Nanos::MAX),
            ramp_fleet: AtomicU64::new(1),
            ramp: OnceLock::new(),
            draw_share: AtomicU64::new(NO_DRAW_SHARE),
        }
    }
}

impl Draws {
    /// Takes on `other`'s state (a record's successor).
    pub(super) fn copy_from(&self, other: &Draws) {
        if let Some(ramp) = other.ramp.get() {
            let _ = self.ramp.set(*ramp);
        }
        for (to, from) in [
            (&self.ramp_since, &other.ramp_since),
            (&self.ramp_fleet, &other.ramp_fleet),
            (&self.draw_share, &other.draw_share),
        ] {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// The bits of a share of the draws that is not in force: a quiet NaN.
const NO_DRAW_SHARE: u64 = 0x7ff8_0000_0000_0000;

/// [`EndpointRecord::ramp_draws`] for a ramp begun at `since`.
#[cold]
fn ramping_draws(draws: &Draws, since: Nanos, now: Nanos) -> f64 {
    let Some(ramp) = draws.ramp.get() else {
        return 1.0;
    };
    let share = ramp.share_at(now.saturating_sub(since));
    if share >= 1.0 {
        // Over: later reads are one load again. A ramp started meanwhile is kept.
        let _ = draws.ramp_since.compare_exchange(
            since,
            Nanos::MAX,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        return 1.0;
    }
    let n = draws.ramp_fleet.load(Ordering::Relaxed) as f64;
    (share * n / (n - 1.0 + share)).min(1.0)
}

impl EndpointRecord {
    /// The shares of the draws, made now if the endpoint has none yet (cold path: one
    /// allocation, of the record's options).
    fn draws_or_new(&self) -> &Draws {
        &self.options_or_new().draws
    }

    /// The shares of the draws, if any was ever set.
    #[inline]
    fn draws(&self) -> Option<&Draws> {
        self.options.get().map(|options| &options.draws)
    }

    /// Starts the endpoint's slow start at `now`, in a balancer's set of `fleet` endpoints (this
    /// one included): its share ramps up as `ramp` says. A record ramps by the first `ramp` it
    /// was given. Cold path.
    pub fn start_ramp(&self, ramp: SlowStart, fleet: usize, now: Nanos) {
        let draws = self.draws_or_new();
        let _ = draws.ramp.set(ramp);
        draws
            .ramp_fleet
            .store(fleet.max(1) as u64, Ordering::Relaxed);
        draws.ramp_since.store(now, Ordering::Relaxed);
    }

    /// The fraction of the balancer's draws the endpoint takes part in at `now` while it ramps
    /// up, in `(0, 1]`: 1 once the ramp is over (or there is none). In a set of `n` endpoints, a
    /// p2c balancer that draws an endpoint in `p` of the pairs it is in gives it `p·(n−1)/(n−p)`
    /// of a full endpoint's share when the costs are even, so for the share `s` of the ramp's
    /// formula `p = s·n / (n − 1 + s)`. One or two loads while the endpoint is not ramping.
    #[inline]
    pub fn ramp_draws(&self, now: Nanos) -> f64 {
        let Some(draws) = self.draws() else {
            return 1.0;
        };
        let since = draws.ramp_since.load(Ordering::Relaxed);
        if since == Nanos::MAX {
            return 1.0;
        }
        ramping_draws(draws, since, now)
    }

    /// Sets the share of the balancer's draws the endpoint takes part in, in `[0, 1]` (a fleet
    /// policy that weights endpoints, such as gRPC's weighted round robin from load reports): in
    /// a p2c balancer of `n` endpoints taking part in `p_i` of their draws with even costs,
    /// endpoint `i` gets `1/n + (n·p_i − Σp)/(n(n−1))` of the calls. While a share is set (1.0
    /// included: the heaviest endpoint's), the weights stand for the endpoints' load, and the
    /// balancer's load compares endpoints taking part in a draw by their calls in flight, not by
    /// their latency ([`draws_weighted`](Self::draws_weighted)). Not a number: as
    /// [`clear_draw_share`](Self::clear_draw_share). Cold path.
    pub fn set_draw_share(&self, share: f64) {
        if share.is_nan() {
            self.clear_draw_share();
            return;
        }
        let bits = share.clamp(0.0, 1.0).to_bits();
        let draws = self.draws_or_new();
        if draws.draw_share.load(Ordering::Relaxed) != bits {
            draws.draw_share.store(bits, Ordering::Relaxed);
        }
    }

    /// No share of the draws is in force any more: the endpoint takes part in all of them, and
    /// is compared by its cost. Cold path.
    pub fn clear_draw_share(&self) {
        if let Some(draws) = self.draws() {
            if draws.draw_share.load(Ordering::Relaxed) != NO_DRAW_SHARE {
                draws.draw_share.store(NO_DRAW_SHARE, Ordering::Relaxed);
            }
        }
    }

    /// The share of the balancer's draws set by [`set_draw_share`](Self::set_draw_share) (1.0
    /// while none is in force).
    #[inline]
    pub fn draw_share(&self) -> f64 {
        self.draws().map_or(1.0, |draws| {
            let share = f64::from_bits(draws.draw_share.load(Ordering::Relaxed));
            if share.is_nan() {
                1.0
            } else {
                share
            }
        })
    }

    /// Whether a fleet policy's weights decide the endpoint's share of the draws
    /// ([`set_draw_share`](Self::set_draw_share)).
    #[inline]
    pub fn draws_weighted(&self) -> bool {
        self.draws()
            .is_some_and(|draws| !f64::from_bits(draws.draw_share.load(Ordering::Relaxed)).is_nan())
    }

    /// The ramp's share of a full endpoint's traffic at `now` (`None` while not ramping), for
    /// snapshots.
    pub fn ramp_share(&self, now: Nanos) -> Option<f64> {
        let draws = self.draws()?;
        let since = draws.ramp_since.load(Ordering::Relaxed);
        if since == Nanos::MAX {
            return None;
        }
        let share = draws.ramp.get()?.share_at(now.saturating_sub(since));
        (share < 1.0).then_some(share)
    }
}
