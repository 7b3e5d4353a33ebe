//! Behaviour tests of the model and the allocator against reference models.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::check::{greedy_reference, stage_time_s, Resource};
use crate::{
    check_allocator, AllocConfig, Allocator, Budgets, CostModel, CostParams, RankLimits, RankLoad,
    SchedError, Tier, Volume,
};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn rel_err(got: f64, want: f64) -> f64 {
    ((got - want) / want).abs()
}

// ---------------------------------------------------------------- the model

/// The crate-doc formulas written out directly, term by term.
fn reference_predict(p: &CostParams, l: &RankLoad, d: u32, t: u32) -> f64 {
    let cache = p.tier(Tier::Cache);
    let c = l.tier(Tier::Cache).samples as f64 * cache.request_s
        + l.tier(Tier::Cache).bytes as f64 * cache.per_byte_s;
    let mut r = 0.0;
    let mut n = 0u64;
    let mut f = 0.0f64;
    for tier in [Tier::Storage, Tier::Remote] {
        let v = l.tier(tier);
        let k = p.tier(tier);
        r += v.samples as f64 * k.request_s + v.bytes as f64 * k.per_byte_s;
        n += v.samples;
        f = f.max(v.bytes as f64 / k.bandwidth_bytes_per_s);
    }
    let io = if n == 0 {
        c
    } else if d == 0 {
        f64::INFINITY
    } else {
        c + (r / (u64::from(d).min(n)) as f64).max(f)
    };
    let dd =
        l.decode.samples as f64 * p.decode.sample_s + l.decode.bytes as f64 * p.decode.per_byte_s;
    let dec = if l.decode.samples == 0 {
        0.0
    } else if t == 0 {
        f64::INFINITY
    } else {
        dd / (u64::from(t).min(l.decode.samples)) as f64
    };
    io.max(dec)
}

fn random_load(rng: &mut StdRng, max_samples: u64) -> RankLoad {
    let mut load = RankLoad::default();
    for tier in Tier::ALL {
        let samples = rng.gen_range(0..=max_samples);
        for _ in 0..samples {
            load.add_read(tier, 1 + rng.gen_range(0..1 << 20));
        }
    }
    let samples = rng.gen_range(0..=max_samples);
    for _ in 0..samples {
        load.add_decode(1 + rng.gen_range(0..1 << 20));
    }
    load
}

#[test]
fn predict_matches_the_documented_formulas() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut params = CostParams::PRIORS;
    params.tier_mut(Tier::Storage).bandwidth_bytes_per_s = 2e9;
    params.tier_mut(Tier::Remote).bandwidth_bytes_per_s = 1e9;
    let model = CostModel::with_priors(params).unwrap();
    for _ in 0..500 {
        let load = random_load(&mut rng, 20);
        let (d, t) = (rng.gen_range(0..30u32), rng.gen_range(0..30u32));
        let want = reference_predict(&params, &load, d, t);
        let got = model.predict(&load, d, t);
        assert!(
            got == want || rel_err(got, want) < 1e-12,
            "{load:?} d={d} t={t}: {got} vs {want}"
        );
    }
}

#[test]
fn predict_is_nonincreasing_in_both_resources() {
    let mut rng = StdRng::seed_from_u64(2);
    let model = CostModel::new();
    for _ in 0..100 {
        let load = random_load(&mut rng, 12);
        for x in 0..20 {
            assert!(model.predict(&load, x + 1, 4) <= model.predict(&load, x, 4));
            assert!(model.predict(&load, 4, x + 1) <= model.predict(&load, 4, x));
        }
    }
}

#[test]
fn bandwidth_floor_is_the_slowest_shared_tier() {
    let mut params = CostParams::PRIORS;
    params.tier_mut(Tier::Storage).bandwidth_bytes_per_s = 1e9;
    params.tier_mut(Tier::Remote).bandwidth_bytes_per_s = 4e9;
    let model = CostModel::with_priors(params).unwrap();
    let mut loads = vec![RankLoad::default(); 3];
    loads[0].add_read(Tier::Storage, 3_000_000_000);
    loads[1].add_read(Tier::Storage, 1_000_000_000);
    loads[2].add_read(Tier::Remote, 8_000_000_000);
    loads[2].add_read(Tier::Cache, 100_000_000_000);
    // storage: 4 GB at 1 GB/s; remote: 8 GB at 4 GB/s; cache bytes do not count.
    assert_eq!(model.bandwidth_floor_s(&loads), 4.0);
}

