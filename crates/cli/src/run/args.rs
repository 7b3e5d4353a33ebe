//! The options of `lobster run`, their checks, and the loader settings they give.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use lobster_io::{
    Assign, Backend, BudgetConfig, CacheConfig, CachePolicy, DiskCache, FailureBudget,
    FaultInjection, FormChoice, IoOrder, JobConfig, LinkPrices, LoaderConfig, OnError,
    PipelineThreads, ReadConfig, Schedule, StorageEmulation,
};
use serde::Serialize;

use super::decode::{Decoder, TransformArg};
use super::strategy::{Budgets, Strategies, Strategy};

/// How a node's ranks run in `lobster run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RanksAs {
    /// Threads of this process.
    Threads,
    /// A process per rank, attached to a host in this process (lobster-node).
    Processes,
}

/// Arguments of `lobster run`.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// An ImageFolder dataset, indexed as torchvision's ImageFolder indexes it (image
    /// extensions only; class directories walked recursively), or WebDataset tar shards
    /// ('shards/train-{000000..000127}.tar', a directory of .tar files, or a list file);
    /// without it the default dataset is generated once into the cache directory
    /// (~/.cache/lobster-io) and reused.
    #[arg(help_heading = "Job", long)]
    pub data: Option<PathBuf>,
    /// Samples of the generated default dataset.
    #[arg(help_heading = "Job", long, default_value_t = 4000)]
    pub samples: u32,
    /// Nodes in the job.
    #[arg(help_heading = "Job", long, default_value_t = 4)]
    pub nodes: usize,
    /// This node's index.
    #[arg(help_heading = "Job", long, default_value_t = 0)]
    pub node: usize,
    /// Ranks (GPUs) per node.
    #[arg(help_heading = "Job", long, default_value_t = 4)]
    pub ranks_per_node: usize,
    /// Samples per batch per rank.
    #[arg(
        help_heading = "Job",
        long,
        visible_alias = "batch",
        default_value_t = 16
    )]
    pub batch_size: usize,
    /// Epochs.
    #[arg(help_heading = "Job", long, default_value_t = 8)]
    pub epochs: u32,
    /// Sampler seed.
    #[arg(help_heading = "Job", long, default_value_t = 0)]
    pub seed: u64,
    /// Node cache capacity in bytes (overrides --cache-frac).
    #[arg(help_heading = "Cache", long)]
    pub cache_bytes: Option<u64>,
    /// Node cache capacity as a fraction of the dataset's bytes.
    #[arg(help_heading = "Cache", long, default_value_t = 0.2)]
    pub cache_frac: f64,
    /// A local disk cache below the node cache, planned with it: its directory. Each
    /// cached strategy gets its own `DIR/<strategy>/`, and a later run with the same DIR
    /// and dataset (any seed) starts with what it left there. One node only (not with
    /// --cluster or --mpi), encoded bytes (not with --cache-forms decoded or auto).
    #[arg(
        help_heading = "Cache",
        long,
        value_name = "DIR",
        requires = "disk_cache_bytes"
    )]
    pub disk_cache: Option<PathBuf>,
    /// The disk cache's capacity in bytes (whole 4 KiB blocks, at least one).
    #[arg(help_heading = "Cache", long, requires = "disk_cache")]
    pub disk_cache_bytes: Option<u64>,
    /// `all`, or a comma-separated list of pytorch, nopfs, lobster, lobster-cache-only,
    /// lobster-alloc-only, run in that order.
    #[arg(help_heading = "Job", long, alias = "policy", default_value = "all")]
    pub strategy: Strategies,
    /// Reads in flight the node's ranks share (Lobster's io_depth budget). The default is
    /// deep enough for a local NVMe device, whose small reads gain from depth to about 128.
    #[arg(help_heading = "Budgets", long, default_value_t = 128)]
    pub io_depth: usize,
    /// Decode threads the node's ranks share, for the pipelined strategies (lobster,
    /// lobster-alloc-only).
    #[arg(help_heading = "Budgets", long, default_value_t = 8)]
    pub decode_threads: usize,
    /// Workers per rank of the read-then-decode strategies (pytorch, nopfs,
    /// lobster-cache-only); each holds one read in flight [default: io_depth / ranks_per_node,
    /// at least 1: the reads in flight of the pipelined strategies, at most the node's 1024
    /// threads shared by its ranks].
    #[arg(help_heading = "Budgets", long)]
    pub workers_per_rank: Option<usize>,
    /// Iterations the loader may run ahead of the slowest rank.
    #[arg(
        help_heading = "Budgets",
        long,
        visible_alias = "prefetch",
        default_value_t = 2
    )]
    pub prefetch_iterations: usize,
    /// How the pipelined strategies split the budgets among ranks: `allocate` (lobster-sched,
    /// every window) or `equal` (a fixed equal split), for ablations.
    #[arg(help_heading = "Budgets", long, value_enum, default_value_t = ScheduleArg::Allocate)]
    pub schedule: ScheduleArg,
    /// Fraction of predicted time an allocation change must save.
    #[arg(help_heading = "Budgets", long, default_value_t = 0.05)]
    pub hysteresis: f64,
    /// The decoder [default: jpeg with --data, so that a user's corrupt file shows;
    /// synthetic on the generated built-in dataset, whose decode cost it models].
    #[arg(help_heading = "Decode", long, value_enum)]
    pub decoder: Option<Decoder>,
    /// What the jpeg decoder does to each image: `train` (RandomResizedCrop and a flip,
    /// seeded by seed, epoch and sample), `eval` (Resize and CenterCrop) or `none`.
    /// Transformed images are collated per batch into one [B, H, W, 3] buffer.
    #[arg(help_heading = "Decode", long, value_enum, default_value_t = TransformArg::None)]
    pub transform: TransformArg,
    /// The side of the transformed images, pixels.
    #[arg(help_heading = "Decode", long, default_value_t = 224)]
    pub image_size: u32,
    /// CPU microseconds per KiB for the synthetic decoder.
    #[arg(help_heading = "Decode", long, default_value_t = 4.0)]
    pub decode_us_per_kb: f64,
    /// Simulated compute per iteration, milliseconds.
    #[arg(help_heading = "Job", long, default_value_t = 25.0)]
    pub compute_ms: f64,
    /// Emulated shared storage bandwidth, MB/s (0: no emulation).
    #[arg(help_heading = "Reads", long, default_value_t = 120.0)]
    pub storage_mbps: f64,
    /// Emulated storage latency per request, microseconds.
    #[arg(help_heading = "Reads", long, default_value_t = 8000)]
    pub storage_latency_us: u64,
    /// Emulated interconnect per node, MB/s, for answers from peers' caches (--mpi and
    /// --cluster; default: a 100 Gb/s fabric's share per node; 0: no emulation).
    #[arg(help_heading = "Reads", long, default_value_t = 12_500.0)]
    pub net_mbps: f64,
    /// Emulated interconnect round trip per fetch, microseconds.
    #[arg(help_heading = "Reads", long, default_value_t = 20)]
    pub net_latency_us: u64,
    /// I/O backend of the pipelined strategies.
    #[arg(help_heading = "Reads", long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// How the kernel schedules lobster's planner and decode workers (the lobster strategies;
    /// pytorch's and nopfs's workers run as normal threads, as theirs do): `batch`
    /// (SCHED_BATCH: their wake-ups do not preempt the ranks) or `normal`.
    #[arg(help_heading = "Budgets", long, value_enum, default_value_t = PipelineThreads::Batch)]
    pub pipeline_threads: PipelineThreads,
    /// What lobster's reuse cache keeps of a sample: `encoded` bytes, `decoded` images, or
    /// `auto` (either, per sample and use, by the cost model). Default: auto with the jpeg
    /// decoder, encoded otherwise; strategies without the reuse cache keep encoded bytes.
    #[arg(help_heading = "Cache", long, value_enum)]
    pub cache_forms: Option<FormChoice>,
    /// Lossy, off by default: decoded images the cache keeps are first brought down to at
    /// most this many pixels a side, so that hits on them transform a smaller image.
    #[arg(help_heading = "Cache", long)]
    pub decoded_max_side: Option<u32>,
    /// Pixels a JPEG or PNG sample may have: one whose header claims more fails as a bad
    /// sample (see --on-error) before it is decoded. A pixel costs 3 bytes of RGB and up to
    /// about 16 more while decoding. Default 2^26 (8192 x 8192); at most 2^32.
    #[arg(help_heading = "Decode", long, default_value_t = lobster_io::images::PIXELS_MAX_DEFAULT)]
    pub image_pixels_max: u64,
    /// How the pipelined strategies order storage reads: `deadline` (one node-wide queue, each
    /// iteration's reads ending together for every rank) or `shares` (each rank held to the
    /// allocator's io_depth share, as the paper's per-rank I/O threads).
    #[arg(help_heading = "Reads", long, value_enum, default_value_t = IoOrder::Deadline)]
    pub io_order: IoOrder,
    /// Read with O_DIRECT, every strategy (the read-then-decode workers too, so that all of
    /// them read from the device, not from pages an earlier epoch left in the page cache).
    #[arg(help_heading = "Reads", long)]
    pub direct: bool,
    /// Write the configuration and results as JSON to this file.
    #[arg(help_heading = "Output", long)]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(help_heading = "Output", long)]
    pub quiet: bool,
    /// How the node's ranks run: as threads of this process, or as processes (this program
    /// run again once per local rank, each attached to one host in this process, as under
    /// torchrun: one cache and one set of budgets per node).
    #[arg(help_heading = "Job", long, value_enum, default_value_t = RanksAs::Threads)]
    pub ranks_as: RanksAs,
    /// Run as one node of an MPI job (`mpirun -np NODES lobster run --mpi`): each node a
    /// process with its own emulated storage link, its ranks as threads, nodes in lock-step,
    /// and misses a peer's cache is planned to hold fetched from it; node 0 prints the
    /// job's table. Needs a build with `--features mpi`.
    #[arg(help_heading = "Job", long)]
    pub mpi: bool,
    /// With --mpi: no remote hits (nodes still train in lock-step), for comparison.
    #[arg(help_heading = "Job", long, requires = "mpi")]
    pub no_remote: bool,
    /// Run every one of the --nodes nodes in this process, as an MPI job would run them (each
    /// node its own loader and emulated storage link, nodes in lock-step, peers' caches
    /// reached through the in-process transport), and print the job's table. The nodes'
    /// caches are planned as one where that gains; the strategy `lobster-node-plan` plans
    /// each node's own, for comparison. Best with `--decoder raw` on few cores.
    #[arg(help_heading = "Job", long, conflicts_with = "mpi")]
    pub cluster: bool,
    /// Which rank of a step (global batch) gets which of its samples: `sampler` (PyTorch's
    /// DistributedSampler split) or `locality` (with --cluster or --mpi, under the cluster
    /// plan: a sample goes to a rank of a node whose cache holds it; every step's samples and
    /// every rank's batch size unchanged). The JSON's `assign` says which ran, and why not
    /// locality where the cluster plan was not used.
    #[arg(help_heading = "Job", long, value_enum, default_value_t = Assign::Sampler)]
    pub assign: Assign,
    /// Under the cluster plan, price a remote hit against a storage read with the emulated
    /// bandwidths (--storage-mbps, --net-mbps, both above 0), so that a slow interconnect
    /// sends some remote hits to storage: `on`, or `off` (a peer serves all it holds).
    #[arg(help_heading = "Job", long, value_enum, default_value_t = LinkPricesArg::On)]
    pub link_prices: LinkPricesArg,
    /// Every rank takes this many batches of this run, then the run stops cleanly (counted
    /// from where it starts: a resumed run stops K batches after its state).
    #[arg(help_heading = "Resume", long)]
    pub stop_after_iterations: Option<u64>,
    /// With --stop-after-iterations: write the loader's state (where every rank is) to this
    /// file as JSON when the run stops, for --resume. Several strategies stop at the same
    /// batch, so they share the one state; it is written once.
    #[arg(help_heading = "Resume", long, requires = "stop_after_iterations")]
    pub save_state: Option<PathBuf>,
    /// Continue from the state in this file (written by --save-state): every rank is given
    /// the batches the uninterrupted run would have given from there; the cache starts cold.
    /// Every strategy of the run resumes from it. A missing or unreadable file, or a state of
    /// another job (dataset, seed, batch size), is an error.
    #[arg(help_heading = "Resume", long)]
    pub resume: Option<PathBuf>,
    /// Internal: run as this local rank of a `--ranks-as processes` run.
    #[arg(long, hide = true, requires = "node_job")]
    pub rank_process: Option<usize>,
    /// Internal: the job id of the host a rank process attaches to.
    #[arg(long, hide = true)]
    pub node_job: Option<String>,
    /// What a rank does with a sample that cannot be read or decoded: fail its batch, or skip
    /// the sample (the batch arrives short) within --max-failures per epoch.
    #[arg(help_heading = "Decode", long, value_enum, default_value_t = OnErrorArg::Fail)]
    pub on_error: OnErrorArg,
    /// With --on-error skip: samples an epoch may skip on this node, a count N or a
    /// percentage P% of the epoch's accesses, rounded up so that any P above 0 allows at least
    /// one [default: 1%].
    #[arg(help_heading = "Decode", long)]
    pub max_failures: Option<FailureBudget>,
    /// Inject deterministic faults into storage reads:
    /// seed=S,eio=P,short=P,delay=P,corrupt=P[,delay_us=U] with P a probability per read.
    /// Corruption is caught only by a decoder that checks its input (--decoder jpeg).
    #[arg(help_heading = "Reads", long)]
    pub inject_faults: Option<FaultInjection>,
}

