//! What the per-call benchmarks share: the trivial service they wrap and their statistics.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

/// The cheapest possible service: always ready, answers at once.
#[derive(Clone, Copy)]
pub struct Echo;

impl Service<u64> for Echo {
    type Response = u64;
    type Error = Infallible;
    type Future = Ready<Result<u64, Infallible>>;

    #[inline]
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    #[inline]
    fn call(&mut self, request: u64) -> Self::Future {
        ready(Ok(request))
    }
}

/// Nanoseconds per call.
pub fn ns_per_call(elapsed: Duration, calls: u64) -> f64 {
    elapsed.as_nanos() as f64 / calls as f64
}

/// The median of the runs (the runs of a noisy machine: the mean would follow the outliers).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}
