//! The buffer pool: a byte budget in one pre-faulted mapping, carved into power-of-two blocks
//! by a buddy allocator and handed out as `Bytes` without copying.
//!
//! - **Committed up front.** The mapping is populated at creation (`MAP_POPULATE`, then one
//!   write per page), so the whole budget is resident from the start and resident memory does
//!   not creep up as larger samples pass through.
//! - **Blocks** are `2^k` pages of [`PAGE_BYTES`], at an offset from the page-aligned start
//!   that is a multiple of their size (so every block meets any O_DIRECT memory alignment up
//!   to a page), from one page up to the largest block class: the next power of two pages at
//!   or above the largest read accepted.
//! - **Internal fragmentation** is below 2x: a read of `len` bytes gets the smallest block
//!   holding it, which is less than twice `len` rounded up to a page.
//! - **External fragmentation** is undone by coalescing: a freed block merges with its free
//!   buddy, repeatedly, so any aligned run of free pages is one block again. With `n` blocks
//!   live, at least `budget / largest block - n` largest blocks are free.
//! - **Waiting** is FIFO: [`Pool::acquire`] queues behind earlier waiters even when a block
//!   of its own size is free, so a large request is not starved by a stream of small ones;
//!   [`Pool::try_acquire`] fails while anyone waits.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;

use crate::system::mapping::Mapping;

/// The allocation unit: blocks are whole pages.
pub(crate) const PAGE_BYTES: usize = 4096;
/// Alignment of every block's start: at least a page, which covers every O_DIRECT memory
/// alignment we accept.
pub(crate) const BUFFER_ALIGN: usize = PAGE_BYTES;
/// Largest budget a pool accepts (pages are counted in `u32`, and the budget is resident).
pub(crate) const POOL_BYTES_MAX: usize = 64 << 30;

/// The pool block a read of `len` bytes takes: the next power of two pages at or above it.
/// A pool of `n` such blocks ([`ReaderConfig::pool_bytes`](crate::ReaderConfig::pool_bytes))
/// holds `n` reads of `len` bytes at once.
pub fn block_bytes(len: usize) -> usize {
    len.max(1).div_ceil(PAGE_BYTES).next_power_of_two() * PAGE_BYTES
}

fn order_of(len: usize) -> u32 {
    (block_bytes(len) / PAGE_BYTES).trailing_zeros()
}

/// A pool of `budget_bytes` handing out blocks for reads of up to `max_read_bytes`.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    /// Unmapped with the last Arc: every PoolBuf holds one, and a session holds the Pool
    /// until its last read left the kernel, so nothing (the kernel included) uses it then.
    mapping: Mapping,
    state: Mutex<Buddy>,
    available: Condvar,
    /// Faulted in at creation: its pages stay, whatever is free.
    committed: bool,
}

// SAFETY: the mapping is owned by PoolInner and each block is handed to at most one PoolBuf
// at a time (the buddy state is behind a Mutex), so sharing the base pointer is sound.
unsafe impl Send for PoolInner {}
// SAFETY: see Send; PoolInner itself only exposes the pointer through PoolBuf ownership.
unsafe impl Sync for PoolInner {}

/// The buddy allocator's state, in pages, plus the FIFO of waiters.
#[derive(Debug)]
struct Buddy {
    pages: u32,
    max_order: u32,
    /// Free blocks by order (block of `2^order` pages), by first page; lowest address first.
    free: Vec<BTreeSet<u32>>,
    free_pages: u32,
    /// Tickets of the threads waiting in `acquire`, oldest first.
    waiters: VecDeque<u64>,
    next_ticket: u64,
    /// A ring holds the pool's pages pinned (a registered buffer): they must stay where
    /// they are.
    registered: bool,
}

impl Buddy {
    fn new(pages: u32, max_order: u32) -> Buddy {
        let mut free = vec![BTreeSet::new(); max_order as usize + 1];
        // Cut [0, pages) into the largest aligned blocks that fit, at most max_order.
        let mut page = 0u32;
        while page < pages {
            let mut order = max_order.min(page.trailing_zeros());
            while page as u64 + (1u64 << order) > pages as u64 {
                order -= 1;
            }
            free[order as usize].insert(page);
            page += 1 << order;
        }
        Buddy {
            pages,
            max_order,
            free,
            free_pages: pages,
            waiters: VecDeque::new(),
            next_ticket: 0,
            registered: false,
        }
    }

