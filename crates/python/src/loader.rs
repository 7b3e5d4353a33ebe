//! `lobster_io.Loader`: one rank's batches, epoch after epoch.
//!
//! A process that is its node's only rank runs the facade's loader on its own threads. When
//! a launcher runs several ranks a node, local rank 0 hosts the node's one engine
//! (lobster-node's `NodeHost`) on its threads and every local rank, 0 too, attaches to it:
//! batches arrive in the node's shared arena and the arrays are views of it.
//!
//! Either way a feeder thread takes the rank's batches as soon as a buffer is free and hands
//! them over a channel of one; `__next__` waits on the channel with the GIL released.
//!
//! The engine starts when the first batch (or the node's arena, or the metrics) is asked
//! for, not in the constructor, so that `load_state_dict` can come between the two, as with
//! StatefulDataLoader; with MPI peers (building a loader is collective) it starts at once,
//! and `load_state_dict` before the first batch starts it again, resumed (collectively).
//! `state_dict` counts the batches `__next__` returned, not those the feeder prefetched.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use lobster_io::images::{Decoding, ImageBatches, Pixels};
use lobster_io::Recycler;
use lobster_io::{
    BudgetConfig, CacheConfig, CachePolicy, Dataset, DistributedSampler, EpochOrder, JobConfig,
    JobFingerprint, LoaderBuilder, LoaderConfig, LoaderState, Positions, RankHandle, RunMetrics,
    SampleLimits, SampleMeta, STATE_VERSION,
};
use lobster_node::{fingerprint, HostOptions, NodeBatch, NodeEnv, NodeHost, NodeRank, RankStopper};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::batch::{Batch, Count, Holder, Images, Made, Span, HEADER_BYTES};
use crate::errors::{loader_error, node_error, DecodeError, Error, StateError, StoppedError};
use crate::groups;
use crate::mpi::{self, Closable, World};
use crate::params::{self, Int, Output};
use crate::recycle::{GivesBack, KEPT_BYTES_MAX};

/// How long a waiting iteration sleeps between looks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);
/// Batches the feeder may have made beyond those the caller holds.
const FEEDER_AHEAD: usize = 1;
/// How long a rank waits for its node's host, and the host for every rank.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(300);
/// Pixels a decoded image may have when `transform="none"` on a node of several ranks,
/// unless `slot_bytes` says otherwise: a slot must hold a batch of whole images.
const NONE_MAX_PIXELS: u64 = 1 << 22;

type Fed = Result<Made, PyErr>;

/// What runs the rank's batches, kept for the loader's life.
enum Engine {
    /// The facade's loader, in this process.
    InProcess(Box<dyn Metered>),
    /// The node's host, on this process's threads (local rank 0).
    Host(NodeHost),
    /// Attached to another process's host.
    Attached,
}

trait Metered: Send {
    fn metrics(&self) -> RunMetrics;
    fn positions(&self) -> Positions;
}

impl<T: Send + 'static> Metered for lobster_io::Loader<T> {
    fn metrics(&self) -> RunMetrics {
        lobster_io::Loader::metrics(self)
    }

    fn positions(&self) -> Positions {
        lobster_io::Loader::positions(self)
    }
}

/// A loader not started yet: what starts it, and the state it resumes from.
struct Pending {
    settings: Settings,
    prepared: Prepared,
    resume: Option<LoaderState>,
}

/// A started rank: where its batches come from and how their count maps to a position.
struct Run {
    batches: Receiver<Fed>,
    arena: Option<std::ops::Range<usize>>,
    positions: Positions,
}

/// Loader(data, batch_size, *, epochs=1, seed=0, drop_last=False, transform="train",
///        image_size=224, decoding="whole", channels_first=False, on_error="fail",
///        max_failures=None,
///        decode=None, assign="sampler", cache=Cache(), budgets=Budgets(), launch=Launch(),
///        limits=Limits())
///
/// One rank's batches of the image folder (or packed dataset) `data`: `len(loader)`
/// batches an epoch, `epochs` epochs, in `DistributedSampler(shuffle=True, seed=seed)`
/// order. `transform` is "train" (RandomResizedCrop to `image_size` and a flip, seeded by
/// seed, epoch and sample), "eval" (resize and centre crop) or "none" (each image at its own
/// size; with `decode`, a callable `decode(bytes) -> array` run per sample in this
/// process: the slow path). `decoding="whole"` (the default) decodes every image whole
/// first: batches are the same bit for bit whatever the cache keeps, and across a resume;
/// "region" decodes only the part of a JPEG the transform keeps, at the coarsest DCT scale
/// that still gives `image_size` over the crop: faster, within a stated tolerance of a
/// whole decode and the same every run, but a sample the cache serves decoded (or not,
/// after a resume) differs within that tolerance. `on_error="skip"` leaves out samples that fail, up to
/// `max_failures` (a count, or a fraction of the epoch).
///
/// The rest is grouped: `cache=lobster_io.Cache(bytes, frac, policy, forms,
/// decoded_max_side, storage_bytes_per_s, net_bytes_per_s, disk, disk_bytes)`, what the
/// node's cache keeps, in memory and on a local disk below it;
/// `budgets=lobster_io.Budgets(io_depth, decode_threads, slots, slot_bytes)`, what the
/// node's ranks share, balanced across them every iteration;
/// `launch=lobster_io.Launch(rank, world_size, local_rank, local_world_size, job_id)`,
/// where this process stands when no launcher's variables
/// (torchrun, Open MPI, Slurm, LOBSTER_*) say, else one process alone;
/// `limits=lobster_io.Limits(image_pixels_max)`, what a sample may cost. With
/// several ranks a node, local rank 0 hosts the node's engine.
///
/// Built with MPI (`lobster_io.built_with_mpi()`), under `mpirun` or `srun` with PMI, every
/// process is a node of one rank (as in `lobster run --mpi`) whose loader fetches planned
/// misses from its peers' caches: building a Loader is then collective (every process
/// builds its loaders in the same order, with the same settings), and nodes must stay in
/// lock-step (DDP's all-reduce, or `step_barrier()`). There, `assign="locality"` gives each
/// step's samples to the processes whose caches hold them where the nodes' caches are
/// planned as one (every step's samples and batch sizes unchanged; `metrics()["assign"]`
/// says which ran and why), and `Cache(storage_bytes_per_s=..., net_bytes_per_s=...)` lets
/// the plan read a remote hit from storage where the interconnect is the dearer link
/// (`metrics()["cluster_plan"]` counts those reads). Under a launcher of several processes
/// that it cannot join, a loader runs without peers and says so once (a RuntimeWarning).
/// `help(lobster_io.Cache)` and the others say what each field does.
#[pyclass(frozen, module = "lobster_io")]
pub(crate) struct Loader {
    /// The engine, its feeder and how far the caller got: shared with the exit hooks that
    /// close loaders left open.
    core: Arc<Core>,
    /// Until the engine starts (the first batch asked for).
    pending: Mutex<Option<Pending>>,
    /// Once it started.
    run: Mutex<Option<Run>>,
    /// What restarts an in-process engine that `load_state_dict` finds started before its
    /// first batch was taken (after a `state_dict()`, as torch.distributed.checkpoint's
    /// load takes one for a template).
    origin: Option<(Settings, Prepared)>,
    /// Batches `__next__` returned since the run's start: what `state_dict` saves.
    given: AtomicU64,
    /// Batches (holding the loader's buffers) the caller holds now: one past the rank's
    /// buffers is refused when asked for, whatever the feeder did meanwhile.
    held: Count,
    /// `Budgets.slots`: the rank has `buffers(slots)`.
    slots: usize,
    /// A resumed run's first epoch when it resumed within it, and where that epoch ends
    /// (another world splits its rest into another number of batches).
    head_end: Mutex<Option<(u32, usize)>>,
    channels_first: bool,
    env: NodeEnv,
    /// The MPI job whose nodes are this loader's peers.
    world: Option<World>,
    /// The process that built it: a forked child has the loader's memory but none of its
    /// threads, so it must not wait on them.
    pid: u32,
}

