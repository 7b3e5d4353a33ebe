//! The allocator's invariants, checked on inputs decoded from arbitrary bytes: shared by the
//! `sched_allocator` fuzz target and the unit tests.
//!
//! The checker restates the documented contract independently of the implementation: it
//! predicts the expected error itself, recomputes the equal split, proves optimality of each
//! stage with a certificate (no allocation within budget brings every rank below the
//! achieved maximum), and, for small budgets, compares unit for unit with a literal greedy.

use std::time::Duration;

use crate::{
    AllocConfig, Allocation, Allocator, Budgets, CostModel, CostParams, RankLimits, RankLoad,
    SchedError, Tier, Volume, MAX_RANKS,
};

/// Reads values from the fuzz input, yielding zeros once it runs out.
struct Input<'a> {
    data: &'a [u8],
}

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    fn volume(&mut self) -> Volume {
        match self.u8() % 5 {
            0 => Volume::default(),
            1 => {
                let samples = u64::from(self.u8() % 16) + 1;
                Volume {
                    samples,
                    bytes: samples * u64::from(self.u16()),
                }
            }
            2 => Volume {
                samples: u64::from(self.u16()) + 1,
                bytes: u64::from(self.u32()),
            },
            3 => Volume {
                samples: u64::from(self.u8() % 4),
                bytes: u64::from(self.u8()),
            },
            _ => Volume {
                samples: self.u64(),
                bytes: self.u64(),
            },
        }
    }

    fn budget(&mut self) -> u32 {
        match self.u8() % 4 {
            0 | 1 => u32::from(self.u8() % 25),
            2 => u32::from(self.u16()),
            _ => self.u32(),
        }
    }

    fn limit_max(&mut self) -> u32 {
        match self.u8() % 3 {
            0 => u32::MAX,
            1 => u32::from(self.u8() % 16),
            _ => self.u32(),
        }
    }

    fn cost(&mut self, prior: f64) -> f64 {
        match self.u8() {
            0 => f64::NAN,
            1 => -prior - 1e-9,
            2 => f64::INFINITY,
            3 => 0.0,
            b => prior * 2f64.powi(i32::from(b % 32) - 16),
        }
    }

    fn bandwidth(&mut self) -> f64 {
        match self.u8() {
            0 => f64::NAN,
            1 => 0.0,
            2 => -1.0,
            3..=127 => f64::INFINITY,
            b => 1e6 * 2f64.powi(i32::from(b % 24)),
        }
    }
}

fn expected_config_error(c: &AllocConfig) -> Option<SchedError> {
    let (b, l) = (&c.budgets, &c.limits);
    if b.io_depth_total == 0 {
        Some(SchedError::ZeroBudget {
            parameter: "io_depth_total",
        })
    } else if b.decode_threads_total == 0 {
        Some(SchedError::ZeroBudget {
            parameter: "decode_threads_total",
        })
    } else if l.io_depth_min > l.io_depth_max {
        Some(SchedError::MinAboveMax {
            parameter: "io_depth_min",
            min: l.io_depth_min,
            max: l.io_depth_max,
        })
    } else if l.decode_threads_min > l.decode_threads_max {
        Some(SchedError::MinAboveMax {
            parameter: "decode_threads_min",
            min: l.decode_threads_min,
            max: l.decode_threads_max,
        })
    } else if !(c.hysteresis_fraction >= 0.0 && c.hysteresis_fraction < 1.0) {
        Some(SchedError::InvalidHysteresis {
            value: c.hysteresis_fraction,
        })
    } else {
        None
    }
}

