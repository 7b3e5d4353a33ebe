//! The loader's configuration, validated before any thread starts.

use lobster_cache::{Assign, FormChoice, FormCosts, LinkPrices};

use crate::emulate::StorageEmulation;
use crate::error::Error;
use crate::faults::{FailureBudget, FaultInjection, OnError};

/// Which cache the planner runs: `none`, `reuse`, `lru` or `static`. The parsers also take
/// `lobster` for `reuse` and `nopfs` for `static`, older spellings of the same policies: a
/// policy is named for what it does, while NoPFS (whose idea static placement is) names a
/// whole strategy (`lobster run --strategy nopfs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum CachePolicy {
    /// No cache: every access reads storage (PyTorch's DataLoader).
    None,
    /// Lobster: evict the sample whose next use is farthest away, bypass when admitting would
    /// harm samples needed sooner.
    #[cfg_attr(feature = "clap", value(alias = "lobster"))]
    Reuse,
    /// Least recently used.
    Lru,
    /// NoPFS placement: pin the most accessed samples before the stream starts.
    #[cfg_attr(feature = "clap", value(alias = "nopfs"))]
    Static,
}

impl CachePolicy {
    /// The cache crate's policy, or `None` without a cache.
    pub(crate) fn kind(self) -> Option<lobster_cache::PolicyKind> {
        match self {
            CachePolicy::None => None,
            CachePolicy::Reuse => Some(lobster_cache::PolicyKind::Reuse),
            CachePolicy::Lru => Some(lobster_cache::PolicyKind::Lru),
            CachePolicy::Static => Some(lobster_cache::PolicyKind::Static),
        }
    }
}

names!(CachePolicy, "cache policy", "none, reuse, lru or static", {
    None => "none",
    Reuse => "reuse" | "lobster",
    Lru => "lru",
    Static => "static" | "nopfs",
});

/// How I/O concurrency and decode threads are split among the node's ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    /// Lobster: every window, lobster-sched gives io_depth and decode threads to the ranks
    /// predicted to be slowest; `hysteresis` is the predicted gain a change must exceed. The
    /// io_depth split applies under [`IoOrder::Shares`]; a rank's decode threads take its
    /// tasks first among those of the oldest iteration waiting.
    Allocate {
        /// Fraction of the predicted slowest-rank time a new allocation must save.
        hysteresis: f64,
    },
    /// An equal, fixed split of both budgets.
    EqualSplit,
}

/// How the pipelined mode orders the node's storage reads: `deadline` or `shares`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum IoOrder {
    /// One queue for the node, holding at most the io_depth budget in flight: reads of the
    /// oldest iteration first and, within it, each read at the fraction of its batch's storage
    /// bytes it completes (of equal fractions, the largest read first), so that on a device
    /// serving requests in about the order they come every rank's reads for an iteration end
    /// together instead of one rank's before another's. Ranks share the whole budget; the
    /// schedule's io_depth split is not applied. The order is the reader's as long as it can
    /// take the whole budget at once (its ring entries or pread threads); past that its
    /// per-rank queues take turns.
    #[default]
    #[cfg_attr(
        feature = "clap",
        value(help = "One node-wide queue in deadline order")
    )]
    Deadline,
    /// Each rank holds at most its io_depth share in flight (the schedule's split), oldest
    /// read first among the ranks below their share: the paper's per-rank I/O threads.
    #[cfg_attr(feature = "clap", value(help = "Per-rank io_depth shares"))]
    Shares,
}

names!(IoOrder, "io_order", "deadline or shares", {
    Deadline => "deadline",
    Shares => "shares",
});

/// Where the pipelined mode reads samples the page cache already holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResidentReads {
    /// A decode worker reads a miss itself when the page cache holds all of it (a copy, no
    /// hand-off), and sends it to the dispatcher otherwise. The planner stops trying while
    /// most of what it tries is not resident, and tries again later. Only where every read
    /// is a real buffered read: not with O_DIRECT or an emulated storage tier.
    #[default]
    Auto,
    /// Every storage read goes through the dispatcher.
    Dispatcher,
}

