//! The state a reader shares between its handle, its sessions and its backend threads: the
//! class queues behind one lock with the condition variables that wait on them, the engines'
//! eventfds, the open files, the buffer pool and the completion channel.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crossbeam_channel::Sender;

use crate::classes::ClassQueues;
use crate::completion::Completion;
use crate::error::ReadError;
use crate::files::{FileTable, FixedTable};
use crate::job::Job;
use crate::pool::Pool;
use crate::types::{IoEvent, IoEventKind, Observer, ReaderStats};

/// Whom to wake after the class queues changed.
#[must_use]
pub(crate) enum Wake {
    Nobody,
    Engine(usize),
    Engines(Vec<usize>),
    Worker,
    Workers,
}

/// Everything the reader handle, its sessions, the submitters and the backend threads share.
pub(crate) struct ReaderState {
    classes: Mutex<ClassQueues>,
    /// Submitters waiting for room in a class queue.
    space: Condvar,
    /// Idle pread workers.
    pub(crate) work: Condvar,
    /// Sessions waiting for a class to get below its io_depth.
    depth: Condvar,
    /// Number of classes (fixed when the reader is built).
    class_count: usize,
    /// One eventfd per io_uring engine; each engine keeps a read of it in its ring.
    pub(crate) wakers: Vec<OwnedFd>,
    pub(crate) files: FileTable,
    pub(crate) fixed: Option<Arc<FixedTable>>,
    pub(crate) pool: Pool,
    pub(crate) sender: Sender<Completion>,
    queue_capacity: usize,
    pub(crate) observer: Option<Observer>,
}

impl fmt::Debug for ReaderState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReaderState")
            .field("engines", &self.wakers.len())
            .field("queue_capacity", &self.queue_capacity)
            .finish_non_exhaustive()
    }
}

