//! Two cache levels, memory over a local disk, planned together from the known stream.

use std::collections::VecDeque;
use std::mem::size_of;
use std::sync::Arc;

use crate::index::{NextUseIndex, StreamSource};
use crate::planner::PlannerConfig;
use crate::policy::{Policy, PolicyKind, NEVER};
use crate::reuse::ReusePolicy;
use crate::static_::StaticPolicy;
use crate::{CacheError, SampleId};

/// Default batch, as [`Planner`](crate::Planner)'s: 2.5 accesses per sample.
const DEFAULT_BATCH_PER_SAMPLE_X2: usize = 5;

/// A cache level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// The loader's memory cache.
    Memory,
    /// The local disk below it.
    Disk,
}

/// One two-level decision, for the access at `position`. See [`TierPlanner::next`] for
/// how a loader carries it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierDecision {
    /// 0-based position in the whole stream.
    pub position: u64,
    /// Epoch of the access.
    pub epoch: u32,
    /// The sample accessed.
    pub sample: SampleId,
    /// Its size.
    pub size_bytes: u32,
    /// Where the sample is when accessed; `None`: read it from the store.
    pub found: Option<Tier>,
    /// Where it is kept after the access; `None`: nowhere.
    pub kept: Option<Tier>,
    /// Write the bytes just read from the store to the disk (`found` is `None` and `kept`
    /// is [`Tier::Disk`]). Demotions are in [`TierEvicted::demoted`].
    pub write_disk: bool,
}

/// What leaves each level in one decision, each list in the order of removal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierEvicted {
    /// Samples that leave memory, possibly the accessed one (a memory hit with no next use).
    pub memory: Vec<SampleId>,
    /// The samples of `memory` that move to the disk (demotions), in the same order: write
    /// each to the disk from its memory bytes before dropping it from memory.
    pub demoted: Vec<SampleId>,
    /// Samples whose disk entries are dropped, possibly the accessed one (a disk hit that
    /// moves to memory, or that has no next use).
    pub disk: Vec<SampleId>,
}

impl TierEvicted {
    /// Empties the three lists.
    pub fn clear(&mut self) {
        self.memory.clear();
        self.demoted.clear();
        self.disk.clear();
    }
}

/// Counters over the decisions made so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierStats {
    /// Accesses decided.
    pub accesses: u64,
    /// Accesses found in memory.
    pub memory_hits: u64,
    /// Accesses found on the disk.
    pub disk_hits: u64,
    /// Accesses read from the store.
    pub store_reads: u64,
    /// Bytes of the memory hits.
    pub memory_hit_bytes: u64,
    /// Bytes of the disk hits.
    pub disk_hit_bytes: u64,
    /// Bytes read from the store.
    pub store_read_bytes: u64,
    /// Disk hits on entries seeded at the start and not rewritten since.
    pub seed_hits: u64,
    /// Bytes of those.
    pub seed_hit_bytes: u64,
    /// Disk writes: store reads kept on disk plus demotions.
    pub disk_writes: u64,
    /// Bytes of those.
    pub disk_write_bytes: u64,
    /// Demotions (memory to disk), counted in `disk_writes` too.
    pub demotions: u64,
}

#[derive(Debug)]
enum Levels {
    /// `held` decides what is kept anywhere, `memory` (fed only what `held` hits or admits)
    /// what of it is in memory; the disk has the rest.
    Reuse {
        held: ReusePolicy,
        memory: ReusePolicy,
        held_evicted: Vec<SampleId>,
        memory_evicted: Vec<SampleId>,
    },
    /// Two pinned sets, memory's chosen first.
    Static {
        memory: StaticPolicy,
        disk: StaticPolicy,
    },
}

