//! Robust online estimates: a Huber line fit and a windowed median, both over bounded windows.

/// Observations kept per line fit; older ones are overwritten.
pub(crate) const FIT_WINDOW: usize = 64;
/// Observations needed before the fit replaces the prior.
pub(crate) const FIT_MIN_OBSERVATIONS: usize = 8;
/// Once the window is full the fit is refreshed every this many observations: the
/// allocator reads it once per window, and a refit costs a few microseconds.
pub(crate) const REFIT_EVERY: usize = 4;
/// Huber tuning constant (95% efficiency under Gaussian noise).
const HUBER_K: f64 = 1.345;
/// Reweighting passes per refit; the fit is warm-started, so passes accumulate over updates.
const IRLS_PASSES: usize = 4;
/// Consistency factor turning a median absolute residual into a standard deviation.
const MAD_TO_SIGMA: f64 = 1.4826;
/// Relative spread of `x` below which the slope is not identifiable and is kept.
const X_SPREAD_MIN_REL: f64 = 1e-9;
/// Smallest prediction used to scale residuals (1 ns), so a zero estimate stays usable.
const PREDICTION_FLOOR_S: f64 = 1e-9;
/// Smallest relative scale, so an exact fit still gives finite weights.
const SCALE_FLOOR: f64 = 1e-9;

/// Robust fit of `y = a + b * x` (`a, b >= 0`) over the last [`FIT_WINDOW`] points.
#[derive(Clone, Debug)]
pub(crate) struct LineFit {
    xs: [f64; FIT_WINDOW],
    ys: [f64; FIT_WINDOW],
    len: usize,
    next: usize,
    since_refit: usize,
    intercept: f64,
    slope: f64,
}

impl LineFit {
    pub(crate) fn new(intercept: f64, slope: f64) -> Self {
        LineFit {
            xs: [0.0; FIT_WINDOW],
            ys: [0.0; FIT_WINDOW],
            len: 0,
            next: 0,
            since_refit: 0,
            intercept,
            slope,
        }
    }

    pub(crate) fn intercept(&self) -> f64 {
        self.intercept
    }

    pub(crate) fn slope(&self) -> f64 {
        self.slope
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds a point and refits. Non-finite or negative points are dropped.
    pub(crate) fn push(&mut self, x: f64, y: f64) {
        if !(x.is_finite() && y.is_finite() && x >= 0.0 && y >= 0.0) {
            return;
        }
        self.xs[self.next] = x;
        self.ys[self.next] = y;
        self.next = (self.next + 1) % FIT_WINDOW;
        self.len = (self.len + 1).min(FIT_WINDOW);
        self.since_refit += 1;
        let due = self.len < FIT_WINDOW || self.since_refit >= REFIT_EVERY;
        if self.len >= FIT_MIN_OBSERVATIONS && due {
            self.since_refit = 0;
            self.refit();
        }
    }

    /// Iteratively reweighted least squares for the Huber loss on relative residuals
    /// `(y - ŷ) / ŷ`, scale from their median absolute value, started from the current
    /// estimate. Relative residuals suit latencies, whose noise grows with their size.
    fn refit(&mut self) {
        let n = self.len;
        let (xs, ys) = (&self.xs[..n], &self.ys[..n]);
        let mut rel = [0.0f64; FIT_WINDOW];
        let mut scratch = [0.0f64; FIT_WINDOW];
        let (mut a, mut b) = (self.intercept, self.slope);
        for _ in 0..IRLS_PASSES {
            for i in 0..n {
                let fitted = (a + b * xs[i]).max(PREDICTION_FLOOR_S);
                rel[i] = (ys[i] - fitted) / fitted;
                scratch[i] = rel[i].abs();
            }
            let scale = (MAD_TO_SIGMA * median(&mut scratch[..n])).max(SCALE_FLOOR);
            let cut = HUBER_K * scale;
            // Least-squares weight on the absolute residual: Huber weight / ŷ².
            for i in 0..n {
                let fitted = (a + b * xs[i]).max(PREDICTION_FLOOR_S);
                let r = rel[i].abs();
                let huber = if r <= cut { 1.0 } else { cut / r };
                scratch[i] = huber / (fitted * fitted);
            }
            let w = &scratch[..n];
            let (mut sw, mut swx, mut swy) = (0.0, 0.0, 0.0);
            for i in 0..n {
                sw += w[i];
                swx += w[i] * xs[i];
                swy += w[i] * ys[i];
            }
            let (xm, ym) = (swx / sw, swy / sw);
            let (mut sxx, mut sxy, mut sx2, mut sxy0) = (0.0, 0.0, 0.0, 0.0);
            for i in 0..n {
                let dx = xs[i] - xm;
                sxx += w[i] * dx * dx;
                sxy += w[i] * dx * (ys[i] - ym);
                sx2 += w[i] * xs[i] * xs[i];
                sxy0 += w[i] * xs[i] * ys[i];
            }
            let (mut na, mut nb) = if sxx > X_SPREAD_MIN_REL * sx2 && sxx > 0.0 {
                let nb = sxy / sxx;
                (ym - nb * xm, nb)
            } else {
                // All sizes (nearly) equal: the slope cannot be told from the intercept.
                (ym - b * xm, b)
            };
            if nb < 0.0 {
                nb = 0.0;
                na = ym;
            }
            if na < 0.0 {
                na = 0.0;
                if sx2 > 0.0 {
                    nb = (sxy0 / sx2).max(0.0);
                }
            }
            if !(na.is_finite() && nb.is_finite()) {
                break;
            }
            a = na;
            b = nb;
        }
        self.intercept = a;
        self.slope = b;
    }
}

/// Observations kept by a [`MedianWindow`].
pub(crate) const MEDIAN_WINDOW: usize = 16;
/// Observations needed before the median replaces the prior.
pub(crate) const MEDIAN_MIN_OBSERVATIONS: usize = 3;

/// Median of the last [`MEDIAN_WINDOW`] positive finite values.
#[derive(Clone, Debug)]
pub(crate) struct MedianWindow {
    values: [f64; MEDIAN_WINDOW],
    len: usize,
    next: usize,
}

impl MedianWindow {
    pub(crate) fn new() -> Self {
        MedianWindow {
            values: [0.0; MEDIAN_WINDOW],
            len: 0,
            next: 0,
        }
    }

