//! Hit-ratio table: reuse-distance (Belady + do no harm) vs static (NoPFS) vs LRU on
//! generated shuffled multi-epoch streams, for caches of 5, 10, 25 and 50% of the dataset,
//! on one node that sees every epoch whole and on four nodes that each see every fourth
//! index of each epoch's permutation (averaged over the four). Then the planner's memory per
//! sample at ImageNet-1k scale.
//!
//! Run: `cargo bench -p lobster-benches --bench hit_ratio`

use std::sync::Arc;
use std::time::Instant;

use lobster_cache::{Planner, PolicyKind, Stats};
use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};

const SAMPLES: u32 = 10_000;
const EPOCHS: u32 = 20;
const MEDIAN_BYTES: f64 = 110_000.0;
const SIGMA: f64 = 0.5;
const SEED: u64 = 2022;

fn run(sizes: &Arc<[u32]>, nodes: u32, capacity_bytes: u64, kind: PolicyKind) -> Stats {
    let mut total = Stats::default();
    for node in 0..nodes {
        let stream = ShuffledStream {
            num_samples: SAMPLES,
            epochs: EPOCHS,
            nodes,
            node,
            seed: SEED,
        };
        let mut planner = Planner::new(stream, sizes.clone(), capacity_bytes, kind)
            .expect("generated stream is valid");
        let s = planner.run_to_end().expect("generated stream is valid");
        total.accesses += s.accesses;
        total.hits += s.hits;
        total.misses += s.misses;
        total.hit_bytes += s.hit_bytes;
        total.miss_bytes += s.miss_bytes;
    }
    total
}

fn main() {
    let sizes: Arc<[u32]> = lognormal_sizes(SAMPLES as usize, MEDIAN_BYTES, SIGMA, SEED).into();
    let dataset_bytes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    println!(
        "hit ratio (% of accesses) over {EPOCHS} shuffled epochs of {SAMPLES} samples, \
         log-normal sizes (median {MEDIAN_BYTES} B, sigma {SIGMA}), dataset {dataset_bytes} B, seed {SEED}"
    );
    println!();
    println!(
        "| nodes | cache % | reuse % | static % | lru % | reuse/static | reuse/lru | reuse byte hit % |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for nodes in [1u32, 4] {
        for pct in [5u64, 10, 25, 50] {
            let capacity = dataset_bytes * pct / 100;
            let [reuse, stat, lru] = [PolicyKind::Reuse, PolicyKind::Static, PolicyKind::Lru]
                .map(|k| run(&sizes, nodes, capacity, k));
            let ratio = |a: u64, b: u64| {
                if b == 0 {
                    "inf".to_owned()
                } else {
                    format!("{:.2}x", a as f64 / b as f64)
                }
            };
            println!(
                "| {nodes} | {pct} | {:.2} | {:.2} | {:.2} | {} | {} | {:.2} |",
                100.0 * reuse.hit_ratio(),
                100.0 * stat.hit_ratio(),
                100.0 * lru.hit_ratio(),
                ratio(reuse.hits, stat.hits),
                ratio(reuse.hits, lru.hits),
                100.0 * reuse.hit_bytes as f64 / (reuse.hit_bytes + reuse.miss_bytes) as f64,
            );
        }
    }

    println!();
    println!("planner memory at 1,281,167 samples (reuse, node 0, first 23 of 90 epochs)");
    println!();
    println!(
        "| nodes | cache % | bytes/sample | epochs generated/epoch | decisions/s (incl. index) |"
    );
    println!("|---|---|---|---|---|");
    let n = 1_281_167u32;
    let big: Arc<[u32]> = lognormal_sizes(n as usize, MEDIAN_BYTES, SIGMA, SEED).into();
    let big_bytes: u64 = big.iter().map(|&s| u64::from(s)).sum();
    for (nodes, pct) in [(1u32, 10u64), (1, 50), (4, 10), (4, 50)] {
        let decided_epochs = 23;
        let stream = ShuffledStream {
            num_samples: n,
            epochs: 90,
            nodes,
            node: 0,
            seed: SEED,
        };
        let mut planner = Planner::new(
            stream,
            big.clone(),
            big_bytes * pct / 100,
            PolicyKind::Reuse,
        )
        .expect("generated stream is valid");
        let start = Instant::now();
        let mut evicted = Vec::new();
        let mut decisions = 0u64;
        let mut peak_bytes = 0usize;
        while let Some(d) = planner
            .next(&mut evicted)
            .expect("generated stream is valid")
        {
            if d.epoch == decided_epochs {
                break;
            }
            decisions += 1;
            if decisions % 65_536 == 0 {
                peak_bytes = peak_bytes.max(planner.memory_bytes());
            }
        }
        let secs = start.elapsed().as_secs_f64();
        peak_bytes = peak_bytes.max(planner.memory_bytes());
        println!(
            "| {nodes} | {pct} | {:.1} | {:.1} | {:.2e} |",
            peak_bytes as f64 / f64::from(n),
            planner.epochs_generated() as f64 / f64::from(decided_epochs),
            decisions as f64 / secs,
        );
    }
}