/// Plans a memory cache of `M` bytes over a local disk of `D` bytes, exclusive (a sample is
/// in one level at most), from a multi-epoch [`StreamSource`], one [`TierDecision`] per
/// access in stream order.
///
/// The rule (`reuse`): Belady's rule is a stack algorithm on unit sizes (the contents of
/// OPT(M) are always a subset of those of OPT(M + D)), so keeping memory = OPT(M) and disk =
/// OPT(M + D) minus OPT(M) reads from the store only OPT(M + D)'s misses and hits memory as
/// often as OPT(M) does: both optimal at once. Here a [`ReusePolicy`] of `H` bytes decides
/// what is held anywhere, and a second one of `M` bytes, fed only the accesses the first
/// hits or admits and told of the first's evictions, decides what of it is in memory. A
/// disk hit the memory admits moves to memory (its disk entry is dropped); a sample the
/// memory evicts while still held moves to the disk (a demotion).
///
/// `H = D + L`, so that the disk bytes (held minus memory) never exceed `D`, where `L` is
/// the least memory can hold after it refuses or evicts: it does so only when a sample of
/// size `z` does not fit, after which it holds more than `M - z` bytes (an eviction frees
/// less than one evicted sample beyond what is needed), so at least `M + 1 - max_size`,
/// and a multiple of `g`; `L` is the least multiple of `g` at or above that (0 if it is
/// not above 0), `max_size` and `g` being the largest size in the table and the greatest
/// common divisor of its sizes (both at least 1). Every other step shrinks the disk or
/// moves bytes from disk to memory. So `M + D + 1 - max_size <= H <= M + D`, and
/// `H = M + D` where all sizes are equal and divide `M`. With all sizes equal (`v`), the
/// plan is the exact two-level optimum for room of `M / v` and `D / v` samples, seeded or not
/// (lobster-testkit's `tiers_optimum` checks it against Belady's rule and an exhaustive
/// search). With other sizes both rules are the reuse policy's heuristic (do no harm), and
/// the store reads are exactly the misses of one [`ReusePolicy`] of `H` bytes over the
/// stream (tested); one of `M + D` bytes may do better or worse, as capacity is
/// not monotone for it with byte sizes.
///
/// `static` (NoPFS): samples ranked by access count as [`StaticPolicy`] ranks them; the
/// first that fit in `M` bytes are pinned in memory, the next that fit in `D` bytes on the
/// disk, each from its first access on, never evicted. `lru` has no two-level plan.
///
/// Parking (`reuse`): a disk hit with no next use stays on the disk, outside the rule
/// ("parked"), and parked entries are dropped oldest first when the disk needs their
/// room, so a run ends with its disk still holding what it last held, for the next run to
/// seed from.
/// No parked sample is accessed again, so the rule's decisions are unchanged.
///
/// Seeds: a second run starts with samples already on the disk (verified by the loader).
/// `reuse` keeps those with a next use, nearest first use first, while they fit in
/// `min(D, H)` bytes, as if admitted with their first use as next use: the rule evicts them
/// when it decides to; seeds never accessed are parked while the disk has room. `static`
/// keeps those pinned on the disk. The others are in
/// [`dropped_seeds`](TierPlanner::dropped_seeds): delete them before the first access.
/// Decisions are a pure function of (stream, sizes, M, D, kind, seeds).
///
/// Memory, in bytes per sample of the size table: [`Planner`](crate::Planner)'s figure for
/// its policy (the cached samples being those held in either level), plus 1/8 (memory's
/// cached bits) + 1/4 (seeded and parked bits) + up to 20 per sample in memory (memory's
/// heap) + up to 4 per parked sample (each is parked once at most) for `reuse`, plus 2
/// (disk's pinned set) for `static`. Building it reads the stream once for `static` (access
/// counts) and, with seeds, for `reuse` until every seed's first access is found, holding 8
/// bytes per sample meanwhile; [`memory_bytes`](TierPlanner::memory_bytes) reports the
/// real figure.
///
/// ```
/// use lobster_cache::{PolicyKind, TierEvicted, TierPlanner, VecSource};
///
/// // Samples 0..3 of 10 bytes, in two epochs; memory for one over a disk for one.
/// let source = VecSource::new(vec![vec![0, 1, 2], vec![2, 1, 0]]);
/// let sizes = vec![10; 3].into();
/// let mut planner = TierPlanner::new(source, sizes, 10, 10, PolicyKind::Reuse, &[])?;
/// let mut evicted = TierEvicted::default();
/// while let Some(d) = planner.next(&mut evicted)? {
///     // A loader reads from `d.found` (or the store), drops `evicted.disk`, writes
///     // `evicted.demoted` to the disk, drops `evicted.memory`, then keeps the sample.
///     let _ = (d.found, d.kept, d.write_disk, &evicted);
/// }
/// // 2 is hit in memory, 1 on the disk; 0, needed last, is read again.
/// let st = planner.stats();
/// assert_eq!((st.memory_hits, st.disk_hits, st.store_reads), (1, 1, 4));
/// # Ok::<(), lobster_cache::CacheError>(())
/// ```
#[derive(Debug)]
pub struct TierPlanner<S> {
    index: NextUseIndex<S>,
    levels: Levels,
    sizes: Arc<[u32]>,
    memory_capacity_bytes: u64,
    disk_capacity_bytes: u64,
    kind: PolicyKind,
    /// One bit per sample: on disk since the start, from the seeds.
    seeded: Vec<u64>,
    /// Parked disk entries, oldest first, with one bit per sample and their bytes.
    parked: VecDeque<SampleId>,
    parked_bits: Vec<u64>,
    parked_bytes: u64,
    dropped_seeds: Vec<SampleId>,
    stats: TierStats,
}

fn bit(bits: &[u64], s: SampleId) -> bool {
    bits[s as usize / 64] & (1 << (s % 64)) != 0
}

fn set_bit(bits: &mut [u64], s: SampleId, on: bool) {
    let (w, b) = (s as usize / 64, 1u64 << (s % 64));
    if on {
        bits[w] |= b;
    } else {
        bits[w] &= !b;
    }
}

