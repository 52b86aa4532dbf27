//! Finagle's equal-jitter back-off: how long an endpoint marked dead stays so, the n-th time in a
//! row.

use std::time::Duration;

use tower_outlier_core::{ConfigError, Dice};

/// Finagle's `Backoff.equalJittered(start, maximum)`: the first time out is `start`; the n-th
/// after it is `h + U[0, h)` with `h = start · 2^(n−1)`; once that reaches `maximum` (or `h`
/// alone does), every later one is `maximum`. At Finagle's defaults (5 s, 300 s): 5 s, then
/// 5–10 s, 10–20 s, 20–40 s, 40–80 s, 80–160 s, 160–300 s, then 300 s.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::Dice;
/// use tower_outlier_finagle::EqualJitter;
///
/// let backoff = EqualJitter::finagle();
/// let dice = Dice::new(1);
/// assert_eq!(backoff.duration(0, &dice), Duration::from_secs(5));
/// let second = backoff.duration(1, &dice);
/// assert!(second >= Duration::from_secs(5) && second < Duration::from_secs(10));
/// assert_eq!(backoff.duration(30, &dice), Duration::from_secs(300));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EqualJitter {
    start: Duration,
    maximum: Duration,
}

impl EqualJitter {
    /// From `start` to `maximum`: `start` at least a millisecond, `maximum` at least `start`.
    pub fn new(start: Duration, maximum: Duration) -> Result<Self, ConfigError> {
        if start < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "backoff_start",
                format!("{start:?}"),
                "at least 1 ms",
            ));
        }
        if maximum < start {
            return Err(ConfigError::new(
                "backoff_maximum",
                format!("{maximum:?}"),
                format!("at least the start, {start:?}"),
            ));
        }
        Ok(EqualJitter { start, maximum })
    }

    /// Finagle's default: 5 s to 300 s.
    pub fn finagle() -> Self {
        EqualJitter {
            start: Duration::from_secs(5),
            maximum: Duration::from_secs(300),
        }
    }

    /// The first time out.
    pub fn start(&self) -> Duration {
        self.start
    }

    /// The longest.
    pub fn maximum(&self) -> Duration {
        self.maximum
    }

    /// The time out after `attempt` earlier ones in a row (0: the first), with the jitter drawn
    /// from `dice`.
    pub fn duration(&self, attempt: u32, dice: &Dice) -> Duration {
        if attempt == 0 {
            return self.start;
        }
        // Finagle caps the shift at 62 bits; a duration past the maximum is the maximum anyway.
        let shift = 1u32 << (attempt - 1).min(30);
        let half = if self.start >= self.maximum / shift {
            self.maximum
        } else {
            self.start * shift
        };
        if half == self.maximum {
            return self.maximum;
        }
        let half_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = Duration::from_nanos(dice.next() % half_nanos.max(1));
        if half >= self.maximum.saturating_sub(jitter) {
            self.maximum
        } else {
            half + jitter
        }
    }
}