/// A synthetic device: latency = a + b·bytes, times multiplicative noise of ±`noise`.
fn feed_reads(
    model: &mut CostModel,
    rng: &mut StdRng,
    tier: Tier,
    a: f64,
    b: f64,
    noise: f64,
    n: usize,
) {
    for _ in 0..n {
        let bytes = 4096 + rng.gen_range(0..1 << 20);
        let latency = (a + b * bytes as f64) * rng.gen_range(1.0 - noise..=1.0 + noise);
        model.observe_read(tier, bytes, secs(latency));
    }
}

#[test]
fn calibration_converges_to_the_true_costs_of_a_synthetic_workload() {
    // True costs far from the priors (100 µs, 1 ns/B and 20 µs, 5 ns/B).
    let (a, b) = (350e-6, 0.3e-9);
    // Decode with a sizeable per-sample part (resize, augment), so it is identifiable.
    let (c, e) = (300e-6, 4e-9);
    let mut rng = StdRng::seed_from_u64(3);
    let mut model = CostModel::new();
    feed_reads(&mut model, &mut rng, Tier::Storage, a, b, 0.05, 400);
    for _ in 0..400 {
        let samples = 1 + rng.gen_range(0..8);
        let bytes = samples * (8192 + rng.gen_range(0..1 << 19));
        let elapsed = (samples as f64 * c + bytes as f64 * e) * rng.gen_range(0.95..=1.05);
        model.observe_decode(samples, bytes, secs(elapsed));
    }
    let p = model.params();
    let s = p.tier(Tier::Storage);
    assert!(
        rel_err(s.request_s, a) < 0.05,
        "request_s {} vs {a}",
        s.request_s
    );
    assert!(
        rel_err(s.per_byte_s, b) < 0.05,
        "per_byte_s {} vs {b}",
        s.per_byte_s
    );
    assert!(
        rel_err(p.decode.sample_s, c) < 0.05,
        "sample_s {} vs {c}",
        p.decode.sample_s
    );
    assert!(
        rel_err(p.decode.per_byte_s, e) < 0.05,
        "per_byte_s {} vs {e}",
        p.decode.per_byte_s
    );
    // Untouched tiers keep their priors.
    assert_eq!(p.tier(Tier::Cache), CostParams::PRIORS.tier(Tier::Cache));
    assert_eq!(model.read_observations(Tier::Storage), 64);

    // And the calibrated predictions agree with the true model's.
    let truth = {
        let mut t = CostParams::PRIORS;
        *t.tier_mut(Tier::Storage) = crate::TierCost {
            request_s: a,
            per_byte_s: b,
            bandwidth_bytes_per_s: f64::INFINITY,
        };
        t.decode = crate::DecodeCost {
            sample_s: c,
            per_byte_s: e,
        };
        CostModel::with_priors(t).unwrap()
    };
    for _ in 0..50 {
        let load = random_load(&mut rng, 30);
        let (d, t) = (1 + rng.gen_range(0..16u32), 1 + rng.gen_range(0..8u32));
        let (got, want) = (model.predict(&load, d, t), truth.predict(&load, d, t));
        assert!(got == want || rel_err(got, want) < 0.05, "{got} vs {want}");
    }
}

#[test]
fn calibration_is_exact_on_noiseless_observations() {
    let mut rng = StdRng::seed_from_u64(4);
    let mut model = CostModel::new();
    feed_reads(&mut model, &mut rng, Tier::Remote, 12e-6, 0.11e-9, 0.0, 64);
    let r = model.params().tier(Tier::Remote);
    // Durations carry whole nanoseconds: that rounding is the only noise left.
    assert!(rel_err(r.request_s, 12e-6) < 1e-3, "{r:?}");
    assert!(rel_err(r.per_byte_s, 0.11e-9) < 1e-3, "{r:?}");
}