/// How the kernel schedules the pipeline's planner and decode workers: `batch` or `normal`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PipelineThreads {
    /// `SCHED_BATCH`: the same share of the CPU, but their wake-ups do not preempt the
    /// thread on the core. On a node with fewer cores than threads, a rank that takes a batch
    /// wakes the planner, and a planner free to preempt it would hold its core while it and
    /// the workers its window wakes run: about 0.8 ms per step at 8 ranks on 2 cores.
    #[default]
    #[cfg_attr(feature = "clap", value(help = "SCHED_BATCH"))]
    Batch,
    /// The default policy, as PyTorch's and NoPFS's workers run.
    #[cfg_attr(feature = "clap", value(help = "The kernel's default scheduling"))]
    Normal,
}

names!(PipelineThreads, "pipeline_threads", "batch or normal", {
    Batch => "batch",
    Normal => "normal",
});

/// How a sample is loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Execution {
    /// Reads go to the io_uring engine in [`IoOrder`]; decode threads only decode.
    #[default]
    Pipelined,
    /// A fixed set of workers per rank, each reading a sample with a blocking read and then
    /// decoding it (PyTorch's DataLoader and NoPFS): I/O concurrency is the worker count.
    ReadThenDecode,
}

/// What the baselines change, and only this: every other part of the engine (the plan, the
/// cache, each read attempt's fate under the emulated tier and injected faults, delivery) is
/// the same for all, so comparisons stay fair.
impl Execution {
    /// A dispatcher reads the misses on its ring, within the io_depth budget; without one,
    /// the decode worker that takes an access reads it, blocking.
    pub(crate) fn dispatches(self) -> bool {
        self == Execution::Pipelined
    }

    /// A decode worker serves its own rank only (the baselines' per-rank workers); else the
    /// oldest iteration waiting first, its own rank's among equals.
    pub(crate) fn workers_per_rank(self) -> bool {
        self == Execution::ReadThenDecode
    }

    /// lobster-sched moves budgets between ranks each window; the baselines' workers stay put.
    pub(crate) fn reallocates(self) -> bool {
        self == Execution::Pipelined
    }
}

/// Everything the loader needs besides the dataset and the decode function, grouped by the
/// stage it shapes. A job sets [`JobConfig`], the cache's policy and capacity, and perhaps
/// the two budgets; the rest have defaults that suit a node of a training job.
#[derive(Clone, Debug, Default)]
pub struct LoaderConfig {
    /// Where this loader stands in the job, and what each rank takes.
    pub job: JobConfig,
    /// The node's cache.
    pub cache: CacheConfig,
    /// The node's reads in flight and CPU threads, and how they are split among its ranks.
    pub budgets: BudgetConfig,
    /// How and where storage is read.
    pub reads: ReadConfig,
    /// What a rank's iterator does with a sample that cannot be read or decoded.
    pub on_error: OnError,
    /// How a sample is loaded: the pipeline, or the read-then-decode baselines.
    pub execution: Execution,
    /// What one sample may cost to decode; past it the sample fails, under `on_error`.
    pub limits: SampleLimits,
}

/// What one sample may cost to decode. A sample past a bound fails as a corrupt one does
/// ([`Error::Decode`] naming it and its file), so `on_error` decides: skip it within the
/// budget, or fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleLimits {
    /// Pixels an image may have ([`LoaderBuilder::decode_images`](crate::LoaderBuilder::decode_images)):
    /// one whose header claims more is refused before it is decoded. Default
    /// [`lobster_image::PIXELS_MAX_DEFAULT`] (2^26, 8192 x 8192; a pixel costs 3 bytes of
    /// RGB and up to about 16 more while decoding), at most
    /// [`lobster_image::PIXELS_MAX_LIMIT`].
    pub image_pixels_max: u64,
    /// Bytes a decoded sample may have (`None`: no bound), set with
    /// [`LoaderBuilder::decoded_sample_bytes_max`](crate::LoaderBuilder::decoded_sample_bytes_max)
    /// for samples of bytes. A node's host gives each rank slots of `batch_size` samples:
    /// its share, `slot_bytes / batch_size`, is this bound.
    pub decoded_sample_bytes_max: Option<u64>,
}

