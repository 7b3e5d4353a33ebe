//! Reuse-distance policy: Belady's rule with "do no harm" admission.

use std::mem::size_of;
use std::sync::Arc;

use crate::heap::{Entry, QuadHeap};
use crate::policy::{Outcome, Policy, PolicyKind, NEVER};
use crate::SampleId;

/// Evicts the cached sample used farthest in the future and admits a missed sample only if
/// that pushes out nothing needed sooner than it.
///
/// Exact semantics:
/// - hit: the sample's next use becomes `next_use`; if that is [`NEVER`] it leaves the cache
///   (and is reported as evicted).
/// - miss of `s` with next use `n`: not admitted if `n` is `NEVER` or `size(s) > capacity`.
///   If `s` fits, it is admitted. Otherwise the cached samples with next use later than `n`
///   are evicted farthest first until `s` fits; if all of them together would not free
///   enough, nothing is evicted and `s` is not admitted.
///
/// Memory: 1 bit per sample in the size table, plus a max-heap of at most
/// `1.25 * cached + 1024` entries of 16 bytes (stale entries are dropped lazily).
///
/// Two-level plans also [`seed`](ReusePolicy::seed) it with samples already held before the
/// stream starts and [`remove`](ReusePolicy::remove) samples from it between accesses.
#[derive(Debug)]
pub struct ReusePolicy {
    sizes: Arc<[u32]>,
    capacity_bytes: u64,
    used_bytes: u64,
    /// One bit per sample: cached.
    cached: Vec<u64>,
    /// Position of the latest access.
    position: u64,
    /// Max-heap by next use. An entry goes stale only when its sample is hit (at the
    /// entry's next use), so an entry is live iff its next use is after `position`.
    heap: QuadHeap,
    live: usize,
    popped: Vec<Entry>,
    /// Upper bound on heap entries of removed samples that are not stale yet. While above 0,
    /// eviction skips entries of uncached samples and compaction drops them.
    ghosts: usize,
}

impl ReusePolicy {
    /// An empty cache of `capacity_bytes` over samples sized by `sizes`.
    pub fn new(sizes: Arc<[u32]>, capacity_bytes: u64) -> Self {
        let n = sizes.len();
        ReusePolicy {
            sizes,
            capacity_bytes,
            used_bytes: 0,
            cached: vec![0; n.div_ceil(64)],
            position: 0,
            heap: QuadHeap::default(),
            live: 0,
            popped: Vec::new(),
            ghosts: 0,
        }
    }

    /// Caches `sample` before the first access, as if admitted with next use `next_use` (its
    /// first access in the stream): a second run's plan starting from what a first one left.
    /// Seeds `sample` only if it is not cached, `next_use` is not [`NEVER`] and it fits in the
    /// free bytes; returns whether it did. Evicts nothing.
    ///
    /// # Panics
    /// If an access was already made (seeds come before the stream).
    pub fn seed(&mut self, sample: SampleId, next_use: u64) -> bool {
        assert!(
            self.position == 0 && self.live == self.heap.len(),
            "seeds come before the first access"
        );
        let size = self.size(sample);
        if self.is_cached(sample)
            || next_use == NEVER
            || self.used_bytes + size > self.capacity_bytes
        {
            return false;
        }
        self.used_bytes += size;
        self.live += 1;
        self.insert(sample, next_use);
        true
    }

    /// Drops `sample` from the cache between accesses (what a cache above or beside this one
    /// decided); returns whether it was cached. Its heap entry stays until it is stale or
    /// reaches the top, where it is skipped.
    pub fn remove(&mut self, sample: SampleId) -> bool {
        if !self.is_cached(sample) {
            return false;
        }
        self.set_cached(sample, false);
        self.used_bytes -= self.size(sample);
        self.live -= 1;
        self.ghosts += 1;
        true
    }

    /// The live top of the heap, skipping entries of removed samples.
    #[inline]
    fn top(&mut self) -> Option<Entry> {
        loop {
            let top = self.heap.live_top(self.position)?;
            if self.ghosts == 0 || self.is_cached(top.sample) {
                return Some(top);
            }
            self.heap.pop();
            self.ghosts -= 1;
        }
    }

    fn size(&self, sample: SampleId) -> u64 {
        u64::from(self.sizes[sample as usize])
    }

    #[inline]
    fn is_cached(&self, sample: SampleId) -> bool {
        self.cached[sample as usize / 64] & (1 << (sample % 64)) != 0
    }

    #[inline]
    fn set_cached(&mut self, sample: SampleId, cached: bool) {
        let (w, b) = (sample as usize / 64, 1u64 << (sample % 64));
        if cached {
            self.cached[w] |= b;
        } else {
            self.cached[w] &= !b;
        }
    }

