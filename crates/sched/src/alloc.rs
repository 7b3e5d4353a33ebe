use crate::minmax::Solver;
use crate::model::Stage;
use crate::{imbalance, CostModel, RankLoad, SchedError};

/// Most ranks one allocator handles; bounds its per-rank state.
pub const MAX_RANKS: usize = 1024;

/// Node-wide totals to split among the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Budgets {
    /// Reads in flight over all ranks.
    pub io_depth_total: u32,
    /// Decode threads over all ranks.
    pub decode_threads_total: u32,
}

/// Bounds on what one rank may get; the same for every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RankLimits {
    /// Fewest reads in flight a rank gets.
    pub io_depth_min: u32,
    /// Most reads in flight a rank gets.
    pub io_depth_max: u32,
    /// Fewest decode threads a rank gets.
    pub decode_threads_min: u32,
    /// Most decode threads a rank gets.
    pub decode_threads_max: u32,
}

impl Default for RankLimits {
    /// At least one of each, no maximum beyond the budget.
    fn default() -> Self {
        RankLimits {
            io_depth_min: 1,
            io_depth_max: u32::MAX,
            decode_threads_min: 1,
            decode_threads_max: u32::MAX,
        }
    }
}

/// Settings of an [`Allocator`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllocConfig {
    /// Totals to split.
    pub budgets: Budgets,
    /// Per-rank bounds.
    pub limits: RankLimits,
    /// The previous allocation is kept unless the new one lowers the predicted maximum rank
    /// time by more than this fraction of the previous one's. In `[0, 1)`.
    pub hysteresis_fraction: f64,
}

impl AllocConfig {
    /// Default hysteresis: switch only for a predicted gain above 5%.
    pub const DEFAULT_HYSTERESIS_FRACTION: f64 = 0.05;

    /// `budgets` with [`RankLimits::default`] and the default hysteresis.
    pub fn new(budgets: Budgets) -> Self {
        AllocConfig {
            budgets,
            limits: RankLimits::default(),
            hysteresis_fraction: Self::DEFAULT_HYSTERESIS_FRACTION,
        }
    }

    /// Checks the settings that do not depend on the number of ranks, in this order:
    /// zero budgets (io then decode), minimum above maximum (io then decode), hysteresis.
    pub fn validate(&self) -> Result<(), SchedError> {
        if self.budgets.io_depth_total == 0 {
            return Err(SchedError::ZeroBudget {
                parameter: "io_depth_total",
            });
        }
        if self.budgets.decode_threads_total == 0 {
            return Err(SchedError::ZeroBudget {
                parameter: "decode_threads_total",
            });
        }
        let l = &self.limits;
        if l.io_depth_min > l.io_depth_max {
            return Err(SchedError::MinAboveMax {
                parameter: "io_depth_min",
                min: l.io_depth_min,
                max: l.io_depth_max,
            });
        }
        if l.decode_threads_min > l.decode_threads_max {
            return Err(SchedError::MinAboveMax {
                parameter: "decode_threads_min",
                min: l.decode_threads_min,
                max: l.decode_threads_max,
            });
        }
        let h = self.hysteresis_fraction;
        if !(0.0..1.0).contains(&h) {
            return Err(SchedError::InvalidHysteresis { value: h });
        }
        Ok(())
    }

    /// The equal split for `ranks` ranks: each resource's budget divided evenly, the remainder
    /// one unit each to the lowest ranks, then clamped to the per-rank limits.
    /// Feasible whenever the budgets cover the minimums.
    pub fn equal_split(&self, ranks: usize) -> Vec<(u32, u32)> {
        let (b, l) = (&self.budgets, &self.limits);
        let io = equal_split(b.io_depth_total, ranks);
        let decode = equal_split(b.decode_threads_total, ranks);
        io.into_iter()
            .zip(decode)
            .map(|(io, decode)| {
                (
                    io.clamp(l.io_depth_min, l.io_depth_max),
                    decode.clamp(l.decode_threads_min, l.decode_threads_max),
                )
            })
            .collect()
    }
}

/// What one rank gets for the coming window, with its predicted times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankAllocation {
    /// Reads in flight.
    pub io_depth: u32,
    /// Decode threads.
    pub decode_threads: u32,
    /// Predicted I/O stage time, in seconds.
    pub io_s: f64,
    /// Predicted decode stage time, in seconds.
    pub decode_s: f64,
    /// Predicted rank time (`max(io_s, decode_s)`), in seconds.
    pub time_s: f64,
}