/// What closing a loader needs: kept apart from the `Loader` so that the exit hooks (the
/// package's `atexit`, an MPI job's exit) close loaders Python has not collected yet.
struct Core {
    /// `None` before the start and after the close.
    engine: Mutex<Option<Engine>>,
    /// The started engine's feeder thread, until the close waits for it.
    feeder: Mutex<Option<Feeder>>,
    per_epoch: usize,
    epochs: u32,
    /// The epoch the next iteration yields, and the batches of it already taken.
    next_epoch: AtomicU32,
    taken: Mutex<usize>,
}

/// The thread that takes the rank's batches (and runs a decode callable on them), and
/// what stops it.
struct Feeder {
    /// Never sends: dropped, it tells the feeder to stop (between samples, or while it
    /// waits to hand a batch over).
    stop: Sender<()>,
    thread: std::thread::JoinHandle<()>,
    /// Ends an attached rank's wait for its next batch.
    rank: Option<RankStopper>,
}

/// Loaders not closed yet, for the package's `atexit` hook.
static LIVE: Mutex<Vec<Weak<Core>>> = Mutex::new(Vec::new());

/// Closes the loaders still open, before Python finalises: a feeder thread that is inside
/// a decode callable then (or waits for the GIL to call it) would abort the interpreter.
/// `lobster_io` registers it with `atexit` when imported.
#[pyfunction]
pub(crate) fn _close_at_exit(py: Python<'_>) {
    let live: Vec<Arc<Core>> = std::mem::take(&mut *lock(&LIVE))
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    py.detach(move || {
        for core in live {
            if let Err(e) = core.close() {
                log::warn!("lobster_io: closing a loader at exit: {e}");
            }
        }
    });
}

impl Core {
    /// Whether the caller took every batch of every epoch.
    fn complete(&self) -> bool {
        let epoch = self.next_epoch.load(Ordering::SeqCst);
        epoch >= self.epochs || (epoch + 1 == self.epochs && *lock(&self.taken) == self.per_epoch)
    }

    /// Stops the feeder, ends the engine and waits for the feeder to finish: a decode call
    /// under way ends first, so call it with the GIL released. A host waits for the node's
    /// other ranks (or stops them if this rank stopped early).
    fn close(&self) -> PyResult<()> {
        let complete = self.complete();
        let engine = lock(&self.engine).take();
        let feeder = lock(&self.feeder).take();
        let thread = feeder.map(|f| {
            drop(f.stop);
            // A rank that took every batch is told its end by the host; one that stopped
            // early stops waiting (the host counts it gone, as if its process had exited).
            if let (Some(rank), false) = (&f.rank, complete) {
                rank.stop();
            }
            f.thread
        });
        let ended = finish(engine, complete);
        // A decode callable may drop the last reference to its own loader: the feeder then
        // closes it and cannot wait for itself.
        let thread = thread.filter(|t| t.thread().id() != std::thread::current().id());
        if let Some(t) = thread {
            if t.join().is_err() {
                log::warn!("lobster_io: the loader's feeder thread panicked");
            }
        }
        ended
    }
}

/// Everything `Loader(...)` was given, checked.
struct Settings {
    data: String,
    batch_size: usize,
    epochs: u32,
    seed: u64,
    cache_bytes: Option<u64>,
    cache_frac: f64,
    policy: CachePolicy,
    cache_forms: Option<lobster_io::FormChoice>,
    decoded_max_side: Option<u32>,
    link_prices: Option<lobster_io::LinkPrices>,
    disk: Option<lobster_io::DiskCache>,
    output: Output,
    drop_last: bool,
    assign: lobster_io::Assign,
    errors: lobster_io::OnError,
    decode_threads: usize,
    io_depth: usize,
    slots: usize,
    slot_bytes: Option<u64>,
    image_pixels_max: u64,
    decode: Option<Py<PyAny>>,
}

impl Settings {
    /// A copy (the decode callable shared).
    fn clone_ref(&self, py: Python<'_>) -> Settings {
        Settings {
            data: self.data.clone(),
            disk: self.disk.clone(),
            decode: self.decode.as_ref().map(|f| f.clone_ref(py)),
            ..*self
        }
    }

    fn config(&self, env: &NodeEnv, dataset: &Dataset) -> LoaderConfig {
        let capacity = self
            .cache_bytes
            .unwrap_or((dataset.total_bytes() as f64 * self.cache_frac) as u64);
        LoaderConfig {
            job: JobConfig {
                nodes: env.nodes,
                node: env.node,
                ranks_per_node: env.local_world_size,
                batch_size: self.batch_size,
                epochs: self.epochs,
                drop_last: self.drop_last,
                assign: self.assign,
            },
            cache: CacheConfig {
                // A cache of nothing is no cache, whatever the policy.
                policy: if capacity == 0 {
                    CachePolicy::None
                } else {
                    self.policy
                },
                capacity_bytes: capacity,
                forms: self.cache_forms,
                decoded_max_side: self.decoded_max_side,
                link_prices: self.link_prices,
                disk: self.disk.clone(),
                ..CacheConfig::default()
            },
            budgets: BudgetConfig {
                io_depth: self.io_depth,
                decode_threads: self.decode_threads,
                ..BudgetConfig::default()
            },
            on_error: self.errors,
            limits: SampleLimits {
                image_pixels_max: self.image_pixels_max,
                ..SampleLimits::default()
            },
            ..LoaderConfig::default()
        }
    }

    fn buffers(&self) -> usize {
        buffers(self.slots)
    }
}

/// Buffers a rank has: the caller's `slots`, the one in the channel, the one the feeder is
/// making. The caller may hold them all; the feeder then waits for one back.
fn buffers(slots: usize) -> usize {
    slots + FEEDER_AHEAD + 1
}

/// Raw bytes for a decode callable; width, height and pixels for `transform="none"`, decoded
/// in place after them. Each into a buffer `recycler` gave back, when it has one.
fn decode_bytes(
    output: Output,
    pixels_max: u64,
    recycler: Arc<Recycler>,
) -> impl Fn(&[u8], &SampleMeta) -> Result<Vec<u8>, String> {
    move |bytes, _meta| {
        let len = match output {
            Output::Decoded => lobster_io::images::dimensions(bytes)
                .map_or(0, |(w, h)| HEADER_BYTES + w as usize * h as usize * 3),
            _ => bytes.len(),
        };
        let mut v = recycler.take(len);
        match output {
            Output::Decoded => {
                // Not cut to the header: what the buffer holds past it is decoded over.
                if v.len() < HEADER_BYTES {
                    v.resize(HEADER_BYTES, 0);
                }
                let (w, h) =
                    lobster_io::images::decode_into(bytes, pixels_max, &mut v, HEADER_BYTES)
                        .map_err(|e| e.to_string())?;
                v[..4].copy_from_slice(&w.to_le_bytes());
                v[4..HEADER_BYTES].copy_from_slice(&h.to_le_bytes());
            }
            _ => {
                v.clear();
                v.extend_from_slice(bytes);
            }
        }
        Ok(v)
    }
}

