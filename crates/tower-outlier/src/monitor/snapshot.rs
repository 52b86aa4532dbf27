//! What a snapshot shows of the layer: statuses, windows, reasons.

use std::fmt;
use std::time::{Duration, SystemTime};

use tower_outlier_core::{Judged, Reason, WindowCounts};

use crate::controls::Override;
use crate::event::EndpointKey;

pub use crate::status::EndpointStatus;

/// One policy's window, as a snapshot shows it.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PolicyWindow {
    /// The policy's name.
    pub policy: &'static str,
    /// The counts in its window now.
    pub counts: WindowCounts,
    /// The state the policy holds the endpoint in, if it has one (a slow-call breaker's
    /// or linkerd's probe gate's `"CLOSED"` when calls pass, `"OPEN"` when they are held,
    /// `"HALF_OPEN"` while a probe passes: a circuit breaker's words, the same for every policy).
    pub state: Option<&'static str>,
    /// What the policy compares with its threshold now, where that is not the counts' failure
    /// rate: a streak of failures and the streak that ejects.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub judged: Option<Judged>,
    /// For a composition of policies ([`ComposedPolicy`](crate::ComposedPolicy)), each member's
    /// window and state, in order; empty for any other policy.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub members: Vec<PolicyWindow>,
}

/// The state of one endpoint at the time of a [`Monitor::snapshot`](crate::Monitor::snapshot).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct EndpointSnapshot {
    /// The endpoint's discover key: typed ([`EndpointKey::downcast_ref`]), and read as its
    /// `Debug` text where text is enough.
    pub key: EndpointKey,
    /// Available, on trial, ejected or probing.
    pub status: EndpointStatus,
    /// Each policy's window, in the layer's policy order.
    pub windows: Vec<PolicyWindow>,
    /// The first policy's failure rate (`failures / calls`, 0 with no calls).
    pub error_rate: f64,
    /// Time until the next recovery check (ejected) or the end of the trial (on trial).
    pub next_check_in: Option<Duration>,
    /// The same as a point in time (the system clock at the snapshot plus `next_check_in`).
    pub next_check_at: Option<SystemTime>,
    /// Consecutive failed recovery checks; the next interval is this plus one units, capped.
    pub failed_checks: u32,
    /// Why the endpoint was last ejected, if it ever was.
    pub last_reason: Option<Reason>,
    /// Requests in flight.
    pub in_flight: usize,
    /// The latency estimate the endpoint's load is computed from (decayed to the snapshot's
    /// time): raised by fast failures, restored by the first success after them.
    pub latency_estimate: Duration,
    /// Relative weight (1.0 = the endpoint's original weight).
    pub weight: f64,
    /// The absolute weight a weight policy gives it (SOFARPC's), if the layer has one.
    pub absolute_weight: Option<f64>,
    /// Whether a weight policy holds it degraded.
    pub degraded: bool,
    /// While it ramps up after joining a serving fleet or after its re-admission
    /// ([`OutlierDetectionLayer::slow_start`](crate::OutlierDetectionLayer::slow_start)): its
    /// share of a full endpoint's traffic by the ramp's formula, at the snapshot's time.
    pub ramp_share: Option<f64>,
    /// While its server says it is degraded
    /// ([`OutlierDetectionLayer::detect_degraded`](crate::OutlierDetectionLayer::detect_degraded)):
    /// how long that holds without another response saying so.
    pub degraded_by_server: Option<Duration>,
    /// Whether its health service last said it is not serving
    /// ([`Probe::watch`](crate::probe::Probe::watch), gRPC's `grpc.health.v1` Watch).
    pub not_serving: bool,
    /// Set while the endpoint is in the balancer's set, its last call failed at least a second ago
    /// and no call has completed since: the balancer is **avoiding** it, since its latency
    /// estimate carries the failures, and its policies have not judged it (a policy that judges
    /// on a timer, a window short of its minimum after timeouts, a budget that refused). The time
    /// since that last call. Callers get no traffic sent to it; it gets calls again as its
    /// estimate decays (within about 30 s after fast failures, longer after timeouts), and the
    /// first success brings it back to its share.
    pub avoided_for: Option<Duration>,
    /// Why the layer keeps the endpoint in although a policy judged it an outlier: "last
    /// available endpoint", or the budget, as "ejection budget of 0 for 3 endpoints at 20 %"
    /// (EDAS's 20 % rounds down to none below five endpoints) or "ejection budget of 1 for 5
    /// endpoints at 20 % is spent". Cleared once it is ejected or no longer judged an outlier.
    /// "forced in by an operator" for one an operator keeps in; prefixed "dry run: " for a
    /// refusal dry run reports.
    pub refused: Option<String>,
    /// In dry run ([`RulesHandle::set_dry_run`](crate::RulesHandle::set_dry_run)), where the
    /// rules would have the endpoint — `Ejected`, `Probing`, `Trial` — while it stays in the
    /// balancer's set (its `status` says where it really is, and `next_check_in`,
    /// `failed_checks` and `last_reason` are the dry run's). `None` when the rules would leave it
    /// available, or when what they decide is enforced.
    pub would_be: Option<EndpointStatus>,
    /// An operator's override of the rules for it, if one is in force.
    pub forced: Option<Override>,
}

