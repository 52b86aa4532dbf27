//! A window a policy's state shares with its endpoint's record.

use std::fmt;

use crate::clock::Nanos;
use crate::sync::Ordering;

use super::*;

/// A window that a policy's endpoint state shares with the endpoint's record, and a flag saying
/// whether the record may count successes in it without asking the state.
///
/// A state hands one to its record ([`EndpointPolicy::shared_window`]) so that the common call,
/// a success while nothing is wrong, costs no call into the state. Who counts what:
///
/// * the record counts a successful call in [`window`](Self::window) itself, and then does not
///   call the state's [`record`](crate::EndpointPolicy::record), when [`watching`](Self::watching)
///   reads false and the call holds no probe permit;
/// * every other call (a failure, a success while watching, a call holding a probe permit) goes
///   to the state's `record` (or its gate's `record_probe`) as usual, and the state counts it.
///
/// So each call is counted once, either here or by the state. A state that needs to see
/// successes (to check the window when one may complete its minimum) sets
/// [`set_watching`](Self::set_watching) until it no longer does. The record does this for one
/// policy at most: the first of its first 256 that has a shared window; the others' calls all
/// go to their `record`.
///
/// [`EndpointPolicy::shared_window`]: crate::EndpointPolicy::shared_window
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::{SharedWindow, Window};
///
/// let shared = SharedWindow::new(Window::new(Duration::from_secs(10), 10).unwrap());
/// assert!(!shared.watching());
/// shared.window().record(0, true, false);
/// shared.set_watching(true);
/// assert!(shared.watching());
/// assert_eq!(shared.window().counts(0).failures, 1);
/// ```
pub struct SharedWindow {
    window: Window,
    watching: std::sync::atomic::AtomicBool,
}

impl SharedWindow {
    /// Shares `window`, not watching.
    pub fn new(window: Window) -> Self {
        SharedWindow {
            window,
            watching: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The window.
    #[inline]
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// Whether successes go to the state's `record` (true) or are counted by the record (false).
    #[inline]
    pub fn watching(&self) -> bool {
        self.watching.load(Ordering::Relaxed)
    }

    /// Sends successes to the state's `record` (true) or lets the record count them (false).
    /// Stores only when it changes (see [`store_if_changed`](crate::store_if_changed)).
    #[inline]
    pub fn set_watching(&self, watching: bool) {
        crate::record::store_if_changed(&self.watching, watching);
    }

    /// The record's path: counts a success at `now` unless watching; false when it did not.
    #[inline]
    pub(crate) fn count_success(&self, now: Nanos) -> bool {
        if self.watching() {
            return false;
        }
        self.window.record(now, false, false);
        true
    }
}

impl fmt::Debug for SharedWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedWindow")
            .field("window", &self.window)
            .field("watching", &self.watching())
            .finish()
    }
}
