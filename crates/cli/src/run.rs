//! `lobster run`: simulated synchronous training on this node, Lobster against its baselines
//! on the same data in the same process.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use lobster_io::uring::Backend;
use lobster_io::{
    AllocationRecord, CachePolicy, Dataset, ErrorPolicy, Execution, FailureBudget, FaultInjection,
    IoOrder, IterationMetrics, LoaderBuilder, LoaderConfig, RunMetrics, SampleMeta, Schedule,
    SkippedSample, StorageEmulation,
};
use serde::Serialize;

/// The loading strategies compared, all run by the same loader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// PyTorch's DataLoader: fixed equal workers per rank that read then decode; no cache.
    Pytorch,
    /// NoPFS: static placement cache; fixed equal workers that read then decode.
    Nopfs,
    /// Lobster: reuse-distance cache; io_uring io_depth and decode threads allocated per rank.
    Lobster,
    /// Ablation: Lobster's cache with fixed equal read-then-decode workers.
    LobsterCacheOnly,
    /// Ablation: NoPFS's cache with Lobster's per-rank allocation.
    LobsterAllocOnly,
}

impl Policy {
    const ALL: [Policy; 5] = [
        Policy::Pytorch,
        Policy::Nopfs,
        Policy::LobsterCacheOnly,
        Policy::LobsterAllocOnly,
        Policy::Lobster,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Policy::Pytorch => "pytorch",
            Policy::Nopfs => "nopfs",
            Policy::Lobster => "lobster",
            Policy::LobsterCacheOnly => "lobster-cache-only",
            Policy::LobsterAllocOnly => "lobster-alloc-only",
        }
    }

    /// (cache, execution, schedule); `allocate` is the pipelined policies' schedule.
    pub(crate) fn parts(self, allocate: Schedule) -> (CachePolicy, Execution, Schedule) {
        match self {
            Policy::Pytorch => (
                CachePolicy::None,
                Execution::ReadThenDecode,
                Schedule::EqualSplit,
            ),
            Policy::Nopfs => (
                CachePolicy::Static,
                Execution::ReadThenDecode,
                Schedule::EqualSplit,
            ),
            Policy::Lobster => (CachePolicy::Reuse, Execution::Pipelined, allocate),
            Policy::LobsterCacheOnly => (
                CachePolicy::Reuse,
                Execution::ReadThenDecode,
                Schedule::EqualSplit,
            ),
            Policy::LobsterAllocOnly => (CachePolicy::Static, Execution::Pipelined, allocate),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `all` or a comma-separated list of policies.
#[derive(Clone, Debug)]
pub struct Policies(pub(crate) Vec<Policy>);

impl FromStr for Policies {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(Policies(Policy::ALL.to_vec()));
        }
        let mut out = Vec::new();
        for name in s.split(',') {
            let p = Policy::ALL
                .into_iter()
                .find(|p| p.name() == name.trim())
                .ok_or_else(|| {
                    format!(
                        "unknown policy {name:?}: expected all, or a list of pytorch, nopfs, \
                         lobster, lobster-cache-only, lobster-alloc-only"
                    )
                })?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        Ok(Policies(out))
    }
}

/// How samples are decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decoder {
    /// Real JPEG decoding (zune-jpeg).
    Jpeg,
    /// No decoding: the bytes are the sample.
    Raw,
    /// A CPU cost per KiB (`--decode-us-per-kb`), checksumming the bytes.
    Synthetic,
}

