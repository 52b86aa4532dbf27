//! What the endpoint's server says of itself, as the record keeps it: the pushback it asked
//! for (and the avoidance the layer set when it kept the endpoint in), whether it is degraded,
//! whether its health service serves; and [`EndpointRecord::hear`], the one way a
//! [`ServerSignal`] comes in.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::EndpointRecord;
use crate::clock::{duration_to_nanos, Nanos};
use crate::signal::ServerSignal;

/// What the server says of itself, in the record's options (made the first time it matters: a
/// server asks for a pause, the layer reads the degraded signal, a health service speaks).
#[derive(Default)]
pub(super) struct Heard {
    // Until when the server asked to be left alone (a `Retry-After`, gRPC's pushback), on the
    // record's clock; 0: it has not (written when a response asks).
    pushback: AtomicU64,
    // Until when the layer, having kept the endpoint in (the budget), has its load avoided for
    // the server's request, capped; 0: it does not.
    avoid: AtomicU64,
    // Until when its server said it is degraded (`x-envoy-degraded`), on the record's clock; 0:
    // it is not. And how long one such response holds it so (0: the layer does not read the
    // signal). Written only while the server says so, and when that changes.
    degraded_until: AtomicU64,
    degraded_hold: AtomicU64,
    // Its health service says it is not serving (gRPC's `grpc.health.v1` Watch): the layer's
    // to act on, until it says it is (written when that changes).
    not_serving: AtomicBool,
}

