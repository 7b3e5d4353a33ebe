//! Synthetic multi-epoch shuffled streams and log-normal sizes, for benches and tests.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::index::StreamSource;
use crate::SampleId;

/// Every epoch a fresh permutation of `0..num_samples` (seeded by `seed` and the epoch);
/// node `node` of `nodes` sees the permutation's indices `node, node + nodes, ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffledStream {
    /// Samples in the dataset.
    pub num_samples: u32,
    /// Epochs in the stream.
    pub epochs: u32,
    /// Nodes sharing each epoch (at least 1).
    pub nodes: u32,
    /// This node, below `nodes`.
    pub node: u32,
    /// Shuffle seed.
    pub seed: u64,
}

impl StreamSource for ShuffledStream {
    fn epochs(&self) -> u32 {
        self.epochs
    }

    fn fill_epoch(&self, epoch: u32, out: &mut Vec<SampleId>) {
        let start = out.len();
        out.extend(0..self.num_samples);
        let perm = &mut out[start..];
        let mut rng = StdRng::seed_from_u64(self.seed ^ (u64::from(epoch) << 32 | 0x5EED));
        perm.shuffle(&mut rng);
        let nodes = self.nodes.max(1) as usize;
        if nodes > 1 {
            let mut w = start;
            for r in (start + self.node as usize..out.len()).step_by(nodes) {
                out[w] = out[r];
                w += 1;
            }
            out.truncate(w);
        }
    }
}

/// `n` sizes drawn from a log-normal distribution with the given median and shape `sigma`
/// (of the underlying normal), clamped to `1..=u32::MAX`.
pub fn lognormal_sizes(n: usize, median_bytes: f64, sigma: f64, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    // In (0, 1]: Box-Muller takes the logarithm of it.
    let mut unit = move || 1.0 - rng.gen::<f64>();
    (0..n)
        .map(|_| {
            // Box-Muller.
            let z = (-2.0 * unit().ln()).sqrt() * (2.0 * std::f64::consts::PI * unit()).cos();
            (median_bytes * (sigma * z).exp()).clamp(1.0, f64::from(u32::MAX)) as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_epoch_is_a_permutation_split_across_nodes() {
        let mut all = Vec::new();
        for node in 0..4 {
            let s = ShuffledStream {
                num_samples: 103,
                epochs: 2,
                nodes: 4,
                node,
                seed: 9,
            };
            let mut v = Vec::new();
            s.fill_epoch(1, &mut v);
            all.extend(v);
        }
        all.sort_unstable();
        assert_eq!(all, (0..103).collect::<Vec<_>>());
    }

    #[test]
    fn epochs_differ_and_regenerate_identically() {
        let s = ShuffledStream {
            num_samples: 50,
            epochs: 3,
            nodes: 1,
            node: 0,
            seed: 1,
        };
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        s.fill_epoch(0, &mut a);
        s.fill_epoch(1, &mut b);
        s.fill_epoch(0, &mut c);
        assert_ne!(a, b);
        assert_eq!(a, c);
    }

    #[test]
    fn lognormal_median_is_near_requested() {
        let mut v = lognormal_sizes(20_001, 110_000.0, 0.5, 3);
        v.sort_unstable();
        let median = f64::from(v[10_000]);
        assert!((median / 110_000.0 - 1.0).abs() < 0.05, "median {median}");
    }
}
