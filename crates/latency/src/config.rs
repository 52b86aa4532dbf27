//! The latency detector's configuration: D2's relative rule, checked.

use std::time::Duration;

use tower_outlier_core::{ConfigError, RecoverySchedule};

/// When an endpoint's latency makes it an outlier against its peers, and when it is not any more.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyConfig {
    pub(crate) interval: Duration,
    pub(crate) eject_above: f64,
    pub(crate) readmit_below: f64,
    pub(crate) min_calls: u64,
    pub(crate) min_endpoints: usize,
    pub(crate) recovery: RecoverySchedule,
}

/// Builds a [`LatencyConfig`]; [`build`](LatencyConfigBuilder::build) checks the values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyConfigBuilder {
    interval: Duration,
    eject_above: f64,
    readmit_below: f64,
    min_calls: u64,
    min_endpoints: usize,
    recovery_unit: Duration,
    max_recovery_multiple: u32,
}

impl LatencyConfig {
    /// LinkedIn D2's relative strategy: every 5 s, an endpoint whose mean latency is at least
    /// 1.3 times the fleet's call-weighted mean is an outlier; one ejected for it is healthy
    /// again at 1.1 times or less. Judged on 10 calls at least in the interval, among 3
    /// endpoints at least; back on trial after 10 s, 20 s, … up to 5 minutes while it stays slow.
    ///
    /// ```
    /// use tower_outlier_latency::LatencyConfig;
    ///
    /// let config = LatencyConfig::d2().build()?;
    /// assert_eq!(config.eject_above(), 1.3);
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub fn d2() -> LatencyConfigBuilder {
        LatencyConfigBuilder {
            interval: Duration::from_secs(5),
            eject_above: 1.3,
            readmit_below: 1.1,
            min_calls: 10,
            min_endpoints: 3,
            recovery_unit: Duration::from_secs(10),
            max_recovery_multiple: 30,
        }
    }

    /// How often endpoints are judged.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The ratio to the fleet's mean at or above which an endpoint is an outlier.
    pub fn eject_above(&self) -> f64 {
        self.eject_above
    }

    /// The ratio at or below which an endpoint back on trial is healthy again.
    pub fn readmit_below(&self) -> f64 {
        self.readmit_below
    }

    /// The fewest calls (completed or in flight) in an interval for an endpoint to be judged.
    pub fn min_calls(&self) -> u64 {
        self.min_calls
    }

    /// The fewest endpoints judged in an interval for any to be an outlier.
    pub fn min_endpoints(&self) -> usize {
        self.min_endpoints
    }

    /// When an ejected endpoint is checked again.
    pub fn recovery(&self) -> RecoverySchedule {
        self.recovery
    }
}

impl LatencyConfigBuilder {
    /// Sets how often endpoints are judged (D2's update interval, 5 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets the ratio to the fleet's call-weighted mean latency at or above which an endpoint is
    /// an outlier (D2's `relativeLatencyHighThresholdFactor`, 1.3).
    pub fn eject_above(mut self, ratio: f64) -> Self {
        self.eject_above = ratio;
        self
    }

    /// Sets the ratio at or below which an endpoint on trial is healthy again (D2's
    /// `relativeLatencyLowThresholdFactor`, 1.1); between the two it stays on trial.
    pub fn readmit_below(mut self, ratio: f64) -> Self {
        self.readmit_below = ratio;
        self
    }

    /// Sets the fewest calls in an interval, completed or in flight, for an endpoint to be
    /// judged (10).
    pub fn min_calls(mut self, calls: u64) -> Self {
        self.min_calls = calls;
        self
    }

    /// Sets the fewest endpoints judged in an interval for any to be an outlier (3): against one
    /// peer, "slower than the fleet" says little.
    pub fn min_endpoints(mut self, endpoints: usize) -> Self {
        self.min_endpoints = endpoints;
        self
    }

    /// Sets when an ejected endpoint comes back on trial: `unit`, then one unit more after each
    /// trial it fails, up to `max_multiple` units (10 s and 30).
    pub fn recovery(mut self, unit: Duration, max_multiple: u32) -> Self {
        self.recovery_unit = unit;
        self.max_recovery_multiple = max_multiple;
        self
    }

    /// The configuration, or the first value out of range: a zero interval, a factor that is not
    /// a finite number above 1, a readmission factor above the ejection factor, fewer than two
    /// endpoints, a zero recovery unit or multiple.
    pub fn build(self) -> Result<LatencyConfig, ConfigError> {
        tower_outlier_core::check_nonzero_duration("interval", self.interval)?;
        if !(self.eject_above.is_finite() && self.eject_above > 1.0) {
            return Err(ConfigError::new(
                "eject_above",
                self.eject_above,
                "a finite number above 1",
            ));
        }
        if !(self.readmit_below.is_finite()
            && self.readmit_below >= 1.0
            && self.readmit_below <= self.eject_above)
        {
            return Err(ConfigError::new(
                "readmit_below",
                self.readmit_below,
                format!("a number from 1 to eject_above ({})", self.eject_above),
            ));
        }
        if self.min_endpoints < 2 {
            return Err(ConfigError::new(
                "min_endpoints",
                self.min_endpoints,
                "at least 2",
            ));
        }
        let recovery = RecoverySchedule::new(self.recovery_unit, self.max_recovery_multiple)?;
        Ok(LatencyConfig {
            interval: self.interval,
            eject_above: self.eject_above,
            readmit_below: self.readmit_below,
            min_calls: self.min_calls.max(1),
            min_endpoints: self.min_endpoints,
            recovery,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        let field = |builder: LatencyConfigBuilder| builder.build().unwrap_err().field().to_owned();
        assert_eq!(
            field(LatencyConfig::d2().interval(Duration::ZERO)),
            "interval"
        );
        assert_eq!(field(LatencyConfig::d2().eject_above(1.0)), "eject_above");
        assert_eq!(
            field(LatencyConfig::d2().eject_above(f64::NAN)),
            "eject_above"
        );
        assert_eq!(
            field(LatencyConfig::d2().readmit_below(1.5)),
            "readmit_below"
        );
        assert_eq!(
            field(LatencyConfig::d2().readmit_below(0.9)),
            "readmit_below"
        );
        assert_eq!(field(LatencyConfig::d2().min_endpoints(1)), "min_endpoints");
        assert_eq!(
            field(LatencyConfig::d2().recovery(Duration::ZERO, 3)),
            "recovery_unit"
        );
        assert!(LatencyConfig::d2().readmit_below(1.3).build().is_ok());
    }
}
