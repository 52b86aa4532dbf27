//! The latency detector's configuration: D2's relative rule, checked.

use std::time::Duration;

use tower_outlier_core::{ConfigError, RecoverySchedule};

/// What is judged of each endpoint's latencies in an interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LatencyStatistic {
    /// The quantile `q` in `(0, 1]` (0.9: the p90): calls rarer than `1 − q` do not move it.
    Quantile(f64),
    /// The mean (D2's): one call of a second among a thousand of a millisecond doubles it.
    Mean,
}

/// What each endpoint's statistic is set against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FleetBar {
    /// The median of the endpoints' statistics: one outlier among three or more cannot move it.
    Median,
    /// The mean of the endpoints' statistics, each weighted by its calls (D2's): a slow
    /// endpoint's calls raise it toward it.
    CallWeightedMean,
}

/// When an endpoint's latency makes it an outlier against its peers, and when it is not any more.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyConfig {
    pub(crate) interval: Duration,
    pub(crate) statistic: LatencyStatistic,
    pub(crate) bar: FleetBar,
    pub(crate) intervals: u32,
    pub(crate) eject_above: f64,
    pub(crate) readmit_below: f64,
    pub(crate) min_calls: u64,
    pub(crate) min_endpoints: usize,
    pub(crate) recovery: RecoverySchedule,
    pub(crate) down_weight: bool,
}

/// Builds a [`LatencyConfig`]; [`build`](LatencyConfigBuilder::build) checks the values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyConfigBuilder {
    interval: Duration,
    statistic: LatencyStatistic,
    bar: FleetBar,
    intervals: u32,
    eject_above: f64,
    readmit_below: f64,
    min_calls: u64,
    min_endpoints: usize,
    recovery_unit: Duration,
    max_recovery_multiple: u32,
    down_weight: bool,
}

impl LatencyConfig {
    /// This crate's recommendation, from the detection benchmark: every 5 s, an endpoint whose
    /// p90 latency is at least 1.3 times the median of the endpoints' p90s two intervals in a row
    /// is an outlier; one ejected for it is healthy again at 1.1 times or less (D2's factors on a
    /// robust statistic). Judged on 10 calls at least in the interval, among 3 endpoints at
    /// least; back on trial after 10 s, 20 s, … up to 5 minutes while it stays slow. In the
    /// benchmark a 3× replica is out 15 s in, one 1 s call, a 5 % tail or a fleet slowing
    /// together ejects nobody; shorter intervals or one interval ejected the 3× replica sooner
    /// (5 s) but also healthy endpoints in the tail.
    ///
    /// ```
    /// use tower_outlier_latency::{FleetBar, LatencyConfig, LatencyStatistic};
    ///
    /// let config = LatencyConfig::recommended().build()?;
    /// assert_eq!(config.statistic(), LatencyStatistic::Quantile(0.9));
    /// assert_eq!(config.fleet_bar(), FleetBar::Median);
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub fn recommended() -> LatencyConfigBuilder {
        LatencyConfigBuilder {
            statistic: LatencyStatistic::Quantile(0.9),
            bar: FleetBar::Median,
            intervals: 2,
            ..LatencyConfig::d2()
        }
    }

    /// LinkedIn D2's relative strategy as D2 states it: every 5 s, an endpoint whose mean
    /// latency is at least 1.3 times the fleet's call-weighted mean latency is an outlier; one
    /// ejected for it is healthy again at 1.1 times or less. Judged on 10 calls at least in the
    /// interval, among 3 endpoints at least; back on trial after 10 s, 20 s, … up to 5 minutes
    /// while it stays slow. D2 lowers a health score (0.2 an interval down, 0.05 up) and
    /// quarantines at its floor; this ejects at once ([`down_weight`](LatencyConfigBuilder::down_weight)
    /// lowers the weight instead). The mean is D2's weakness: in the detection benchmark one 1 s
    /// call among 1 ms ones ejected a healthy endpoint; [`recommended`](Self::recommended)
    /// judges a p90 against a median.
    ///
    /// ```
    /// use tower_outlier_latency::{LatencyConfig, LatencyStatistic};
    ///
    /// let config = LatencyConfig::d2().build()?;
    /// assert_eq!(config.eject_above(), 1.3);
    /// assert_eq!(config.statistic(), LatencyStatistic::Mean);
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub fn d2() -> LatencyConfigBuilder {
        LatencyConfigBuilder {
            interval: Duration::from_secs(5),
            statistic: LatencyStatistic::Mean,
            bar: FleetBar::CallWeightedMean,
            intervals: 1,
            eject_above: 1.3,
            readmit_below: 1.1,
            min_calls: 10,
            min_endpoints: 3,
            recovery_unit: Duration::from_secs(10),
            max_recovery_multiple: 30,
            down_weight: false,
        }
    }

