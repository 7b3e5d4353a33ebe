use std::time::Duration;

use crate::fit::{LineFit, MedianWindow};
use crate::{RankLoad, SchedError, Tier};

/// Costs of reading from one tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierCost {
    /// Fixed time of one request, in seconds (`a` in the crate docs).
    pub request_s: f64,
    /// Time per byte of one request, in seconds (`b`): the inverse of one stream's speed.
    pub per_byte_s: f64,
    /// Bandwidth of the whole tier, shared by all ranks, in bytes per second (`β`);
    /// `f64::INFINITY` when unknown. Ignored for [`Tier::Cache`].
    pub bandwidth_bytes_per_s: f64,
}

/// Costs of decoding samples on one thread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeCost {
    /// Fixed time per sample, in seconds (`c`).
    pub sample_s: f64,
    /// Time per encoded byte, in seconds (`e`).
    pub per_byte_s: f64,
}

/// All parameters of the [`CostModel`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostParams {
    /// Per tier, indexed like [`Tier::ALL`].
    pub reads: [TierCost; 3],
    /// Decode costs.
    pub decode: DecodeCost,
}

impl CostParams {
    /// The priors the model starts from before any observation.
    ///
    /// - cache hit: 1 µs per request, 0.05 ns per byte (a memory hand-off, ~20 GB/s);
    /// - storage: 100 µs per request (NVMe or parallel-FS random read), 1 ns per byte
    ///   (1 GB/s per stream), shared bandwidth unknown (∞) until observed;
    /// - remote: 30 µs per request, 0.4 ns per byte (~25 Gb/s link), bandwidth unknown;
    /// - decode: 20 µs per sample, 5 ns per encoded byte (~200 MB/s per core, JPEG-like).
    pub const PRIORS: CostParams = CostParams {
        reads: [
            TierCost {
                request_s: 1e-6,
                per_byte_s: 0.05e-9,
                bandwidth_bytes_per_s: f64::INFINITY,
            },
            TierCost {
                request_s: 100e-6,
                per_byte_s: 1e-9,
                bandwidth_bytes_per_s: f64::INFINITY,
            },
            TierCost {
                request_s: 30e-6,
                per_byte_s: 0.4e-9,
                bandwidth_bytes_per_s: f64::INFINITY,
            },
        ],
        decode: DecodeCost {
            sample_s: 20e-6,
            per_byte_s: 5e-9,
        },
    };

    /// Costs of `tier`.
    pub fn tier(&self, tier: Tier) -> &TierCost {
        &self.reads[tier.index()]
    }

    /// Mutable costs of `tier`.
    pub fn tier_mut(&mut self, tier: Tier) -> &mut TierCost {
        &mut self.reads[tier.index()]
    }

    /// Checks every cost is finite and non-negative and every bandwidth positive (∞ allowed).
    pub fn validate(&self) -> Result<(), SchedError> {
        const NAMES: [[&str; 3]; 3] = [
            [
                "cache.request_s",
                "cache.per_byte_s",
                "cache.bandwidth_bytes_per_s",
            ],
            [
                "storage.request_s",
                "storage.per_byte_s",
                "storage.bandwidth_bytes_per_s",
            ],
            [
                "remote.request_s",
                "remote.per_byte_s",
                "remote.bandwidth_bytes_per_s",
            ],
        ];
        let cost = |parameter: &'static str, value: f64| {
            if value.is_finite() && value >= 0.0 {
                Ok(())
            } else {
                Err(SchedError::InvalidCost { parameter, value })
            }
        };
        for (t, names) in self.reads.iter().zip(NAMES) {
            cost(names[0], t.request_s)?;
            cost(names[1], t.per_byte_s)?;
            if t.bandwidth_bytes_per_s.is_nan() || t.bandwidth_bytes_per_s <= 0.0 {
                return Err(SchedError::InvalidCost {
                    parameter: names[2],
                    value: t.bandwidth_bytes_per_s,
                });
            }
        }
        cost("decode.sample_s", self.decode.sample_s)?;
        cost("decode.per_byte_s", self.decode.per_byte_s)
    }
}

