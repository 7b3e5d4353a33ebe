//! Metrics per rank per iteration and per run, bounded in memory however long the run.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use lobster_cache::{ClusterCounts, FormCosts, LinkPrices, PeerPlanKind};
use serde::Serialize;

/// One rank's figures for one iteration.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct IterationMetrics {
    /// Epoch of the batch.
    pub epoch: u32,
    /// Iteration within the epoch.
    pub iteration: u32,
    /// Local rank.
    pub rank: usize,
    /// Time the rank's pipeline spent producing this batch, after the previous one was ready.
    pub load_s: f64,
    /// Time the rank's training thread waited for this batch.
    pub stall_s: f64,
    /// Samples served from the node cache.
    pub hits: u32,
    /// Samples read from storage.
    pub misses: u32,
    /// Bytes served from the cache.
    pub hit_bytes: u64,
    /// Bytes read from storage.
    pub miss_bytes: u64,
    /// Summed decode time of the batch's samples.
    pub decode_s: f64,
}

/// One allocation decision of lobster-sched.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocationRecord {
    /// Epoch of the window's first iteration.
    pub epoch: u32,
    /// The window's first iteration.
    pub iteration: u32,
    /// io_depth per local rank: each rank's cap under
    /// [`IoOrder::Shares`](crate::IoOrder::Shares); under the default deadline order the
    /// ranks share the whole budget and this split is the allocator's advice only.
    pub io_depth: Vec<u32>,
    /// Decode threads per local rank.
    pub decode_threads: Vec<u32>,
    /// Predicted imbalance (max / mean rank time) of the equal split.
    pub predicted_imbalance_equal: f64,
    /// Predicted imbalance of this allocation.
    pub predicted_imbalance: f64,
}

/// A sample left out of its batch under [`OnError::Skip`](crate::OnError::Skip).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SkippedSample {
    /// Epoch of the access.
    pub epoch: u32,
    /// Iteration of the access.
    pub iteration: u32,
    /// Local rank whose batch lost it.
    pub rank: usize,
    /// The sample's id.
    pub sample: u32,
    /// The sample's file.
    pub path: std::path::PathBuf,
    /// Why it failed.
    pub cause: String,
}

/// A mode the loader ran in, and why where a setting, the machine or the run ruled out the
/// first choice. In JSON: `{"mode": "dispatcher", "reason": "O_DIRECT bypasses the page
/// cache"}`; displayed as `dispatcher (O_DIRECT bypasses the page cache)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Mode<K> {
    /// What the loader did.
    pub mode: K,
    /// Why it did not do better, if it could not.
    pub reason: Option<String>,
}

impl<K> Mode<K> {
    /// The mode chosen, with nothing against it.
    pub fn chosen(mode: K) -> Self {
        Mode { mode, reason: None }
    }

    /// The mode taken, for `reason`.
    pub fn because(mode: K, reason: impl Into<String>) -> Self {
        Mode {
            mode,
            reason: Some(reason.into()),
        }
    }
}

impl<K: std::fmt::Display> std::fmt::Display for Mode<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.reason {
            None => write!(f, "{}", self.mode),
            Some(why) => write!(f, "{} ({why})", self.mode),
        }
    }
}

/// Generates a mode enum that serializes, parses and displays as its kebab-case names.
macro_rules! mode_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        #[serde(rename_all = "kebab-case")]
        pub enum $name {
            #[default]
            $($(#[$vdoc])* $variant,)*
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self {
                    $($name::$variant => $text,)*
                })
            }
        }
    };
}

mode_enum! {
    /// Where a run's misses were read.
    ReadPath {
        /// Decode workers read what the page cache holds, the dispatcher the rest.
        ResidentOnWorkers = "resident-on-workers",
        /// The dispatcher read every miss.
        Dispatcher = "dispatcher",
        /// Read-then-decode workers read every sample (the baselines).
        BlockingWorkers = "blocking-workers",
    }
}

mode_enum! {
    /// Where the cache holds its samples.
    CacheStore {
        /// No cache.
        None = "none",
        /// An admitted sample a worker found in the page cache stays there, no copy; the
        /// rest are copied.
        PageCacheWhereResident = "page-cache-where-resident",
        /// Every cached sample is a copy of its own.
        Copies = "copies",
    }
}