/// Result of [`Allocator::allocate`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Allocation {
    /// Per rank, in the order of the loads.
    pub ranks: Vec<RankAllocation>,
    /// The equal split ([`AllocConfig::equal_split`]) under the same loads and model.
    pub equal_split: Vec<RankAllocation>,
    /// io_depth no rank's predicted time gains from; left unassigned.
    pub io_depth_spare: u32,
    /// Decode threads no rank's predicted time gains from; left unassigned.
    pub decode_threads_spare: u32,
    /// The node's bandwidth floor for these loads ([`CostModel::bandwidth_floor_s`]).
    pub bandwidth_floor_s: f64,
    /// Whether hysteresis kept the previous allocation.
    pub kept_previous: bool,
}

/// Imbalance of one window, before (equal split) and after allocation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ImbalanceReport {
    /// [`imbalance`] of the equal split's predicted rank times.
    pub before: f64,
    /// [`imbalance`] of the allocation's predicted rank times.
    pub after: f64,
    /// Largest predicted rank time under the equal split, in seconds.
    pub max_before_s: f64,
    /// Largest predicted rank time under the allocation, in seconds.
    pub max_after_s: f64,
}

fn max_time_s(ranks: &[RankAllocation]) -> f64 {
    ranks.iter().map(|r| r.time_s).fold(0.0, f64::max)
}

impl Allocation {
    /// Largest predicted rank time, in seconds: what the allocator minimised.
    pub fn max_time_s(&self) -> f64 {
        max_time_s(&self.ranks)
    }

    /// Predicted window time, in seconds: the slowest rank or the bandwidth floor.
    pub fn window_s(&self) -> f64 {
        self.max_time_s().max(self.bandwidth_floor_s)
    }

    /// Imbalance before (equal split) and after this allocation, for logging per window.
    pub fn imbalance(&self) -> ImbalanceReport {
        let times = |v: &[RankAllocation]| v.iter().map(|r| r.time_s).collect::<Vec<_>>();
        ImbalanceReport {
            before: imbalance(&times(&self.equal_split)),
            after: imbalance(&times(&self.ranks)),
            max_before_s: max_time_s(&self.equal_split),
            max_after_s: self.max_time_s(),
        }
    }
}

/// Splits io_depth and decode threads among ranks to minimise the slowest rank's predicted
/// time, with hysteresis against flapping. See the crate docs.
#[derive(Clone, Debug)]
pub struct Allocator {
    config: AllocConfig,
    previous: Vec<(u32, u32)>,
    solver: Solver,
    io_stages: Vec<Stage>,
    decode_stages: Vec<Stage>,
    io_units: Vec<u32>,
    decode_units: Vec<u32>,
}