fn expected_params_error(p: &CostParams) -> Option<SchedError> {
    let bad_cost = |v: f64| !(v.is_finite() && v >= 0.0);
    let fields: [(&str, f64, bool); 11] = [
        ("cache.request_s", p.reads[0].request_s, true),
        ("cache.per_byte_s", p.reads[0].per_byte_s, true),
        (
            "cache.bandwidth_bytes_per_s",
            p.reads[0].bandwidth_bytes_per_s,
            false,
        ),
        ("storage.request_s", p.reads[1].request_s, true),
        ("storage.per_byte_s", p.reads[1].per_byte_s, true),
        (
            "storage.bandwidth_bytes_per_s",
            p.reads[1].bandwidth_bytes_per_s,
            false,
        ),
        ("remote.request_s", p.reads[2].request_s, true),
        ("remote.per_byte_s", p.reads[2].per_byte_s, true),
        (
            "remote.bandwidth_bytes_per_s",
            p.reads[2].bandwidth_bytes_per_s,
            false,
        ),
        ("decode.sample_s", p.decode.sample_s, true),
        ("decode.per_byte_s", p.decode.per_byte_s, true),
    ];
    fields.into_iter().find_map(|(parameter, value, is_cost)| {
        let bad = if is_cost {
            bad_cost(value)
        } else {
            value.is_nan() || value <= 0.0
        };
        bad.then_some(SchedError::InvalidCost { parameter, value })
    })
}

fn expected_allocate_error(loads: &[RankLoad], c: &AllocConfig) -> Option<SchedError> {
    if loads.is_empty() {
        return Some(SchedError::NoRanks);
    }
    if loads.len() > MAX_RANKS {
        return Some(SchedError::TooManyRanks {
            ranks: loads.len(),
            max: MAX_RANKS,
        });
    }
    for (rank, load) in loads.iter().enumerate() {
        let parts = [
            ("cache", load.tier(Tier::Cache)),
            ("storage", load.tier(Tier::Storage)),
            ("remote", load.tier(Tier::Remote)),
            ("decode", load.decode),
        ];
        for (parameter, v) in parts {
            if v.samples == 0 && v.bytes != 0 {
                return Some(SchedError::InconsistentLoad {
                    rank,
                    parameter,
                    bytes: v.bytes,
                });
            }
        }
    }
    let n = loads.len() as u64;
    let (b, l) = (&c.budgets, &c.limits);
    if u64::from(l.io_depth_min) * n > u64::from(b.io_depth_total) {
        return Some(SchedError::BudgetBelowMinimums {
            parameter: "io_depth_total",
            budget: b.io_depth_total,
            minimum_sum: u64::from(l.io_depth_min) * n,
            ranks: loads.len(),
        });
    }
    if u64::from(l.decode_threads_min) * n > u64::from(b.decode_threads_total) {
        return Some(SchedError::BudgetBelowMinimums {
            parameter: "decode_threads_total",
            budget: b.decode_threads_total,
            minimum_sum: u64::from(l.decode_threads_min) * n,
            ranks: loads.len(),
        });
    }
    None
}

/// One resource seen through the public model: its time for rank `r` with `x` units.
#[derive(Clone, Copy)]
pub(crate) enum Resource {
    Io,
    Decode,
}

pub(crate) fn stage_time_s(model: &CostModel, load: &RankLoad, res: Resource, x: u32) -> f64 {
    // The other stage gets one unit: only this stage's time is read.
    match res {
        Resource::Io => model.predict_stages(load, x, 1).io_s,
        Resource::Decode => model.predict_stages(load, 1, x).decode_s,
    }
}

fn bounds(c: &AllocConfig, res: Resource) -> (u32, u32, u32) {
    match res {
        Resource::Io => (
            c.limits.io_depth_min,
            c.limits.io_depth_max,
            c.budgets.io_depth_total,
        ),
        Resource::Decode => (
            c.limits.decode_threads_min,
            c.limits.decode_threads_max,
            c.budgets.decode_threads_total,
        ),
    }
}

