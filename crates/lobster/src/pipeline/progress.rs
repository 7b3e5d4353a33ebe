//! Back-pressure: the planner stays at most the prefetch distance ahead of the slowest rank.

use std::sync::{Condvar, Mutex};

use super::sync::{lock, stopped, StopSignal};
use crate::error::Error;

/// How far each rank's training thread has got.
#[derive(Debug)]
pub(crate) struct Progress {
    /// Batches taken per rank (counted across epochs); `usize::MAX` once detached.
    taken: Mutex<Vec<usize>>,
    cv: Condvar,
}

impl Progress {
    pub(crate) fn new(ranks: usize) -> Self {
        Progress {
            taken: Mutex::new(vec![0; ranks]),
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
                return Err(stopped());
            }
            let slowest = taken.iter().copied().min().unwrap_or(usize::MAX);
            if until <= slowest.saturating_add(prefetch) {
                return Ok(());
            }
            taken = self.cv.wait(taken).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Rank `rank` took a batch.
    pub(crate) fn took(&self, rank: usize) {
        lock(&self.taken)[rank] += 1;
        self.cv.notify_all();
    }

    /// Rank `rank` is gone and no longer holds the planner back.
    pub(crate) fn detach(&self, rank: usize) {
        lock(&self.taken)[rank] = usize::MAX;
        self.cv.notify_all();
    }

    pub(crate) fn wake(&self) {
        drop(lock(&self.taken));
        self.cv.notify_all();
    }
}
