//! The pipeline: planner, I/O dispatcher, decode workers and per-rank reorder buffers.
//!
//! The planner thread walks the node stream in canonical order and makes every cache
//! decision, so hits and misses are a pure function of the inputs. A miss becomes a read (to
//! the dispatcher, or to a worker that reads and then decodes); a hit waits on the slot the
//! earlier miss fills. Decoded samples land in their rank's reorder buffer, which hands out
//! whole batches in plan order.
//!
//! The dispatcher receives a window's reads at once and orders them by [`IoOrder`]. Under
//! the default deadline order the node's reads form one queue: the oldest iteration first,
//! and within it each read at the fraction of its batch's storage bytes it completes, so on a
//! shared device every rank's batch finishes its reads at about the same time. Held to
//! per-rank io_depth shares instead, each rank streams its own reads at the rate of its
//! share, and ranks drift apart by whole reads whatever the shares are.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fs::File;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{select, Receiver, Sender};
use lobster_cache::{Planner, StreamSource};
use lobster_sched::{AllocConfig, Allocator, Budgets, CostModel, RankLoad, Tier};
use lobster_uring::{Completion, FileId, OpenOptions, ReadRequest, Reader};
use slab::Slab;

use crate::config::{CachePolicy, Execution, IoOrder, LoaderConfig, Schedule};
use crate::dataset::{Dataset, SampleMeta};
use crate::emulate::Device;
use crate::error::{Cause, Error};
use crate::faults::{self, AttemptError, Decision, ErrorPolicy, FaultInjection, READ_ATTEMPTS};
use crate::metrics::{AllocationRecord, Collector, IterationMetrics, SkippedSample};
use crate::sampler::DistributedSampler;

/// The user's decode function, type-erased.
pub(crate) type DecodeFn<T> = Arc<dyn Fn(&[u8], &SampleMeta) -> Result<T, Cause> + Send + Sync>;

/// Locks a mutex; a panic elsewhere must not hide the state from the threads shutting down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The node's shape in the job and the canonical order of its stream.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(crate) sampler: DistributedSampler,
    pub(crate) world: usize,
    pub(crate) first_rank: usize,
    pub(crate) ranks: usize,
    pub(crate) batch: usize,
    pub(crate) per_rank: usize,
    pub(crate) epochs: u32,
}

impl Layout {
    pub(crate) fn iterations(&self) -> usize {
        self.per_rank.div_ceil(self.batch)
    }

    /// Iterations since the first epoch's first: a batch's place in the whole run.
    pub(crate) fn step(&self, epoch: u32, iteration: usize) -> u64 {
        u64::from(epoch) * self.iterations() as u64 + iteration as u64
    }

    pub(crate) fn batch_len(&self, iteration: usize) -> usize {
        self.batch.min(self.per_rank - iteration * self.batch)
    }

    /// Visits the node's accesses of one epoch in canonical order:
    /// (iteration, local rank, position in batch, sample).
    pub(crate) fn walk_epoch(&self, epoch: u32, mut visit: impl FnMut(usize, usize, usize, u32)) {
        let order = self.sampler.epoch_indices(epoch);
        for iteration in 0..self.iterations() {
            for rank in 0..self.ranks {
                for pos in 0..self.batch_len(iteration) {
                    let k = iteration * self.batch + pos;
                    visit(
                        iteration,
                        rank,
                        pos,
                        order[self.first_rank + rank + k * self.world],
                    );
                }
            }
        }
    }
}

impl StreamSource for Layout {
    fn epochs(&self) -> u32 {
        self.epochs
    }

    fn fill_epoch(&self, epoch: u32, out: &mut Vec<u32>) {
        self.walk_epoch(epoch, |_, _, _, sample| out.push(sample));
    }
}

/// Bytes of one sample, or why they could not be had. Shared by every access that needs them.
type Loaded = Result<Bytes, Error>;

/// Where a sample's bytes will appear; hits and the miss that reads it wait on the same slot.
#[derive(Debug)]
struct Slot {
    state: Mutex<SlotState>,
}

#[derive(Debug)]
enum SlotState {
    Pending(Vec<Task>),
    Ready(Loaded),
}

impl Slot {
    fn new() -> Arc<Self> {
        Arc::new(Slot {
            state: Mutex::new(SlotState::Pending(Vec::new())),
        })
    }
}

/// One access on its way to a rank's batch.
#[derive(Debug)]
struct Task {
    /// Position in the node stream: lower goes first in every queue.
    seq: u64,
    epoch: u32,
    iteration: u32,
    rank: usize,
    pos: usize,
    sample: u32,
    /// `None` while the task waits in its slot's list: a waiting task holding its slot would
    /// make a reference cycle, leaked when the loader stops before the slot is filled.
    slot: Option<Arc<Slot>>,
    /// The slot's bytes are kept in the cache: store a right-sized copy, not a pool buffer.
    admitted: bool,
    /// ReadThenDecode: the worker that takes this task reads the sample itself.
    read_here: bool,
    /// A cache hit: its bytes come from the read that admitted the sample.
    hit: bool,
}

/// A task whose bytes are known, waiting for a decode thread.
#[derive(Debug)]
struct Ready {
    task: Task,
    bytes: Loaded,
}

// Queues are min-heaps on the stream position, so the oldest iteration is served first.
impl PartialEq for Ready {
    fn eq(&self, other: &Self) -> bool {
        self.task.seq == other.task.seq
    }
}

impl Eq for Ready {}

impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ready {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.task.seq.cmp(&self.task.seq)
    }
}

/// A batch being assembled in a rank's reorder buffer.
#[derive(Debug)]
struct PendingBatch<T> {
    epoch: u32,
    iteration: u32,
    items: Vec<Option<Result<crate::Sample<T>, Error>>>,
    remaining: usize,
    issued: Instant,
    ready_at: Option<Instant>,
    metrics: IterationMetrics,
}

#[derive(Debug)]
struct RankBuffer<T> {
    batches: VecDeque<PendingBatch<T>>,
    /// The planner has queued every batch of this rank.
    planned_all: bool,
    prev_ready: Option<Instant>,
}

struct RankShared<T> {
    buffer: Mutex<RankBuffer<T>>,
    ready: Condvar,
    /// The rank's handle is gone: its batches are dropped, and its reads that no other access
    /// needs are not made. Set under the buffer's lock, so a holder of the lock sees it settled.
    detached: AtomicBool,
}

/// Decode queues and who serves them.
#[derive(Debug)]
struct DecodeState {
    queues: Vec<BinaryHeap<Ready>>,
    /// Worker index to the rank it serves first.
    assignment: Vec<usize>,
}

/// Backpressure: how far each rank's training thread has got.
#[derive(Debug)]
struct Progress {
    /// Batches taken per rank (counted across epochs); `usize::MAX` once detached.
    taken: Vec<usize>,
}

/// State every pipeline thread and rank handle shares.
pub(crate) struct Shared<T> {
    pub(crate) stop: AtomicBool,
    /// Accesses planned and not yet delivered to a reorder buffer.
    outstanding: AtomicUsize,
    planner_done: AtomicBool,
    ranks: Vec<RankShared<T>>,
    decode: Mutex<DecodeState>,
    decode_cv: Condvar,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
    pub(crate) collector: Mutex<Collector>,
    model: Mutex<CostModel>,
    /// A failure that ends the pipeline (planner or dispatcher error).
    failure: Mutex<Option<Error>>,
    error_policy: ErrorPolicy,
    /// The node's accesses per epoch, the base of a fractional failure budget.
    epoch_accesses: u64,
    /// An epoch went over its failure budget: every rank's next batch reports it.
    budget_failure: Mutex<Option<Error>>,
    pub(crate) faults: FaultCounters,
}