mode_enum! {
    /// What the cache keeps of samples.
    CacheForms {
        /// No cache.
        None = "none",
        /// Encoded bytes.
        Encoded = "encoded",
        /// Decoded images.
        Decoded = "decoded",
        /// Either, chosen per sample by the cost model.
        Auto = "auto",
    }
}

mode_enum! {
    /// How the kernel scheduled the planner and the decode workers.
    ThreadClass {
        /// `SCHED_BATCH`: a fair share, without preempting the thread on the core.
        Batch = "batch",
        /// The normal class.
        Normal = "normal",
    }
}

impl From<lobster_cache::FormChoice> for CacheForms {
    fn from(choice: lobster_cache::FormChoice) -> Self {
        match choice {
            lobster_cache::FormChoice::Encoded => CacheForms::Encoded,
            lobster_cache::FormChoice::Decoded => CacheForms::Decoded,
            lobster_cache::FormChoice::Auto => CacheForms::Auto,
        }
    }
}

/// A run's summary.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunMetrics {
    /// Samples delivered to all local ranks.
    pub samples: u64,
    /// Wall time from the loader's start to the last batch taken.
    pub elapsed_s: f64,
    /// Wall time of each completed epoch (first batch issued to last batch taken).
    pub epoch_seconds: Vec<f64>,
    /// `samples / elapsed_s`.
    pub samples_per_second: f64,
    /// Samples per second after the run's first epoch (from its last batch taken to the last
    /// batch taken): the steady state, without the cold cache's first pass (a resumed run's
    /// first is the rest of the interrupted epoch). Zero with one epoch.
    pub steady_samples_per_second: f64,
    /// Time ranks waited for batches over the ranks' total time.
    pub stall_fraction: f64,
    /// Time a synchronous job waited for data over the elapsed time: per iteration the
    /// longest wait of any local rank, since every rank's step waits for the slowest batch.
    /// Unlike [`stall_fraction`](Self::stall_fraction) it does not fall when one rank's
    /// batch comes late while the others come early and wait at the step's barrier instead.
    /// Iterations count once every local rank took its batch, so once a rank drops its handle
    /// later iterations are left out.
    pub job_stall_fraction: f64,
    /// Median per-iteration imbalance (max over ranks of load time / mean).
    pub imbalance_p50: f64,
    /// 95th percentile of the per-iteration imbalance.
    pub imbalance_p95: f64,
    /// Cache hits over accesses.
    pub hit_ratio: f64,
    /// Cache hits.
    pub hits: u64,
    /// Accesses.
    pub accesses: u64,
    /// The most recent per-iteration figures: at most 4096 (256 KiB), oldest dropped first.
    /// The run-wide figures above count every iteration.
    pub iterations: Vec<IterationMetrics>,
    /// The most recent allocations: at most 1024, oldest dropped first.
    pub allocations: Vec<AllocationRecord>,
    /// Accesses skipped by the error policy.
    pub skipped: u64,
    /// The first skipped accesses, in the order ranks took their batches: at most 1024,
    /// later ones are only counted in `skipped`.
    pub skipped_samples: Vec<SkippedSample>,
    /// Storage read attempts the fault injector changed (failed, shortened, delayed or
    /// corrupted; feature `lab`).
    #[cfg(feature = "lab")]
    pub faults_injected: u64,
    /// Read attempts retried after a transient failure.
    pub read_retries: u64,
    /// Reads that succeeded after at least one retry.
    pub reads_recovered: u64,
    /// Where misses were read, and why not on the workers where they were not.
    pub read_path: Mode<ReadPath>,
    /// How the kernel scheduled the planner and decode workers (normal, with why, where
    /// `SCHED_BATCH` was refused).
    pub pipeline_threads: Mode<ThreadClass>,
    /// Misses decode workers read from the page cache.
    pub reads_resident: u64,
    /// Misses decode workers tried and found not resident (they read them from storage).
    pub reads_not_resident: u64,
    /// Reads the dispatcher made (pipelined).
    pub reads_dispatched: u64,
    /// The dataset's directories the pipeline holds open, so that an open walks one
    /// component of a sample's path, not all of them (0 read-then-decode, which opens by
    /// path as PyTorch's workers do).
    pub dirs_held: u64,
    /// Where the cache holds its samples, and why in copies where it could not leave them
    /// in the page cache.
    pub cache_store: Mode<CacheStore>,
    /// Admitted samples left in the page cache.
    pub cached_in_page_cache: u64,
    /// Hits on those read back from the page cache.
    pub hits_from_page_cache: u64,
    /// Hits on those the page cache had let go, read from storage and counted as misses.
    pub hits_lost_by_page_cache: u64,
    /// Misses sent to a peer node's cache: the planned remote hits. `hit_ratio` stays the
    /// local cache's.
    pub planned_remote_hits: u64,
    /// Of those, served by the peer.
    pub remote_hits: u64,
    /// Of those, not served by the peer (a miss, a timeout, a failure): read from storage.
    pub remote_misses: u64,
    /// Of the remote misses, those not answered in time.
    pub remote_timeouts: u64,
    /// Accesses of this node a peer is planned to hold, whether or not the local cache hits
    /// them or the cost model sends them to storage.
    pub peer_planned_accesses: u64,
    /// Bytes peers sent this node: its remote hits' bytes over the interconnect.
    pub remote_hit_bytes: u64,
    /// Storage reads that delivered bytes, by the epoch of their access (a remote miss's
    /// fallback and a page-cache hit the page cache had let go count; retries once).
    pub storage_reads_by_epoch: Vec<u64>,
    /// Their bytes.
    pub storage_bytes_by_epoch: Vec<u64>,
    /// For a dataset in an object store, the GET requests made for samples, by the epoch of
    /// their access: one per read attempt, failed ones included, less the attempts served by
    /// another's GET (coalesced); a stalled body the client resumes is not a new request.
    /// Empty for local files.
    pub object_requests_by_epoch: Vec<u64>,
    /// How the nodes' caches were planned: `cluster` (one plan for the job's caches) or
    /// `node` (each node's own), and why.
    pub peer_plan: Mode<PeerPlanKind>,
    /// Which rank of a step got which of its samples: `sampler` (PyTorch's split) or
    /// `locality` (to the nodes holding them, under the cluster plan), and why not locality
    /// where it was asked for.
    pub assign: Mode<lobster_cache::Assign>,
    /// This node's share of the cluster plan (under it).
    pub cluster_plan: Option<ClusterPlanMetrics>,
    /// What the cache kept of samples, and why encoded where a decoded tier was not
    /// possible (or why lossy, with a decoded side bound).
    pub cache_forms: Mode<CacheForms>,
    /// The costs the two-form rule priced forms with (with a decoded tier).
    pub form_costs: Option<FormCostsReport>,
    /// Hits on encoded bytes, as planned.
    pub hits_encoded: u64,
    /// Hits on decoded images, as planned.
    pub hits_decoded: u64,
    /// Hits that found their decoded image and skipped the decode.
    pub decoded_hits_served: u64,
    /// The decode time those hits skipped, each image's own decode as timed when made.
    pub decode_saved_seconds: f64,
    /// Decoded images made and put in the cache.
    pub images_kept: u64,
    /// Planned decoded hits that decoded the bytes again: the image was not made yet (its
    /// admitting access still decoding) or its decode had failed.
    pub decoded_again: u64,
    /// The most bytes the cache held in encoded form at once (by the plan).
    pub peak_cached_encoded_bytes: u64,
    /// The most bytes the cache held in decoded form at once (by the plan).
    pub peak_cached_decoded_bytes: u64,
    /// What the disk cache below the memory cache did (with one).
    pub disk_cache: Option<DiskCacheMetrics>,
}