    /// Takes the lowest free block of the smallest sufficient order, split down to `order`.
    fn alloc(&mut self, order: u32) -> Option<u32> {
        let from = (order..=self.max_order).find(|&o| !self.free[o as usize].is_empty())?;
        let page = self.free[from as usize].pop_first()?;
        for o in (order..from).rev() {
            self.free[o as usize].insert(page + (1 << o));
        }
        self.free_pages -= 1 << order;
        debug_assert!(
            self.free_pages <= self.pages,
            "more handed out than the budget"
        );
        Some(page)
    }

    /// Returns a block, merging it with its buddy for as long as the buddy is free.
    fn release(&mut self, mut page: u32, mut order: u32) {
        self.free_pages += 1 << order;
        debug_assert!(self.free_pages <= self.pages, "a block was returned twice");
        while order < self.max_order {
            let buddy = page ^ (1 << order);
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            page = page.min(buddy);
            order += 1;
        }
        let fresh = self.free[order as usize].insert(page);
        debug_assert!(fresh, "block {page} of order {order} freed twice");
    }

    fn largest_free_order(&self) -> Option<u32> {
        (0..=self.max_order)
            .rev()
            .find(|&o| !self.free[o as usize].is_empty())
    }
}

impl Pool {
    /// Maps and pre-faults `budget_bytes` (rounded up to a page) for reads of up to
    /// `max_read_bytes`. The caller checks that the budget holds one largest block.
    #[cfg(test)]
    pub(crate) fn new(budget_bytes: usize, max_read_bytes: usize) -> std::io::Result<Pool> {
        Pool::with_commit(budget_bytes, max_read_bytes, true)
    }

    /// [`Pool::new`]; with `commit` false the pages are faulted in when a block first uses
    /// them. Blocks are handed out lowest address first, so the pages touched are the most
    /// the pool ever held at once, not its whole budget.
    pub(crate) fn with_commit(
        budget_bytes: usize,
        max_read_bytes: usize,
        commit: bool,
    ) -> std::io::Result<Pool> {
        let max_block = block_bytes(max_read_bytes);
        let map_len = budget_bytes.div_ceil(PAGE_BYTES) * PAGE_BYTES;
        let pages = u32::try_from(map_len / PAGE_BYTES)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        if map_len < max_block || map_len > POOL_BYTES_MAX {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mapping = Mapping::new(map_len, commit)?;
        let base = mapping.base();
        // MAP_POPULATE does not report a partial population: touch every page so the budget
        // is committed now rather than on first use (a no-op for pages already present).
        for page in (0..map_len / PAGE_BYTES).filter(|_| commit) {
            // SAFETY: the offset is inside the fresh mapping, which nothing else uses yet.
            unsafe { base.as_ptr().add(page * PAGE_BYTES).write_volatile(0) };
        }
        Ok(Pool {
            inner: Arc::new(PoolInner {
                mapping,
                state: Mutex::new(Buddy::new(pages, (max_block / PAGE_BYTES).trailing_zeros())),
                available: Condvar::new(),
                committed: commit,
            }),
        })
    }

    /// The budget: bytes mapped, committed, and handed out at most.
    pub(crate) fn budget_bytes(&self) -> usize {
        self.inner.mapping.len()
    }

    /// The largest block: the largest read this pool can hold.
    #[cfg(test)]
    pub(crate) fn max_block_bytes(&self) -> usize {
        PAGE_BYTES << self.inner.lock().max_order
    }

    /// Bytes in free blocks.
    pub(crate) fn free_bytes(&self) -> usize {
        self.inner.lock().free_pages as usize * PAGE_BYTES
    }

    /// The largest block that is free now (0 if none).
    pub(crate) fn largest_free_bytes(&self) -> usize {
        self.inner
            .lock()
            .largest_free_order()
            .map_or(0, |o| PAGE_BYTES << o)
    }

    /// Runs `register` (a ring's registration of the pool, which pins its pages) with no
    /// release of free pages under way, and none after it: a pinned page released would go
    /// on receiving reads the mapping no longer shows.
    pub(crate) fn registering<R>(&self, register: impl FnOnce() -> R) -> R {
        let mut s = self.inner.lock();
        s.registered = true;
        register()
    }

    /// Gives the pages of the free blocks back to the system, unless the pool is committed
    /// or registered with a ring; returns the bytes given. Blocks go lowest address first,
    /// but a burst of large reads touches pages the steady state never needs again; a
    /// loader calls this once an epoch so that resident memory follows what is in flight.
    pub(crate) fn release_free_pages(&self) -> usize {
        let s = self.inner.lock();
        if self.inner.committed || s.registered {
            return 0;
        }
        let mut blocks: Vec<(u32, u32)> = s
            .free
            .iter()
            .enumerate()
            .flat_map(|(order, set)| set.iter().map(move |&p| (p, 1u32 << order)))
            .collect();
        blocks.sort_unstable();
        // Neighbouring free blocks of different orders, one call each run.
        let mut runs: Vec<(u32, u32)> = Vec::with_capacity(blocks.len());
        for (page, pages) in blocks {
            match runs.last_mut() {
                Some((start, len)) if *start + *len == page => *len += pages,
                _ => runs.push((page, pages)),
            }
        }
        for &(page, pages) in &runs {
            // SAFETY: a free block belongs to no `PoolBuf` and no read in flight (a read
            // holds its block's `PoolBuf` until its completion is reaped), the lock keeps it
            // from being handed out meanwhile, and the pool is not registered, so no ring
            // holds its pages pinned.
            unsafe {
                self.inner
                    .mapping
                    .release(page as usize * PAGE_BYTES, pages as usize * PAGE_BYTES);
            }
        }
        s.free_pages as usize * PAGE_BYTES
    }

    /// Threads waiting in [`Pool::acquire`].
    pub(crate) fn waiters(&self) -> usize {
        self.inner.lock().waiters.len()
    }

    /// The whole mapping as one iovec (for `register_buffers`: a `READ_FIXED` with buffer
    /// index 0 may then target any address inside it).
    pub(crate) fn iovec(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.inner.mapping.base().as_ptr().cast(),
            iov_len: self.inner.mapping.len(),
        }
    }