impl Default for SampleLimits {
    fn default() -> Self {
        SampleLimits {
            image_pixels_max: lobster_image::PIXELS_MAX_DEFAULT,
            decoded_sample_bytes_max: None,
        }
    }
}

/// The job's shape as this loader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobConfig {
    /// Nodes in the job.
    pub nodes: usize,
    /// This node's index, `0..nodes`.
    pub node: usize,
    /// Ranks (GPUs) on each node.
    pub ranks_per_node: usize,
    /// Samples per batch per rank.
    pub batch_size: usize,
    /// Epochs to load.
    pub epochs: u32,
    /// Drop the tail of each epoch instead of padding (PyTorch's `drop_last`).
    pub drop_last: bool,
    /// Which rank of a step (global batch) gets which of its samples.
    pub assign: Assign,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            nodes: 1,
            node: 0,
            ranks_per_node: 1,
            batch_size: 32,
            epochs: 1,
            drop_last: false,
            assign: Assign::Sampler,
        }
    }
}

/// The node's cache.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheConfig {
    /// Which cache the planner runs.
    pub policy: CachePolicy,
    /// Its capacity in bytes (ignored with `CachePolicy::None`).
    pub capacity_bytes: u64,
    /// What the cache keeps of a sample: its encoded bytes, its decoded image, or either,
    /// chosen per sample and per use by the cost model (see `lobster_cache::FormPolicy`).
    /// Decoded forms need the reuse policy and an image decoder
    /// ([`LoaderBuilder::decode_images`](crate::LoaderBuilder::decode_images)), and no peers.
    /// `None`: auto with an image decoder, encoded otherwise.
    pub forms: Option<FormChoice>,
    /// The read and decode costs the two-form rule prices with. `None`: reads from the
    /// emulated storage tier if there is one, else the cost model's storage prior; decodes
    /// from each sample's pixels (its header) times the built-in decoder's constant per
    /// pixel: never timed, so the same run makes the same decisions. Set this for another
    /// decoder's costs.
    pub form_costs: Option<FormCosts>,
    /// Lossy, off by default: decoded images the cache keeps are brought down so that their
    /// longer side is at most this many pixels (FFCV-style pre-resizing), decoded at the
    /// coarsest DCT scale that still reaches that side. Every access of a sample kept so,
    /// the one that keeps it and the hits, then transforms the smaller image, so their
    /// pixels differ from a miss's.
    pub decoded_max_side: Option<u32>,
    /// With peer nodes, whether their caches are planned as one (see
    /// `lobster_cache::cluster`).
    pub peer_plan: PeerPlanChoice,
    /// Under the cluster plan, each node's storage and interconnect bandwidths: a remote hit
    /// is then read from storage where the interconnect is the dearer link (see
    /// `lobster_cache::cluster`, priced remote hits). Configured, never timed, so every node
    /// plans the same; give every node the same. `None`: a peer always serves what it holds,
    /// right for an interconnect much faster than storage.
    pub link_prices: Option<LinkPrices>,
    /// A local disk below the memory cache, planned with it as a second level (see
    /// [`DiskCache`]); `None`: memory only.
    pub disk: Option<DiskCache>,
}