impl<S: StreamSource> TierPlanner<S> {
    /// A planner of `kind` with `memory_capacity_bytes` of memory over
    /// `disk_capacity_bytes` of disk, whose disk already holds `seeds` (empty on a first
    /// run), over `source`, whose samples are sized by `sizes`.
    ///
    /// # Errors
    /// [`CacheError::NoTieredPlan`] for [`PolicyKind::Lru`];
    /// [`CacheError::SeedOutOfRange`] for a seed without a size;
    /// [`CacheError::SampleOutOfRange`] if the stream names a sample without a size (here if
    /// the stream is read at construction, else later); [`CacheError::TooManySamples`] if
    /// `sizes` has more than `u32::MAX` entries.
    pub fn new(
        source: S,
        sizes: Arc<[u32]>,
        memory_capacity_bytes: u64,
        disk_capacity_bytes: u64,
        kind: PolicyKind,
        seeds: &[SampleId],
    ) -> Result<Self, CacheError> {
        Self::with_config(
            source,
            sizes,
            [memory_capacity_bytes, disk_capacity_bytes],
            kind,
            seeds,
            PlannerConfig::default(),
        )
    }

    /// [`new`](TierPlanner::new) with explicit tuning; `capacities_bytes` is `[memory,
    /// disk]`.
    ///
    /// # Errors
    /// As [`new`](TierPlanner::new).
    pub fn with_config(
        source: S,
        sizes: Arc<[u32]>,
        capacities_bytes: [u64; 2],
        kind: PolicyKind,
        seeds: &[SampleId],
        config: PlannerConfig,
    ) -> Result<Self, CacheError> {
        let [memory_capacity_bytes, disk_capacity_bytes] = capacities_bytes;
        let n = sizes.len();
        if u32::try_from(n).is_err() {
            return Err(CacheError::TooManySamples { num_samples: n });
        }
        let mut seeds = seeds.to_vec();
        seeds.sort_unstable();
        seeds.dedup();
        if let Some(&s) = seeds.iter().find(|&&s| s as usize >= n) {
            return Err(CacheError::SeedOutOfRange {
                sample: s,
                num_samples: n,
            });
        }
        let mut seeded = vec![0u64; n.div_ceil(64)];
        let mut parked = VecDeque::new();
        let mut parked_bits = vec![0u64; n.div_ceil(64)];
        let mut parked_bytes = 0u64;
        let mut dropped_seeds = Vec::new();
        let levels = match kind {
            PolicyKind::Lru => return Err(CacheError::NoTieredPlan { policy: "lru" }),
            PolicyKind::Reuse => {
                let held_capacity_bytes =
                    held_capacity_bytes(&sizes, memory_capacity_bytes, disk_capacity_bytes);
                let mut held = ReusePolicy::new(sizes.clone(), held_capacity_bytes);
                let memory = ReusePolicy::new(sizes.clone(), memory_capacity_bytes);
                if !seeds.is_empty() {
                    let first = scan(&source, n, &seeds, false)?.first;
                    let mut order: Vec<(u64, SampleId)> =
                        seeds.iter().map(|&s| (first[s as usize], s)).collect();
                    order.sort_unstable();
                    let budget = disk_capacity_bytes.min(held_capacity_bytes);
                    for (first_use, s) in order {
                        let size = u64::from(sizes[s as usize]);
                        if first_use == NEVER {
                            if held.used_bytes() + parked_bytes + size <= disk_capacity_bytes {
                                parked.push_back(s);
                                set_bit(&mut parked_bits, s, true);
                                parked_bytes += size;
                                set_bit(&mut seeded, s, true);
                            } else {
                                dropped_seeds.push(s);
                            }
                        } else if held.used_bytes() + parked_bytes + size <= budget
                            && held.seed(s, first_use)
                        {
                            set_bit(&mut seeded, s, true);
                        } else {
                            dropped_seeds.push(s);
                        }
                    }
                }
                Levels::Reuse {
                    held,
                    memory,
                    held_evicted: Vec::new(),
                    memory_evicted: Vec::new(),
                }
            }
            PolicyKind::Static => {
                let Scan { mut counts, first } = scan(&source, n, &seeds, true)?;
                let memory =
                    StaticPolicy::new(sizes.clone(), memory_capacity_bytes, &counts, &first);
                for (s, c) in counts.iter_mut().enumerate() {
                    if memory.is_pinned(s as SampleId) {
                        *c = 0;
                    }
                }
                let mut disk =
                    StaticPolicy::new(sizes.clone(), disk_capacity_bytes, &counts, &first);
                for &s in &seeds {
                    if disk.seed(s) {
                        set_bit(&mut seeded, s, true);
                    } else {
                        dropped_seeds.push(s);
                    }
                }
                Levels::Static { memory, disk }
            }
        };
        dropped_seeds.sort_unstable();
        let batch = config
            .batch_accesses_max
            .unwrap_or(DEFAULT_BATCH_PER_SAMPLE_X2 * n / 2);
        let look_ahead = kind == PolicyKind::Reuse;
        Ok(TierPlanner {
            index: NextUseIndex::new(source, n, look_ahead, batch),
            levels,
            sizes,
            memory_capacity_bytes,
            disk_capacity_bytes,
            kind,
            seeded,
            parked,
            parked_bits,
            parked_bytes,
            dropped_seeds,
            stats: TierStats::default(),
        })
    }

