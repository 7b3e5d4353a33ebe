//! The running loader, one batch iterator per local rank, and that iterator as an async
//! stream.

use std::sync::Arc;

use crate::batch::Batch;
use crate::config::{CachePolicy, Execution, LoaderConfig, PipelineThreads};
use crate::error::Error;
use crate::metrics::{CacheForms, CacheStore, Mode, ReadPath, RunMetrics, ThreadClass};
use crate::pipeline::{self, ForRanks, Pipeline};
use crate::resume::{JobFingerprint, LoaderState, Positions};
use lobster_cache::{Assign, PeerPlanKind};

/// A running loader. Take the rank handles with [`ranks`](Loader::ranks), give one to each
/// rank's training thread, and keep the loader alive while they iterate; dropping it stops
/// and joins every thread it started.
#[derive(Debug)]
pub struct Loader<T> {
    pub(super) pipeline: Pipeline<T>,
    pub(super) handles: Option<Vec<RankHandle<T>>>,
    pub(super) config: LoaderConfig,
    pub(super) backend: Option<lobster_uring::BackendInfo>,
    pub(super) window_bytes: u64,
    /// What the cache keeps of samples, as the metrics report it.
    pub(super) cache_forms: Mode<CacheForms>,
    /// How the nodes' caches are planned, as the metrics report it.
    pub(super) peer_plan: Mode<PeerPlanKind>,
    /// Which rank of a step gets which sample, as the metrics report it.
    pub(super) assign: Mode<Assign>,
    /// What a saved state must share with a loader it resumes.
    pub(super) fingerprint: JobFingerprint,
}

impl<T> Loader<T> {
    /// One handle per local rank, in rank order; `None` after the first call.
    pub fn ranks(&mut self) -> Option<Vec<RankHandle<T>>> {
        self.handles.take()
    }

    /// The configuration the loader runs with.
    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// The I/O backend and why it was chosen (`None` for read-then-decode workers).
    pub fn backend(&self) -> Option<&lobster_uring::BackendInfo> {
        self.backend.as_ref()
    }

    /// Bound on the bytes of samples the prefetch window holds outside the cache: reads in
    /// flight or waiting for decode (pipelined: the reader's pool budget), and cached copies
    /// evicted while planned hits still use them. The cache's bytes come on top, up to its
    /// capacity.
    pub fn prefetch_window_bytes(&self) -> u64 {
        self.window_bytes
    }

    /// Where every local rank is: the batches it was given so far (taken from its handle, not
    /// prefetched), as a state [`LoaderBuilder::resume_from`](crate::LoaderBuilder::resume_from) continues from. Save it when
    /// every rank has taken the same number of batches (after a training step): a resume
    /// refuses ranks at different batches.
    pub fn state(&self) -> LoaderState {
        self.positions()
            .state(&self.pipeline.for_ranks.progress.delivered())
    }

    /// How the run's batches map to positions, for a process that counts a rank's batches
    /// itself (a node's rank process) and saves its state.
    pub fn positions(&self) -> Positions {
        Positions::of(&self.pipeline.layout, self.fingerprint.clone())
    }

    /// Batches every rank is given in this run (fewer than the epochs' when resumed).
    pub fn steps(&self) -> u64 {
        self.pipeline.layout.steps()
    }

    /// Batches per epoch per rank.
    pub fn iterations_per_epoch(&self) -> usize {
        self.pipeline.layout.iterations()
    }

