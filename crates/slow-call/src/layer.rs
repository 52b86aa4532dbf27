//! The standalone layer.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;
use tower_outlier_core::{Clock, NetworkErrors};

use crate::breaker::{Breaker, Observer, StateChange};
use crate::config::BreakerConfig;
use crate::service::CircuitBreaker;

/// A circuit breaker for any `Service`, with Sentinel's degrade semantics.
///
/// Each service the layer wraps gets its own breaker; clones of a wrapped service share it. While
/// the breaker is open, calls fail at once with [`BrokenCircuit`](crate::BrokenCircuit) (boxed in a
/// `tower::BoxError`) without reaching the inner service; after the open duration exactly one call
/// goes through as the probe, and its completion decides.
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_outlier_slow_call::{BreakerConfig, CircuitBreakerLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// let breaker = CircuitBreakerLayer::new(
///     BreakerConfig::slow_ratio(Duration::from_millis(500))
///         .open_duration(Duration::from_secs(10))
///         .build()?,
/// )
/// .on_state_change(|change| println!("breaker {} -> {}", change.from, change.to));
/// let service = ServiceBuilder::new()
///     .layer(breaker)
///     .service(service_fn(|name: &'static str| async move {
///         Ok::<_, std::io::Error>(format!("hello {name}"))
///     }));
/// assert_eq!(service.oneshot("world").await?, "hello world");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CircuitBreakerLayer<C = NetworkErrors> {
    config: BreakerConfig,
    classifier: C,
    clock: Clock,
    observers: Vec<Observer>,
}

impl CircuitBreakerLayer {
    /// A layer with `config`, counting only service errors as failures ([`NetworkErrors`]).
    pub fn new(config: BreakerConfig) -> Self {
        CircuitBreakerLayer {
            config,
            classifier: NetworkErrors,
            clock: Clock::auto(),
            observers: Vec::new(),
        }
    }
}

impl<C> CircuitBreakerLayer<C> {
    /// Sets what counts as a failure (for the error strategies, and for the probe).
    pub fn classifier<C2>(self, classifier: C2) -> CircuitBreakerLayer<C2> {
        CircuitBreakerLayer {
            config: self.config,
            classifier,
            clock: self.clock,
            observers: self.observers,
        }
    }

    /// Sets the clock calls are timed with (default [`Clock::auto`]).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Registers a callback told of every state change, with the value that triggered it. It runs
    /// on the process's breaker-observer thread, after the change and never on the caller's task,
    /// inside the caller's tokio runtime and `tracing` span; one that panics is caught and logged.
    /// Changes are told in the order they were handed over: two changes of one breaker made at
    /// once on two threads may arrive in either order, so read `from` and `to`, not the arrival
    /// order. The thread is shared by every breaker of the process: an observer that blocks holds
    /// back every later change, so keep it quick or hand the work to a task.
    /// [`wait_for_state_observers`](crate::wait_for_state_observers) and
    /// [`state_observers_told`](crate::state_observers_told) wait until it has run.
    pub fn on_state_change(
        mut self,
        observer: impl Fn(&StateChange) + Send + Sync + 'static,
    ) -> Self {
        self.observers.push(Arc::new(observer));
        self
    }
}

impl<S, C: Clone> Layer<S> for CircuitBreakerLayer<C> {
    type Service = CircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        let breaker = Breaker::with_observers(self.config.clone(), self.observers.clone().into());
        CircuitBreaker::new(inner, breaker, self.classifier.clone(), self.clock.clone())
    }
}

impl<C: fmt::Debug> fmt::Debug for CircuitBreakerLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayer")
            .field("config", &self.config)
            .field("classifier", &self.classifier)
            .field("clock", &self.clock)
            .field("observers", &self.observers.len())
            .finish()
    }
}