    /// Decides the next access of the stream; `None` at its end.
    ///
    /// `evicted` is cleared, then filled. A loader carries the decision out in this order,
    /// and then neither level ever holds more than its capacity, at any point:
    /// 1. take the sample's bytes from `found` (memory, the disk, or the store);
    /// 2. drop the disk entries of `evicted.disk`;
    /// 3. write each of `evicted.demoted` to the disk from its memory bytes, then drop every
    ///    sample of `evicted.memory` from memory;
    /// 4. keep the sample where `kept` says: in memory, or written to the disk if
    ///    `write_disk` (a disk hit kept on the disk is already there).
    ///
    /// Contract (checked by the tests and the fuzz checker): `found` is where the sample
    /// was after the previous decision; `kept` is `Memory` or `None` after a memory hit;
    /// `write_disk` iff found `None` and kept `Disk`; the accessed sample is in
    /// `evicted.disk` iff it was found on the disk and is not kept there, in
    /// `evicted.memory` iff it was found in memory and is kept nowhere, and never in
    /// `demoted`; every other sample listed is where the list says it leaves from; after
    /// the decision the bytes in memory never exceed the memory capacity, nor those on the
    /// disk the disk capacity (asserted here).
    ///
    /// # Errors
    /// [`CacheError::SampleOutOfRange`] if the stream names a sample without a size.
    pub fn next(&mut self, evicted: &mut TierEvicted) -> Result<Option<TierDecision>, CacheError> {
        evicted.clear();
        let Some(a) = self.index.next_access()? else {
            return Ok(None);
        };
        let s = a.sample;
        let size_bytes = self.sizes[s as usize];
        let (found, kept) = match &mut self.levels {
            Levels::Reuse {
                held,
                memory,
                held_evicted,
                memory_evicted,
            } => {
                debug_assert!(
                    !bit(&self.parked_bits, s),
                    "a parked sample is not accessed"
                );
                let found = if memory.contains(s) {
                    Some(Tier::Memory)
                } else if held.contains(s) {
                    Some(Tier::Disk)
                } else {
                    None
                };
                held_evicted.clear();
                let out = held.access(s, a.position, a.next_use, held_evicted);
                for &e in held_evicted.iter().filter(|&&e| e != s) {
                    if memory.remove(e) {
                        evicted.memory.push(e);
                    } else {
                        evicted.disk.push(e);
                    }
                }
                if out.hit || out.admitted {
                    memory_evicted.clear();
                    memory.access(s, a.position, a.next_use, memory_evicted);
                    for &e in memory_evicted.iter() {
                        evicted.memory.push(e);
                        if e != s {
                            evicted.demoted.push(e);
                        }
                    }
                }
                let kept = if memory.contains(s) {
                    Some(Tier::Memory)
                } else if held.contains(s) {
                    Some(Tier::Disk)
                } else if found == Some(Tier::Disk) {
                    // Its last use: parked where it is.
                    debug_assert_eq!(a.next_use, NEVER);
                    self.parked.push_back(s);
                    set_bit(&mut self.parked_bits, s, true);
                    self.parked_bytes += u64::from(size_bytes);
                    Some(Tier::Disk)
                } else {
                    None
                };
                // Parked entries give way to the rule's.
                while held.used_bytes() - memory.used_bytes() + self.parked_bytes
                    > self.disk_capacity_bytes
                {
                    let p = self
                        .parked
                        .pop_front()
                        .expect("the rule alone keeps the disk within its capacity");
                    set_bit(&mut self.parked_bits, p, false);
                    self.parked_bytes -= u64::from(self.sizes[p as usize]);
                    evicted.disk.push(p);
                }
                (found, kept)
            }
            Levels::Static { memory, disk } => {
                if memory.contains(s) {
                    (Some(Tier::Memory), Some(Tier::Memory))
                } else if disk.contains(s) {
                    (Some(Tier::Disk), Some(Tier::Disk))
                } else {
                    let mut none = Vec::new();
                    let kept = if memory.access(s, a.position, a.next_use, &mut none).admitted {
                        Some(Tier::Memory)
                    } else if disk.access(s, a.position, a.next_use, &mut none).admitted {
                        Some(Tier::Disk)
                    } else {
                        None
                    };
                    debug_assert!(none.is_empty(), "static pins never evict");
                    (None, kept)
                }
            }
        };
        if found == Some(Tier::Disk) && kept != Some(Tier::Disk) {
            evicted.disk.push(s);
        }
        let write_disk = found.is_none() && kept == Some(Tier::Disk);
        self.record(found, write_disk, s, size_bytes, evicted);
        let (memory_bytes, disk_bytes) = (self.memory_used_bytes(), self.disk_used_bytes());
        assert!(
            memory_bytes <= self.memory_capacity_bytes,
            "memory level holds {memory_bytes} bytes over its capacity of {}",
            self.memory_capacity_bytes
        );
        assert!(
            disk_bytes <= self.disk_capacity_bytes,
            "disk level holds {disk_bytes} bytes over its capacity of {}",
            self.disk_capacity_bytes
        );
        Ok(Some(TierDecision {
            position: a.position,
            epoch: a.epoch,
            sample: s,
            size_bytes,
            found,
            kept,
            write_disk,
        }))
    }