/// Makes a batch's images from its samples' bytes (each `&mut`, in the batch's order).
fn images(
    output: Output,
    samples: Vec<&mut [u8]>,
    ids: &[u32],
    decode: Option<&(Py<PyAny>, Option<Arc<Dataset>>)>,
    stop: &Receiver<()>,
) -> Result<Images, PyErr> {
    match output {
        Output::Stacked(..) => unreachable!("stacked batches are collated or contiguous"),
        Output::Decoded => {
            let mut each = Vec::with_capacity(samples.len());
            for (bytes, id) in samples.into_iter().zip(ids) {
                let bad = || Error::new_err(format!("sample {id}: a decoded image cut short"));
                let (head, pixels) = bytes.split_at_mut_checked(HEADER_BYTES).ok_or_else(bad)?;
                let w = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
                let h = u32::from_le_bytes(head[4..].try_into().expect("4 bytes")) as usize;
                if pixels.len() != w * h * 3 {
                    return Err(bad());
                }
                each.push((Span::of(pixels), [h, w, 3]));
            }
            Ok(Images::Each(each))
        }
        Output::Raw => {
            let (f, dataset) = decode.expect("a raw batch has its decode callable");
            let closing = || StoppedError::new_err("the loader was closed");
            if stopping(stop) {
                return Err(closing());
            }
            Python::attach(|py| {
                let mut out = Vec::with_capacity(samples.len());
                for (bytes, &id) in samples.iter().zip(ids) {
                    // A close waits for the call under way, not for the batch's rest.
                    if stopping(stop) {
                        return Err(closing());
                    }
                    let arg = PyBytes::new(py, bytes);
                    match f.call1(py, (arg,)) {
                        Ok(o) => out.push(o),
                        Err(e) => {
                            let file = dataset
                                .as_ref()
                                .and_then(|d| d.samples().get(id as usize))
                                .map(|m| format!(" ({})", m.key()))
                                .unwrap_or_default();
                            let err = DecodeError::new_err(format!(
                                "decoding sample {id}{file} with the decode callable failed: {e}"
                            ));
                            err.set_cause(py, Some(e));
                            return Err(err);
                        }
                    }
                }
                Ok(Images::Objects(out))
            })
        }
    }
}

/// The in-process rank's collated batches.
fn feed_collated(
    rank: RankHandle<Pixels>,
    dataset: Arc<Dataset>,
    buffers: usize,
    tx: &Sender<Fed>,
    stop: &Receiver<()>,
) {
    // Counted from their making until they are back, so the feeder takes a batch only when
    // a buffer is free for it: running ahead never fails for want of one.
    let out = Count::default();
    let mut batches = ImageBatches::new(rank, dataset, buffers);
    loop {
        while !out.wait_below(buffers, SIGNAL_POLL) {
            if stopping(stop) {
                return;
            }
        }
        let Some(b) = batches.next() else {
            return;
        };
        let made = b.map_err(loader_error).map(|mut b| {
            let shape = b.shape();
            let span = Span::of(b.images_mut());
            Made {
                epoch: b.epoch,
                iteration: b.iteration,
                ids: b.ids.clone(),
                labels: b.labels().to_vec(),
                skipped: b.skipped.clone(),
                images: Images::Stacked { span, shape },
                _holder: Some(Box::new(b)),
                _made: Some(out.take()),
            }
        });
        if !hand_over(tx, stop, made) {
            return;
        }
    }
}

/// The in-process rank's batches of samples (decoded at their own size, or raw bytes for a
/// decode callable).
fn feed_samples(
    rank: RankHandle<Vec<u8>>,
    output: Output,
    decode: Option<(Py<PyAny>, Option<Arc<Dataset>>)>,
    recycler: Arc<Recycler>,
    tx: &Sender<Fed>,
    stop: &Receiver<()>,
) {
    for b in rank {
        let made = b.map_err(loader_error).and_then(|mut b| {
            let ids: Vec<u32> = b.samples.iter().map(|s| s.id).collect();
            let labels = b.samples.iter().map(|s| s.label).collect();
            let skipped = std::mem::take(&mut b.skipped);
            let (epoch, iteration) = (b.epoch, b.iteration);
            let bytes = b.samples.iter_mut().map(|s| &mut s.value[..]).collect();
            let images = images(output, bytes, &ids, decode.as_ref(), stop)?;
            let b = GivesBack {
                batch: b,
                to: Arc::clone(&recycler),
            };
            Ok(made(epoch, iteration, ids, labels, skipped, images, b))
        });
        if !hand_over(tx, stop, made) {
            return;
        }
    }
}

/// An attached rank's batches, in the node's arena.
fn feed_node(
    rank: NodeRank,
    output: Output,
    decode: Option<(Py<PyAny>, Option<Arc<Dataset>>)>,
    tx: &Sender<Fed>,
    stop: &Receiver<()>,
) {
    for b in rank {
        let made = b
            .map_err(node_error)
            .and_then(|b| node_batch(b, output, decode.as_ref(), stop));
        if !hand_over(tx, stop, made) {
            return;
        }
    }
}

/// Whether `stop` says the loader is closing (its sender gone).
fn stopping(stop: &Receiver<()>) -> bool {
    matches!(stop.try_recv(), Err(TryRecvError::Disconnected))
}

/// Hands a batch to `__next__`, waiting for room; `false` when the loader is closing (the
/// batch is dropped, its buffer returned).
fn hand_over(tx: &Sender<Fed>, stop: &Receiver<()>, made: Fed) -> bool {
    crossbeam_channel::select! {
        send(tx, made) -> sent => sent.is_ok(),
        recv(stop) -> _ => false,
    }
}

fn node_batch(
    mut b: NodeBatch,
    output: Output,
    decode: Option<&(Py<PyAny>, Option<Arc<Dataset>>)>,
    stop: &Receiver<()>,
) -> Result<Made, PyErr> {
    let ids: Vec<u32> = b.samples.iter().map(|p| p.id).collect();
    let labels = b.samples.iter().map(|p| p.label).collect();
    let skipped = std::mem::take(&mut b.skipped);
    let (epoch, iteration) = (b.epoch, b.iteration);
    let lens: Vec<usize> = b.samples.iter().map(|p| p.len as usize).collect();
    let apart = || Error::new_err("a batch's samples were not placed back to back in its slot");
    let images = if b.samples.is_empty() {
        match output {
            Output::Stacked(..) => Images::Stacked {
                span: Span::of(&mut []),
                shape: [0, 0, 0, 3],
            },
            _ => Images::Each(Vec::new()),
        }
    } else {
        let run = b.contiguous_mut().ok_or_else(apart)?;
        match output {
            Output::Stacked(..) => {
                let side = output.side().expect("a stacked output has a side") as usize;
                let each = side * side * 3;
                if lens.iter().any(|&l| l != each) {
                    return Err(Error::new_err(format!(
                        "a batch's images are not all {side} x {side} x 3 bytes"
                    )));
                }
                Images::Stacked {
                    span: Span::of(run),
                    shape: [ids.len(), side, side, 3],
                }
            }
            _ => {
                let mut rest = run;
                let mut samples = Vec::with_capacity(lens.len());
                for &len in &lens {
                    let (one, tail) = rest.split_at_mut(len);
                    samples.push(one);
                    rest = tail;
                }
                images(output, samples, &ids, decode, stop)?
            }
        }
    };
    Ok(made(epoch, iteration, ids, labels, skipped, images, b))
}