#[test]
fn a_single_outlier_does_not_swing_the_fit() {
    let (a, b) = (80e-6, 0.5e-9);
    // Two models see the same stream, except that one read in the middle of the second one
    // stalls for a full second (a GC pause, a retried request).
    let mut clean = CostModel::new();
    let mut model = CostModel::new();
    feed_reads(
        &mut clean,
        &mut StdRng::seed_from_u64(5),
        Tier::Storage,
        a,
        b,
        0.02,
        400,
    );
    let mut rng = StdRng::seed_from_u64(5);
    feed_reads(&mut model, &mut rng, Tier::Storage, a, b, 0.02, 370);
    model.observe_read(Tier::Storage, 65536, secs(1.0));
    // The rest of the stream: the outlier stays in the window through several refits.
    feed_reads(&mut model, &mut rng, Tier::Storage, a, b, 0.02, 30);
    let (want, got) = (
        *clean.params().tier(Tier::Storage),
        *model.params().tier(Tier::Storage),
    );
    assert!(
        rel_err(got.request_s, want.request_s) < 0.01,
        "{want:?} vs {got:?}"
    );
    assert!(
        rel_err(got.per_byte_s, want.per_byte_s) < 0.01,
        "{want:?} vs {got:?}"
    );
    assert!(
        rel_err(got.request_s, a) < 0.05 && rel_err(got.per_byte_s, b) < 0.05,
        "{got:?}"
    );
    // An outlier among the very first observations does not either.
    let mut fresh = CostModel::new();
    fresh.observe_read(Tier::Storage, 4096, secs(2.0));
    feed_reads(&mut fresh, &mut rng, Tier::Storage, a, b, 0.02, 63);
    let s = fresh.params().tier(Tier::Storage);
    assert!(
        rel_err(s.request_s, a) < 0.05 && rel_err(s.per_byte_s, b) < 0.05,
        "{s:?}"
    );
    // Same for decode.
    let mut dec = CostModel::new();
    for i in 0..100u64 {
        let bytes = 10_000 + 997 * i;
        dec.observe_decode(1, bytes, secs(30e-6 + 4e-9 * bytes as f64));
    }
    dec.observe_decode(1, 10_000, secs(5.0));
    for i in 0..8u64 {
        let bytes = 20_000 + 991 * i;
        dec.observe_decode(1, bytes, secs(30e-6 + 4e-9 * bytes as f64));
    }
    let d = dec.params().decode;
    assert!(rel_err(d.sample_s, 30e-6) < 0.01, "{d:?}");
    assert!(rel_err(d.per_byte_s, 4e-9) < 0.01, "{d:?}");
}

#[test]
fn an_outlier_would_swing_a_plain_least_squares_fit() {
    // Guards the previous test: the outlier is big enough to matter without robustness.
    let mut rng = StdRng::seed_from_u64(5);
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for _ in 0..63 {
        let bytes = (4096 + rng.gen_range(0..1 << 20)) as f64;
        xs.push(bytes);
        ys.push((80e-6 + 0.5e-9 * bytes) * rng.gen_range(0.98..=1.02));
    }
    xs.push(65536.0);
    ys.push(1.0);
    let n = xs.len() as f64;
    let (xm, ym) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - xm) * (y - ym)).sum();
    let sxx: f64 = xs.iter().map(|x| (x - xm) * (x - xm)).sum();
    let intercept = ym - sxy / sxx * xm;
    assert!(
        rel_err(intercept, 80e-6) > 1.0,
        "plain fit intercept {intercept}"
    );
}

#[test]
fn calibration_follows_a_change_of_device_within_the_window() {
    let mut rng = StdRng::seed_from_u64(6);
    let mut model = CostModel::new();
    feed_reads(
        &mut model,
        &mut rng,
        Tier::Storage,
        80e-6,
        0.5e-9,
        0.02,
        100,
    );
    feed_reads(&mut model, &mut rng, Tier::Storage, 400e-6, 2e-9, 0.02, 64);
    let s = model.params().tier(Tier::Storage);
    assert!(
        rel_err(s.request_s, 400e-6) < 0.05 && rel_err(s.per_byte_s, 2e-9) < 0.05,
        "{s:?}"
    );
}

