//! The disk thread: carries out the plan's disk operations (reads of disk hits, drops,
//! writes) one at a time, in the order the planner decided them, on the loader's disk
//! cache ([`lobster_tier::DiskTier`]).
//!
//! One thread in plan order, rather than reads on the decode workers or the dispatcher, so
//! that the tier is where the plan says at every step without any hand-off between threads:
//! a disk hit is read before the drop its own decision makes, an entry is written before a
//! later hit reads it (so no read ever finds its entry still being written), and a drop frees
//! room before the write the plan made room for. A write waits for its sample's bytes to land
//! (from storage, or for a demotion from the memory cache's copy); the bytes it waits on are
//! always read for an earlier or the same access, by the dispatcher, a worker or this thread,
//! so it never waits on itself.
//!
//! What the files give never changes a decision, only where bytes come from: a planned disk
//! hit whose entry cannot be read (damaged, or missing since its write found the disk full)
//! goes to a decode worker to read from storage, counted, and its batch is the same.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;
use crossbeam_channel::Receiver;
use lobster_cache::TierStats;
use lobster_tier::{DiskTier, TierError};

use crate::metrics::DiskCacheMetrics;
use crate::pipeline::access::{fill_for, Access, AccessLanding, Read, Ready};
use crate::pipeline::context::Context;
use crate::pipeline::decode::queue::DecodeQueues;
use crate::pipeline::landing::Origin;
use crate::pipeline::sync::{lock, StopSignal};

/// The loader's disk cache: its files, what the plan budgets, and what it did.
#[derive(Debug)]
pub(crate) struct DiskLevel {
    pub(crate) tier: DiskTier,
    /// Entries found at open: the plan's seeds.
    pub(crate) seeds: Vec<u32>,
    seed_bytes: u64,
    /// The disk bytes the plan budgets, in sample bytes.
    pub(crate) plan_capacity_bytes: u64,
    counters: DiskCounters,
    /// The plan's totals, once the planner is done.
    pub(crate) planned: Mutex<Option<(TierStats, u64)>>,
    /// Set when the disk thread has applied its last operation.
    finished: Mutex<bool>,
    finished_cv: Condvar,
}

#[derive(Debug, Default)]
struct DiskCounters {
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    fallbacks: AtomicU64,
    full: AtomicU64,
    damaged: AtomicU64,
    io_errors: AtomicU64,
    writes_skipped: AtomicU64,
    removes: AtomicU64,
}

/// One disk operation of the plan, in the plan's order.
#[derive(Debug)]
pub(crate) enum DiskOp {
    /// Read a disk hit's bytes and hand the access to the decode queues.
    Read(Access),
    /// Drop the sample's entry.
    Remove(u32),
    /// Write the sample's bytes once they are in `landing`.
    Write {
        sample: u32,
        landing: Arc<AccessLanding>,
    },
}

/// What the disk thread is given.
pub(crate) struct ForDisk {
    pub(crate) stop: Arc<StopSignal>,
    pub(crate) decode: Arc<DecodeQueues>,
    pub(crate) level: Arc<DiskLevel>,
}

impl DiskLevel {
    /// The level over `tier`, whose entries at open are the plan's seeds; `sizes` sizes
    /// the dataset's samples.
    pub(crate) fn new(tier: DiskTier, sizes: &[u32], plan_capacity_bytes: u64) -> Self {
        let seeds = tier.entries();
        let seed_bytes = seeds.iter().map(|&s| u64::from(sizes[s as usize])).sum();
        DiskLevel {
            tier,
            seeds,
            seed_bytes,
            plan_capacity_bytes,
            counters: DiskCounters::default(),
            planned: Mutex::new(None),
            finished: Mutex::new(false),
            finished_cv: Condvar::new(),
        }
    }

