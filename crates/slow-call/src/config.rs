//! Breaker configuration: the strategy, its thresholds, and Sentinel's defaults.

use std::fmt;
use std::time::Duration;

use tower_outlier_core::{check_ratio, ConfigError, WindowShape};

/// What trips the breaker (Sentinel's `grade`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// Grade 0: the ratio of calls slower than `max_rt` (strictly) exceeds `ratio`, or every call
    /// was slow when `ratio` is 1.0.
    SlowRatio {
        /// A call is slow when its latency is strictly greater than this.
        max_rt: Duration,
        /// The slow-call ratio, in `[0, 1]`, that must be exceeded.
        ratio: f64,
    },
    /// Grade 1: the ratio of failed calls strictly exceeds `ratio`.
    ErrorRatio {
        /// The error ratio, in `[0, 1]`, that must be exceeded.
        ratio: f64,
    },
    /// Grade 2: the number of failed calls in the interval strictly exceeds `count`.
    ErrorCount {
        /// The error count that must be exceeded.
        count: u64,
    },
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::SlowRatio { max_rt, ratio } => {
                write!(f, "slow-call ratio > {ratio} (slow: > {max_rt:?})")
            }
            Strategy::ErrorRatio { ratio } => write!(f, "error ratio > {ratio}"),
            Strategy::ErrorCount { count } => write!(f, "error count > {count}"),
        }
    }
}

/// A validated breaker configuration.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_slow_call::BreakerConfig;
///
/// // A slow-call ratio breaker: 1 s interval, at least 5 calls, every call slower than 500 ms,
/// // open for 10 s.
/// let config = BreakerConfig::slow_ratio(Duration::from_millis(500))
///     .ratio(1.0)
///     .min_requests(5)
///     .window(Duration::from_secs(1))
///     .open_duration(Duration::from_secs(10))
///     .build()?;
/// assert_eq!(config.min_requests(), 5);
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BreakerConfig {
    pub(crate) strategy: Strategy,
    pub(crate) min_requests: u64,
    pub(crate) interval: WindowShape,
    pub(crate) open_duration: Duration,
}

impl BreakerConfig {
    /// A slow-call-ratio breaker (grade 0) where calls slower than `max_rt` are slow; Sentinel's
    /// defaults otherwise (ratio 1.0, 5 requests, 1 s interval); the open duration must be set.
    pub fn slow_ratio(max_rt: Duration) -> BreakerBuilder {
        BreakerBuilder::new(Strategy::SlowRatio { max_rt, ratio: 1.0 })
    }

    /// An error-ratio breaker (grade 1) opening above `ratio`.
    pub fn error_ratio(ratio: f64) -> BreakerBuilder {
        BreakerBuilder::new(Strategy::ErrorRatio { ratio })
    }

    /// An error-count breaker (grade 2) opening above `count` errors in the interval.
    pub fn error_count(count: u64) -> BreakerBuilder {
        BreakerBuilder::new(Strategy::ErrorCount { count })
    }

    /// The strategy and its thresholds.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The minimum number of calls in the interval before the breaker may open.
    pub fn min_calls(&self) -> u64 {
        self.min_requests
    }

    /// The fewest calls: [`min_calls`](Self::min_calls).
    #[deprecated(
        since = "0.2.0",
        note = "renamed `min_calls`, as in the other policies"
    )]
    pub fn min_requests(&self) -> u64 {
        self.min_calls()
    }

    /// The statistics interval.
    pub fn window(&self) -> Duration {
        self.interval.span()
    }

    /// The interval's shape (span and buckets).
    pub fn window_shape(&self) -> WindowShape {
        self.interval
    }

    /// How long the breaker stays open before it admits a probe.
    pub fn open_duration(&self) -> Duration {
        self.open_duration
    }
}

/// Builds a [`BreakerConfig`]; [`build`](Self::build) validates every field.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakerBuilder {
    strategy: Strategy,
    min_requests: u64,
    window: Duration,
    buckets: usize,
    open_duration: Duration,
}

impl BreakerBuilder {
    fn new(strategy: Strategy) -> Self {
        BreakerBuilder {
            strategy,
            min_requests: 5,
            window: Duration::from_secs(1),
            buckets: 1,
            open_duration: Duration::ZERO,
        }
    }

    /// The slow-call ratio (`slowRatioThreshold`, default 1.0). Only for
    /// [`BreakerConfig::slow_ratio`]; ignored by the other strategies.
    pub fn ratio(mut self, ratio: f64) -> Self {
        if let Strategy::SlowRatio { max_rt, .. } = self.strategy {
            self.strategy = Strategy::SlowRatio { max_rt, ratio };
        }
        self
    }

    /// Minimum calls in the interval before the breaker may open (`minRequestAmount`, default 5,
    /// at least 1).
    pub fn min_calls(mut self, min_calls: u64) -> Self {
        self.min_requests = min_calls;
        self
    }

    /// Sets the fewest calls: [`min_calls`](Self::min_calls).
    #[deprecated(
        since = "0.2.0",
        note = "renamed `min_calls`, as in the other policies"
    )]
    pub fn min_requests(self, min_requests: u64) -> Self {
        self.min_calls(min_requests)
    }

    /// The statistics interval (`statIntervalMs`, default 1 s).
    pub fn window(mut self, interval: Duration) -> Self {
        self.window = interval;
        self
    }

    /// How many buckets the interval slides by. The default, 1, is Sentinel's behaviour exactly:
    /// the statistics restart at every interval boundary. More buckets make it a sliding window.
    pub fn buckets(mut self, buckets: usize) -> Self {
        self.buckets = buckets;
        self
    }

    /// How long the breaker stays open (`timeWindow`, required, greater than zero).
    pub fn open_duration(mut self, open: Duration) -> Self {
        self.open_duration = open;
        self
    }

    /// Validates and builds the configuration.
    pub fn build(self) -> Result<BreakerConfig, ConfigError> {
        match self.strategy {
            Strategy::SlowRatio { ratio, .. } => {
                check_ratio("slow_ratio_threshold", ratio)?;
            }
            Strategy::ErrorRatio { ratio } => {
                check_ratio("error_ratio", ratio)?;
            }
            Strategy::ErrorCount { .. } => {}
        }
        if self.min_requests == 0 {
            return Err(ConfigError::new("min_requests", 0, "at least 1"));
        }
        if self.open_duration.is_zero() {
            return Err(ConfigError::new(
                "open_duration",
                format_args!("{:?}", self.open_duration),
                "greater than 0",
            ));
        }
        let interval = WindowShape::new(self.window, self.buckets)?;
        Ok(BreakerConfig {
            strategy: self.strategy,
            min_requests: self.min_requests,
            interval,
            open_duration: self.open_duration,
        })
    }
}