/// Arguments of `lobster run`.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// An ImageFolder dataset; without it the default dataset is generated once into the
    /// cache directory (~/.cache/lobster-io) and reused.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Samples of the generated default dataset.
    #[arg(long, default_value_t = 4000)]
    pub samples: u32,
    /// Nodes in the job.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// This node's index.
    #[arg(long, default_value_t = 0)]
    pub node: usize,
    /// Ranks (GPUs) per node.
    #[arg(long, default_value_t = 4)]
    pub ranks_per_node: usize,
    /// Samples per batch per rank.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Epochs.
    #[arg(long, default_value_t = 8)]
    pub epochs: u32,
    /// Sampler seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Node cache capacity in bytes (overrides --cache-frac).
    #[arg(long)]
    pub cache_bytes: Option<u64>,
    /// Node cache capacity as a fraction of the dataset's bytes.
    #[arg(long, default_value_t = 0.2)]
    pub cache_frac: f64,
    /// `all`, or a comma-separated list of pytorch, nopfs, lobster, lobster-cache-only,
    /// lobster-alloc-only.
    #[arg(long, default_value = "all")]
    pub policy: Policies,
    /// Reads in flight the node's ranks share (Lobster's io_depth budget).
    #[arg(long, default_value_t = 32)]
    pub io_depth: usize,
    /// Decode threads the node's ranks share; the read-then-decode baselines get this many
    /// workers, split equally.
    #[arg(long, default_value_t = 8)]
    pub decode_threads: usize,
    /// Iterations the loader may run ahead of the slowest rank.
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// How the pipelined policies split the budgets among ranks: `allocate` (lobster-sched,
    /// every window) or `equal` (a fixed equal split), for ablations.
    #[arg(long, value_enum, default_value_t = ScheduleArg::Allocate)]
    pub schedule: ScheduleArg,
    /// Fraction of predicted time an allocation change must save.
    #[arg(long, default_value_t = 0.05)]
    pub hysteresis: f64,
    /// The decoder.
    #[arg(long, value_enum, default_value_t = Decoder::Synthetic)]
    pub decoder: Decoder,
    /// CPU microseconds per KiB for the synthetic decoder.
    #[arg(long, default_value_t = 4.0)]
    pub decode_us_per_kb: f64,
    /// Simulated compute per iteration, milliseconds.
    #[arg(long, default_value_t = 25.0)]
    pub compute_ms: f64,
    /// Emulated shared storage bandwidth, MB/s (0: no emulation).
    #[arg(long, default_value_t = 120.0)]
    pub storage_mbps: f64,
    /// Emulated storage latency per request, microseconds.
    #[arg(long, default_value_t = 8000)]
    pub storage_latency_us: u64,
    /// I/O backend of the pipelined policies.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// How the pipelined policies order storage reads: `deadline` (one node-wide queue, each
    /// iteration's reads ending together for every rank) or `shares` (each rank held to the
    /// allocator's io_depth share, as the paper's per-rank I/O threads).
    #[arg(long, value_enum, default_value_t = IoOrderArg::Deadline)]
    pub io_order: IoOrderArg,
    /// Read with O_DIRECT.
    #[arg(long)]
    pub direct: bool,
    /// Write the configuration and results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// What a rank does with a sample that cannot be read or decoded: fail its batch, or skip
    /// the sample (the batch arrives short) within --max-failures per epoch.
    #[arg(long, value_enum, default_value_t = OnError::Fail)]
    pub on_error: OnError,
    /// With --on-error skip: samples an epoch may skip on this node, a count N or a
    /// percentage P% of the epoch's accesses [default: 1%].
    #[arg(long)]
    pub max_failures: Option<FailureBudget>,
    /// Inject deterministic faults into storage reads:
    /// seed=S,eio=P,short=P,delay=P,corrupt=P[,delay_us=U] with P a probability per read.
    /// Corruption is caught only by a decoder that checks its input (--decoder jpeg).
    #[arg(long)]
    pub inject_faults: Option<FaultInjection>,
}

/// What a rank does with a sample that fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// The batch is an error naming the sample, its file and the cause; the run stops.
    Fail,
    /// The sample is left out of its batch and reported.
    Skip,
}

/// The skip budget when --max-failures is not given.
const DEFAULT_MAX_FAILURES: FailureBudget = FailureBudget::Fraction(0.01);

impl RunArgs {
    fn error_policy(&self) -> Result<ErrorPolicy> {
        match (self.on_error, self.max_failures) {
            (OnError::Fail, Some(_)) => bail!("--max-failures needs --on-error skip"),
            (OnError::Fail, None) => Ok(ErrorPolicy::Fail),
            (OnError::Skip, budget) => Ok(ErrorPolicy::Skip {
                max_failures: budget.unwrap_or(DEFAULT_MAX_FAILURES),
            }),
        }
    }
}

