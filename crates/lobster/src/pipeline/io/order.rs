//! The order of the node's storage reads ([`IoOrder`]).
//!
//! Under the default deadline order the node's reads form one queue: the oldest iteration
//! first, and within it each read at the fraction of its batch's storage bytes it completes,
//! so on a shared device every rank's batch finishes its reads at about the same time. Held
//! to per-rank io_depth shares instead, each rank streams its own reads at the rate of its
//! share, and ranks drift apart by whole reads whatever the shares are.

use std::cmp::Reverse;
use std::collections::VecDeque;

use crate::config::IoOrder;
use crate::pipeline::access::Access;

/// What the planner and the decode workers send the dispatcher.
#[derive(Debug)]
pub(crate) enum ToDispatcher {
    /// Reads, together so that their order is chosen over the whole window.
    Reads(Vec<Access>),
    /// io_depth per rank for the requests from stream position `from_seq` on.
    Depths { from_seq: u64, io_depth: Vec<u32> },
}

/// Sets each read's place in the [`IoOrder::Deadline`] order: the fraction, in parts per
/// million, of its batch's storage bytes read once it is. `reads` are in canonical order, so
/// each batch's reads are adjacent.
pub(crate) fn set_read_fractions(reads: &mut [Access]) {
    let batch_of = |a: &Access| (a.storage().step, a.rank);
    for batch in reads.chunk_by_mut(|a, b| batch_of(a) == batch_of(b)) {
        let total_bytes: u64 = batch.iter().map(|r| r.storage().bytes).sum();
        let mut read_bytes = 0;
        for r in batch {
            let read = r.storage_mut();
            read_bytes += read.bytes;
            // A batch of empty samples finishes with its first read.
            read.finish_ppm = (read_bytes * 1_000_000)
                .checked_div(total_bytes)
                .unwrap_or(1_000_000) as u32;
        }
    }
}