    fn buf(&self, page: u32, len: usize) -> PoolBuf {
        PoolBuf {
            pool: self.inner.clone(),
            page,
            order: order_of(len),
        }
    }

    /// A block for `len` bytes, waiting (behind every earlier waiter) until one is free.
    ///
    /// # Panics
    /// If `len` exceeds the largest block: no wait could satisfy it.
    pub(crate) fn acquire(&self, len: usize) -> PoolBuf {
        let order = order_of(len);
        let mut s = self.inner.lock();
        assert!(
            order <= s.max_order,
            "a read of {len} bytes exceeds the pool's largest block"
        );
        if s.waiters.is_empty() {
            if let Some(page) = s.alloc(order) {
                return self.buf(page, len);
            }
        }
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.waiters.push_back(ticket);
        loop {
            s = self
                .inner
                .available
                .wait(s)
                .unwrap_or_else(|e| e.into_inner());
            if s.waiters.front() != Some(&ticket) {
                continue;
            }
            if let Some(page) = s.alloc(order) {
                s.waiters.pop_front();
                // The next waiter may fit in what is left.
                if !s.waiters.is_empty() {
                    self.inner.available.notify_all();
                }
                return self.buf(page, len);
            }
        }
    }

    /// A block for `len` bytes if one is free and nobody is waiting (`None` also when `len`
    /// exceeds the largest block).
    pub(crate) fn try_acquire(&self, len: usize) -> Option<PoolBuf> {
        let order = order_of(len);
        let mut s = self.inner.lock();
        if order > s.max_order || !s.waiters.is_empty() {
            return None;
        }
        let page = s.alloc(order)?;
        Some(self.buf(page, len))
    }
}

impl PoolInner {
    fn lock(&self) -> MutexGuard<'_, Buddy> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn block_ptr(&self, page: u32) -> *mut u8 {
        debug_assert!((page as usize) < self.mapping.len() / PAGE_BYTES);
        // SAFETY: the page is inside the mapping.
        unsafe { self.mapping.base().as_ptr().add(page as usize * PAGE_BYTES) }
    }
}

/// Exclusive ownership of one block; returns it to the pool on drop.
#[derive(Debug)]
pub(crate) struct PoolBuf {
    pool: Arc<PoolInner>,
    page: u32,
    order: u32,
}

impl PoolBuf {
    /// Bytes in the block (at least the length it was acquired for).
    pub(crate) fn capacity(&self) -> usize {
        PAGE_BYTES << self.order
    }

