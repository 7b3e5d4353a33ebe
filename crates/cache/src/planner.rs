//! The planner: drives a policy over a multi-epoch stream in canonical order.

use std::mem::size_of;
use std::sync::Arc;

use crate::index::{NextUseIndex, StreamSource};
use crate::lru::LruPolicy;
use crate::policy::{Policy, PolicyKind};
use crate::reuse::ReusePolicy;
use crate::static_::StaticPolicy;
use crate::{CacheError, SampleId};

/// Default batch: twice the accesses held per sample of the size table (2.5 per sample).
const DEFAULT_BATCH_PER_SAMPLE_X2: usize = 5;

/// Decisions between two [`Policy::warm`] calls, each for the group after the next one (so
/// the loads have a group's worth of decisions to complete).
const WARM_AHEAD: usize = 16;

/// One cache decision, for the access at `position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// 0-based position in the whole stream.
    pub position: u64,
    /// Epoch of the access.
    pub epoch: u32,
    /// The sample accessed.
    pub sample: SampleId,
    /// Its size.
    pub size_bytes: u32,
    /// It was cached when accessed: take it from the store.
    pub hit: bool,
    /// It was missed and is now cached: put it in the store once read.
    pub admitted: bool,
}

/// Counters over the decisions made so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Accesses decided.
    pub accesses: u64,
    /// Accesses that were hits.
    pub hits: u64,
    /// Accesses that were misses.
    pub misses: u64,
    /// Bytes of the hits.
    pub hit_bytes: u64,
    /// Bytes of the misses.
    pub miss_bytes: u64,
}

impl Stats {
    /// Hits per access (0 when there were none).
    pub fn hit_ratio(&self) -> f64 {
        if self.accesses == 0 {
            0.0
        } else {
            self.hits as f64 / self.accesses as f64
        }
    }

    /// Counts one access.
    pub fn record(&mut self, hit: bool, size_bytes: u32) {
        self.accesses += 1;
        if hit {
            self.hits += 1;
            self.hit_bytes += u64::from(size_bytes);
        } else {
            self.misses += 1;
            self.miss_bytes += u64::from(size_bytes);
        }
    }
}

/// Tuning of the planner's memory/time trade-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlannerConfig {
    /// Accesses held per batch of epochs (8 bytes each); at least one epoch is always held.
    /// `None`: 2.5 per sample of the size table. Larger batches leave fewer samples for the
    /// frontier to answer (see [`NextUseIndex`](crate::NextUseIndex)).
    pub batch_accesses_max: Option<usize>,
}

/// Makes every cache decision of a stream, in stream order, without allocating per call.
///
/// Memory (reuse, the policy that looks ahead), in bytes per sample of the size table
/// (`N`): 6 (next use after the batch, frontier's latest batch) + 1/4 (pending and cached
/// bits) + 8 per access of the batch (by default at most `2.5 N` accesses, so up to 20) +
/// 4 per access of the largest epoch (scratch) + 8 per frontier answer (it stops reading at
/// `N / 4 + 1024` held, so up to 2, 4 with the slack of growing vectors) + up to 20 per
/// cached sample (heap of 16-byte entries, at most 1.25 per cached sample + 1024).
/// Measured at ImageNet-1k scale (1.28 M samples, 110 KB median, 1 or 4 nodes): 31-35
/// bytes per sample with a cache of 10% of the dataset, 39-45 with 50%;
/// [`memory_bytes`](Planner::memory_bytes) reports the real figure. The size table itself
/// (4 bytes per sample) is shared with the caller. LRU and static need no look-ahead: one
/// epoch plus 9 (LRU) or 2 (static) bytes per sample.
#[derive(Debug)]
pub struct Planner<S> {
    index: NextUseIndex<S>,
    policy: Box<dyn Policy>,
    sizes: Arc<[u32]>,
    stats: Stats,
    until_warm: usize,
}