    fn insert(&mut self, sample: SampleId, next_use: u64) {
        debug_assert_ne!(next_use, NEVER);
        self.set_cached(sample, true);
        let size_bytes = self.sizes[sample as usize];
        self.heap.push(Entry::new(next_use, sample, size_bytes));
        if self.ghosts == 0 {
            self.heap.compact_if_stale(self.live, self.position);
        } else if self.heap.len() > self.live + self.live / 4 + 1024 {
            // As `compact_if_stale`, also dropping the entries of removed samples: a live
            // entry of a cached sample is its only one.
            let (cached, position) = (&self.cached, self.position);
            self.heap.retain(|e| {
                e.next_use() > position
                    && cached[e.sample as usize / 64] & (1 << (e.sample % 64)) != 0
            });
            debug_assert_eq!(self.heap.len(), self.live);
            self.ghosts = 0;
        }
    }

    /// Evicts the samples needed farthest ahead, each after `next_use`, until `need` bytes are
    /// free; true if they are. Where they cannot be (do no harm), evicts nothing.
    fn evict_farther(&mut self, need: u64, next_use: u64, evicted: &mut Vec<SampleId>) -> bool {
        let mut freed = 0u64;
        self.popped.clear();
        while freed < need {
            let Some(top) = self.top() else {
                break;
            };
            if top.next_use() <= next_use {
                break;
            }
            self.heap.pop();
            freed += u64::from(top.size_bytes);
            self.popped.push(top);
        }
        if freed < need {
            // Do no harm: put the candidates back untouched.
            for e in self.popped.drain(..) {
                self.heap.push(e);
            }
            return false;
        }
        let mut popped = std::mem::take(&mut self.popped);
        for e in popped.drain(..) {
            self.set_cached(e.sample, false);
            self.used_bytes -= u64::from(e.size_bytes);
            self.live -= 1;
            evicted.push(e.sample);
        }
        self.popped = popped;
        true
    }
}

impl Policy for ReusePolicy {
    fn access(
        &mut self,
        sample: SampleId,
        position: u64,
        next_use: u64,
        evicted: &mut Vec<SampleId>,
    ) -> Outcome {
        debug_assert!(
            position > self.position || self.position == 0,
            "positions must increase"
        );
        self.position = position;
        let size = self.size(sample);
        if self.is_cached(sample) {
            if next_use == NEVER {
                self.set_cached(sample, false);
                self.used_bytes -= size;
                self.live -= 1;
                evicted.push(sample);
            } else {
                self.insert(sample, next_use);
            }
            return Outcome {
                hit: true,
                admitted: false,
            };
        }
        let miss = Outcome::default();
        if next_use == NEVER || size > self.capacity_bytes {
            return miss;
        }
        if self.used_bytes + size > self.capacity_bytes {
            let need = self.used_bytes + size - self.capacity_bytes;
            let Some(top) = self.top() else {
                return miss;
            };
            if top.next_use() <= next_use {
                return miss;
            }
            let top_size = u64::from(top.size_bytes);
            if top_size >= need {
                // The common case: the farthest sample alone makes room; s takes its place.
                self.set_cached(top.sample, false);
                evicted.push(top.sample);
                self.used_bytes = self.used_bytes - top_size + size;
                self.set_cached(sample, true);
                self.heap
                    .replace_top(Entry::new(next_use, sample, size as u32));
                assert!(
                    self.used_bytes <= self.capacity_bytes,
                    "reuse cache holds {} bytes over its capacity of {}",
                    self.used_bytes,
                    self.capacity_bytes
                );
                return Outcome {
                    hit: false,
                    admitted: true,
                };
            }
            if !self.evict_farther(need, next_use, evicted) {
                return miss;
            }
        }
        self.used_bytes += size;
        self.live += 1;
        self.insert(sample, next_use);
        assert!(
            self.used_bytes <= self.capacity_bytes,
            "reuse cache holds {} bytes over its capacity of {}",
            self.used_bytes,
            self.capacity_bytes
        );
        Outcome {
            hit: false,
            admitted: true,
        }
    }

    fn contains(&self, sample: SampleId) -> bool {
        self.is_cached(sample)
    }

    fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn kind(&self) -> PolicyKind {
        PolicyKind::Reuse
    }

    fn warm(&self, upcoming: &[SampleId]) {
        let mut acc = 0u64;
        for &s in upcoming {
            acc = acc.wrapping_add(u64::from(self.sizes[s as usize]));
        }
        std::hint::black_box(acc);
    }

    fn memory_bytes(&self) -> usize {
        self.cached.capacity() * size_of::<u64>()
            + (self.heap.capacity() + self.popped.capacity()) * size_of::<Entry>()
    }
}
