//! The two-level (memory over disk) plan against lobster-testkit's references: Belady on unit
//! sizes, the exhaustive best placement, the loader model's contract, over seeded small
//! cases and training streams; the one-node disk-tier target and the second run from seeds.

use lobster_cache::{PolicyKind, SampleId, Tier};
use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};
use lobster_testkit::tiers_optimum::{
    belady_unit, check_tier_bytes, check_tier_case, optimal_two_level, run_tiers,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn seeded_random_bytes_keep_the_contract_and_meet_the_references() {
    let mut rng = StdRng::seed_from_u64(0x7135);
    for i in 0..3000 {
        let len = rng.gen_range(0..48);
        let mut data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if let Some(flags) = data.first_mut() {
            // Half the cases with unit sizes, where the plan must be the optimum.
            *flags = if i % 2 == 0 {
                *flags | 0x10
            } else {
                *flags & !0x10
            };
        }
        check_tier_bytes(&data);
    }
}

#[test]
fn belady_on_unit_sizes_is_the_exhaustive_optimum_of_one_level() {
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        let k = rng.gen_range(1..=5u32);
        let stream: Vec<SampleId> = (0..rng.gen_range(1..20))
            .map(|_| rng.gen_range(0..k))
            .collect();
        let sizes = vec![1; k as usize];
        for m in 0..4u64 {
            let best = optimal_two_level(std::slice::from_ref(&stream), &sizes, m, 0, &[]).unwrap();
            let (misses, hits) = belady_unit(&stream, m as usize);
            assert_eq!(best.store_read_bytes, misses, "seed {seed}, room {m}");
            assert_eq!(best.memory_hit_bytes, hits, "seed {seed}, room {m}");
        }
    }
}

#[test]
fn unit_sizes_on_shuffled_streams_are_the_two_level_optimum() {
    for seed in 0..40 {
        let stream = ShuffledStream {
            num_samples: 5,
            epochs: 5,
            nodes: 1,
            node: 0,
            seed,
        };
        let epochs = stream.to_epochs();
        let sizes = vec![1; 5];
        for (m, d) in [(0, 1), (1, 1), (1, 2), (2, 1), (0, 3), (2, 2)] {
            check_tier_case(&epochs, &sizes, m, d, &[]);
            check_tier_case(&epochs, &sizes, m, d, &[(seed % 5) as SampleId, 4]);
        }
    }
}

#[test]
fn the_exhaustive_search_finds_a_demotion_worth_making() {
    // Memory of 1 and disk of 1: sample 0 is read first and needed last, sample 1 needed
    // before it. The best keeps 0 in memory, demotes it to the disk for 1, and hits both.
    let epochs = vec![vec![0, 1, 1, 0]];
    let best = optimal_two_level(&epochs, &[1, 1], 1, 1, &[]).unwrap();
    assert_eq!((best.store_read_bytes, best.memory_hit_bytes), (2, 1));
    let run = run_tiers(&epochs, &[1, 1], 1, 1, PolicyKind::Reuse, &[]);
    assert_eq!(run.stats.demotions, 1);
    assert_eq!(
        (run.stats.store_read_bytes, run.stats.memory_hit_bytes),
        (2, 1)
    );
    // Without the disk the best hits one of them only.
    let best = optimal_two_level(&epochs, &[1, 1], 1, 0, &[]).unwrap();
    assert_eq!((best.store_read_bytes, best.memory_hit_bytes), (3, 1));
}

fn dataset(num_samples: u32, seed: u64) -> (Vec<u32>, u64) {
    let sizes = lognormal_sizes(num_samples as usize, 110_000.0, 0.6, seed);
    let total = sizes.iter().map(|&z| u64::from(z)).sum();
    (sizes, total)
}