/// A batch for Python, holding `holder` for as long as its images view it.
fn made(
    epoch: u32,
    iteration: u32,
    ids: Vec<u32>,
    labels: Vec<u32>,
    skipped: Vec<u32>,
    images: Images,
    holder: impl std::any::Any + Send + Sync,
) -> Made {
    let holder: Holder = match images {
        // The callable's arrays are its own: the bytes can go now.
        Images::Objects(_) => None,
        _ => Some(Box::new(holder)),
    };
    Made {
        epoch,
        iteration,
        ids,
        labels,
        skipped,
        images,
        _holder: holder,
        _made: None,
    }
}

fn spawn_feeder(f: impl FnOnce() + Send + 'static) -> PyResult<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("lobster-py-feeder".into())
        .spawn(f)
        .map_err(|e| Error::new_err(format!("cannot start the feeder thread: {e}")))
}

/// What every rank of a node must agree on: the node's fingerprint and what the samples
/// become.
fn agreed(dataset: &Dataset, config: &LoaderConfig, s: &Settings) -> Vec<(String, String)> {
    let mut v = fingerprint(dataset, config, s.seed);
    v.push(("output".into(), s.output.name()));
    v
}

/// What the constructor checks before the engine starts: the dataset, the configuration and
/// the batches an epoch.
#[derive(Clone)]
struct Prepared {
    dataset: Arc<Dataset>,
    config: LoaderConfig,
    per_epoch: usize,
}

fn prepare(s: &Settings, env: &NodeEnv) -> PyResult<Prepared> {
    let dataset = Arc::new(Dataset::open(&s.data).map_err(loader_error)?);
    let config = s.config(env, &dataset);
    let order = EpochOrder::Shuffle { seed: s.seed };
    let ranks = env.nodes * env.local_world_size;
    let per_epoch = DistributedSampler::new(dataset.len(), ranks, s.drop_last, order)
        .map_err(loader_error)?
        .per_rank()
        .div_ceil(s.batch_size.max(1));
    Ok(Prepared {
        dataset,
        config,
        per_epoch,
    })
}

/// The hello fields that say where a rank resumes from: every local rank must present the
/// host's, so ranks that loaded different states are refused naming the field.
fn resume_fields(resume: Option<&LoaderState>) -> PyResult<Vec<(String, String)>> {
    let Some(state) = resume else {
        return Ok(vec![("resume".into(), "none".into())]);
    };
    let at = state
        .ranks
        .first()
        .ok_or_else(|| StateError::new_err("unreadable loader state: no rank positions"))?;
    let j = &state.job;
    let fields = [
        ("resume", "from a state".to_owned()),
        ("resume.version", state.version.to_string()),
        ("resume.samples", j.samples.to_string()),
        ("resume.dataset", j.dataset.clone()),
        ("resume.order", j.order.clone()),
        ("resume.batch_size", j.batch_size.to_string()),
        ("resume.drop_last", j.drop_last.to_string()),
        ("resume.world", j.world.to_string()),
        ("resume.epoch", at.epoch.to_string()),
        ("resume.iteration", at.iteration.to_string()),
        ("resume.epoch_world", at.epoch_world.to_string()),
        ("resume.consumed", at.consumed.to_string()),
    ];
    Ok(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// A started rank: its engine and feeder, its batches, the node's arena and the run's
/// positions.
struct Started {
    engine: Engine,
    batches: Receiver<Fed>,
    arena: Option<std::ops::Range<usize>>,
    positions: Positions,
    feeder: Feeder,
}

/// What every loader a rank builds shares: the dataset, the configuration, the seed, the
/// state it resumes from and its peers.
struct Builders<'a> {
    dataset: &'a Arc<Dataset>,
    config: &'a LoaderConfig,
    seed: u64,
    resume: Option<&'a LoaderState>,
    peers: Option<&'a Arc<dyn lobster_io::net::Transport>>,
}

impl Builders<'_> {
    /// A loader of stacked images, decoded as `d` says and transformed by `t`.
    fn pixels(&self, t: lobster_io::images::Transform, d: Decoding) -> LoaderBuilder<Pixels> {
        self.with(LoaderBuilder::<Pixels>::new(Arc::clone(self.dataset)).decode_images_as(t, d))
    }

    /// A loader of each sample's bytes, or its image, as `s.output` asks, into buffers
    /// `recycler` gives.
    fn bytes(&self, s: &Settings, recycler: Arc<Recycler>) -> LoaderBuilder<Vec<u8>> {
        self.with(
            LoaderBuilder::<Vec<u8>>::new(Arc::clone(self.dataset)).decode(decode_bytes(
                s.output,
                s.image_pixels_max,
                recycler,
            )),
        )
    }

    /// `b` with what every loader of the rank shares.
    fn with<T: Send + 'static>(&self, b: LoaderBuilder<T>) -> LoaderBuilder<T> {
        let b = b.config(self.config.clone()).seed(self.seed);
        let b = match self.resume {
            Some(r) => b.resume_from(r.clone()),
            None => b,
        };
        match self.peers {
            Some(p) => b.peers(Arc::clone(p)),
            None => b,
        }
    }
}

/// Every node must plan from the same inputs (the dataset's root may differ), and from
/// where they start: a resume must be the same.
fn agree(
    world: &World,
    dataset: &Dataset,
    config: &LoaderConfig,
    s: &Settings,
    resume: Option<&LoaderState>,
) -> PyResult<()> {
    let mut fields = agreed(dataset, config, s);
    fields.retain(|(k, _)| k != "node" && k != "dataset");
    let point = resume.and_then(LoaderState::resume_point);
    fields.push(("resume".into(), point.unwrap_or_else(|| "none".into())));
    world.agree(fields)
}

/// A node's slot (one batch of a rank) and each sample's share of it, in bytes. A sample
/// larger than its share is a bad sample (on_error), not a stopped node.
fn slot_bytes(s: &Settings, dataset: &Dataset) -> PyResult<(u64, u64)> {
    let sample_bytes = match (s.output.side(), s.output) {
        (Some(side), _) => u64::from(side) * u64::from(side) * 3,
        (None, Output::Raw) => dataset.max_sample_bytes(),
        (None, _) => HEADER_BYTES as u64 + 3 * NONE_MAX_PIXELS,
    };
    // Saturating: the arena is checked against the memory available when made.
    let slot_bytes = s
        .slot_bytes
        .unwrap_or(sample_bytes.saturating_mul(s.batch_size as u64));
    let share_bytes = slot_bytes / s.batch_size as u64;
    if share_bytes == 0 {
        return Err(PyValueError::new_err(format!(
            "budgets.slot_bytes = {slot_bytes}: a slot holds a batch, so at least \
             batch_size = {}",
            s.batch_size
        )));
    }
    Ok((slot_bytes, share_bytes))
}