/// The I/O backend, as the CLI spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendArg {
    /// io_uring, falling back to pread if a ring cannot be set up.
    Auto,
    /// io_uring.
    Uring,
    /// The pread thread pool.
    Pread,
}

/// The pipelined policies' schedule, as the CLI spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleArg {
    /// lobster-sched's min-max allocation, every window.
    Allocate,
    /// A fixed equal split.
    Equal,
}

/// The pipelined read order, as the CLI spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoOrderArg {
    /// One node-wide queue in deadline order.
    Deadline,
    /// Per-rank io_depth shares.
    Shares,
}

/// Mean size of the generated default dataset's files, KiB.
const DEFAULT_MEAN_KB: f64 = 110.0;
const DEFAULT_CLASSES: u32 = 10;
const DEFAULT_GEN_SEED: u64 = 0;

#[derive(Debug, Serialize)]
struct RunConfig {
    data: PathBuf,
    samples: usize,
    dataset_bytes: u64,
    nodes: usize,
    node: usize,
    ranks_per_node: usize,
    batch: usize,
    epochs: u32,
    seed: u64,
    cache_bytes: u64,
    io_depth: usize,
    decode_threads: usize,
    prefetch: usize,
    schedule: ScheduleArg,
    hysteresis: f64,
    decoder: Decoder,
    decode_us_per_kb: f64,
    compute_ms: f64,
    storage_mbps: f64,
    storage_latency_us: u64,
    backend: BackendArg,
    io_order: IoOrderArg,
    direct: bool,
    on_error: OnError,
    max_failures: Option<String>,
    inject_faults: Option<String>,
}

#[derive(Debug, Serialize)]
struct PolicyResult {
    policy: Policy,
    epoch_seconds: Vec<f64>,
    samples_per_second: f64,
    stall_fraction: f64,
    job_stall_fraction: f64,
    imbalance_p50: f64,
    imbalance_p95: f64,
    hit_ratio: f64,
    speedup_vs_pytorch: Option<f64>,
    peak_rss_bytes: u64,
    cache_capacity_bytes: u64,
    prefetch_window_bytes: u64,
    backend: String,
    /// Median predicted imbalance of the equal split and of lobster-sched's allocation over
    /// the run's windows (allocating policies only): the model's view of per-rank shares,
    /// which the reads follow under `--io-order shares` only.
    predicted_imbalance_equal_split_p50: Option<f64>,
    predicted_imbalance_allocated_p50: Option<f64>,
    /// Accesses skipped by --on-error skip, and the first of them with their causes.
    skipped: u64,
    skipped_samples: Vec<SkippedSample>,
    /// Storage read attempts changed by --inject-faults, attempts retried, and reads that
    /// succeeded on a retry.
    faults_injected: u64,
    read_retries: u64,
    reads_recovered: u64,
    /// Every rank's figures per iteration, and lobster-sched's decisions (bounded: the most
    /// recent ones).
    iterations: Vec<IterationMetrics>,
    allocations: Vec<AllocationRecord>,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    config: &'a RunConfig,
    results: &'a [PolicyResult],
}