impl Allocator {
    /// An allocator with no previous allocation, after [`AllocConfig::validate`].
    pub fn new(config: AllocConfig) -> Result<Self, SchedError> {
        config.validate()?;
        Ok(Allocator {
            config,
            previous: Vec::new(),
            solver: Solver::default(),
            io_stages: Vec::new(),
            decode_stages: Vec::new(),
            io_units: Vec::new(),
            decode_units: Vec::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &AllocConfig {
        &self.config
    }

    /// Forgets the previous allocation, so the next one is not held back by hysteresis.
    pub fn reset(&mut self) {
        self.previous.clear();
    }

    /// Allocates for the coming window.
    ///
    /// Errors, checked in this order: [`SchedError::NoRanks`], [`SchedError::TooManyRanks`],
    /// [`SchedError::InvalidCost`] (the model's parameters), [`SchedError::InconsistentLoad`]
    /// (first rank, tiers then decode), [`SchedError::BudgetBelowMinimums`] (io then decode).
    ///
    /// The new allocation minimises the largest predicted rank time exactly; among optimal
    /// allocations it is the one the bottleneck greedy reaches (lowest rank index first on
    /// ties). The previous allocation (same number of ranks) is kept instead when the new one
    /// does not beat it by more than `hysteresis_fraction` and it is no worse than the equal
    /// split, both predicted under the current loads and model.
    pub fn allocate(
        &mut self,
        loads: &[RankLoad],
        model: &CostModel,
    ) -> Result<Allocation, SchedError> {
        self.check(loads, model)?;
        let n = loads.len();
        let (b, l) = (self.config.budgets, self.config.limits);
        self.io_stages.clear();
        self.io_stages
            .extend(loads.iter().map(|x| model.io_stage(x)));
        self.decode_stages.clear();
        self.decode_stages
            .extend(loads.iter().map(|x| model.decode_stage(x)));
        self.io_units.resize(n, 0);
        self.decode_units.resize(n, 0);
        let mut io_spare = self.solver.solve(
            &self.io_stages,
            l.io_depth_min,
            l.io_depth_max,
            b.io_depth_total,
            &mut self.io_units,
        );
        let mut decode_spare = self.solver.solve(
            &self.decode_stages,
            l.decode_threads_min,
            l.decode_threads_max,
            b.decode_threads_total,
            &mut self.decode_units,
        );

        let eval = |io: u32, dec: u32, r: usize| {
            let io_s = self.io_stages[r].time_s(io);
            let decode_s = self.decode_stages[r].time_s(dec);
            RankAllocation {
                io_depth: io,
                decode_threads: dec,
                io_s,
                decode_s,
                time_s: io_s.max(decode_s),
            }
        };
        let mut ranks: Vec<RankAllocation> = (0..n)
            .map(|r| eval(self.io_units[r], self.decode_units[r], r))
            .collect();
        let equal_split: Vec<RankAllocation> = self
            .config
            .equal_split(n)
            .into_iter()
            .enumerate()
            .map(|(r, (io, dec))| eval(io, dec, r))
            .collect();

        let mut kept_previous = false;
        if self.previous.len() == n {
            let previous: Vec<RankAllocation> = self
                .previous
                .iter()
                .enumerate()
                .map(|(r, &(io, dec))| eval(io, dec, r))
                .collect();
            let new_max = max_time_s(&ranks);
            let previous_max = max_time_s(&previous);
            let gain_enough = new_max < previous_max * (1.0 - self.config.hysteresis_fraction);
            if !gain_enough && previous_max <= max_time_s(&equal_split) {
                ranks = previous;
                kept_previous = true;
                let io_used: u64 = ranks.iter().map(|r| u64::from(r.io_depth)).sum();
                let dec_used: u64 = ranks.iter().map(|r| u64::from(r.decode_threads)).sum();
                io_spare = (u64::from(b.io_depth_total) - io_used) as u32;
                decode_spare = (u64::from(b.decode_threads_total) - dec_used) as u32;
            }
        }
        self.previous.clear();
        self.previous
            .extend(ranks.iter().map(|r| (r.io_depth, r.decode_threads)));

        Ok(Allocation {
            ranks,
            equal_split,
            io_depth_spare: io_spare,
            decode_threads_spare: decode_spare,
            bandwidth_floor_s: model.bandwidth_floor_s(loads),
            kept_previous,
        })
    }

    /// The loads, the model and the budgets are fit to allocate over: what
    /// [`Allocator::allocate`] refuses, in its order.
    fn check(&self, loads: &[RankLoad], model: &CostModel) -> Result<(), SchedError> {
        let n = loads.len();
        if n == 0 {
            return Err(SchedError::NoRanks);
        }
        if n > MAX_RANKS {
            return Err(SchedError::TooManyRanks {
                ranks: n,
                max: MAX_RANKS,
            });
        }
        model.params().validate()?;
        for (rank, load) in loads.iter().enumerate() {
            load.validate(rank)?;
        }
        let (b, l) = (self.config.budgets, self.config.limits);
        for (parameter, budget, min) in [
            ("io_depth_total", b.io_depth_total, l.io_depth_min),
            (
                "decode_threads_total",
                b.decode_threads_total,
                l.decode_threads_min,
            ),
        ] {
            let minimum_sum = u64::from(min) * n as u64;
            if minimum_sum > u64::from(budget) {
                return Err(SchedError::BudgetBelowMinimums {
                    parameter,
                    budget,
                    minimum_sum,
                    ranks: n,
                });
            }
        }
        Ok(())
    }
}

/// `budget` split as evenly as possible over `ranks`, one more each to the lowest ranks
/// for the remainder: what every rank gets before the allocator has seen a load.
pub fn equal_split(budget: u32, ranks: usize) -> Vec<u32> {
    let n = ranks as u64;
    (0..n)
        .map(|r| (u64::from(budget) / n + u64::from(r < u64::from(budget) % n)) as u32)
        .collect()
}
