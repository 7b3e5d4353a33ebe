/// Imbalance of one window: the largest rank time over the mean rank time (`>= 1`).
///
/// `1.0` for no ranks or all-zero times; infinite when a time is infinite. Times are
/// non-negative seconds; NaN entries are ignored by the maximum and poison the mean.
pub fn imbalance(times_s: &[f64]) -> f64 {
    if times_s.is_empty() {
        return 1.0;
    }
    let max = times_s.iter().copied().fold(0.0, f64::max);
    if max.is_infinite() {
        return f64::INFINITY;
    }
    if max == 0.0 {
        return 1.0;
    }
    let mean = times_s.iter().sum::<f64>() / times_s.len() as f64;
    max / mean
}

#[cfg(test)]
mod tests {
    use super::imbalance;

    #[test]
    fn imbalance_is_max_over_mean() {
        assert_eq!(imbalance(&[1.0, 1.0, 1.0]), 1.0);
        assert_eq!(imbalance(&[3.0, 1.0]), 1.5);
        assert_eq!(imbalance(&[4.0, 0.0, 0.0, 0.0]), 4.0);
    }

    #[test]
    fn imbalance_of_degenerate_windows() {
        assert_eq!(imbalance(&[]), 1.0);
        assert_eq!(imbalance(&[0.0, 0.0]), 1.0);
        assert_eq!(imbalance(&[f64::INFINITY, 1.0]), f64::INFINITY);
    }
}
