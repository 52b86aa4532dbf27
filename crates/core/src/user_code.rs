//! What the crates keep of a panic caught in user code (a classifier, a probe, a callback, an
//! observer): its message for the log, and a payload disposed of without a second unwind.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The message a caught panic carried, if it was text.
///
/// ```
/// let caught = std::panic::catch_unwind(|| panic!("no such endpoint")).unwrap_err();
/// assert_eq!(tower_outlier_core::panic_message(&*caught), "no such endpoint");
/// ```
pub fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not text)")
}

/// Drops a caught panic's payload. A payload whose own `Drop` panics would unwind again out of
/// the code that caught the first panic (a balancer's `poll_ready`, the observers' thread): that
/// second payload is leaked instead.
///
/// ```
/// let caught = std::panic::catch_unwind(|| panic!("a classifier's bug")).unwrap_err();
/// tower_outlier_core::drop_panic(caught);
/// ```
pub fn drop_panic(panic: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(panic))) {
        std::mem::forget(again);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload that panics again when dropped.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("a panic payload that panics when dropped");
        }
    }

    #[test]
    fn a_payload_that_panics_when_dropped_does_not_unwind_again() {
        let caught = catch_unwind(|| std::panic::panic_any(Bomb)).unwrap_err();
        assert_eq!(panic_message(&*caught), "(not text)");
        // Outside a catch_unwind of its own: a second unwind would fail the test.
        drop_panic(caught);
    }
}
