//! The cache's memory: one mapping, faulted in as used, carved into runs of whole pages that
//! go back to it when the last `Bytes` over them drops.
//!
//! A cached sample needs memory of its own for as long as the cache keeps it. A mapping per
//! sample costs two system calls, and each mmap and munmap takes the address space's lock for
//! writing, stalling every other thread's page faults; the heap serves large allocations with
//! mappings of their own for the same reason. One arena pays that once, reuses the pages of
//! evicted samples, and wastes less than a page per sample.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::file_ref::FileRef;
use crate::resident::{fill_nowait, Resident};
use crate::system::mapping::Mapping;

const PAGE_BYTES: usize = 4096;

/// Free runs of pages, by start (to merge neighbours) and by length (best fit).
#[derive(Debug, Default)]
struct Runs {
    by_start: BTreeMap<u32, u32>,
    by_len: BTreeSet<(u32, u32)>,
    free_pages: u64,
}

impl Runs {
    fn insert(&mut self, start: u32, pages: u32) {
        self.by_start.insert(start, pages);
        self.by_len.insert((pages, start));
    }

    fn remove(&mut self, start: u32, pages: u32) {
        self.by_start.remove(&start);
        self.by_len.remove(&(pages, start));
    }

    /// The smallest free run of at least `pages`, lowest first among equals, split.
    fn alloc(&mut self, pages: u32) -> Option<u32> {
        let &(len, start) = self.by_len.range((pages, 0)..).next()?;
        self.remove(start, len);
        if len > pages {
            self.insert(start + pages, len - pages);
        }
        self.free_pages -= u64::from(pages);
        Some(start)
    }

    /// Gives a run back, merged with free neighbours.
    fn free(&mut self, mut start: u32, mut pages: u32) {
        self.free_pages += u64::from(pages);
        if let Some((&before, &len)) = self.by_start.range(..start).next_back() {
            if before + len == start {
                self.remove(before, len);
                start = before;
                pages += len;
            }
        }
        if let Some(&len) = self.by_start.get(&(start + pages)) {
            self.remove(start + pages, len);
            pages += len;
        }
        self.insert(start, pages);
    }
}

#[derive(Debug)]
struct ArenaInner {
    mapping: Mapping,
    runs: Mutex<Runs>,
}

// SAFETY: the mapping is plain memory owned by the arena; a run is written only by the
// holder of its `Run` before it becomes `Bytes`, and read-only after, and the free runs are
// behind the mutex.
unsafe impl Send for ArenaInner {}
// SAFETY: as above.
unsafe impl Sync for ArenaInner {}

impl ArenaInner {
    fn lock(&self) -> MutexGuard<'_, Runs> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Memory for cached samples; see the module docs.
#[derive(Clone, Debug)]
pub struct Arena {
    inner: Arc<ArenaInner>,
}

/// A run of the arena this code owns until it becomes `Bytes`.
struct Run {
    arena: Arc<ArenaInner>,
    start: u32,
    pages: u32,
    len: usize,
}

impl Run {
    fn ptr(&self) -> *mut u8 {
        // SAFETY: the run lies inside the mapping.
        unsafe {
            self.arena
                .mapping
                .base()
                .as_ptr()
                .add(self.start as usize * PAGE_BYTES)
        }
    }
}

impl AsRef<[u8]> for Run {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the run were written before it became `Bytes`, and
        // nothing writes to it since.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.arena.lock().free(self.start, self.pages);
    }
}

impl Arena {
    /// An arena of `budget_bytes` (rounded up to a page) of address space; pages come into
    /// memory when a run first uses them.
    ///
    /// # Errors
    /// The mapping cannot be made, or the budget is over 16 TiB.
    pub fn new(budget_bytes: usize) -> io::Result<Arena> {
        let pages = budget_bytes.div_ceil(PAGE_BYTES).max(1);
        let pages32 =
            u32::try_from(pages).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // Not MADV_HUGEPAGE: where THP defragments on madvise (the default), a fault may stall
        // in compaction, and measured no faster here.
        let mapping = Mapping::new(pages * PAGE_BYTES, false)?;
        let mut runs = Runs::default();
        runs.free(0, pages32);
        Ok(Arena {
            inner: Arc::new(ArenaInner {
                mapping,
                runs: Mutex::new(runs),
            }),
        })
    }

    /// Bytes of the arena not in a run now.
    pub fn free_bytes(&self) -> u64 {
        self.inner.lock().free_pages * PAGE_BYTES as u64
    }

    /// Gives the pages of every free run back to the system; returns the bytes given (free
    /// bytes, resident or not). Runs are handed out best fit, so over a long run they touch
    /// more and more of the arena though the cache holds no more; a loader calls this once
    /// an epoch so that resident memory follows what the cache holds.
    pub fn release_free_pages(&self) -> u64 {
        let runs = self.inner.lock();
        for (&start, &pages) in &runs.by_start {
            // SAFETY: a free run belongs to no `Run` and no `Bytes`, and the lock keeps it
            // from being handed out meanwhile; the arena is never registered with a ring.
            unsafe {
                self.inner
                    .mapping
                    .release(start as usize * PAGE_BYTES, pages as usize * PAGE_BYTES);
            }
        }
        runs.free_pages * PAGE_BYTES as u64
    }

    fn run(&self, len: usize) -> Option<Run> {
        let pages = u32::try_from(len.div_ceil(PAGE_BYTES).max(1)).ok()?;
        let start = self.inner.lock().alloc(pages)?;
        Some(Run {
            arena: self.inner.clone(),
            start,
            pages,
            len: 0,
        })
    }