    /// The run's metrics so far.
    pub fn metrics(&self) -> RunMetrics {
        let shared = &self.pipeline;
        let mut m = pipeline::lock(&shared.for_ranks.collector).summary();
        let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(feature = "lab")]
        {
            m.faults_injected = count(&self.pipeline.context.storage.counters.injected);
        }
        let path = &shared.for_planner.read_path;
        let tried = count(&path.tried);
        m.reads_resident = count(&path.resident);
        m.reads_not_resident = tried - m.reads_resident.min(tried);
        m.reads_dispatched = count(&path.dispatched);
        m.dirs_held = self.pipeline.dirs_held as u64;
        m.pipeline_threads = match (
            self.config.budgets.pipeline_threads,
            &*pipeline::lock(&shared.for_planner.batch_refused),
        ) {
            (PipelineThreads::Normal, _) => Mode::chosen(ThreadClass::Normal),
            (PipelineThreads::Batch, None) => Mode::chosen(ThreadClass::Batch),
            (PipelineThreads::Batch, Some(why)) => {
                Mode::because(ThreadClass::Normal, format!("SCHED_BATCH refused: {why}"))
            }
        };
        m.read_path = match self.config.resident_reads_enabled() {
            Ok(()) => Mode::chosen(ReadPath::ResidentOnWorkers),
            Err(why) if self.config.execution == Execution::ReadThenDecode => {
                Mode::because(ReadPath::BlockingWorkers, why)
            }
            Err(why) => Mode::because(ReadPath::Dispatcher, why),
        };
        m.cached_in_page_cache = count(&path.left_in_page_cache);
        m.hits_from_page_cache = count(&path.page_cache_hits);
        m.hits_lost_by_page_cache = count(&path.page_cache_lost);
        m.cache_store = match self.config.cache_in_page_cache() {
            _ if self.config.cache.policy == CachePolicy::None => Mode::chosen(CacheStore::None),
            _ if self.pipeline.for_planner.peers.is_some() => {
                Mode::because(CacheStore::Copies, "served to peers")
            }
            Ok(()) if path.leave_in_page_cache() => {
                Mode::chosen(CacheStore::PageCacheWhereResident)
            }
            Ok(()) => Mode::because(
                CacheStore::Copies,
                format!("the page cache let {} hits go", m.hits_lost_by_page_cache),
            ),
            Err(why) => Mode::because(CacheStore::Copies, why),
        };
        if let Some(peers) = &self.pipeline.for_planner.peers {
            let c = &peers.counters;
            m.planned_remote_hits = count(&c.planned);
            m.remote_hits = count(&c.hits);
            m.remote_misses = count(&c.misses);
            m.remote_timeouts = count(&c.timeouts);
            m.peer_planned_accesses = peers.plan.planned();
            m.remote_hit_bytes = count(&c.hit_bytes);
        }
        m.peer_plan = self.peer_plan.clone();
        m.assign = self.assign.clone();
        if let Some(plan) = pipeline::lock(&shared.for_planner.cluster_plan).clone() {
            m.peer_planned_accesses = plan.epochs.iter().map(|e| e.remote_hits).sum();
            m.cluster_plan = Some(plan);
        }
        m.read_retries = count(&self.pipeline.context.storage.counters.retries);
        let [attempts, rode, reads, bytes] = self.pipeline.context.storage.delivered.counts();
        (m.storage_reads_by_epoch, m.storage_bytes_by_epoch) = (reads, bytes);
        if !matches!(
            self.pipeline.context.dataset.source(),
            crate::dataset::Source::Files
        ) {
            m.object_requests_by_epoch = attempts
                .iter()
                .zip(&rode)
                .map(|(a, r)| a.saturating_sub(*r))
                .collect();
        }
        m.reads_recovered = count(&self.pipeline.context.storage.counters.recovered);
        m.cache_forms = self.cache_forms.clone();
        if let Some(disk) = &shared.for_planner.disk {
            // Once every access is delivered only the plan's last writes and drops are left:
            // the figures wait for them, so that a finished run's are whole.
            if shared.for_planner.outstanding.drained() {
                disk.wait_finished(&shared.for_planner.stop);
            }
            m.disk_cache = Some(disk.metrics());
        }
        if let Some(tier) = &self.pipeline.for_planner.tier {
            let f = &shared.forms;
            m.form_costs = Some(tier.costs_from.report(tier.costs));
            m.decoded_hits_served = count(&f.decoded_hits);
            m.decode_saved_seconds = count(&f.decode_saved_ns) as f64 * 1e-9;
            m.images_kept = count(&f.images_kept);
            m.decoded_again = count(&f.decoded_again);
            if let Some(plan) = *pipeline::lock(&shared.for_planner.form_plan) {
                [m.hits_encoded, m.hits_decoded] = plan.hits;
                [m.peak_cached_encoded_bytes, m.peak_cached_decoded_bytes] = plan.peak_bytes;
            }
        }
        m
    }
}

/// One local rank's batches, epoch after epoch, in plan order. `Send`: the rank's training
/// thread owns it.
pub struct RankHandle<T> {
    state: Arc<ForRanks<T>>,
    rank: usize,
    ends: pipeline::EpochEnds,
    done: bool,
}

impl<T> std::fmt::Debug for RankHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankHandle")
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

impl<T> RankHandle<T> {
    pub(super) fn new(state: Arc<ForRanks<T>>, rank: usize, ends: pipeline::EpochEnds) -> Self {
        Self {
            state,
            rank,
            ends,
            done: false,
        }
    }

