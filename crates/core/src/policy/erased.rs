//! Policies as a layer holds them, whatever their types.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Nanos;

use super::*;

/// An [`OutlierPolicy`] as a layer holds it, whatever its endpoint state's type.
///
/// Implemented for every `OutlierPolicy` and for nothing else: a layer, its rules and its
/// monitor hold policies as `Arc<dyn DynOutlierPolicy>`. This module is the one place where
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
/// let held: Arc<dyn DynOutlierPolicy> = Arc::new(Never);
/// assert_eq!(held.name(), "never");
/// assert!(held.downcast_ref::<Never>().is_some());
/// ```
pub trait DynOutlierPolicy: fmt::Debug + Send + Sync + Any + sealed::Sealed {
    /// [`OutlierPolicy::name`].
    fn name(&self) -> &'static str;

    /// [`OutlierPolicy::new_endpoint`], boxed.
    fn new_endpoint(&self) -> Box<dyn EndpointPolicy>;

    /// [`OutlierPolicy::new_endpoint_from`] when `previous` is a state of this policy's type
    /// (the policy replaced was of the same type); a fresh state otherwise.
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

    /// [`FleetPolicy::interval`], for a policy with the [`fleet`](OutlierPolicy::fleet)
    /// capability.
    fn fleet_interval(&self) -> Option<Duration>;

    /// [`FleetPolicy::evaluate`] over the members whose state is this policy's (all of them, in a
    /// layer: each endpoint holds one state per policy); nothing for a policy without the
    /// capability.
    fn evaluate_fleet(&self, fleet: &[FleetMember<'_, dyn EndpointPolicy>], now: Nanos);
}

impl dyn DynOutlierPolicy {
    /// The policy as its own type, if it is a `P`.
    pub fn downcast_ref<P: OutlierPolicy>(&self) -> Option<&P> {
        (self as &dyn Any).downcast_ref()
    }

    /// The shared policy as its own type, if it is a `P`.
    pub fn downcast_arc<P: OutlierPolicy>(self: Arc<Self>) -> Option<Arc<P>> {
        (self as Arc<dyn Any + Send + Sync>).downcast().ok()
    }
}

impl<P: OutlierPolicy> DynOutlierPolicy for P {
    fn name(&self) -> &'static str {
        OutlierPolicy::name(self)
    }

    fn new_endpoint(&self) -> Box<dyn EndpointPolicy> {
        Box::new(OutlierPolicy::new_endpoint(self))
    }

    fn new_endpoint_from(
        &self,
        previous: &dyn EndpointPolicy,
        now: Nanos,
    ) -> Box<dyn EndpointPolicy> {
        match (previous as &dyn Any).downcast_ref::<P::Endpoint>() {
            Some(previous) => Box::new(OutlierPolicy::new_endpoint_from(self, previous, now)),
            None => Box::new(OutlierPolicy::new_endpoint(self)),
        }
    }

    fn enabled(&self) -> bool {
        OutlierPolicy::enabled(self)
    }

    fn recovery(&self) -> RecoverySchedule {
        OutlierPolicy::recovery(self)
    }

    fn trial_period(&self) -> Duration {
        OutlierPolicy::trial_period(self)
    }

    fn budget(&self) -> Option<EjectionBudget> {
        OutlierPolicy::budget(self)
    }

    fn fleet_interval(&self) -> Option<Duration> {
        self.fleet().map(|fleet| fleet.interval())
    }

    fn evaluate_fleet(&self, fleet: &[FleetMember<'_, dyn EndpointPolicy>], now: Nanos) {
        let Some(policy) = self.fleet() else {
            return;
        };
        let typed: Vec<FleetMember<'_, P::Endpoint>> = fleet
            .iter()
            .filter_map(|member| {
                Some(FleetMember {
                    key: member.key,
                    state: (member.state as &dyn Any).downcast_ref::<P::Endpoint>()?,
                    record: member.record,
                    available: member.available,
                })
            })
            .collect();
        policy.evaluate(&typed, now);
    }
}

mod sealed {
    /// Keeps [`DynOutlierPolicy`](super::DynOutlierPolicy) to the blanket implementation.
    pub trait Sealed {}

    impl<P: super::OutlierPolicy> Sealed for P {}
}