impl Default for CostParams {
    fn default() -> Self {
        CostParams::PRIORS
    }
}

/// Predicted times of one rank's two pipeline stages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageTimes {
    /// I/O stage (cache hits plus reads in flight), in seconds.
    pub io_s: f64,
    /// Decode stage, in seconds.
    pub decode_s: f64,
}

impl StageTimes {
    /// The pipelined rank time: the slower stage.
    pub fn total_s(&self) -> f64 {
        self.io_s.max(self.decode_s)
    }
}

/// One pipeline stage of one rank as a function of the units (io_depth or threads) it gets:
/// `fixed_s + max(work_s / min(units, lanes), floor_s)`; `fixed_s` alone when `lanes == 0`;
/// infinite with zero units and work to do. Nonincreasing in `units`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Stage {
    pub(crate) fixed_s: f64,
    pub(crate) work_s: f64,
    pub(crate) lanes: u64,
    pub(crate) floor_s: f64,
}

impl Stage {
    pub(crate) fn time_s(&self, units: u32) -> f64 {
        if self.lanes == 0 {
            return self.fixed_s;
        }
        if units == 0 {
            return f64::INFINITY;
        }
        let lanes = u64::from(units).min(self.lanes) as f64;
        self.fixed_s + (self.work_s / lanes).max(self.floor_s)
    }

    /// Units at which `fixed_s + work_s / units` first drops to `time_s`: the closed-form
    /// starting point of the searches in the solver.
    pub(crate) fn units_guess(&self, time_s: f64) -> u64 {
        let room = time_s - self.fixed_s;
        if room > 0.0 {
            // `as` saturates and maps NaN to 0; the caller verifies and corrects the guess.
            (self.work_s / room).ceil() as u64
        } else {
            u64::MAX
        }
    }
}

/// Predicts a rank's window time and calibrates itself online.
///
/// See the crate docs for the formulas and the estimator.
#[derive(Clone, Debug)]
pub struct CostModel {
    params: CostParams,
    priors: CostParams,
    reads: [LineFit; 3],
    decode: LineFit,
    bandwidth: [MedianWindow; 3],
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::new()
    }
}

impl CostModel {
    /// A model starting from [`CostParams::PRIORS`].
    pub fn new() -> Self {
        CostModel::build(CostParams::PRIORS)
    }

    /// A model starting from `priors`, after checking them.
    pub fn with_priors(priors: CostParams) -> Result<Self, SchedError> {
        priors.validate()?;
        Ok(CostModel::build(priors))
    }

    fn build(priors: CostParams) -> Self {
        let line = |t: &TierCost| LineFit::new(t.request_s, t.per_byte_s);
        CostModel {
            params: priors,
            priors,
            reads: [
                line(&priors.reads[0]),
                line(&priors.reads[1]),
                line(&priors.reads[2]),
            ],
            decode: LineFit::new(priors.decode.sample_s, priors.decode.per_byte_s),
            bandwidth: [
                MedianWindow::new(),
                MedianWindow::new(),
                MedianWindow::new(),
            ],
        }
    }

    /// The current estimates (the priors until enough observations arrived).
    pub fn params(&self) -> &CostParams {
        &self.params
    }

    /// The priors this model started from.
    pub fn priors(&self) -> &CostParams {
        &self.priors
    }

    /// Observations currently held for `tier`'s latency fit (at most 64).
    pub fn read_observations(&self, tier: Tier) -> usize {
        self.reads[tier.index()].len()
    }

    /// Observations currently held for the decode fit (at most 64).
    pub fn decode_observations(&self) -> usize {
        self.decode.len()
    }

    /// Records one completed read of `bytes` from `tier` that took `latency` from submission
    /// to completion.
    pub fn observe_read(&mut self, tier: Tier, bytes: u64, latency: Duration) {
        let fit = &mut self.reads[tier.index()];
        fit.push(bytes as f64, latency.as_secs_f64());
        if fit.len() >= crate::fit::FIT_MIN_OBSERVATIONS {
            let cost = self.params.tier_mut(tier);
            cost.request_s = fit.intercept();
            cost.per_byte_s = fit.slope();
        }
    }

