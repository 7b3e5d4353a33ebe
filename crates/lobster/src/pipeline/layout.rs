//! The node's shape in the job and the canonical order of its stream.

use lobster_cache::StreamSource;

use crate::sampler::DistributedSampler;

/// Which accesses this node makes, and in what order: (epoch, iteration, local rank, position
/// in batch). Every cache decision and every queue follows this order.
///
/// A resumed run starts at `start_epoch`, and its first epoch may be a [`Head`]: the rest of
/// an epoch begun before the interruption, possibly by another world. Steps count the run's
/// batches from its first, so that they meet the ranks' counts of batches taken.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(crate) sampler: DistributedSampler,
    pub(crate) world: usize,
    pub(crate) first_rank: usize,
    pub(crate) ranks: usize,
    pub(crate) batch: usize,
    pub(crate) per_rank: usize,
    pub(crate) epochs: u32,
    /// The first epoch the run plans (0 unless resumed).
    pub(crate) start_epoch: u32,
    /// The rest of epoch `start_epoch`, where the run resumes within it.
    pub(crate) head: Option<Head>,
}

/// The rest of an epoch a resumed run finishes: the remaining samples of the epoch's order,
/// split over this world as the sampler splits a whole epoch (rank `r`'s `k`-th sample at
/// `r + k * world`), with the world's batches counted from `first_iteration`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) order: std::sync::Arc<[u32]>,
    pub(crate) per_rank: usize,
    pub(crate) first_iteration: usize,
    /// The world the epoch began in, whose padding its order has.
    pub(crate) epoch_world: usize,
    /// Entries of the epoch's order taken before the head.
    pub(crate) consumed: u64,
}

impl Head {
    /// The head's batches per rank, `batch` samples each (its last may be short).
    pub(crate) fn steps(&self, batch: usize) -> usize {
        self.per_rank.div_ceil(batch)
    }
}

/// Where each epoch's batches end: a whole epoch's iterations, and a resumed head's end.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EpochEnds {
    head: Option<(u32, usize)>,
    iterations: usize,
}