/// What the disk cache did: the plan's figures, and what its files gave. A planned disk hit
/// that could not be read (its entry damaged, or missing because its write found the disk
/// full) is read from storage, counted in `fallbacks` and in the storage figures, never
/// silently: the batch is the same.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DiskCacheMetrics {
    /// The tier's directory, `dir/<dataset fingerprint>`.
    pub dir: String,
    /// The tier's capacity: the bytes its extents may hold (whole 4 KiB blocks).
    pub capacity_bytes: u64,
    /// The disk bytes the plan budgets in sample bytes: the capacity less room for each
    /// sample's rounding to whole blocks and for fragmentation.
    pub plan_capacity_bytes: u64,
    /// Whether its files are read and written with O_DIRECT (probed at open).
    pub direct: bool,
    /// Entries found at open (a previous run's): the plan's seeds.
    pub seeds: u64,
    /// Their bytes.
    pub seed_bytes: u64,
    /// Of those, the ones the plan dropped before the first access.
    pub seeds_dropped: u64,
    /// Accesses the plan finds on the disk.
    pub planned_hits: u64,
    /// Their bytes.
    pub planned_hit_bytes: u64,
    /// Of those, planned on entries found at open.
    pub planned_seed_hits: u64,
    /// Disk reads that gave checked bytes.
    pub hits: u64,
    /// Their bytes.
    pub hit_bytes: u64,
    /// Entries written (store reads kept on the disk, and demotions from memory).
    pub writes: u64,
    /// Their bytes.
    pub write_bytes: u64,
    /// Planned disk hits read from storage instead.
    pub fallbacks: u64,
    /// Writes refused for want of a free extent (the entry is then absent).
    pub full: u64,
    /// Reads that found an entry's bytes damaged or short (the entry dropped).
    pub damaged: u64,
    /// Writes or reads the system failed.
    pub io_errors: u64,
    /// Writes not made because the sample's bytes could not be had (its read failed).
    pub writes_skipped: u64,
    /// Entries dropped as the plan says.
    pub removes: u64,
    /// Extent bytes the tier holds now (at most `capacity_bytes`).
    pub used_bytes: u64,
    /// Entries the tier holds now.
    pub entries: u64,
}

