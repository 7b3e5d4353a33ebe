//! Static placement baseline (NoPFS).

use std::cmp::Reverse;
use std::sync::Arc;

use crate::policy::{Outcome, Policy, PolicyKind};
use crate::SampleId;

/// Pins, before the stream starts, the most accessed samples that fit and never evicts them.
///
/// Samples are ranked by number of accesses (descending; ties: earlier first access first)
/// and pinned greedily while they fit, skipping those that do not. A pinned sample is cached
/// from its first access on (that access is a miss that admits it); nothing else is cached.
///
/// Memory: 2 bytes per sample in the size table (the tables of access counts are dropped
/// once the pinned set is chosen).
#[derive(Debug)]
pub struct StaticPolicy {
    sizes: Arc<[u32]>,
    capacity_bytes: u64,
    used_bytes: u64,
    pinned: Vec<bool>,
    cached: Vec<bool>,
}

impl StaticPolicy {
    /// Chooses the pinned set from per-sample access counts and first-access positions over
    /// the whole stream (`counts[s] == 0`: never accessed, never pinned).
    ///
    /// # Panics
    /// If `counts` or `first_access` is not as long as `sizes`.
    pub fn new(
        sizes: Arc<[u32]>,
        capacity_bytes: u64,
        counts: &[u32],
        first_access: &[u64],
    ) -> Self {
        let n = sizes.len();
        assert_eq!(counts.len(), n, "one access count per sample");
        assert_eq!(first_access.len(), n, "one first access per sample");
        let mut order: Vec<u32> = (0..n as u32).filter(|&s| counts[s as usize] > 0).collect();
        order.sort_unstable_by_key(|&s| (Reverse(counts[s as usize]), first_access[s as usize]));
        let mut pinned = vec![false; n];
        let mut pinned_bytes = 0u64;
        for s in order {
            let size = u64::from(sizes[s as usize]);
            if pinned_bytes + size <= capacity_bytes {
                pinned_bytes += size;
                pinned[s as usize] = true;
            }
        }
        StaticPolicy {
            sizes,
            capacity_bytes,
            used_bytes: 0,
            pinned,
            cached: vec![false; n],
        }
    }

    /// Caches a pinned `sample` before the first access (a second run's plan starting from
    /// what a first one left); returns whether it did (false if not pinned or already
    /// cached). Its first access is then a hit.
    pub fn seed(&mut self, sample: SampleId) -> bool {
        let s = sample as usize;
        if !self.pinned[s] || self.cached[s] {
            return false;
        }
        self.cached[s] = true;
        self.used_bytes += u64::from(self.sizes[s]);
        true
    }

    /// Whether `sample` was chosen for pinning.
    pub fn is_pinned(&self, sample: SampleId) -> bool {
        self.pinned[sample as usize]
    }
}

impl Policy for StaticPolicy {
    fn access(
        &mut self,
        sample: SampleId,
        _position: u64,
        _next_use: u64,
        _evicted: &mut Vec<SampleId>,
    ) -> Outcome {
        let s = sample as usize;
        if self.cached[s] {
            return Outcome {
                hit: true,
                admitted: false,
            };
        }
        if !self.pinned[s] {
            return Outcome::default();
        }
        self.cached[s] = true;
        self.used_bytes += u64::from(self.sizes[s]);
        assert!(
            self.used_bytes <= self.capacity_bytes,
            "static cache holds {} bytes over its capacity of {}",
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
        PolicyKind::Static
    }

    fn memory_bytes(&self) -> usize {
        self.pinned.capacity() + self.cached.capacity()
    }
}