    /// How often endpoints are judged.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// What is judged of each endpoint's latencies.
    pub fn statistic(&self) -> LatencyStatistic {
        self.statistic
    }

    /// What each endpoint's statistic is set against.
    pub fn fleet_bar(&self) -> FleetBar {
        self.bar
    }

    /// Intervals in a row an endpoint must stand out before it is an outlier.
    pub fn intervals(&self) -> u32 {
        self.intervals
    }

    /// The ratio to the fleet's median at or above which an endpoint is an outlier.
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

    /// Whether outliers are down-weighted rather than ejected.
    pub fn down_weight(&self) -> bool {
        self.down_weight
    }
}

impl LatencyConfigBuilder {
    /// Sets how often endpoints are judged (D2's update interval, 5 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets the quantile of each endpoint's latencies that is judged (0.9): in `(0, 1]`. Calls
    /// rarer than `1 − quantile` of an endpoint's do not move it.
    pub fn quantile(mut self, quantile: f64) -> Self {
        self.statistic = LatencyStatistic::Quantile(quantile);
        self
    }

    /// Sets what is judged of each endpoint's latencies.
    pub fn statistic(mut self, statistic: LatencyStatistic) -> Self {
        self.statistic = statistic;
        self
    }

    /// Sets what each endpoint's statistic is set against.
    pub fn fleet_bar(mut self, bar: FleetBar) -> Self {
        self.bar = bar;
        self
    }

    /// Sets how many intervals in a row an endpoint must stand out before it is an outlier (2;
    /// at least 1): an endpoint that p2c sent few calls in an interval, one of them slow, stands
    /// out once by chance, a slow one again and again. An endpoint back on trial is judged on
    /// one.
    pub fn intervals(mut self, intervals: u32) -> Self {
        self.intervals = intervals;
        self
    }

    /// Sets the ratio to the median of the endpoints' statistics at or above which an endpoint
    /// is an outlier (D2's `relativeLatencyHighThresholdFactor`, 1.3).
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

    /// Lowers an outlier's weight instead of ejecting it (off): while it stands out, its
    /// relative weight is the fleet's median over its statistic (a replica three times slower
    /// weighs a third), which divides its load as a weight policy's does, so p2c sends it that
    /// much less on top of what its latency already costs it; back to 1 once it is at or below
    /// the readmission bar. Nothing is ejected and the budget is not spent. Do not combine with
    /// another policy that sets weights (SOFARPC's): the last one to set it wins.
    pub fn down_weight(mut self, down_weight: bool) -> Self {
        self.down_weight = down_weight;
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
        if let LatencyStatistic::Quantile(q) = self.statistic {
            if !(q > 0.0 && q <= 1.0) {
                return Err(ConfigError::new("quantile", q, "a number in (0, 1]"));
            }
        }
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
        if self.intervals == 0 {
            return Err(ConfigError::new("intervals", 0, "at least 1"));
        }
        Ok(LatencyConfig {
            interval: self.interval,
            statistic: self.statistic,
            bar: self.bar,
            intervals: self.intervals,
            eject_above: self.eject_above,
            readmit_below: self.readmit_below,
            min_calls: self.min_calls.max(1),
            min_endpoints: self.min_endpoints,
            recovery,
            down_weight: self.down_weight,
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