    /// Records that one thread decoded `samples` samples of `bytes` total in `elapsed`.
    /// Ignored when `samples` is zero.
    pub fn observe_decode(&mut self, samples: u64, bytes: u64, elapsed: Duration) {
        if samples == 0 {
            return;
        }
        let n = samples as f64;
        self.decode
            .push(bytes as f64 / n, elapsed.as_secs_f64() / n);
        if self.decode.len() >= crate::fit::FIT_MIN_OBSERVATIONS {
            self.params.decode.sample_s = self.decode.intercept();
            self.params.decode.per_byte_s = self.decode.slope();
        }
    }

    /// Records that `tier` delivered `bytes` over `elapsed` while it was saturated (reads were
    /// queued behind the device for the whole interval). Unsaturated intervals understate the
    /// bandwidth and must not be passed. The estimate is the median of the last 16.
    pub fn observe_throughput(&mut self, tier: Tier, bytes: u64, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        let window = &mut self.bandwidth[tier.index()];
        window.push(bytes as f64 / secs);
        if let Some(bw) = window.estimate() {
            self.params.tier_mut(tier).bandwidth_bytes_per_s = bw;
        }
    }

    /// The I/O stage of `load` as a function of io_depth.
    pub(crate) fn io_stage(&self, load: &RankLoad) -> Stage {
        let mut stage = Stage {
            fixed_s: 0.0,
            work_s: 0.0,
            lanes: 0,
            floor_s: 0.0,
        };
        for tier in Tier::ALL {
            let v = load.tier(tier);
            let c = self.params.tier(tier);
            let service_s = v.samples as f64 * c.request_s + v.bytes as f64 * c.per_byte_s;
            if tier.uses_io_depth() {
                stage.work_s += service_s;
                stage.lanes = stage.lanes.saturating_add(v.samples);
                stage.floor_s = stage.floor_s.max(v.bytes as f64 / c.bandwidth_bytes_per_s);
            } else {
                stage.fixed_s += service_s;
            }
        }
        stage
    }

    /// The decode stage of `load` as a function of decode threads.
    pub(crate) fn decode_stage(&self, load: &RankLoad) -> Stage {
        let c = &self.params.decode;
        let v = load.decode;
        Stage {
            fixed_s: 0.0,
            work_s: v.samples as f64 * c.sample_s + v.bytes as f64 * c.per_byte_s,
            lanes: v.samples,
            floor_s: 0.0,
        }
    }

    /// Predicted stage times of `load` with `io_depth` reads in flight and `decode_threads`.
    pub fn predict_stages(
        &self,
        load: &RankLoad,
        io_depth: u32,
        decode_threads: u32,
    ) -> StageTimes {
        StageTimes {
            io_s: self.io_stage(load).time_s(io_depth),
            decode_s: self.decode_stage(load).time_s(decode_threads),
        }
    }

    /// Predicted window time of `load`, in seconds: the slower of its two pipelined stages.
    /// Infinite when a stage has work and gets zero units.
    pub fn predict(&self, load: &RankLoad, io_depth: u32, decode_threads: u32) -> f64 {
        self.predict_stages(load, io_depth, decode_threads)
            .total_s()
    }

    /// The node's bandwidth floor over `loads`, in seconds: no allocation finishes the window
    /// before every shared tier has moved its bytes (`Φ` in the crate docs).
    pub fn bandwidth_floor_s(&self, loads: &[RankLoad]) -> f64 {
        Tier::ALL
            .into_iter()
            .filter(|t| t.uses_io_depth())
            .map(|t| {
                let bytes: f64 = loads.iter().map(|l| l.tier(t).bytes as f64).sum();
                bytes / self.params.tier(t).bandwidth_bytes_per_s
            })
            .fold(0.0, f64::max)
    }
}