/// What a rank does with a sample that fails. Not [`OnError`]'s mirror: its `Skip` carries
/// the budget, which `--max-failures` gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnErrorArg {
    /// The batch is an error naming the sample, its file and the cause; the run stops.
    Fail,
    /// The sample is left out of its batch and reported.
    Skip,
}

/// The pipelined strategies' schedule, as the CLI spells it. Not [`Schedule`]'s mirror: its
/// `Allocate` carries the hysteresis, which `--hysteresis` gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleArg {
    /// lobster-sched's min-max allocation, every window.
    Allocate,
    /// A fixed equal split.
    Equal,
}

/// Whether the cluster plan prices remote hits, as the CLI spells it. Not a library enum's
/// mirror: `on` gives [`CacheConfig::link_prices`] the emulated bandwidths, where both are
/// emulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkPricesArg {
    /// With the emulated storage and interconnect bandwidths, where both are emulated.
    On,
    /// Not priced: a peer serves every sample it holds.
    Off,
}

/// The skip budget when --max-failures is not given.
pub(crate) const DEFAULT_MAX_FAILURES: FailureBudget = FailureBudget::Fraction(0.01);

impl RunArgs {
    /// The node cache's capacity: `--cache-bytes`, else `--cache-frac` of the dataset.
    pub(crate) fn cache_capacity_bytes(&self, dataset: &lobster_io::Dataset) -> u64 {
        self.cache_bytes
            .unwrap_or((dataset.total_bytes() as f64 * self.cache_frac) as u64)
    }