    /// Start of the block. Writing through it is allowed while this `PoolBuf` is owned and
    /// no `Bytes` made from it exists.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.pool.block_ptr(self.page)
    }

    /// Hands out `[start, start + len)` of the block as `Bytes`, without copying. The block
    /// returns to the pool when the last clone of the `Bytes` drops.
    pub(crate) fn into_bytes(self, start: usize, len: usize) -> Bytes {
        assert!(start + len <= self.capacity(), "slice outside the block");
        Bytes::from_owner(PoolSlice {
            buf: self,
            start,
            len,
        })
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        let mut s = self.pool.lock();
        s.release(self.page, self.order);
        let wake = !s.waiters.is_empty();
        drop(s);
        if wake {
            // Only the oldest waiter may take it; it must hear of it whatever the others do.
            self.pool.available.notify_all();
        }
    }
}

struct PoolSlice {
    buf: PoolBuf,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for PoolSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the range is inside the block (checked in into_bytes); the block is owned
        // by this slice and no longer written (its read completed before into_bytes).
        unsafe {
            std::slice::from_raw_parts(
                self.buf.pool.block_ptr(self.buf.page).add(self.start),
                self.len,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn page_of(pool: &Pool, buf: &mut PoolBuf) -> usize {
        (buf.as_mut_ptr() as usize - pool.inner.mapping.base().as_ptr() as usize) / PAGE_BYTES
    }

    #[test]
    fn free_blocks_leave_memory_unless_the_pool_is_committed_or_registered() {
        let fill = |pool: &Pool| -> Vec<Bytes> {
            (0..8u8)
                .map(|i| {
                    let mut b = pool.acquire(PAGE_BYTES * 2);
                    // SAFETY: the block is this test's, two pages long.
                    unsafe { std::ptr::write_bytes(b.as_mut_ptr(), i + 1, 2 * PAGE_BYTES) };
                    b.into_bytes(0, 2 * PAGE_BYTES)
                })
                .collect()
        };
        let pool = Pool::with_commit(64 * PAGE_BYTES, 4 * PAGE_BYTES, false).unwrap();
        let mut held = fill(&pool);
        assert_eq!(pool.inner.mapping.resident_pages(), 16);
        let kept: Vec<Bytes> = held.drain(..).step_by(2).collect();
        assert_eq!(pool.release_free_pages(), pool.free_bytes());
        assert_eq!(
            pool.inner.mapping.resident_pages(),
            8,
            "only the held blocks stay"
        );
        for (b, i) in kept.iter().zip((0..8u8).step_by(2)) {
            assert!(b.iter().all(|&x| x == i + 1));
        }

        let committed = Pool::with_commit(64 * PAGE_BYTES, 4 * PAGE_BYTES, true).unwrap();
        assert_eq!(committed.release_free_pages(), 0);
        assert_eq!(committed.inner.mapping.resident_pages(), 64);

        let registered = Pool::with_commit(64 * PAGE_BYTES, 4 * PAGE_BYTES, false).unwrap();
        drop(fill(&registered));
        registered.registering(|| ());
        assert_eq!(registered.release_free_pages(), 0);
        assert_eq!(
            registered.inner.mapping.resident_pages(),
            16,
            "pinned pages stay"
        );
    }

    fn wait_for_waiters(pool: &Pool, n: usize) {
        while pool.waiters() < n {
            std::thread::yield_now();
        }
    }

    #[test]
    fn blocks_are_powers_of_two_pages_aligned_to_their_size() {
        assert_eq!(block_bytes(0), 4096);
        assert_eq!(block_bytes(1), 4096);
        assert_eq!(block_bytes(4096), 4096);
        assert_eq!(block_bytes(4097), 8192);
        assert_eq!(block_bytes(3 * 4096), 4 * 4096);
        let pool = Pool::new(1 << 20, 100_000).unwrap();
        assert_eq!(pool.max_block_bytes(), 128 << 10);
        let mut held = Vec::new();
        for len in [5000, 1, 100_000, 4096, 70_000, 9000] {
            let mut b = pool.try_acquire(len).unwrap();
            assert_eq!(b.capacity(), block_bytes(len));
            assert!(b.capacity() < 2 * len.div_ceil(PAGE_BYTES) * PAGE_BYTES);
            assert_eq!(b.as_mut_ptr() as usize % BUFFER_ALIGN, 0, "page-aligned");
            assert_eq!(
                page_of(&pool, &mut b) * PAGE_BYTES % b.capacity(),
                0,
                "buddy-aligned"
            );
            held.push(b);
        }
        assert!(
            pool.try_acquire((128 << 10) + 1).is_none(),
            "over the largest block"
        );
    }

    #[test]
    fn blocks_return_on_last_drop_of_their_bytes() {
        let pool = Pool::new(2 * 8192, 5000).unwrap();
        let mut a = pool.acquire(5000);
        // SAFETY: `a` is exclusively owned and holds 8192 bytes.
        unsafe { std::ptr::write_bytes(a.as_mut_ptr(), 7, 100) };
        let b = pool.acquire(8192);
        assert!(pool.try_acquire(1).is_none());
        let bytes = a.into_bytes(10, 20);
        let clone = bytes.slice(5..);
        assert_eq!(&bytes[..], &[7u8; 20][..]);
        drop(bytes);
        assert_eq!(pool.free_bytes(), 0, "a clone still refers to the block");
        drop(clone);
        assert_eq!(pool.free_bytes(), 8192);
        drop(b);
        assert_eq!(pool.free_bytes(), 2 * 8192);
    }

    #[test]
    fn the_whole_budget_is_resident_after_creation() {
        let pool = Pool::new(3 << 20, 1 << 20).unwrap();
        let pages = pool.budget_bytes() / PAGE_BYTES;
        let resident = resident_pages(&pool);
        assert_eq!(
            resident,
            pages,
            "{} of {pages} pages are not resident",
            pages - resident
        );
    }

    /// Pages of the pool's mapping in memory now.
    fn resident_pages(pool: &Pool) -> usize {
        let pages = pool.budget_bytes() / PAGE_BYTES;
        let mut resident = vec![0u8; pages];
        // SAFETY: the range is the pool's mapping and `resident` has one byte per page.
        let rc = unsafe {
            libc::mincore(
                pool.inner.mapping.base().as_ptr().cast(),
                pool.budget_bytes(),
                resident.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        resident.iter().filter(|&&r| r & 1 == 1).count()
    }

    #[test]
    fn an_uncommitted_pool_holds_in_memory_only_the_pages_its_blocks_used() {
        let pool = Pool::with_commit(8 << 20, 1 << 20, false).unwrap();
        assert_eq!(resident_pages(&pool), 0);
        // Blocks used and given back, again and again: the lowest ones are reused, so the
        // pages touched are the most held at once (three 64 KiB blocks), not the budget.
        for _ in 0..50 {
            let mut held: Vec<PoolBuf> =
                (0..3).map(|_| pool.try_acquire(60_000).unwrap()).collect();
            for b in &mut held {
                // SAFETY: the block is ours, `capacity` bytes long.
                unsafe { std::ptr::write_bytes(b.as_mut_ptr(), 7, b.capacity()) };
            }
        }
        assert_eq!(resident_pages(&pool), 3 * 16);
    }

    #[test]
    fn freed_blocks_coalesce_back_into_largest_blocks() {
        let pool = Pool::new(4 * 65536 + 3 * 4096, 65536).unwrap();
        // The tail that is not a whole largest block is cut into smaller aligned blocks.
        assert_eq!(pool.largest_free_bytes(), 65536);
        let mut rng = StdRng::seed_from_u64(11);
        let mut held = Vec::new();
        while let Some(b) = pool.try_acquire(1 + rng.gen_range(0..20_000) as usize) {
            held.push(b);
        }
        assert!(pool.largest_free_bytes() < 65536);
        while !held.is_empty() {
            held.swap_remove(rng.gen_range(0..held.len() as u64) as usize);
        }
        assert_eq!(pool.free_bytes(), pool.budget_bytes());
        let big: Vec<_> = (0..4).map(|_| pool.try_acquire(65536).unwrap()).collect();
        assert_eq!(big.len(), 4, "every largest block came back whole");
        assert!(pool.try_acquire(65536).is_none());
        assert_eq!(pool.free_bytes(), 3 * 4096);
    }

    #[test]
    fn acquire_waits_for_a_returned_block() {
        let pool = Pool::new(4096, 4096).unwrap();
        let held = pool.acquire(4096);
        let p2 = pool.clone();
        let t = std::thread::spawn(move || p2.acquire(10).capacity());
        wait_for_waiters(&pool, 1);
        drop(held);
        assert_eq!(t.join().unwrap(), 4096);
    }

    #[test]
    fn a_large_waiter_is_served_before_later_small_ones() {
        // Two largest blocks, each spoiled by one small block.
        let pool = Pool::new(2 * 65536, 65536).unwrap();
        let low = pool.acquire(4096);
        let fill = [4096, 8192, 16384, 32768].map(|len| pool.acquire(len));
        let high = pool.acquire(4096);
        drop(fill);
        assert!(pool.largest_free_bytes() < 65536 && pool.free_bytes() > 4096);
        let spawn = |len: usize| {
            let pool = pool.clone();
            std::thread::spawn(move || pool.acquire(len))
        };
        let big = spawn(65536);
        wait_for_waiters(&pool, 1);
        let small = spawn(4096);
        wait_for_waiters(&pool, 2);
        // A small block is free, yet the small request waits behind the large one.
        assert!(
            pool.try_acquire(4096).is_none(),
            "try_acquire must not jump the queue"
        );
        pool.inner.available.notify_all();
        assert_eq!(
            pool.waiters(),
            2,
            "a wake-up must not let the small request pass"
        );
        drop(low);
        let big = big.join().unwrap();
        let small = small.join().unwrap();
        assert_eq!(big.capacity(), 65536);
        drop((big, small, high));
        assert_eq!(pool.free_bytes(), pool.budget_bytes());
    }

    /// Random acquire/free sequences against a page map: blocks never overlap, are aligned
    /// to their size, stay inside the budget, and `try_acquire` fails exactly when no aligned
    /// run of free pages of the block's size exists.
    #[test]
    fn random_sequences_agree_with_a_page_map() {
        for (seed, budget_pages, max_read) in [
            (1u64, 64usize, 65536usize),
            (2, 37, 32768),
            (3, 200, 131072),
            (4, 5, 16384),
        ] {
            let pool = Pool::new(budget_pages * PAGE_BYTES, max_read).unwrap();
            let max_pages = pool.max_block_bytes() / PAGE_BYTES;
            let mut used = vec![false; budget_pages];
            let mut held: Vec<(PoolBuf, usize, usize)> = Vec::new();
            let mut rng = StdRng::seed_from_u64(seed);
            for _ in 0..20_000 {
                if !held.is_empty() && rng.gen_range(0..100) < 45 {
                    let (b, first, n) =
                        held.swap_remove(rng.gen_range(0..held.len() as u64) as usize);
                    drop(b);
                    used[first..first + n].iter_mut().for_each(|u| *u = false);
                } else {
                    let len = 1 + rng.gen_range(0..max_read as u64) as usize;
                    let n = block_bytes(len) / PAGE_BYTES;
                    let fits = (0..budget_pages)
                        .step_by(n)
                        .any(|p| p + n <= budget_pages && used[p..p + n].iter().all(|u| !u));
                    match pool.try_acquire(len) {
                        Some(mut b) => {
                            let first = page_of(&pool, &mut b);
                            assert_eq!(b.capacity(), n * PAGE_BYTES);
                            assert_eq!(first % n, 0, "aligned to its size");
                            assert!(first + n <= budget_pages, "inside the budget");
                            assert!(
                                used[first..first + n].iter().all(|u| !u),
                                "seed {seed}: block at page {first} overlaps a live block"
                            );
                            used[first..first + n].iter_mut().for_each(|u| *u = true);
                            held.push((b, first, n));
                        }
                        None => assert!(!fits, "seed {seed}: {n} free aligned pages refused"),
                    }
                }
                let in_use = used.iter().filter(|&&u| u).count();
                assert_eq!(pool.free_bytes(), (budget_pages - in_use) * PAGE_BYTES);
            }
            held.clear();
            assert_eq!(pool.free_bytes(), pool.budget_bytes());
            if budget_pages >= max_pages {
                assert!(
                    pool.try_acquire(max_read).is_some(),
                    "coalesced after all frees"
                );
            }
        }
    }

    #[test]
    fn concurrent_holders_never_share_a_page() {
        let pool = Pool::new(64 * PAGE_BYTES, 8 * PAGE_BYTES).unwrap();
        let owner: Arc<Vec<AtomicUsize>> = Arc::new((0..64).map(|_| AtomicUsize::new(0)).collect());
        let threads: Vec<_> = (1..=4usize)
            .map(|id| {
                let (pool, owner) = (pool.clone(), owner.clone());
                std::thread::spawn(move || {
                    let mut rng = StdRng::seed_from_u64(id as u64 * 77);
                    for _ in 0..2000 {
                        let len = 1 + rng.gen_range(0..8 * PAGE_BYTES as u64) as usize;
                        let mut b = pool.acquire(len);
                        let first = page_of(&pool, &mut b);
                        let n = b.capacity() / PAGE_BYTES;
                        for o in &owner[first..first + n] {
                            assert_eq!(o.swap(id, Ordering::SeqCst), 0, "page shared");
                        }
                        std::thread::yield_now();
                        for o in &owner[first..first + n] {
                            o.store(0, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(pool.free_bytes(), pool.budget_bytes());
    }
}
