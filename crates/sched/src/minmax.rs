//! Exact 1-D min-max allocation of one resource over ranks with nonincreasing stage times.
//!
//! The result is, unit for unit, what this greedy reaches: start every rank at `lo`; while
//! budget is left, give one unit to the rank with the largest time among those that can still
//! improve (`time(x) > time(hi)`), lowest index on ties. That greedy minimises the maximum:
//! while the maximum is above the optimum `T*`, the rank holding it has fewer units than any
//! allocation reaching `T*` gives it, so every unit it receives is one an optimum also spends;
//! once the rank holding the maximum cannot improve, no allocation can go lower.
//!
//! Instead of stepping unit by unit (the budget may be huge), the solver finds the greedy's
//! final level directly: the smallest candidate value `T` (a value some rank's time takes) at
//! which `Σ g_r(T) <= budget`, with `g_r(T)` the fewest units bringing rank `r` to `<= T`
//! (or its knee, if it cannot). The remainder goes, in rank order, to the ranks sitting at
//! exactly `T`, each up to the units that take it below `T` — the greedy's tie-breaking.

use crate::model::Stage;

/// Smallest `x` in `[lo, hi]` with `ok(stage.time_s(x))`, for a predicate that is monotone
/// (false then true) along `x`; `hi` if none. `target_s` seeds the closed-form guess.
fn first_where(stage: &Stage, lo: u32, hi: u32, target_s: f64, ok: impl Fn(f64) -> bool) -> u32 {
    if ok(stage.time_s(lo)) {
        return lo;
    }
    if lo == hi || !ok(stage.time_s(hi)) {
        return hi;
    }
    // Invariant from here: !ok(time(l)), ok(time(h)), l < h.
    let (mut l, mut h) = (lo, hi);
    let guess = stage
        .units_guess(target_s)
        .clamp(u64::from(lo) + 1, u64::from(hi)) as u32;
    if ok(stage.time_s(guess)) {
        if !ok(stage.time_s(guess - 1)) {
            return guess;
        }
        h = guess - 1;
    } else {
        if guess < hi && ok(stage.time_s(guess + 1)) {
            return guess + 1;
        }
        l = guess;
    }
    while h - l > 1 {
        let m = l + (h - l) / 2;
        if ok(stage.time_s(m)) {
            h = m;
        } else {
            l = m;
        }
    }
    h
}

/// One rank's share of the problem.
#[derive(Clone, Copy, Debug)]
struct Lane {
    stage: Stage,
    lo: u32,
    /// The knee: the fewest units reaching the rank's best time within `[lo, hi]`.
    cap: u32,
    cap_time_s: f64,
}

impl Lane {
    /// Fewest units bringing the time to `<= t`, or the knee when the rank cannot.
    fn units_for(&self, t: f64) -> u32 {
        if self.cap_time_s > t {
            self.cap
        } else {
            first_where(&self.stage, self.lo, self.cap, t, |v| v <= t)
        }
    }

    /// Fewest units bringing the time strictly below `t`, or the knee.
    fn units_below(&self, t: f64) -> u32 {
        first_where(&self.stage, self.lo, self.cap, t, |v| v < t)
    }
}

/// Scratch space reused across solves, so an allocation does not allocate per call.
#[derive(Clone, Debug, Default)]
pub(crate) struct Solver {
    lanes: Vec<Lane>,
}

impl Solver {
    /// Writes the units of every rank into `out` and returns the unassigned budget.
    ///
    /// Preconditions (checked by the caller): `lo <= hi`, `stages.len() * lo <= budget`,
    /// `out.len() == stages.len()`.
    pub(crate) fn solve(
        &mut self,
        stages: &[Stage],
        lo: u32,
        hi: u32,
        budget: u32,
        out: &mut [u32],
    ) -> u32 {
        debug_assert!(lo <= hi && out.len() == stages.len());
        self.lanes.clear();
        let mut cap_sum = 0u64;
        for stage in stages {
            let best_s = stage.time_s(hi);
            let cap = first_where(stage, lo, hi, best_s, |v| v <= best_s);
            cap_sum += u64::from(cap);
            self.lanes.push(Lane {
                stage: *stage,
                lo,
                cap,
                cap_time_s: stage.time_s(cap),
            });
        }
        let lanes = &self.lanes[..];
        if cap_sum <= u64::from(budget) {
            for (o, lane) in out.iter_mut().zip(lanes) {
                *o = lane.cap;
            }
            return budget - cap_sum as u32;
        }
        let feasible = |t: f64| {
            let mut sum = 0u64;
            for lane in lanes {
                sum += u64::from(lane.units_for(t));
                if sum > u64::from(budget) {
                    return false;
                }
            }
            true
        };
        // Everyone at `lo` fits, so the largest starting time is a feasible level.
        let mut best = lanes
            .iter()
            .map(|l| l.stage.time_s(l.lo))
            .fold(f64::NEG_INFINITY, f64::max);
        for lane in lanes {
            if lane.cap_time_s >= best {
                continue;
            }
            // This rank's values below `best` sit at x in [x0, cap], decreasing along x;
            // find the largest x whose value is still a feasible level.
            let x0 = lane.units_below(best);
            if !feasible(lane.stage.time_s(x0)) {
                continue;
            }
            let (mut l, mut h) = (x0, lane.cap);
            if feasible(lane.stage.time_s(h)) {
                l = h;
            } else {
                while h - l > 1 {
                    let m = l + (h - l) / 2;
                    if feasible(lane.stage.time_s(m)) {
                        l = m;
                    } else {
                        h = m;
                    }
                }
            }
            best = lane.stage.time_s(l);
        }
        let level = best;
        let mut used = 0u64;
        for (o, lane) in out.iter_mut().zip(lanes) {
            *o = lane.units_for(level);
            used += u64::from(*o);
        }
        let mut spare = budget - used as u32;
        for (o, lane) in out.iter_mut().zip(lanes) {
            if spare == 0 {
                break;
            }
            if *o < lane.cap && lane.stage.time_s(*o) == level {
                let give = (lane.units_below(level) - *o).min(spare);
                *o += give;
                spare -= give;
            }
        }
        spare
    }
}
