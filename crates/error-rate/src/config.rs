//! Configuration of error-rate ejection: the builder, its presets and its validation.

use std::time::Duration;

use tower_outlier_core::{
    check_ratio, BudgetFloor, ConfigError, EjectionBudget, RecoverySchedule, WindowShape,
};

/// A validated error-rate ejection configuration. Build one with [`ErrorRateConfig::builder`] or
/// start from a preset ([`ErrorRateConfig::hsf`], [`ErrorRateConfig::edas_spring_cloud`],
/// [`ErrorRateConfig::edas_dubbo_2_7`]).
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_error_rate::ErrorRateConfig;
///
/// let config = ErrorRateConfig::edas_spring_cloud()
///     .error_rate_threshold(0.3)
///     .max_ejection_ratio(0.6)
///     .build()
///     .unwrap();
/// assert_eq!(config.window(), Duration::from_secs(10));
/// assert_eq!(config.budget().max_ejected(6), 3);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorRateConfig {
    pub(crate) enabled: bool,
    pub(crate) window: WindowShape,
    pub(crate) min_calls: u64,
    pub(crate) threshold: f64,
    pub(crate) budget: EjectionBudget,
    pub(crate) recovery: RecoverySchedule,
    pub(crate) ip_dimension: bool,
}

impl ErrorRateConfig {
    /// A builder with HSF's defaults (the same as [`ErrorRateConfig::hsf`]) but enabled.
    pub fn builder() -> ErrorRateBuilder {
        ErrorRateBuilder::default()
    }

    /// HSF's documented defaults: window 10 s, at least 10 calls, error rate above 0.5, at most
    /// 20 % ejected and at least one when that rounds to zero, recovery unit 60 s capped at 60
    /// units. HSF ships with `qosEnabled = false`; this preset is enabled, because a user who adds
    /// the layer wants it on.
    pub fn hsf() -> ErrorRateBuilder {
        ErrorRateBuilder::default()
    }

    /// EDAS's documented defaults for Spring Cloud and Dubbo other than 2.7: window 10 s, error
    /// rate above 50 %, at most 20 % ejected and none when that rounds to zero, recovery unit 30 s
    /// capped at 20 units (checks every 10 min once capped). The minimum is "QPS lower bound ×
    /// window"; with a lower bound of 1 QPS that is 10 calls.
    pub fn edas_spring_cloud() -> ErrorRateBuilder {
        ErrorRateBuilder {
            recovery_unit: Duration::from_secs(30),
            max_recovery_multiple: 20,
            budget_floor: BudgetFloor::Zero,
            ..ErrorRateBuilder::default()
        }
    }

    /// EDAS defaults for Dubbo 2.7: as [`edas_spring_cloud`](Self::edas_spring_cloud) with a 15 s
    /// window, so 15 calls at 1 QPS.
    pub fn edas_dubbo_2_7() -> ErrorRateBuilder {
        ErrorRateBuilder {
            window: Duration::from_secs(15),
            min_calls: 15,
            ..Self::edas_spring_cloud()
        }
    }

    /// Whether the policy ejects at all (`qosEnabled`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The statistics window.
    pub fn window(&self) -> Duration {
        self.window.span()
    }

    /// The window's shape (span and buckets).
    pub fn window_shape(&self) -> WindowShape {
        self.window
    }

    /// The minimum number of calls in the window before an endpoint is judged.
    pub fn min_calls(&self) -> u64 {
        self.min_calls
    }

    /// The error rate an endpoint must strictly exceed to be ejected.
    pub fn error_rate_threshold(&self) -> f64 {
        self.threshold
    }

    /// HSF's `ipDimension`: whether endpoints are judged by host
    /// ([`ErrorRateBuilder::ip_dimension`]).
    pub fn ip_dimension(&self) -> bool {
        self.ip_dimension
    }

    /// The ejection budget.
    pub fn budget(&self) -> EjectionBudget {
        self.budget
    }

    /// The recovery schedule.
    pub fn recovery(&self) -> RecoverySchedule {
        self.recovery
    }
}

/// Builds an [`ErrorRateConfig`]; [`build`](Self::build) validates every field.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorRateBuilder {
    pub(crate) enabled: bool,
    pub(crate) window: Duration,
    pub(crate) buckets: usize,
    pub(crate) min_calls: u64,
    pub(crate) threshold: f64,
    pub(crate) max_ejection_ratio: f64,
    pub(crate) budget_floor: BudgetFloor,
    pub(crate) recovery_unit: Duration,
    pub(crate) max_recovery_multiple: u32,
    pub(crate) ip_dimension: bool,
}

impl Default for ErrorRateBuilder {
    fn default() -> Self {
        ErrorRateBuilder {
            enabled: true,
            window: Duration::from_secs(10),
            buckets: 10,
            min_calls: 10,
            threshold: 0.5,
            max_ejection_ratio: 0.2,
            budget_floor: BudgetFloor::One,
            recovery_unit: Duration::from_secs(60),
            max_recovery_multiple: 60,
            ip_dimension: false,
        }
    }
}

impl ErrorRateBuilder {
    /// Turns the policy on or off (`qosEnabled`). A disabled policy records nothing and ejects
    /// nothing.
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// The statistics window (`timeWindowInSeconds`). At least 1 ms; the window is kept in
    /// nanoseconds, so one longer than 2⁶⁴ − 1 ns (about 584 years) covers only that long.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How many buckets the window slides by (1 to 1024; default 10).
    pub fn buckets(mut self, buckets: usize) -> Self {
        self.buckets = buckets;
        self
    }

    /// Minimum calls in the window before an endpoint is judged (`requestThreshold`). At least 1.
    pub fn min_calls(mut self, min_calls: u64) -> Self {
        self.min_calls = min_calls;
        self
    }

