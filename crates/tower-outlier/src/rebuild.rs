//! Fresh services for endpoints that return after their connections failed.
//!
//! An endpoint ejected for timeouts or transport failures (refused, reset) comes back, by default,
//! as a clone of the service it had: a client's clones share its connection pool, and a pool whose
//! connections went dead with a restarted server, or wedged behind a black hole, fails the first
//! calls after the return. With
//! [`OutlierDetectionLayer::rebuild_on_return`](crate::OutlierDetectionLayer::rebuild_on_return),
//! the layer makes the endpoint a new service instead, from a factory per key, as tonic-xds
//! reconnects an endpoint it marks `needs_reconnect`: before its recovery probe (which then runs
//! on the new service) or its re-admission, whichever comes first, once per ejection.

use std::fmt;

/// Makes a fresh service for an endpoint that returns after its connections failed.
///
/// `None` keeps the current service (a clone of it). A rebuild that panics keeps it too, and is
/// logged.
pub trait Rebuild<K, S> {
    /// A new service for the endpoint `key`, whose current service is `current`.
    fn rebuild(&self, key: &K, current: &S) -> Option<S>;
}

/// The default: an endpoint comes back with a clone of the service it had.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeepService;

impl<K, S> Rebuild<K, S> for KeepService {
    fn rebuild(&self, _: &K, _: &S) -> Option<S> {
        None
    }
}

/// A [`Rebuild`] from a closure that makes an endpoint's service from its key
/// ([`rebuild_fn`]).
#[derive(Clone, Copy)]
pub struct RebuildFn<F> {
    make: F,
}

/// Rebuilds an endpoint's service with `make(key)`: for a hyper client pinned to one address, a
/// new client for that address (a new pool, new connections).
///
#[cfg_attr(feature = "detectors", doc = "```")]
#[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
/// use std::net::SocketAddr;
/// use tower_outlier::rebuild::rebuild_fn;
/// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
///
/// #[derive(Clone)]
/// struct Pinned(SocketAddr); // stands for a client with its own connection pool
///
/// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?))
///     .rebuild_on_return(rebuild_fn(|addr: &SocketAddr| Pinned(*addr)));
/// # let _ = layer;
/// # Ok::<(), tower_outlier::ConfigError>(())
/// ```
pub fn rebuild_fn<F>(make: F) -> RebuildFn<F> {
    RebuildFn { make }
}

impl<K, S, F> Rebuild<K, S> for RebuildFn<F>
where
    F: Fn(&K) -> S,
{
    fn rebuild(&self, key: &K, _: &S) -> Option<S> {
        Some((self.make)(key))
    }
}

impl<F> fmt::Debug for RebuildFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RebuildFn").finish_non_exhaustive()
    }
}