/// The literal bottleneck greedy, one unit at a time: the allocator's documented result.
pub(crate) fn greedy_reference(
    model: &CostModel,
    loads: &[RankLoad],
    c: &AllocConfig,
    res: Resource,
) -> Vec<u32> {
    let (lo, hi, budget) = bounds(c, res);
    let f = |r: usize, x: u32| stage_time_s(model, &loads[r], res, x);
    let mut x = vec![lo; loads.len()];
    let mut spare = budget - lo * loads.len() as u32;
    while spare > 0 {
        let mut pick: Option<(usize, f64)> = None;
        for (r, &units) in x.iter().enumerate() {
            let t = f(r, units);
            if t > f(r, hi) && pick.is_none_or(|(_, best)| t > best) {
                pick = Some((r, t));
            }
        }
        let Some((r, _)) = pick else { break };
        x[r] += 1;
        spare -= 1;
    }
    x
}

/// Units of `res` per rank, and the largest stage time among them.
fn units(a: &Allocation, res: Resource) -> Vec<u32> {
    a.ranks
        .iter()
        .map(|r| match res {
            Resource::Io => r.io_depth,
            Resource::Decode => r.decode_threads,
        })
        .collect()
}

/// Asserts no allocation of `res` within budget and limits brings every rank strictly below
/// the maximum `x` achieves: each rank's fewest units to get below it (binary search over the
/// monotone stage time) already exceed the budget together.
fn assert_optimal(
    model: &CostModel,
    loads: &[RankLoad],
    c: &AllocConfig,
    res: Resource,
    x: &[u32],
) {
    let (lo, hi, budget) = bounds(c, res);
    let f = |r: usize, u: u32| stage_time_s(model, &loads[r], res, u);
    let max = (0..loads.len()).map(|r| f(r, x[r])).fold(0.0, f64::max);
    let mut need = 0u64;
    for r in 0..loads.len() {
        if f(r, hi) >= max {
            return; // This rank can never go below the maximum: optimal.
        }
        let (mut l, mut h) = (lo, hi);
        if f(r, l) < max {
            h = l;
        } else {
            while h - l > 1 {
                let m = l + (h - l) / 2;
                if f(r, m) < max {
                    h = m;
                } else {
                    l = m;
                }
            }
        }
        need += u64::from(h);
    }
    assert!(
        need > u64::from(budget),
        "not optimal: {need} units within a budget of {budget} beat the maximum {max}"
    );
}

