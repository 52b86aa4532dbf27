//! The one lock type of the library crates: the only place `std::sync::Mutex` is named.
#![allow(clippy::disallowed_types)]

use std::fmt;
use std::sync::{Mutex, MutexGuard};

/// A mutual-exclusion lock that survives poisoning.
///
/// The library keeps locks off the hot path (recording takes none); the few it has guard
/// bookkeeping that a panicking holder cannot leave half-updated, so a poisoned lock is taken as
/// it is instead of turning one panic into a panic in every later caller.
///
/// ```
/// use tower_outlier_core::Lock;
///
/// let counts = Lock::new(vec![1, 2]);
/// counts.lock().push(3);
/// assert_eq!(counts.lock().len(), 3);
/// ```
pub struct Lock<T>(Mutex<T>);

/// The guard of a [`Lock`]: the value is locked while it lives.
pub type LockGuard<'a, T> = MutexGuard<'a, T>;

impl<T> Lock<T> {
    /// A lock holding `value`.
    pub fn new(value: T) -> Self {
        Lock(Mutex::new(value))
    }

    /// Locks, waiting for any other holder; a lock poisoned by a panicking holder is taken as is.
    pub fn lock(&self) -> LockGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<T> Lock<T> {
    /// Locks if no other holder has it now; a poisoned lock is taken as is.
    pub fn try_lock(&self) -> Option<LockGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The value, through an exclusive borrow of the lock: nothing to wait for, nothing locked
    /// (for a value kept in a lock only so that its owner stays `Sync`).
    pub fn get_mut(&mut self) -> &mut T {
        self.0
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<T: Default> Default for Lock<T> {
    fn default() -> Self {
        Lock::new(T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for Lock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Lock").field(&*self.lock()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_as_it_is() {
        let lock = std::sync::Arc::new(Lock::new(1));
        let holder = lock.clone();
        let _ = std::thread::spawn(move || {
            let _guard = holder.lock();
            panic!("the holder panics");
        })
        .join();
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 2);
    }
}