#[test]
fn throughput_is_the_median_of_saturated_intervals() {
    let mut model = CostModel::new();
    let storage = |m: &CostModel| m.params().tier(Tier::Storage).bandwidth_bytes_per_s;
    model.observe_throughput(Tier::Storage, 2_000_000_000, secs(1.0));
    model.observe_throughput(Tier::Storage, 1_000_000_000, secs(0.5));
    assert_eq!(
        storage(&model),
        f64::INFINITY,
        "prior until three intervals"
    );
    model.observe_throughput(Tier::Storage, 60_000_000_000, secs(1.0));
    assert_eq!(storage(&model), 2e9);
    model.observe_throughput(Tier::Storage, 1, Duration::ZERO);
    assert_eq!(storage(&model), 2e9);
}

#[test]
fn costs_are_validated_by_name() {
    type Breakage = fn(&mut CostParams);
    let cases: [(Breakage, &str); 5] = [
        (
            |p| p.tier_mut(Tier::Storage).request_s = f64::NAN,
            "storage.request_s",
        ),
        (
            |p| p.tier_mut(Tier::Cache).per_byte_s = -1e-9,
            "cache.per_byte_s",
        ),
        (
            |p| p.tier_mut(Tier::Remote).bandwidth_bytes_per_s = 0.0,
            "remote.bandwidth_bytes_per_s",
        ),
        (|p| p.decode.sample_s = f64::INFINITY, "decode.sample_s"),
        (|p| p.decode.per_byte_s = -0.0 - 1.0, "decode.per_byte_s"),
    ];
    for (break_it, name) in cases {
        let mut p = CostParams::PRIORS;
        break_it(&mut p);
        let err = CostModel::with_priors(p).unwrap_err();
        assert!(matches!(err, SchedError::InvalidCost { .. }), "{err:?}");
        assert_eq!(err.parameter(), name);
        assert!(err.to_string().contains(name), "{err}");
    }
}

// ---------------------------------------------------------------- the allocator

fn config(io: u32, dec: u32, limits: RankLimits, hysteresis: f64) -> AllocConfig {
    AllocConfig {
        budgets: Budgets {
            io_depth_total: io,
            decode_threads_total: dec,
        },
        limits,
        hysteresis_fraction: hysteresis,
    }
}

/// Every vector of `n` values in `[lo, hi]` with sum at most `budget`.
fn vectors(n: usize, lo: u32, hi: u32, budget: u32) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    let mut cur = vec![lo; n];
    fn rec(i: usize, left: u32, lo: u32, hi: u32, cur: &mut Vec<u32>, out: &mut Vec<Vec<u32>>) {
        if i == cur.len() {
            out.push(cur.clone());
            return;
        }
        let mut x = lo;
        while x <= hi && x <= left {
            cur[i] = x;
            rec(i + 1, left - x, lo, hi, cur, out);
            x += 1;
        }
    }
    rec(0, budget, lo, hi, &mut cur, &mut out);
    out
}

/// Minimum over every feasible joint allocation of the largest `model.predict`.
fn brute_force_min_max(model: &CostModel, loads: &[RankLoad], c: &AllocConfig) -> f64 {
    let l = &c.limits;
    let ios = vectors(
        loads.len(),
        l.io_depth_min,
        l.io_depth_max,
        c.budgets.io_depth_total,
    );
    let decs = vectors(
        loads.len(),
        l.decode_threads_min,
        l.decode_threads_max,
        c.budgets.decode_threads_total,
    );
    let mut best = f64::INFINITY;
    for d in &ios {
        for t in &decs {
            let max = (0..loads.len())
                .map(|r| model.predict(&loads[r], d[r], t[r]))
                .fold(0.0, f64::max);
            best = best.min(max);
        }
    }
    best
}