/// Feasibility, consistency with the model, no worse than the equal split, spare units
/// useless to every rank, optimality of both stages.
fn assert_valid(model: &CostModel, loads: &[RankLoad], c: &AllocConfig, a: &Allocation) {
    assert_eq!(a.ranks.len(), loads.len());
    for (res, spare) in [
        (Resource::Io, a.io_depth_spare),
        (Resource::Decode, a.decode_threads_spare),
    ] {
        let (lo, hi, budget) = bounds(c, res);
        let x = units(a, res);
        assert!(
            x.iter().all(|&u| lo <= u && u <= hi),
            "limits broken: {x:?}"
        );
        let used: u64 = x.iter().map(|&u| u64::from(u)).sum();
        assert_eq!(
            used + u64::from(spare),
            u64::from(budget),
            "budget broken: {x:?}"
        );
        if spare > 0 && !a.kept_previous {
            for (r, &u) in x.iter().enumerate() {
                let (now, best) = (
                    stage_time_s(model, &loads[r], res, u),
                    stage_time_s(model, &loads[r], res, hi),
                );
                assert!(
                    now <= best,
                    "spare {spare} left while rank {r} could improve"
                );
            }
        }
        if !a.kept_previous {
            assert_optimal(model, loads, c, res, &x);
        }
    }
    for (r, ra) in a.ranks.iter().enumerate() {
        let s = model.predict_stages(&loads[r], ra.io_depth, ra.decode_threads);
        assert_eq!((ra.io_s, ra.decode_s), (s.io_s, s.decode_s));
        assert_eq!(
            ra.time_s,
            model.predict(&loads[r], ra.io_depth, ra.decode_threads)
        );
    }
    // The equal split, restated.
    let n = loads.len() as u64;
    let share = |budget: u32, lo: u32, hi: u32, r: usize| {
        let base = u64::from(budget) / n;
        let extra = u64::from((r as u64) < u64::from(budget) % n);
        (base + extra).clamp(u64::from(lo), u64::from(hi)) as u32
    };
    let mut equal_max = 0.0f64;
    for (r, load) in loads.iter().enumerate() {
        let io = share(
            c.budgets.io_depth_total,
            c.limits.io_depth_min,
            c.limits.io_depth_max,
            r,
        );
        let dec = share(
            c.budgets.decode_threads_total,
            c.limits.decode_threads_min,
            c.limits.decode_threads_max,
            r,
        );
        assert_eq!(
            (a.equal_split[r].io_depth, a.equal_split[r].decode_threads),
            (io, dec)
        );
        equal_max = equal_max.max(model.predict(load, io, dec));
    }
    assert!(
        a.max_time_s() <= equal_max,
        "worse than the equal split: {} > {equal_max}",
        a.max_time_s()
    );
    let report = a.imbalance();
    assert_eq!(report.max_after_s, a.max_time_s());
    assert_eq!(report.max_before_s, equal_max);
    // Predicted times are never NaN or negative, so the ratios are never NaN.
    for ratio in [report.before, report.after] {
        assert!(
            ratio == f64::INFINITY || (1.0..=loads.len() as f64).contains(&ratio),
            "imbalance {ratio} of {} ranks",
            loads.len()
        );
    }
    assert!(a.window_s() >= a.bandwidth_floor_s && a.window_s() >= a.max_time_s());
}

/// Decodes loads, budgets, limits, hysteresis and model from `data`, runs the allocator
/// twice (the second time on changed loads, through hysteresis) and asserts the contract:
/// the documented error when the input is invalid, otherwise a feasible, optimal allocation
/// no worse than the equal split. Panics on a violation. Returns the error the input was
/// rightly refused with, or `None` when it was allocated and checked.
pub fn check_allocator(data: &[u8]) -> Option<SchedError> {
    let mut input = Input { data };
    let (ranks, config) = config_from(&mut input);
    let model = match model_from(&mut input) {
        Ok(model) => model,
        Err(refused) => return Some(refused),
    };

    let mut loads = vec![RankLoad::default(); ranks];
    if ranks <= 16 {
        for load in &mut loads {
            for v in &mut load.reads {
                *v = input.volume();
            }
            load.decode = input.volume();
        }
    }
    let mut allocator = match (Allocator::new(config), expected_config_error(&config)) {
        (Ok(a), None) => a,
        (Err(got), Some(want)) if format!("{got:?}") == format!("{want:?}") => return Some(got),
        (got, want) => panic!("config {config:?}: got {got:?}, want {want:?}"),
    };
    let first = match (
        allocator.allocate(&loads, &model),
        expected_allocate_error(&loads, &config),
    ) {
        (Ok(a), None) => a,
        (Err(got), Some(want)) if got == want => return Some(got),
        (got, want) => panic!("allocate: got {got:?}, want {want:?}"),
    };
    assert!(!first.kept_previous);
    assert_valid(&model, &loads, &config, &first);
    let small = config.budgets.io_depth_total <= 64 && config.budgets.decode_threads_total <= 64;
    if small {
        assert_eq!(
            units(&first, Resource::Io),
            greedy_reference(&model, &loads, &config, Resource::Io)
        );
        assert_eq!(
            units(&first, Resource::Decode),
            greedy_reference(&model, &loads, &config, Resource::Decode)
        );
    }

    check_next_window(
        &mut allocator,
        &first,
        &mut loads,
        &model,
        &config,
        &mut input,
    );
    None
}