/// Starts the node's host, with the loader the settings ask for, serving `attaching`'s
/// ranks.
fn start_host(
    env: &NodeEnv,
    s: &Settings,
    builders: &Builders<'_>,
    attaching: &[(String, String)],
    buffers: usize,
) -> PyResult<NodeHost> {
    let (slot_bytes, share_bytes) = slot_bytes(s, builders.dataset)?;
    let options = HostOptions {
        slots_per_rank: buffers,
        slot_bytes,
        attach_timeout: ATTACH_TIMEOUT,
    };
    match s.output {
        Output::Stacked(t, d) => {
            let loader = builders.pixels(t, d).build().map_err(loader_error)?;
            NodeHost::start(env, loader, attaching.to_vec(), options)
        }
        _ => {
            // The host copies each sample into the node's arena and frees it: nothing to
            // give back.
            let loader = builders
                .bytes(s, Arc::new(Recycler::new(0, 0)))
                .decoded_sample_bytes_max(share_bytes)
                .build()
                .map_err(loader_error)?;
            NodeHost::start(env, loader, attaching.to_vec(), options)
        }
    }
    .map_err(node_error)
}

/// Starts this rank: the loader in process, or the node's host and this rank attached;
/// resumed from `resume` when given. A wait for the node's host or ranks ends when
/// `keep_waiting` says no.
fn start(
    mut s: Settings,
    p: Prepared,
    env: &NodeEnv,
    world: Option<&World>,
    resume: Option<LoaderState>,
    keep_waiting: &mut dyn FnMut() -> bool,
) -> PyResult<Started> {
    let Prepared {
        dataset, config, ..
    } = p;
    if let Some(w) = world {
        agree(w, &dataset, &config, &s, resume.as_ref())?;
    }
    let peers = world.map(World::transport);
    // The node's ranks agreed on one position (their hellos say it), so the node's state
    // has every local rank there.
    let node_state = resume.as_ref().map(|r| LoaderState {
        ranks: vec![r.ranks[0]; env.local_world_size],
        ..r.clone()
    });
    let (tx, rx) = crossbeam_channel::bounded(FEEDER_AHEAD);
    let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
    let buffers = s.buffers();
    // Taken, not cloned: a start needs no GIL (another thread may hold it, waiting for
    // this start to finish).
    let decode = s.decode.take().map(|f| (f, Some(Arc::clone(&dataset))));
    let builders = Builders {
        dataset: &dataset,
        config: &config,
        seed: s.seed,
        resume: node_state.as_ref(),
        peers: peers.as_ref(),
    };
    // Every node's loader is built (serving its cache) before any fetches from a peer.
    let all_built = || world.map_or(Ok(()), World::barrier);
    if env.local_world_size == 1 {
        let (engine, thread): (Box<dyn Metered>, _) = match s.output {
            Output::Stacked(t, d) => {
                let mut loader = builders.pixels(t, d).build().map_err(loader_error)?;
                let rank = take_rank(&mut loader)?;
                all_built()?;
                let ds = Arc::clone(&dataset);
                let thread = spawn_feeder(move || feed_collated(rank, ds, buffers, &tx, &stopped))?;
                (Box::new(loader), thread)
            }
            output => {
                // Every sample a rank may have out: its buffers' batches, and a batch more
                // being decoded.
                let recycler =
                    Arc::new(Recycler::new((buffers + 2) * s.batch_size, KEPT_BYTES_MAX));
                let mut loader = builders
                    .bytes(&s, Arc::clone(&recycler))
                    .build()
                    .map_err(loader_error)?;
                let rank = take_rank(&mut loader)?;
                all_built()?;
                let thread = spawn_feeder(move || {
                    feed_samples(rank, output, decode, recycler, &tx, &stopped)
                })?;
                (Box::new(loader), thread)
            }
        };
        return Ok(Started {
            positions: engine.positions(),
            engine: Engine::InProcess(engine),
            batches: rx,
            arena: None,
            feeder: Feeder {
                stop,
                thread,
                rank: None,
            },
        });
    }
    assert!(
        world.is_none(),
        "under MPI every process is a node of one rank"
    );
    let mut attaching = agreed(&dataset, &config, &s);
    attaching.extend(resume_fields(resume.as_ref())?);
    let engine = if env.is_host() {
        Engine::Host(start_host(env, &s, &builders, &attaching, buffers)?)
    } else {
        Engine::Attached
    };
    // The sample table is the host's: the others hold none of it (a decode callable's
    // error names its sample's file, so that path keeps it).
    drop(dataset);
    let rank =
        NodeRank::attach_while(env, attaching, ATTACH_TIMEOUT, keep_waiting).map_err(node_error)?;
    let arena = rank.arena_span();
    let positions = rank.positions().clone();
    let rank_stopper = rank.stopper().map_err(node_error)?;
    let output = s.output;
    let thread = spawn_feeder(move || feed_node(rank, output, decode, &tx, &stopped))?;
    Ok(Started {
        engine,
        batches: rx,
        arena: Some(arena),
        positions,
        feeder: Feeder {
            stop,
            thread,
            rank: Some(rank_stopper),
        },
    })
}

fn take_rank<T: Send + 'static>(loader: &mut lobster_io::Loader<T>) -> PyResult<RankHandle<T>> {
    loader
        .ranks()
        .and_then(|mut r| r.pop())
        .ok_or_else(|| Error::new_err("the loader's rank was already taken"))
}

