//! A handle whose service failed `poll_ready`: out of the balancer's picks, retried with a back-off.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::*;

/// A handle's hold on an endpoint whose service failed `poll_ready`: when it asks again.
pub(super) struct Unready {
    pub(super) retry: Pin<Box<tokio::time::Sleep>>,
    pub(super) failures: u32,
}

/// The first wait after a readiness error, doubled after each one in a row, up to the cap.
pub(super) const UNREADY_FIRST_RETRY: Duration = Duration::from_millis(100);
pub(super) const UNREADY_MAX_RETRY: Duration = Duration::from_secs(30);

impl Holder {
    /// The inner service's `poll_ready` failed. A balancer given the error would drop the
    /// endpoint for good (p2c does), out of step with the layer, which would still count it as
    /// one to fall back on; so the handle keeps it, reports it not ready, tells the layer, and
    /// asks the service again after a back-off (a reconnecting service recovers; a dead one is
    /// asked every 30 s at most). `Pending` with the retry timer registered.
    #[cold]
    pub(super) fn readiness_failed<E>(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        let failures = self
            .unready
            .as_ref()
            .map_or(0, |u| u.failures)
            .saturating_add(1);
        let wait = UNREADY_FIRST_RETRY
            .saturating_mul(1 << (failures - 1).min(16))
            .min(UNREADY_MAX_RETRY);
        if failures == 1 {
            tracing::warn!(
                target: "tower_outlier",
                // The error's type: the service's error has no `Display` bound to print it by.
                error_type = std::any::type_name::<E>(),
                "an endpoint's service failed poll_ready: held out of the balancer's picks and asked again after a back-off"
            );
        }
        self.shared.record.set_unready(true);
        let mut retry = Box::pin(tokio::time::sleep(wait));
        // Registers the timer: woken when it is time to ask the service again.
        let _ = retry.as_mut().poll(cx);
        self.unready = Some(Box::new(Unready { retry, failures }));
        Poll::Pending
    }
}
