//! A validated window shape.

use std::time::Duration;

use crate::clock::duration_to_nanos;
use crate::error::ConfigError;

use super::*;

/// A validated window shape: a span and a bucket count. Policies validate the shape once, when
/// they are configured, and build one window per endpoint from it without further checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowShape {
    pub(super) bucket_nanos: u64,
    pub(super) buckets: usize,
}

impl WindowShape {
    /// Checks that `span` is at least one millisecond, `buckets` in `1..=1024`, and each bucket at
    /// least one microsecond long.
    pub fn new(span: Duration, buckets: usize) -> Result<Self, ConfigError> {
        if span < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "window",
                format_args!("{span:?}"),
                "at least 1ms",
            ));
        }
        if !(1..=Window::MAX_BUCKETS).contains(&buckets) {
            return Err(ConfigError::new("buckets", buckets, "1 to 1024"));
        }
        let bucket_nanos = duration_to_nanos(span) / buckets as u64;
        if bucket_nanos < 1_000 {
            return Err(ConfigError::new(
                "buckets",
                buckets,
                "few enough that each bucket covers at least 1µs",
            ));
        }
        Ok(WindowShape {
            bucket_nanos,
            buckets,
        })
    }

    /// The time a window of this shape covers.
    pub fn span(&self) -> Duration {
        Duration::from_nanos(self.bucket_nanos * self.buckets as u64)
    }

    /// How many buckets a window of this shape slides by.
    pub fn buckets(&self) -> usize {
        self.buckets
    }

    /// A new, empty window of this shape counting calls and failures (its
    /// [`WindowCounts::slow`] stays 0: `record`'s `slow` is ignored).
    pub fn window(&self) -> Window {
        Window::with_shape(*self, false)
    }

    /// A new, empty window of this shape that also counts slow calls (four bytes more per
    /// bucket).
    pub fn window_counting_slow(&self) -> Window {
        Window::with_shape(*self, true)
    }
}
