//! One allocation for 8 ranks with budgets of 256 io_depth and 64 decode threads (the issue's
//! target: under 20 µs), against a literal unit-by-unit bottleneck greedy in the same run,
//! and the cost of one calibration observation.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use lobster_sched::{AllocConfig, Allocator, Budgets, CostModel, RankLoad, Tier};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const RANKS: usize = 8;
const SAMPLES_PER_WINDOW: u64 = 256;

/// A window of 256 samples per rank, hit ratios from 0% to 87.5%, sizes growing with the
/// rank (mean 110 KiB to 300 KiB), so both stages are imbalanced under the equal split.
fn loads() -> Vec<RankLoad> {
    let mut rng = StdRng::seed_from_u64(0x2545_F491_4F6C_DD1D);
    (0..RANKS)
        .map(|r| {
            let mut load = RankLoad::default();
            for _ in 0..SAMPLES_PER_WINDOW {
                let bytes = (60_000 + rng.gen_range(0..100_000)) * (4 + r as u64) / 4;
                let tier = if rng.gen_range(0..8) < r {
                    Tier::Cache
                } else {
                    Tier::Storage
                };
                load.add_read(tier, bytes);
                load.add_decode(bytes);
            }
            load
        })
        .collect()
}

fn config() -> AllocConfig {
    AllocConfig::new(Budgets {
        io_depth_total: 256,
        decode_threads_total: 64,
    })
}

/// The baseline: the same min-max by handing out one unit at a time to the bottleneck.
fn greedy(model: &CostModel, loads: &[RankLoad], budget: u32, io: bool) -> Vec<u32> {
    let f = |r: usize, x: u32| {
        if io {
            model.predict_stages(&loads[r], x, 1).io_s
        } else {
            model.predict_stages(&loads[r], 1, x).decode_s
        }
    };
    let mut x = vec![1u32; loads.len()];
    for _ in loads.len() as u32..budget {
        let mut pick = None;
        let mut worst = f64::NEG_INFINITY;
        for (r, &u) in x.iter().enumerate() {
            let t = f(r, u);
            if t > f(r, u32::MAX) && t > worst {
                worst = t;
                pick = Some(r);
            }
        }
        match pick {
            Some(r) => x[r] += 1,
            None => break,
        }
    }
    x
}

fn bench(c: &mut Criterion) {
    let loads = loads();
    let model = CostModel::new();
    let mut group = c.benchmark_group("sched_allocate_8_ranks_256_io_64_threads");
    group.bench_function("allocator_steady", |b| {
        let mut allocator = Allocator::new(config()).expect("valid config");
        b.iter(|| allocator.allocate(black_box(&loads), black_box(&model)))
    });
    group.bench_function("allocator_fresh", |b| {
        b.iter(|| {
            Allocator::new(config())
                .expect("valid config")
                .allocate(black_box(&loads), black_box(&model))
        })
    });
    group.bench_function("greedy_baseline", |b| {
        b.iter(|| {
            (
                greedy(&model, black_box(&loads), 256, true),
                greedy(&model, black_box(&loads), 64, false),
            )
        })
    });
    group.finish();

    // The allocator and the baseline agree, or the comparison means nothing.
    let a = Allocator::new(config())
        .expect("valid config")
        .allocate(&loads, &model)
        .expect("valid input");
    let io: Vec<u32> = a.ranks.iter().map(|r| r.io_depth).collect();
    let threads: Vec<u32> = a.ranks.iter().map(|r| r.decode_threads).collect();
    assert_eq!(io, greedy(&model, &loads, 256, true));
    assert_eq!(threads, greedy(&model, &loads, 64, false));
    let report = a.imbalance();
    println!(
        "imbalance before {:.3} after {:.3}; max rank time {:.3} ms -> {:.3} ms",
        report.before,
        report.after,
        report.max_before_s * 1e3,
        report.max_after_s * 1e3
    );

    c.bench_function("sched_observe_read", |b| {
        let mut model = CostModel::new();
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let bytes = 4096 + (i * 7919) % (1 << 20);
            let latency = Duration::from_nanos(80_000 + bytes / 2 + i % 13 * 1000);
            model.observe_read(Tier::Storage, black_box(bytes), latency);
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