/// This node's share of the cluster plan, as planned.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClusterPlanMetrics {
    /// Nodes whose caches the plan treats as one.
    pub nodes: usize,
    /// The dataset's bytes `F`.
    pub dataset_bytes: u64,
    /// The job's floor of storage bytes per epoch, `max(0, F - nodes * capacity)`: every
    /// sample is read once per epoch, and a hit needs the sample held at the epoch's start.
    pub floor_bytes_per_epoch: u64,
    /// This node's planned accesses per epoch.
    pub epochs: Vec<ClusterCounts>,
    /// Other nodes' accesses this node's cache was planned to serve.
    pub serves_planned: u64,
    /// The bandwidths remote hits were priced with, if any.
    pub link_prices: Option<LinkPrices>,
}

/// The costs the two-form rule priced forms with, and where they came from. In JSON the
/// costs' fields sit beside the sources', as one object.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FormCostsReport {
    /// The costs.
    #[serde(flatten)]
    pub costs: FormCosts,
    /// Where the read costs came from: `config`, `emulation` (the emulated tier) or
    /// `prior` (the cost model's storage prior).
    pub read_source: &'static str,
    /// Where the decode costs came from: `config`, `model` (each sample's pixels times the
    /// built-in decoder's constant for its format, over the encoded bytes) or `prior` (no
    /// sample's header could be read). Never a timing: the plan does not depend on the
    /// machine's load.
    pub decode_source: &'static str,
    /// The model's input: pixels of the samples with a header (0 without the model).
    pub model_pixels: u64,
    /// The model's input: those samples' encoded bytes.
    pub model_encoded_bytes: u64,
    /// The model's constant: seconds per pixel of a JPEG.
    pub model_jpeg_s_per_pixel: f64,
    /// The model's constant: seconds per pixel of a PNG.
    pub model_png_s_per_pixel: f64,
}

/// Per-iteration records kept for the API and JSON; older ones are dropped. The run's
/// summary figures count every iteration, so the records are for looking at recent
/// behaviour; at 64 bytes each they hold 256 KiB, reached within an epoch or two of a job
/// of many ranks, so memory levels off early however long the run.
pub(crate) const ITERATIONS_MAX: usize = 4096;

/// Allocation records kept (one per planning window); older ones are dropped.
pub(crate) const ALLOCATIONS_MAX: usize = 1024;