impl<S: StreamSource> Planner<S> {
    /// A planner of `kind` with a cache of `capacity_bytes` over `source`, whose samples are
    /// sized by `sizes` (indexed by sample id).
    ///
    /// # Errors
    /// [`CacheError::SampleOutOfRange`] if the stream names a sample without a size (found
    /// here for `static`, which reads the whole stream once to count accesses; later for
    /// the others); [`CacheError::TooManySamples`] if `sizes` has more than `u32::MAX`
    /// entries.
    pub fn new(
        source: S,
        sizes: Arc<[u32]>,
        capacity_bytes: u64,
        kind: PolicyKind,
    ) -> Result<Self, CacheError> {
        Self::with_config(
            source,
            sizes,
            capacity_bytes,
            kind,
            PlannerConfig::default(),
        )
    }

    /// [`new`](Planner::new) with explicit tuning.
    ///
    /// # Errors
    /// As [`new`](Planner::new).
    pub fn with_config(
        source: S,
        sizes: Arc<[u32]>,
        capacity_bytes: u64,
        kind: PolicyKind,
        config: PlannerConfig,
    ) -> Result<Self, CacheError> {
        let n = sizes.len();
        if u32::try_from(n).is_err() {
            return Err(CacheError::TooManySamples { num_samples: n });
        }
        let policy: Box<dyn Policy> = match kind {
            PolicyKind::Reuse => Box::new(ReusePolicy::new(sizes.clone(), capacity_bytes)),
            PolicyKind::Lru => Box::new(LruPolicy::new(sizes.clone(), capacity_bytes)),
            PolicyKind::Static => {
                let (counts, first) = count_accesses(&source, n)?;
                Box::new(StaticPolicy::new(
                    sizes.clone(),
                    capacity_bytes,
                    &counts,
                    &first,
                ))
            }
        };
        let look_ahead = kind == PolicyKind::Reuse;
        let batch = config
            .batch_accesses_max
            .unwrap_or(DEFAULT_BATCH_PER_SAMPLE_X2 * n / 2);
        Ok(Planner {
            index: NextUseIndex::new(source, n, look_ahead, batch),
            policy,
            sizes,
            stats: Stats::default(),
            until_warm: 0,
        })
    }

    /// Decides the next access of the stream; `None` at its end.
    ///
    /// `evicted` is cleared, then receives the samples to drop from the store, in order
    /// (possibly the accessed sample itself, on a reuse hit with no next use: take a hit's
    /// bytes before dropping the evicted samples). The bytes of the samples cached after
    /// this decision never exceed the capacity, so a store of the same capacity that drops
    /// `evicted` before inserting an admitted sample never refuses it.
    ///
    /// # Errors
    /// [`CacheError::SampleOutOfRange`] if the stream names a sample without a size.
    #[inline]
    pub fn next(&mut self, evicted: &mut Vec<SampleId>) -> Result<Option<Decision>, CacheError> {
        evicted.clear();
        self.until_warm = self.until_warm.saturating_sub(1);
        if self.until_warm == 0 {
            self.until_warm = WARM_AHEAD;
            let upcoming = self.index.upcoming(2 * WARM_AHEAD);
            self.policy
                .warm(upcoming.get(WARM_AHEAD..).unwrap_or_default());
        }
        let Some(a) = self.index.next_access()? else {
            return Ok(None);
        };
        let out = self
            .policy
            .access(a.sample, a.position, a.next_use, evicted);
        let size_bytes = self.sizes[a.sample as usize];
        self.stats.record(out.hit, size_bytes);
        Ok(Some(Decision {
            position: a.position,
            epoch: a.epoch,
            sample: a.sample,
            size_bytes,
            hit: out.hit,
            admitted: out.admitted,
        }))
    }

