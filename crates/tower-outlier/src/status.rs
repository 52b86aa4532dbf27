//! Where an endpoint stands, as the monitor, the events and the metrics show it.

/// Where an endpoint stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum EndpointStatus {
    /// In the balancer's set, serving requests.
    Available,
    /// Re-admitted for a passive trial: serving requests and judged only on what happened since
    /// re-admission; ejected again with a longer interval if it breaches before the trial ends.
    Trial,
    /// Out of the balancer's set, waiting for its next recovery check.
    Ejected,
    /// Out of the balancer's set while an active probe is in flight.
    Probing,
    /// In the balancer's set, but its service's `poll_ready` failed: the endpoint reports itself
    /// not ready (the balancer does not pick it) and asks its service again after a back-off,
    /// from 100 ms up to 30 s. The layer does not count it as an endpoint to fall back on.
    Unready,
}

impl EndpointStatus {
    /// Whether the balancer may send requests to the endpoint.
    pub fn is_available(&self) -> bool {
        matches!(self, EndpointStatus::Available | EndpointStatus::Trial)
    }
}