fn small_load(rng: &mut StdRng) -> RankLoad {
    let mut load = RankLoad::default();
    // Mostly a few samples so stage times flatten inside the budget; sometimes none.
    for tier in Tier::ALL {
        for _ in 0..rng.gen_range(0..7) {
            load.add_read(tier, 1 + rng.gen_range(0..1 << 20));
        }
    }
    for _ in 0..rng.gen_range(0..9) {
        load.add_decode(1 + rng.gen_range(0..1 << 20));
    }
    load
}

#[test]
fn allocation_matches_brute_force_on_small_instances() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut params = CostParams::PRIORS;
    params.tier_mut(Tier::Storage).bandwidth_bytes_per_s = 3e9;
    let models = [CostModel::new(), CostModel::with_priors(params).unwrap()];
    let mut checked = 0;
    for case in 0..120 {
        let ranks = 1 + (case % 4);
        // The biggest joint enumerations (4 ranks, budget 12) are slow unoptimised: few of them.
        let cap = if ranks == 4 && case % 10 != 3 { 8 } else { 12 };
        let lo = rng.gen_range(0..2u32);
        let hi = if rng.gen_ratio(1, 3) {
            2 + rng.gen_range(0..5u32)
        } else {
            u32::MAX
        };
        let limits = RankLimits {
            io_depth_min: lo,
            io_depth_max: hi,
            decode_threads_min: lo,
            decode_threads_max: hi,
        };
        let io = (ranks as u32 * lo).max(1) + rng.gen_range(0..cap);
        let dec = (ranks as u32 * lo).max(1) + rng.gen_range(0..cap);
        let (io, dec) = (io.min(cap), dec.min(cap));
        if ranks as u32 * lo > io.min(dec) {
            continue;
        }
        let c = config(io, dec, limits, 0.0);
        let loads: Vec<RankLoad> = (0..ranks).map(|_| small_load(&mut rng)).collect();
        let model = &models[case % 2];
        let a = Allocator::new(c).unwrap().allocate(&loads, model).unwrap();
        let want = brute_force_min_max(model, &loads, &c);
        assert_eq!(
            a.max_time_s(),
            want,
            "case {case}: {loads:?} {c:?} -> {a:?}"
        );
        checked += 1;
    }
    assert!(checked > 100, "only {checked} instances checked");
}

#[test]
fn allocation_is_the_bottleneck_greedy_unit_for_unit() {
    let mut rng = StdRng::seed_from_u64(8);
    let model = CostModel::new();
    for _ in 0..300 {
        let ranks = 1 + rng.gen_range(0..8usize);
        let limits = RankLimits {
            io_depth_min: rng.gen_range(0..3u32),
            io_depth_max: [3, 8, u32::MAX][rng.gen_range(0..3usize)],
            decode_threads_min: rng.gen_range(0..3u32),
            decode_threads_max: [2, 6, u32::MAX][rng.gen_range(0..3usize)],
        };
        let io = (ranks as u32 * limits.io_depth_min).max(1) + rng.gen_range(0..60u32);
        let dec = (ranks as u32 * limits.decode_threads_min).max(1) + rng.gen_range(0..30u32);
        let c = config(io, dec, limits, 0.0);
        let mut loads: Vec<RankLoad> = (0..ranks).map(|_| random_load(&mut rng, 24)).collect();
        // Identical ranks make ties, which the greedy breaks by lowest index.
        if rng.gen_bool(0.5) {
            let first = loads[0];
            loads.iter_mut().for_each(|l| *l = first);
        }
        let a = Allocator::new(c).unwrap().allocate(&loads, &model).unwrap();
        let io_units: Vec<u32> = a.ranks.iter().map(|r| r.io_depth).collect();
        let dec_units: Vec<u32> = a.ranks.iter().map(|r| r.decode_threads).collect();
        assert_eq!(io_units, greedy_reference(&model, &loads, &c, Resource::Io));
        assert_eq!(
            dec_units,
            greedy_reference(&model, &loads, &c, Resource::Decode)
        );
    }
}

