//! Where a sample's bytes appear: the slot every access to one read waits on, and the tasks
//! that wait.
//!
//! A miss creates a slot; the hits the cache plans on that sample share it. Whoever fills the
//! slot (the dispatcher, or a read-then-decode worker) releases every task waiting on it, and
//! the caller hands the released tasks to the decode queues in one go. A sample the cache
//! keeps that the page cache already holds settles the slot without bytes: its hits read it
//! there.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use lobster_uring::Arena;

use super::sync::lock;
use crate::error::Error;

/// Bytes of one sample, or why they could not be had. Shared by every access that needs them.
pub(crate) type Loaded = Result<Bytes, Error>;

/// The bytes of one read, once they are known.
#[derive(Debug)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
}

#[derive(Debug)]
enum SlotState {
    Pending(Vec<Task>),
    Ready(Loaded),
    /// A cached sample the page cache held when it was read: the cache keeps no copy, and
    /// each hit reads it from there (see [`WorkerRead::PageCacheHit`]).
    InPageCache,
}

/// One access on its way to a rank's batch.
#[derive(Debug)]
pub(crate) struct Task {
    /// Position in the node stream: lower goes first in every queue.
    pub(crate) seq: u64,
    pub(crate) epoch: u32,
    pub(crate) iteration: u32,
    pub(crate) rank: usize,
    pub(crate) pos: usize,
    pub(crate) sample: u32,
    /// `None` while the task waits in its slot's list: a waiting task holding its slot would
    /// make a reference cycle, leaked when the loader stops before the slot is filled.
    pub(crate) slot: Option<Arc<Slot>>,
    /// The slot's bytes are kept in the cache: store a right-sized copy, not a pool buffer.
    pub(crate) admitted: bool,
    /// Who reads the sample, if the task's worker does.
    pub(crate) read: WorkerRead,
    /// A cache hit: its bytes come from the read that admitted the sample.
    pub(crate) hit: bool,
    /// Read-then-decode: the peer node to fetch the sample from before storage.
    pub(crate) peer: Option<usize>,
}

/// A read the decode worker that takes a task makes itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkerRead {
    /// None: the bytes come with the task (a hit, or the dispatcher read them).
    No,
    /// Read-then-decode: a blocking read.
    Blocking,
    /// Pipelined: a read if the page cache holds the sample, else the dispatcher's.
    IfResident,
    /// A hit on a sample the cache left in the page cache: read it from there, or, if the
    /// page cache has let it go, from storage (the miss it then is).
    PageCacheHit,
}

/// Where a read's bytes live, which decides what the cache keeps of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A block of the reader's pool, which must go back to it: the cache keeps a copy.
    Pool,
    /// Memory of their own (a blocking read, a read into the arena or the heap): the cache
    /// keeps them as they are.
    Own,
    /// The page cache, which holds the sample: the cache keeps no copy, and its hits read it
    /// back from there.
    PageCache,
}

/// Samples at or above this size are large: the cache keeps them in its arena, and reads
/// of them not kept go to pool blocks. Smaller ones live on the heap, whose size classes
/// reuse freed memory without a page fault or a shared lock.
pub(crate) const LARGE_FROM_BYTES: usize = 64 << 10;

/// A cached sample's own copy, so pool buffers only hold samples in flight (the pool stays
/// small however large the cache). Large samples go to the cache's arena (whole pages, reused
/// after evictions, no mapping per sample) so that evicted ones do not fragment the heap over
/// a long run; small ones, which the allocator keeps in size classes, to the heap. Without an
/// arena, or when it is full, large samples get pages of their own, or the heap when the
/// system refuses another mapping (vm.max_map_count).
fn cache_copy(b: &Bytes, arena: Option<&Arena>) -> Bytes {
    if b.len() < LARGE_FROM_BYTES {
        return Bytes::copy_from_slice(b);
    }
    arena
        .and_then(|a| a.copy(b))
        .or_else(|| lobster_uring::copy_to_pages(b).ok())
        .unwrap_or_else(|| Bytes::copy_from_slice(b))
}

/// A hit on a sample left in the page cache, ready for a worker to read it there.
fn page_cache_hit(mut task: Task) -> Ready {
    task.read = WorkerRead::PageCacheHit;
    task.slot = None;
    Ready {
        task,
        bytes: Ok(Bytes::new()),
    }
}

/// A task whose bytes are known, waiting for a decode thread.
#[derive(Debug)]
pub(crate) struct Ready {
    pub(crate) task: Task,
    pub(crate) bytes: Loaded,
}

impl Slot {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Slot {
            state: Mutex::new(SlotState::Pending(Vec::new())),
        })
    }

    /// Parks `task` until the slot is filled, or returns it ready if it already is.
    pub(crate) fn wait(self: &Arc<Self>, mut task: Task) -> Option<Ready> {
        let mut state = lock(&self.state);
        match &mut *state {
            SlotState::Pending(waiters) => {
                waiters.push(task);
                None
            }
            SlotState::Ready(loaded) => {
                let bytes = loaded.clone();
                drop(state);
                task.slot = Some(self.clone());
                Some(Ready { task, bytes })
            }
            SlotState::InPageCache => Some(page_cache_hit(task)),
        }
    }

    /// Fills the slot and moves every task waiting on it into `released`. A sample the cache
    /// keeps (`admitted`) whose bytes hold a pool block is copied out of the pool first; one
    /// the page cache holds is not kept at all, and its hits are sent to read it there.
    pub(crate) fn fill(
        self: &Arc<Self>,
        loaded: Loaded,
        admitted: bool,
        origin: Origin,
        arena: Option<&Arena>,
        released: &mut Vec<Ready>,
    ) {
        if admitted && origin == Origin::PageCache && loaded.is_ok() {
            let waiters = self.settle(SlotState::InPageCache);
            released.extend(waiters.into_iter().map(page_cache_hit));
            return;
        }
        let loaded = match loaded {
            Ok(b) if admitted && origin == Origin::Pool => Ok(cache_copy(&b, arena)),
            other => other,
        };
        let waiters = self.settle(SlotState::Ready(loaded.clone()));
        released.extend(waiters.into_iter().map(|mut task| {
            task.slot = Some(self.clone());
            Ready {
                task,
                bytes: loaded.clone(),
            }
        }));
    }

    /// Moves a pending slot to `settled`, returning the tasks that waited on it.
    fn settle(&self, settled: SlotState) -> Vec<Task> {
        let mut state = lock(&self.state);
        match std::mem::replace(&mut *state, settled) {
            SlotState::Pending(waiters) => waiters,
            SlotState::Ready(_) | SlotState::InPageCache => {
                unreachable!("a slot is filled once")
            }
        }
    }

    /// The bytes, once read and if the read succeeded (what a peer's fetch is served).
    pub(crate) fn bytes(&self) -> Option<Bytes> {
        match &*lock(&self.state) {
            SlotState::Ready(Ok(b)) => Some(b.clone()),
            _ => None,
        }
    }

    /// The bytes a storage read admitted to the cache failed to decode (corrupt on the way,
    /// or bad on disk): later hits read storage instead, and the cached copy is freed.
    pub(crate) fn spoil(&self, error: Error) {
        let mut state = lock(&self.state);
        if let SlotState::Ready(loaded @ Ok(_)) = &mut *state {
            *loaded = Err(error);
        }
    }
}
