//! The sampler: which samples each rank reads in each epoch, with PyTorch's semantics.

use crate::error::Error;

/// The 32-bit Mersenne Twister (MT19937) that PyTorch's CPU generator uses.
#[derive(Clone)]
pub(crate) struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl std::fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Mt19937 {
    /// Seeds like `torch.Generator().manual_seed(seed)`: the low 32 bits initialise the state.
    pub(crate) fn new(seed: u64) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed as u32;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Self { state, index: 624 }
    }

    fn twist(&mut self) {
        for k in 0..624 {
            let y = (self.state[k] & 0x8000_0000) | (self.state[(k + 1) % 624] & 0x7fff_ffff);
            let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
            self.state[k] = self.state[(k + 397) % 624] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    pub(crate) fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    fn next_u64(&mut self) -> u64 {
        // PyTorch's random64(): the first draw is the high half.
        let hi = u64::from(self.next_u32());
        let lo = u64::from(self.next_u32());
        (hi << 32) | lo
    }
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU, exactly.
///
/// PyTorch swaps each position with a draw modulo the remaining length for `n` below
/// `u32::MAX / 20`, and uses an inside-out shuffle with 64-bit draws above it.
pub fn torch_randperm(n: usize, seed: u64) -> Vec<u32> {
    assert!(
        n <= u32::MAX as usize,
        "randperm of {n} samples exceeds u32 sample ids"
    );
    let mut rng = Mt19937::new(seed);
    if (n as u64) < u64::from(u32::MAX / 20) {
        let mut perm: Vec<u32> = (0..n as u32).collect();
        for i in 0..n.saturating_sub(1) {
            let z = rng.next_u32() as usize % (n - i);
            perm.swap(i, i + z);
        }
        perm
    } else {
        let mut perm = vec![0u32; n];
        for i in 0..n {
            let z = (rng.next_u64() % (i as u64 + 1)) as usize;
            perm[i] = perm[z];
            perm[z] = i as u32;
        }
        perm
    }
}

/// Where each epoch's order of the whole dataset comes from.
#[derive(Clone, Debug)]
pub enum EpochOrder {
    /// `torch.randperm(n)` seeded with `seed + epoch`, as `DistributedSampler(shuffle=True)`.
    Shuffle {
        /// The sampler seed shared by every rank.
        seed: u64,
    },
    /// `0..n` every epoch, as `DistributedSampler(shuffle=False)`.
    Sequential,
    /// Caller-supplied orders, one per epoch, each a permutation of `0..n` (for example
    /// exported from the caller's own sampler).
    Explicit(std::sync::Arc<[Vec<u32>]>),
}

/// PyTorch `DistributedSampler` semantics over a world of ranks.
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    samples: usize,
    world: usize,
    drop_last: bool,
    order: EpochOrder,
}

impl DistributedSampler {
    /// A sampler over `samples` samples for `world` ranks.
    pub fn new(
        samples: usize,
        world: usize,
        drop_last: bool,
        order: EpochOrder,
    ) -> Result<Self, Error> {
        if samples == 0 {
            return Err(Error::invalid("samples", "0", "at least 1"));
        }
        if samples > u32::MAX as usize {
            return Err(Error::invalid("samples", samples, "at most 4294967295"));
        }
        if world == 0 {
            return Err(Error::invalid("world", "0", "at least 1"));
        }
        if drop_last && samples < world {
            return Err(Error::invalid(
                "world",
                world,
                format!("at most the {samples} samples when drop_last is set"),
            ));
        }
        if let EpochOrder::Explicit(orders) = &order {
            if orders.is_empty() {
                return Err(Error::invalid(
                    "epoch order",
                    "no epochs",
                    "at least one epoch",
                ));
            }
            for (epoch, perm) in orders.iter().enumerate() {
                check_permutation(perm, samples).map_err(|why| {
                    Error::invalid(
                        "epoch order",
                        format!("epoch {epoch}: {why}"),
                        format!("a permutation of 0..{samples}"),
                    )
                })?;
            }
        }
        Ok(Self {
            samples,
            world,
            drop_last,
            order,
        })
    }

    /// Samples each rank takes per epoch (PyTorch's `num_samples`).
    pub fn per_rank(&self) -> usize {
        if self.drop_last && self.samples % self.world != 0 {
            (self.samples - self.world).div_ceil(self.world)
        } else {
            self.samples.div_ceil(self.world)
        }
    }

    /// Where each epoch's order comes from.
    pub fn order(&self) -> &EpochOrder {
        &self.order
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Whether each epoch's tail is cut instead of padded.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// The same sampler over a world of `world` ranks.
    pub fn with_world(&self, world: usize) -> Result<Self, Error> {
        if world == 0 {
            return Err(Error::invalid("world", "0", "at least 1"));
        }
        if self.drop_last && self.samples < world {
            return Err(Error::invalid(
                "world",
                world,
                format!("at most the {} samples when drop_last is set", self.samples),
            ));
        }
        Ok(Self {
            world,
            ..self.clone()
        })
    }

    /// Epochs an explicit order provides; `None` when any number can be generated.
    pub fn explicit_epochs(&self) -> Option<usize> {
        match &self.order {
            EpochOrder::Explicit(orders) => Some(orders.len()),
            _ => None,
        }
    }

    /// The whole epoch's order, padded or cut to `per_rank() * world` entries.
    pub fn epoch_indices(&self, epoch: u32) -> Vec<u32> {
        let n = self.samples;
        let mut indices = match &self.order {
            EpochOrder::Shuffle { seed } => torch_randperm(n, seed.wrapping_add(u64::from(epoch))),
            EpochOrder::Sequential => (0..n as u32).collect(),
            EpochOrder::Explicit(orders) => orders[epoch as usize % orders.len()].clone(),
        };
        let total = self.per_rank() * self.world;
        if total <= n {
            indices.truncate(total);
        } else {
            // Pad by repeating the head, cycling when the padding exceeds the dataset.
            let mut i = 0;
            while indices.len() < total {
                indices.push(indices[i]);
                i += 1;
            }
        }
        indices
    }

    /// The indices `rank` reads in `epoch`, in order.
    pub fn rank_indices(&self, epoch: u32, rank: usize) -> Vec<u32> {
        assert!(
            rank < self.world,
            "rank {rank} outside world {}",
            self.world
        );
        self.epoch_indices(epoch)
            .into_iter()
            .skip(rank)
            .step_by(self.world)
            .collect()
    }
}

fn check_permutation(perm: &[u32], n: usize) -> Result<(), String> {
    if perm.len() != n {
        return Err(format!("{} entries", perm.len()));
    }
    let mut seen = vec![false; n];
    for &i in perm {
        let slot = seen
            .get_mut(i as usize)
            .ok_or_else(|| format!("index {i} out of range"))?;
        if std::mem::replace(slot, true) {
            return Err(format!("index {i} repeated"));
        }
    }
    Ok(())
}

/// Every epoch's whole order as a [`DistributedSampler`] draws it (padded by repeating its
/// head, or cut with `drop_last`), as a stream of the cache crate: the cluster plan's global
/// stream splits it over the ranks exactly as the sampler does. Drawn again on each fill, not
/// held.
#[derive(Clone, Debug)]
pub struct SamplerOrders {
    sampler: DistributedSampler,
    /// The sampler's epoch the stream's first is.
    first: u32,
    epochs: u32,
}

impl SamplerOrders {
    /// The orders of `epochs` epochs of `sampler`.
    pub fn new(sampler: DistributedSampler, epochs: u32) -> Self {
        SamplerOrders {
            sampler,
            first: 0,
            epochs,
        }
    }

    /// The orders of the sampler's epochs `first..epochs`, as a stream of `epochs - first`:
    /// a run resumed at epoch `first`.
    pub(crate) fn from_epoch(sampler: DistributedSampler, first: u32, epochs: u32) -> Self {
        SamplerOrders {
            sampler,
            first: first.min(epochs),
            epochs: epochs - first.min(epochs),
        }
    }
}

impl lobster_cache::StreamSource for SamplerOrders {
    fn epochs(&self) -> u32 {
        self.epochs
    }

    fn fill_epoch(&self, epoch: u32, out: &mut Vec<u32>) {
        out.extend(self.sampler.epoch_indices(self.first + epoch));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_matches_the_reference_sequence() {
        // The C++ standard requires the 10000th output of a default-seeded mt19937 to be this.
        let mut rng = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = rng.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn randperm_is_a_permutation() {
        for n in [1usize, 2, 3, 17, 1000] {
            let mut p = torch_randperm(n, 9);
            p.sort_unstable();
            assert_eq!(p, (0..n as u32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn padding_repeats_the_head_and_every_rank_gets_the_same_count() {
        let s = DistributedSampler::new(10, 4, false, EpochOrder::Sequential).unwrap();
        assert_eq!(s.per_rank(), 3);
        assert_eq!(s.epoch_indices(0), vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]);
        assert_eq!(s.rank_indices(0, 1), vec![1, 5, 9]);
        assert_eq!(s.rank_indices(0, 3), vec![3, 7, 1]);
    }

    #[test]
    fn padding_cycles_when_the_world_exceeds_the_dataset() {
        let s = DistributedSampler::new(2, 5, false, EpochOrder::Sequential).unwrap();
        assert_eq!(s.epoch_indices(0), vec![0, 1, 0, 1, 0]);
    }

    #[test]
    fn drop_last_cuts_the_tail() {
        let s = DistributedSampler::new(10, 4, true, EpochOrder::Sequential).unwrap();
        assert_eq!(s.per_rank(), 2);
        assert_eq!(s.epoch_indices(0), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn explicit_orders_are_checked() {
        let bad = EpochOrder::Explicit(vec![vec![0, 0, 1]].into());
        let err = DistributedSampler::new(3, 1, false, bad).unwrap_err();
        assert!(err.to_string().contains("repeated"), "{err}");
    }
}
