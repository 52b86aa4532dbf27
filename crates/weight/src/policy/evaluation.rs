//! How one evaluation judges each endpoint against the fleet's average (SOFARPC's rules).

use std::sync::atomic::Ordering;

use tower_outlier_core::FleetMember;

use super::*;

/// What one evaluation decided for one endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Verdict {
    NotCounted,
    Healthy,
    /// With the endpoint's exception rate, in hundredths.
    Abnormal {
        rate: u128,
    },
}

impl WeightPolicy {
    /// The least calls an endpoint at `weight` needs to be counted: the least count times
    /// `weight / original` (rounded half-up to hundredths), truncated, never below 1 — as SOFARPC
    /// scales it (see [Arithmetic](WeightPolicy#arithmetic)).
    pub(super) fn scaled_least_count(&self, weight: f64) -> u64 {
        // The weights are `f64`; their ratio is the one quotient not taken on integers. `round`
        // rounds halves away from zero, which for a non-negative ratio is half-up; the cast
        // saturates (and maps NaN to 0).
        let ratio = (weight * 100.0 / self.config.original_weight).round() as u128;
        let scaled = u128::from(self.config.least_window_count) * ratio / 100;
        u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
    }

    pub(super) fn degrade(
        &self,
        member: &FleetMember<'_, WeightEndpoint>,
        state: &WeightEndpoint,
        rate: f64,
        average: f64,
        degraded: &mut usize,
    ) {
        let config = &*self.config;
        let current = state.weight();
        let next = (current * config.degrade_rate).max(config.least_weight);
        if !config.degrade_effective {
            tracing::warn!(
                target: "tower_outlier::weight",
                endpoint = ?member.key,
                exception_rate = rate,
                average,
                weight = current,
                would_be = next,
                "abnormal endpoint (degrade switch off: weight unchanged)"
            );
            return;
        }
        if !state.is_degraded() {
            if *degraded >= config.max_degraded {
                tracing::info!(
                    target: "tower_outlier::weight",
                    endpoint = ?member.key,
                    exception_rate = rate,
                    average,
                    degraded = *degraded,
                    "abnormal endpoint not degraded: the degraded set is full"
                );
                return;
            }
            state.degraded.store(true, Ordering::Relaxed);
            *degraded += 1;
        }
        self.set_weight(member, state, next);
        tracing::warn!(
            target: "tower_outlier::weight",
            endpoint = ?member.key,
            exception_rate = rate,
            average,
            from = current,
            to = next,
            "endpoint weight degraded"
        );
    }

    pub(super) fn recover(
        &self,
        member: &FleetMember<'_, WeightEndpoint>,
        state: &WeightEndpoint,
        degraded: &mut usize,
    ) {
        let config = &*self.config;
        let current = state.weight();
        let mut next = current * config.recover_rate;
        if next >= config.original_weight {
            next = config.original_weight;
            state.degraded.store(false, Ordering::Relaxed);
            *degraded = degraded.saturating_sub(1);
        }
        self.set_weight(member, state, next);
        tracing::info!(
            target: "tower_outlier::weight",
            endpoint = ?member.key,
            from = current,
            to = next,
            recovered = !state.is_degraded(),
            "endpoint weight recovering"
        );
    }

    pub(super) fn set_weight(
        &self,
        member: &FleetMember<'_, WeightEndpoint>,
        state: &WeightEndpoint,
        weight: f64,
    ) {
        state.weight.store(weight.to_bits(), Ordering::Relaxed);
        member
            .record
            .set_weight(weight / self.config.original_weight);
    }
}

/// `numerator / denominator` in hundredths, rounded half-up (Java's
/// `BigDecimal.divide(denominator, 2, ROUND_HALF_UP)` on non-negative integers), computed exactly:
/// `floor(100 × n / d + 1/2)` is `floor((200 × n + d) / (2 × d))`. `denominator` is not 0.
pub(super) fn hundredths(numerator: u128, denominator: u128) -> u128 {
    (numerator * 200 + denominator) / (denominator * 2)
}

/// Whether `rate / average` (both in hundredths, `average` not 0), rounded half-up to two places
/// as SOFARPC divides them, is at least `multiple`.
pub(super) fn reaches_multiple(rate: u128, average: u128, multiple: f64) -> bool {
    // The quotient of two integers is correctly rounded to `f64`, as Java's
    // `BigDecimal.doubleValue` is, so the comparison is the one SOFARPC makes.
    as_decimal(hundredths(rate, average)) >= multiple
}

/// A count of hundredths as a decimal number (for comparisons and logs).
pub(super) fn as_decimal(hundredths: u128) -> f64 {
    hundredths as f64 / 100.0
}
