//! The state a reader shares with its sessions: the classes' io_depth accounting behind one
//! lock with the condition variable sessions wait on for depth, the open files, the buffer
//! pool and the observer.

use std::fmt;
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::classes::Classes;
use crate::error::ReadError;
use crate::files::FileTable;
use crate::job::Job;
use crate::pool::Pool;
use crate::types::{IoEvent, IoEventKind, Observer, ReaderStats};

/// Everything the reader handle and its sessions share.
pub(crate) struct ReaderState {
    classes: Mutex<Classes>,
    /// Sessions waiting for a class to get below its io_depth.
    depth: Condvar,
    /// Number of classes (fixed when the reader is built).
    class_count: usize,
    pub(crate) files: FileTable,
    pub(crate) pool: Pool,
    observer: Option<Observer>,
}

impl fmt::Debug for ReaderState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReaderState")
            .field("classes", &self.class_count)
            .finish_non_exhaustive()
    }
}

impl ReaderState {
    pub(crate) fn new(depths: &[usize], pool: Pool, observer: Option<Observer>) -> ReaderState {
        ReaderState {
            classes: Mutex::new(Classes::new(depths)),
            depth: Condvar::new(),
            class_count: depths.len(),
            files: FileTable::default(),
            pool,
            observer,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Classes> {
        self.classes.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn classes(&self) -> usize {
        self.class_count
    }

    /// [`Classes::try_start`] for a job a session holds, telling the observer.
    pub(crate) fn try_start(&self, s: &mut Classes, job: &Job) -> bool {
        if !s.try_start(job.class) {
            return false;
        }
        self.observe(IoEventKind::Issued, job);
        true
    }

    /// [`Classes::finish`], telling the observer and waking sessions that wait for depth.
    pub(crate) fn finish(&self, s: &mut Classes, job: &Job) {
        self.observe(IoEventKind::Finished, job);
        s.finish(job.class);
        if s.depth_waiters > 0 {
            self.depth.notify_all();
        }
    }

    /// Sleeps until a read finishes or an io_depth changes (a session whose queued reads
    /// are all held back by their classes' limits).
    pub(crate) fn wait_for_depth<'a>(
        &self,
        mut s: MutexGuard<'a, Classes>,
    ) -> MutexGuard<'a, Classes> {
        s.depth_waiters += 1;
        s = self.depth.wait(s).unwrap_or_else(|e| e.into_inner());
        s.depth_waiters -= 1;
        s
    }

    fn observe(&self, kind: IoEventKind, job: &Job) {
        if let Some(observer) = &self.observer {
            observer(IoEvent {
                kind,
                class: job.class,
                tag: job.tag,
            });
        }
    }

    pub(crate) fn set_io_depth(&self, class: usize, depth: usize) -> Result<(), ReadError> {
        let mut s = self.lock();
        let grew = s.set_depth(class, depth)?;
        if grew && s.depth_waiters > 0 {
            self.depth.notify_all();
        }
        Ok(())
    }

    pub(crate) fn io_depth(&self, class: usize) -> Option<usize> {
        self.lock().depth(class)
    }

    pub(crate) fn stats(&self) -> ReaderStats {
        let classes = self.lock().stats();
        ReaderStats {
            classes,
            pool_free_bytes: self.pool.free_bytes(),
            pool_largest_free_bytes: self.pool.largest_free_bytes(),
            pool_budget_bytes: self.pool.budget_bytes(),
            pool_waiters: self.pool.waiters(),
            files_open: self.files.len(),
        }
    }

    pub(crate) fn reset_peaks(&self) {
        self.lock().reset_peaks();
    }
}