    /// The decoder asked for, or the default for the dataset: real decoding for a user's
    /// `--data`, the synthetic cost for the built-in one.
    pub(crate) fn decoder(&self) -> Decoder {
        self.decoder.unwrap_or(match self.data {
            Some(_) => Decoder::Jpeg,
            None => Decoder::Synthetic,
        })
    }

    /// Checks the options the loader does not check itself (it names its own parameters).
    pub(crate) fn validate(&self) -> Result<()> {
        if !(self.cache_frac.is_finite() && (0.0..=1.0).contains(&self.cache_frac)) {
            bail!("--cache-frac = {}: allowed 0 to 1", self.cache_frac);
        }
        if !(self.compute_ms.is_finite() && self.compute_ms >= 0.0) {
            bail!("--compute-ms = {}: allowed a number >= 0", self.compute_ms);
        }
        if self.transform != TransformArg::None {
            if !(1..=8192).contains(&self.image_size) {
                bail!("--image-size {}: allowed 1..=8192", self.image_size);
            }
            if self.decoder() != Decoder::Jpeg {
                bail!("--transform needs real decoding (--decoder jpeg)");
            }
        }
        if !(self.decode_us_per_kb.is_finite() && self.decode_us_per_kb >= 0.0) {
            bail!(
                "--decode-us-per-kb = {}: allowed a number >= 0",
                self.decode_us_per_kb
            );
        }
        if self.net_mbps != 0.0 {
            lobster_io::net::LinkParams::new(self.net_mbps, self.net_latency_us)
                .context("--net-mbps / --net-latency-us (0 MB/s: no emulation)")?;
        }
        if !(self.storage_mbps.is_finite() && self.storage_mbps >= 0.0) {
            bail!(
                "--storage-mbps = {}: allowed 0 (no emulation) or more",
                self.storage_mbps
            );
        }
        if self.mpi && self.ranks_as == RanksAs::Processes {
            bail!("--mpi runs a node's ranks as threads: drop --ranks-as processes");
        }
        if self.cluster && self.ranks_as == RanksAs::Processes {
            bail!("--cluster runs every node's ranks as threads: drop --ranks-as processes");
        }
        if self.cluster && self.nodes < 2 {
            bail!("--cluster needs --nodes 2 or more, got {}", self.nodes);
        }
        if self.disk_cache.is_some() && (self.cluster || self.mpi) {
            bail!(
                "--disk-cache with {}: the plan over several nodes' disks is not built; \
                 drop one of the two",
                if self.cluster { "--cluster" } else { "--mpi" }
            );
        }
        if self.assign == Assign::Locality && !(self.cluster || self.mpi) {
            bail!("--assign locality needs peers' caches: add --cluster or --mpi");
        }
        if self.stop_after_iterations == Some(0) {
            bail!("--stop-after-iterations 0: allowed 1 or more");
        }
        self.validate_resume()?;
        self.workers_per_rank()?;
        self.on_error_rule()?;
        Ok(())
    }

