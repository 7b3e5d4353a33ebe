//! Reads waiting for pool memory: `submit` never blocks on the pool.
//!
//! A submitter that finds no free block (or reads already waiting) leaves its request here
//! and returns; one thread per reader takes the oldest request, waits in the pool's FIFO for
//! its block, and queues the read in its class. So whoever holds pool memory (the caller's
//! completion loop above all) never waits for pool memory itself, and a budget of one
//! largest block cannot deadlock; requests are served in submission order.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::error::ReadError;
use crate::job::{Job, Pending};
use crate::pool::{Pool, PoolBuf};
use crate::state::ReaderState;

/// The queue behind [`Deferred`]'s lock.
#[derive(Debug)]
struct DeferredQueue {
    /// Oldest first; the front stays until its read is queued in its class, so later
    /// requests cannot overtake it.
    queue: VecDeque<Pending>,
    closed: bool,
}

/// The FIFO of requests waiting for pool memory, bounded by `capacity`.
#[derive(Debug)]
pub(crate) struct Deferred {
    state: Mutex<DeferredQueue>,
    changed: Condvar,
    capacity: usize,
}

impl Deferred {
    pub(crate) fn new(capacity: usize) -> Deferred {
        Deferred {
            state: Mutex::new(DeferredQueue {
                queue: VecDeque::new(),
                closed: false,
            }),
            changed: Condvar::new(),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, DeferredQueue> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer for `pending` now if nobody waits before it and a block is free; else
    /// (`blocking`) leaves it to the deferral thread and returns `None`, waiting only while
    /// this queue is full, or (not `blocking`) fails with `WouldBlock`.
    pub(crate) fn admit(
        &self,
        pool: &Pool,
        pending: &Pending,
        blocking: bool,
    ) -> Result<Option<PoolBuf>, ReadError> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return Err(ReadError::ShutDown);
            }
            if s.queue.is_empty() {
                if let Some(buf) = pool.try_acquire(pending.read_len) {
                    return Ok(Some(buf));
                }
            }
            if !blocking {
                return Err(ReadError::WouldBlock {
                    bound: "buffer pool",
                });
            }
            if s.queue.len() < self.capacity {
                s.queue.push_back(pending.clone());
                self.changed.notify_all();
                return Ok(None);
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Leaves `pending` to the deferral thread (after earlier ones), waiting while full.
    pub(crate) fn push(&self, pending: Pending) -> Result<(), ReadError> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return Err(ReadError::ShutDown);
            }
            if s.queue.len() < self.capacity {
                s.queue.push_back(pending);
                self.changed.notify_all();
                return Ok(());
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stops the deferral thread; what it has not queued yet completes as cancelled.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// Body of the deferral thread.
    pub(crate) fn run(&self, shared: &ReaderState) {
        loop {
            let next = {
                let mut s = self.lock();
                loop {
                    if s.closed {
                        break None;
                    }
                    if let Some(p) = s.queue.front() {
                        break Some(p.clone());
                    }
                    s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                }
            };
            let Some(p) = next else { break };
            // None: the pool was closed, the reader is shutting down.
            let Some(buf) = shared.pool.acquire(p.read_len) else {
                break;
            };
            let queued = shared.enqueue(Job::new(p.clone(), buf), true);
            self.lock().queue.pop_front();
            self.changed.notify_all();
            if queued.is_err() {
                shared.deliver(p.cancelled());
            }
        }
        let left: Vec<Pending> = self.lock().queue.drain(..).collect();
        self.changed.notify_all();
        for p in left {
            shared.deliver(p.cancelled());
        }
    }
}
