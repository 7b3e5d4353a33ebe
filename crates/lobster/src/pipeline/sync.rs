//! Locking that survives a panic elsewhere, and the error of a stage stopped by a drop.

use std::sync::{Mutex, MutexGuard};

use crate::error::Error;

/// Locks a mutex; a panic elsewhere must not hide the state from the threads shutting down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The error of a rank or stage that ends because the loader was dropped.
pub(crate) fn stopped() -> Error {
    Error::Stopped {
        reason: "loader dropped".into(),
    }
}

/// The pipeline's stop flag, with a condition variable so that timed sleeps (emulated storage
/// time, injected delays, retry backoffs) end as soon as the loader stops.
#[derive(Debug, Default)]
pub(crate) struct StopSignal {
    stopped: std::sync::atomic::AtomicBool,
    lock: Mutex<()>,
    cv: std::sync::Condvar,
}

impl StopSignal {
    pub(crate) fn is_set(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sets the flag and wakes every sleeper.
    pub(crate) fn set(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Taking the lock orders the flag before a sleeper's check-then-wait.
        drop(lock(&self.lock));
        self.cv.notify_all();
    }

    /// Waits until `deadline` unless the loader stops first; `false` if it stopped.
    pub(crate) fn sleep_until(&self, deadline: std::time::Instant) -> bool {
        // Nothing to wait for (no emulated tier, no injected delay): no lock.
        if std::time::Instant::now() >= deadline {
            return !self.is_set();
        }
        let mut guard = lock(&self.lock);
        loop {
            if self.is_set() {
                return false;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return true;
            }
            guard = self
                .cv
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