    fn record(
        &mut self,
        found: Option<Tier>,
        write_disk: bool,
        s: SampleId,
        size_bytes: u32,
        evicted: &TierEvicted,
    ) {
        let size = u64::from(size_bytes);
        let st = &mut self.stats;
        st.accesses += 1;
        match found {
            Some(Tier::Memory) => {
                st.memory_hits += 1;
                st.memory_hit_bytes += size;
            }
            Some(Tier::Disk) => {
                st.disk_hits += 1;
                st.disk_hit_bytes += size;
                if bit(&self.seeded, s) {
                    st.seed_hits += 1;
                    st.seed_hit_bytes += size;
                }
            }
            None => {
                st.store_reads += 1;
                st.store_read_bytes += size;
            }
        }
        if write_disk {
            st.disk_writes += 1;
            st.disk_write_bytes += size;
        }
        for &e in &evicted.demoted {
            st.demotions += 1;
            st.disk_writes += 1;
            st.disk_write_bytes += u64::from(self.sizes[e as usize]);
        }
        for &e in &evicted.disk {
            set_bit(&mut self.seeded, e, false);
        }
    }

    /// Runs the stream to its end and returns the totals.
    ///
    /// # Errors
    /// As [`next`](TierPlanner::next).
    pub fn run_to_end(&mut self) -> Result<TierStats, CacheError> {
        let mut evicted = TierEvicted::default();
        while self.next(&mut evicted)?.is_some() {}
        Ok(self.stats)
    }

    /// Counters so far.
    pub fn stats(&self) -> TierStats {
        self.stats
    }

    /// Which plan this is.
    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// Where `sample` is now.
    pub fn location(&self, sample: SampleId) -> Option<Tier> {
        let (in_memory, on_disk) = match &self.levels {
            Levels::Reuse { held, memory, .. } => (
                memory.contains(sample),
                held.contains(sample) || bit(&self.parked_bits, sample),
            ),
            Levels::Static { memory, disk } => (memory.contains(sample), disk.contains(sample)),
        };
        if in_memory {
            Some(Tier::Memory)
        } else if on_disk {
            Some(Tier::Disk)
        } else {
            None
        }
    }

    /// Bytes in memory now.
    pub fn memory_used_bytes(&self) -> u64 {
        match &self.levels {
            Levels::Reuse { memory, .. } => memory.used_bytes(),
            Levels::Static { memory, .. } => memory.used_bytes(),
        }
    }

    /// Bytes on the disk now (seeds kept and parked entries included).
    pub fn disk_used_bytes(&self) -> u64 {
        match &self.levels {
            Levels::Reuse { held, memory, .. } => {
                held.used_bytes() - memory.used_bytes() + self.parked_bytes
            }
            Levels::Static { disk, .. } => disk.used_bytes(),
        }
    }

    /// The bytes the `reuse` rule holds in both levels together, `H` (see the type's docs);
    /// `M + D` for `static`.
    pub fn held_capacity_bytes(&self) -> u64 {
        match &self.levels {
            Levels::Reuse { held, .. } => held.capacity_bytes(),
            Levels::Static { .. } => self.memory_capacity_bytes + self.disk_capacity_bytes,
        }
    }

    /// Seeds the plan does not keep (never accessed, not wanted, or over the budget),
    /// ascending: delete them from the disk before the first access.
    pub fn dropped_seeds(&self) -> &[SampleId] {
        &self.dropped_seeds
    }

