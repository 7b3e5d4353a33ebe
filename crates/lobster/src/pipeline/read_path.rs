//! The automatic choice of where a miss is read: on the decode worker when the page cache
//! holds the sample (a copy, no hand-off), or by the dispatcher.
//!
//! The planner tries the worker path window by window. Workers count what they tried and
//! what was resident; a try that finds the sample not resident reads it from storage on the
//! worker, blocking it for one read. While most tries miss the page cache the planner sends
//! misses straight to the dispatcher, and tries again after a backoff that doubles each time.
//!
//! A sample the cache admits that a worker found in the page cache stays there: the cache
//! keeps no copy of it (a copy would cost a page of fresh memory per 4 KiB and hold the
//! bytes twice), and its hits read it back from the page cache. The plan, and so every hit
//! and miss, is unchanged. If the page cache lets such samples go (their hits then read
//! storage, counted as the misses they are), the cache keeps copies from then on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Tries needed before their outcome counts.
const TRIES_MIN: u64 = 16;
/// Windows the planner waits before trying again, at first and at most.
const BACKOFF_WINDOWS_FIRST: u32 = 4;
const BACKOFF_WINDOWS_MAX: u32 = 256;

/// What the decode workers saw, read by the planner and the metrics.
#[derive(Debug, Default)]
pub(crate) struct ReadPathCounters {
    /// Misses a worker tried to read from the page cache.
    pub(crate) tried: AtomicU64,
    /// Of those, read on the worker.
    pub(crate) resident: AtomicU64,
    /// Reads the dispatcher made (planned there, or tried and not resident).
    pub(crate) dispatched: AtomicU64,
    /// Admitted samples the cache left in the page cache.
    pub(crate) left_in_page_cache: AtomicU64,
    /// Hits on those read back from the page cache, and read from storage because the page
    /// cache had let them go.
    pub(crate) page_cache_hits: AtomicU64,
    pub(crate) page_cache_lost: AtomicU64,
    /// Set from the start where the config rules it out, or once the page cache lost too
    /// many: admitted samples get copies from then on.
    pub(crate) copies_only: AtomicBool,
}

/// Lost hits at which the page cache stops holding the cache's samples, and the share of
/// its hits (one in this many) they must also reach.
const LOST_MIN: u64 = 16;
const LOST_SHARE: u64 = 16;

impl ReadPathCounters {
    /// Counters for a loader whose cache may (`leave`) keep samples in the page cache.
    pub(crate) fn new(leave: bool) -> Self {
        ReadPathCounters {
            copies_only: AtomicBool::new(!leave),
            ..Default::default()
        }
    }

    /// Whether an admitted sample found in the page cache may stay there.
    pub(crate) fn leave_in_page_cache(&self) -> bool {
        !self.copies_only.load(Ordering::Relaxed)
    }

    /// Counts a worker's page-cache hits and losses; too many losses end the leaving.
    pub(crate) fn page_cache_hits(&self, hits: u64, lost: u64) {
        let hits = self.page_cache_hits.fetch_add(hits, Ordering::Relaxed) + hits;
        let lost = self.page_cache_lost.fetch_add(lost, Ordering::Relaxed) + lost;
        if lost >= LOST_MIN && lost * LOST_SHARE > hits + lost {
            self.copies_only.store(true, Ordering::Relaxed);
        }
    }
}

/// The planner's side: whether this window's misses are tried on the workers.
#[derive(Debug)]
pub(crate) struct ResidentGate {
    enabled: bool,
    /// Windows left before trying again.
    wait_windows: u32,
    backoff_windows: u32,
    seen_tried: u64,
    seen_resident: u64,
    /// Windows planned with worker reads, and without.
    pub(crate) windows_tried: u64,
    pub(crate) windows_dispatched: u64,
}

