//! The cluster plan against lobster-testkit's naive model, exhaustive optima and floor, over
//! seeded small jobs and shuffled jobs beyond the search.

use lobster_cache::SampleId;
use lobster_testkit::cluster_optimum::{check_cluster_bytes, check_cluster_case, ClusterCase};
use lobster_testkit::gen::lognormal_sizes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn seeded_small_jobs_keep_every_invariant_and_bound() {
    let mut rng = StdRng::seed_from_u64(0xC1);
    // Per size kind (unit, varied): jobs searched, cluster plan at the holder-model
    // optimum, at the pooled optimum, local plan at or below the cluster plan, sum of
    // cluster / holder optimum, worst.
    let mut tally = [(0u32, 0u32, 0u32, 0u32, 0.0f64, 1.0f64); 2];
    for _ in 0..3000 {
        let data: Vec<u8> = (0..64).map(|_| rng.gen()).collect();
        let c = check_cluster_bytes(&data);
        if let (Some(h), Some(p)) = (c.holder_optimum_bytes, c.pooled_optimum_bytes) {
            let t = &mut tally[usize::from(data[5] % 2)];
            let ratio = if h == 0 {
                1.0
            } else {
                c.cluster_bytes as f64 / h as f64
            };
            t.0 += 1;
            t.1 += u32::from(c.cluster_bytes == h);
            t.2 += u32::from(c.cluster_bytes == p);
            t.3 += u32::from(c.local_bytes <= c.cluster_bytes);
            t.4 += ratio;
            t.5 = t.5.max(ratio);
        }
    }
    // Most cases are small enough to search, both unit and varied sizes.
    assert!(tally[0].0 > 1000 && tally[1].0 > 800, "{tally:?}");
    for (kind, t) in ["unit", "varied"].iter().zip(tally) {
        eprintln!(
            "{kind} sizes: {} jobs searched; cluster plan at the holder-model optimum in {}, \
             at the pooled optimum in {}, local plan as good in {}; cluster / holder \
             optimum mean {:.4}, worst {:.3}",
            t.0,
            t.1,
            t.2,
            t.3,
            t.4 / f64::from(t.0),
            t.5
        );
    }
}

#[test]
fn shuffled_jobs_at_sizes_beyond_the_search_agree_with_the_model() {
    for (nodes, ranks, batch_size, frac, batch) in [
        (4, 2, 3, 0.1, 50),
        (3, 1, 5, 0.3, 7),
        (2, 4, 2, 0.05, 1000),
        (5, 1, 4, 0.4, 33),
    ] {
        let n = 61;
        let sizes = lognormal_sizes(n, 1000.0, 0.6, 7);
        let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        let mut rng = StdRng::seed_from_u64(nodes as u64);
        let orders = (0..4)
            .map(|_| {
                let mut o: Vec<SampleId> = (0..n as SampleId).collect();
                rand::seq::SliceRandom::shuffle(&mut o[..], &mut rng);
                o
            })
            .collect();
        let case = ClusterCase {
            orders,
            sizes,
            nodes,
            ranks_per_node: ranks,
            batch_size,
            capacity_bytes: (total as f64 * frac) as u64,
        };
        let c = check_cluster_case(&case, batch);
        assert!(c.holder_optimum_bytes.is_none());
    }
}
