//! The node's shape in the job and the canonical order of its stream.

use lobster_cache::StreamSource;

use crate::sampler::DistributedSampler;

/// Which accesses this node makes, and in what order: (epoch, iteration, local rank, position
/// in batch). Every cache decision and every queue follows this order.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(crate) sampler: DistributedSampler,
    pub(crate) world: usize,
    pub(crate) first_rank: usize,
    pub(crate) ranks: usize,
    pub(crate) batch: usize,
    pub(crate) per_rank: usize,
    pub(crate) epochs: u32,
}

impl Layout {
    /// Node `node`'s layout, its ranks `ranks_per_node` consecutive ranks of `sampler`'s world.
    pub(crate) fn of_node(
        sampler: DistributedSampler,
        ranks_per_node: usize,
        node: usize,
        batch: usize,
        epochs: u32,
    ) -> Layout {
        Layout {
            per_rank: sampler.per_rank(),
            world: sampler.world(),
            first_rank: node * ranks_per_node,
            ranks: ranks_per_node,
            batch,
            epochs,
            sampler,
        }
    }

    pub(crate) fn iterations(&self) -> usize {
        self.per_rank.div_ceil(self.batch)
    }

    /// Iterations since the first epoch's first: a batch's place in the whole run.
    pub(crate) fn step(&self, epoch: u32, iteration: usize) -> u64 {
        u64::from(epoch) * self.iterations() as u64 + iteration as u64
    }

    /// The step of the access at `position` of the node stream (canonical order; every
    /// iteration but an epoch's last holds `ranks * batch` accesses).
    pub(crate) fn step_at(&self, position: u64) -> u64 {
        let per_epoch = (self.ranks * self.per_rank) as u64;
        let per_iteration = (self.ranks * self.batch) as u64;
        let iterations = self.iterations() as u64;
        let (epoch, within) = (position / per_epoch, position % per_epoch);
        epoch * iterations + (within / per_iteration).min(iterations - 1)
    }

    pub(crate) fn batch_len(&self, iteration: usize) -> usize {
        self.batch.min(self.per_rank - iteration * self.batch)
    }

    /// Visits the node's accesses of one epoch in canonical order:
    /// (iteration, local rank, position in batch, sample).
    pub(crate) fn walk_epoch(&self, epoch: u32, mut visit: impl FnMut(usize, usize, usize, u32)) {
        let order = self.sampler.epoch_indices(epoch);
        for iteration in 0..self.iterations() {
            for rank in 0..self.ranks {
                for pos in 0..self.batch_len(iteration) {
                    let k = iteration * self.batch + pos;
                    visit(
                        iteration,
                        rank,
                        pos,
                        order[self.first_rank + rank + k * self.world],
                    );
                }
            }
        }
    }
}

impl StreamSource for Layout {
    fn epochs(&self) -> u32 {
        self.epochs
    }

    fn fill_epoch(&self, epoch: u32, out: &mut Vec<u32>) {
        self.walk_epoch(epoch, |_, _, _, sample| out.push(sample));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_number_the_runs_batches_in_order() {
        // 10 samples over 2 ranks of batch 2: 3 iterations per epoch, the last one short.
        let sampler = DistributedSampler::new(10, 2, false, crate::EpochOrder::Sequential)
            .expect("a valid sampler");
        let layout = Layout {
            sampler,
            world: 2,
            first_rank: 0,
            ranks: 2,
            batch: 2,
            per_rank: 5,
            epochs: 3,
        };
        let mut next = 0;
        for epoch in 0..layout.epochs {
            for iteration in 0..layout.iterations() {
                assert_eq!(layout.step(epoch, iteration), next);
                next += 1;
            }
        }
        assert_eq!(next, 9);
        assert_eq!(layout.batch_len(2), 1);
    }
}