impl ResidentGate {
    pub(crate) fn new(enabled: bool) -> Self {
        ResidentGate {
            enabled,
            wait_windows: 0,
            backoff_windows: BACKOFF_WINDOWS_FIRST,
            seen_tried: 0,
            seen_resident: 0,
            windows_tried: 0,
            windows_dispatched: 0,
        }
    }

    /// Whether the next window's misses go to the workers first, from what they found since
    /// the last decision.
    pub(crate) fn next_window(&mut self, counters: &ReadPathCounters) -> bool {
        if !self.enabled {
            return false;
        }
        let tried = counters.tried.load(Ordering::Relaxed);
        let resident = counters.resident.load(Ordering::Relaxed);
        let (new_tried, new_resident) = (tried - self.seen_tried, resident - self.seen_resident);
        if new_tried >= TRIES_MIN {
            self.seen_tried = tried;
            self.seen_resident = resident;
            if 2 * new_resident < new_tried {
                self.wait_windows = self.backoff_windows;
                self.backoff_windows = (2 * self.backoff_windows).min(BACKOFF_WINDOWS_MAX);
            } else {
                self.backoff_windows = BACKOFF_WINDOWS_FIRST;
            }
        }
        let on_workers = if self.wait_windows > 0 {
            self.wait_windows -= 1;
            false
        } else {
            true
        };
        if on_workers {
            self.windows_tried += 1;
        } else {
            self.windows_dispatched += 1;
        }
        on_workers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_cache_keeps_the_cache_samples_until_it_loses_one_hit_in_sixteen() {
        assert!(!ReadPathCounters::new(false).leave_in_page_cache());
        let c = ReadPathCounters::new(true);
        assert!(c.leave_in_page_cache());
        // Losses below the floor, however large their share, keep it.
        c.page_cache_hits(0, 15);
        assert!(c.leave_in_page_cache());
        // 16 lost against 300 served: under one in sixteen.
        c.page_cache_hits(300, 1);
        assert!(c.leave_in_page_cache());
        // 30 lost of 330: over it, for good.
        c.page_cache_hits(0, 14);
        assert!(!c.leave_in_page_cache());
        c.page_cache_hits(100_000, 0);
        assert!(!c.leave_in_page_cache());
    }

    fn saw(c: &ReadPathCounters, tried: u64, resident: u64) {
        c.tried.fetch_add(tried, Ordering::Relaxed);
        c.resident.fetch_add(resident, Ordering::Relaxed);
    }

    #[test]
    fn a_disabled_gate_never_tries() {
        let c = ReadPathCounters::default();
        let mut g = ResidentGate::new(false);
        assert!((0..10).all(|_| !g.next_window(&c)));
    }

    #[test]
    fn mostly_resident_keeps_trying_and_mostly_not_backs_off_doubling() {
        let c = ReadPathCounters::default();
        let mut g = ResidentGate::new(true);
        assert!(g.next_window(&c), "the first window tries");
        saw(&c, 20, 19);
        assert!(g.next_window(&c));
        // Few tries: no verdict yet.
        saw(&c, 3, 0);
        assert!(g.next_window(&c));
        saw(&c, 17, 2);
        let pattern: Vec<bool> = (0..5).map(|_| g.next_window(&c)).collect();
        assert_eq!(pattern, [false, false, false, false, true]);
        // Still not resident: the wait doubles.
        saw(&c, 16, 0);
        let waited = (0..9).take_while(|_| !g.next_window(&c)).count();
        assert_eq!(waited, 2 * BACKOFF_WINDOWS_FIRST as usize);
        // Resident again: back to the first backoff on the next failure.
        saw(&c, 16, 16);
        assert!(g.next_window(&c));
        saw(&c, 16, 1);
        let waited = (0..9).take_while(|_| !g.next_window(&c)).count();
        assert_eq!(waited, BACKOFF_WINDOWS_FIRST as usize);
        assert_eq!(
            (g.windows_tried, g.windows_dispatched),
            (23 - 16, 4 + 8 + 4)
        );
    }
}