    pub(crate) fn push(&mut self, v: f64) {
        if !(v.is_finite() && v > 0.0) {
            return;
        }
        self.values[self.next] = v;
        self.next = (self.next + 1) % MEDIAN_WINDOW;
        self.len = (self.len + 1).min(MEDIAN_WINDOW);
    }

    /// The median, once enough values were seen.
    pub(crate) fn estimate(&self) -> Option<f64> {
        if self.len < MEDIAN_MIN_OBSERVATIONS {
            return None;
        }
        let mut scratch = self.values;
        Some(median(&mut scratch[..self.len]))
    }
}

/// Median of a non-empty slice (mean of the two middle values for even lengths); reorders it.
fn median(v: &mut [f64]) -> f64 {
    let n = v.len();
    let mid = n / 2;
    let (lower, m, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    let upper = *m;
    if n % 2 == 1 {
        upper
    } else {
        let below = lower.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        0.5 * (below + upper)
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn median_matches_sorting() {
        let mut rng = StdRng::seed_from_u64(7);
        for n in 1..40 {
            // Whole numbers: the mean of the middle pair is exact, so `==` is fair.
            let mut v: Vec<f64> = (0..n)
                .map(|_| f64::from(rng.gen_range(0..1u32 << 24)))
                .collect();
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            let want = if n % 2 == 1 {
                sorted[n / 2]
            } else {
                0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
            };
            assert_eq!(median(&mut v), want, "n = {n}");
        }
    }

    #[test]
    fn exact_line_is_recovered_from_a_far_prior() {
        let mut fit = LineFit::new(1.0, 1.0);
        for i in 0..FIT_WINDOW {
            let x = 1000.0 * (1 + (i * 37) % 101) as f64;
            fit.push(x, 5e-5 + 2e-9 * x);
        }
        assert!((fit.intercept() - 5e-5).abs() < 5e-5 * 1e-3, "{fit:?}");
        assert!((fit.slope() - 2e-9).abs() < 2e-9 * 1e-3, "{fit:?}");
    }

    #[test]
    fn constant_sizes_keep_the_slope_and_fit_the_intercept() {
        let mut fit = LineFit::new(0.0, 1e-9);
        for _ in 0..FIT_WINDOW {
            fit.push(4096.0, 1e-4);
        }
        assert_eq!(fit.slope(), 1e-9);
        assert!((fit.intercept() - (1e-4 - 4096.0 * 1e-9)).abs() < 1e-12);
    }

    #[test]
    fn negative_fits_are_clamped_to_non_negative_costs() {
        // Latency falling with size would mean a negative per-byte cost.
        let mut fit = LineFit::new(1e-4, 1e-9);
        for i in 0..FIT_WINDOW {
            let x = 1000.0 * (i + 1) as f64;
            fit.push(x, (1e-3 - 1e-8 * x).max(0.0));
        }
        assert!(fit.slope() >= 0.0 && fit.intercept() >= 0.0, "{fit:?}");
    }

    #[test]
    fn median_window_ignores_one_outlier_and_waits_for_enough_values() {
        let mut w = MedianWindow::new();
        w.push(1e9);
        w.push(1e9);
        assert_eq!(w.estimate(), None);
        w.push(1e15);
        assert_eq!(w.estimate(), Some(1e9));
        w.push(f64::NAN);
        w.push(-1.0);
        assert_eq!(w.estimate(), Some(1e9));
    }
}
