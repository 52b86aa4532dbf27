//! Finagle's failure accrual, as policies of `tower_outlier::OutlierDetectionLayer`.
//!
//! Finagle (whose peak-EWMA load tower's balancer uses) marks a client's endpoint dead by two
//! rules, each with its own back-off:
//!
//! * [`SuccessRateAccrual`] — `successRateWithinDuration`: a success rate averaged over time
//!   (an exponentially weighted moving average whose observations live `window` on average)
//!   below the bar, with a minimum number of requests in the window;
//! * [`ConsecutiveFailuresAccrual`] — `consecutiveFailures`: the n-th failure in a row;
//!
//! both timed by [`EqualJitter`], Finagle's equal-jitter back-off. [`finagle`] is Finagle's
//! default client policy: a success rate below 0.8 over 30 s (at least 5 requests) OR 5
//! failures in a row, each backing off from 5 s to 300 s, the longer time winning when both
//! mark an endpoint dead at once — a [`ComposedPolicy`] of the two.
//!
//! After its time out an endpoint is back in the balancer's set (Finagle lets one request
//! through as its probe); as in Finagle nothing is forgotten until a success, so a failure
//! marks it dead again for the back-off's next time, and a success starts both rules afresh.
//!
//! | rule | Finagle's default | what marks dead | time out |
//! |---|---|---|---|
//! | success rate | 0.8 over 30 s, 5 requests | a failure with the average below 0.8, judged a whole window | 5 s, 5–10 s, 10–20 s, … 300 s |
//! | consecutive failures | 5 | the 5th failure in a row | the same, its own draws |
//!
//! ```
//! use tower_outlier_core::OutlierPolicy;
//!
//! let policy = tower_outlier_finagle::finagle();
//! assert_eq!(policy.name(), "finagle");
//! assert_eq!(policy.members().len(), 2);
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod accrual;
mod backoff;
mod consecutive;
mod seeds;
mod success_rate;

use std::time::Duration;

pub use backoff::EqualJitter;
pub use consecutive::{ConsecutiveFailuresAccrual, ConsecutiveFailuresEndpoint};
pub use success_rate::{SuccessRateAccrual, SuccessRateEndpoint};
pub use tower_outlier_core::ComposedPolicy;

/// Finagle's default failure accrual (`FailureAccrualFactory.defaultPolicy`): a success rate
/// below 0.8 over 30 s with at least 5 requests, OR 5 consecutive failures, each with the
/// equal-jitter back-off from 5 s to 300 s; when both mark an endpoint dead at once the longer
/// time wins. Named `"finagle"`; its members `"success-rate-ema"` and `"consecutive-failures"`.
pub fn finagle() -> ComposedPolicy {
    compose(
        SuccessRateAccrual::default_finagle(),
        ConsecutiveFailuresAccrual::default_finagle(),
    )
}

/// [`finagle`] with its back-offs' jitter drawn from `seed`: the same calls give the same times.
pub fn finagle_seeded(seed: u64) -> ComposedPolicy {
    compose(
        SuccessRateAccrual::default_finagle().seeded(seed),
        ConsecutiveFailuresAccrual::default_finagle().seeded(seed ^ 0x9e37_79b9),
    )
}

fn compose(rate: SuccessRateAccrual, consecutive: ConsecutiveFailuresAccrual) -> ComposedPolicy {
    ComposedPolicy::any_of()
        .name("finagle")
        .member(rate)
        .member(consecutive)
        .build()
        .unwrap_or_else(|_| unreachable!("two members, neither gating readiness"))
}

impl SuccessRateAccrual {
    /// Finagle's defaults: 0.8 over 30 s, 5 requests, back-off 5 s to 300 s.
    pub fn default_finagle() -> Self {
        SuccessRateAccrual::new(0.8, Duration::from_secs(30))
            .unwrap_or_else(|_| unreachable!("0.8 and 30 s are in range"))
    }
}

impl ConsecutiveFailuresAccrual {
    /// Finagle's defaults: 5 failures in a row, back-off 5 s to 300 s.
    pub fn default_finagle() -> Self {
        ConsecutiveFailuresAccrual::new(5).unwrap_or_else(|_| unreachable!("5 is at least 1"))
    }
}

#[cfg(test)]
mod tests;
