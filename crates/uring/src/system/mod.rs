//! What a loader asks of the system besides reads, none of it io_uring's: the memory a node
//! cache keeps samples in once their reads are over (apart from the reader's pool, which only
//! holds reads in flight and the bytes they became), and the scheduling class of its
//! background threads.
//!
//! - [`arena::Arena`]: one mapping for the cache's large samples, faulted in as used and
//!   carved into runs of whole pages that go back to it when their last `Bytes` drops (no
//!   mapping, and no address-space lock, per sample).
//! - [`pages::copy_to_pages`]: a copy in a mapping of its own, for when there is no arena or
//!   it is full.
//! - [`mapping::Mapping`]: the private anonymous mapping under both, and under the pool.
//! - [`threads::run_as_batch`]: `SCHED_BATCH` for the calling thread.
//! - [`heap::release_free_heap`]: the C heap's free pages back to the system, once an epoch;
//!   [`heap::hold_heap`]: the C heap's mmap and trim thresholds and its arenas held
//!   where [`heap::HeapLimits`] set them.
//!
//! Nothing here touches io_uring; the crate re-exports `Arena`, `copy_to_pages`,
//! `run_as_batch`, `release_free_heap`, `hold_heap` and `HeapLimits` at its root.

pub(crate) mod arena;
pub(crate) mod heap;
pub(crate) mod mapping;
pub(crate) mod pages;
pub(crate) mod threads;