#[test]
fn ties_go_to_the_lowest_rank_and_results_repeat() {
    let model = CostModel::new();
    let mut load = RankLoad::default();
    for _ in 0..100 {
        load.add_read(Tier::Storage, 100_000);
        load.add_decode(100_000);
    }
    let loads = vec![load; 3];
    let c = config(8, 4, RankLimits::default(), 0.0);
    let a = Allocator::new(c).unwrap().allocate(&loads, &model).unwrap();
    let io: Vec<u32> = a.ranks.iter().map(|r| r.io_depth).collect();
    let dec: Vec<u32> = a.ranks.iter().map(|r| r.decode_threads).collect();
    assert_eq!(io, [3, 3, 2]);
    assert_eq!(dec, [2, 1, 1]);
    let again = Allocator::new(c).unwrap().allocate(&loads, &model).unwrap();
    assert_eq!(a, again);
}

#[test]
fn storage_heavy_ranks_get_depth_and_imbalance_drops() {
    let model = CostModel::new();
    // Rank 0 reads all 256 samples from storage, ranks 1..4 find 3/4 of theirs in the cache.
    // No decode work, so the I/O stage decides the rank times.
    let mut loads = vec![RankLoad::default(); 4];
    for (r, load) in loads.iter_mut().enumerate() {
        for i in 0..256 {
            let tier = if r > 0 && i % 4 != 0 {
                Tier::Cache
            } else {
                Tier::Storage
            };
            load.add_read(tier, 110 << 10);
        }
    }
    let c = config(64, 16, RankLimits::default(), 0.0);
    let a = Allocator::new(c).unwrap().allocate(&loads, &model).unwrap();
    assert!(a.ranks[0].io_depth > a.ranks[1].io_depth, "{a:?}");
    assert!(
        a.ranks[1].io_depth.abs_diff(a.ranks[3].io_depth) <= 1,
        "{a:?}"
    );
    let report = a.imbalance();
    assert!(report.max_after_s < report.max_before_s, "{report:?}");
    assert!(report.after < report.before, "{report:?}");
    // Both ratios are max/mean of the split's times, from the formulas restated.
    for (ratio, split) in [(report.before, &a.equal_split), (report.after, &a.ranks)] {
        let times: Vec<f64> = loads
            .iter()
            .zip(split)
            .map(|(l, r)| reference_predict(&CostParams::PRIORS, l, r.io_depth, r.decode_threads))
            .collect();
        let max = times.iter().copied().fold(0.0, f64::max);
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        assert!(
            rel_err(ratio, max / mean) < 1e-12,
            "{report:?} vs {times:?}"
        );
    }
}

#[test]
fn spare_units_are_left_when_no_rank_gains() {
    let model = CostModel::new();
    let mut loads = vec![RankLoad::default(); 2];
    for load in &mut loads {
        for _ in 0..3 {
            load.add_read(Tier::Storage, 4096);
        }
        load.add_decode(4096);
    }
    let c = config(100, 10, RankLimits::default(), 0.0);
    let a = Allocator::new(c).unwrap().allocate(&loads, &model).unwrap();
    // Three reads each: more than three in flight gains nothing; one sample: one thread.
    assert!(
        a.ranks
            .iter()
            .all(|r| r.io_depth == 3 && r.decode_threads == 1),
        "{a:?}"
    );
    assert_eq!((a.io_depth_spare, a.decode_threads_spare), (94, 8));
}