impl Heard {
    /// Takes on `other`'s state (a record's successor).
    pub(super) fn copy_from(&self, other: &Heard) {
        for (to, from) in [
            (&self.pushback, &other.pushback),
            (&self.avoid, &other.avoid),
            (&self.degraded_until, &other.degraded_until),
            (&self.degraded_hold, &other.degraded_hold),
        ] {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.not_serving
            .store(other.not_serving.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Forgets the pushback and the avoidance for it.
    pub(super) fn forget_pushback(&self) {
        self.pushback.store(0, Ordering::Relaxed);
        self.avoid.store(0, Ordering::Relaxed);
    }
}

impl EndpointRecord {
    /// What the server said of itself, if it said anything yet.
    #[inline]
    fn heard(&self) -> Option<&Heard> {
        self.options.get().map(|options| &options.heard)
    }

    /// What the server says of itself, made now if nothing was heard yet.
    fn heard_or_new(&self) -> &Heard {
        &self.options_or_new().heard
    }

    /// What the endpoint's server said at `now`: acted on where it is the record's (pushback,
    /// degraded, health), and told to every policy that [hears](crate::EndpointPolicy::hears)
    /// signals. Whether the endpoint's state changed (it became degraded or stopped being so,
    /// its health service changed its word). Cold path, but for a load report that comes with
    /// every call: then no lock and no allocation.
    pub fn hear(&self, signal: ServerSignal<'_>, now: Nanos) -> bool {
        let changed = match signal {
            ServerSignal::PushBack { wait } => {
                self.push_back(now.saturating_add(duration_to_nanos(wait)));
                false
            }
            ServerSignal::Degraded(degraded) => self.set_degraded(degraded, now),
            ServerSignal::Serving(serving) => self.set_not_serving(!serving),
            ServerSignal::LoadReport(_) => false,
        };
        if self.hears() {
            for policy in self.policies.iter().filter(|policy| policy.hears()) {
                policy.hear(&signal, now);
            }
        }
        changed
    }

    /// Whether a policy of the record hears what the server says (so that a load report is worth
    /// reading from a response): one load.
    #[inline]
    pub fn hears(&self) -> bool {
        self.marks.load(Ordering::Relaxed) & super::HEARS != 0
    }

    /// The server asked to be left alone until `until` (on the record's clock): a 429 or 503 with
    /// `Retry-After`, a gRPC status with `grpc-retry-pushback-ms`. The layer is asked to act; a
    /// later request never shortens an earlier one (cold path: the first one an endpoint's server
    /// makes allocates its options).
    pub fn push_back(&self, until: Nanos) {
        self.heard_or_new()
            .pushback
            .fetch_max(until, Ordering::AcqRel);
        self.request_evaluation();
    }

    /// Shortens the server's request to end by `latest` at the latest (the layer's cap; 0 drops
    /// it). Cold path.
    pub fn cap_pushback(&self, latest: Nanos) {
        if let Some(heard) = self.heard() {
            heard.pushback.fetch_min(latest, Ordering::AcqRel);
        }
    }

    /// The layer kept the endpoint in although its server asked to be left alone: its load is to
    /// be avoided until `until` (the request as the layer caps it). Cold path.
    pub fn avoid_until(&self, until: Nanos) {
        self.heard_or_new().avoid.fetch_max(until, Ordering::AcqRel);
    }

    /// Until when the endpoint's load is to be avoided ([`avoid_until`](Self::avoid_until)), if
    /// that is still ahead of `now`.
    #[inline]
    pub fn avoided_until(&self, now: Nanos) -> Option<Nanos> {
        let until = self.heard()?.avoid.load(Ordering::Relaxed);
        (until > now).then_some(until)
    }

    /// Until when the server asked to be left alone, if that is still ahead of `now`.
    #[inline]
    pub fn pushed_back_until(&self, now: Nanos) -> Option<Nanos> {
        let until = self.heard()?.pushback.load(Ordering::Relaxed);
        (until > now).then_some(until)
    }

    /// Notes what the endpoint's health service says: not serving, or (`false`) serving. Whether
    /// that changed. Cold path; the layer acts on it.
    pub fn set_not_serving(&self, not_serving: bool) -> bool {
        if !not_serving && self.heard().is_none() {
            return false;
        }
        self.heard_or_new()
            .not_serving
            .swap(not_serving, Ordering::AcqRel)
            != not_serving
    }

    /// Whether the endpoint's health service last said it is not serving.
    #[inline]
    pub fn is_not_serving(&self) -> bool {
        self.heard()
            .is_some_and(|heard| heard.not_serving.load(Ordering::Relaxed))
    }

    /// Forgets what the server asked and the avoidance the layer set for it: the endpoint is back
    /// after a signal's ejection, its policies' histories kept (cold path).
    pub fn forget_pushback(&self) {
        if let Some(heard) = self.heard() {
            heard.forget_pushback();
        }
    }

    /// Ends any avoidance the layer set with [`avoid_until`](Self::avoid_until): the endpoint was
    /// forced in, or dry run keeps routing as it is. Cold path.
    pub fn end_avoidance(&self) {
        if let Some(heard) = self.heard() {
            if heard.avoid.load(Ordering::Relaxed) != 0 {
                heard.avoid.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Ends an avoidance the layer set with [`avoid_until`](Self::avoid_until)`(Nanos::MAX)`, the
    /// one that lasts until the layer ends it (a server not serving, kept in). Cold path.
    pub fn end_open_avoidance(&self) {
        if let Some(heard) = self.heard() {
            let _ =
                heard
                    .avoid
                    .compare_exchange(Nanos::MAX, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Reads what the endpoint's server says of its own state: a response saying it is degraded
    /// holds it so for `hold` (zero: the signal is ignored, the default). Cold path.
    pub fn watch_degraded(&self, hold: Duration) {
        if hold.is_zero() && self.heard().is_none() {
            return;
        }
        self.heard_or_new()
            .degraded_hold
            .store(duration_to_nanos(hold), Ordering::Relaxed);
    }

    /// Whether the layer reads the server's degraded signal (one or two loads).
    #[inline]
    pub fn watches_degraded(&self) -> bool {
        self.heard()
            .is_some_and(|heard| heard.degraded_hold.load(Ordering::Relaxed) != 0)
    }

    /// A response at `now` said the endpoint is degraded, or (`false`) did not: degraded until
    /// the hold after the last response that said so, or until a response that does not. Ignored
    /// unless [`watch_degraded`](Self::watch_degraded) set a hold. Whether the endpoint's state
    /// changed. Writes only while the server says so, and when that ends.
    pub fn set_degraded(&self, degraded: bool, now: Nanos) -> bool {
        let Some(heard) = self.heard() else {
            return false;
        };
        let hold = heard.degraded_hold.load(Ordering::Relaxed);
        if hold == 0 {
            return false;
        }
        let until = heard.degraded_until.load(Ordering::Relaxed);
        let was = until > now;
        if degraded {
            heard
                .degraded_until
                .store(now.saturating_add(hold).max(1), Ordering::Relaxed);
        } else if until != 0 {
            heard.degraded_until.store(0, Ordering::Relaxed);
        }
        was != degraded
    }

    /// Until when the endpoint is degraded by its server's word, if that is still ahead of
    /// `now`.
    #[inline]
    pub fn degraded_until(&self, now: Nanos) -> Option<Nanos> {
        let until = self.heard()?.degraded_until.load(Ordering::Relaxed);
        (until > now).then_some(until)
    }
}
