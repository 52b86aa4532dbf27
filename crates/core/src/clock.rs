//! The clock that timestamps calls.
//!
//! Every recorded call reads the clock twice (when it starts and when it completes), so the clock
//! is the largest single cost on the hot path. Two sources are offered, and the choice is the
//! user's:
//!
//! * [`Clock::tokio`] (the default) reads `tokio::time::Instant`. It follows tokio's paused clock,
//!   so tests written with `#[tokio::test(start_paused = true)]` are deterministic. On Linux it is a
//!   vDSO `clock_gettime`, about 19 ns per read on the reference machine.
//! * [`Clock::tsc`] reads the CPU's time-stamp counter through the `quanta` crate, about 8 ns per
//!   read. It runs in real time only: it does not see tokio's paused clock, so use it in production
//!   builds where the per-call cost matters and keep the default in tests.
//!
//! Timestamps are nanoseconds since the clock was created, as a `u64` ([`Nanos`]), so they fit in
//! an atomic and windows can index buckets without a lock.

use std::fmt;
use std::time::Duration;

/// Nanoseconds since a [`Clock`]'s origin.
pub type Nanos = u64;

/// A monotonic clock that reads nanoseconds since its own origin.
///
/// Clones share the origin, so timestamps from clones are comparable.
///
/// ```
/// use tower_outlier_core::Clock;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let clock = Clock::tokio();
/// let start = clock.now();
/// tokio::time::sleep(std::time::Duration::from_millis(5)).await;
/// assert_eq!(clock.now() - start, 5_000_000);
/// # }
/// ```
#[derive(Clone)]
pub struct Clock {
    source: Source,
}

#[derive(Clone)]
enum Source {
    Tokio(tokio::time::Instant),
    Tsc(quanta::Clock, quanta::Instant),
}

impl Clock {
    /// A clock reading `tokio::time::Instant`, which honours tokio's paused test clock.
    pub fn tokio() -> Self {
        Clock {
            source: Source::Tokio(tokio::time::Instant::now()),
        }
    }

    /// A clock reading the CPU time-stamp counter (through `quanta`), calibrated against the
    /// system's monotonic clock. Real time only: it ignores tokio's paused clock.
    pub fn tsc() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.now();
        Clock {
            source: Source::Tsc(clock, origin),
        }
    }

    /// Nanoseconds since this clock's origin.
    #[inline]
    pub fn now(&self) -> Nanos {
        let elapsed = match &self.source {
            Source::Tokio(origin) => tokio::time::Instant::now().saturating_duration_since(*origin),
            Source::Tsc(clock, origin) => clock.now().saturating_duration_since(*origin),
        };
        duration_to_nanos(elapsed)
    }

    /// Whether this clock follows tokio's (possibly paused) clock.
    pub fn is_tokio(&self) -> bool {
        matches!(self.source, Source::Tokio(_))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::tokio()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.source {
            Source::Tokio(_) => "Clock::tokio",
            Source::Tsc(..) => "Clock::tsc",
        })
    }
}

/// A duration as whole nanoseconds, saturating at `u64::MAX` (about 584 years).
#[inline]
pub fn duration_to_nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
