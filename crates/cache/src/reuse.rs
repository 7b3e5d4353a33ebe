//! Reuse-distance policy: Belady's rule with "do no harm" admission.

use std::collections::BinaryHeap;
use std::mem::size_of;
use std::sync::Arc;

use crate::policy::{Outcome, Policy, PolicyKind, NEVER};
use crate::SampleId;

/// Key of a sample that is not cached. Cached keys are next-use positions, never `NEVER`.
const NOT_CACHED: u64 = NEVER;

/// Heap entries beyond the live ones that are tolerated before compaction.
const STALE_SLACK: usize = 1024;

/// Heap entry, 12 bytes: the next use split in halves keeps the alignment at 4.
/// Ordered by next use (fields compare in order; next uses are unique among live entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    next_use_hi: u32,
    next_use_lo: u32,
    sample: SampleId,
}

impl Entry {
    fn new(next_use: u64, sample: SampleId) -> Self {
        Entry {
            next_use_hi: (next_use >> 32) as u32,
            next_use_lo: next_use as u32,
            sample,
        }
    }

    fn next_use(&self) -> u64 {
        u64::from(self.next_use_hi) << 32 | u64::from(self.next_use_lo)
    }
}

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
/// Memory: 8 bytes per sample in the size table, plus a max-heap of at most
/// `1.5 * cached + 1024` entries of 12 bytes (stale entries are dropped lazily).
#[derive(Debug)]
pub struct ReusePolicy {
    sizes: Arc<[u32]>,
    capacity_bytes: u64,
    used_bytes: u64,
    /// Next use of each cached sample, `NOT_CACHED` otherwise.
    key: Vec<u64>,
    /// Max-heap by next use; an entry is live iff `key[sample] == next_use`.
    heap: BinaryHeap<Entry>,
    live: usize,
    popped: Vec<Entry>,
}

impl ReusePolicy {
    /// An empty cache of `capacity_bytes` over samples sized by `sizes`.
    pub fn new(sizes: Arc<[u32]>, capacity_bytes: u64) -> Self {
        let n = sizes.len();
        ReusePolicy {
            sizes,
            capacity_bytes,
            used_bytes: 0,
            key: vec![NOT_CACHED; n],
            heap: BinaryHeap::new(),
            live: 0,
            popped: Vec::new(),
        }
    }

    fn size(&self, sample: SampleId) -> u64 {
        u64::from(self.sizes[sample as usize])
    }

    fn insert(&mut self, sample: SampleId, next_use: u64) {
        debug_assert_ne!(next_use, NEVER);
        self.key[sample as usize] = next_use;
        self.heap.push(Entry::new(next_use, sample));
        self.compact_if_stale();
    }

    fn compact_if_stale(&mut self) {
        if self.heap.len() > self.live + self.live / 2 + STALE_SLACK {
            let key = &self.key;
            self.heap.retain(|e| key[e.sample as usize] == e.next_use());
            debug_assert_eq!(self.heap.len(), self.live);
        }
    }

    fn is_live(&self, e: &Entry) -> bool {
        self.key[e.sample as usize] == e.next_use()
    }
}

impl Policy for ReusePolicy {
    fn access(
        &mut self,
        sample: SampleId,
        _position: u64,
        next_use: u64,
        evicted: &mut Vec<SampleId>,
    ) -> Outcome {
        let size = self.size(sample);
        if self.key[sample as usize] != NOT_CACHED {
            if next_use == NEVER {
                self.key[sample as usize] = NOT_CACHED;
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
            let mut freed = 0u64;
            self.popped.clear();
            while freed < need {
                let Some(top) = self.heap.peek().copied() else {
                    break;
                };
                if !self.is_live(&top) {
                    self.heap.pop();
                    continue;
                }
                if top.next_use() <= next_use {
                    break;
                }
                self.heap.pop();
                freed += self.size(top.sample);
                self.popped.push(top);
            }
            if freed < need {
                // Do no harm: put the candidates back untouched.
                self.heap.extend(self.popped.drain(..));
                return miss;
            }
            for e in self.popped.drain(..) {
                self.key[e.sample as usize] = NOT_CACHED;
                self.used_bytes -= u64::from(self.sizes[e.sample as usize]);
                self.live -= 1;
                evicted.push(e.sample);
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
        self.key[sample as usize] != NOT_CACHED
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

    fn memory_bytes(&self) -> usize {
        self.key.capacity() * size_of::<u64>()
            + (self.heap.capacity() + self.popped.capacity()) * size_of::<Entry>()
    }
}