/// A local disk cache below the memory cache (`lobster run --disk-cache DIR
/// --disk-cache-bytes N`): one clairvoyant plan over both levels (`lobster_cache::TierPlanner`)
/// for the `reuse` policy, and a two-level static placement for `static`, with the same disk
/// budget; `lru` has no two-level plan. The files live in `dir/<dataset fingerprint>/`, so a
/// later run of the same dataset (any seed) starts with what this one left there.
///
/// One node only for now: a loader with peers, or with a decoded tier (`cache_forms` other
/// than encoded), is refused with a disk cache; the cluster plan over disks is not built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCache {
    /// The directory the tier's files go in (made if missing; locked while the loader runs).
    pub dir: std::path::PathBuf,
    /// The bytes its files may hold: whole 4 KiB blocks, so at least 4096.
    pub capacity_bytes: u64,
}

/// The bandwidths [`CacheConfig::link_prices`] may give, bytes per second.
pub const LINK_BYTES_PER_S: std::ops::RangeInclusive<u64> = 1..=1 << 50;

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            policy: CachePolicy::Reuse,
            capacity_bytes: 1 << 30,
            forms: None,
            form_costs: None,
            decoded_max_side: None,
            peer_plan: PeerPlanChoice::Auto,
            link_prices: None,
            disk: None,
        }
    }
}

/// How a node with peers plans its cache: `auto` (the cluster's plan where it can gain) or
/// `node` (each node's own), in the words of [`PeerPlanKind`](crate::PeerPlanKind), which
/// says what a run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PeerPlanChoice {
    /// The nodes' caches as one cluster cache wherever that can gain: the reuse policy with
    /// encoded bytes, caches large enough that per-node plans read more than the floor
    /// (`capacity * nodes^2 > dataset bytes`), and a peer's cache priced below storage by the
    /// cost model's priors. Each node's own plan otherwise.
    #[default]
    Auto,
    /// Each node plans its own cache; peers serve what they happen to hold (NoPFS's way).
    Node,
}

names!(PeerPlanChoice, "peer_plan", "auto or node", {
    Auto => "auto",
    Node => "node",
});

/// The node's budgets, and how they are split among its ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BudgetConfig {
    /// Reads in flight the node's ranks share. The default, 128, is deep enough for a local
    /// NVMe device, whose small reads gain from depth to about there.
    pub io_depth: usize,
    /// Decode threads the node's ranks share; 0 picks the machine's cores, at least one per
    /// rank.
    pub decode_threads: usize,
    /// Iterations the planner may run ahead of the slowest rank.
    pub prefetch_iterations: usize,
    /// Iterations per allocation window.
    pub window_iterations: usize,
    /// How the budgets are split.
    pub schedule: Schedule,
    /// How the kernel schedules the planner and the decode workers.
    pub pipeline_threads: PipelineThreads,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            io_depth: 128,
            decode_threads: 0,
            prefetch_iterations: 2,
            window_iterations: 1,
            schedule: Schedule::Allocate { hysteresis: 0.05 },
            pipeline_threads: PipelineThreads::Batch,
        }
    }
}

/// How storage is read, and (with the `lab` feature) what stands in for storage in tests,
/// demos and benches.
#[derive(Clone, Debug, Default)]
pub struct ReadConfig {
    /// Which I/O backend runs the reads.
    pub backend: lobster_uring::Backend,
    /// Read with O_DIRECT (bypassing the page cache), in both executions.
    pub direct: bool,
    /// How the pipelined mode orders storage reads.
    pub io_order: IoOrder,
    /// Where the pipelined mode reads samples the page cache holds.
    pub resident_reads: ResidentReads,
    /// An emulated storage tier charged on every storage read (feature `lab`).
    #[cfg(feature = "lab")]
    pub storage_emulation: Option<StorageEmulation>,
    /// Deterministic faults injected into storage reads (feature `lab`).
    #[cfg(feature = "lab")]
    pub inject_faults: Option<FaultInjection>,
}

impl ReadConfig {
    /// The emulated storage tier, if the `lab` feature is on and one is configured.
    pub(crate) fn emulation(&self) -> Option<StorageEmulation> {
        #[cfg(feature = "lab")]
        return self.storage_emulation;
        #[cfg(not(feature = "lab"))]
        None
    }

