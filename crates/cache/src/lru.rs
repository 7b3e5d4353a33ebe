//! Least-recently-used baseline.

use std::mem::size_of;
use std::sync::Arc;

use crate::policy::{Outcome, Policy, PolicyKind};
use crate::SampleId;

const NIL: u32 = u32::MAX;

/// Admits every miss that fits in the capacity at all, evicting the least recently used
/// samples first; a hit makes the sample the most recently used.
///
/// Memory: an intrusive doubly linked list, 9 bytes per sample in the size table.
#[derive(Debug)]
pub struct LruPolicy {
    sizes: Arc<[u32]>,
    capacity_bytes: u64,
    used_bytes: u64,
    prev: Vec<u32>,
    next: Vec<u32>,
    cached: Vec<bool>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
}

impl LruPolicy {
    /// An empty cache of `capacity_bytes` over samples sized by `sizes`.
    pub fn new(sizes: Arc<[u32]>, capacity_bytes: u64) -> Self {
        let n = sizes.len();
        LruPolicy {
            sizes,
            capacity_bytes,
            used_bytes: 0,
            prev: vec![NIL; n],
            next: vec![NIL; n],
            cached: vec![false; n],
            head: NIL,
            tail: NIL,
        }
    }

    fn unlink(&mut self, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    fn push_front(&mut self, s: u32) {
        self.prev[s as usize] = NIL;
        self.next[s as usize] = self.head;
        if self.head == NIL {
            self.tail = s;
        } else {
            self.prev[self.head as usize] = s;
        }
        self.head = s;
    }
}

impl Policy for LruPolicy {
    fn access(
        &mut self,
        sample: SampleId,
        _position: u64,
        _next_use: u64,
        evicted: &mut Vec<SampleId>,
    ) -> Outcome {
        if self.cached[sample as usize] {
            if self.head != sample {
                self.unlink(sample);
                self.push_front(sample);
            }
            return Outcome {
                hit: true,
                admitted: false,
            };
        }
        let size = u64::from(self.sizes[sample as usize]);
        if size > self.capacity_bytes {
            return Outcome::default();
        }
        while self.used_bytes + size > self.capacity_bytes {
            let victim = self.tail;
            debug_assert_ne!(victim, NIL);
            self.unlink(victim);
            self.cached[victim as usize] = false;
            self.used_bytes -= u64::from(self.sizes[victim as usize]);
            evicted.push(victim);
        }
        self.push_front(sample);
        self.cached[sample as usize] = true;
        self.used_bytes += size;
        assert!(
            self.used_bytes <= self.capacity_bytes,
            "LRU cache holds {} bytes over its capacity of {}",
            self.used_bytes,
            self.capacity_bytes
        );
        Outcome {
            hit: false,
            admitted: true,
        }
    }

    fn contains(&self, sample: SampleId) -> bool {
        self.cached[sample as usize]
    }

    fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn kind(&self) -> PolicyKind {
        PolicyKind::Lru
    }

    fn warm(&self, upcoming: &[SampleId]) {
        let mut acc = 0u32;
        for &s in upcoming {
            let s = s as usize;
            acc = acc
                .wrapping_add(u32::from(self.cached[s]))
                .wrapping_add(self.prev[s])
                .wrapping_add(self.next[s])
                .wrapping_add(self.sizes[s]);
        }
        std::hint::black_box(acc);
    }

    fn memory_bytes(&self) -> usize {
        (self.prev.capacity() + self.next.capacity()) * size_of::<u32>() + self.cached.capacity()
    }
}