/// Counts `core` among the live loaders (and forgets those gone).
fn live(core: &Arc<Core>) {
    let mut live = lock(&LIVE);
    live.retain(|c| c.strong_count() > 0);
    live.push(Arc::downgrade(core));
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (
        data, batch_size, *, epochs = Int::from(1), seed = Int::from(0), drop_last = false,
        transform = "train", image_size = Int::from(224), decoding = "whole",
        channels_first = false,
        on_error = "fail", max_failures = None, decode = None, assign = "sampler", cache = None, budgets = None, launch = None,
        limits = None, **moved
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        data: std::path::PathBuf,
        batch_size: Int,
        epochs: Int,
        seed: Int,
        drop_last: bool,
        transform: &str,
        image_size: Int,
        decoding: &str,
        channels_first: bool,
        on_error: &str,
        max_failures: Option<f64>,
        decode: Option<Py<PyAny>>,
        assign: &str,
        cache: Option<Bound<'_, PyAny>>,
        budgets: Option<Bound<'_, PyAny>>,
        launch: Option<Bound<'_, PyAny>>,
        limits: Option<Bound<'_, PyAny>>,
        moved: Option<Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        groups::refuse_unknown(moved.as_ref())?;
        let cache = groups::cache(py, cache)?;
        let budgets = groups::budgets(py, budgets)?;
        let given = groups::launch(py, launch)?;
        let image_pixels_max = groups::limits(py, limits)?;
        let batch_size = params::int("batch_size", &batch_size, 1..=u32::MAX as usize)?;
        let epochs = params::int("epochs", &epochs, 0..=u32::MAX)?;
        let seed = params::int("seed", &seed, 0..=u64::MAX)?;
        let data = params::data(data)?;
        params::callable(py, "decode", decode.as_ref())?;
        let (env, world) = mpi::place(py, &given)?;
        let settings = Settings {
            data,
            batch_size,
            epochs,
            seed,
            cache_bytes: cache.bytes,
            cache_frac: cache.frac,
            policy: params::cache_policy(&cache.policy)?,
            cache_forms: params::cache_forms(cache.forms.as_deref())?,
            decoded_max_side: cache.decoded_max_side,
            link_prices: cache.link_prices,
            disk: cache.disk,
            output: params::output(
                transform,
                &image_size,
                params::decoding(decoding)?,
                decode.is_some(),
            )?,
            drop_last,
            assign: params::assign(assign)?,
            errors: params::on_error_rule(on_error, max_failures)?,
            decode_threads: budgets.decode_threads,
            io_depth: budgets.io_depth,
            slots: budgets.slots,
            slot_bytes: budgets.slot_bytes,
            image_pixels_max,
            decode,
        };
        let slots = settings.slots;
        let prepared = py.detach(|| prepare(&settings, &env))?;
        let origin =
            (env.local_world_size == 1).then(|| (settings.clone_ref(py), prepared.clone()));
        let core = Arc::new(Core {
            engine: Mutex::new(None),
            feeder: Mutex::new(None),
            per_epoch: prepared.per_epoch,
            epochs,
            next_epoch: AtomicU32::new(0),
            taken: Mutex::new(0),
        });
        live(&core);
        let loader = Loader {
            origin,
            core,
            pending: Mutex::new(Some(Pending {
                settings,
                prepared,
                resume: None,
            })),
            run: Mutex::new(None),
            given: AtomicU64::new(0),
            held: Count::default(),
            slots,
            head_end: Mutex::new(None),
            channels_first,
            env,
            world,
            pid: std::process::id(),
        };
        if let Some(w) = &loader.world {
            // Building a loader with peers is collective: it starts now, in every process.
            w.track(Box::new(Arc::downgrade(&loader.core)));
            loader.started(py)?;
        }
        Ok(loader)
    }

    /// This rank's position as a plain dict (JSON and `torch.save` carry it): the batches
    /// this loader returned so far (not those prefetched) and the job it belongs to, with a
    /// checksum. Save it after a training step, when every rank has taken as many batches;
    /// on a node of several ranks every rank saves its own.
    fn state_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if lock(&self.pending).is_some() {
            self.started(py)?;
        }
        // A closed loader still says where it stopped.
        let json = {
            let run = lock(&self.run);
            let run = run
                .as_ref()
                .ok_or_else(|| StoppedError::new_err("the loader was closed before it started"))?;
            let at = run
                .positions
                .after(self.env.local_rank, self.given.load(Ordering::SeqCst));
            LoaderState {
                version: STATE_VERSION,
                job: run.positions.job.clone(),
                ranks: vec![at],
            }
            .to_json()
        };
        Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
    }

    /// Continues from `state` (a `state_dict()` of this job, maybe from a run of another
    /// world size): the batches that follow are the uninterrupted run's. Call it after
    /// building the loader and before anything starts it (iterating, `state_dict()`,
    /// `metrics()`, `arena`); it starts the engine, resumed. On a node of several ranks every rank loads its own state and
    /// they must agree: a rank whose state differs from local rank 0's is refused naming the
    /// field. A damaged state, or one of another dataset, seed or batch size, raises
    /// `StateError` naming what differs.
    fn load_state_dict(&self, py: Python<'_>, state: Bound<'_, PyAny>) -> PyResult<()> {
        let json: String = py
            .import("json")?
            .call_method1("dumps", (state,))
            .map_err(|e| {
                StateError::new_err(format!(
                    "unreadable loader state: not a dict of JSON values ({e})"
                ))
            })?
            .extract()?;
        let state = LoaderState::from_json(&json).map_err(loader_error)?;
        let at = *state
            .ranks
            .first()
            .ok_or_else(|| StateError::new_err("unreadable loader state: no rank positions"))?;
        let mut pending = lock(&self.pending);
        if pending.is_none() && self.given.load(Ordering::SeqCst) == 0 {
            if let Some((settings, prepared)) = &self.origin {
                // Started, no batch taken yet: stopped and started again, resumed.
                if lock(&self.core.engine).is_none() {
                    return Err(StoppedError::new_err("the loader was closed"));
                }
                let core = Arc::clone(&self.core);
                py.detach(move || core.close())?;
                lock(&self.run).take();
                *pending = Some(Pending {
                    settings: settings.clone_ref(py),
                    prepared: prepared.clone(),
                    resume: None,
                });
            }
        }
        let Some(p) = pending.as_mut() else {
            drop(pending);
            return self.load_when_started(&state);
        };
        p.resume = Some(state);
        self.core.next_epoch.store(at.epoch, Ordering::SeqCst);
        *lock(&self.core.taken) = at.iteration as usize;
        drop(pending);
        // Started now, so that a state of another job is refused here, not at the first
        // batch, and the resumed run prefetches while the caller sets up.
        self.started(py).map(drop)
    }

    /// Batches per epoch.
    fn __len__(&self) -> usize {
        self.core.per_epoch
    }

    /// Epochs the loader was built for.
    #[getter]
    fn epochs(&self) -> u32 {
        self.core.epochs
    }

    /// This process's global rank.
    #[getter]
    fn rank(&self) -> usize {
        self.env.rank
    }

    /// Ranks in the job.
    #[getter]
    fn world_size(&self) -> usize {
        self.env.world_size
    }

    /// This process's node.
    #[getter]
    fn node(&self) -> usize {
        self.env.node
    }

    /// Nodes in the job.
    #[getter]
    fn nodes(&self) -> usize {
        self.env.nodes
    }

    /// Whether the node fetches from its peers' caches (a build with MPI, under `mpirun` or
    /// `srun` with PMI, each process a node).
    #[getter]
    fn peers(&self) -> bool {
        self.world.is_some()
    }

    /// With peers: waits until every node of the MPI job is here, serving its peers
    /// meanwhile. Nodes must stay in lock-step, within a prefetch window of each other, for
    /// the planned remote hits to be there: a job whose steps end in a collective (DDP's
    /// all-reduce) needs no more; any other calls this after each batch. Without peers it
    /// returns at once.
    fn step_barrier(&self, py: Python<'_>) -> PyResult<()> {
        match &self.world {
            Some(w) => py.detach(|| w.barrier()),
            None => Ok(()),
        }
    }

    /// This process's rank on its node; local rank 0 hosts the node's engine.
    #[getter]
    fn local_rank(&self) -> usize {
        self.env.local_rank
    }

    /// Ranks on this node.
    #[getter]
    fn local_world_size(&self) -> usize {
        self.env.local_world_size
    }

    /// `(address, bytes)` of the node's shared arena in this process, which every batch's
    /// images lie in; `None` for a node of one rank (its batches are this process's). Asking
    /// starts a node's engine.
    #[getter]
    fn arena(&self, py: Python<'_>) -> PyResult<Option<(usize, usize)>> {
        if self.env.local_world_size == 1 {
            return Ok(None);
        }
        self.started(py)?;
        Ok(lock(&self.run)
            .as_ref()
            .and_then(|r| r.arena.as_ref())
            .map(|r| (r.start, r.end - r.start)))
    }

    /// Names the epoch the next iteration yields. Epochs come in order (the plan covers
    /// them all from the start): `epoch` must be the next one, or the one under way. An
    /// epoch whose every batch was given is over, whether or not its end was asked for
    /// (the second loader of a `zip`).
    fn set_epoch(&self, epoch: params::Int) -> PyResult<()> {
        let epoch = params::int("epoch", &epoch, 0..=u32::MAX)?;
        let mut taken = lock(&self.core.taken);
        let current = self.core.next_epoch.load(Ordering::SeqCst);
        if epoch < self.core.epochs && epoch == current + 1 && *taken >= self.epoch_end(current) {
            // Every batch of the epoch was given, though nobody asked for its end (as
            // `zip` does not of its second loader): the epoch is over.
            *taken = 0;
            self.core.next_epoch.store(epoch, Ordering::SeqCst);
            return Ok(());
        }
        if epoch != current {
            return Err(PyValueError::new_err(format!(
                "epoch = {epoch}: the loader's next epoch is {current} (epochs are loaded in \
                 order, 0 to {})",
                self.core.epochs.saturating_sub(1)
            )));
        }
        Ok(())
    }

    /// One epoch's batches: the next epoch, from where it stands.
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        if std::process::id() != self.pid {
            return Err(Error::new_err(
                "this Loader was built in another process (this one is a fork of it, e.g. a \
                 DataLoader worker): build a Loader in the process that iterates it",
            ));
        }
        let batches = self.started(py)?;
        let epoch = self.core.next_epoch.load(Ordering::SeqCst);
        if epoch >= self.core.epochs {
            return Ok(None);
        }
        {
            let end = self.epoch_end(epoch);
            let mut taken = lock(&self.core.taken);
            if *taken >= end {
                // The epoch is over: this iteration ends, the next begins the next epoch.
                *taken = 0;
                self.core.next_epoch.store(epoch + 1, Ordering::SeqCst);
                return Ok(None);
            }
        }
        let held = self.held.now();
        if held >= buffers(self.slots) {
            return Err(PyValueError::new_err(format!(
                "budgets.slots = {}: the caller holds {held} batches, every buffer of its rank \
                 (slots + {}); drop one (and every view of its images) before taking the \
                 next, or give the Loader Budgets(slots=...) to hold more",
                self.slots,
                FEEDER_AHEAD + 1
            )));
        }
        let made = loop {
            let rx = batches.clone();
            let got = py.detach(move || rx.recv_timeout(SIGNAL_POLL));
            if !matches!(got, Ok(Ok(_))) {
                // A Ctrl-C that came during the wait wins over a failure it may have caused
                // (local rank 0 interrupted stops the node's other ranks, which torchrun
                // interrupts a moment later): the caller gets its KeyboardInterrupt, not an
                // error that Python would still be printing when the signal lands.
                py.check_signals()?;
            }
            match got {
                Ok(b) => break b?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(StoppedError::new_err(
                        "the loader has no more batches (it stopped or ended)",
                    ))
                }
            }
        };
        *lock(&self.core.taken) += 1;
        self.given.fetch_add(1, Ordering::SeqCst);
        // A decode callable's batch holds none of the loader's buffers.
        let held = made._holder.is_some().then(|| self.held.take());
        Ok(Some(Batch::new(made, self.channels_first, held)))
    }

    /// The run's figures so far (hits, accesses, stall and load times...), as a dict: the
    /// node's, from the process that runs its engine (a node's other ranks get `None`).
    fn metrics(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.started(py)?;
        let m = match &*lock(&self.core.engine) {
            None => return Err(StoppedError::new_err("the loader was closed")),
            Some(Engine::InProcess(l)) => Some(l.metrics()),
            Some(Engine::Host(h)) => h.metrics(),
            Some(Engine::Attached) => None,
        };
        let Some(m) = m else { return Ok(None) };
        let dict = PyDict::new(py);
        dict.set_item("hits", m.hits)?;
        dict.set_item("accesses", m.accesses)?;
        dict.set_item("hit_ratio", m.hit_ratio)?;
        dict.set_item("skipped", m.skipped)?;
        dict.set_item("samples", m.samples)?;
        // Peers: what the plan sent to their caches and what they served.
        dict.set_item("planned_remote_hits", m.planned_remote_hits)?;
        dict.set_item("remote_hits", m.remote_hits)?;
        dict.set_item("remote_misses", m.remote_misses)?;
        dict.set_item("remote_timeouts", m.remote_timeouts)?;
        // Modes as the JSON has them: {"mode": ..., "reason": ...}.
        let mode = |mode: String, reason: Option<String>| -> PyResult<Bound<'_, PyDict>> {
            let d = PyDict::new(py);
            d.set_item("mode", mode)?;
            d.set_item("reason", reason)?;
            Ok(d)
        };
        let (r, t, f) = (m.read_path, m.pipeline_threads, m.cache_forms);
        dict.set_item("read_path", mode(r.mode.to_string(), r.reason)?)?;
        dict.set_item("pipeline_threads", mode(t.mode.to_string(), t.reason)?)?;
        dict.set_item("cache_forms", mode(f.mode.to_string(), f.reason)?)?;
        let plan = serde_json::to_value(m.peer_plan.mode).expect("a plain name");
        let plan = mode(
            plan.as_str().unwrap_or("?").to_owned(),
            m.peer_plan.reason.clone(),
        )?;
        dict.set_item("peer_plan", plan)?;
        let a = &m.assign;
        dict.set_item("assign", mode(a.mode.to_string(), a.reason.clone())?)?;
        dict.set_item("hits_encoded", m.hits_encoded)?;
        dict.set_item("hits_decoded", m.hits_decoded)?;
        dict.set_item("decoded_hits_served", m.decoded_hits_served)?;
        dict.set_item("decoded_again", m.decoded_again)?;
        dict.set_item("decode_saved_seconds", m.decode_saved_seconds)?;
        dict.set_item("peak_cached_encoded_bytes", m.peak_cached_encoded_bytes)?;
        dict.set_item("peak_cached_decoded_bytes", m.peak_cached_decoded_bytes)?;
        // The JSON's form_costs, field for field: what the two-form rule priced with and
        // where each cost came from.
        dict.set_item("form_costs", as_json(py, m.form_costs.as_ref())?)?;
        // The JSON's cluster_plan: storage reads against the floor, what was rerouted.
        dict.set_item("cluster_plan", as_json(py, m.cluster_plan.as_ref())?)?;
        // Storage reads by epoch: what a cache, on disk or in memory, spared storage.
        dict.set_item("storage_reads_by_epoch", m.storage_reads_by_epoch)?;
        dict.set_item("storage_bytes_by_epoch", m.storage_bytes_by_epoch)?;
        // GETs of an object store by epoch (empty for local files).
        dict.set_item("object_requests_by_epoch", m.object_requests_by_epoch)?;
        // The JSON's disk_cache, field for field: the plan's disk hits and what the files gave.
        dict.set_item("disk_cache", as_json(py, m.disk_cache.as_ref())?)?;
        Ok(Some(dict.into_any().unbind()))
    }

    /// Stops the loader and waits for its feeder thread (a `decode` call under way
    /// finishes first), with the GIL released; iterating afterwards raises `StoppedError`.
    /// On a node of several ranks, local rank 0's close waits until every local rank has
    /// had its batches (the node's engine runs in its process), or stops them all if it
    /// closes early. A loader left open is closed when collected, or at exit.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.env.local_world_size > 1 && lock(&self.pending).is_some() {
            // Started so that the node's other ranks, waiting to attach, are told it stopped.
            self.started(py)?;
        }
        lock(&self.pending).take();
        // The GIL released: the feeder may need it to finish a decode call.
        let core = Arc::clone(&self.core);
        py.detach(move || core.close())
    }
}

