//! Back-pressure: the planner stays at most the prefetch distance ahead of the slowest rank.

use std::sync::{Condvar, Mutex};

use crate::error::Error;
use crate::pipeline::sync::{lock, stopped, StopSignal};

#[derive(Debug)]
struct Taken {
    /// Batches taken per rank (counted across epochs); `usize::MAX` once detached.
    per_rank: Vec<usize>,
    /// Batches each rank was given, kept when it detaches: what a saved state names.
    delivered: Vec<u64>,
    /// While the planner waits: the slowest rank's count it waits for. A rank's take wakes
    /// it only then, since every wake-up a rank sends costs that rank its core for a while.
    planner_needs: Option<usize>,
}

impl Taken {
    fn slowest(&self) -> usize {
        self.per_rank.iter().copied().min().unwrap_or(usize::MAX)
    }
}

/// How far each rank's training thread has got.
#[derive(Debug)]
pub(crate) struct Progress {
    taken: Mutex<Taken>,
    cv: Condvar,
}

impl Progress {
    pub(crate) fn new(ranks: usize) -> Self {
        Progress {
            taken: Mutex::new(Taken {
                per_rank: vec![0; ranks],
                delivered: vec![0; ranks],
                planner_needs: None,
            }),
            cv: Condvar::new(),
        }
    }

    /// Blocks until every rank has taken enough batches for `until` to be within `prefetch`
    /// iterations of the slowest.
    pub(crate) fn wait_for_room(
        &self,
        stop: &StopSignal,
        until: usize,
        prefetch: usize,
    ) -> Result<(), Error> {
        let mut taken = lock(&self.taken);
        loop {
            if stop.is_set() {
                taken.planner_needs = None;
                return Err(stopped());
            }
            if until <= taken.slowest().saturating_add(prefetch) {
                taken.planner_needs = None;
                return Ok(());
            }
            taken.planner_needs = Some(until - prefetch);
            taken = self.cv.wait(taken).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Batches the slowest rank has taken.
    pub(crate) fn slowest(&self) -> usize {
        lock(&self.taken).slowest()
    }

    /// Batches each rank was given.
    pub(crate) fn delivered(&self) -> Vec<u64> {
        lock(&self.taken).delivered.clone()
    }

    /// Rank `rank` took a batch.
    pub(crate) fn took(&self, rank: usize) {
        let mut taken = lock(&self.taken);
        taken.per_rank[rank] = taken.per_rank[rank].saturating_add(1);
        taken.delivered[rank] += 1;
        self.wake_if_room(taken);
    }

    /// Rank `rank` is gone and no longer holds the planner back.
    pub(crate) fn detach(&self, rank: usize) {
        let mut taken = lock(&self.taken);
        taken.per_rank[rank] = usize::MAX;
        self.wake_if_room(taken);
    }

    fn wake_if_room(&self, taken: std::sync::MutexGuard<'_, Taken>) {
        let Some(needs) = taken.planner_needs else {
            return;
        };
        let slowest = taken.slowest();
        drop(taken);
        // The room was recorded under the lock, so the planner cannot miss it.
        if slowest >= needs {
            self.cv.notify_all();
        }
    }

    pub(crate) fn wake(&self) {
        drop(lock(&self.taken));
        self.cv.notify_all();
    }
}
