//! The glue to lobster-sched: a window's exact per-rank load in, io_depth and decode threads
//! per rank out.

use lobster_sched::{Allocator, CostModel, RankLoad, Tier};

use crate::error::Error;
use crate::metrics::AllocationRecord;

/// One access of a window, as the allocator sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AccessLoad {
    pub(crate) rank: usize,
    pub(crate) bytes: u64,
    pub(crate) hit: bool,
}

/// Runs the allocator on the window's accesses; threads it leaves spare go to the ranks
/// predicted slowest, since they decode all the same.
pub(crate) fn allocate(
    allocator: &mut Allocator,
    model: &CostModel,
    ranks: usize,
    decode_threads: u32,
    window: impl Iterator<Item = AccessLoad>,
    (epoch, first_iteration): (u32, usize),
) -> Result<AllocationRecord, Error> {
    let mut loads = vec![RankLoad::default(); ranks];
    for a in window {
        let tier = if a.hit { Tier::Cache } else { Tier::Storage };
        loads[a.rank].add_read(tier, a.bytes);
        loads[a.rank].add_decode(a.bytes);
    }
    let allocation = allocator
        .allocate(&loads, model)
        .map_err(|e| Error::engine("allocator", e))?;
    let report = allocation.imbalance();
    let mut threads: Vec<u32> = allocation.ranks.iter().map(|r| r.decode_threads).collect();
    let spare = decode_threads - threads.iter().sum::<u32>();
    let mut order: Vec<usize> = (0..threads.len()).collect();
    order.sort_by(|&a, &b| {
        allocation.ranks[b]
            .time_s
            .total_cmp(&allocation.ranks[a].time_s)
    });
    for i in 0..spare as usize {
        threads[order[i % order.len()]] += 1;
    }
    Ok(AllocationRecord {
        epoch,
        iteration: first_iteration as u32,
        io_depth: allocation.ranks.iter().map(|r| r.io_depth).collect(),
        decode_threads: threads,
        predicted_imbalance_equal: report.before,
        predicted_imbalance: report.after,
    })
}