#[test]
fn hysteresis_keeps_the_allocation_until_the_gain_is_large_enough() {
    let model = CostModel::new();
    let load = |storage: u32| {
        let mut l = RankLoad::default();
        for i in 0..200 {
            let tier = if i < storage {
                Tier::Storage
            } else {
                Tier::Cache
            };
            l.add_read(tier, 64 << 10);
        }
        l
    };
    let c = config(32, 4, RankLimits::default(), 0.2);
    let mut alloc = Allocator::new(c).unwrap();
    let first = alloc.allocate(&[load(200), load(100)], &model).unwrap();
    assert!(!first.kept_previous);
    // A small shift: the optimum moves, but gains less than 20% over the old allocation.
    let shifted = [load(185), load(115)];
    let second = alloc.allocate(&shifted, &model).unwrap();
    let fresh = Allocator::new(c)
        .unwrap()
        .allocate(&shifted, &model)
        .unwrap();
    assert_ne!(
        fresh.ranks[0].io_depth, first.ranks[0].io_depth,
        "the optimum must move"
    );
    let old_max = (0..2)
        .map(|r| {
            model.predict(
                &shifted[r],
                first.ranks[r].io_depth,
                first.ranks[r].decode_threads,
            )
        })
        .fold(0.0, f64::max);
    let gain = 1.0 - fresh.max_time_s() / old_max;
    assert!(gain > 0.0 && gain < 0.2, "gain {gain}");
    assert!(
        old_max <= second.imbalance().max_before_s,
        "old allocation beats the equal split"
    );
    assert!(second.kept_previous);
    assert_eq!(second.ranks[0].io_depth, first.ranks[0].io_depth);
    // The mix flips: the gain is large, the allocation follows.
    let third = alloc.allocate(&[load(20), load(200)], &model).unwrap();
    assert!(!third.kept_previous);
    assert!(
        third.ranks[1].io_depth > third.ranks[0].io_depth,
        "{third:?}"
    );
    // Without hysteresis the allocator follows every change.
    let mut eager = Allocator::new(config(32, 4, RankLimits::default(), 0.0)).unwrap();
    eager.allocate(&[load(200), load(100)], &model).unwrap();
    let moved = eager.allocate(&shifted, &model).unwrap();
    assert_eq!(moved.ranks, fresh.ranks);
}

#[test]
fn invalid_inputs_name_their_parameter() {
    let model = CostModel::new();
    let ok = RankLimits::default();
    let cases = [
        (config(0, 4, ok, 0.0), "io_depth_total"),
        (config(4, 0, ok, 0.0), "decode_threads_total"),
        (
            config(
                4,
                4,
                RankLimits {
                    io_depth_min: 5,
                    io_depth_max: 4,
                    ..ok
                },
                0.0,
            ),
            "io_depth_min",
        ),
        (
            config(
                4,
                4,
                RankLimits {
                    decode_threads_min: 2,
                    decode_threads_max: 1,
                    ..ok
                },
                0.0,
            ),
            "decode_threads_min",
        ),
        (config(4, 4, ok, 1.0), "hysteresis_fraction"),
        (config(4, 4, ok, f64::NAN), "hysteresis_fraction"),
        (config(4, 4, ok, -0.5), "hysteresis_fraction"),
    ];
    for (c, name) in cases {
        let err = Allocator::new(c).unwrap_err();
        assert_eq!(err.parameter(), name, "{err:?}");
        assert!(err.to_string().contains(name), "{err}");
    }

    let mut alloc = Allocator::new(config(4, 3, ok, 0.0)).unwrap();
    let load = RankLoad::default();
    let err = alloc.allocate(&[load; 4], &model).unwrap_err();
    assert_eq!(
        err,
        SchedError::BudgetBelowMinimums {
            parameter: "decode_threads_total",
            budget: 3,
            minimum_sum: 4,
            ranks: 4
        }
    );
    assert!(err.to_string().contains("decode_threads_total"));
    assert_eq!(
        alloc.allocate(&[], &model).unwrap_err(),
        SchedError::NoRanks
    );
    let too_many = vec![load; crate::MAX_RANKS + 1];
    assert_eq!(
        alloc.allocate(&too_many, &model).unwrap_err().parameter(),
        "loads"
    );
    let mut bad = RankLoad::default();
    *bad.tier_mut(Tier::Remote) = Volume {
        samples: 0,
        bytes: 10,
    };
    let err = alloc.allocate(&[load, bad], &model).unwrap_err();
    assert_eq!(
        err,
        SchedError::InconsistentLoad {
            rank: 1,
            parameter: "remote",
            bytes: 10
        }
    );
}

