//! Whether any task will still come: the accesses planned and not yet delivered to a reorder
//! buffer, and whether the planner is done. The planner counts, the decode workers deliver,
//! and the workers and the dispatcher ask.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

#[derive(Debug, Default)]
pub(crate) struct Outstanding {
    /// Accesses planned and not yet delivered to a reorder buffer.
    accesses: AtomicUsize,
    planner_done: AtomicBool,
}

impl Outstanding {
    /// `n` more accesses were planned.
    pub(crate) fn planned(&self, n: usize) {
        self.accesses.fetch_add(n, Ordering::SeqCst);
    }

    /// One access reached its reorder buffer: `true` if no other is outstanding now.
    pub(crate) fn delivered(&self) -> bool {
        self.accesses.fetch_sub(1, Ordering::SeqCst) == 1
    }

    pub(crate) fn planner_done(&self) {
        self.planner_done.store(true, Ordering::SeqCst);
    }

    /// Every planned access was delivered and the planner is done: no task will come.
    pub(crate) fn drained(&self) -> bool {
        self.planner_done.load(Ordering::SeqCst) && self.accesses.load(Ordering::SeqCst) == 0
    }
}
