//! The record's list of policy states, held in place when there is one.

use crate::policy::EndpointPolicy;

/// The record's policy states. Most layers have one policy: held in place, where a list of one on
/// the heap cost every endpoint 16 bytes (8 more in the record for the tag).
pub(super) enum Policies {
    One(Box<dyn EndpointPolicy>),
    Many(Box<[Box<dyn EndpointPolicy>]>),
}

impl From<Box<[Box<dyn EndpointPolicy>]>> for Policies {
    fn from(policies: Box<[Box<dyn EndpointPolicy>]>) -> Self {
        let mut policies = Vec::from(policies);
        match policies.len() {
            1 => Policies::One(policies.remove(0)),
            _ => Policies::Many(policies.into_boxed_slice()),
        }
    }
}

impl std::ops::Deref for Policies {
    type Target = [Box<dyn EndpointPolicy>];

    #[inline]
    fn deref(&self) -> &Self::Target {
        match self {
            Policies::One(policy) => std::slice::from_ref(policy),
            Policies::Many(policies) => policies,
        }
    }
}