impl EpochEnds {
    /// Whether the batch at `iteration` of `epoch` is that epoch's last.
    pub(crate) fn is_last(&self, epoch: u32, iteration: u32) -> bool {
        let end = match self.head {
            Some((e, end)) if e == epoch => end,
            _ => self.iterations,
        };
        iteration as usize + 1 == end
    }
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
            start_epoch: 0,
            head: None,
        }
    }

    /// The same layout, resumed at `start_epoch` with `head` the rest of that epoch.
    pub(crate) fn resumed(mut self, start_epoch: u32, head: Option<Head>) -> Layout {
        // A head with nothing left (the rest cut by drop_last) is a finished epoch.
        let start_epoch = match &head {
            Some(h) if h.per_rank == 0 => start_epoch.saturating_add(1),
            _ => start_epoch,
        };
        self.start_epoch = start_epoch.min(self.epochs);
        self.head = head.filter(|h| h.per_rank > 0 && self.start_epoch < self.epochs);
        self
    }

    /// Iterations of a whole epoch.
    pub(crate) fn iterations(&self) -> usize {
        self.per_rank.div_ceil(self.batch)
    }

    /// The head, if `epoch` is it.
    fn head_of(&self, epoch: u32) -> Option<&Head> {
        self.head.as_ref().filter(|_| epoch == self.start_epoch)
    }

    /// Samples per rank in `epoch`.
    fn per_rank_in(&self, epoch: u32) -> usize {
        self.head_of(epoch).map_or(self.per_rank, |h| h.per_rank)
    }

    /// The iteration numbers of `epoch`'s batches: `first..end`.
    pub(crate) fn iteration_range(&self, epoch: u32) -> std::ops::Range<usize> {
        match self.head_of(epoch) {
            Some(h) => h.first_iteration..h.first_iteration + h.steps(self.batch),
            None => 0..self.iterations(),
        }
    }

    /// Batches the run delivers to each rank.
    pub(crate) fn steps(&self) -> u64 {
        let whole = u64::from(self.epochs - self.start_epoch) * self.iterations() as u64;
        match &self.head {
            Some(h) => whole - self.iterations() as u64 + h.steps(self.batch) as u64,
            None => whole,
        }
    }

    /// The batch at `iteration` of `epoch` as the run's step (its batches counted from 0).
    pub(crate) fn step(&self, epoch: u32, iteration: usize) -> u64 {
        let iterations = self.iterations() as u64;
        match &self.head {
            Some(h) if epoch == self.start_epoch => (iteration - h.first_iteration) as u64,
            Some(h) => {
                h.steps(self.batch) as u64
                    + u64::from(epoch - self.start_epoch - 1) * iterations
                    + iteration as u64
            }
            None => u64::from(epoch - self.start_epoch) * iterations + iteration as u64,
        }
    }

    /// The step of the access at `position` of the node stream (canonical order; every
    /// iteration but an epoch's last holds `ranks * batch` accesses).
    pub(crate) fn step_at(&self, position: u64) -> u64 {
        let per_iteration = (self.ranks * self.batch) as u64;
        let (mut position, mut base) = (position, 0);
        if let Some(h) = &self.head {
            let head_accesses = (self.ranks * h.per_rank) as u64;
            let head_steps = h.steps(self.batch) as u64;
            if position < head_accesses {
                return (position / per_iteration).min(head_steps - 1);
            }
            position -= head_accesses;
            base = head_steps;
        }
        let per_epoch = (self.ranks * self.per_rank) as u64;
        let iterations = self.iterations() as u64;
        let (epoch, within) = (position / per_epoch, position % per_epoch);
        base + epoch * iterations + (within / per_iteration).min(iterations - 1)
    }

    /// Where each epoch's batches end, as a rank's handle needs it.
    pub(crate) fn ends(&self) -> EpochEnds {
        EpochEnds {
            head: self
                .head
                .as_ref()
                .map(|_| (self.start_epoch, self.iteration_range(self.start_epoch).end)),
            iterations: self.iterations(),
        }
    }

    /// Samples in the batch at `iteration` of `epoch` (an epoch's last may be short).
    pub(crate) fn batch_len(&self, epoch: u32, iteration: usize) -> usize {
        let range = self.iteration_range(epoch);
        let k = iteration - range.start;
        self.batch.min(self.per_rank_in(epoch) - k * self.batch)
    }

    /// The node's accesses of one epoch in canonical order, as [`Layout::walk_epoch`] visits
    /// them.
    pub(crate) fn epoch_accesses(&self, epoch: u32) -> Vec<(usize, usize, usize, u32)> {
        let mut accesses = Vec::with_capacity(self.per_rank * self.ranks);
        self.walk_epoch(epoch, |it, rank, pos, sample| {
            accesses.push((it, rank, pos, sample))
        });
        accesses
    }

    /// Visits the node's accesses of one epoch in canonical order:
    /// (iteration, local rank, position in batch, sample).
    pub(crate) fn walk_epoch(&self, epoch: u32, mut visit: impl FnMut(usize, usize, usize, u32)) {
        let whole;
        let order: &[u32] = match self.head_of(epoch) {
            Some(h) => &h.order,
            None => {
                whole = self.sampler.epoch_indices(epoch);
                &whole
            }
        };
        let range = self.iteration_range(epoch);
        for (k_batch, iteration) in range.clone().enumerate() {
            for rank in 0..self.ranks {
                for pos in 0..self.batch_len(epoch, iteration) {
                    let k = k_batch * self.batch + pos;
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

/// The run's stream: a resumed run's cache plans only what remains, its epochs counted from
/// the first it plans.
impl StreamSource for Layout {
    fn epochs(&self) -> u32 {
        self.epochs - self.start_epoch
    }

    fn fill_epoch(&self, epoch: u32, out: &mut Vec<u32>) {
        self.walk_epoch(self.start_epoch + epoch, |_, _, _, sample| out.push(sample));
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
            start_epoch: 0,
            head: None,
        };
        let mut next = 0;
        for epoch in 0..layout.epochs {
            for iteration in 0..layout.iterations() {
                assert_eq!(layout.step(epoch, iteration), next);
                next += 1;
            }
        }
        assert_eq!(next, 9);
        assert_eq!(layout.batch_len(0, 2), 1);
        assert_eq!(layout.steps(), 9);
    }

    /// A resumed layout numbers its batches from 0 in walk order, and every access's step by
    /// position is its batch's: with a head of another shape than a whole epoch, and without.
    #[test]
    fn a_resumed_layouts_steps_follow_its_walk() {
        let sampler = DistributedSampler::new(23, 4, false, crate::EpochOrder::Sequential)
            .expect("a valid sampler");
        let whole = Layout::of_node(sampler, 2, 1, 2, 3);
        let head = Head {
            order: (0..12).collect::<Vec<u32>>().into(),
            per_rank: 3,
            first_iteration: 1,
            epoch_world: 2,
            consumed: 11,
        };
        for layout in [
            whole.clone().resumed(1, Some(head)),
            whole.clone().resumed(2, None),
            whole.clone(),
        ] {
            let (mut steps, mut position) = (Vec::new(), 0u64);
            for epoch in layout.start_epoch..layout.epochs {
                layout.walk_epoch(epoch, |iteration, _, _, _| {
                    let step = layout.step(epoch, iteration);
                    assert_eq!(layout.step_at(position), step, "position {position}");
                    position += 1;
                    if steps.last() != Some(&step) {
                        steps.push(step);
                    }
                });
            }
            assert_eq!(steps, (0..layout.steps()).collect::<Vec<_>>());
        }
    }

    /// A head that `drop_last` cut to nothing ends its epoch: the run starts at the next.
    #[test]
    fn an_empty_head_starts_the_run_at_the_next_epoch() {
        let sampler = DistributedSampler::new(23, 4, true, crate::EpochOrder::Sequential)
            .expect("a valid sampler");
        let head = Head {
            order: Vec::new().into(),
            per_rank: 0,
            first_iteration: 3,
            epoch_world: 2,
            consumed: 20,
        };
        let layout = Layout::of_node(sampler, 2, 0, 2, 3).resumed(1, Some(head));
        assert_eq!((layout.start_epoch, layout.head.is_none()), (2, true));
        assert_eq!(layout.steps(), layout.iterations() as u64);
    }
}
