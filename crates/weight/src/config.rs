//! Configuration of weight degradation: SOFARPC's fault-tolerance parameters.

use std::time::Duration;

use tower_outlier_core::{ConfigError, FailureKind, Outcome};

/// A validated weight-degradation configuration (SOFARPC "fault tolerance").
///
/// Weights are absolute, as in SOFARPC: every endpoint starts at [`original_weight`]
/// (SOFARPC's default provider weight, 100) and the balancer sees `current / original`.
///
/// [`original_weight`]: WeightConfig::original_weight
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_weight::WeightConfig;
///
/// // The example from SOFARPC's fault-tolerance documentation.
/// let config = WeightConfig::builder()
///     .regulation_effective(true)
///     .degrade_effective(true)
///     .interval(Duration::from_secs(20))
///     .least_window_count(30)
///     .exception_rate_multiple(6.0)
///     .degrade_rate(0.5)
///     .recover_rate(1.2)
///     .least_weight(1.0)
///     .max_degraded(2)
///     .build()?;
/// assert_eq!(config.interval(), Duration::from_secs(20));
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct WeightConfig {
    pub(crate) regulation_effective: bool,
    pub(crate) degrade_effective: bool,
    pub(crate) interval: Duration,
    pub(crate) least_window_count: u64,
    pub(crate) exception_rate_multiple: f64,
    pub(crate) degrade_rate: f64,
    pub(crate) recover_rate: f64,
    pub(crate) least_weight: f64,
    pub(crate) max_degraded: usize,
    pub(crate) original_weight: f64,
    pub(crate) exceptions: ExceptionKinds,
}

impl WeightConfig {
    /// A builder with SOFARPC's defaults: both switches off, window 10 s, least 10 calls,
    /// multiple 6, degrade rate 0.05 (1/20), recover rate 2, least weight 1, at most 2 degraded,
    /// original weight 100.
    pub fn builder() -> WeightBuilder {
        WeightBuilder::default()
    }

    /// SOFARPC's behaviour with both switches on: the defaults above, counting only timeouts and
    /// overload ("server busy") as exceptions.
    pub fn sofarpc() -> WeightBuilder {
        WeightBuilder::default()
            .regulation_effective(true)
            .degrade_effective(true)
            .exceptions(&[FailureKind::Timeout, FailureKind::Overload])
    }

    /// The global switch (`regulation.effective`): off, the policy does nothing at all.
    pub fn regulation_effective(&self) -> bool {
        self.regulation_effective
    }

    /// The degrade switch (`degrade.effective`): off, abnormal endpoints are only reported.
    pub fn degrade_effective(&self) -> bool {
        self.degrade_effective
    }

    /// The window, and so the evaluation period (`time.window`).
    pub fn window(&self) -> Duration {
        self.interval
    }

    /// Least calls in a window for an endpoint at full weight to be counted
    /// (`least.window.count`).
    pub fn min_calls(&self) -> u64 {
        self.least_window_count
    }

    /// The window: [`window`](Self::window).
    #[deprecated(since = "0.2.0", note = "renamed `window`, as in the other policies")]
    pub fn interval(&self) -> Duration {
        self.window()
    }

    /// The fewest calls: [`min_calls`](Self::min_calls).
    #[deprecated(
        since = "0.2.0",
        note = "renamed `min_calls`, as in the other policies"
    )]
    pub fn least_window_count(&self) -> u64 {
        self.min_calls()
    }

    /// An endpoint is abnormal when its exception rate is at least this multiple of the average
    /// (`least.window.exception.rate.multiple`).
    pub fn exception_rate_multiple(&self) -> f64 {
        self.exception_rate_multiple
    }

    /// Each abnormal window multiplies the weight by this (`weight.degrade.rate`).
    pub fn degrade_rate(&self) -> f64 {
        self.degrade_rate
    }

    /// Each healthy window multiplies a degraded weight by this (`weight.recover.rate`).
    pub fn recover_rate(&self) -> f64 {
        self.recover_rate
    }

    /// The weight never goes below this (`degrade.least.weight`).
    pub fn least_weight(&self) -> f64 {
        self.least_weight
    }

    /// At most this many endpoints are degraded at once (`degrade.max.ip.count`).
    pub fn max_degraded(&self) -> usize {
        self.max_degraded
    }

    /// Every endpoint's weight before degradation.
    pub fn original_weight(&self) -> f64 {
        self.original_weight
    }

    /// Which failures count as exceptions.
    pub fn exceptions(&self) -> ExceptionKinds {
        self.exceptions
    }
}

/// A set of [`FailureKind`]s that count as exceptions for weight degradation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExceptionKinds(u8);

impl ExceptionKinds {
    /// Every failure the classifier reports.
    pub const ALL: ExceptionKinds = ExceptionKinds(u8::MAX);

    /// Exactly these kinds.
    pub fn of(kinds: &[FailureKind]) -> Self {
        ExceptionKinds(kinds.iter().fold(0, |bits, kind| bits | bit(*kind)))
    }

    /// Whether `outcome` counts as an exception.
    #[inline]
    pub fn counts(&self, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Failure(kind) => self.0 & bit(kind) != 0,
            Outcome::Success | Outcome::Cancelled | Outcome::NotSent => false,
        }
    }
}

fn bit(kind: FailureKind) -> u8 {
    match kind {
        FailureKind::Transport => 1,
        FailureKind::Timeout => 2,
        FailureKind::ServerError => 4,
        FailureKind::Overload => 8,
        FailureKind::Business => 16,
        FailureKind::Gateway => 32,
        // Kinds added later count only under `ALL`.
        _ => 128,
    }
}

