//! Policies as a layer holds them, whatever their types.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Nanos;

use super::*;

/// An [`OutlierPolicy`] as a layer holds it, whatever its endpoint state's type.
///
/// Made from any `OutlierPolicy` with [`from_policy`](#method.from_policy) or
/// [`from_shared`](#method.from_shared), and implemented by nothing else: a layer, its rules and
/// its monitor hold policies as `Arc<dyn DynOutlierPolicy>`. The policy is wrapped rather than
/// given a second trait, so a policy's own type has only [`OutlierPolicy`]'s methods, whatever
/// is imported. This module is the one place where
/// the types a policy declares are recovered from the values a layer holds: a state goes back
/// to the policy type that made it ([`new_endpoint_from`](Self::new_endpoint_from), a fleet
/// evaluation), and a user can ask for the policy in force as its own type
/// ([`downcast_ref`](#method.downcast_ref)).
///
/// ```
/// use std::sync::Arc;
/// use tower_outlier_core::{DynOutlierPolicy, EndpointPolicy, OutlierPolicy};
/// # use tower_outlier_core::{Description, Judgement, Nanos, Observation, RecoverySchedule, Signal};
/// # use std::time::Duration;
/// # #[derive(Debug)] struct Never;
/// # #[derive(Debug)] struct Healthy;
/// # impl EndpointPolicy for Healthy {
/// #     fn record(&self, _: &Observation, _: Nanos) -> Signal { Signal::None }
/// #     fn judge(&self, _: Nanos) -> Judgement { Judgement::Healthy }
/// #     fn describe(&self, _: Nanos) -> Description { Description::default() }
/// #     fn reset(&self) {}
/// # }
/// # impl OutlierPolicy for Never {
/// #     type Endpoint = Healthy;
/// #     fn name(&self) -> &'static str { "never" }
/// #     fn new_endpoint(&self) -> Healthy { Healthy }
/// #     fn recovery(&self) -> RecoverySchedule { RecoverySchedule::fixed(Duration::from_secs(1)) }
/// #     fn trial_period(&self) -> Duration { Duration::from_secs(1) }
/// # }
///
/// let held: Arc<dyn DynOutlierPolicy> = <dyn DynOutlierPolicy>::from_policy(Never);
/// assert_eq!(held.name(), "never");
/// assert!(held.downcast_ref::<Never>().is_some());
/// // The policy's own type keeps only its own trait's methods, with both traits in scope.
/// assert_eq!(Never.name(), "never");
/// ```
pub trait DynOutlierPolicy: fmt::Debug + Send + Sync + Any + sealed::Sealed {
    /// [`OutlierPolicy::name`].
    fn name(&self) -> &'static str;

    /// [`OutlierPolicy::new_endpoint`], boxed.
    fn new_endpoint(&self) -> Box<dyn EndpointPolicy>;

    /// [`OutlierPolicy::new_endpoint_from`] when `previous` is of this policy's
    /// [`Endpoint`](OutlierPolicy::Endpoint) type; a fresh state otherwise.
    fn new_endpoint_from(
        &self,
        previous: &dyn EndpointPolicy,
        now: Nanos,
    ) -> Box<dyn EndpointPolicy>;

    /// [`OutlierPolicy::enabled`].
    fn enabled(&self) -> bool;

    /// [`OutlierPolicy::recovery`].
    fn recovery(&self) -> RecoverySchedule;

    /// [`OutlierPolicy::trial_period`].
    fn trial_period(&self) -> Duration;

    /// [`OutlierPolicy::budget`].
    fn budget(&self) -> Option<EjectionBudget>;

    /// [`OutlierPolicy::when_all_out`].
    fn when_all_out(&self) -> Option<WhenAllOut>;

    /// [`FleetPolicy::interval`], for a policy with the [`fleet`](OutlierPolicy::fleet)
    /// capability.
    fn fleet_interval(&self) -> Option<Duration>;

    /// [`FleetPolicy::started`], for a policy with the [`fleet`](OutlierPolicy::fleet)
    /// capability.
    fn fleet_started(&self, at: Nanos);

    /// [`FleetPolicy::counts_in_flight`], for a policy with the [`fleet`](OutlierPolicy::fleet)
    /// capability (`false` without it).
    fn fleet_counts_in_flight(&self) -> bool;

