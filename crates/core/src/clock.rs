//! The clock that timestamps calls.
//!
//! Every recorded call reads the clock twice (when it starts and when it completes), so the clock
//! is the largest single cost on the hot path. Two sources are offered:
//!
//! * [`Clock::tokio`] reads `tokio::time::Instant`. It follows tokio's paused clock, so tests
//!   written with `#[tokio::test(start_paused = true)]` are deterministic. On Linux it is a vDSO
//!   `clock_gettime`, about 19 ns per read on the reference machine.
//! * [`Clock::tsc`] reads the CPU's time-stamp counter through the `quanta` crate (which falls back
//!   to the OS clock where the counter is not reliable), about 8 ns per read. It runs in real time
//!   only: it does not see tokio's paused clock.
//!
//! The default, [`Clock::auto`], picks between them when the layer is built: the tokio clock if
//! tokio's clock is paused at that moment (a test), the time-stamp counter otherwise. Pausing the
//! clock *after* building the layer is not detected; pass [`Clock::tokio`] explicitly then.
//!
//! Timestamps are nanoseconds since the clock's origin, as a `u64` ([`Nanos`]), so they fit in an
//! atomic and windows can index buckets without a lock. A tokio clock's origin is its creation;
//! every time-stamp-counter clock in the process shares one origin and one calibration, made by
//! the first, so a record holds a pointer to them rather than a copy.

use std::fmt;
use std::time::Duration;

/// Nanoseconds since a [`Clock`]'s origin.
pub type Nanos = u64;

/// A monotonic clock that reads nanoseconds since its origin.
///
/// Clones share the origin, so timestamps from clones are comparable (and so are those of any two
/// [`Clock::tsc`] clocks).
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
    // A pointer, not the calibration itself: every endpoint's record holds a clock, and the
    // calibrated counter is 40 bytes.
    Tsc(&'static Counter),
}

// The calibrated counter and its raw reading at the origin: raw deltas scale to nanoseconds with
// one multiply and shift, cheaper than building `quanta::Instant`s.
struct Counter {
    clock: quanta::Clock,
    origin: u64,
}

fn counter() -> &'static Counter {
    static COUNTER: std::sync::OnceLock<Counter> = std::sync::OnceLock::new();
    COUNTER.get_or_init(|| {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Counter { clock, origin }
    })
}

impl Clock {
    /// [`Clock::tokio`] when tokio's clock is paused now (in a `start_paused` test), else
    /// [`Clock::tsc`].
    ///
    /// A paused tokio clock returns the same instant to consecutive reads, which a running clock
    /// with nanosecond resolution does not. Where the OS clock is too coarse to tell, this picks
    /// the tokio clock: correct everywhere, only slower.
    pub fn auto() -> Self {
        let first = tokio::time::Instant::now();
        let second = tokio::time::Instant::now();
        if first == second {
            Clock::tokio()
        } else {
            Clock::tsc()
        }
    }

    /// A clock reading `tokio::time::Instant`, which honours tokio's paused test clock.
    pub fn tokio() -> Self {
        Clock {
            source: Source::Tokio(tokio::time::Instant::now()),
        }
    }

    /// A clock reading the CPU time-stamp counter (through `quanta`), calibrated against the
    /// system's monotonic clock. Real time only: it ignores tokio's paused clock. Its origin is
    /// the first such clock's creation in the process.
    pub fn tsc() -> Self {
        Clock {
            source: Source::Tsc(counter()),
        }
    }

    /// Nanoseconds since this clock's origin.
    #[inline]
    pub fn now(&self) -> Nanos {
        match &self.source {
            Source::Tokio(origin) => {
                duration_to_nanos(tokio::time::Instant::now().saturating_duration_since(*origin))
            }
            Source::Tsc(counter) => counter
                .clock
                .delta_as_nanos(counter.origin, counter.clock.raw()),
        }
    }

    /// Whether this clock follows tokio's (possibly paused) clock.
    pub fn is_tokio(&self) -> bool {
        matches!(self.source, Source::Tokio(_))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::auto()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.source {
            Source::Tokio(_) => "Clock::tokio",
            Source::Tsc(_) => "Clock::tsc",
        })
    }
}

/// A duration as whole nanoseconds, saturating at `u64::MAX` (about 584 years).
#[inline]
pub fn duration_to_nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn auto_follows_a_paused_clock() {
        let clock = Clock::auto();
        assert!(clock.is_tokio());
        let start = clock.now();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(clock.now() - start, 3_000_000_000);
    }

    #[tokio::test]
    async fn auto_reads_the_counter_in_real_time() {
        let clock = Clock::auto();
        let start = clock.now();
        std::thread::sleep(Duration::from_millis(5));
        let elapsed = clock.now() - start;
        assert!(elapsed >= 4_000_000, "{elapsed}");
        // Outside tokio's paused clock the choice is the counter, unless the OS clock is coarse.
        let _ = clock.is_tokio();
    }

    #[test]
    fn tsc_clocks_are_monotonic_and_share_one_origin() {
        let first = Clock::tsc();
        let a = first.now();
        let second = Clock::tsc();
        let b = second.now();
        let c = first.now();
        assert!(a <= b && b <= c, "{a} {b} {c}");
    }

    #[test]
    fn a_clock_is_two_words() {
        assert!(std::mem::size_of::<Clock>() <= 16);
    }
}