    /// The injected faults, if the `lab` feature is on and some are configured.
    pub(crate) fn faults(&self) -> Option<&FaultInjection> {
        #[cfg(feature = "lab")]
        return self.inject_faults.as_ref();
        #[cfg(not(feature = "lab"))]
        None
    }
}

/// Bounds on the knobs, so a typo cannot ask for a million threads: the most decode
/// threads (read-then-decode: workers) a node's loader may have.
pub const THREADS_MAX: usize = 1024;
pub(crate) const IO_DEPTH_MAX: usize = 65_536;
pub(crate) const PREFETCH_MAX: usize = 1024;

impl LoaderConfig {
    /// Ranks in the whole job.
    pub fn world(&self) -> usize {
        self.job.nodes * self.job.ranks_per_node
    }

    /// The config with automatic settings resolved (`decode_threads` 0).
    pub fn resolved(&self) -> LoaderConfig {
        let mut c = self.clone();
        if c.budgets.decode_threads == 0 {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            c.budgets.decode_threads = cores.max(c.job.ranks_per_node).min(THREADS_MAX);
        }
        c
    }

    /// Whether decode workers may read resident samples themselves, and if not, why.
    pub fn resident_reads_enabled(&self) -> Result<(), &'static str> {
        match () {
            _ if !self.execution.dispatches() => Err("read-then-decode workers read every sample"),
            _ if self.reads.resident_reads == ResidentReads::Dispatcher => {
                Err("resident reads are off (as asked, or for a dataset in an object store)")
            }
            _ if self.reads.direct => Err("O_DIRECT bypasses the page cache"),
            _ if self.reads.emulation().is_some() => {
                Err("the emulated storage tier charges every read")
            }
            _ => Ok(()),
        }
    }

    /// Whether the cache may leave a sample it admits in the page cache when a worker found
    /// it there (no copy; its hits read it back), and if not, why.
    pub fn cache_in_page_cache(&self) -> Result<(), &'static str> {
        self.resident_reads_enabled()?;
        match () {
            _ if self.cache.policy == CachePolicy::None => Err("no cache"),
            // Demotions write the disk from the memory cache's own bytes.
            _ if self.cache.disk.is_some() => Err("a disk cache below it is written from copies"),
            // A hit read back would draw a storage read's faults the cached bytes never saw.
            _ if self.reads.faults().is_some() => {
                Err("faults are injected into every storage read")
            }
            _ => Ok(()),
        }
    }

    /// Checks every parameter against its allowed range; `samples` is the dataset's size.
    pub fn validate(&self, samples: usize) -> Result<(), Error> {
        self.validate_job(samples)?;
        self.validate_cache()?;
        self.validate_budgets_and_reads()
    }

    /// The world, the epochs and the batch size.
    fn validate_job(&self, samples: usize) -> Result<(), Error> {
        in_range("nodes", self.job.nodes, 1, 1 << 20)?;
        in_range("ranks_per_node", self.job.ranks_per_node, 1, THREADS_MAX)?;
        in_range("node", self.job.node, 0, self.job.nodes - 1)?;
        in_range("epochs", self.job.epochs as usize, 1, u32::MAX as usize)?;
        let world = self.world();
        let per_rank = if self.job.drop_last {
            samples / world
        } else {
            samples.div_ceil(world)
        };
        if per_rank == 0 {
            return Err(Error::invalid(
                "world",
                world,
                format!("at most the {samples} samples when drop_last is set"),
            ));
        }
        in_range("batch_size", self.job.batch_size, 1, per_rank)?;
        Ok(())
    }

    /// The cache and the limits on what it keeps.
    fn validate_cache(&self) -> Result<(), Error> {
        if self.cache.policy != CachePolicy::None && self.cache.capacity_bytes == 0 {
            return Err(Error::invalid(
                "cache_bytes",
                0,
                "at least 1 with a cache policy (use the policy none for no cache)",
            ));
        }
        if let Some(forms) = self.cache.forms.filter(|&f| f != FormChoice::Encoded) {
            if self.cache.policy != CachePolicy::Reuse {
                return Err(Error::invalid(
                    "cache_forms",
                    forms,
                    format!(
                        "encoded with the cache policy {} (decoded forms need reuse)",
                        self.cache.policy
                    ),
                ));
            }
        }
        if let Some(disk) = &self.cache.disk {
            validate_disk(disk, &self.cache)?;
        }
        if let Some(p) = self.cache.link_prices {
            for (name, value) in [
                ("link_prices.storage_bytes_per_s", p.storage_bytes_per_s),
                ("link_prices.net_bytes_per_s", p.net_bytes_per_s),
            ] {
                if !LINK_BYTES_PER_S.contains(&value) {
                    return Err(Error::invalid(name, value, "1..=2^50 bytes per second"));
                }
            }
        }
        if let Some(side) = self.cache.decoded_max_side {
            in_range("decoded_max_side", side as usize, 1, 1 << 16)?;
        }
        let pixels = self.limits.image_pixels_max;
        if !(1..=lobster_image::PIXELS_MAX_LIMIT).contains(&pixels) {
            let allowed = format!("1..={}", lobster_image::PIXELS_MAX_LIMIT);
            return Err(Error::invalid("image_pixels_max", pixels, allowed));
        }
        if self.limits.decoded_sample_bytes_max == Some(0) {
            return Err(Error::invalid("decoded_sample_bytes_max", 0, "at least 1"));
        }
        if let Some(c) = self.cache.form_costs {
            c.validate()
                .map_err(|e| Error::invalid("form_costs", format!("{c:?}"), e.to_string()))?;
        }
        Ok(())
    }

    /// Whether a run may have the disk cache: `lobster-io` plans it with peers and with a
    /// decoded tier not yet.
    pub(crate) fn disk_refused(&self, has_peers: bool) -> Result<(), Error> {
        let Some(disk) = &self.cache.disk else {
            return Ok(());
        };
        if has_peers {
            return Err(Error::invalid(
                "disk_cache",
                disk.dir.display(),
                "no disk cache with peers: the plan over several nodes' disks is not built; \
                 drop the peers or the disk cache",
            ));
        }
        Ok(())
    }

    /// The node's budgets, how storage is read, and what happens when a read fails.
    fn validate_budgets_and_reads(&self) -> Result<(), Error> {
        let ranks = self.job.ranks_per_node;
        in_range("io_depth", self.budgets.io_depth, ranks, IO_DEPTH_MAX)?;
        if self.budgets.decode_threads != 0 {
            in_range(
                "decode_threads",
                self.budgets.decode_threads,
                ranks,
                THREADS_MAX,
            )?;
        }
        in_range(
            "prefetch_iterations",
            self.budgets.prefetch_iterations,
            1,
            PREFETCH_MAX,
        )?;
        in_range(
            "window_iterations",
            self.budgets.window_iterations,
            1,
            PREFETCH_MAX,
        )?;
        if let Schedule::Allocate { hysteresis } = self.budgets.schedule {
            if !(0.0..1.0).contains(&hysteresis) {
                return Err(Error::invalid("hysteresis", hysteresis, "0 <= h < 1"));
            }
        }
        if let Some(e) = self.reads.emulation() {
            if !(e.bandwidth_bytes_per_s.is_finite() && e.bandwidth_bytes_per_s > 0.0) {
                return Err(Error::invalid(
                    "storage bandwidth_bytes_per_s",
                    e.bandwidth_bytes_per_s,
                    "a positive number",
                ));
            }
            in_range("storage latency_us", e.latency_us as usize, 0, 10_000_000)?;
        }
        if let OnError::Skip {
            max_failures: FailureBudget::Fraction(f),
        } = self.on_error
        {
            if !(0.0..=1.0).contains(&f) {
                return Err(Error::invalid("max_failures", f, "a fraction 0..=1"));
            }
        }
        if let Some(f) = self.reads.faults() {
            f.validate()?;
        }
        Ok(())
    }
}