    /// Heap bytes held by the planner (index, both levels, seed bits), excluding the shared
    /// size table.
    pub fn memory_bytes(&self) -> usize {
        let levels = match &self.levels {
            Levels::Reuse {
                held,
                memory,
                held_evicted,
                memory_evicted,
            } => {
                held.memory_bytes()
                    + memory.memory_bytes()
                    + (held_evicted.capacity() + memory_evicted.capacity()) * size_of::<SampleId>()
            }
            Levels::Static { memory, disk } => memory.memory_bytes() + disk.memory_bytes(),
        };
        self.index.memory_bytes()
            + levels
            + (self.seeded.capacity() + self.parked_bits.capacity()) * size_of::<u64>()
            + self.parked.capacity() * size_of::<SampleId>()
            + self.dropped_seeds.capacity() * size_of::<SampleId>()
            + size_of::<Self>()
    }
}

/// `H` of the `reuse` rule: see [`TierPlanner`]'s docs.
fn held_capacity_bytes(sizes: &[u32], memory_capacity_bytes: u64, disk_capacity_bytes: u64) -> u64 {
    fn gcd(mut a: u64, mut b: u64) -> u64 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
    let max_size = u64::from(sizes.iter().copied().max().unwrap_or(0).max(1));
    let g = sizes.iter().fold(0, |g, &z| gcd(g, u64::from(z))).max(1);
    let least = (memory_capacity_bytes + 1).saturating_sub(max_size);
    disk_capacity_bytes.saturating_add(least.div_ceil(g) * g)
}

struct Scan {
    /// Accesses per sample (empty unless asked for).
    counts: Vec<u32>,
    /// First access per sample ([`NEVER`] if none), for every sample when counting, else
    /// for the seeds only.
    first: Vec<u64>,
}