/// `value` as Python's `json.loads` makes of its JSON (`None` for none).
fn as_json<'py>(
    py: Python<'py>,
    value: Option<&impl serde::Serialize>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    value
        .map(|v| {
            let json = serde_json::to_string(v).expect("plain numbers and names");
            py.import("json")?.call_method1("loads", (json,))
        })
        .transpose()
}

impl Loader {
    /// Where epoch `epoch` ends, in batches: a resumed run's first epoch may end elsewhere.
    fn epoch_end(&self, epoch: u32) -> usize {
        match *lock(&self.head_end) {
            Some((e, end)) if e == epoch => end,
            _ => self.core.per_epoch,
        }
    }

    /// Starts the engine if it has not started; its batches, or `StoppedError` once closed.
    fn started(&self, py: Python<'_>) -> PyResult<Receiver<Fed>> {
        if std::process::id() != self.pid {
            return Err(Error::new_err(
                "this Loader was built in another process (this one is a fork of it): build a \
                 Loader in the process that uses it",
            ));
        }
        let mut pending = lock(&self.pending);
        if let Some(p) = pending.take() {
            let (env, world) = (self.env.clone(), self.world.clone());
            let Pending {
                settings,
                prepared,
                resume,
            } = p;
            // Waits for the node's host or ranks answer Ctrl-C: the GIL is taken back now
            // and then to run Python's signal handlers, whose error ends the wait.
            let mut interrupt: Option<PyErr> = None;
            let interrupted = &mut interrupt;
            let started = py.detach(move || {
                let mut keep_waiting = || {
                    Python::attach(|py| py.check_signals())
                        .map_err(|e| *interrupted = Some(e))
                        .is_ok()
                };
                start(
                    settings,
                    prepared,
                    &env,
                    world.as_ref(),
                    resume,
                    &mut keep_waiting,
                )
            });
            if let Some(e) = interrupt {
                return Err(e);
            }
            if started.is_err() {
                // As in `__next__`: a Ctrl-C that came meanwhile wins over the failure it may
                // have caused (the host interrupted while this rank attached).
                py.check_signals()?;
            }
            let Started {
                engine,
                batches,
                arena,
                positions,
                feeder,
            } = started?;
            // Where the run begins: a resumed run's first epoch may be cut (another world).
            let (first_epoch, first_taken, head_end) = match positions.head {
                Some((steps, first, _, _)) => (
                    positions.start_epoch,
                    first as usize,
                    Some((positions.start_epoch, first as usize + steps as usize)),
                ),
                None => (positions.start_epoch, 0, None),
            };
            self.core.next_epoch.store(first_epoch, Ordering::SeqCst);
            *lock(&self.core.taken) = first_taken;
            *lock(&self.head_end) = head_end;
            self.given.store(0, Ordering::SeqCst);
            *lock(&self.core.engine) = Some(engine);
            *lock(&self.core.feeder) = Some(feeder);
            *lock(&self.run) = Some(Run {
                batches,
                arena,
                positions,
            });
        }
        drop(pending);
        if lock(&self.core.engine).is_none() {
            return Err(StoppedError::new_err("the loader was closed"));
        }
        lock(&self.run)
            .as_ref()
            .map(|r| r.batches.clone())
            .ok_or_else(|| StoppedError::new_err("the loader was closed"))
    }