    /// A copy of `bytes` in the arena; `None` when no free run is long enough.
    pub fn copy(&self, bytes: &[u8]) -> Option<Bytes> {
        let mut run = self.run(bytes.len())?;
        // SAFETY: the run is ours and holds at least `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), run.ptr(), bytes.len()) };
        run.len = bytes.len();
        Some(Bytes::from_owner(run))
    }

    /// [`crate::read_resident`] into a run of the arena: `None` when no free run holds
    /// `len` bytes.
    ///
    /// # Errors
    /// As [`crate::read_resident`].
    pub fn read_resident<'a>(
        &self,
        file: impl Into<FileRef<'a>>,
        offset: u64,
        len: usize,
    ) -> io::Result<Option<Resident>> {
        let file = file.into();
        let path = file.path;
        let file = file.open(0).map_err(|e| named(path, e))?;
        let Some(mut run) = self.run(len) else {
            return Ok(None);
        };
        // SAFETY: the run is ours and holds `len` bytes.
        let filled =
            unsafe { fill_nowait(&file, offset, run.ptr(), len) }.map_err(|e| named(path, e))?;
        Ok(Some(filled.resident(|n| {
            run.len = n;
            (Bytes::from_owner(run), false)
        })))
    }
}

fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn free_runs_leave_memory_and_live_ones_keep_their_bytes() {
        let arena = Arena::new(64 * PAGE_BYTES).unwrap();
        let live: Vec<Bytes> = (0..8u8)
            .map(|i| arena.copy(&vec![i + 1; 3 * PAGE_BYTES]).unwrap())
            .collect();
        let freed: Vec<Bytes> = (0..8u8)
            .map(|i| arena.copy(&vec![i + 100; 3 * PAGE_BYTES]).unwrap())
            .collect();
        assert_eq!(arena.inner.mapping.resident_pages(), 48);
        drop(freed);
        let given = arena.release_free_pages();
        assert_eq!(given, arena.free_bytes());
        assert_eq!(
            arena.inner.mapping.resident_pages(),
            24,
            "only the live runs stay"
        );
        for (i, b) in live.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8 + 1));
        }
        // Released pages serve a run again, with what it is given.
        let again = arena.copy(&vec![9u8; 40 * PAGE_BYTES]).unwrap();
        assert!(again.iter().all(|&x| x == 9));
    }

    #[test]
    fn runs_match_a_reference_model_and_coalesce_back_whole() {
        // Reference: a page map of who holds each page.
        let total = 256u32;
        let mut runs = Runs::default();
        runs.free(0, total);
        let mut held: Vec<(u32, u32)> = Vec::new();
        let mut owner = vec![false; total as usize];
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..20_000 {
            if rng.gen_bool(0.55) {
                let pages = rng.gen_range(1..20);
                // A best fit exists exactly when some free stretch is long enough.
                let longest = owner
                    .split(|&o| o)
                    .map(|s| s.len() as u32)
                    .max()
                    .unwrap_or(0);
                match runs.alloc(pages) {
                    Some(start) => {
                        assert!(pages <= longest);
                        for p in start..start + pages {
                            assert!(!owner[p as usize], "page {p} handed out twice");
                            owner[p as usize] = true;
                        }
                        held.push((start, pages));
                    }
                    None => assert!(pages > longest, "{pages} pages fit in {longest}"),
                }
            } else if !held.is_empty() {
                let (start, pages) = held.swap_remove(rng.gen_range(0..held.len()));
                for p in start..start + pages {
                    owner[p as usize] = false;
                }
                runs.free(start, pages);
            }
            let free = owner.iter().filter(|&&o| !o).count() as u64;
            assert_eq!(runs.free_pages, free);
        }
        for (start, pages) in held.drain(..) {
            runs.free(start, pages);
        }
        assert_eq!(
            runs.by_start.len(),
            1,
            "everything merged back into one run"
        );
        assert_eq!(runs.by_start.get(&0), Some(&total));
    }

    #[test]
    fn copies_hold_their_bytes_and_give_their_pages_back() {
        let arena = Arena::new(64 << 10).unwrap();
        let a: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let b = vec![9u8; 40_000];
        let ca = arena.copy(&a).unwrap();
        let cb = arena.copy(&b).unwrap();
        assert_eq!((&ca[..], &cb[..]), (&a[..], &b[..]));
        // 3 + 10 pages of 16 in use: a 4-page copy no longer fits.
        assert_eq!(arena.free_bytes(), 3 * 4096);
        assert!(arena.copy(&[1u8; 13_000]).is_none());
        drop(cb);
        assert!(arena.copy(&[1u8; 13_000]).is_some());
        drop(ca);
        assert_eq!(arena.free_bytes(), 64 << 10);
    }

    #[test]
    fn a_resident_read_lands_in_the_arena() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let arena = Arena::new(1 << 20).unwrap();
        match arena.read_resident(&path, 0, data.len() + 1).unwrap() {
            Some(Resident::Read { bytes, pooled }) => {
                assert_eq!(&bytes[..], &data[..]);
                assert!(!pooled);
                // 70,001 bytes take 18 pages.
                assert_eq!(arena.free_bytes(), (256 - 18) * 4096);
            }
            Some(Resident::Unsupported) => eprintln!("skipped: RWF_NOWAIT refused"),
            other => panic!("{other:?}"),
        }
        assert_eq!(arena.free_bytes(), 1 << 20);
        assert!(Arena::new(8192)
            .unwrap()
            .read_resident(&path, 0, data.len() + 1)
            .unwrap()
            .is_none());
    }
}