#[test]
fn zero_units_for_a_rank_with_work_is_infinite_and_avoided() {
    let model = CostModel::new();
    let mut busy = RankLoad::default();
    busy.add_read(Tier::Storage, 4096);
    busy.add_decode(4096);
    let limits = RankLimits {
        io_depth_min: 0,
        io_depth_max: u32::MAX,
        decode_threads_min: 0,
        decode_threads_max: u32::MAX,
    };
    let loads = [RankLoad::default(), busy, RankLoad::default()];
    let a = Allocator::new(config(1, 1, limits, 0.0))
        .unwrap()
        .allocate(&loads, &model)
        .unwrap();
    assert_eq!((a.ranks[1].io_depth, a.ranks[1].decode_threads), (1, 1));
    assert!(a.max_time_s().is_finite());
    assert_eq!(model.predict(&busy, 0, 1), f64::INFINITY);
    assert_eq!(
        stage_time_s(&model, &busy, Resource::Decode, 0),
        f64::INFINITY
    );
}

#[test]
fn checker_passes_on_seeded_random_inputs() {
    let mut rng = StdRng::seed_from_u64(9);
    let mut allocated = 0;
    let mut refused = std::collections::HashSet::new();
    for _ in 0..4000 {
        let len = rng.gen_range(0..400usize);
        let data: Vec<u8> = (0..len).map(|_| rng.gen::<u8>()).collect();
        match check_allocator(&data) {
            None => allocated += 1,
            Some(err) => {
                refused.insert(std::mem::discriminant(&err));
            }
        }
    }
    // The inputs reach the full checks often, and every documented error path.
    assert!(
        allocated > 1000,
        "only {allocated} of 4000 inputs allocated"
    );
    assert_eq!(refused.len(), 8, "error kinds seen: {}", refused.len());
}

#[test]
fn checker_accepts_empty_and_extreme_inputs() {
    // All zeros: the zero io budget is the first thing refused.
    assert_eq!(
        check_allocator(&[]),
        Some(SchedError::ZeroBudget {
            parameter: "io_depth_total"
        })
    );
    // All 0xff: the NaN hysteresis (byte 15) is refused before anything else.
    assert!(matches!(
        check_allocator(&[255; 64]),
        Some(SchedError::InvalidHysteresis { value }) if value.is_nan()
    ));
    // Then u32::MAX budgets and limits pass, and the rank count is one too many.
    let mut data = [255u8; 64];
    data[15] = 0; // hysteresis 0
    data[16] = 0; // the priors
    assert_eq!(
        check_allocator(&data),
        Some(SchedError::TooManyRanks {
            ranks: crate::MAX_RANKS + 1,
            max: crate::MAX_RANKS
        })
    );
    assert_eq!(check_allocator(&[0; 64]), check_allocator(&[]));
    // Huge budgets and sample counts: the solver must not step unit by unit.
    // 8 ranks, both budgets u32::MAX, no limits, no hysteresis, priors, no observations,
    // then raw u64 volumes of 0x0404… samples and bytes.
    let mut data = vec![
        8u8, 3, 0xff, 0xff, 0xff, 0xff, 3, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0,
    ];
    data.extend(std::iter::repeat_n(4u8, 8 * 4 * 17));
    assert_eq!(check_allocator(&data), None);
}

#[test]
fn equal_split_differs_by_at_most_one_and_sums_to_the_budget() {
    for budget in 0..40u32 {
        for ranks in 1..9 {
            let s = crate::equal_split(budget, ranks);
            assert_eq!(s.len(), ranks);
            assert_eq!(s.iter().sum::<u32>(), budget);
            let (lo, hi) = (s.iter().min().unwrap(), s.iter().max().unwrap());
            assert!(hi - lo <= 1, "{budget} over {ranks}: {s:?}");
            assert!(
                s.windows(2).all(|w| w[0] >= w[1]),
                "the remainder goes first: {s:?}"
            );
        }
    }
    assert_eq!(
        crate::equal_split(u32::MAX, 3)
            .iter()
            .map(|&x| u64::from(x))
            .sum::<u64>(),
        u64::from(u32::MAX)
    );
}