    /// EDAS's "QPS lower bound": sets the minimum calls to `ceil(qps × window)` for the window
    /// configured so far (set the window first).
    pub fn qps_lower_bound(mut self, qps: f64) -> Self {
        let calls = qps * self.window.as_secs_f64();
        self.min_calls = if calls.is_finite() && calls >= 1.0 {
            calls.ceil() as u64
        } else if calls.is_finite() && calls >= 0.0 {
            1
        } else {
            0 // rejected by `build`
        };
        self
    }

    /// The error rate (in `[0, 1]`) an endpoint must strictly exceed (`errorRateThreshold`).
    pub fn error_rate_threshold(mut self, threshold: f64) -> Self {
        self.threshold = threshold;
        self
    }

    /// At most this ratio (in `[0, 1]`) of the endpoints is ejected at once (`maxIsolationRate`).
    pub fn max_ejection_ratio(mut self, ratio: f64) -> Self {
        self.max_ejection_ratio = ratio;
        self
    }

    /// What happens when `floor(n × ratio)` is below one: EDAS ejects none, HSF one.
    pub fn budget_floor(mut self, floor: BudgetFloor) -> Self {
        self.budget_floor = floor;
        self
    }

    /// The recovery detection unit (`isolationTime`). Non-zero.
    pub fn recovery_unit(mut self, unit: Duration) -> Self {
        self.recovery_unit = unit;
        self
    }

    /// HSF's `ipDimension`: judge each endpoint on every call to its host, across the services
    /// whose layers share hosts (`tower_outlier::OutlierDetectionLayer::share_hosts`), instead of
    /// on its own calls. Without shared hosts it changes nothing. Default: off.
    pub fn ip_dimension(mut self, by_host: bool) -> Self {
        self.ip_dimension = by_host;
        self
    }

    /// The cap of the linear schedule, in units (`maxIsolationTimeMultiple`). At least 1.
    pub fn max_recovery_multiple(mut self, multiple: u32) -> Self {
        self.max_recovery_multiple = multiple;
        self
    }

    /// Validates and builds the configuration.
    pub fn build(self) -> Result<ErrorRateConfig, ConfigError> {
        let window = WindowShape::new(self.window, self.buckets)?;
        if self.min_calls == 0 {
            return Err(ConfigError::new("min_calls", 0, "at least 1"));
        }
        Ok(ErrorRateConfig {
            enabled: self.enabled,
            window,
            min_calls: self.min_calls,
            threshold: check_ratio("error_rate_threshold", self.threshold)?,
            budget: EjectionBudget::new(self.max_ejection_ratio, self.budget_floor)?,
            recovery: RecoverySchedule::new(self.recovery_unit, self.max_recovery_multiple)?,
            ip_dimension: self.ip_dimension,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_outlier_core::BudgetFloor;

    #[test]
    fn presets_carry_the_documented_defaults() {
        let hsf = ErrorRateConfig::hsf().build().unwrap();
        assert_eq!(hsf.window(), Duration::from_secs(10));
        assert_eq!(hsf.min_calls(), 10);
        assert_eq!(hsf.error_rate_threshold(), 0.5);
        assert_eq!(hsf.budget().max_ratio(), 0.2);
        assert_eq!(hsf.budget().floor(), BudgetFloor::One);
        assert_eq!(hsf.recovery().unit(), Duration::from_secs(60));
        assert_eq!(hsf.recovery().max_multiple(), 60);

        let spring = ErrorRateConfig::edas_spring_cloud().build().unwrap();
        assert_eq!(spring.window(), Duration::from_secs(10));
        assert_eq!(spring.budget().floor(), BudgetFloor::Zero);
        assert_eq!(spring.recovery().unit(), Duration::from_secs(30));
        assert_eq!(spring.recovery().max_multiple(), 20);

        let dubbo = ErrorRateConfig::edas_dubbo_2_7().build().unwrap();
        assert_eq!(dubbo.window(), Duration::from_secs(15));
        assert_eq!(dubbo.min_calls(), 15);
        assert_eq!(dubbo.recovery().unit(), Duration::from_secs(30));
    }

    #[test]
    fn qps_lower_bound_scales_with_the_window() {
        let config = ErrorRateConfig::edas_dubbo_2_7()
            .qps_lower_bound(2.0)
            .build()
            .unwrap();
        assert_eq!(config.min_calls(), 30);
        assert!(ErrorRateConfig::hsf()
            .qps_lower_bound(f64::NAN)
            .build()
            .is_err());
    }

    #[test]
    fn every_invalid_field_is_named() {
        let cases: Vec<(ErrorRateBuilder, &str)> = vec![
            (ErrorRateConfig::hsf().window(Duration::ZERO), "window"),
            (ErrorRateConfig::hsf().buckets(0), "buckets"),
            (ErrorRateConfig::hsf().min_calls(0), "min_calls"),
            (
                ErrorRateConfig::hsf().error_rate_threshold(1.5),
                "error_rate_threshold",
            ),
            (
                ErrorRateConfig::hsf().error_rate_threshold(-0.1),
                "error_rate_threshold",
            ),
            (
                ErrorRateConfig::hsf().max_ejection_ratio(2.0),
                "max_ejection_ratio",
            ),
            (
                ErrorRateConfig::hsf().recovery_unit(Duration::ZERO),
                "recovery_unit",
            ),
            (
                ErrorRateConfig::hsf().max_recovery_multiple(0),
                "max_recovery_multiple",
            ),
        ];
        for (builder, field) in cases {
            let error = builder.build().unwrap_err();
            assert_eq!(error.field(), field);
            assert!(error.to_string().contains(field), "{error}");
            assert!(error.to_string().contains("allowed"), "{error}");
        }
    }
}
