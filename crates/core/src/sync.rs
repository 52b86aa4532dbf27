//! The atomics, reference counts and lock the window's and the lanes' protocols are built on, and
//! the one place that names them: loom's under `--cfg loom`, so that `crates/core/tests/loom_*.rs`
//! can check the protocols under every interleaving, std's otherwise.
//!
//! loom has no `Weak`, and the lanes count calls in flight by reference counts; under loom a lane
//! is counted by `model::Arc`, a strong count on a loom atomic whose reaching zero runs the
//! lane's last-reference step, as its `Drop` does with std's `Arc`.
//!
//! Under loom a window never splits into per-core rings (the split allocates through a
//! `OnceBox`, which loom does not model): each ring runs the same protocol, and a split window's
//! reads only sum its rings.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub use model::{Arc as LaneArc, Weak as LaneWeak};
/// The reference-counted pointer a lane is held by.
#[cfg(not(loom))]
pub use std::sync::{Arc as LaneArc, Weak as LaneWeak};

/// The lock over an endpoint's list of lanes.
#[cfg(not(loom))]
pub(crate) struct LaneLock<T>(crate::Lock<T>);
#[cfg(loom)]
pub(crate) struct LaneLock<T>(loom::sync::Mutex<T>);

impl<T> LaneLock<T> {
    pub(crate) fn new(value: T) -> Self {
        #[cfg(not(loom))]
        return LaneLock(crate::Lock::new(value));
        #[cfg(loom)]
        return LaneLock(loom::sync::Mutex::new(value));
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        #[cfg(not(loom))]
        return f(&mut self.0.lock());
        #[cfg(loom)]
        return f(&mut self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()));
    }
}

/// A value that does something when its last strong reference goes: under loom, where
/// `model::Arc` cannot drop the value at that moment, the step is called instead.
pub trait LastRef {
    /// The last strong reference is gone.
    fn last_ref_dropped(&self);
}

#[cfg(loom)]
pub(crate) mod model {
    //! A model of `std::sync::{Arc, Weak}` on loom's atomics, for what the lanes use of them:
    //! `clone`, drop, `strong_count`, `downgrade`, `upgrade`. The value stays allocated (behind
    //! std's `Arc`) while any handle exists; the logical strong count reaching zero calls
    //! [`LastRef::last_ref_dropped`](super::LastRef::last_ref_dropped) where std's `Arc` would drop
    //! the value, and `upgrade` refuses a count of zero.

    use super::{AtomicUsize, LastRef, Ordering};

    struct Cell<T> {
        strong: AtomicUsize,
        value: T,
    }

    /// loom's model of `std::sync::Arc`.
    pub struct Arc<T: LastRef> {
        cell: std::sync::Arc<Cell<T>>,
    }

    /// loom's model of `std::sync::Weak`.
    pub struct Weak<T: LastRef> {
        cell: std::sync::Arc<Cell<T>>,
    }

    impl<T: LastRef> Arc<T> {
        /// One strong reference to `value`.
        pub fn new(value: T) -> Self {
            Arc {
                cell: std::sync::Arc::new(Cell {
                    strong: AtomicUsize::new(1),
                    value,
                }),
            }
        }

        /// The strong references (Relaxed, as std's: no synchronisation std does not give).
        pub fn strong_count(this: &Self) -> usize {
            this.cell.strong.load(Ordering::Relaxed)
        }

        /// A weak reference.
        pub fn downgrade(this: &Self) -> Weak<T> {
            Weak {
                cell: this.cell.clone(),
            }
        }
    }

    impl<T: LastRef> std::fmt::Debug for Arc<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Arc")
                .field("strong", &Arc::strong_count(self))
                .finish_non_exhaustive()
        }
    }

    impl<T: LastRef> std::fmt::Debug for Weak<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Weak")
                .field("strong", &self.strong_count())
                .finish_non_exhaustive()
        }
    }

    impl<T: LastRef> Clone for Arc<T> {
        fn clone(&self) -> Self {
            self.cell.strong.fetch_add(1, Ordering::Relaxed);
            Arc {
                cell: self.cell.clone(),
            }
        }
    }

    impl<T: LastRef> Drop for Arc<T> {
        fn drop(&mut self) {
            if self.cell.strong.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.cell.value.last_ref_dropped();
            }
        }
    }

    impl<T: LastRef> std::ops::Deref for Arc<T> {
        type Target = T;
        fn deref(&self) -> &T {
            &self.cell.value
        }
    }

    impl<T: LastRef> Weak<T> {
        /// A strong reference, unless the last one is gone.
        pub fn upgrade(&self) -> Option<Arc<T>> {
            let mut n = self.cell.strong.load(Ordering::Relaxed);
            loop {
                if n == 0 {
                    return None;
                }
                match self.cell.strong.compare_exchange_weak(
                    n,
                    n + 1,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        return Some(Arc {
                            cell: self.cell.clone(),
                        })
                    }
                    Err(now) => n = now,
                }
            }
        }

        /// The strong references (Relaxed, as std's).
        pub fn strong_count(&self) -> usize {
            self.cell.strong.load(Ordering::Relaxed)
        }
    }
}

#[cfg(not(loom))]
pub(crate) use once_cell::race::OnceBox;
#[cfg(not(loom))]
pub(crate) use std::sync::OnceLock;

/// Under loom, the per-core rings are never made: `get` is always `None`.
#[cfg(loom)]
pub(crate) struct OnceBox<T>(std::marker::PhantomData<T>);

#[cfg(loom)]
impl<T> OnceBox<T> {
    pub(crate) const fn new() -> Self {
        OnceBox(std::marker::PhantomData)
    }

    pub(crate) fn get(&self) -> Option<&T> {
        None
    }
}
