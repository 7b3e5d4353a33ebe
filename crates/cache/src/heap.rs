//! The max-heap of cached samples by next use that the look-ahead policies evict from.

use crate::SampleId;

/// Heap entries beyond the live ones that are tolerated before compaction.
const STALE_SLACK: usize = 1024;

/// Heap entry, 16 bytes: the next use split in halves keeps the alignment at 4.
/// Ordered by next use (fields compare in order; next uses are unique among live entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Entry {
    next_use_hi: u32,
    next_use_lo: u32,
    pub(crate) sample: SampleId,
    /// Carried so that evicting the top needs no lookup in the size table.
    pub(crate) size_bytes: u32,
}

impl Entry {
    pub(crate) fn new(next_use: u64, sample: SampleId, size_bytes: u32) -> Self {
        Entry {
            next_use_hi: (next_use >> 32) as u32,
            next_use_lo: next_use as u32,
            sample,
            size_bytes,
        }
    }

    pub(crate) fn next_use(&self) -> u64 {
        u64::from(self.next_use_hi) << 32 | u64::from(self.next_use_lo)
    }
}

/// Max-heap of entries with four children per node: half the depth of a binary heap, and
/// the children of a node share a cache line or two, which matters at 100 k+ entries.
#[derive(Debug, Default)]
pub(crate) struct QuadHeap {
    v: Vec<Entry>,
}

impl QuadHeap {
    pub(crate) fn len(&self) -> usize {
        self.v.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.v.capacity()
    }

    pub(crate) fn peek(&self) -> Option<&Entry> {
        self.v.first()
    }

    /// The top once the stale entries above it are dropped: an entry is stale once its next
    /// use is at or before `position` (its sample was accessed there).
    pub(crate) fn live_top(&mut self, position: u64) -> Option<Entry> {
        while self.peek().is_some_and(|e| e.next_use() <= position) {
            self.pop();
        }
        self.peek().copied()
    }

    /// Drops every stale entry once there are more than a quarter of `live` plus a slack of
    /// them, so the heap stays within `1.25 * live + 1024` entries.
    pub(crate) fn compact_if_stale(&mut self, live: usize, position: u64) {
        if self.len() > live + live / 4 + STALE_SLACK {
            self.retain(|e| e.next_use() > position);
            debug_assert_eq!(self.len(), live);
        }
    }

    pub(crate) fn push(&mut self, e: Entry) {
        let mut i = self.v.len();
        self.v.push(e);
        while i > 0 {
            let parent = (i - 1) / 4;
            if self.v[parent] >= e {
                break;
            }
            self.v[i] = self.v[parent];
            i = parent;
        }
        self.v[i] = e;
    }

    pub(crate) fn pop(&mut self) -> Option<Entry> {
        let last = self.v.pop()?;
        if self.v.is_empty() {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.v[0], last);
        self.sift_down(0);
        Some(top)
    }

    /// Replaces the maximum by `e` in one pass. The heap must not be empty.
    pub(crate) fn replace_top(&mut self, e: Entry) -> Entry {
        let top = std::mem::replace(&mut self.v[0], e);
        self.sift_down(0);
        top
    }

    fn sift_down(&mut self, mut i: usize) {
        let e = self.v[i];
        let n = self.v.len();
        loop {
            let first = 4 * i + 1;
            if first >= n {
                break;
            }
            let mut best = first;
            for c in first + 1..(first + 4).min(n) {
                if self.v[c] > self.v[best] {
                    best = c;
                }
            }
            if self.v[best] <= e {
                break;
            }
            self.v[i] = self.v[best];
            i = best;
        }
        self.v[i] = e;
    }

    pub(crate) fn retain(&mut self, f: impl FnMut(&Entry) -> bool) {
        self.v.retain(f);
        for i in (0..self.v.len() / 4 + 1).rev() {
            if i < self.v.len() {
                self.sift_down(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn quad_heap_pops_in_descending_order_under_mixed_operations() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut heap = QuadHeap::default();
        let mut model: Vec<Entry> = Vec::new();
        for step in 0..20_000u32 {
            match rng.gen_range(0..5) {
                0 | 1 => {
                    let e = Entry::new(rng.gen_range(0..1000), step, 0);
                    heap.push(e);
                    model.push(e);
                }
                2 if !model.is_empty() => {
                    model.sort_unstable();
                    assert_eq!(heap.pop(), model.pop());
                }
                3 if !model.is_empty() => {
                    model.sort_unstable();
                    let e = Entry::new(rng.gen_range(0..1000), step, 0);
                    assert_eq!(heap.replace_top(e), model.pop().unwrap());
                    model.push(e);
                }
                _ => {
                    let cut = rng.gen_range(0..1000);
                    heap.retain(|e| e.next_use() != cut);
                    model.retain(|e| e.next_use() != cut);
                }
            }
            assert_eq!(heap.len(), model.len());
            assert_eq!(heap.peek().copied(), model.iter().max().copied());
        }
    }
}