/// The ranks and the allocator's configuration `input` describes.
fn config_from(input: &mut Input<'_>) -> (usize, AllocConfig) {
    let ranks = match input.u8() {
        255 => MAX_RANKS + 1,
        b => usize::from(b % 10),
    };
    let config = AllocConfig {
        budgets: Budgets {
            io_depth_total: input.budget(),
            decode_threads_total: input.budget(),
        },
        limits: RankLimits {
            io_depth_min: u32::from(input.u8() % 4),
            io_depth_max: input.limit_max(),
            decode_threads_min: u32::from(input.u8() % 4),
            decode_threads_max: input.limit_max(),
        },
        hysteresis_fraction: match input.u8() {
            255 => f64::NAN,
            254 => 1.0,
            253 => -0.01,
            b => f64::from(b) / 500.0,
        },
    };
    (ranks, config)
}

/// The cost model `input` describes, calibrated by the observations it holds; the error
/// its parameters are rightly refused with.
fn model_from(input: &mut Input<'_>) -> Result<CostModel, SchedError> {
    let mut params = CostParams::PRIORS;
    if input.u8() % 2 == 1 {
        for t in &mut params.reads {
            t.request_s = input.cost(t.request_s);
            t.per_byte_s = input.cost(t.per_byte_s);
            t.bandwidth_bytes_per_s = input.bandwidth();
        }
        params.decode.sample_s = input.cost(params.decode.sample_s);
        params.decode.per_byte_s = input.cost(params.decode.per_byte_s);
    }
    let mut model = match (
        CostModel::with_priors(params),
        expected_params_error(&params),
    ) {
        (Ok(model), None) => model,
        (Err(got), Some(want)) if format!("{got:?}") == format!("{want:?}") => return Err(got),
        (got, want) => panic!("params {params:?}: got {got:?}, want {want:?}"),
    };
    for _ in 0..input.u8() % 24 {
        let tier = Tier::ALL[usize::from(input.u8() % 3)];
        let bytes = u64::from(input.u32());
        let nanos = u64::from(input.u32());
        if input.u8() % 2 == 0 {
            model.observe_read(tier, bytes, Duration::from_nanos(nanos));
        } else {
            model.observe_decode(u64::from(input.u8()), bytes, Duration::from_nanos(nanos));
        }
    }
    model
        .params()
        .validate()
        .expect("calibration keeps the costs valid");
    Ok(model)
}

/// The next window: loads change, and hysteresis decides whether the allocation moves.
fn check_next_window(
    allocator: &mut Allocator,
    first: &Allocation,
    loads: &mut [RankLoad],
    model: &CostModel,
    config: &AllocConfig,
    input: &mut Input<'_>,
) {
    let ranks = loads.len();
    // Next window: loads change, hysteresis decides whether to move.
    loads.rotate_left(usize::from(input.u8()) % ranks.max(1));
    if let Some(load) = loads.first_mut() {
        load.add_read(Tier::Storage, u64::from(input.u32()));
        load.add_decode(u64::from(input.u16()));
    }
    let second = allocator
        .allocate(loads, model)
        .expect("the same shape stays valid");
    assert_valid(model, loads, config, &second);
    let fresh = Allocator::new(*config)
        .expect("valid config")
        .allocate(loads, model)
        .expect("valid input");
    if second.kept_previous {
        let before: Vec<_> = first
            .ranks
            .iter()
            .map(|r| (r.io_depth, r.decode_threads))
            .collect();
        let after: Vec<_> = second
            .ranks
            .iter()
            .map(|r| (r.io_depth, r.decode_threads))
            .collect();
        assert_eq!(before, after, "kept_previous must keep the units");
        assert!(
            fresh.max_time_s() >= second.max_time_s() * (1.0 - config.hysteresis_fraction),
            "kept a previous allocation the new one beats by more than the hysteresis"
        );
    } else {
        assert_eq!(second.ranks, fresh.ranks);
    }
}