    /// The modes a state cannot be saved in or resumed from, named.
    fn validate_resume(&self) -> Result<()> {
        let option = match (&self.save_state, self.stop_after_iterations, &self.resume) {
            (Some(_), _, _) => "--save-state",
            (None, Some(_), _) => "--stop-after-iterations",
            (None, None, Some(_)) => "--resume",
            (None, None, None) => return Ok(()),
        };
        // In one process the nodes run to the end together; a state is saved by an MPI job
        // (node 0 writes it), and any job of nodes resumes from one.
        if self.cluster && option != "--resume" {
            bail!(
                "{option} is not supported with --cluster: its nodes run to the end together; \
                 stop an MPI job (--mpi) or a single node instead"
            );
        }
        // The node host takes a rank process that leaves before the run's end for a failed
        // one (lobster-node has no early detach), so a run cannot stop there; a resumed
        // loader is hosted as any other.
        if self.ranks_as == RanksAs::Processes && option != "--resume" {
            bail!(
                "{option} is not supported with --ranks-as processes: rank processes cannot \
                 stop before the run's end; use --ranks-as threads"
            );
        }
        Ok(())
    }

    pub(crate) fn on_error_rule(&self) -> Result<OnError> {
        match (self.on_error, self.max_failures) {
            (OnErrorArg::Fail, Some(_)) => bail!("--max-failures needs --on-error skip"),
            (OnErrorArg::Fail, None) => Ok(OnError::Fail),
            (OnErrorArg::Skip, budget) => Ok(OnError::Skip {
                max_failures: budget.unwrap_or(DEFAULT_MAX_FAILURES),
            }),
        }
    }