    /// `load_state_dict` on a started loader: only a state at the run's start, of this job,
    /// before the first batch.
    fn load_when_started(&self, state: &LoaderState) -> PyResult<()> {
        let run = lock(&self.run);
        let Some(run) = run.as_ref() else {
            return Err(StoppedError::new_err("the loader was closed"));
        };
        let at = state.ranks[0];
        let here = run.positions.after(self.env.local_rank, 0);
        let given = self.given.load(Ordering::SeqCst);
        if given > 0 || (at.epoch, at.consumed) != (here.epoch, here.consumed) {
            let why = if given > 0 {
                format!(
                    "this loader already gave {given} batches: load the state into a new \
                     Loader, before its first batch"
                )
            } else {
                "on a node of several ranks the engine starts at the first batch, \
                 state_dict(), metrics() or arena: call load_state_dict before those"
                    .to_owned()
            };
            return Err(PyValueError::new_err(format!(
                "load_state_dict: {why} (the state is at epoch {} iteration {})",
                at.epoch, at.iteration
            )));
        }
        same_job(&state.job, &run.positions.job)
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child: the engine's threads are not here to be waited for.
            std::mem::forget(lock(&self.core.engine).take());
            std::mem::forget(lock(&self.core.feeder).take());
            return;
        }
        let closed = if lock(&self.core.feeder).is_some() {
            // Collected by Python, which holds the GIL: released while the feeder finishes
            // (it may be waiting for the GIL to call a decode callable).
            let core = &self.core;
            Python::attach(|py| py.detach(|| core.close()))
        } else {
            self.core.close()
        };
        if let Err(e) = closed {
            log::warn!("lobster_io: closing the loader: {e}");
        }
    }
}

/// Ends an engine: a host waits for the node's other ranks (or stops them if this rank
/// stopped early).
fn finish(engine: Option<Engine>, complete: bool) -> PyResult<()> {
    match engine {
        Some(Engine::Host(host)) => {
            if !complete {
                host.stop("local rank 0 closed its loader before its last batch");
            }
            match host.wait() {
                Ok(_) => Ok(()),
                Err(e) if complete => Err(node_error(e)),
                Err(_) => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// What a state must share with this loader's job, field by field, as the library checks it.
fn same_job(saved: &JobFingerprint, now: &JobFingerprint) -> PyResult<()> {
    let fields = [
        (
            "samples",
            saved.samples.to_string(),
            now.samples.to_string(),
        ),
        ("dataset", saved.dataset.clone(), now.dataset.clone()),
        ("order", saved.order.clone(), now.order.clone()),
        (
            "batch_size",
            saved.batch_size.to_string(),
            now.batch_size.to_string(),
        ),
        (
            "drop_last",
            saved.drop_last.to_string(),
            now.drop_last.to_string(),
        ),
    ];
    for (field, saved, now) in fields {
        if saved != now {
            return Err(loader_error(lobster_io::Error::Resume {
                field,
                saved,
                now,
            }));
        }
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A loader, closed at exit before MPI is finalised.
impl Closable for Weak<Core> {
    fn open(&self) -> bool {
        self.upgrade().is_some_and(|c| lock(&c.engine).is_some())
    }

    fn close(&self) {
        if let Some(core) = self.upgrade() {
            if let Err(e) = core.close() {
                log::warn!("lobster_io: closing the loader at exit: {e}");
            }
        }
    }
}