impl ReaderState {
    pub(crate) fn new(
        depths: &[usize],
        wakers: Vec<OwnedFd>,
        fixed: Option<Arc<FixedTable>>,
        pool: Pool,
        sender: Sender<Completion>,
        queue_capacity: usize,
        observer: Option<Observer>,
    ) -> ReaderState {
        ReaderState {
            classes: Mutex::new(ClassQueues::new(depths, wakers.len())),
            space: Condvar::new(),
            work: Condvar::new(),
            depth: Condvar::new(),
            class_count: depths.len(),
            wakers,
            files: FileTable::default(),
            fixed,
            pool,
            sender,
            queue_capacity,
            observer,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ClassQueues> {
        self.classes.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn classes(&self) -> usize {
        self.class_count
    }

    /// [`ClassQueues::take_next`], telling the observer.
    pub(crate) fn take_next(&self, s: &mut ClassQueues) -> Option<Job> {
        let job = s.take_next()?;
        self.observe(IoEventKind::Issued, &job);
        Some(job)
    }

    /// [`ClassQueues::try_start`] for a job a session holds, telling the observer.
    pub(crate) fn try_start(&self, s: &mut ClassQueues, job: &Job) -> bool {
        if !s.try_start(job.class) {
            return false;
        }
        self.observe(IoEventKind::Issued, job);
        true
    }

    /// [`ClassQueues::finish`], telling the observer and waking sessions that wait for depth.
    pub(crate) fn finish(&self, s: &mut ClassQueues, job: &Job) {
        self.observe(IoEventKind::Finished, job);
        s.finish(job.class);
        if s.depth_waiters > 0 {
            self.depth.notify_all();
        }
    }

    /// After a session finished reads: the depth it freed may let an engine or a pread
    /// worker start reads queued on the reader, and they only look when woken.
    pub(crate) fn wake_for_freed_depth(&self, s: &mut ClassQueues) -> Wake {
        if s.runnable() {
            self.wake_one(s)
        } else {
            Wake::Nobody
        }
    }

    /// `class` is below its io_depth.
    pub(crate) fn class_has_room(&self, s: &ClassQueues, class: usize) -> bool {
        s.has_room(class)
    }

    /// Sleeps until a read finishes or an io_depth changes (a session whose queued reads
    /// are all held back by their classes' limits).
    pub(crate) fn wait_for_depth<'a>(
        &self,
        mut s: MutexGuard<'a, ClassQueues>,
    ) -> MutexGuard<'a, ClassQueues> {
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

    /// Queues jobs in order under one lock and with at most one wake-up, waiting for room
    /// in the class queues (after waking an engine for what is already queued).
    pub(crate) fn enqueue_many(&self, jobs: Vec<Job>) -> Result<(), ReadError> {
        let mut s = self.lock();
        // Requests of this batch the backend could start at once.
        let mut woken_for = 0usize;
        for job in jobs {
            loop {
                if s.shutdown {
                    return Err(ReadError::ShutDown);
                }
                if s.queue_len(job.class) < self.queue_capacity {
                    break;
                }
                if woken_for > 0 {
                    woken_for = 0;
                    let wake = self.wake_one(&mut s);
                    drop(s);
                    self.wake(wake);
                    s = self.lock();
                    continue;
                }
                s.space_waiters += 1;
                s = self.space.wait(s).unwrap_or_else(|e| e.into_inner());
                s.space_waiters -= 1;
            }
            if s.would_start(job.class) {
                woken_for += 1;
            }
            s.push_back(job);
        }
        let wake = match woken_for {
            0 => Wake::Nobody,
            1 => self.wake_one(&mut s),
            _ => self.wake_all(&mut s),
        };
        drop(s);
        self.wake(wake);
        Ok(())
    }

    /// Queues a job, waiting for room in its class queue if `blocking`.
    pub(crate) fn enqueue(&self, job: Job, blocking: bool) -> Result<(), ReadError> {
        let class = job.class;
        let mut s = self.lock();
        loop {
            if s.shutdown {
                return Err(ReadError::ShutDown);
            }
            if s.queue_len(class) < self.queue_capacity {
                break;
            }
            if !blocking {
                return Err(ReadError::WouldBlock {
                    bound: "class queue",
                });
            }
            s.space_waiters += 1;
            s = self.space.wait(s).unwrap_or_else(|e| e.into_inner());
            s.space_waiters -= 1;
        }
        s.push_back(job);
        let wake = if s.has_room(class) {
            self.wake_one(&mut s)
        } else {
            Wake::Nobody
        };
        drop(s);
        self.wake(wake);
        Ok(())
    }

    /// Called by a backend thread after `take_next` made room in the queues.
    pub(crate) fn room_made(&self, s: &ClassQueues) {
        if s.space_waiters > 0 {
            self.space.notify_all();
        }
    }

    fn wake_one(&self, s: &mut ClassQueues) -> Wake {
        if !self.wakers.is_empty() {
            match s.parked.iter().position(|&p| p) {
                Some(i) => {
                    s.parked[i] = false;
                    Wake::Engine(i)
                }
                None => Wake::Nobody,
            }
        } else if s.idle_workers > 0 {
            Wake::Worker
        } else {
            Wake::Nobody
        }
    }

    fn wake_all(&self, s: &mut ClassQueues) -> Wake {
        if !self.wakers.is_empty() {
            let parked: Vec<usize> = (0..s.parked.len()).filter(|&i| s.parked[i]).collect();
            for &i in &parked {
                s.parked[i] = false;
            }
            Wake::Engines(parked)
        } else {
            Wake::Workers
        }
    }

    pub(crate) fn wake(&self, wake: Wake) {
        match wake {
            Wake::Nobody => {}
            Wake::Engine(i) => self.kick(i),
            Wake::Engines(list) => list.into_iter().for_each(|i| self.kick(i)),
            Wake::Worker => self.work.notify_one(),
            Wake::Workers => self.work.notify_all(),
        }
    }

    /// Writes engine `i`'s eventfd, completing the read it keeps in its ring.
    pub(crate) fn kick(&self, i: usize) {
        let one: u64 = 1;
        // SAFETY: the eventfd is open for the lifetime of ReaderState and `one` is 8 readable
        // bytes, the size an eventfd write takes.
        let rc = unsafe {
            libc::write(
                self.wakers[i].as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        // EAGAIN means the counter is saturated: the engine is woken anyway.
        debug_assert!(rc == 8 || io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN));
    }

    pub(crate) fn set_io_depth(&self, class: usize, depth: usize) -> Result<(), ReadError> {
        let mut s = self.lock();
        let change = s.set_depth(class, depth)?;
        if change.grew && s.depth_waiters > 0 {
            self.depth.notify_all();
        }
        let wake = if change.grew && change.queued {
            self.wake_all(&mut s)
        } else {
            Wake::Nobody
        };
        drop(s);
        self.wake(wake);
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
            files_open: self.files.len(),
        }
    }

    pub(crate) fn reset_peaks(&self) {
        self.lock().reset_peaks();
    }

    /// Stops accepting requests and wakes every backend thread so it can wind down.
    pub(crate) fn shut_down(&self) {
        let mut s = self.lock();
        s.shutdown = true;
        for p in &mut s.parked {
            *p = false;
        }
        drop(s);
        self.space.notify_all();
        self.work.notify_all();
        for i in 0..self.wakers.len() {
            self.kick(i);
        }
    }

    /// Delivers a completion. The consumer may have dropped every receiver; then the
    /// completion (and its buffer) is simply dropped.
    pub(crate) fn deliver(&self, completion: Completion) {
        let _ = self.sender.send(completion);
    }
}
