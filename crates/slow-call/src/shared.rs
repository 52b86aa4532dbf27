//! What a breaker service, its clones and its response futures share, and the lanes its
//! futures reach it through.

use tower_outlier_core::lanes::{HasLanes, Lanes};
use tower_outlier_core::Clock;

use crate::breaker::Breaker;

/// What the service, its clones and its response futures share.
pub(crate) struct Shared<C> {
    pub(crate) breaker: Breaker,
    pub(crate) classifier: C,
    pub(crate) clock: Clock,
    pub(crate) lanes: Lanes<Shared<C>>,
}

impl<C> Shared<C> {
    pub(crate) fn new(breaker: Breaker, classifier: C, clock: Clock) -> Self {
        Shared {
            breaker,
            classifier,
            clock,
            lanes: Lanes::new(),
        }
    }
}

impl<C> HasLanes for Shared<C> {
    fn lanes(&self) -> &Lanes<Self> {
        &self.lanes
    }
}

/// What response futures hold to reach the shared state: the outlier endpoint's lanes
/// (`tower_outlier_core::lanes`). A future holds a reference to its handle's lane, so the
/// reference counts written per call are the lane's, which only that handle's calls write: once
/// each has its own lane, cores calling through clones of one breaker write no shared word per
/// call on the closed path (the breaker's state is only read, and its window gives each core a
/// ring of its own once they contend), though two lanes, unpadded, may share a cache line. Making
/// or dropping a lane writes the shared state's list of lanes, once per handle.
///
/// A breaker never asks for its calls in flight, so its handles do not count themselves as a
/// lane's holders: `Lane::in_flight` and `Lanes::in_flight` mean nothing here and are not read.
/// Only handles that call more than once make a lane.
pub(crate) type Lane<C> = tower_outlier_core::lanes::Lane<Shared<C>>;