/// Iterations left open by a detached rank that are still tracked.
const OPEN_ITERATIONS_MAX: usize = ITERATIONS_MAX;

/// Skipped accesses listed in the metrics (each holds its path and cause, some 200
/// bytes); later ones are counted only.
pub(crate) const SKIPPED_MAX: usize = 1024;

/// Failures per epoch kept for a budget error's summary.
pub(crate) const FIRST_FAILURES_MAX: usize = 5;

/// Imbalance ratios in [1, 11) at 0.1% resolution; larger ones land in the last bin.
const BIN_WIDTH: f64 = 0.001;
const BINS: usize = 10_000;

/// A fixed-size histogram so percentiles cost no memory per iteration.
#[derive(Clone, Debug)]
pub(crate) struct RatioHistogram {
    counts: Vec<u64>,
    total: u64,
}

impl RatioHistogram {
    pub(crate) fn new() -> Self {
        Self {
            counts: vec![0; BINS],
            total: 0,
        }
    }

    pub(crate) fn record(&mut self, ratio: f64) {
        let bin = if ratio.is_finite() {
            ((ratio - 1.0).max(0.0) / BIN_WIDTH) as usize
        } else {
            BINS - 1
        };
        self.counts[bin.min(BINS - 1)] += 1;
        self.total += 1;
    }

    /// The `q` quantile (0..=1), as the upper edge of its bin; 1.0 when empty.
    pub(crate) fn quantile(&self, q: f64) -> f64 {
        if self.total == 0 {
            return 1.0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (bin, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return 1.0 + (bin as f64 + 1.0) * BIN_WIDTH;
            }
        }
        1.0 + BINS as f64 * BIN_WIDTH
    }
}

/// An iteration being completed by the node's ranks.
#[derive(Clone, Debug)]
struct OpenIteration {
    key: (u32, u32),
    load_s: Vec<Option<f64>>,
    stall_max_s: f64,
}

/// The collector the pipeline and the rank handles write to.
#[derive(Debug)]
pub(crate) struct Collector {
    ranks: usize,
    started: Instant,
    last_taken: Instant,
    samples: u64,
    hits: u64,
    accesses: u64,
    stall: Duration,
    /// Summed over completed iterations: the longest wait of any rank.
    job_stall_s: f64,
    imbalance: RatioHistogram,
    open: VecDeque<OpenIteration>,
    history: VecDeque<IterationMetrics>,
    allocations: VecDeque<AllocationRecord>,
    epoch_started: Vec<Option<Instant>>,
    epoch_taken: Vec<(usize, Option<Instant>)>,
    /// Samples of every epoch after the first.
    steady_samples: u64,
    /// The run's first epoch (a resumed run's may be past 0): its cold pass is not steady.
    first_epoch: u32,
    skipped: u64,
    skipped_samples: Vec<SkippedSample>,
    /// Per epoch: skipped accesses and the first few (sample, cause), for a budget error's
    /// summary; the causes are dropped once every rank took the epoch's last batch.
    epoch_skipped: Vec<(u64, Vec<(u32, String)>)>,
}

impl Collector {
    pub(crate) fn new(ranks: usize, epochs: u32, first_epoch: u32) -> Self {
        let now = Instant::now();
        Self {
            ranks,
            started: now,
            last_taken: now,
            samples: 0,
            hits: 0,
            accesses: 0,
            stall: Duration::ZERO,
            job_stall_s: 0.0,
            imbalance: RatioHistogram::new(),
            open: VecDeque::new(),
            // Allocated once: growing them by doubling through a long run leaves the
            // allocator holes it may never give back.
            history: VecDeque::with_capacity(ITERATIONS_MAX),
            allocations: VecDeque::with_capacity(ALLOCATIONS_MAX),
            epoch_started: vec![None; epochs as usize],
            epoch_taken: vec![(0, None); epochs as usize],
            steady_samples: 0,
            first_epoch,
            skipped: 0,
            skipped_samples: Vec::new(),
            epoch_skipped: vec![(0, Vec::new()); epochs as usize],
        }
    }

