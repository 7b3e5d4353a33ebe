/// Imbalance of one iteration or window: the largest rank time over the mean rank time.
///
/// `times_s` holds one time per rank, in seconds: measured load times (the facade's metrics)
/// or predicted ones (the allocator's report). The result is, by case:
///
/// - **valid times** (finite, non-negative, at least one positive): `max / mean`, in
///   `[1, n]` for `n` ranks, exactly `1.0` when all times are equal and exactly `n` when one
///   rank has all the time;
/// - **no ranks, or all times zero**: `1.0`, since no rank waits for another;
/// - **a time of `+∞`** (a rank that cannot finish, e.g. predicted with no depth for its
///   reads): `+∞`;
/// - **a NaN or negative time**: NaN, so that invalid input never passes for a ratio.
///
/// The ratio is computed as `n / Σ (t / max)`, which cannot overflow however large the times
/// and cannot round outside `[1, n]`.
pub fn imbalance(times_s: &[f64]) -> f64 {
    // -0.0 is not below zero: it counts as zero.
    if times_s.iter().any(|&t| t.is_nan() || t < 0.0) {
        return f64::NAN;
    }
    let max = times_s.iter().copied().fold(0.0, f64::max);
    if max == f64::INFINITY {
        return f64::INFINITY;
    }
    if max == 0.0 {
        return 1.0;
    }
    // The max contributes exactly 1 and every term is at most 1, so the sum is in [1, n].
    let sum: f64 = times_s.iter().map(|&t| t / max).sum();
    times_s.len() as f64 / sum
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::imbalance;

    /// The definition, in exact rational arithmetic: times are whole multiples of a unit, so
    /// max / mean = n·max / Σ t with integer numerator and denominator.
    fn reference(units: &[u64]) -> (u128, u128) {
        let max = u128::from(*units.iter().max().unwrap());
        let sum: u128 = units.iter().map(|&u| u128::from(u)).sum();
        (units.len() as u128 * max, sum)
    }

    #[test]
    fn imbalance_is_max_over_mean() {
        assert_eq!(imbalance(&[1.0, 1.0, 1.0]), 1.0);
        assert_eq!(imbalance(&[3.0, 1.0]), 1.5);
        assert_eq!(imbalance(&[1.0, 1.0, 2.0, 4.0]), 2.0);
        assert_eq!(imbalance(&[4.0, 0.0, 0.0, 0.0]), 4.0);
    }

    #[test]
    fn imbalance_matches_exact_arithmetic_on_random_windows() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..2000 {
            let n = rng.gen_range(1..=64);
            let units: Vec<u64> = (0..n).map(|_| rng.gen_range(0..1_000_000)).collect();
            if units.iter().all(|&u| u == 0) {
                continue;
            }
            // A unit of 1 ms or 3e300 s: the result is the same and nothing overflows.
            for unit_s in [1e-3, 3e300] {
                let times: Vec<f64> = units.iter().map(|&u| u as f64 * unit_s).collect();
                let got = imbalance(&times);
                let (num, den) = reference(&units);
                let want = num as f64 / den as f64;
                assert!(
                    (got - want).abs() <= 1e-12 * want,
                    "{units:?} x {unit_s}: {got} vs {want}"
                );
                assert!((1.0..=n as f64).contains(&got), "{units:?}: {got}");
            }
        }
    }

    #[test]
    fn equal_times_give_exactly_one_and_one_busy_rank_gives_exactly_n() {
        for n in 1..=100usize {
            for t in [0.1, 1.0 / 3.0, 7e-9, 1e300] {
                assert_eq!(imbalance(&vec![t; n]), 1.0, "n={n} t={t}");
                let mut one = vec![0.0; n];
                one[n / 2] = t;
                assert_eq!(imbalance(&one), n as f64, "n={n} t={t}");
            }
        }
    }

    #[test]
    fn no_ranks_or_no_time_is_balanced() {
        assert_eq!(imbalance(&[]), 1.0);
        assert_eq!(imbalance(&[0.0]), 1.0);
        assert_eq!(imbalance(&[0.0, 0.0]), 1.0);
        assert_eq!(imbalance(&[-0.0, 0.0]), 1.0);
    }

    #[test]
    fn an_infinite_time_is_infinite_imbalance() {
        assert_eq!(imbalance(&[f64::INFINITY, 1.0]), f64::INFINITY);
        assert_eq!(imbalance(&[0.0, f64::INFINITY]), f64::INFINITY);
        assert_eq!(imbalance(&[f64::INFINITY, f64::INFINITY]), f64::INFINITY);
    }

    #[test]
    fn invalid_times_give_nan_not_a_ratio() {
        for times in [
            &[f64::NAN][..],
            &[1.0, f64::NAN],
            &[f64::NAN, f64::INFINITY],
            &[2.0, -1.0],
            &[-1.0, -1.0],
            &[f64::NEG_INFINITY, 1.0],
            &[-1.0, f64::INFINITY],
        ] {
            assert!(imbalance(times).is_nan(), "{times:?}");
        }
    }
}