    /// The local rank this handle serves.
    pub fn rank(&self) -> usize {
        self.rank
    }
}

impl<T> RankHandle<T> {
    /// The rank's batches as an async stream over the same engine: a task waiting for its
    /// batch holds no thread, so every rank of a node can run on one runtime thread.
    pub fn into_stream(self) -> RankStream<T> {
        RankStream {
            handle: self,
            waiting: None,
        }
    }

    /// Notes what the rank was given: after the last batch, or an error that ends the run,
    /// nothing more comes.
    fn given(&mut self, next: &Option<Result<Batch<T>, Error>>) {
        if matches!(
            next,
            None | Some(Err(Error::Stopped { .. } | Error::TooManyFailures { .. }))
        ) {
            self.done = true;
        }
    }
}

impl<T> Iterator for RankHandle<T> {
    type Item = Result<Batch<T>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = pipeline::next_batch(&self.state, self.rank, self.ends);
        self.given(&next);
        next
    }
}

/// One local rank's batches as a [`futures_core::Stream`] ([`RankHandle::into_stream`]): the
/// same batches, in the same order and with the same errors, as the rank handle's iterator.
/// A poll that finds the batch incomplete registers the task's waker, which the decode
/// worker completing the batch (or a stop) wakes. Dropping the stream detaches the rank as
/// dropping its handle does.
///
/// ```
/// use lobster_io::{CachePolicy, Dataset, LoaderBuilder};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # for i in 0..24u32 {
/// #     let class = dir.path().join(format!("class{}", i % 3));
/// #     std::fs::create_dir_all(&class)?;
/// #     std::fs::write(class.join(format!("{i:03}.jpg")), vec![i as u8; 64])?;
/// # }
/// let mut loader = LoaderBuilder::new(Dataset::open_image_folder(dir.path())?)
///     .world(1, 2, 0)
///     .batch_size(4)
///     .cache(CachePolicy::Reuse, 1 << 20)
///     .decode(|bytes: &[u8], _meta| Ok::<_, std::io::Error>(bytes.len()))
///     .build()?;
/// let streams: Vec<_> = loader.ranks().expect("first call").into_iter().map(|h| h.into_stream()).collect();
/// // One thread drives both ranks: each waits for its batch without blocking the other.
/// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
/// let counts = runtime.block_on(async {
///     let tasks: Vec<_> = streams
///         .into_iter()
///         .map(|mut s| {
///             tokio::spawn(async move {
///                 let mut samples = 0;
///                 while let Some(batch) = s.next_batch().await {
///                     samples += batch.expect("readable samples").samples.len();
///                 }
///                 samples
///             })
///         })
///         .collect();
///     let mut counts = Vec::new();
///     for t in tasks {
///         counts.push(t.await.expect("a rank task"));
///     }
///     counts
/// });
/// assert_eq!(counts, vec![12, 12]); // 24 samples, 2 ranks, one epoch
/// # Ok(())
/// # }
/// ```
pub struct RankStream<T> {
    handle: RankHandle<T>,
    /// When the rank began to wait for the batch it polls for: its stall.
    waiting: Option<std::time::Instant>,
}

impl<T> std::fmt::Debug for RankStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankStream")
            .field("rank", &self.handle.rank)
            .finish_non_exhaustive()
    }
}

impl<T> RankStream<T> {
    /// The local rank this stream serves.
    pub fn rank(&self) -> usize {
        self.handle.rank
    }

    /// The next batch, `None` after the last: the stream's next item without a stream
    /// combinator crate.
    pub async fn next_batch(&mut self) -> Option<Result<Batch<T>, Error>> {
        std::future::poll_fn(|cx| {
            futures_core::Stream::poll_next(std::pin::Pin::new(&mut *self), cx)
        })
        .await
    }
}

impl<T> futures_core::Stream for RankStream<T> {
    type Item = Result<Batch<T>, Error>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let handle = &mut this.handle;
        if handle.done {
            return std::task::Poll::Ready(None);
        }
        let next = std::task::ready!(pipeline::poll_next_batch(
            &handle.state,
            handle.rank,
            handle.ends,
            cx,
            &mut this.waiting,
        ));
        handle.given(&next);
        std::task::Poll::Ready(next)
    }
}

impl<T> Drop for RankHandle<T> {
    fn drop(&mut self) {
        pipeline::detach(&self.state, self.rank);
    }
}