    /// Records a skipped access; returns the epoch's skipped count and first failures.
    pub(crate) fn skipped(&mut self, s: SkippedSample) -> (u64, &[(u32, String)]) {
        self.skipped += 1;
        let epoch = &mut self.epoch_skipped[s.epoch as usize];
        epoch.0 += 1;
        if epoch.1.len() < FIRST_FAILURES_MAX {
            epoch.1.push((s.sample, s.cause.clone()));
        }
        if self.skipped_samples.len() < SKIPPED_MAX {
            self.skipped_samples.push(s);
        }
        (epoch.0, &epoch.1)
    }

    pub(crate) fn epoch_issued(&mut self, epoch: u32, at: Instant) {
        self.epoch_started[epoch as usize].get_or_insert(at);
    }

    /// A rank took a batch; `last_of_epoch` marks the epoch's final batch for that rank.
    /// Record the batch's skipped accesses first: once every rank took the epoch's last
    /// batch, the epoch's failures are dropped.
    /// Counts a rank's batch as taken; true when it was the last rank's last batch of its
    /// epoch.
    pub(crate) fn batch_taken(
        &mut self,
        m: IterationMetrics,
        samples: usize,
        last_of_epoch: bool,
    ) -> bool {
        let mut epoch_ended = false;
        let now = Instant::now();
        self.last_taken = now;
        self.samples += samples as u64;
        if m.epoch > self.first_epoch {
            self.steady_samples += samples as u64;
        }
        self.hits += u64::from(m.hits);
        self.accesses += u64::from(m.hits + m.misses);
        self.stall += Duration::from_secs_f64(m.stall_s);
        if last_of_epoch {
            let entry = &mut self.epoch_taken[m.epoch as usize];
            entry.0 += 1;
            if entry.0 == self.ranks {
                entry.1 = Some(now);
                // The epoch's budget was decided: its failures' summary is not needed again.
                self.epoch_skipped[m.epoch as usize].1 = Vec::new();
                epoch_ended = true;
            }
        }
        let key = (m.epoch, m.iteration);
        let index = match self.open.iter().position(|o| o.key == key) {
            Some(i) => i,
            None => {
                self.open.push_back(OpenIteration {
                    key,
                    load_s: vec![None; self.ranks],
                    stall_max_s: 0.0,
                });
                self.open.len() - 1
            }
        };
        let open = &mut self.open[index];
        open.load_s[m.rank] = Some(m.load_s);
        open.stall_max_s = open.stall_max_s.max(m.stall_s);
        if open.load_s.iter().all(Option::is_some) {
            let done = self.open.remove(index).expect("index is in range");
            self.job_stall_s += done.stall_max_s;
            let loads: Vec<f64> = done.load_s.into_iter().flatten().collect();
            self.imbalance.record(lobster_sched::imbalance(&loads));
        }
        // A detached rank leaves iterations open forever; keep that bounded.
        while self.open.len() > OPEN_ITERATIONS_MAX {
            self.open.pop_front();
        }
        if self.history.len() == ITERATIONS_MAX {
            self.history.pop_front();
        }
        self.history.push_back(m);
        epoch_ended
    }

    pub(crate) fn allocation(&mut self, record: AllocationRecord) {
        if self.allocations.len() == ALLOCATIONS_MAX {
            self.allocations.pop_front();
        }
        self.allocations.push_back(record);
    }