    /// Runs the stream to its end and returns the totals.
    ///
    /// # Errors
    /// As [`next`](Planner::next).
    pub fn run_to_end(&mut self) -> Result<Stats, CacheError> {
        let mut evicted = Vec::new();
        while self.next(&mut evicted)?.is_some() {}
        Ok(self.stats)
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The policy (to ask what is cached, and how many bytes).
    pub fn policy(&self) -> &dyn Policy {
        &*self.policy
    }

    /// Epochs generated so far by the index, look-ahead included.
    pub fn epochs_generated(&self) -> u64 {
        self.index.epochs_generated()
    }

    /// Heap bytes held by the planner (index + policy), excluding the shared size table.
    pub fn memory_bytes(&self) -> usize {
        self.index.memory_bytes() + self.policy.memory_bytes() + size_of::<Self>()
    }
}

/// Access counts and first-access positions over a whole stream: one pass.
fn count_accesses<S: StreamSource>(
    source: &S,
    n: usize,
) -> Result<(Vec<u32>, Vec<u64>), CacheError> {
    let mut counts = vec![0u32; n];
    let mut first = vec![u64::MAX; n];
    let mut buf = Vec::new();
    let mut pos = 0u64;
    for epoch in 0..source.epochs() {
        buf.clear();
        source.fill_epoch(epoch, &mut buf);
        for &s in &buf {
            let Some(c) = counts.get_mut(s as usize) else {
                return Err(CacheError::SampleOutOfRange {
                    sample: s,
                    epoch,
                    num_samples: n,
                });
            };
            if *c == 0 {
                first[s as usize] = pos;
            }
            *c = c.saturating_add(1);
            pos += 1;
        }
    }
    Ok((counts, first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VecSource;

    #[test]
    fn a_store_mirroring_the_decisions_never_refuses_and_always_has_the_hits() {
        use crate::Store;
        use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};
        let sizes: Arc<[u32]> = lognormal_sizes(300, 2000.0, 0.7, 5).into();
        let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        for kind in PolicyKind::ALL {
            let stream = ShuffledStream {
                num_samples: 300,
                epochs: 8,
                nodes: 4,
                node: 1,
                seed: 3,
            };
            let source = VecSource::new(stream.to_epochs());
            let mut planner = Planner::new(source, sizes.clone(), total / 8, kind).unwrap();
            let mut store: Store<bytes::Bytes> = Store::new(total / 8);
            let mut evicted = Vec::new();
            while let Some(d) = planner.next(&mut evicted).unwrap() {
                if d.hit {
                    let bytes = store.get(d.sample).expect("a hit is in the store");
                    assert_eq!(bytes.len(), d.size_bytes as usize);
                }
                for &e in &evicted {
                    assert!(store.remove(e).is_some(), "{kind}: evicted {e} not stored");
                }
                if d.admitted {
                    let bytes = bytes::Bytes::from(vec![0u8; d.size_bytes as usize]);
                    store
                        .insert(d.sample, u64::from(d.size_bytes), bytes)
                        .unwrap();
                }
                assert_eq!(store.used_bytes(), planner.policy().used_bytes(), "{kind}");
            }
        }
    }

    #[test]
    fn sample_without_a_size_is_an_error_naming_it_and_its_epoch() {
        let sizes: Arc<[u32]> = vec![1; 3].into();
        for kind in PolicyKind::ALL {
            let source = VecSource::new(vec![vec![0, 1], vec![2, 7]]);
            let result =
                Planner::new(source, sizes.clone(), 10, kind).and_then(|mut p| p.run_to_end());
            match result {
                Err(CacheError::SampleOutOfRange {
                    sample: 7,
                    epoch: 1,
                    num_samples: 3,
                }) => {}
                other => panic!("{kind}: expected sample 7 out of range, got {other:?}"),
            }
        }
    }

    #[test]
    fn policy_names_round_trip_and_unknown_names_are_refused() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.to_string().parse::<PolicyKind>().unwrap(), kind);
        }
        let err = "fifo".parse::<PolicyKind>().unwrap_err();
        assert!(err.to_string().contains("\"fifo\""), "{err}");
    }

    #[test]
    fn decisions_carry_positions_epochs_and_sizes() {
        let source = VecSource::new(vec![vec![1, 0], vec![], vec![0]]);
        let sizes: Arc<[u32]> = vec![5, 9].into();
        let mut planner = Planner::new(source, sizes, 100, PolicyKind::Lru).unwrap();
        let mut evicted = Vec::new();
        let mut seen = Vec::new();
        while let Some(d) = planner.next(&mut evicted).unwrap() {
            seen.push((d.position, d.epoch, d.sample, d.size_bytes, d.hit));
        }
        assert_eq!(
            seen,
            vec![(0, 0, 1, 9, false), (1, 0, 0, 5, false), (2, 2, 0, 5, true)]
        );
        let stats = planner.stats();
        assert_eq!(
            (
                stats.accesses,
                stats.hits,
                stats.misses,
                stats.hit_bytes,
                stats.miss_bytes
            ),
            (3, 1, 2, 5, 14)
        );
    }
}