    /// The read-then-decode strategies' workers per rank: given, or as many reads in flight as
    /// the pipelined strategies' io_depth budget.
    pub(crate) fn workers_per_rank(&self) -> Result<usize> {
        match self.workers_per_rank {
            Some(0) => bail!("--workers-per-rank = 0: allowed 1 or more"),
            Some(n) => Ok(n),
            // Reads in flight may go past the threads a node may have; workers may not.
            None => {
                let ranks = self.ranks_per_node.max(1);
                Ok((self.io_depth / ranks).clamp(1, (lobster_io::THREADS_MAX / ranks).max(1)))
            }
        }
    }

    /// What the strategies share: budgets, schedule and cache capacity.
    pub(crate) fn budgets(&self, cache_bytes: u64) -> Result<Budgets> {
        Ok(Budgets {
            pipelined_schedule: match self.schedule {
                ScheduleArg::Allocate => Schedule::Allocate {
                    hysteresis: self.hysteresis,
                },
                ScheduleArg::Equal => Schedule::EqualSplit,
            },
            decode_threads: self.decode_threads,
            workers_per_rank: self.workers_per_rank()?,
            cache_bytes,
            pipeline_threads: self.pipeline_threads,
        })
    }

    /// The bandwidths the cluster plan prices remote hits with: the emulated ones, where
    /// both storage and interconnect are emulated and prices are on.
    pub(crate) fn link_prices(&self) -> Option<LinkPrices> {
        let emulated = self.storage_mbps > 0.0 && self.net_mbps > 0.0;
        (self.link_prices == LinkPricesArg::On && emulated).then_some(LinkPrices {
            storage_bytes_per_s: (self.storage_mbps * 1e6) as u64,
            net_bytes_per_s: (self.net_mbps * 1e6) as u64,
        })
    }