/// Counts of the fault paths, touched only when something fails or faults are injected.
#[derive(Debug, Default)]
pub(crate) struct FaultCounters {
    /// Read attempts the fault injector changed.
    pub(crate) injected: AtomicU64,
    /// Read attempts retried after a transient failure.
    pub(crate) retries: AtomicU64,
    /// Reads that succeeded after at least one retry.
    pub(crate) recovered: AtomicU64,
}

impl<T> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

/// A sample read request for the dispatcher.
#[derive(Debug)]
struct IoRequest {
    seq: u64,
    /// Iterations since the first epoch's first: the read's deadline.
    step: u64,
    /// Parts per million of its batch's storage bytes read once this read is done.
    finish_ppm: u32,
    /// The sample's size: of reads that end their batches together, the largest goes first.
    bytes: u64,
    epoch: u32,
    rank: usize,
    sample: u32,
    slot: Arc<Slot>,
    admitted: bool,
}

#[derive(Debug)]
enum ToDispatcher {
    /// A window's reads, together so that their order is chosen over the whole window.
    Reads(Vec<IoRequest>),
    /// io_depth per rank for the requests from stream position `from_seq` on.
    Depths { from_seq: u64, io_depth: Vec<u32> },
}

/// Everything the threads need, fixed at build time.
pub(crate) struct Context<T> {
    pub(crate) layout: Layout,
    pub(crate) config: LoaderConfig,
    pub(crate) dataset: Arc<Dataset>,
    pub(crate) decode: DecodeFn<T>,
    pub(crate) device: Option<Arc<Device>>,
}

/// The running pipeline: its threads and shared state.
pub(crate) struct Pipeline<T> {
    pub(crate) shared: Arc<Shared<T>>,
    threads: Vec<JoinHandle<()>>,
    reader: Option<Reader>,
    pub(crate) layout: Layout,
}

impl<T> std::fmt::Debug for Pipeline<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

/// Open files the dispatcher keeps at most; least recently opened idle ones close first.
const OPEN_FILES_MAX: usize = 1024;

impl<T: Send + 'static> Pipeline<T> {
    pub(crate) fn start(ctx: Context<T>, reader: Option<Reader>) -> Result<Self, Error> {
        let ranks = ctx.layout.ranks;
        let config = &ctx.config;
        let workers = config.decode_threads;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            outstanding: AtomicUsize::new(0),
            planner_done: AtomicBool::new(false),
            ranks: (0..ranks)
                .map(|_| RankShared {
                    buffer: Mutex::new(RankBuffer {
                        batches: VecDeque::new(),
                        planned_all: false,
                        prev_ready: None,
                    }),
                    ready: Condvar::new(),
                    detached: AtomicBool::new(false),
                })
                .collect(),
            decode: Mutex::new(DecodeState {
                queues: (0..ranks).map(|_| BinaryHeap::new()).collect(),
                assignment: spread(&equal_split(workers as u32, ranks)),
            }),
            decode_cv: Condvar::new(),
            progress: Mutex::new(Progress {
                taken: vec![0; ranks],
            }),
            progress_cv: Condvar::new(),
            collector: Mutex::new(Collector::new(ranks, ctx.layout.epochs)),
            model: Mutex::new(CostModel::new()),
            failure: Mutex::new(None),
            error_policy: config.error_policy,
            epoch_accesses: (ctx.layout.per_rank * ranks) as u64,
            budget_failure: Mutex::new(None),
            faults: FaultCounters::default(),
        });
        let ctx = Arc::new(ctx);
        let mut threads = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| Error::Stopped {
                    reason: format!("cannot start a thread: {e}"),
                })
        };
        let (to_dispatcher, dispatcher_rx) = crossbeam_channel::unbounded();
        if let Some(reader) = &reader {
            let (c, s, r) = (ctx.clone(), shared.clone(), reader.clone());
            threads.push(spawn(
                "lobster-dispatch".into(),
                Box::new(move || {
                    let result = dispatcher(&c, &s, &r, dispatcher_rx);
                    if let Err(e) = result {
                        fail(&s, e);
                    }
                }),
            )?);
        }
        for w in 0..workers {
            let (c, s) = (ctx.clone(), shared.clone());
            threads.push(spawn(
                format!("lobster-decode-{w}"),
                Box::new(move || decode_worker(&c, &s, w)),
            )?);
        }
        {
            let (c, s) = (ctx.clone(), shared.clone());
            let tx = reader.is_some().then_some(to_dispatcher);
            threads.push(spawn(
                "lobster-plan".into(),
                Box::new(move || {
                    if let Err(e) = planner(&c, &s, tx) {
                        fail(&s, e);
                    }
                    s.planner_done.store(true, Ordering::SeqCst);
                    s.decode_cv.notify_all();
                }),
            )?);
        }
        Ok(Pipeline {
            shared,
            threads,
            reader,
            layout: ctx.layout.clone(),
        })
    }
}

impl<T> Pipeline<T> {
    /// Stops every thread and waits for them; in-flight reads are waited for by the reader.
    pub(crate) fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        wake_all(&self.shared);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.reader = None;
    }
}

impl<T> Drop for Pipeline<T> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn wake_all<T>(shared: &Shared<T>) {
    // Take each lock before notifying so a thread between its check and its wait is not missed.
    drop(lock(&shared.decode));
    shared.decode_cv.notify_all();
    drop(lock(&shared.progress));
    shared.progress_cv.notify_all();
    for r in &shared.ranks {
        drop(lock(&r.buffer));
        r.ready.notify_all();
    }
}

/// Records a pipeline failure and stops; rank handles report it.
fn fail<T>(shared: &Shared<T>, error: Error) {
    lock(&shared.failure).get_or_insert(error);
    shared.stop.store(true, Ordering::SeqCst);
    wake_all(shared);
}

/// `budget` split as evenly as possible over `ranks`, the remainder to the first ranks.
pub(crate) fn equal_split(budget: u32, ranks: usize) -> Vec<u32> {
    let n = ranks as u32;
    (0..n)
        .map(|r| budget / n + u32::from(r < budget % n))
        .collect()
}

/// Per-rank thread counts to a worker-to-rank assignment.
fn spread(threads: &[u32]) -> Vec<usize> {
    threads
        .iter()
        .enumerate()
        .flat_map(|(r, &t)| std::iter::repeat_n(r, t as usize))
        .collect()
}

/// One access the planner decided, not yet handed out.
struct Planned {
    epoch: u32,
    iteration: usize,
    rank: usize,
    pos: usize,
    sample: u32,
    slot: Arc<Slot>,
    hit: bool,
    admitted: bool,
}

/// The cache decisions, with or without a cache.
enum Decider {
    Cache(Box<Planner<Layout>>),
    NoCache,
}

