//! Policies that judge endpoints against each other, on a timer.

use std::fmt;
use std::time::Duration;

use crate::clock::Nanos;
use crate::record::EndpointRecord;

use super::*;

/// What a policy that judges endpoints against each other implements, with its own endpoint
/// state type: the layer calls [`evaluate`](Self::evaluate) every [`interval`](Self::interval)
/// with every endpoint the upstream holds.
pub trait FleetPolicy: Send + Sync {
    /// The policy's per-endpoint state: its [`OutlierPolicy::Endpoint`].
    type State: EndpointPolicy;

    /// How often to evaluate.
    fn interval(&self) -> Duration;

    /// Judges the whole set at once (cold path); the policy acts through the states and the
    /// records (for example their weights).
    fn evaluate(&self, fleet: &[FleetMember<'_, Self::State>], now: Nanos);

    /// A layer starts evaluating this policy at `at`: its evaluations come one
    /// [`interval`](Self::interval) apart from then (the first at `at + interval`), until a
    /// reconfiguration changes the interval and starts them again. For a policy whose timing
    /// follows its evaluations before the first one has run (Envoy's ejections end on the
    /// interval timer armed when the detector starts). Nothing by default.
    fn started(&self, at: Nanos) {
        let _ = at;
    }

    /// Whether the policy reads the calls each endpoint has in flight
    /// ([`FleetMember::in_flight`], [`FleetMember::waited`]): counting them takes a lock per
    /// endpoint, so only a policy that asks is given them. Default: no (both are zero).
    fn counts_in_flight(&self) -> bool {
        false
    }
}

/// One endpoint as [`FleetPolicy::evaluate`] sees it.
#[derive(Debug)]
pub struct FleetMember<'a, S: ?Sized> {
    /// The endpoint's key, for logs.
    pub key: &'a dyn fmt::Debug,
    /// This policy's state for the endpoint.
    pub state: &'a S,
    /// The endpoint's record.
    pub record: &'a EndpointRecord,
    /// Whether the endpoint is in the balancer's set (not ejected).
    pub available: bool,
    /// Calls in flight, for a policy that [counts them](FleetPolicy::counts_in_flight) (else 0).
    pub in_flight: usize,
    /// How long the endpoint's calls in flight have waited with no call completing (from the
    /// later of when the oldest began and the last completion), for a policy that
    /// [counts them](FleetPolicy::counts_in_flight) (else 0): a hung endpoint's grows.
    pub waited: Nanos,
}

impl<S: ?Sized> Clone for FleetMember<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: ?Sized> Copy for FleetMember<'_, S> {}
