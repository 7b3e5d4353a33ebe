//! Synthetic multi-epoch shuffled streams and log-normal sizes, for benches and tests.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use lobster_cache::{FormCosts, SampleId, StreamSource};

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

impl ShuffledStream {
    /// Every epoch of the stream, as plain ids (what a test of a second build of
    /// lobster-cache, which has its own `StreamSource`, can take).
    pub fn to_epochs(&self) -> Vec<Vec<SampleId>> {
        (0..self.epochs)
            .map(|e| {
                let mut v = Vec::new();
                self.fill_epoch(e, &mut v);
                v
            })
            .collect()
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

/// A small two-form cache problem: a shuffled stream short enough for the exhaustive
/// search ([`crate::forms_optimum`]), sizes of both forms, a budget and the costs.
#[derive(Debug, Clone, PartialEq)]
pub struct FormCase {
    /// Each epoch a permutation of the samples.
    pub epochs: Vec<Vec<SampleId>>,
    /// Encoded sizes, 1 to 10 bytes.
    pub encoded: Vec<u32>,
    /// Decoded sizes, 1 to 5 times the encoded ones.
    pub decoded: Vec<u32>,
    /// Between the largest encoded sample and the whole decoded set.
    pub capacity_bytes: u64,
    /// Read and decode costs, each 0.1 to 10 seconds fixed plus up to 1 per byte.
    pub costs: FormCosts,
}

impl FormCase {
    /// The case of `seed`: 2 to 5 samples over 2 to 4 epochs, at most `max_reuses`
    /// accesses with a next use (samples times epochs minus samples).
    pub fn small(seed: u64, max_reuses: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let (samples, epochs) = loop {
            let samples = rng.gen_range(2..=5usize);
            let epochs = rng.gen_range(2..=4usize);
            if samples * (epochs - 1) <= max_reuses {
                break (samples, epochs);
            }
        };
        let encoded: Vec<u32> = (0..samples).map(|_| rng.gen_range(1..=10)).collect();
        let decoded: Vec<u32> = encoded.iter().map(|&e| e * rng.gen_range(1..=5)).collect();
        let largest = u64::from(*encoded.iter().max().expect("at least 2 samples"));
        let all: u64 = decoded.iter().map(|&d| u64::from(d)).sum();
        let epochs = (0..epochs)
            .map(|_| {
                let mut e: Vec<SampleId> = (0..samples as SampleId).collect();
                e.shuffle(&mut rng);
                e
            })
            .collect();
        let mut cost = || rng.gen_range(0.1..10.0);
        let costs = FormCosts {
            read_s: cost(),
            read_per_byte_s: cost() / 10.0,
            decode_s: cost(),
            decode_per_byte_s: cost() / 10.0,
        };
        FormCase {
            epochs,
            encoded,
            decoded,
            capacity_bytes: rng.gen_range(largest..=all.max(largest)),
            costs,
        }
    }
}

/// Where the time of a training step goes, for [`FormCase::training`]: costs of a sample of
/// about 110 KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostRegime {
    /// Page-cache reads (0.2 ms) and a 1.8 ms decode.
    DecodeBound,
    /// 1.4 ms reads and a 1.8 ms decode.
    Balanced,
    /// Shared-storage reads of 9 ms and a 1.8 ms decode.
    ReadBound,
}

impl CostRegime {
    /// Every regime.
    pub const ALL: [CostRegime; 3] = [
        CostRegime::DecodeBound,
        CostRegime::Balanced,
        CostRegime::ReadBound,
    ];

    /// The regime's costs.
    pub fn costs(self) -> FormCosts {
        let decode = (20e-6, 16e-9);
        let (read_s, read_per_byte_s) = match self {
            CostRegime::DecodeBound => (100e-6, 1e-9),
            CostRegime::Balanced => (1e-3, 4e-9),
            CostRegime::ReadBound => (8e-3, 8e-9),
        };
        FormCosts {
            read_s,
            read_per_byte_s,
            decode_s: decode.0,
            decode_per_byte_s: decode.1,
        }
    }
}

impl FormCase {
    /// A training stream: `samples` of log-normal encoded size (median 110 KiB, sigma 0.3)
    /// and decoded images `decoded_ratio` times larger, shuffled over `epochs`, with a budget
    /// of `percent` of the decoded set and the costs of `regime`.
    pub fn training(
        samples: u32,
        epochs: u32,
        decoded_ratio: f64,
        regime: CostRegime,
        percent: u64,
        seed: u64,
    ) -> Self {
        let stream = ShuffledStream {
            num_samples: samples,
            epochs,
            nodes: 1,
            node: 0,
            seed,
        };
        let epochs = (0..epochs)
            .map(|e| {
                let mut v = Vec::new();
                stream.fill_epoch(e, &mut v);
                v
            })
            .collect();
        let encoded = lognormal_sizes(samples as usize, 110.0 * 1024.0, 0.3, seed);
        let decoded: Vec<u32> = encoded
            .iter()
            .map(|&e| (f64::from(e) * decoded_ratio) as u32)
            .collect();
        let all: u64 = decoded.iter().map(|&d| u64::from(d)).sum();
        FormCase {
            epochs,
            encoded,
            decoded,
            capacity_bytes: all * percent / 100,
            costs: regime.costs(),
        }
    }
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