/// Builds a [`WeightConfig`]; [`build`](Self::build) validates every field.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightBuilder {
    regulation_effective: bool,
    degrade_effective: bool,
    interval: Duration,
    least_window_count: u64,
    exception_rate_multiple: f64,
    degrade_rate: f64,
    recover_rate: f64,
    least_weight: f64,
    max_degraded: usize,
    original_weight: f64,
    exceptions: ExceptionKinds,
}

impl Default for WeightBuilder {
    fn default() -> Self {
        WeightBuilder {
            regulation_effective: false,
            degrade_effective: false,
            interval: Duration::from_secs(10),
            least_window_count: 10,
            exception_rate_multiple: 6.0,
            degrade_rate: 0.05,
            recover_rate: 2.0,
            least_weight: 1.0,
            max_degraded: 2,
            original_weight: 100.0,
            exceptions: ExceptionKinds::ALL,
        }
    }
}

impl WeightBuilder {
    /// The global switch (`regulation.effective`, default off).
    pub fn regulation_effective(mut self, on: bool) -> Self {
        self.regulation_effective = on;
        self
    }

    /// The degrade switch (`degrade.effective`, default off: log only).
    pub fn degrade_effective(mut self, on: bool) -> Self {
        self.degrade_effective = on;
        self
    }

    /// The window and evaluation period (`time.window`, default 10 s, at least 1 ms).
    pub fn window(mut self, window: Duration) -> Self {
        self.interval = window;
        self
    }

    /// Least calls per window at full weight (`least.window.count`, default 10, at least 1).
    pub fn min_calls(mut self, count: u64) -> Self {
        self.least_window_count = count;
        self
    }

    /// Sets the window: [`window`](Self::window).
    #[deprecated(since = "0.2.0", note = "renamed `window`, as in the other policies")]
    pub fn interval(self, window: Duration) -> Self {
        self.window(window)
    }

    /// Sets the fewest calls: [`min_calls`](Self::min_calls).
    #[deprecated(
        since = "0.2.0",
        note = "renamed `min_calls`, as in the other policies"
    )]
    pub fn least_window_count(self, count: u64) -> Self {
        self.min_calls(count)
    }

    /// The exception-rate multiple (`least.window.exception.rate.multiple`, default 6, > 0).
    pub fn exception_rate_multiple(mut self, multiple: f64) -> Self {
        self.exception_rate_multiple = multiple;
        self
    }

    /// The degrade rate (`weight.degrade.rate`, default 0.05, in (0, 1]).
    pub fn degrade_rate(mut self, rate: f64) -> Self {
        self.degrade_rate = rate;
        self
    }

    /// The recover rate (`weight.recover.rate`, default 2, > 1).
    pub fn recover_rate(mut self, rate: f64) -> Self {
        self.recover_rate = rate;
        self
    }

    /// The least weight (`degrade.least.weight`, default 1, in (0, original weight]).
    pub fn least_weight(mut self, weight: f64) -> Self {
        self.least_weight = weight;
        self
    }

    /// The most endpoints degraded at once (`degrade.max.ip.count`, default 2).
    pub fn max_degraded(mut self, count: usize) -> Self {
        self.max_degraded = count;
        self
    }

    /// Every endpoint's original weight (default 100, SOFARPC's default provider weight; > 0).
    pub fn original_weight(mut self, weight: f64) -> Self {
        self.original_weight = weight;
        self
    }

    /// Counts only these failure kinds as exceptions (default: every failure the layer's
    /// classifier reports). SOFARPC counts timeouts and overload ("server busy").
    pub fn exceptions(mut self, kinds: &[FailureKind]) -> Self {
        self.exceptions = ExceptionKinds::of(kinds);
        self
    }

    /// Validates and builds the configuration.
    pub fn build(self) -> Result<WeightConfig, ConfigError> {
        if self.interval < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "interval",
                format_args!("{:?}", self.interval),
                "at least 1ms",
            ));
        }
        if self.least_window_count == 0 {
            return Err(ConfigError::new("least_window_count", 0, "at least 1"));
        }
        positive("exception_rate_multiple", self.exception_rate_multiple)?;
        positive("original_weight", self.original_weight)?;
        if !(self.degrade_rate > 0.0 && self.degrade_rate <= 1.0) {
            return Err(ConfigError::new(
                "degrade_rate",
                self.degrade_rate,
                "a number in (0, 1]",
            ));
        }
        if !(self.recover_rate > 1.0 && self.recover_rate.is_finite()) {
            return Err(ConfigError::new(
                "recover_rate",
                self.recover_rate,
                "a finite number greater than 1",
            ));
        }
        if !(self.least_weight > 0.0 && self.least_weight <= self.original_weight) {
            return Err(ConfigError::new(
                "least_weight",
                self.least_weight,
                format!(
                    "a number in (0, {}] (the original weight)",
                    self.original_weight
                ),
            ));
        }
        Ok(WeightConfig {
            regulation_effective: self.regulation_effective,
            degrade_effective: self.degrade_effective,
            interval: self.interval,
            least_window_count: self.least_window_count,
            exception_rate_multiple: self.exception_rate_multiple,
            degrade_rate: self.degrade_rate,
            recover_rate: self.recover_rate,
            least_weight: self.least_weight,
            max_degraded: self.max_degraded,
            original_weight: self.original_weight,
            exceptions: self.exceptions,
        })
    }
}

fn positive(field: &str, value: f64) -> Result<f64, ConfigError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(ConfigError::new(
            field,
            value,
            "a finite number greater than 0",
        ))
    }
}
