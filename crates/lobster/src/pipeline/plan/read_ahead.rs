//! Storage reads ahead of the prefetch distance, under the cluster plan.
//!
//! The cluster plan keeps the samples needed soonest, so the ones nobody holds are those
//! needed late in the next epoch: its storage reads come in a burst in each epoch's last
//! iterations while the link idles before. The planner may therefore issue a window's storage
//! reads up to an epoch ahead of the slowest rank, as long as the storage bytes of the windows
//! it issued beyond the prefetch distance stay within a budget. Only storage reads go early:
//! hits wait on landings (no memory) and a peer's fetch of such a window starts once the window
//! is within the prefetch distance, so peers' bytes are held no longer than without read-ahead.
//! A plan never depends on it: the decisions are made in stream order either way; only when
//! reads are issued changes.

use std::collections::VecDeque;
use std::sync::Arc;

use super::handles::ForPlanner;
use super::remote;
use crate::error::Error;
use crate::pipeline::access::Access;
use crate::pipeline::context::Context;

/// A window the planner issued beyond the prefetch distance.
#[derive(Debug)]
struct Ahead {
    /// Global iterations up to which the window plans (exclusive).
    end: usize,
    storage_bytes: u64,
}

/// The read-ahead's budget and what it has issued.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    bytes_max: u64,
    /// The farthest the planner runs ahead of the slowest rank, in iterations.
    lead_max: usize,
    /// The usual distance: windows within it are not read-ahead.
    prefetch: usize,
    ahead: VecDeque<Ahead>,
    ahead_bytes: u64,
    /// Peer fetches of windows issued ahead, with the window's end, started in order.
    deferred: VecDeque<(usize, Access, usize)>,
}

impl ReadAhead {
    pub(crate) fn new(bytes_max: u64, lead_max: usize, prefetch: usize) -> Self {
        ReadAhead {
            bytes_max,
            lead_max: lead_max.max(prefetch),
            prefetch,
            ahead: VecDeque::new(),
            ahead_bytes: 0,
            deferred: VecDeque::new(),
        }
    }

    /// The farthest the planner may run ahead: it decides a window this far ahead, then
    /// [`admit`](ReadAhead::admit) says when to issue it.
    pub(crate) fn lead_max(&self) -> usize {
        self.lead_max
    }

    /// Waits until the window ending at global iteration `end`, with `storage_bytes` of
    /// storage reads, may be issued: within the prefetch distance, or ahead of it within the
    /// budget. Returns whether it is issued ahead (its peer fetches then wait: [`defer`]).
    /// Starts the deferred fetches that come within the distance meanwhile.
    ///
    /// [`defer`]: ReadAhead::defer
    pub(crate) fn admit<T: Send + 'static>(
        &mut self,
        ctx: &Arc<Context<T>>,
        state: &Arc<ForPlanner<T>>,
        end: usize,
        storage_bytes: u64,
    ) -> Result<bool, Error> {
        loop {
            let slowest = state.progress.slowest();
            self.release(ctx, state, slowest);
            let within = slowest.saturating_add(self.prefetch);
            if end <= within {
                return Ok(false);
            }
            if end <= slowest.saturating_add(self.lead_max)
                && self.ahead_bytes + storage_bytes <= self.bytes_max
            {
                self.ahead.push_back(Ahead { end, storage_bytes });
                self.ahead_bytes += storage_bytes;
                return Ok(true);
            }
            // The next moment anything changes: this window, an earlier one or a deferred
            // fetch comes within the distance.
            let next = self
                .ahead
                .front()
                .map(|a| a.end)
                .into_iter()
                .chain(self.deferred.front().map(|d| d.0))
                .fold(end, usize::min);
            state
                .progress
                .wait_for_room(&state.stop, next.saturating_sub(self.prefetch), 0)?;
        }
    }

    /// Holds a peer fetch of a window issued ahead until the window is within the distance.
    pub(crate) fn defer(&mut self, end: usize, access: Access, peer: usize) {
        self.deferred.push_back((end, access, peer));
    }

    /// Starts every deferred fetch, waiting for each to come within the distance: once the
    /// planner has planned the whole stream.
    pub(crate) fn finish<T: Send + 'static>(
        &mut self,
        ctx: &Arc<Context<T>>,
        state: &Arc<ForPlanner<T>>,
    ) -> Result<(), Error> {
        while let Some(&(end, ..)) = self.deferred.front() {
            state
                .progress
                .wait_for_room(&state.stop, end.saturating_sub(self.prefetch), 0)?;
            self.release(ctx, state, state.progress.slowest());
        }
        Ok(())
    }

    /// Forgets the windows and starts the fetches that are within the distance of `slowest`.
    fn release<T: Send + 'static>(
        &mut self,
        ctx: &Arc<Context<T>>,
        state: &Arc<ForPlanner<T>>,
        slowest: usize,
    ) {
        let within = slowest.saturating_add(self.prefetch);
        while self.ahead.front().is_some_and(|a| a.end <= within) {
            let a = self.ahead.pop_front().expect("checked");
            self.ahead_bytes -= a.storage_bytes;
        }
        while self.deferred.front().is_some_and(|d| d.0 <= within) {
            let (_, access, peer) = self.deferred.pop_front().expect("checked");
            remote::start(ctx, state, access, peer);
        }
    }
}

/// The read-ahead budget under the cluster plan: this node's share of the storage reads of a
/// steady epoch (the floor `F - nodes * C` over the nodes), with a quarter more for the
/// shares' spread, and at most the cache's capacity. Zero where the caches hold the dataset.
pub(crate) fn budget_bytes(dataset_bytes: u64, nodes: usize, capacity_bytes: u64) -> u64 {
    let floor = dataset_bytes.saturating_sub(capacity_bytes.saturating_mul(nodes as u64));
    let share = floor / nodes.max(1) as u64;
    share.saturating_add(share / 4).min(capacity_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_the_nodes_share_of_the_floor_and_a_quarter_bounded_by_the_cache() {
        // F 1000, 4 nodes of 200: floor 200, share 50, and a quarter: 62.
        assert_eq!(budget_bytes(1000, 4, 200), 62);
        // The caches hold the dataset: nothing to read ahead.
        assert_eq!(budget_bytes(1000, 8, 150), 0);
        // Never more than the cache.
        assert_eq!(budget_bytes(1_000_000, 2, 10), 10);
        assert_eq!(budget_bytes(u64::MAX, 65_535, u64::MAX), 0);
    }
}