/// All endpoints of a layer, sorted by key.
#[derive(Clone, Debug, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Snapshot {
    /// One entry per endpoint the upstream currently holds.
    pub endpoints: Vec<EndpointSnapshot>,
    /// The version of the rules in force: the newest an adaptor of the layer has applied (0 as
    /// built; see [`RulesHandle`](crate::RulesHandle)). A version just published is in force once
    /// the balancer next polls the adaptor.
    pub rules_version: u64,
    /// Why the last reconfiguration was refused, if it was (cleared by the next accepted one).
    pub rules_error: Option<String>,
    /// What the rules in force said on their way in, when a document was accepted with notes:
    /// keys it ignored (with the key a misspelt one likely meant), detection it switched off.
    /// Replaced by the next accepted change.
    pub rules_notes: Vec<String>,
    /// Errors the upstream discover streams returned that the layer kept serving through
    /// ([`DiscoverErrors::KeepServing`](crate::DiscoverErrors)).
    pub discover_errors: u64,
    /// Set while the layer's budget allows no ejection at all for the endpoints it has, with
    /// why: "ejection budget of 0 for 3 endpoints at 20 %" (EDAS's 20 % of fewer than five,
    /// Envoy's 10 % of fewer than ten). Its policies may judge endpoints outliers; none is
    /// ejected, and failing ones are only avoided by the balancer.
    pub no_ejection: Option<String>,
    /// Set while the rules leave the balancer no endpoint it would pick otherwise, with what the
    /// layer does about it ([`WhenAllOut`](crate::WhenAllOut)): "panic: 1 of 4 endpoints
    /// healthy, below 50 %: every endpoint gets traffic", or "no endpoint to pick (every one
    /// ejected or unready): calls fail fast behind the fail-fast guard, or wait".
    pub all_out: Option<String>,
    /// Whether the layer-wide dry run is on: nothing is ejected, and `would_be` shows what would.
    pub dry_run: bool,
    /// The policies in dry run of their own ([`RulesHandle::set_policy_dry_run`](crate::RulesHandle::set_policy_dry_run)), by name.
    pub dry_run_policies: Vec<&'static str>,
}

impl Snapshot {
    /// The endpoint whose key prints (with `Debug`) as `key`.
    pub fn get(&self, key: &str) -> Option<&EndpointSnapshot> {
        self.endpoints.iter().find(|e| e.key.as_str() == key)
    }

    /// The endpoint with discover key `key` (compared by its `Debug` form, as snapshots keep it).
    ///
    /// ```
    /// # use tower_outlier::Snapshot;
    /// let addr: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
    /// let snapshot = Snapshot::default();
    /// assert!(snapshot.get_key(&addr).is_none());
    /// ```
    pub fn get_key<K: fmt::Debug + ?Sized>(&self, key: &K) -> Option<&EndpointSnapshot> {
        self.get(&format!("{key:?}"))
    }

    /// How many endpoints are out of the balancer's set (ejected or probing).
    pub fn ejected(&self) -> usize {
        self.endpoints
            .iter()
            .filter(|e| !e.status.is_available())
            .count()
    }
}