    /// [`FleetPolicy::evaluate`] over the members whose state is this policy's (all of them, in a
    /// layer: each endpoint holds one state per policy). Whether it evaluated: `false`, doing
    /// nothing, for a policy without the capability now.
    fn evaluate_fleet(&self, fleet: &[FleetMember<'_, dyn EndpointPolicy>], now: Nanos) -> bool;

    /// [`OutlierPolicy::judges_by_host`].
    fn judges_by_host(&self) -> bool;
}

impl dyn DynOutlierPolicy {
    /// `policy`, as a layer holds it.
    pub fn from_policy<P: OutlierPolicy>(policy: P) -> Arc<Self> {
        Self::from_shared(Arc::new(policy))
    }

    /// A policy already shared, as a layer holds it.
    pub fn from_shared<P: OutlierPolicy>(policy: Arc<P>) -> Arc<Self> {
        Arc::new(Held(policy))
    }

    /// The policy as its own type, if it is a `P`.
    pub fn downcast_ref<P: OutlierPolicy>(&self) -> Option<&P> {
        (self as &dyn Any)
            .downcast_ref::<Held<P>>()
            .map(|held| &*held.0)
    }

    /// The shared policy as its own type, if it is a `P`.
    pub fn downcast_arc<P: OutlierPolicy>(&self) -> Option<Arc<P>> {
        (self as &dyn Any)
            .downcast_ref::<Held<P>>()
            .map(|held| held.0.clone())
    }
}

/// A policy as a layer holds it.
struct Held<P>(Arc<P>);

impl<P: fmt::Debug> fmt::Debug for Held<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The policy's own, as if it were not wrapped.
        self.0.fmt(f)
    }
}

impl<P: OutlierPolicy> DynOutlierPolicy for Held<P> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn new_endpoint(&self) -> Box<dyn EndpointPolicy> {
        Box::new(self.0.new_endpoint())
    }

    fn new_endpoint_from(
        &self,
        previous: &dyn EndpointPolicy,
        now: Nanos,
    ) -> Box<dyn EndpointPolicy> {
        match (previous as &dyn Any).downcast_ref::<P::Endpoint>() {
            Some(previous) => Box::new(self.0.new_endpoint_from(previous, now)),
            None => Box::new(self.0.new_endpoint()),
        }
    }

    fn enabled(&self) -> bool {
        self.0.enabled()
    }

    fn recovery(&self) -> RecoverySchedule {
        self.0.recovery()
    }

    fn trial_period(&self) -> Duration {
        self.0.trial_period()
    }

    fn budget(&self) -> Option<EjectionBudget> {
        self.0.budget()
    }

    fn when_all_out(&self) -> Option<WhenAllOut> {
        self.0.when_all_out()
    }

    fn judges_by_host(&self) -> bool {
        self.0.judges_by_host()
    }

    fn fleet_interval(&self) -> Option<Duration> {
        self.0.fleet().map(|fleet| fleet.interval())
    }

    fn fleet_counts_in_flight(&self) -> bool {
        self.0.fleet().is_some_and(|fleet| fleet.counts_in_flight())
    }

    fn fleet_started(&self, at: Nanos) {
        if let Some(fleet) = self.0.fleet() {
            fleet.started(at);
        }
    }

    fn evaluate_fleet(&self, fleet: &[FleetMember<'_, dyn EndpointPolicy>], now: Nanos) -> bool {
        let Some(policy) = self.0.fleet() else {
            return false;
        };
        let typed: Vec<FleetMember<'_, P::Endpoint>> = fleet
            .iter()
            .filter_map(|member| {
                Some(FleetMember {
                    key: member.key,
                    state: (member.state as &dyn Any).downcast_ref::<P::Endpoint>()?,
                    record: member.record,
                    available: member.available,
                    in_flight: member.in_flight,
                    waited: member.waited,
                })
            })
            .collect();
        policy.evaluate(&typed, now);
        true
    }
}

mod sealed {
    /// Keeps [`DynOutlierPolicy`](super::DynOutlierPolicy) to the layer's wrapper.
    pub trait Sealed {}

    impl<P> Sealed for super::Held<P> {}
}