    /// Waits until the disk thread has applied every operation (called once every access
    /// is delivered and the planner is done, when only writes and drops can be left).
    pub(crate) fn wait_finished(&self, stop: &StopSignal) {
        let mut done = lock(&self.finished);
        while !*done && !stop.is_set() {
            done = self
                .finished_cv
                .wait_timeout(done, std::time::Duration::from_millis(20))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn set_finished(&self) {
        *lock(&self.finished) = true;
        self.finished_cv.notify_all();
    }

    /// What the disk cache did so far.
    pub(crate) fn metrics(&self) -> DiskCacheMetrics {
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (planned, seeds_dropped) = lock(&self.planned).unwrap_or_default();
        let st = self.tier.stats();
        DiskCacheMetrics {
            dir: self.tier.dir().display().to_string(),
            capacity_bytes: self.tier.capacity_bytes(),
            plan_capacity_bytes: self.plan_capacity_bytes,
            direct: self.tier.direct(),
            seeds: self.seeds.len() as u64,
            seed_bytes: self.seed_bytes,
            seeds_dropped,
            planned_hits: planned.disk_hits,
            planned_hit_bytes: planned.disk_hit_bytes,
            planned_seed_hits: planned.seed_hits,
            hits: n(&c.hits),
            hit_bytes: n(&c.hit_bytes),
            writes: n(&c.writes),
            write_bytes: n(&c.write_bytes),
            fallbacks: n(&c.fallbacks),
            full: n(&c.full),
            damaged: n(&c.damaged),
            io_errors: n(&c.io_errors),
            writes_skipped: n(&c.writes_skipped),
            removes: n(&c.removes),
            used_bytes: st.used_bytes,
            entries: st.entries,
        }
    }
}

/// The disk thread's body: applies each window's operations in order until the planner
/// ends, then writes the tier's index so that a next run finds its entries.
pub(crate) fn disk_thread<T>(ctx: &Context<T>, state: &ForDisk, ops: &Receiver<Vec<DiskOp>>) {
    let level = &state.level;
    let mut released = Vec::new();
    while let Ok(window) = ops.recv() {
        for op in window {
            if state.stop.is_set() {
                break;
            }
            match op {
                DiskOp::Read(access) => read(ctx, state, access, &mut released),
                DiskOp::Remove(sample) => {
                    if level.tier.remove(sample) {
                        level.counters.removes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                DiskOp::Write { sample, landing } => match landing.wait_bytes(&state.stop) {
                    Some(bytes) => write(level, sample, &bytes),
                    None if state.stop.is_set() => {}
                    None => {
                        level
                            .counters
                            .writes_skipped
                            .fetch_add(1, Ordering::Relaxed);
                    }
                },
            }
        }
    }
    if let Err(e) = level.tier.persist() {
        log::warn!("disk cache: its index was not written, a next run starts without it: {e}");
    }
    level.set_finished();
}

/// Reads a disk hit: its bytes fill its landing, or a worker reads it from storage.
fn read<T>(ctx: &Context<T>, state: &ForDisk, mut access: Access, released: &mut Vec<Ready>) {
    let c = &state.level.counters;
    match state.level.tier.read(access.sample) {
        Ok(bytes) => {
            c.hits.fetch_add(1, Ordering::Relaxed);
            c.hit_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            // The tier's buffer is the read's own: the memory cache keeps it as it is.
            fill_for(
                access,
                Ok(bytes),
                (Origin::Own, ctx.arena.as_ref()),
                released,
            );
            state.decode.push(released.drain(..));
        }
        Err(e) => {
            c.fallbacks.fetch_add(1, Ordering::Relaxed);
            match &e {
                TierError::Damaged { .. } => {
                    c.damaged.fetch_add(1, Ordering::Relaxed);
                }
                TierError::Io { .. } => {
                    c.io_errors.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
            log::warn!("disk cache: {e}; read from storage instead");
            // A worker reads it from storage and fills its landing, as a blocking read does.
            access.read = Read::Blocking { peer: None };
            state.decode.push([Ready {
                access,
                bytes: Ok(Bytes::new()),
            }]);
        }
    }
}

/// Writes a sample's entry; a refusal leaves it absent (a later planned hit falls back).
fn write(level: &DiskLevel, sample: u32, bytes: &Bytes) {
    let c = &level.counters;
    let mut result = level.tier.write(sample, bytes);
    if let Err(TierError::Exists { .. }) = result {
        // An entry the plan no longer knows of (it cannot be, but the bytes are the same
        // sample's): written again.
        level.tier.remove(sample);
        result = level.tier.write(sample, bytes);
    }
    match result {
        Ok(()) => {
            c.writes.fetch_add(1, Ordering::Relaxed);
            c.write_bytes
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        Err(TierError::Full { .. }) => {
            c.full.fetch_add(1, Ordering::Relaxed);
        }
        Err(e @ TierError::Io { .. }) => {
            c.io_errors.fetch_add(1, Ordering::Relaxed);
            log::warn!("disk cache: {e}");
        }
        Err(e) => {
            c.writes_skipped.fetch_add(1, Ordering::Relaxed);
            log::warn!("disk cache: {e}");
        }
    }
}