/// The disk cache's own limits, and what it cannot go with.
fn validate_disk(disk: &DiskCache, cache: &CacheConfig) -> Result<(), Error> {
    match cache.policy {
        CachePolicy::Reuse | CachePolicy::Static => {}
        p => {
            return Err(Error::invalid(
                "disk_cache",
                disk.dir.display(),
                format!("a cache policy with a two-level plan, reuse or static, not {p}"),
            ))
        }
    }
    if disk.capacity_bytes < lobster_tier::BLOCK_BYTES {
        return Err(Error::invalid(
            "disk_cache_bytes",
            disk.capacity_bytes,
            format!("at least one {}-byte block", lobster_tier::BLOCK_BYTES),
        ));
    }
    if let Some(forms) = cache.forms.filter(|&f| f != FormChoice::Encoded) {
        return Err(Error::invalid(
            "disk_cache",
            disk.dir.display(),
            format!(
                "no disk cache with cache_forms {forms}: the disk keeps encoded bytes and the \
                 plan over a decoded tier and a disk is not built; drop one of the two"
            ),
        ));
    }
    Ok(())
}

/// `value` if it is within `lo..=hi`, else an error naming the parameter and the range.
fn in_range(name: &'static str, value: usize, lo: usize, hi: usize) -> Result<(), Error> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(name, value, format!("{lo}..={hi}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bad_parameter_is_named() {
        let mut ok = LoaderConfig::default();
        ok.job.ranks_per_node = 2;
        ok.budgets.decode_threads = 2;
        ok.validate(1000).unwrap();
        let with = |change: &dyn Fn(&mut LoaderConfig)| {
            let mut c = ok.clone();
            change(&mut c);
            c
        };
        let cases: Vec<(LoaderConfig, &str)> = vec![
            (with(&|c| c.job.ranks_per_node = 0), "ranks_per_node"),
            (with(&|c| c.job.node = 1), "node"),
            (with(&|c| c.job.batch_size = 501), "batch_size"),
            (with(&|c| c.job.batch_size = 0), "batch_size"),
            (with(&|c| c.cache.capacity_bytes = 0), "cache_bytes"),
            (with(&|c| c.budgets.io_depth = 0), "io_depth"),
            (with(&|c| c.budgets.decode_threads = 1), "decode_threads"),
            (
                with(&|c| c.budgets.prefetch_iterations = 0),
                "prefetch_iterations",
            ),
            (with(&|c| c.job.epochs = 0), "epochs"),
            (with(&|c| c.limits.image_pixels_max = 0), "image_pixels_max"),
            (
                with(&|c| c.limits.image_pixels_max = (1 << 32) + 1),
                "image_pixels_max",
            ),
            (
                with(&|c| c.limits.decoded_sample_bytes_max = Some(0)),
                "decoded_sample_bytes_max",
            ),
            (
                with(&|c| {
                    c.cache.link_prices = Some(LinkPrices {
                        storage_bytes_per_s: 0,
                        net_bytes_per_s: 1,
                    })
                }),
                "link_prices.storage_bytes_per_s",
            ),
            (
                with(&|c| {
                    c.cache.link_prices = Some(LinkPrices {
                        storage_bytes_per_s: 1,
                        net_bytes_per_s: u64::MAX,
                    })
                }),
                "link_prices.net_bytes_per_s",
            ),
        ];
        for (config, parameter) in cases {
            let err = config.validate(1000).unwrap_err();
            match &err {
                Error::InvalidParameter { parameter: p, .. } => assert_eq!(*p, parameter, "{err}"),
                other => panic!("expected InvalidParameter for {parameter}, got {other}"),
            }
            assert!(err.to_string().contains("allowed"), "{err}");
        }
    }
}