/// The rank whose next pending read goes to the reader now, if any. Both orders serve the
/// current iteration before the prefetched ones.
pub(crate) fn next_read(
    order: IoOrder,
    pending: &[VecDeque<Access>],
    in_flight: &[u32],
    depth: &[u32],
    budget: u32,
) -> Option<usize> {
    let fronts = || {
        pending
            .iter()
            .enumerate()
            .filter_map(|(r, q)| q.front().map(|a| (r, a)))
    };
    match order {
        IoOrder::Deadline => {
            if in_flight.iter().sum::<u32>() >= budget {
                return None;
            }
            fronts()
                .min_by_key(|&(r, a)| {
                    let q = a.storage();
                    (q.step, q.finish_ppm, Reverse(q.bytes), r)
                })
                .map(|(r, _)| r)
        }
        IoOrder::Shares => fronts()
            .filter(|&(r, _)| in_flight[r] < depth[r])
            .min_by_key(|(_, q)| q.seq)
            .map(|(r, _)| r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::access::{Read, StorageRead};
    use lobster_sched::equal_split;
    use rand::{Rng, SeedableRng};

    fn request(seq: u64, step: u64, rank: usize, finish_ppm: u32, bytes: u64) -> Access {
        Access {
            seq,
            epoch: 0,
            iteration: step as u32,
            rank,
            pos: 0,
            sample: seq as u32,
            cached: Default::default(),
            read: Read::Storage(StorageRead {
                step,
                finish_ppm,
                bytes,
            }),
            landing: Some(crate::pipeline::access::AccessLanding::new()),
        }
    }

    /// Sample sizes drawn from a seeded generator.
    fn sizes(seed: u64, n: usize) -> Vec<u64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen_range(20_000..420_000)).collect()
    }

    #[test]
    fn read_fractions_follow_each_batchs_storage_bytes() {
        // The misses of two iterations (steps 3 and 4) of two ranks, in canonical order.
        let mut reads = [
            request(1, 3, 0, 0, 100),
            request(2, 3, 0, 0, 300),
            request(3, 3, 1, 0, 0),
            request(4, 4, 0, 0, 10),
        ];
        set_read_fractions(&mut reads);
        let f: Vec<u32> = reads.iter().map(|r| r.storage().finish_ppm).collect();
        assert_eq!(f, vec![250_000, 1_000_000, 1_000_000, 1_000_000]);
    }

    /// Issues every pending read in `order` with room for all of them, onto a link that
    /// transfers one byte per unit of time in issue order; returns when each rank's last read
    /// of step 0 ends.
    fn rank_finish_times(order: IoOrder, pending: &mut [VecDeque<Access>]) -> Vec<u64> {
        let ranks = pending.len();
        let mut in_flight = vec![0; ranks];
        let depth = equal_split(1 << 20, ranks);
        let mut link = 0;
        let mut finish = vec![0; ranks];
        while let Some(r) = next_read(order, pending, &in_flight, &depth, 1 << 20) {
            let req = pending[r]
                .pop_front()
                .expect("next_read picks a rank with work");
            in_flight[r] += 1;
            link += req.storage().bytes;
            if req.storage().step == 0 {
                finish[r] = link;
            }
        }
        finish
    }

    /// Step 0's batches of four ranks with different miss counts, then one read of step 1.
    fn batches(seed: u64) -> Vec<VecDeque<Access>> {
        let misses = [7, 2, 12, 5];
        let mut seq = 0;
        let mut pending: Vec<VecDeque<Access>> = (0..4).map(|_| VecDeque::new()).collect();
        for (rank, &n) in misses.iter().enumerate() {
            let mut batch: Vec<Access> = sizes(seed + rank as u64, n)
                .into_iter()
                .map(|b| {
                    seq += 1;
                    request(seq, 0, rank, 0, b)
                })
                .collect();
            set_read_fractions(&mut batch);
            pending[rank].extend(batch);
        }
        seq += 1;
        pending[0].push_back(request(seq, 1, 0, 0, 1));
        pending
    }

    #[test]
    fn deadline_order_ends_every_ranks_batch_together() {
        for seed in 1..50 {
            let mut pending = batches(seed);
            let last_bytes: Vec<u64> = pending
                .iter()
                .map(|q| {
                    q.iter()
                        .rfind(|r| r.storage().step == 0)
                        .expect("every rank reads")
                        .storage()
                        .bytes
                })
                .collect();
            let step_bytes: u64 = pending
                .iter()
                .flatten()
                .filter(|r| r.storage().step == 0)
                .map(|r| r.storage().bytes)
                .sum();
            let finish = rank_finish_times(IoOrder::Deadline, &mut pending);
            // Only the ranks' last reads separate their ends, largest first.
            let mut others = last_bytes.clone();
            others.sort_unstable();
            let spread_max: u64 = others[..others.len() - 1].iter().sum();
            let earliest = *finish.iter().min().expect("four ranks");
            assert_eq!(
                *finish.iter().max().expect("four ranks"),
                step_bytes,
                "seed {seed}"
            );
            assert!(
                step_bytes - earliest <= spread_max,
                "seed {seed}: {finish:?}"
            );
            // The stream order ends rank 0's batch long before rank 2's.
            let mut pending = batches(seed);
            let stream = rank_finish_times(IoOrder::Shares, &mut pending);
            assert!(
                stream[0] < earliest,
                "seed {seed}: {stream:?} against {finish:?}"
            );
        }
    }

    #[test]
    fn deadline_order_serves_the_oldest_step_within_the_node_budget() {
        let mut pending: Vec<VecDeque<Access>> = (0..2).map(|_| VecDeque::new()).collect();
        pending[0].push_back(request(1, 5, 0, 900_000, 10));
        pending[1].push_back(request(2, 6, 1, 1, 10));
        // Rank 1's read is further through its batch but a step later.
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[0, 0], &[1, 1], 4),
            Some(0)
        );
        // The node's budget bounds the reads in flight; one rank may hold all of it.
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[4, 0], &[2, 2], 4),
            None
        );
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[3, 0], &[2, 2], 4),
            Some(0)
        );
        pending[0].clear();
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[0, 0], &[1, 1], 4),
            Some(1)
        );
        pending[1].clear();
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[0, 0], &[1, 1], 4),
            None
        );
    }

    #[test]
    fn shares_hold_each_rank_to_its_io_depth() {
        let mut pending: Vec<VecDeque<Access>> = (0..2).map(|_| VecDeque::new()).collect();
        pending[0].push_back(request(1, 0, 0, 500_000, 10));
        pending[1].push_back(request(2, 0, 1, 100_000, 10));
        assert_eq!(
            next_read(IoOrder::Shares, &pending, &[0, 0], &[1, 1], 2),
            Some(0)
        );
        assert_eq!(
            next_read(IoOrder::Shares, &pending, &[1, 0], &[1, 1], 2),
            Some(1)
        );
        assert_eq!(
            next_read(IoOrder::Shares, &pending, &[1, 1], &[1, 1], 2),
            None
        );
    }
}