/// One pass over the stream: access counts and first accesses of every sample, or only the
/// first accesses of `seeds` (sorted), stopping once all are found.
fn scan<S: StreamSource>(
    source: &S,
    n: usize,
    seeds: &[SampleId],
    count: bool,
) -> Result<Scan, CacheError> {
    let mut counts = if count { vec![0u32; n] } else { Vec::new() };
    let mut first = vec![NEVER; n];
    let mut pending = if count { 0 } else { seeds.len() };
    let mut want = vec![0u64; n.div_ceil(64)];
    for &s in seeds {
        set_bit(&mut want, s, true);
    }
    let mut buf = Vec::new();
    let mut pos = 0u64;
    for epoch in 0..source.epochs() {
        if !count && pending == 0 {
            break;
        }
        buf.clear();
        source.fill_epoch(epoch, &mut buf);
        for &s in &buf {
            if s as usize >= n {
                return Err(CacheError::SampleOutOfRange {
                    sample: s,
                    epoch,
                    num_samples: n,
                });
            }
            if count {
                let c = &mut counts[s as usize];
                if *c == 0 {
                    first[s as usize] = pos;
                }
                *c = c.saturating_add(1);
            } else if bit(&want, s) {
                set_bit(&mut want, s, false);
                first[s as usize] = pos;
                pending -= 1;
            }
            pos += 1;
        }
    }
    Ok(Scan { counts, first })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VecSource;

    type Step = (Option<Tier>, Option<Tier>, bool, TierEvicted);

    fn ev(memory: &[SampleId], demoted: &[SampleId], disk: &[SampleId]) -> TierEvicted {
        TierEvicted {
            memory: memory.to_vec(),
            demoted: demoted.to_vec(),
            disk: disk.to_vec(),
        }
    }

    fn steps(
        epochs: Vec<Vec<SampleId>>,
        sizes: &[u32],
        memory: u64,
        disk: u64,
        kind: PolicyKind,
        seeds: &[SampleId],
    ) -> (Vec<Step>, TierPlanner<VecSource>) {
        let mut p = TierPlanner::new(
            VecSource::new(epochs),
            sizes.to_vec().into(),
            memory,
            disk,
            kind,
            seeds,
        )
        .unwrap();
        let mut evicted = TierEvicted::default();
        let mut out = Vec::new();
        while let Some(d) = p.next(&mut evicted).unwrap() {
            out.push((d.found, d.kept, d.write_disk, evicted.clone()));
        }
        (out, p)
    }

    const M: Option<Tier> = Some(Tier::Memory);
    const D: Option<Tier> = Some(Tier::Disk);

    #[test]
    fn memory_keeps_belady_of_m_and_the_disk_the_rest_of_belady_of_m_plus_d() {
        // Next uses: 0 at 5, 1 at 4, 2 at 3. Memory of one sample over a disk of one.
        let (got, p) = steps(
            vec![vec![0, 1, 2], vec![2, 1, 0]],
            &[1; 3],
            1,
            1,
            PolicyKind::Reuse,
            &[],
        );
        let want: Vec<Step> = vec![
            (None, M, false, ev(&[], &[], &[])),
            // 1 is needed before 0: 0 is demoted to the disk.
            (None, M, false, ev(&[0], &[0], &[])),
            // Both levels full: 0 (farthest) leaves the disk, 1 is demoted for 2.
            (None, M, false, ev(&[1], &[1], &[0])),
            (M, None, false, ev(&[2], &[], &[])),
            // Its last use: parked on the disk for a next run.
            (D, D, false, ev(&[], &[], &[])),
            (None, None, false, ev(&[], &[], &[])),
        ];
        assert_eq!(got, want);
        let st = p.stats();
        assert_eq!(
            (
                st.memory_hits,
                st.disk_hits,
                st.store_reads,
                st.demotions,
                st.disk_writes
            ),
            (1, 1, 4, 2, 2)
        );
        assert_eq!((p.memory_used_bytes(), p.disk_used_bytes()), (0, 1));
        assert_eq!(p.location(1), D);
    }

    #[test]
    fn a_store_read_memory_will_not_take_is_written_to_the_disk_and_promoted_when_it_can() {
        // 0 is needed at 2, before 1 (at 3): memory keeps 0, the disk takes 1; at 3 memory is
        // free again and takes 1 from the disk, whose entry is dropped.
        let (got, _) = steps(
            vec![vec![0, 1, 0, 1, 1]],
            &[1; 2],
            1,
            1,
            PolicyKind::Reuse,
            &[],
        );
        let want: Vec<Step> = vec![
            (None, M, false, ev(&[], &[], &[])),
            (None, D, true, ev(&[], &[], &[])),
            (M, None, false, ev(&[0], &[], &[])),
            (D, M, false, ev(&[], &[], &[1])),
            (M, None, false, ev(&[1], &[], &[])),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn the_held_budget_leaves_room_for_the_largest_sample_so_the_disk_stays_in_bounds() {
        // Sizes 1 and 3, memory 3, disk 3: the rule holds at most 3 + 3 + 1 - 3 = 4 bytes.
        let (_, p) = steps(vec![vec![0, 1]], &[1, 3], 3, 3, PolicyKind::Reuse, &[]);
        assert_eq!(p.held_capacity_bytes(), 4);
        let (_, p) = steps(vec![vec![0]], &[1; 1], 2, 5, PolicyKind::Reuse, &[]);
        assert_eq!(p.held_capacity_bytes(), 7);
        // All sizes 10: memory holds 10 after any refusal, so the rule holds 20.
        let (_, p) = steps(vec![vec![0]], &[10; 3], 10, 10, PolicyKind::Reuse, &[]);
        assert_eq!(p.held_capacity_bytes(), 20);
        // Sizes 4 and 6, memory 10: at least 5 after a refusal, so 6 (even): 5 + 6.
        let (_, p) = steps(vec![vec![0]], &[4, 6], 10, 5, PolicyKind::Reuse, &[]);
        assert_eq!(p.held_capacity_bytes(), 11);
        // Memory smaller than the largest sample: the rule holds the disk's bytes.
        let (_, p) = steps(vec![vec![0]], &[4, 6], 5, 5, PolicyKind::Reuse, &[]);
        assert_eq!(p.held_capacity_bytes(), 5);
    }

    #[test]
    fn seeds_are_kept_nearest_first_within_the_disk_and_hit_from_it() {
        // Disk of 2: seeds 0 (first use 2), 1 (first use 0), 3 (never used), 2 (first use 1).
        // 1 and 2 are kept; 0 does not fit; 3 is never used.
        let (got, p) = steps(
            vec![vec![1, 2, 0], vec![0]],
            &[1; 4],
            0,
            2,
            PolicyKind::Reuse,
            &[3, 0, 1, 2],
        );
        assert_eq!(p.dropped_seeds(), &[0, 3]);
        let want: Vec<Step> = vec![
            // 1 and 2 are at their last uses: parked.
            (D, D, false, ev(&[], &[], &[])),
            (D, D, false, ev(&[], &[], &[])),
            // 0 needs the room of the oldest parked entry.
            (None, D, true, ev(&[], &[], &[1])),
            (D, D, false, ev(&[], &[], &[])),
        ];
        assert_eq!(got, want);
        let st = p.stats();
        assert_eq!((st.seed_hits, st.disk_hits, st.store_reads), (2, 3, 1));
        assert_eq!((p.location(1), p.location(2), p.location(0)), (None, D, D));
        // A seed never accessed is parked while there is room, and gives way.
        let (got, p) = steps(
            vec![vec![1, 2, 0], vec![0]],
            &[1; 4],
            0,
            2,
            PolicyKind::Reuse,
            &[3],
        );
        assert!(p.dropped_seeds().is_empty());
        assert_eq!(got[2], (None, D, true, ev(&[], &[], &[])));
        assert_eq!((p.location(3), p.location(0)), (D, D));
        let (got, _) = steps(
            vec![vec![1, 0, 2], vec![2, 0]],
            &[1; 4],
            0,
            1,
            PolicyKind::Reuse,
            &[3],
        );
        assert_eq!(got[1], (None, D, true, ev(&[], &[], &[3])));
    }

    #[test]
    fn static_pins_the_most_accessed_in_memory_then_the_next_on_the_disk() {
        // Counts: 0 three times, 1 twice, 2 twice, 3 once. Memory of 1 pins 0, disk of 1
        // pins 1 (accessed first among the twice-accessed); 2 and 3 are never kept. Seed 2
        // is not pinned and is dropped, seed 1 is on the disk already.
        let (got, p) = steps(
            vec![vec![0, 1, 2, 3], vec![0, 2, 1, 0]],
            &[1; 4],
            1,
            1,
            PolicyKind::Static,
            &[2],
        );
        assert_eq!(p.dropped_seeds(), &[2]);
        let none = ev(&[], &[], &[]);
        let want: Vec<Step> = vec![
            (None, M, false, none.clone()),
            (None, D, true, none.clone()),
            (None, None, false, none.clone()),
            (None, None, false, none.clone()),
            (M, M, false, none.clone()),
            (None, None, false, none.clone()),
            (D, D, false, none.clone()),
            (M, M, false, none.clone()),
        ];
        assert_eq!(got, want);
        let (got, p) = steps(
            vec![vec![0, 1], vec![1, 0]],
            &[1; 2],
            1,
            1,
            PolicyKind::Static,
            &[1],
        );
        assert_eq!(p.dropped_seeds(), &[] as &[SampleId]);
        assert_eq!(got[1].0, D);
        // Both hits of 1 are on the seeded entry, never rewritten.
        assert_eq!(p.stats().seed_hits, 2);
    }

    #[test]
    fn lru_and_seeds_without_a_size_are_refused_by_name() {
        let source = || VecSource::new(vec![vec![0]]);
        let sizes: Arc<[u32]> = vec![1].into();
        let e = TierPlanner::new(source(), sizes.clone(), 1, 1, PolicyKind::Lru, &[]).unwrap_err();
        assert!(e.to_string().contains("lru"), "{e}");
        let e = TierPlanner::new(source(), sizes, 1, 1, PolicyKind::Reuse, &[7]).unwrap_err();
        assert!(
            matches!(
                e,
                CacheError::SeedOutOfRange {
                    sample: 7,
                    num_samples: 1
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn reuse_remove_drops_a_sample_whose_heap_entry_is_then_skipped() {
        let sizes: Arc<[u32]> = vec![1; 4].into();
        let mut r = ReusePolicy::new(sizes, 2);
        let mut ev = Vec::new();
        assert!(r.access(0, 0, 10, &mut ev).admitted);
        assert!(r.access(1, 1, 5, &mut ev).admitted);
        assert!(r.remove(0));
        assert!(!r.remove(0));
        assert_eq!(r.used_bytes(), 1);
        // 2 fits without evicting; 3 then evicts 1 (next use 5 > 4), not the removed 0.
        assert!(r.access(2, 2, 3, &mut ev).admitted);
        assert!(ev.is_empty());
        assert!(r.access(3, 3, 4, &mut ev).admitted);
        assert_eq!(ev, vec![1]);
    }

    #[test]
    fn reuse_remove_survives_heap_compaction_and_never_evicts_a_removed_sample() {
        // 50 samples admitted; 10 of them (needed last of all) removed; 3000 round-robin
        // hits on the other 40 pile up stale heap entries until it compacts; then new
        // samples force evictions of the 40, needed again before the removed ones.
        let mut stream: Vec<SampleId> = (0..50).collect();
        stream.extend((0..3000).map(|i| 10 + i % 40));
        for s in 50..70 {
            stream.extend([s, s]);
        }
        stream.extend(10..50);
        stream.extend(0..10);
        let mut next = vec![NEVER; stream.len()];
        let mut seen = [NEVER; 70];
        for (p, &s) in stream.iter().enumerate().rev() {
            next[p] = seen[s as usize];
            seen[s as usize] = p as u64;
        }
        let mut r = ReusePolicy::new(vec![1; 70].into(), 50);
        let mut ev = Vec::new();
        for (p, &s) in stream.iter().enumerate() {
            if p == 50 {
                for x in 0..10 {
                    assert!(r.remove(x));
                }
            }
            ev.clear();
            let was: Vec<bool> = (0..70).map(|x| r.contains(x)).collect();
            let out = r.access(s, p as u64, next[p], &mut ev);
            assert_eq!(out.hit, was[s as usize], "at {p}");
            for &e in &ev {
                assert!(was[e as usize] && !r.contains(e), "at {p}: evicted {e}");
                assert!(e >= 10, "at {p}: evicted the removed {e}");
            }
            let cached = (0..70).filter(|&x| r.contains(x)).count() as u64;
            assert_eq!(r.used_bytes(), cached, "at {p}");
        }
        // Without compaction the heap would have grown to 4096 entries of 16 bytes.
        assert!(r.memory_bytes() < 64 * 1024, "{}", r.memory_bytes());
    }
}