#[test]
fn one_node_with_memory_of_a_tenth_and_disk_of_four_tenths_reads_near_the_floor() {
    let n = 2000;
    let (sizes, total) = dataset(n, 7);
    let (memory, disk) = (total / 10, total * 4 / 10);
    let epochs = ShuffledStream {
        num_samples: n,
        epochs: 6,
        nodes: 1,
        node: 0,
        seed: 11,
    }
    .to_epochs();
    let run = run_tiers(&epochs, &sizes, memory, disk, PolicyKind::Reuse, &[]);
    let floor = total - memory - disk;
    assert_eq!(
        run.store_read_bytes_per_epoch[0], total,
        "epoch 0 reads everything"
    );
    for (e, &read) in run.store_read_bytes_per_epoch.iter().enumerate().skip(1) {
        assert!(
            read as f64 <= 1.1 * floor as f64,
            "epoch {e}: {read} store bytes, floor {floor}"
        );
    }
    let st = run.stats;
    assert!(
        st.memory_hits > 0 && st.disk_hits > 0 && st.demotions > 0,
        "{st:?}"
    );
    // The static baseline has the same budgets: on one node, where every sample is read
    // once an epoch, pinning is as good.
    let stat = run_tiers(&epochs, &sizes, memory, disk, PolicyKind::Static, &[]);
    for (e, &read) in stat.store_read_bytes_per_epoch.iter().enumerate().skip(1) {
        assert!(
            read as f64 <= 1.1 * floor as f64,
            "static, epoch {e}: {read}"
        );
    }
}

#[test]
fn a_second_run_reads_only_what_it_does_not_find_on_the_disk() {
    let n = 1500;
    let (sizes, total) = dataset(n, 3);
    let (memory, disk) = (total / 10, total * 4 / 10);
    for (first_seed, second_seed) in [(5, 5), (5, 6)] {
        let stream = |seed| {
            ShuffledStream {
                num_samples: n,
                epochs: 4,
                nodes: 1,
                node: 0,
                seed,
            }
            .to_epochs()
        };
        let first = run_tiers(
            &stream(first_seed),
            &sizes,
            memory,
            disk,
            PolicyKind::Reuse,
            &[],
        );
        let seeds = first.disk_at_end.clone();
        let seed_bytes: u64 = seeds.iter().map(|&s| u64::from(sizes[s as usize])).sum();
        assert!(seed_bytes > disk / 2, "the first run leaves its disk used");
        let epochs = stream(second_seed);
        let second = run_tiers(&epochs, &sizes, memory, disk, PolicyKind::Reuse, &seeds);
        // Every access of epoch 0 is its sample's first: a hit there is a seed's.
        let seed_hit_bytes: u64 = second
            .decisions
            .iter()
            .filter(|(d, _)| d.epoch == 0 && d.found.is_some())
            .map(|(d, _)| {
                assert_eq!(d.found, Some(Tier::Disk));
                assert!(seeds.binary_search(&d.sample).is_ok());
                u64::from(d.size_bytes)
            })
            .sum();
        assert_eq!(
            second.store_read_bytes_per_epoch[0],
            first.store_read_bytes_per_epoch[0] - seed_hit_bytes,
            "seeds {first_seed} then {second_seed}"
        );
        assert!(second.stats.seed_hit_bytes >= seed_hit_bytes);
        // The plan keeps the seeds it needs soonest: most of them are hit.
        assert!(
            seed_hit_bytes > seed_bytes / 2,
            "seeds {first_seed} then {second_seed}: {seed_hit_bytes} of {seed_bytes} seed bytes hit"
        );
        let total_first: u64 = first.store_read_bytes_per_epoch.iter().sum();
        let total_second: u64 = second.store_read_bytes_per_epoch.iter().sum();
        assert!(
            total_second < total_first,
            "seeds {first_seed} then {second_seed}"
        );
        // The static baseline reuses the seeds it pins on the disk.
        let stat = run_tiers(&epochs, &sizes, memory, disk, PolicyKind::Static, &seeds);
        assert!(stat.stats.seed_hits > 0);
    }
}

#[test]
fn byte_sizes_on_shuffled_streams_keep_the_contract() {
    for seed in 0..6 {
        let n = 300;
        let (sizes, total) = dataset(n, seed);
        let epochs = ShuffledStream {
            num_samples: n,
            epochs: 4,
            nodes: 2,
            node: (seed % 2) as u32,
            seed,
        }
        .to_epochs();
        for (m, d) in [(10, 40), (30, 30), (5, 80), (0, 50), (50, 0)] {
            let seeds: Vec<SampleId> = (0..n).filter(|s| s % 7 == seed as u32).collect();
            check_tier_case(&epochs, &sizes, total * m / 100, total * d / 100, &[]);
            check_tier_case(&epochs, &sizes, total * m / 100, total * d / 100, &seeds);
        }
    }
}