fn planner<T: Send + 'static>(
    ctx: &Context<T>,
    shared: &Shared<T>,
    to_dispatcher: Option<Sender<ToDispatcher>>,
) -> Result<(), Error> {
    let layout = &ctx.layout;
    let config = &ctx.config;
    let samples = ctx.dataset.samples();
    let sizes: Arc<[u32]> = samples
        .iter()
        .map(|s| {
            u32::try_from(s.size_bytes).map_err(|_| {
                Error::dataset(
                    &*s.path,
                    format!(
                        "{} bytes: samples of 4 GiB or more are not supported",
                        s.size_bytes
                    ),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    let engine = |part: &'static str| {
        move |e: Box<dyn std::error::Error + Send + Sync>| Error::Engine {
            part,
            cause: Arc::from(e),
        }
    };
    let mut decider = match config.cache_policy {
        CachePolicy::None => Decider::NoCache,
        policy => {
            let kind = match policy {
                CachePolicy::Reuse => lobster_cache::PolicyKind::Reuse,
                CachePolicy::Lru => lobster_cache::PolicyKind::Lru,
                _ => lobster_cache::PolicyKind::Static,
            };
            let p = Planner::new(
                layout.clone(),
                sizes.clone(),
                config.cache_capacity_bytes,
                kind,
            )
            .map_err(|e| engine("cache planner")(Box::new(e)))?;
            Decider::Cache(Box::new(p))
        }
    };
    let mut allocator = match config.schedule {
        Schedule::Allocate { hysteresis } if config.execution == Execution::Pipelined => {
            let mut alloc = AllocConfig::new(Budgets {
                io_depth_total: config.io_depth_budget as u32,
                decode_threads_total: config.decode_threads as u32,
            });
            alloc.hysteresis_fraction = hysteresis;
            Some(Allocator::new(alloc).map_err(|e| engine("allocator")(Box::new(e)))?)
        }
        _ => None,
    };
    // The node's cache: the slot of every sample the policy holds.
    let mut cached: HashMap<u32, Arc<Slot>> = HashMap::new();
    let mut evicted = Vec::new();
    let iterations = layout.iterations();
    let mut window: Vec<Planned> = Vec::new();
    let mut global_iteration = 0usize;
    let mut seq = 0u64;
    for epoch in 0..layout.epochs {
        // The node stream of this epoch, grouped by window.
        let mut accesses = Vec::with_capacity(layout.per_rank * layout.ranks);
        layout.walk_epoch(epoch, |it, rank, pos, sample| {
            accesses.push((it, rank, pos, sample))
        });
        let mut next = 0;
        let mut first = 0;
        while first < iterations {
            let last = (first + config.window_iterations).min(iterations);
            // A window wider than the prefetch distance is planned whole, or its first batch
            // would wait for batches not yet planned.
            wait_for_room(
                shared,
                global_iteration + (last - first),
                config.prefetch_iterations.max(config.window_iterations),
            )?;
            window.clear();
            while next < accesses.len() && accesses[next].0 < last {
                let (iteration, rank, pos, sample) = accesses[next];
                next += 1;
                let (hit, admitted) = match &mut decider {
                    Decider::NoCache => (false, false),
                    Decider::Cache(p) => {
                        let d = p
                            .next(&mut evicted)
                            .map_err(|e| engine("cache planner")(Box::new(e)))?
                            .ok_or_else(|| Error::Stopped {
                                reason: "cache planner ended early".into(),
                            })?;
                        assert_eq!(
                            d.sample, sample,
                            "the planner and the node stream disagree at {}",
                            d.position
                        );
                        (d.hit, d.admitted)
                    }
                };
                let slot = if hit {
                    cached.get(&sample).cloned().expect("a hit is cached")
                } else {
                    Slot::new()
                };
                for e in evicted.drain(..) {
                    cached.remove(&e);
                }
                if admitted {
                    cached.insert(sample, slot.clone());
                }
                window.push(Planned {
                    epoch,
                    iteration,
                    rank,
                    pos,
                    sample,
                    slot,
                    hit,
                    admitted,
                });
            }
            let issued = Instant::now();
            lock(&shared.collector).epoch_issued(epoch, issued);
            if let Some(alloc) = allocator.as_mut() {
                let record = allocate(ctx, shared, alloc, &window, epoch, first)?;
                if let (Some(tx), IoOrder::Shares) = (&to_dispatcher, config.io_order) {
                    let io_depth = record.io_depth.clone();
                    let _ = tx.send(ToDispatcher::Depths {
                        from_seq: seq + 1,
                        io_depth,
                    });
                }
                lock(&shared.decode).assignment = spread(&record.decode_threads);
                lock(&shared.collector).allocation(record);
            }
            open_batches(ctx, shared, &window, epoch, first, last, issued);
            let mut reads = Vec::new();
            let mut tasks = Vec::with_capacity(window.len());
            for p in window.drain(..) {
                seq += 1;
                shared.outstanding.fetch_add(1, Ordering::SeqCst);
                let task = Task {
                    seq,
                    epoch: p.epoch,
                    iteration: p.iteration as u32,
                    rank: p.rank,
                    pos: p.pos,
                    sample: p.sample,
                    slot: Some(p.slot.clone()),
                    admitted: p.admitted,
                    read_here: !p.hit && to_dispatcher.is_none(),
                    hit: p.hit,
                };
                tasks.push(task);
                if !p.hit && to_dispatcher.is_some() {
                    reads.push(IoRequest {
                        seq,
                        step: layout.step(p.epoch, p.iteration),
                        finish_ppm: 0,
                        bytes: samples[p.sample as usize].size_bytes,
                        epoch: p.epoch,
                        rank: p.rank,
                        sample: p.sample,
                        slot: p.slot,
                        admitted: p.admitted,
                    });
                }
            }
            // Tasks whose bytes are at hand start decoding as soon as they are queued: queue
            // them position by position across the ranks, so a window of hits does not decode
            // rank 0's batch before rank 3's.
            tasks.sort_by_key(|t| (t.iteration, t.pos, t.rank));
            for task in tasks {
                if task.read_here {
                    push_ready(
                        shared,
                        Ready {
                            task,
                            bytes: Ok(Bytes::new()),
                        },
                    );
                } else {
                    wait_on_slot(shared, task);
                }
            }
            if let Some(tx) = &to_dispatcher {
                if config.io_order == IoOrder::Deadline {
                    set_read_fractions(&mut reads);
                }
                if !reads.is_empty() && tx.send(ToDispatcher::Reads(reads)).is_err() {
                    return Err(Error::Stopped {
                        reason: "the I/O dispatcher ended".into(),
                    });
                }
            }
            global_iteration += last - first;
            first = last;
        }
    }
    for r in &shared.ranks {
        lock(&r.buffer).planned_all = true;
        r.ready.notify_all();
    }
    Ok(())
}

/// Sets each read's place in the [`IoOrder::Deadline`] order: the fraction, in parts per
/// million, of its batch's storage bytes read once it is. `reads` are in canonical order, so
/// each batch's reads are adjacent.
fn set_read_fractions(reads: &mut [IoRequest]) {
    for batch in reads.chunk_by_mut(|a, b| (a.step, a.rank) == (b.step, b.rank)) {
        let total_bytes: u64 = batch.iter().map(|r| r.bytes).sum();
        let mut read_bytes = 0;
        for r in batch {
            read_bytes += r.bytes;
            // A batch of empty samples finishes with its first read.
            r.finish_ppm = (read_bytes * 1_000_000)
                .checked_div(total_bytes)
                .unwrap_or(1_000_000) as u32;
        }
    }
}

/// Blocks until every rank has taken enough batches for `until` to be within the window.
fn wait_for_room<T>(shared: &Shared<T>, until: usize, prefetch: usize) -> Result<(), Error> {
    let mut progress = lock(&shared.progress);
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return Err(stopped());
        }
        let slowest = progress.taken.iter().copied().min().unwrap_or(usize::MAX);
        if until <= slowest.saturating_add(prefetch) {
            return Ok(());
        }
        progress = shared
            .progress_cv
            .wait(progress)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// Runs lobster-sched on the window's exact per-rank load.
fn allocate<T>(
    ctx: &Context<T>,
    shared: &Shared<T>,
    allocator: &mut Allocator,
    window: &[Planned],
    epoch: u32,
    first: usize,
) -> Result<AllocationRecord, Error> {
    let mut loads = vec![RankLoad::default(); ctx.layout.ranks];
    let samples = ctx.dataset.samples();
    for p in window {
        let bytes = samples[p.sample as usize].size_bytes;
        let tier = if p.hit { Tier::Cache } else { Tier::Storage };
        loads[p.rank].add_read(tier, bytes);
        loads[p.rank].add_decode(bytes);
    }
    let model = lock(&shared.model);
    let allocation = allocator
        .allocate(&loads, &model)
        .map_err(|e| Error::Engine {
            part: "allocator",
            cause: Arc::new(e),
        })?;
    drop(model);
    let report = allocation.imbalance();

    let mut threads: Vec<u32> = allocation.ranks.iter().map(|r| r.decode_threads).collect();
    // Threads the allocator left spare still decode: give them to the slowest ranks.
    let spare = ctx.config.decode_threads as u32 - threads.iter().sum::<u32>();
    let mut order: Vec<usize> = (0..threads.len()).collect();
    order.sort_by(|&a, &b| {
        allocation.ranks[b]
            .time_s
            .total_cmp(&allocation.ranks[a].time_s)
    });
    for i in 0..spare as usize {
        threads[order[i % order.len()]] += 1;
    }
    Ok(AllocationRecord {
        epoch,
        iteration: first as u32,
        io_depth: allocation.ranks.iter().map(|r| r.io_depth).collect(),
        decode_threads: threads,
        predicted_imbalance_equal: report.before,
        predicted_imbalance: report.after,
    })
}

/// Queues the window's batches in the reorder buffers, with their planned hit/miss figures.
fn open_batches<T>(
    ctx: &Context<T>,
    shared: &Shared<T>,
    window: &[Planned],
    epoch: u32,
    first: usize,
    last: usize,
    issued: Instant,
) {
    let samples = ctx.dataset.samples();
    let span = last - first;
    // One pass over the window: the figures of batch (rank, iteration) at rank * span + i.
    let mut metrics: Vec<IterationMetrics> = (0..shared.ranks.len() * span)
        .map(|k| IterationMetrics {
            epoch,
            iteration: (first + k % span) as u32,
            rank: k / span,
            ..Default::default()
        })
        .collect();
    for p in window {
        let m = &mut metrics[p.rank * span + (p.iteration - first)];
        let bytes = samples[p.sample as usize].size_bytes;
        if p.hit {
            m.hits += 1;
            m.hit_bytes += bytes;
        } else {
            m.misses += 1;
            m.miss_bytes += bytes;
        }
    }
    let mut metrics = metrics.into_iter();
    for r in &shared.ranks {
        let mut buffer = lock(&r.buffer);
        for (iteration, m) in (first..last).zip(metrics.by_ref()) {
            if r.detached.load(Ordering::SeqCst) {
                continue;
            }
            let len = ctx.layout.batch_len(iteration);
            buffer.batches.push_back(PendingBatch {
                epoch,
                iteration: iteration as u32,
                items: (0..len).map(|_| None).collect(),
                remaining: len,
                issued,
                ready_at: None,
                metrics: m,
            });
        }
    }
}

/// Hands `task` to the decode queues once its slot is filled.
fn wait_on_slot<T>(shared: &Shared<T>, mut task: Task) {
    let slot = task
        .slot
        .take()
        .expect("a task not yet waiting has its slot");
    let mut state = lock(&slot.state);
    match &mut *state {
        SlotState::Pending(waiters) => waiters.push(task),
        SlotState::Ready(loaded) => {
            let bytes = loaded.clone();
            drop(state);
            task.slot = Some(slot.clone());
            push_ready(shared, Ready { task, bytes });
        }
    }
}

/// Fills a slot and releases every task waiting on it.
fn fill_slot<T>(shared: &Shared<T>, slot: &Arc<Slot>, loaded: Loaded, admitted: bool) {
    // A cached sample gets its own copy so pool buffers only hold samples in flight (the
    // pool stays small however large the cache), in whole pages of its own so that evicted
    // samples give their memory back instead of fragmenting the heap over a long run. When
    // the system refuses another mapping (vm.max_map_count), the heap holds the copy.
    let loaded = match loaded {
        Ok(b) if admitted => {
            Ok(lobster_uring::copy_to_pages(&b).unwrap_or_else(|_| Bytes::copy_from_slice(&b)))
        }
        other => other,
    };
    let waiters = {
        let mut state = lock(&slot.state);
        match std::mem::replace(&mut *state, SlotState::Ready(loaded.clone())) {
            SlotState::Pending(waiters) => waiters,
            SlotState::Ready(_) => unreachable!("a slot is filled once"),
        }
    };
    for mut task in waiters {
        task.slot = Some(slot.clone());
        push_ready(
            shared,
            Ready {
                task,
                bytes: loaded.clone(),
            },
        );
    }
}

fn push_ready<T>(shared: &Shared<T>, ready: Ready) {
    let rank = ready.task.rank;
    lock(&shared.decode).queues[rank].push(ready);
    shared.decode_cv.notify_all();
}

/// Takes the next task for worker `w`. Read-then-decode workers belong to their rank, as in
/// PyTorch's DataLoader. A pipelined worker takes its rank's oldest task if that is of the
/// oldest iteration waiting, and otherwise that iteration's task at the earliest batch
/// position of any rank: no thread idles while a batch waits, and none runs ahead on a later
/// iteration of its own rank while another rank's current batch waits.
fn take_task<T>(ctx: &Context<T>, shared: &Shared<T>, w: usize) -> Option<Ready> {
    let pipelined = ctx.config.execution == Execution::Pipelined;
    let step = |t: &Ready| ctx.layout.step(t.task.epoch, t.task.iteration as usize);
    let mut state = lock(&shared.decode);
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return None;
        }
        let own = state.assignment.get(w).copied();
        if pipelined {
            let oldest = (0..state.queues.len())
                .filter_map(|r| state.queues[r].peek().map(|t| ((step(t), t.task.pos), r)))
                .min();
            if let Some(((oldest_step, _), oldest_rank)) = oldest {
                let r = own
                    .filter(|&r| {
                        state.queues[r]
                            .peek()
                            .is_some_and(|t| step(t) <= oldest_step)
                    })
                    .unwrap_or(oldest_rank);
                return state.queues[r].pop();
            }
        } else if let Some(t) = own.and_then(|r| state.queues[r].pop()) {
            return Some(t);
        } else if own.is_none() {
            let oldest = (0..state.queues.len())
                .filter_map(|r| state.queues[r].peek().map(|t| (t.task.seq, r)))
                .min();
            if let Some((_, r)) = oldest {
                return state.queues[r].pop();
            }
        }
        if shared.planner_done.load(Ordering::SeqCst)
            && shared.outstanding.load(Ordering::SeqCst) == 0
        {
            return None;
        }
        state = shared
            .decode_cv
            .wait_timeout(state, Duration::from_millis(100))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

fn decode_worker<T: Send + 'static>(ctx: &Context<T>, shared: &Shared<T>, w: usize) {
    while let Some(Ready { task, bytes }) = take_task(ctx, shared, w) {
        let meta = &ctx.dataset.samples()[task.sample as usize];
        // A planned hit that had to read storage after all (counted as the miss it is).
        let mut reread = false;
        let bytes = if task.read_here {
            let loaded = blocking_read(ctx, shared, meta, task.epoch);
            let slot = task.slot.as_ref().expect("a task read here never waited");
            fill_slot(shared, slot, loaded.clone(), task.admitted);
            loaded
        } else if task.hit && matches!(bytes, Err(Error::Read { .. } | Error::Decode { .. })) {
            // The read that admitted this sample failed, or its bytes failed to decode: read it
            // again for this access rather than fail every later hit on it. The slot keeps the
            // failure, so each such hit reads for itself and its outcome depends only on its
            // own epoch, not on timing.
            reread = true;
            blocking_read(ctx, shared, meta, task.epoch)
        } else {
            bytes
        };
        let mut item = decode_sample(ctx, shared, meta, bytes);
        if task.hit && !reread && matches!(item.0, Err(Error::Decode { .. })) {
            // Cached bytes the admitting access has not yet found bad (it may still be
            // decoding them): the same verdict, reached before the mark.
            reread = true;
            let again = decode_sample(
                ctx,
                shared,
                meta,
                blocking_read(ctx, shared, meta, task.epoch),
            );
            item = (again.0, item.1 + again.1);
        }
        if task.admitted && !task.hit {
            if let Err(e @ Error::Decode { .. }) = &item.0 {
                if let Some(slot) = &task.slot {
                    spoil_slot(slot, e.clone());
                }
            }
        }
        deliver(
            shared,
            &task,
            item.0,
            item.1,
            reread.then_some(meta.size_bytes),
        );
    }
}

/// Checks a sample's length and runs the user's decode function on it.
fn decode_sample<T>(
    ctx: &Context<T>,
    shared: &Shared<T>,
    meta: &SampleMeta,
    bytes: Loaded,
) -> (Result<crate::Sample<T>, Error>, Duration) {
    let started = Instant::now();
    let item = bytes.and_then(|b| {
        if b.len() as u64 != meta.size_bytes {
            return Err(Error::SizeChanged {
                sample: meta.id,
                path: meta.path.to_path_buf(),
                expected_bytes: meta.size_bytes,
                actual_bytes: b.len() as u64,
            });
        }
        // A panicking decoder fails its sample, not the worker: the batch must still come.
        let decoded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (ctx.decode)(&b, meta)))
                .unwrap_or_else(|panic| {
                    Err(Cause::from(
                        Box::<dyn std::error::Error + Send + Sync>::from(panic_message(&panic)),
                    ))
                });
        let value = decoded.map_err(|cause| Error::Decode {
            sample: meta.id,
            path: meta.path.to_path_buf(),
            cause,
        })?;
        Ok(crate::Sample {
            id: meta.id,
            label: meta.label,
            value,
        })
    });
    let elapsed = started.elapsed();
    lock(&shared.model).observe_decode(1, meta.size_bytes, elapsed);
    (item, elapsed)
}

/// The bytes a storage read admitted to the cache failed to decode (corrupt on the way, or bad
/// on disk): later hits read storage instead, and the cached copy is freed.
fn spoil_slot(slot: &Slot, error: Error) {
    let mut state = lock(&slot.state);
    if let SlotState::Ready(loaded @ Ok(_)) = &mut *state {
        *loaded = Err(error);
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".into());
    format!("the decode function panicked: {text}")
}

/// A worker's blocking read (the ReadThenDecode baselines), charged to the emulated tier;
/// transient failures are retried with backoff, up to [`READ_ATTEMPTS`] attempts.
fn blocking_read<T>(ctx: &Context<T>, shared: &Shared<T>, meta: &SampleMeta, epoch: u32) -> Loaded {
    let read = || -> std::io::Result<Vec<u8>> {
        let mut file = File::open(&meta.path)?;
        let mut buf = Vec::with_capacity(meta.size_bytes as usize);
        // One byte more than expected reveals a file that grew since the dataset was opened.
        (&mut file)
            .take(meta.size_bytes + 1)
            .read_to_end(&mut buf)?;
        Ok(buf)
    };
    let mut attempt = 0;
    loop {
        // Reserved before the read, as the dispatcher does, so the tier serves in issue order.
        let due = reserve(ctx, Instant::now(), meta.size_bytes);
        let result = read()
            .map(|bytes| (Bytes::from(bytes), Duration::ZERO))
            .map_err(|cause| AttemptError {
                transient: faults::transient(&cause),
                cause,
            })
            .and_then(|(bytes, delay)| match &ctx.config.fault_injection {
                None => Ok((bytes, delay)),
                Some(f) => inject(shared, f, meta.id, epoch, attempt, bytes),
            });
        // The emulated tier answers, success or failure, when it has served the request.
        let now = Instant::now();
        let answered = answered(due, now);
        match result {
            Ok((bytes, delay)) => {
                if !sleep_unless_stopped(shared, answered + delay) {
                    return Err(stopped());
                }
                if attempt > 0 {
                    shared.faults.recovered.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(bytes);
            }
            Err(e) if e.transient && attempt + 1 < READ_ATTEMPTS => {
                shared.faults.retries.fetch_add(1, Ordering::Relaxed);
                attempt += 1;
                if !sleep_unless_stopped(shared, answered + faults::backoff(attempt)) {
                    return Err(stopped());
                }
            }
            Err(e) => {
                if !sleep_unless_stopped(shared, answered) {
                    return Err(stopped());
                }
                return Err(Error::Read {
                    sample: meta.id,
                    path: meta.path.to_path_buf(),
                    offset: 0,
                    cause: Arc::new(e.cause),
                });
            }
        }
    }
}

/// Waits until `deadline` (emulated storage time, an injected delay, a retry's backoff) unless
/// the loader stops first, so a drop never waits for a slow read; `false` if it stopped.
fn sleep_unless_stopped<T>(shared: &Shared<T>, deadline: Instant) -> bool {
    // Nothing to wait for (no emulated tier, no injected delay): no need for the shared lock.
    if Instant::now() >= deadline {
        return !shared.stop.load(Ordering::SeqCst);
    }
    // The decode condition variable: `wake_all` notifies it under its lock when stopping.
    let mut state = lock(&shared.decode);
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        state = shared
            .decode_cv
            .wait_timeout(state, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// The error of a rank or stage that ends because the loader was dropped.
fn stopped() -> Error {
    Error::Stopped {
        reason: "loader dropped".into(),
    }
}

/// Puts a decoded sample in its batch and wakes the rank if the batch is complete.
fn deliver<T>(
    shared: &Shared<T>,
    task: &Task,
    item: Result<crate::Sample<T>, Error>,
    decode: Duration,
    reread_bytes: Option<u64>,
) {
    let rank = &shared.ranks[task.rank];
    let mut buffer = lock(&rank.buffer);
    if let Some(batch) = buffer
        .batches
        .iter_mut()
        .find(|b| b.epoch == task.epoch && b.iteration == task.iteration)
    {
        debug_assert!(
            batch.items[task.pos].is_none(),
            "a position is delivered once"
        );
        if let Some(bytes) = reread_bytes {
            // A planned hit that read storage: the batch's figures say where its bytes came from.
            let m = &mut batch.metrics;
            m.hits -= 1;
            m.hit_bytes -= bytes;
            m.misses += 1;
            m.miss_bytes += bytes;
        }
        batch.items[task.pos] = Some(item);
        batch.remaining -= 1;
        batch.metrics.decode_s += decode.as_secs_f64();
        if batch.remaining == 0 {
            batch.ready_at = Some(Instant::now());
            rank.ready.notify_all();
        }
    }
    drop(buffer);
    if shared.outstanding.fetch_sub(1, Ordering::SeqCst) == 1 {
        shared.decode_cv.notify_all();
    }
}

/// A read handed to the reader, until it completes on the (emulated) storage.
#[derive(Debug)]
struct InFlight {
    req: IoRequest,
    file: FileId,
    /// 0 for the first attempt; a retry waiting for its backoff keeps its io_depth slot.
    attempt: u32,
    issued: Instant,
    /// When the emulated tier delivers this attempt: reserved at submission, so the tier
    /// serves requests in the order they were issued.
    due: Option<Instant>,
    /// The attempt's outcome, held until the emulated tier delivers it.
    parked: Option<Loaded>,
}

/// The dispatcher's reads between submission and delivery, and what they hold: an io_depth
/// slot (counted per rank) and an open file.
#[derive(Debug)]
struct Reads {
    slab: Slab<InFlight>,
    in_flight: Vec<u32>,
    files: OpenFiles,
    /// Emulated completions and retry backoffs, by due time.
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
}

impl Reads {
    fn new(ranks: usize) -> Self {
        Reads {
            slab: Slab::new(),
            in_flight: vec![0; ranks],
            files: OpenFiles::default(),
            timers: BinaryHeap::new(),
        }
    }

    /// Takes a read that holds an io_depth slot and an open file.
    fn start(&mut self, req: IoRequest, file: FileId) -> usize {
        self.in_flight[req.rank] += 1;
        self.slab.insert(InFlight {
            req,
            file,
            attempt: 0,
            issued: Instant::now(),
            due: None,
            parked: None,
        })
    }

    /// Ends read `key`, giving back its io_depth slot and its file.
    fn retire(&mut self, key: usize) -> InFlight {
        let done = self.slab.remove(key);
        self.in_flight[done.req.rank] -= 1;
        self.files.release(done.req.sample);
        done
    }
}

/// Open files by sample, closed least-recently-opened first when idle.
#[derive(Debug, Default)]
struct OpenFiles {
    by_sample: HashMap<u32, (FileId, usize)>,
    order: VecDeque<u32>,
}

impl OpenFiles {
    fn acquire(
        &mut self,
        reader: &Reader,
        meta: &SampleMeta,
        direct: bool,
    ) -> Result<FileId, Error> {
        if let Some((file, users)) = self.by_sample.get_mut(&meta.id) {
            *users += 1;
            return Ok(*file);
        }
        while self.by_sample.len() >= OPEN_FILES_MAX {
            let Some(i) = self.order.iter().position(|s| self.by_sample[s].1 == 0) else {
                break;
            };
            let sample = self.order.remove(i).expect("position is in range");
            let (file, _) = self
                .by_sample
                .remove(&sample)
                .expect("order mirrors the map");
            // A close error leaves nothing to undo: the id is gone either way.
            let _ = reader.close(file);
        }
        let file = reader
            .open(&meta.path, OpenOptions { direct })
            .map_err(|e| Error::Read {
                sample: meta.id,
                path: meta.path.to_path_buf(),
                offset: 0,
                cause: Arc::new(e),
            })?;
        // A file that changed since the dataset was opened is reported as such, not read as
        // a short or partial sample.
        let size = std::fs::metadata(&meta.path).map(|m| m.len());
        if let Ok(actual_bytes) = size {
            if actual_bytes != meta.size_bytes {
                let _ = reader.close(file);
                return Err(Error::SizeChanged {
                    sample: meta.id,
                    path: meta.path.to_path_buf(),
                    expected_bytes: meta.size_bytes,
                    actual_bytes,
                });
            }
        }
        self.by_sample.insert(meta.id, (file, 1));
        self.order.push_back(meta.id);
        Ok(file)
    }

    fn release(&mut self, sample: u32) {
        if let Some((_, users)) = self.by_sample.get_mut(&sample) {
            *users -= 1;
        }
    }
}

/// Issues the node's storage reads in [`IoOrder`], holding the reads in flight (emulated time
/// included) to the node's io_depth budget or each rank's share of it, and turns completions
/// into filled slots.
fn dispatcher<T>(
    ctx: &Context<T>,
    shared: &Shared<T>,
    reader: &Reader,
    requests: Receiver<ToDispatcher>,
) -> Result<(), Error> {
    let ranks = ctx.layout.ranks;
    let samples = ctx.dataset.samples();
    let budget = ctx.config.io_depth_budget as u32;
    // Under the deadline order the node's reads share the whole budget, so the engine holds
    // no rank to a share of it.
    let mut depth: Vec<u32> = match ctx.config.io_order {
        IoOrder::Deadline => vec![budget; ranks],
        IoOrder::Shares => equal_split(budget, ranks),
    };
    let mut pending: Vec<VecDeque<IoRequest>> = (0..ranks).map(|_| VecDeque::new()).collect();
    let mut reads = Reads::new(ranks);
    let mut allocations: VecDeque<(u64, Vec<u32>)> = VecDeque::new();
    let completions = reader.completions();
    let mut requests = Some(requests);
    for (r, &d) in depth.iter().enumerate() {
        set_depth(reader, r, d)?;
    }
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        // A window's allocation takes effect when its first request is the oldest pending one,
        // not when it was planned, which is up to the prefetch window earlier.
        let oldest = (0..ranks)
            .filter_map(|r| pending[r].front().map(|q| q.seq))
            .min();
        while let Some((from_seq, _)) = allocations.front() {
            if oldest.is_none_or(|o| o < *from_seq) {
                break;
            }
            let (_, d) = allocations.pop_front().expect("front checked");
            for (r, &v) in d.iter().enumerate() {
                set_depth(reader, r, v)?;
            }
            depth = d;
        }
        while let Some(r) = next_read(
            ctx.config.io_order,
            &pending,
            &reads.in_flight,
            &depth,
            budget,
        ) {
            let req = pending[r].pop_front().expect("front checked");
            if !req.admitted && shared.ranks[req.rank].detached.load(Ordering::SeqCst) {
                // Only the dropped rank's own access waits on this slot.
                fill_slot(shared, &req.slot, Err(stopped()), false);
                continue;
            }
            let meta = &samples[req.sample as usize];
            match reads.files.acquire(reader, meta, ctx.config.direct) {
                Ok(file) => {
                    let key = reads.start(req, file);
                    debug_assert!(
                        ctx.config.io_order != IoOrder::Deadline
                            || reads.in_flight.iter().sum::<u32>() <= budget,
                        "the node holds at most its io_depth budget in flight"
                    );
                    submit(ctx, shared, reader, &mut reads, key);
                }
                Err(e) => fill_slot(shared, &req.slot, Err(e), false),
            }
        }
        if requests.is_none() && reads.slab.is_empty() && pending.iter().all(VecDeque::is_empty) {
            return Ok(());
        }
        let now = Instant::now();
        let wait = reads
            .timers
            .peek()
            .map_or(Duration::from_millis(100), |Reverse((t, _))| {
                t.saturating_duration_since(now)
            })
            .min(Duration::from_millis(100));
        let never = crossbeam_channel::never();
        let rx = requests.as_ref().unwrap_or(&never);
        select! {
            recv(rx) -> msg => match msg {
                Ok(ToDispatcher::Reads(window)) => {
                    for req in window {
                        pending[req.rank].push_back(req);
                    }
                }
                Ok(ToDispatcher::Depths { from_seq, io_depth }) => {
                    allocations.push_back((from_seq, io_depth));
                }
                Err(_) => requests = None,
            },
            recv(completions) -> c => {
                let Ok(c) = c else {
                    return Err(Error::Stopped { reason: "the reader's completion queue closed".into() });
                };
                on_completion(ctx, shared, &mut reads, c);
            },
            default(wait) => {}
        }
        let now = Instant::now();
        while let Some(Reverse((t, key))) = reads.timers.peek().copied() {
            if t > now {
                break;
            }
            reads.timers.pop();
            match reads.slab[key].parked.take() {
                Some(loaded) => {
                    let done = reads.retire(key);
                    finish_with(ctx, shared, done, loaded);
                }
                // A retry's backoff is over.
                None => submit(ctx, shared, reader, &mut reads, key),
            }
        }
    }
}

/// The rank whose next pending read goes to the reader now, if any. Both orders serve the
/// current iteration before the prefetched ones.
fn next_read(
    order: IoOrder,
    pending: &[VecDeque<IoRequest>],
    in_flight: &[u32],
    depth: &[u32],
    budget: u32,
) -> Option<usize> {
    let fronts = || {
        pending
            .iter()
            .enumerate()
            .filter_map(|(r, q)| q.front().map(|q| (r, q)))
    };
    match order {
        IoOrder::Deadline => {
            if in_flight.iter().sum::<u32>() >= budget {
                return None;
            }
            fronts()
                .min_by_key(|&(r, q)| (q.step, q.finish_ppm, Reverse(q.bytes), r))
                .map(|(r, _)| r)
        }
        IoOrder::Shares => fronts()
            .filter(|&(r, _)| in_flight[r] < depth[r])
            .min_by_key(|(_, q)| q.seq)
            .map(|(r, _)| r),
    }
}

/// Reserves the emulated tier (if any) for a read of `bytes` issued at `issued`: when it is due.
fn reserve<T>(ctx: &Context<T>, issued: Instant, bytes: u64) -> Option<Instant> {
    ctx.device.as_ref().map(|d| d.finish_time(issued, bytes))
}

/// When the emulated tier answers an attempt it is due to serve at `due` (now without one).
fn answered(due: Option<Instant>, now: Instant) -> Instant {
    due.map_or(now, |due| due.max(now))
}

/// Hands read `key` (a first attempt or a retry) to the reader; a refused submission fails
/// the sample.
fn submit<T>(ctx: &Context<T>, shared: &Shared<T>, reader: &Reader, reads: &mut Reads, key: usize) {
    let read = &mut reads.slab[key];
    let meta = &ctx.dataset.samples()[read.req.sample as usize];
    read.issued = Instant::now();
    read.due = reserve(ctx, read.issued, meta.size_bytes);
    let request = ReadRequest {
        file: read.file,
        offset: 0,
        len: meta.size_bytes as usize,
        class: read.req.rank,
        tag: key as u64,
    };
    if let Err(e) = reader.submit(request) {
        let done = reads.retire(key);
        finish_with(ctx, shared, done, Err(read_error(meta, e)));
    }
}

/// The reader finished a read: charge the emulated tier, or complete it now.
fn on_completion<T>(ctx: &Context<T>, shared: &Shared<T>, reads: &mut Reads, c: Completion) {
    let key = c.tag as usize;
    let read = &reads.slab[key];
    let meta = &ctx.dataset.samples()[read.req.sample as usize];
    let result = match (c.result, &ctx.config.fault_injection) {
        (Ok(bytes), None) => Ok((bytes, Duration::ZERO)),
        (Ok(bytes), Some(f)) => inject(shared, f, meta.id, read.req.epoch, read.attempt, bytes)
            .map_err(|e| (e.transient, read_error_cause(meta, Arc::new(e.cause)))),
        (Err(e), _) => Err((read_error_transient(&e), read_error(meta, e))),
    };
    // The emulated tier answers, success or failure, when it has served the request.
    let now = Instant::now();
    let answered = answered(read.due, now);
    let (loaded, at) = match result {
        Ok((bytes, delay)) => {
            if read.attempt > 0 {
                shared.faults.recovered.fetch_add(1, Ordering::Relaxed);
            }
            (Ok(bytes), answered + delay)
        }
        Err((true, _)) if read.attempt + 1 < READ_ATTEMPTS => {
            // Transient: retry after a backoff, keeping the io_depth slot and the open file.
            shared.faults.retries.fetch_add(1, Ordering::Relaxed);
            let read = &mut reads.slab[key];
            read.attempt += 1;
            reads
                .timers
                .push(Reverse((answered + faults::backoff(read.attempt), key)));
            return;
        }
        Err((_, err)) => (Err(err), answered),
    };
    if at > now {
        reads.slab[key].parked = Some(loaded);
        reads.timers.push(Reverse((at, key)));
        return;
    }
    let done = reads.retire(key);
    finish_with(ctx, shared, done, loaded);
}

/// Applies the injector to one attempt, counting the attempts it changes.
fn inject<T>(
    shared: &Shared<T>,
    f: &FaultInjection,
    sample: u32,
    epoch: u32,
    attempt: u32,
    bytes: Bytes,
) -> Result<(Bytes, Duration), AttemptError> {
    if f.decide(sample, epoch, attempt) != Decision::default() {
        shared.faults.injected.fetch_add(1, Ordering::Relaxed);
    }
    f.apply(sample, epoch, attempt, bytes)
}

/// Whether the reader's error may go away on retry (it already retried EAGAIN/EINTR).
fn read_error_transient(e: &lobster_uring::ReadError) -> bool {
    match e {
        lobster_uring::ReadError::Read { source, .. } => faults::transient(source),
        _ => false,
    }
}

fn finish_with<T>(ctx: &Context<T>, shared: &Shared<T>, done: InFlight, loaded: Loaded) {
    let meta = &ctx.dataset.samples()[done.req.sample as usize];
    if loaded.is_ok() {
        lock(&shared.model).observe_read(Tier::Storage, meta.size_bytes, done.issued.elapsed());
    }
    fill_slot(shared, &done.req.slot, loaded, done.req.admitted);
}

fn set_depth(reader: &Reader, class: usize, depth: u32) -> Result<(), Error> {
    reader
        .set_io_depth(class, depth as usize)
        .map_err(|e| Error::Engine {
            part: "reader io_depth",
            cause: Arc::new(e),
        })
}

fn read_error(meta: &SampleMeta, e: lobster_uring::ReadError) -> Error {
    read_error_cause(meta, Arc::new(e))
}

fn read_error_cause(meta: &SampleMeta, cause: Cause) -> Error {
    Error::Read {
        sample: meta.id,
        path: meta.path.to_path_buf(),
        offset: 0,
        cause,
    }
}

/// A rank's view: takes batches in plan order.
pub(crate) fn next_batch<T>(
    shared: &Shared<T>,
    rank: usize,
    iterations: usize,
) -> Option<Result<crate::Batch<T>, Error>> {
    let r = &shared.ranks[rank];
    let started = Instant::now();
    let mut buffer = lock(&r.buffer);
    loop {
        if let Some(front) = buffer.batches.front() {
            if front.remaining == 0 {
                break;
            }
        } else if buffer.planned_all {
            return None;
        }
        if shared.stop.load(Ordering::SeqCst) {
            let failure = lock(&shared.failure).clone();
            return Some(Err(failure.unwrap_or_else(stopped)));
        }
        buffer = r.ready.wait(buffer).unwrap_or_else(|p| p.into_inner());
    }
    let batch = buffer.batches.pop_front().expect("front checked");
    let ready_at = batch.ready_at.expect("a complete batch has its time");
    let load_from = buffer
        .prev_ready
        .map_or(batch.issued, |p| p.max(batch.issued));
    buffer.prev_ready = Some(ready_at);
    drop(buffer);
    let stall = started.elapsed();
    let mut metrics = batch.metrics;
    metrics.load_s = ready_at.saturating_duration_since(load_from).as_secs_f64();
    metrics.stall_s = stall.as_secs_f64();
    let len = batch.items.len();
    {
        let mut progress = lock(&shared.progress);
        progress.taken[rank] += 1;
    }
    shared.progress_cv.notify_all();
    let mut items = Vec::with_capacity(len);
    let mut first_error = None;
    let mut failed = Vec::new();
    let skip = matches!(shared.error_policy, ErrorPolicy::Skip { .. });
    for item in batch.items {
        match item.expect("a complete batch has every item") {
            Ok(s) => items.push(s),
            Err(e) if skip => failed.push(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let last_of_epoch = batch.iteration as usize + 1 == iterations;
    let mut collector = lock(&shared.collector);
    collector.batch_taken(metrics, len - failed.len(), last_of_epoch);
    let mut skipped = Vec::with_capacity(failed.len());
    if let ErrorPolicy::Skip { max_failures } = shared.error_policy {
        let allowed = max_failures.allowed(shared.epoch_accesses);
        for e in failed {
            let sample = e.sample().unwrap_or(u32::MAX);
            skipped.push(sample);
            let (count, first) = collector.skipped(SkippedSample {
                epoch: batch.epoch,
                iteration: batch.iteration,
                rank,
                sample,
                path: e.path().map(Into::into).unwrap_or_default(),
                cause: e.to_string(),
            });
            if count > allowed {
                lock(&shared.budget_failure).get_or_insert_with(|| Error::TooManyFailures {
                    epoch: batch.epoch,
                    failed: count,
                    allowed,
                    accesses: shared.epoch_accesses,
                    first: first.to_vec(),
                });
            }
        }
    }
    drop(collector);
    if let Some(e) = lock(&shared.budget_failure).clone() {
        return Some(Err(e));
    }
    Some(match first_error {
        Some(e) => Err(e),
        None => Ok(crate::Batch {
            epoch: batch.epoch,
            iteration: batch.iteration,
            samples: items,
            skipped,
        }),
    })
}

/// A rank's handle was dropped: its batches are discarded and it no longer holds back the
/// planner.
pub(crate) fn detach<T>(shared: &Shared<T>, rank: usize) {
    {
        let mut buffer = lock(&shared.ranks[rank].buffer);
        shared.ranks[rank].detached.store(true, Ordering::SeqCst);
        buffer.batches.clear();
    }
    lock(&shared.progress).taken[rank] = usize::MAX;
    shared.progress_cv.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(seq: u64, step: u64, rank: usize, finish_ppm: u32, bytes: u64) -> IoRequest {
        IoRequest {
            seq,
            step,
            finish_ppm,
            bytes,
            epoch: 0,
            rank,
            sample: seq as u32,
            slot: Slot::new(),
            admitted: false,
        }
    }

    /// A small deterministic generator for sizes.
    fn sizes(seed: u64, n: usize) -> Vec<u64> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                20_000 + x % 400_000
            })
            .collect()
    }

    #[test]
    fn steps_number_the_runs_batches_in_order() {
        // 10 samples over 2 ranks of batch 2: 3 iterations per epoch, the last one short.
        let sampler = DistributedSampler::new(10, 2, false, crate::EpochOrder::Sequential)
            .expect("a valid sampler");
        let layout = Layout {
            sampler,
            world: 2,
            first_rank: 0,
            ranks: 2,
            batch: 2,
            per_rank: 5,
            epochs: 3,
        };
        let mut next = 0;
        for epoch in 0..layout.epochs {
            for iteration in 0..layout.iterations() {
                assert_eq!(layout.step(epoch, iteration), next);
                next += 1;
            }
        }
        assert_eq!(next, 9);
    }

    #[test]
    fn read_fractions_follow_each_batchs_storage_bytes() {
        // The misses of two iterations (steps 3 and 4) of two ranks, in canonical order.
        let mut reads = [
            request(1, 3, 0, 0, 100),
            request(2, 3, 0, 0, 300),
            request(3, 3, 1, 0, 0),
            request(4, 4, 0, 0, 10),
        ];
        set_read_fractions(&mut reads);
        let f: Vec<u32> = reads.iter().map(|r| r.finish_ppm).collect();
        assert_eq!(f, vec![250_000, 1_000_000, 1_000_000, 1_000_000]);
    }

    /// Issues every pending read in `order` with room for all of them, onto a link that
    /// transfers one byte per unit of time in issue order; returns when each rank's last read
    /// of step 0 ends.
    fn rank_finish_times(order: IoOrder, pending: &mut [VecDeque<IoRequest>]) -> Vec<u64> {
        let ranks = pending.len();
        let mut in_flight = vec![0; ranks];
        let depth = equal_split(1 << 20, ranks);
        let mut link = 0;
        let mut finish = vec![0; ranks];
        while let Some(r) = next_read(order, pending, &in_flight, &depth, 1 << 20) {
            let req = pending[r]
                .pop_front()
                .expect("next_read picks a rank with work");
            in_flight[r] += 1;
            link += req.bytes;
            if req.step == 0 {
                finish[r] = link;
            }
        }
        finish
    }

    /// Step 0's batches of four ranks with different miss counts, then one read of step 1.
    fn batches(seed: u64) -> Vec<VecDeque<IoRequest>> {
        let misses = [7, 2, 12, 5];
        let mut seq = 0;
        let mut pending: Vec<VecDeque<IoRequest>> = (0..4).map(|_| VecDeque::new()).collect();
        for (rank, &n) in misses.iter().enumerate() {
            let mut batch: Vec<IoRequest> = sizes(seed + rank as u64, n)
                .into_iter()
                .map(|b| {
                    seq += 1;
                    request(seq, 0, rank, 0, b)
                })
                .collect();
            set_read_fractions(&mut batch);
            pending[rank].extend(batch);
        }
        seq += 1;
        pending[0].push_back(request(seq, 1, 0, 0, 1));
        pending
    }

    #[test]
    fn deadline_order_ends_every_ranks_batch_together() {
        for seed in 1..50 {
            let mut pending = batches(seed);
            let last_bytes: Vec<u64> = pending
                .iter()
                .map(|q| {
                    q.iter()
                        .rfind(|r| r.step == 0)
                        .expect("every rank reads")
                        .bytes
                })
                .collect();
            let step_bytes: u64 = pending
                .iter()
                .flatten()
                .filter(|r| r.step == 0)
                .map(|r| r.bytes)
                .sum();
            let finish = rank_finish_times(IoOrder::Deadline, &mut pending);
            // Only the ranks' last reads separate their ends, largest first.
            let mut others = last_bytes.clone();
            others.sort_unstable();
            let spread_max: u64 = others[..others.len() - 1].iter().sum();
            let earliest = *finish.iter().min().expect("four ranks");
            assert_eq!(
                *finish.iter().max().expect("four ranks"),
                step_bytes,
                "seed {seed}"
            );
            assert!(
                step_bytes - earliest <= spread_max,
                "seed {seed}: {finish:?}"
            );
            // The stream order ends rank 0's batch long before rank 2's.
            let mut pending = batches(seed);
            let stream = rank_finish_times(IoOrder::Shares, &mut pending);
            assert!(
                stream[0] < earliest,
                "seed {seed}: {stream:?} against {finish:?}"
            );
        }
    }

    #[test]
    fn deadline_order_serves_the_oldest_step_within_the_node_budget() {
        let mut pending: Vec<VecDeque<IoRequest>> = (0..2).map(|_| VecDeque::new()).collect();
        pending[0].push_back(request(1, 5, 0, 900_000, 10));
        pending[1].push_back(request(2, 6, 1, 1, 10));
        // Rank 1's read is further through its batch but a step later.
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[0, 0], &[1, 1], 4),
            Some(0)
        );
        // The node's budget bounds the reads in flight; one rank may hold all of it.
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[4, 0], &[2, 2], 4),
            None
        );
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[3, 0], &[2, 2], 4),
            Some(0)
        );
        pending[0].clear();
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[0, 0], &[1, 1], 4),
            Some(1)
        );
        pending[1].clear();
        assert_eq!(
            next_read(IoOrder::Deadline, &pending, &[0, 0], &[1, 1], 4),
            None
        );
    }

    #[test]
    fn shares_hold_each_rank_to_its_io_depth() {
        let mut pending: Vec<VecDeque<IoRequest>> = (0..2).map(|_| VecDeque::new()).collect();
        pending[0].push_back(request(1, 0, 0, 500_000, 10));
        pending[1].push_back(request(2, 0, 1, 100_000, 10));
        assert_eq!(
            next_read(IoOrder::Shares, &pending, &[0, 0], &[1, 1], 2),
            Some(0)
        );
        assert_eq!(
            next_read(IoOrder::Shares, &pending, &[1, 0], &[1, 1], 2),
            Some(1)
        );
        assert_eq!(
            next_read(IoOrder::Shares, &pending, &[1, 1], &[1, 1], 2),
            None
        );
    }
}
