//! What a watch's connections did: gRFC A94's subchannel metrics, the reasons a connection
//! ends, and the sinks (a Prometheus registry) told of each attempt and end.

/// What counts a watch's connections besides its own counters (a Prometheus registry).
// Only the Prometheus module joins sinks (and compares them).
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
pub(crate) trait ConnectionSink: Send + Sync {
    /// An attempt to connect ended.
    fn attempted(&self, connected: bool);
    /// A connection ended, for `reason` (`None`: no longer watched, no disconnection).
    fn ended(&self, reason: Option<&'static str>);
    /// Joined with `open` connections open already (they will end through it).
    fn joined(&self, open: u64);
    /// Whether it counts in the same series as `other` (the same registry and name): a watch
    /// counts in each series once.
    fn same_as(&self, other: &dyn ConnectionSink) -> bool;
    /// For [`same_as`](Self::same_as).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Why a connection ended, in gRFC A94's words (its `grpc.disconnect_error` label), by what the
/// socket said: the client let it go with no error seen (`subchannel shutdown`), a read or
/// write failed (`connection reset`, `connection timed out`, `connection aborted`, or `socket
/// error` for any other error), or its server closed it without an error (`unknown`: at the
/// socket there is no HTTP/2 GOAWAY code to name). Through hyper's IO (feature `hyper-io`: a
/// hyper-util client's or tonic's connections) an end of stream cannot be seen, so every end
/// without an error is `unknown`, the client's own shutdown included.
pub const DISCONNECT_REASONS: [&str; 6] = [
    "subchannel shutdown",
    "connection reset",
    "connection timed out",
    "connection aborted",
    "socket error",
    "unknown",
];

/// The index in [`DISCONNECT_REASONS`] of a read or write error.
pub(super) fn reason_of(error: &std::io::Error) -> u8 {
    match error.kind() {
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => 1,
        std::io::ErrorKind::TimedOut => 2,
        std::io::ErrorKind::ConnectionAborted => 3,
        _ => 4,
    }
}

/// A connection's end seen as an end of stream (its server closed it).
pub(super) const CLOSED_BY_PEER: u8 = 5;

/// What the connections of one [`ConnectionWatch`](super::ConnectionWatch) did since it was made: gRFC A94's subchannel
/// metrics, from [`ConnectionWatch::stats`](super::ConnectionWatch::stats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionStats {
    /// Attempts to connect that succeeded (`grpc.subchannel.connection_attempts_succeeded`).
    pub attempts_succeeded: u64,
    /// Attempts to connect that failed or timed out (`grpc.subchannel.connection_attempts_failed`).
    pub attempts_failed: u64,
    /// Connections open now (`grpc.subchannel.open_connections`).
    pub open_connections: u64,
    /// Connections that ended, by reason (`grpc.subchannel.disconnections` by
    /// `grpc.disconnect_error`), in the order of [`DISCONNECT_REASONS`].
    pub disconnections: [u64; DISCONNECT_REASONS.len()],
}

impl ConnectionStats {
    /// The connections that ended for `reason` (one of [`DISCONNECT_REASONS`]).
    pub fn disconnections_for(&self, reason: &str) -> u64 {
        DISCONNECT_REASONS
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.disconnections[i])
    }
}