    pub(crate) fn summary(&self) -> RunMetrics {
        let elapsed_s = (self.last_taken - self.started).as_secs_f64();
        let epoch_seconds = self
            .epoch_started
            .iter()
            .zip(&self.epoch_taken)
            .filter_map(|(start, (_, end))| {
                Some((end.as_ref()?.saturating_duration_since(*start.as_ref()?)).as_secs_f64())
            })
            .collect();
        let rank_time_s = elapsed_s * self.ranks as f64;
        let steady_s = self
            .epoch_taken
            .get(self.first_epoch as usize)
            .and_then(|e| e.1)
            .map_or(0.0, |end| (self.last_taken - end).as_secs_f64());
        RunMetrics {
            steady_samples_per_second: if steady_s > 0.0 {
                self.steady_samples as f64 / steady_s
            } else {
                0.0
            },
            samples: self.samples,
            elapsed_s,
            epoch_seconds,
            samples_per_second: if elapsed_s > 0.0 {
                self.samples as f64 / elapsed_s
            } else {
                0.0
            },
            stall_fraction: if rank_time_s > 0.0 {
                (self.stall.as_secs_f64() / rank_time_s).min(1.0)
            } else {
                0.0
            },
            job_stall_fraction: if elapsed_s > 0.0 {
                (self.job_stall_s / elapsed_s).min(1.0)
            } else {
                0.0
            },
            imbalance_p50: self.imbalance.quantile(0.5),
            imbalance_p95: self.imbalance.quantile(0.95),
            hit_ratio: if self.accesses > 0 {
                self.hits as f64 / self.accesses as f64
            } else {
                0.0
            },
            hits: self.hits,
            accesses: self.accesses,
            iterations: self.history.iter().cloned().collect(),
            allocations: self.allocations.iter().cloned().collect(),
            skipped: self.skipped,
            skipped_samples: self.skipped_samples.clone(),
            #[cfg(feature = "lab")]
            faults_injected: 0,
            read_path: Mode::default(),
            pipeline_threads: Mode::default(),
            reads_resident: 0,
            reads_not_resident: 0,
            reads_dispatched: 0,
            dirs_held: 0,
            cache_store: Mode::default(),
            cached_in_page_cache: 0,
            hits_from_page_cache: 0,
            hits_lost_by_page_cache: 0,
            planned_remote_hits: 0,
            remote_hits: 0,
            remote_misses: 0,
            remote_timeouts: 0,
            peer_planned_accesses: 0,
            remote_hit_bytes: 0,
            storage_reads_by_epoch: Vec::new(),
            storage_bytes_by_epoch: Vec::new(),
            object_requests_by_epoch: Vec::new(),
            peer_plan: Mode::default(),
            assign: Mode::default(),
            cluster_plan: None,
            read_retries: 0,
            reads_recovered: 0,
            cache_forms: Mode::default(),
            form_costs: None,
            hits_encoded: self.hits,
            hits_decoded: 0,
            decoded_hits_served: 0,
            decode_saved_seconds: 0.0,
            images_kept: 0,
            decoded_again: 0,
            peak_cached_encoded_bytes: 0,
            peak_cached_decoded_bytes: 0,
            disk_cache: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_match_sorted_data() {
        let mut h = RatioHistogram::new();
        let data: Vec<f64> = (0..1000).map(|i| 1.0 + f64::from(i) * 0.002).collect();
        for &x in &data {
            h.record(x);
        }
        for q in [0.5, 0.95] {
            let exact = data[(q * 1000.0) as usize - 1];
            assert!((h.quantile(q) - exact).abs() <= 2.0 * BIN_WIDTH, "q={q}");
        }
    }

    #[test]
    fn an_iteration_counts_once_every_rank_took_it() {
        let mut c = Collector::new(2, 1, 0);
        let m = |rank, load_s| IterationMetrics {
            rank,
            load_s,
            ..Default::default()
        };
        c.batch_taken(m(0, 1.0), 4, false);
        assert_eq!(c.imbalance.total, 0);
        c.batch_taken(m(1, 3.0), 4, false);
        assert_eq!(c.imbalance.total, 1);
        assert!((c.summary().imbalance_p50 - 1.5).abs() < 0.002);
    }

    #[test]
    fn job_stall_counts_each_iterations_longest_wait() {
        let mut c = Collector::new(2, 1, 0);
        let m = |iteration, rank, stall_s| IterationMetrics {
            iteration,
            rank,
            stall_s,
            ..Default::default()
        };
        // One rank late by 3 s while the other waits 1 s, then both waiting 2 s.
        c.batch_taken(m(0, 0, 3.0), 4, false);
        c.batch_taken(m(0, 1, 1.0), 4, false);
        c.batch_taken(m(1, 0, 2.0), 4, false);
        assert_eq!(
            c.job_stall_s, 3.0,
            "an iteration counts once all ranks took it"
        );
        c.batch_taken(m(1, 1, 2.0), 4, false);
        assert_eq!(c.job_stall_s, 5.0);
        assert_eq!(c.stall, Duration::from_secs(8));
    }
}
