//! Slow start: an endpoint that joins a serving fleet, or comes back after an ejection, takes a
//! share of the traffic that grows over a window instead of its full share at once.

use std::time::Duration;

use crate::clock::{duration_to_nanos, Nanos};
use crate::error::ConfigError;

/// How an endpoint's share ramps up after it joins a fleet that is already serving or is
/// re-admitted: Envoy's slow start formula,
/// `share = max(min_weight, (max(t, 1 s) / window)^(1 / aggression))` of a full endpoint's share
/// at `t` into the window, and the full share once the window is over.
///
/// The defaults are Envoy's: aggression 1 (a linear ramp), a minimum of 10 %.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::SlowStart;
///
/// let ramp = SlowStart::new(Duration::from_secs(30)).build()?;
/// assert_eq!(ramp.share(Duration::from_secs(15)), 0.5);
/// assert_eq!(ramp.share(Duration::ZERO), 0.1, "never below the minimum");
/// assert_eq!(ramp.share(Duration::from_secs(40)), 1.0);
///
/// // Aggression 2: the share follows the square root of the time, faster at first.
/// let fast = SlowStart::new(Duration::from_secs(100)).aggression(2.0).build()?;
/// assert!((fast.share(Duration::from_secs(25)) - 0.5).abs() < 1e-12);
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowStart {
    window: Duration,
    aggression: f64,
    min_weight: f64,
}

/// Builds a [`SlowStart`]; [`build`](SlowStartBuilder::build) checks the values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowStartBuilder {
    ramp: SlowStart,
}

impl SlowStart {
    /// A ramp lasting `window` (Envoy's `slow_start_window`), with Envoy's default aggression
    /// (1.0) and minimum share (10 %).
    #[allow(clippy::new_ret_no_self)]
    pub fn new(window: Duration) -> SlowStartBuilder {
        SlowStartBuilder {
            ramp: SlowStart {
                window,
                aggression: 1.0,
                min_weight: 0.1,
            },
        }
    }

    /// How long the ramp lasts.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The ramp's aggression: the share grows as the time's `1 / aggression` power.
    pub fn aggression(&self) -> f64 {
        self.aggression
    }

    /// The smallest share, as a fraction of a full endpoint's.
    pub fn min_weight(&self) -> f64 {
        self.min_weight
    }

    /// The share of a full endpoint's traffic at `elapsed` into the ramp, in `[min_weight, 1]`.
    pub fn share(&self, elapsed: Duration) -> f64 {
        self.share_at(duration_to_nanos(elapsed))
    }

    /// [`share`](Self::share) for `elapsed` nanoseconds.
    pub fn share_at(&self, elapsed: Nanos) -> f64 {
        let window = duration_to_nanos(self.window);
        if elapsed >= window {
            return 1.0;
        }
        // Envoy counts at least one second, so a ramp never starts at nothing.
        let time_factor = elapsed.max(1_000_000_000) as f64 / window as f64;
        let ramped = if self.aggression == 1.0 {
            time_factor
        } else {
            time_factor.powf(1.0 / self.aggression)
        };
        ramped.max(self.min_weight).min(1.0)
    }
}

impl SlowStartBuilder {
    /// Sets the aggression (Envoy's `aggression`, default 1.0): above 1 the share rises fast at
    /// first, below 1 slowly. Must be a finite number above zero.
    pub fn aggression(mut self, aggression: f64) -> Self {
        self.ramp.aggression = aggression;
        self
    }

    /// Sets the smallest share, as a fraction of a full endpoint's (Envoy's
    /// `min_weight_percent` divided by 100, default 0.1). Must lie in `(0, 1]`.
    pub fn min_weight(mut self, fraction: f64) -> Self {
        self.ramp.min_weight = fraction;
        self
    }

    /// The ramp, or the first value out of range: a zero window, an aggression that is not a
    /// finite number above zero, a minimum share outside `(0, 1]`.
    pub fn build(self) -> Result<SlowStart, ConfigError> {
        let SlowStart {
            window,
            aggression,
            min_weight,
        } = self.ramp;
        crate::check_nonzero_duration("slow_start_window", window)?;
        if !(aggression.is_finite() && aggression > 0.0) {
            return Err(ConfigError::new(
                "aggression",
                aggression,
                "a finite number above 0",
            ));
        }
        if !(min_weight.is_finite() && min_weight > 0.0 && min_weight <= 1.0) {
            return Err(ConfigError::new(
                "min_weight",
                min_weight,
                "a number in (0, 1]",
            ));
        }
        Ok(self.ramp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_formula_with_its_floor_and_its_first_second() {
        let ramp = SlowStart::new(Duration::from_secs(10)).build().unwrap();
        // The first second counts as one: 10 %, and the minimum is 10 % too.
        assert_eq!(ramp.share(Duration::from_millis(300)), 0.1);
        assert_eq!(ramp.share(Duration::from_secs(3)), 0.3);
        assert_eq!(ramp.share(Duration::from_secs(10)), 1.0);
        let floored = SlowStart::new(Duration::from_secs(100))
            .min_weight(0.25)
            .build()
            .unwrap();
        assert_eq!(floored.share(Duration::from_secs(5)), 0.25);
        assert_eq!(floored.share(Duration::from_secs(50)), 0.5);
        let gentle = SlowStart::new(Duration::from_secs(100))
            .aggression(0.5)
            .build()
            .unwrap();
        assert!((gentle.share(Duration::from_secs(50)) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn values_out_of_range_are_refused_by_name() {
        let window = Duration::from_secs(10);
        let error = SlowStart::new(Duration::ZERO).build().unwrap_err();
        assert_eq!(error.field(), "slow_start_window");
        for aggression in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let error = SlowStart::new(window)
                .aggression(aggression)
                .build()
                .unwrap_err();
            assert_eq!(error.field(), "aggression");
        }
        for min in [0.0, 1.5, f64::NAN] {
            let error = SlowStart::new(window).min_weight(min).build().unwrap_err();
            assert_eq!(error.field(), "min_weight");
        }
        assert!(SlowStart::new(window).min_weight(1.0).build().is_ok());
    }
}
