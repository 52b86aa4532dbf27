//! The weights' configuration: gRPC's `weighted_round_robin` load-balancing config (gRFC A58),
//! checked.

use std::time::Duration;

use tower_outlier_core::ConfigError;

/// How load reports become weights, with gRPC's defaults (gRFC A58).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OrcaConfig {
    pub(crate) blackout_period: Duration,
    pub(crate) weight_expiration_period: Duration,
    pub(crate) weight_update_period: Duration,
    pub(crate) error_utilization_penalty: f64,
}

/// Builds an [`OrcaConfig`]; [`build`](OrcaConfigBuilder::build) checks the values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OrcaConfigBuilder {
    config: OrcaConfig,
}

impl OrcaConfig {
    /// gRPC's defaults: a 10 s blackout, weights expiring after 3 minutes without a report,
    /// recomputed every second, an error utilization penalty of 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier_orca::OrcaConfig;
    ///
    /// let config = OrcaConfig::a58().blackout_period(Duration::from_secs(2)).build()?;
    /// assert_eq!(config.weight_update_period(), Duration::from_secs(1));
    /// # Ok::<(), tower_outlier_core::ConfigError>(())
    /// ```
    pub fn a58() -> OrcaConfigBuilder {
        OrcaConfigBuilder {
            config: OrcaConfig {
                blackout_period: Duration::from_secs(10),
                weight_expiration_period: Duration::from_secs(180),
                weight_update_period: Duration::from_secs(1),
                error_utilization_penalty: 1.0,
            },
        }
    }

    /// How long an endpoint reports before its weight is used.
    pub fn blackout_period(&self) -> Duration {
        self.blackout_period
    }

    /// How long a weight lasts without a new report.
    pub fn weight_expiration_period(&self) -> Duration {
        self.weight_expiration_period
    }

    /// How often the weights are recomputed.
    pub fn weight_update_period(&self) -> Duration {
        self.weight_update_period
    }

    /// How much each error per query adds to the utilization.
    pub fn error_utilization_penalty(&self) -> f64 {
        self.error_utilization_penalty
    }
}

impl OrcaConfigBuilder {
    /// Sets how long an endpoint must report before its weight is used (gRPC's
    /// `blackout_period`, 10 s; zero: at once): a server's first reports, taken while it warms
    /// up, say little of its load.
    pub fn blackout_period(mut self, period: Duration) -> Self {
        self.config.blackout_period = period;
        self
    }

    /// Sets how long a weight lasts without a new report (gRPC's `weight_expiration_period`,
    /// 3 minutes); an endpoint that reports again after that sits a new blackout.
    pub fn weight_expiration_period(mut self, period: Duration) -> Self {
        self.config.weight_expiration_period = period;
        self
    }

    /// Sets how often the weights are recomputed (gRPC's `weight_update_period`, 1 s; at least
    /// 100 ms, as gRPC raises anything shorter).
    pub fn weight_update_period(mut self, period: Duration) -> Self {
        self.config.weight_update_period = period;
        self
    }

    /// Sets how much each error per query adds to the utilization (gRPC's
    /// `error_utilization_penalty`, 1.0): a non-negative number.
    pub fn error_utilization_penalty(mut self, penalty: f64) -> Self {
        self.config.error_utilization_penalty = penalty;
        self
    }

    /// The configuration, or the first value out of range. An update period under 100 ms is
    /// raised to 100 ms, as gRPC does.
    pub fn build(self) -> Result<OrcaConfig, ConfigError> {
        let mut config = self.config;
        tower_outlier_core::check_nonzero_duration(
            "weight_expiration_period",
            config.weight_expiration_period,
        )?;
        let penalty = config.error_utilization_penalty;
        if !(penalty.is_finite() && penalty >= 0.0) {
            return Err(ConfigError::new(
                "error_utilization_penalty",
                penalty,
                "a finite number, 0 or more",
            ));
        }
        config.weight_update_period = config.weight_update_period.max(Duration::from_millis(100));
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_refused_and_a_short_period_raised() {
        let error = OrcaConfig::a58()
            .error_utilization_penalty(-1.0)
            .build()
            .unwrap_err();
        assert_eq!(error.field(), "error_utilization_penalty");
        let error = OrcaConfig::a58()
            .error_utilization_penalty(f64::NAN)
            .build()
            .unwrap_err();
        assert_eq!(error.field(), "error_utilization_penalty");
        let error = OrcaConfig::a58()
            .weight_expiration_period(Duration::ZERO)
            .build()
            .unwrap_err();
        assert_eq!(error.field(), "weight_expiration_period");
        let config = OrcaConfig::a58()
            .weight_update_period(Duration::from_millis(5))
            .blackout_period(Duration::ZERO)
            .build()
            .unwrap();
        assert_eq!(config.weight_update_period(), Duration::from_millis(100));
        assert_eq!(config.blackout_period(), Duration::ZERO);
    }
}