pub fn run(args: &RunArgs) -> Result<()> {
    let data = match &args.data {
        Some(d) => d.clone(),
        None => default_dataset(args.samples, args.quiet)?,
    };
    let dataset = Arc::new(
        Dataset::open_image_folder(&data)
            .with_context(|| format!("opening the dataset {}", data.display()))?,
    );
    if !(args.cache_frac.is_finite() && (0.0..=1.0).contains(&args.cache_frac)) {
        bail!("--cache-frac = {}: allowed 0 to 1", args.cache_frac);
    }
    if !(args.compute_ms.is_finite() && args.compute_ms >= 0.0) {
        bail!("--compute-ms = {}: allowed a number >= 0", args.compute_ms);
    }
    if !(args.decode_us_per_kb.is_finite() && args.decode_us_per_kb >= 0.0) {
        bail!(
            "--decode-us-per-kb = {}: allowed a number >= 0",
            args.decode_us_per_kb
        );
    }
    if !(args.storage_mbps.is_finite() && args.storage_mbps >= 0.0) {
        bail!(
            "--storage-mbps = {}: allowed 0 (no emulation) or more",
            args.storage_mbps
        );
    }
    let cache_bytes = args
        .cache_bytes
        .unwrap_or((dataset.total_bytes() as f64 * args.cache_frac) as u64);
    let config = RunConfig {
        data: data.clone(),
        samples: dataset.len(),
        dataset_bytes: dataset.total_bytes(),
        nodes: args.nodes,
        node: args.node,
        ranks_per_node: args.ranks_per_node,
        batch: args.batch,
        epochs: args.epochs,
        seed: args.seed,
        cache_bytes,
        io_depth: args.io_depth,
        decode_threads: args.decode_threads,
        prefetch: args.prefetch,
        schedule: args.schedule,
        hysteresis: args.hysteresis,
        decoder: args.decoder,
        decode_us_per_kb: args.decode_us_per_kb,
        compute_ms: args.compute_ms,
        storage_mbps: args.storage_mbps,
        storage_latency_us: args.storage_latency_us,
        backend: args.backend,
        io_order: args.io_order,
        direct: args.direct,
        on_error: args.on_error,
        max_failures: match args.error_policy()? {
            ErrorPolicy::Skip { max_failures } => Some(max_failures.to_string()),
            _ => None,
        },
        inject_faults: args.inject_faults.map(|f| {
            format!(
                "seed={},eio={},short={},delay={},corrupt={},delay_us={}",
                f.seed, f.eio, f.short, f.delay, f.corrupt, f.delay_us
            )
        }),
    };
    println!(
        "dataset {} ({} samples, {:.1} MiB); node {} of {} with {} ranks; batch {}; {} epochs; \
         cache {:.1} MiB",
        data.display(),
        dataset.len(),
        mib(dataset.total_bytes()),
        args.node,
        args.nodes,
        args.ranks_per_node,
        args.batch,
        args.epochs,
        mib(cache_bytes)
    );
    if let Some(f) = &config.inject_faults {
        println!("injecting faults into storage reads: {f}");
    }
    if args.storage_mbps > 0.0 {
        println!(
            "emulated shared storage: {} MB/s, {} us per request; compute {} ms per iteration",
            args.storage_mbps, args.storage_latency_us, args.compute_ms
        );
    }
    let mut results: Vec<PolicyResult> = Vec::new();
    for &policy in &args.policy.0 {
        let (metrics, backend, peak_rss_bytes, prefetch_window_bytes) =
            run_policy(args, &dataset, cache_bytes, policy)?;
        results.push(PolicyResult {
            policy,
            epoch_seconds: metrics.epoch_seconds,
            samples_per_second: metrics.samples_per_second,
            stall_fraction: metrics.stall_fraction,
            job_stall_fraction: metrics.job_stall_fraction,
            imbalance_p50: metrics.imbalance_p50,
            imbalance_p95: metrics.imbalance_p95,
            hit_ratio: metrics.hit_ratio,
            speedup_vs_pytorch: None,
            peak_rss_bytes,
            cache_capacity_bytes: if policy.parts(Schedule::EqualSplit).0 == CachePolicy::None {
                0
            } else {
                cache_bytes
            },
            prefetch_window_bytes,
            backend,
            predicted_imbalance_equal_split_p50: median(
                metrics
                    .allocations
                    .iter()
                    .map(|a| a.predicted_imbalance_equal),
            ),
            predicted_imbalance_allocated_p50: median(
                metrics.allocations.iter().map(|a| a.predicted_imbalance),
            ),
            skipped: metrics.skipped,
            skipped_samples: metrics.skipped_samples,
            faults_injected: metrics.faults_injected,
            read_retries: metrics.read_retries,
            reads_recovered: metrics.reads_recovered,
            iterations: metrics.iterations,
            allocations: metrics.allocations,
        });
    }
    let baseline = results
        .iter()
        .find(|r| r.policy == Policy::Pytorch)
        .map(|r| r.samples_per_second);
    for r in &mut results {
        r.speedup_vs_pytorch = baseline.map(|b| r.samples_per_second / b);
    }
    print_table(&results);
    print_skipped(&results);
    if let Some(path) = &args.json {
        let report = Report {
            config: &config,
            results: &results,
        };
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// The generated default dataset, made once and reused.
fn default_dataset(samples: u32, quiet: bool) -> Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("lobster-io");
    let dir = base.join(format!(
        "imagefolder-{samples}-{DEFAULT_CLASSES}-{DEFAULT_MEAN_KB}kb-seed{DEFAULT_GEN_SEED}"
    ));
    let done = dir.join(".complete");
    if done.exists() {
        return Ok(dir);
    }
    if dir.exists() {
        // A generation that did not finish: start over.
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    if !quiet {
        println!(
            "generating the default dataset once into {} ...",
            dir.display()
        );
    }
    crate::gen::generate(
        &dir,
        samples,
        DEFAULT_CLASSES,
        DEFAULT_MEAN_KB,
        DEFAULT_GEN_SEED,
    )?;
    std::fs::write(&done, b"").with_context(|| format!("writing {}", done.display()))?;
    Ok(dir)
}

/// Runs one policy to the end; returns its metrics, backend, peak resident memory and
/// prefetch window bound.
fn run_policy(
    args: &RunArgs,
    dataset: &Arc<Dataset>,
    cache_bytes: u64,
    policy: Policy,
) -> Result<(RunMetrics, String, u64, u64)> {
    reset_peak_rss();
    let pipelined_schedule = match args.schedule {
        ScheduleArg::Allocate => Schedule::Allocate {
            hysteresis: args.hysteresis,
        },
        ScheduleArg::Equal => Schedule::EqualSplit,
    };
    let (cache, execution, schedule) = policy.parts(pipelined_schedule);
    let config = LoaderConfig {
        nodes: args.nodes,
        node: args.node,
        ranks_per_node: args.ranks_per_node,
        batch_size: args.batch,
        epochs: args.epochs,
        drop_last: false,
        cache_policy: cache,
        cache_capacity_bytes: if cache == CachePolicy::None {
            0
        } else {
            cache_bytes
        },
        io_depth_budget: args.io_depth,
        decode_threads: args.decode_threads,
        prefetch_iterations: args.prefetch,
        window_iterations: 1,
        schedule,
        io_order: match args.io_order {
            IoOrderArg::Deadline => IoOrder::Deadline,
            IoOrderArg::Shares => IoOrder::Shares,
        },
        execution,
        backend: match args.backend {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Uring => Backend::Uring,
            BackendArg::Pread => Backend::Pread,
        },
        direct: args.direct,
        storage_emulation: (args.storage_mbps > 0.0).then_some(StorageEmulation {
            bandwidth_bytes_per_s: args.storage_mbps * 1e6,
            latency_us: args.storage_latency_us,
        }),
        error_policy: args.error_policy()?,
        fault_injection: args.inject_faults,
    };
    let decoder = args.decoder;
    let us_per_kb = args.decode_us_per_kb;
    let mut loader = LoaderBuilder::new(dataset.clone())
        .config(config)
        .seed(args.seed)
        .decode(move |bytes: &[u8], meta: &SampleMeta| decode(decoder, us_per_kb, bytes, meta))
        .build()
        .with_context(|| format!("starting the {policy} loader"))?;
    let backend = loader
        .backend()
        .map_or("read-then-decode workers".to_string(), |b| {
            format!("{:?}", b.active).to_lowercase()
        });
    let iterations = loader.iterations_per_epoch();
    let window_bytes = loader.prefetch_window_bytes();
    let bar = progress_bar(args, policy, iterations as u64 * u64::from(args.epochs));
    let handles = loader.ranks().context("rank handles already taken")?;
    let barrier = Barrier::new(handles.len());
    // A rank whose batch failed still meets the others at that step's barrier, so none waits
    // forever; then every rank stops. The flag holds the first failed step, so a failure in
    // step k + 1 cannot stop a rank just released from step k's barrier before it gets there.
    let failed_step = AtomicUsize::new(usize::MAX);
    let compute = Duration::from_secs_f64(args.compute_ms / 1e3);
    std::thread::scope(|s| -> Result<()> {
        let threads: Vec<_> = handles
            .into_iter()
            .map(|handle| {
                let (barrier, bar, failed_step) = (&barrier, &bar, &failed_step);
                s.spawn(move || -> Result<()> {
                    let rank = handle.rank();
                    for (step, batch) in handle.enumerate() {
                        let batch = batch.with_context(|| format!("{policy}: rank {rank}"));
                        match &batch {
                            Ok(batch) => {
                                std::hint::black_box(batch);
                                std::thread::sleep(compute);
                            }
                            Err(_) => {
                                failed_step.fetch_min(step, Ordering::SeqCst);
                            }
                        }
                        if barrier.wait().is_leader() {
                            bar.inc(1);
                        }
                        if failed_step.load(Ordering::SeqCst) <= step {
                            return batch.map(drop);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a training thread panicked")?;
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    let metrics = loader.metrics();
    drop(loader);
    Ok((metrics, backend, status_bytes("VmHWM"), window_bytes))
}

fn progress_bar(args: &RunArgs, policy: Policy, total: u64) -> ProgressBar {
    if args.quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>20} [{bar:40}] {pos}/{len} iterations {elapsed}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_prefix(policy.name());
    bar
}

/// An error of the CLI's decoders.
#[derive(Debug)]
pub(crate) struct DecodeError(String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one sample; the value is a small digest so nothing is optimised away.
pub(crate) fn decode(
    decoder: Decoder,
    us_per_kb: f64,
    bytes: &[u8],
    meta: &SampleMeta,
) -> Result<u64, DecodeError> {
    match decoder {
        Decoder::Raw => Ok(bytes.len() as u64),
        Decoder::Jpeg => {
            let mut d = zune_jpeg::JpegDecoder::new(bytes);
            let pixels = d
                .decode()
                .map_err(|e| DecodeError(format!("JPEG of {}: {e:?}", meta.path.display())))?;
            Ok(pixels.iter().step_by(4099).map(|&b| u64::from(b)).sum())
        }
        Decoder::Synthetic => {
            let budget = Duration::from_secs_f64(us_per_kb * bytes.len() as f64 / 1024.0 / 1e6);
            let started = Instant::now();
            let mut digest = 0u64;
            // Spin on the bytes until the CPU cost is paid: a stand-in for decode + augment.
            while started.elapsed() < budget {
                for chunk in bytes.chunks(4096) {
                    digest = digest.wrapping_mul(31).wrapping_add(u64::from(chunk[0]));
                }
            }
            Ok(digest)
        }
    }
}

fn print_table(results: &[PolicyResult]) {
    println!(
        "\n{:<20} {:>12} {:>11} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "policy",
        "epoch s",
        "samples/s",
        "stall %",
        "job st %",
        "imb p50",
        "imb p95",
        "hit ratio",
        "speedup"
    );
    for r in results {
        let mean_epoch = r.epoch_seconds.iter().sum::<f64>() / r.epoch_seconds.len().max(1) as f64;
        println!(
            "{:<20} {:>12.2} {:>11.0} {:>8.1} {:>8.1} {:>9.3} {:>9.3} {:>9.3} {:>9}",
            r.policy.name(),
            mean_epoch,
            r.samples_per_second,
            r.stall_fraction * 100.0,
            r.job_stall_fraction * 100.0,
            r.imbalance_p50,
            r.imbalance_p95,
            r.hit_ratio,
            r.speedup_vs_pytorch
                .map_or("-".to_string(), |s| format!("{s:.2}x")),
        );
    }
}

/// Faults met and what the error policy skipped, per policy (nothing when none).
fn print_skipped(results: &[PolicyResult]) {
    for r in results
        .iter()
        .filter(|r| r.skipped + r.faults_injected + r.read_retries > 0)
    {
        println!(
            "{}: {} read attempts faulted by injection, {} retried, {} reads recovered by a \
             retry; {} samples skipped (budget per epoch held)",
            r.policy.name(),
            r.faults_injected,
            r.read_retries,
            r.reads_recovered,
            r.skipped
        );
        for s in r.skipped_samples.iter().take(5) {
            println!(
                "  epoch {} rank {} sample {}: {}",
                s.epoch, s.rank, s.sample, s.cause
            );
        }
    }
}

/// Resets the kernel's peak-RSS mark so each policy's peak is its own.
fn reset_peak_rss() {
    // Writing 5 to clear_refs resets VmHWM (Linux 4.0+); without it the peak is cumulative.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// A memory figure of this process from /proc/self/status (`field` is e.g. `VmHWM` or
/// `VmRSS`), in bytes; 0 where /proc is unavailable.
pub(crate) fn status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> std::result::Result<RunArgs, String> {
        Cli::try_parse_from(std::iter::once("lobster").chain(args.iter().copied()))
            .map(|c| c.run)
            .map_err(|e| e.to_string())
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
            args.error_policy().unwrap(),
            ErrorPolicy::Skip {
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
                .error_policy()
                .unwrap(),
            ErrorPolicy::Skip {
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
            .error_policy()
            .unwrap_err();
        assert!(e.to_string().contains("--on-error skip"), "{e}");
    }

    fn small_run(dir: &Path, extra: &[&str]) -> (RunArgs, PathBuf) {
        let data = dir.join("data");
        if !data.exists() {
            crate::gen::generate(&data, 48, 3, 4.0, 1).unwrap();
        }
        let json = dir.join("run.json");
        let data_s = data.to_str().unwrap();
        let json_s = json.to_str().unwrap();
        let mut args = vec![
            "--quiet",
            "--data",
            data_s,
            "--json",
            json_s,
            "--nodes",
            "1",
            "--ranks-per-node",
            "2",
            "--batch",
            "4",
            "--epochs",
            "3",
            "--compute-ms",
            "0",
            "--storage-mbps",
            "0",
            "--decoder",
            "jpeg",
            "--decode-threads",
            "2",
            "--io-depth",
            "4",
        ];
        args.extend_from_slice(extra);
        (parse(&args).unwrap(), json)
    }

    #[test]
    fn skip_reports_the_same_injected_faults_on_both_executions() {
        let dir = tempfile::tempdir().unwrap();
        // nopfs and lobster-alloc-only share the static cache: same reads, same faults, one
        // through read-then-decode workers, the other through the pipelined reader.
        let (args, json) = small_run(
            dir.path(),
            &[
                "--policy",
                "nopfs,lobster-alloc-only",
                "--on-error",
                "skip",
                "--max-failures",
                "100%",
                "--inject-faults",
                "seed=4,eio=0.1,short=0.3,corrupt=0.1",
            ],
        );
        run(&args).unwrap();
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        let sets: Vec<BTreeSet<(u64, u64, u64)>> = report["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let list = r["skipped_samples"].as_array().unwrap();
                assert_eq!(r["skipped"].as_u64().unwrap() as usize, list.len());
                list.iter()
                    .map(|s| {
                        assert!(!s["cause"].as_str().unwrap().is_empty());
                        let n = |k: &str| s[k].as_u64().unwrap();
                        (n("epoch"), n("rank"), n("sample"))
                    })
                    .collect()
            })
            .collect();
        assert_eq!(sets.len(), 2);
        assert!(!sets[0].is_empty());
        assert_eq!(sets[0], sets[1]);
    }

    #[test]
    fn fail_stops_the_run_naming_the_sample() {
        let dir = tempfile::tempdir().unwrap();
        let (args, _) = small_run(
            dir.path(),
            &[
                "--policy",
                "lobster,pytorch",
                "--inject-faults",
                "seed=4,eio=0.2",
            ],
        );
        let e = format!("{:#}", run(&args).unwrap_err());
        assert!(e.contains("lobster: rank"), "{e}");
        assert!(
            e.contains("reading sample") && e.contains("injected EIO"),
            "{e}"
        );
    }
}
