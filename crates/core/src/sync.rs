//! The atomics the window's protocol is built on, and the one place that names them: loom's under
//! `--cfg loom`, so that `crates/core/tests/loom_window.rs` can check the protocol under every
//! interleaving, std's otherwise.
//!
//! Under loom a window never splits into per-core rings (the split allocates through a
//! `OnceLock`, which loom does not model): each ring runs the same protocol, and a split window's
//! reads only sum its rings.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::OnceLock;

/// Under loom, the per-core rings are never made: `get` is always `None`.
#[cfg(loom)]
pub(crate) struct OnceLock<T>(std::marker::PhantomData<T>);

#[cfg(loom)]
impl<T> OnceLock<T> {
    pub(crate) const fn new() -> Self {
        OnceLock(std::marker::PhantomData)
    }

    pub(crate) fn get(&self) -> Option<&T> {
        None
    }
}