    /// The loader settings every strategy shares: layout, io_depth, storage, errors. A
    /// strategy sets its cache, execution, schedule and threads on top.
    /// The loader configuration of `strategy`, as the options set it, for node `self.node`.
    pub(crate) fn strategy_config(
        &self,
        cache_bytes: u64,
        strategy: Strategy,
    ) -> Result<LoaderConfig> {
        let mut config = self.loader_config()?;
        strategy.apply(&self.budgets(cache_bytes)?, &mut config);
        // Strategies do not share a disk: each would start with another's entries.
        config.cache.disk = match (&self.disk_cache, self.disk_cache_bytes) {
            (Some(dir), Some(capacity_bytes)) if config.cache.policy != CachePolicy::None => {
                Some(DiskCache {
                    dir: dir.join(strategy.name()),
                    capacity_bytes,
                })
            }
            _ => None,
        };
        Ok(config)
    }

    pub(crate) fn loader_config(&self) -> Result<LoaderConfig> {
        Ok(LoaderConfig {
            job: JobConfig {
                nodes: self.nodes,
                node: self.node,
                ranks_per_node: self.ranks_per_node,
                batch_size: self.batch_size,
                epochs: self.epochs,
                drop_last: false,
                assign: self.assign,
            },
            cache: CacheConfig {
                forms: self.cache_forms,
                decoded_max_side: self.decoded_max_side,
                link_prices: self.link_prices(),
                ..CacheConfig::default()
            },
            budgets: BudgetConfig {
                io_depth: self.io_depth,
                prefetch_iterations: self.prefetch_iterations,
                window_iterations: 1,
                ..BudgetConfig::default()
            },
            reads: ReadConfig {
                io_order: self.io_order,
                backend: self.backend,
                direct: self.direct,
                storage_emulation: (self.storage_mbps > 0.0).then_some(StorageEmulation {
                    bandwidth_bytes_per_s: self.storage_mbps * 1e6,
                    latency_us: self.storage_latency_us,
                }),
                inject_faults: self.inject_faults,
                ..ReadConfig::default()
            },
            on_error: self.on_error_rule()?,
            limits: lobster_io::SampleLimits {
                image_pixels_max: self.image_pixels_max,
                ..Default::default()
            },
            ..LoaderConfig::default()
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    pub(crate) fn parse(args: &[&str]) -> std::result::Result<RunArgs, String> {
        Cli::try_parse_from(std::iter::once("lobster").chain(args.iter().copied()))
            .map(|c| c.run)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_pixel_bound_flag_reaches_the_loader_config() {
        let default = parse(&[]).unwrap().loader_config().unwrap();
        assert_eq!(
            default.limits.image_pixels_max,
            lobster_io::images::PIXELS_MAX_DEFAULT
        );
        let set = parse(&["--image-pixels-max", "1000"]).unwrap();
        assert_eq!(set.loader_config().unwrap().limits.image_pixels_max, 1000);
    }

    #[test]
    fn fault_flags_parse_and_bad_ones_are_named() {
        let args = parse(&[
            "--on-error",
            "skip",
            "--max-failures",
            "2.5%",
            "--inject-faults",
            "seed=3,eio=0.01,short=0.1,delay=0.2,corrupt=0.02",
        ])
        .unwrap();
        assert_eq!(
            args.on_error_rule().unwrap(),
            OnError::Skip {
                max_failures: FailureBudget::Fraction(0.025)
            }
        );
        let f = args.inject_faults.unwrap();
        assert_eq!(
            (f.seed, f.eio, f.short, f.delay, f.corrupt),
            (3, 0.01, 0.1, 0.2, 0.02)
        );
        assert_eq!(
            parse(&["--on-error", "skip"])
                .unwrap()
                .on_error_rule()
                .unwrap(),
            OnError::Skip {
                max_failures: DEFAULT_MAX_FAILURES
            }
        );
        for (args, named) in [
            (&["--inject-faults", "seed=3,eio=1.5"][..], "eio"),
            (&["--inject-faults", "seed=3,typo=0.1"][..], "typo"),
            (&["--inject-faults", "seed=-1"][..], "seed"),
            (&["--inject-faults", "short"][..], "short"),
            (&["--on-error", "skip", "--max-failures", "ten"][..], "ten"),
            (&["--on-error", "maybe"][..], "maybe"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(named), "{args:?}: {e}");
        }
        let e = parse(&["--max-failures", "3"])
            .unwrap()
            .on_error_rule()
            .unwrap_err();
        assert!(e.to_string().contains("--on-error skip"), "{e}");
    }

    #[test]
    fn the_library_choice_enums_take_their_one_spelling_on_the_command_line() {
        let args = parse(&[
            "--backend",
            "pread",
            "--cache-forms",
            "decoded",
            "--io-order",
            "shares",
            "--pipeline-threads",
            "normal",
            "--assign",
            "locality",
            "--cluster",
        ])
        .unwrap();
        let config = args.loader_config().unwrap();
        assert_eq!(config.reads.backend, Backend::Pread);
        assert_eq!(config.cache.forms, Some(FormChoice::Decoded));
        assert_eq!(config.reads.io_order, IoOrder::Shares);
        assert_eq!(config.job.assign, Assign::Locality);
        let budgets = args.budgets(1).unwrap();
        assert_eq!(budgets.pipeline_threads, PipelineThreads::Normal);
        let e = parse(&["--io-order", "fifo"]).unwrap_err();
        assert!(e.contains("fifo") && e.contains("deadline, shares"), "{e}");
    }

    #[test]
    fn the_decoder_defaults_to_jpeg_for_a_users_data_and_synthetic_for_the_built_in_set() {
        let decoder = |args: &[&str]| parse(args).unwrap().decoder();
        assert_eq!(decoder(&[]), Decoder::Synthetic);
        assert_eq!(decoder(&["--data", "/d"]), Decoder::Jpeg);
        assert_eq!(decoder(&["--data", "/d", "--decoder", "raw"]), Decoder::Raw);
        assert_eq!(decoder(&["--decoder", "jpeg"]), Decoder::Jpeg);
    }

    #[test]
    fn workers_per_rank_defaults_to_the_io_depth_share_and_zero_is_refused() {
        let default = |extra: &[&str]| parse(extra).unwrap().workers_per_rank().unwrap();
        // 128 reads in flight over 4 ranks.
        assert_eq!(default(&[]), 32);
        assert_eq!(default(&["--io-depth", "12", "--ranks-per-node", "3"]), 4);
        assert_eq!(default(&["--io-depth", "2", "--ranks-per-node", "8"]), 1);
        assert_eq!(default(&["--workers-per-rank", "3"]), 3);
        let args = parse(&["--workers-per-rank", "3", "--ranks-per-node", "2"]).unwrap();
        assert_eq!(args.budgets(1).unwrap().workers_per_rank, 3);
        let e = parse(&["--workers-per-rank", "0"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("--workers-per-rank"), "{e}");
        let e = parse(&["--workers-per-rank", "two"]).unwrap_err();
        assert!(e.contains("--workers-per-rank"), "{e}");
    }
}
