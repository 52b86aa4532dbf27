//! What a server says of itself beside a call's outcome: one typed signal, read from a response
//! by the layer's classifiers (or a classifier of the user's) and handed to the endpoint's
//! record, which acts on what is its own (pushback, degraded, health) and passes every signal to
//! the policies that [`hear`](crate::EndpointPolicy::hear) them.

use std::time::Duration;

/// The header ORCA's per-call load reports travel in (gRFC A51): the base64 of an
/// `xds.data.orca.v3.OrcaLoadReport`, in a response's headers or trailers.
pub const LOAD_REPORT_HEADER: &str = "endpoint-load-metrics-bin";

/// What a server said of itself, beside a call's outcome.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::ServerSignal;
///
/// // A 503 with `Retry-After: 5`, as a classifier reads it.
/// let signal = ServerSignal::PushBack { wait: Duration::from_secs(5) };
/// assert_eq!(signal, ServerSignal::PushBack { wait: Duration::from_secs(5) });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerSignal<'a> {
    /// Leave me alone for `wait` (`Retry-After` on a 429 or 503, gRPC's
    /// `grpc-retry-pushback-ms`): the layer keeps the endpoint out that long, within its bound.
    PushBack {
        /// How long the server asked for.
        wait: Duration,
    },
    /// I am degraded (Envoy's `x-envoy-degraded`), or, `false`, I am not: while the layer reads
    /// the signal, a degraded endpoint is picked only when no other can take a call.
    Degraded(bool),
    /// My load, as an ORCA report: the [`LOAD_REPORT_HEADER`] value, still encoded. Only the
    /// policies that hear signals read it.
    LoadReport(&'a [u8]),
    /// My health service says I serve, or, `false`, that I do not (`grpc.health.v1`).
    Serving(bool),
}
