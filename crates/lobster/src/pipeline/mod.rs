//! The pipeline: how a sample walks from the sampler to a rank's batch. Its rooms are the
//! stages a sample meets, read in this order; a stage imports only the stages after it, and
//! the files at this folder's root import no stage:
//! 1. [`plan`]: the planner thread walks the node stream ([`layout`]) in canonical
//!    order a window at a time and makes every cache decision, so hits and misses are a pure
//!    function of the inputs; it opens the window's batches, runs the allocator, stays within
//!    the prefetch distance of the slowest rank ([`progress`]), says who reads each miss
//!    ([`read_path`]), and starts the peer fetches of planned remote hits.
//! 2. [`io`]: the dispatcher issues the window's reads in deadline order within the io_depth
//!    budget and fills each sample's [`landing`] when its read completes. With a disk cache,
//!    [`disk`]: one thread applies the plan's disk operations in plan order (reads of disk
//!    hits, which fill their landings, drops, and writes once their bytes have landed).
//! 3. [`decode`]: decode workers take accesses whose bytes are known, run the user's
//!    function (in two stages with a decoded tier) and deliver each sample.
//! 4. [`deliver`]: each rank's reorder buffer, and a rank taking its next whole batch.
//!
//! Beside them, imported by the stages and importing none: [`read`], every read attempt's
//! fate (emulated tier, injected fault, retry, error), for the dispatcher's reads and the
//! workers' alike; [`peers`], other nodes' caches (which peer holds each access's sample,
//! the fetch and its settling, this node's cache as its peers see it); and [`context`], what
//! never changes (it names `read`'s read fates and directories). Each thread is given only what
//! it touches: [`plan::ForPlanner`], [`io::ForDispatcher`], [`decode::ForWorkers`],
//! [`deliver::ForRanks`], built here.

mod access;
mod context;
mod decode;
mod deliver;
mod disk;
mod free_memory;
mod io;
mod landing;
mod layout;
mod outstanding;
pub(crate) mod peers;
mod plan;
mod progress;
mod read;
mod read_path;
mod sync;
mod threads;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;

use lobster_sched::CostModel;
use lobster_uring::Reader;

pub(crate) use context::{Context, DecodeFn};
pub(crate) use decode::forms::{
    decoded_sizes, form_costs, CostsFrom, DecodedTier, FormCounters, Staged,
};
pub(crate) use deliver::{detach, next_batch, poll_next_batch, ForRanks};
pub(crate) use disk::DiskLevel;
pub(crate) use layout::{EpochEnds, Head, Layout};
pub use peers::plan::{PeerHolders, PeerHoldersInputs};
pub(crate) use peers::{PeerCounters, Peers, ServedLandings};
pub(crate) use plan::read_ahead_budget_bytes;
pub(crate) use progress::Progress;
pub(crate) use read::attempt::ReadFates;
pub(crate) use read::dirs::SampleDirs;
pub(crate) use read_path::ReadPathCounters;
pub(crate) use sync::lock;

use crate::error::Error;
use crate::metrics::Collector;
use decode::queue::DecodeQueues;
use deliver::reorder::ReorderBuffer;
use sync::StopSignal;

/// The running pipeline: its threads, and the parts of their state that the loader reads.
pub(crate) struct Pipeline<T> {
    threads: Vec<JoinHandle<()>>,
    reader: Option<Reader>,
    pub(crate) layout: Layout,
    /// Directories the workers and the dispatcher open files in.
    pub(crate) dirs_held: usize,
    /// What the threads share and never change.
    pub(crate) context: Arc<Context<T>>,
    /// What each rank's handle is given.
    pub(crate) for_ranks: Arc<ForRanks<T>>,
    /// What the planner is given, which the loader's metrics read (the read path, the
    /// planner's form and cluster plans, the peers, the decoded tier); kept too for the
    /// answers of the planner's peer fetches, which may come after it ends.
    pub(crate) for_planner: Arc<plan::ForPlanner<T>>,
    stopper: Arc<Stopper<T>>,
    /// What the decoded tier did.
    pub(crate) forms: Arc<FormCounters>,
    /// Whether this node's cache is still served to its peers.
    serving: bool,
}

impl<T> std::fmt::Debug for Pipeline<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

/// What ends the pipeline, on a thread's failure or a drop: the stop flag, and every
/// sleeper woken to see it.
struct Stopper<T> {
    stop: Arc<StopSignal>,
    /// A failure that ends the pipeline (planner or dispatcher error).
    failure: Arc<Mutex<Option<Error>>>,
    decode: Arc<DecodeQueues>,
    progress: Arc<Progress>,
    ranks: Arc<[ReorderBuffer<T>]>,
}

impl<T> Stopper<T> {
    fn wake_all(&self) {
        self.decode.wake();
        self.progress.wake();
        for r in self.ranks.iter() {
            r.wake();
        }
    }

    /// Records a failure that ends the pipeline and stops; rank handles report it.
    fn fail(&self, error: Error) {
        lock(&self.failure).get_or_insert(error);
        self.stop.set();
        self.wake_all();
    }
}

/// What each thread is given, built together so that what several of them share is made
/// once.
struct Handles<T> {
    for_ranks: Arc<ForRanks<T>>,
    for_planner: Arc<plan::ForPlanner<T>>,
    for_dispatcher: Arc<io::ForDispatcher<T>>,
    for_workers: Arc<decode::ForWorkers<T>>,
    /// The disk thread's, with a disk cache.
    for_disk: Option<Arc<disk::ForDisk>>,
    stopper: Arc<Stopper<T>>,
    /// The dispatcher's end of the planner's requests.
    to_dispatcher: Receiver<io::order::ToDispatcher>,
}

impl<T> Handles<T> {
    fn new(
        ctx: &Context<T>,
        peers: Option<Arc<Peers>>,
        (tier, disk): (Option<Arc<DecodedTier<T>>>, Option<Arc<DiskLevel>>),
        dispatches: bool,
    ) -> Self {
        let ranks = ctx.layout.ranks;
        let config = &ctx.config;
        let (to_dispatcher, dispatcher_rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(StopSignal::default());
        let outstanding = Arc::new(outstanding::Outstanding::default());
        let reorder: Arc<[ReorderBuffer<T>]> = (0..ranks).map(|_| ReorderBuffer::new()).collect();
        let decode_queues = Arc::new(DecodeQueues::new(
            ranks,
            &lobster_sched::equal_split(config.budgets.decode_threads as u32, ranks),
            if config.execution.workers_per_rank() {
                decode::queue::TakeRule::OwnRank
            } else {
                decode::queue::TakeRule::OldestIteration
            },
        ));
        let progress = Arc::new(Progress::new(ranks));
        let collector = Arc::new(Mutex::new(Collector::new(
            ranks,
            ctx.layout.epochs,
            ctx.layout.start_epoch,
        )));
        let model = Arc::new(Mutex::new(CostModel::new()));
        let failure = Arc::new(Mutex::new(None));
        // Peers are served from the cache's own copies.
        let read_path = Arc::new(ReadPathCounters::new(
            config.cache_in_page_cache().is_ok() && peers.is_none(),
        ));
        let batch_refused = Arc::new(Mutex::new(None));
        let for_ranks = Arc::new(ForRanks {
            stop: stop.clone(),
            failure: failure.clone(),
            ranks: reorder.clone(),
            progress: progress.clone(),
            collector: collector.clone(),
            on_error: config.on_error,
            epoch_accesses: (ctx.layout.per_rank * ranks) as u64,
            budget_failure: Mutex::new(None),
            free_memory: Arc::new(free_memory::FreeMemory::new(
                ctx.reader.clone(),
                ctx.arena.clone(),
            )),
        });
        let for_planner = Arc::new(plan::ForPlanner {
            stop: stop.clone(),
            batch_refused: batch_refused.clone(),
            progress: progress.clone(),
            outstanding: outstanding.clone(),
            decode: decode_queues.clone(),
            ranks: reorder.clone(),
            to_dispatcher: dispatches.then_some(to_dispatcher),
            collector,
            model: model.clone(),
            read_path: read_path.clone(),
            form_plan: Arc::new(Mutex::new(None)),
            cluster_plan: Arc::new(Mutex::new(None)),
            peers: peers.clone(),
            tier: tier.clone(),
            disk: disk.clone(),
        });
        let for_disk = disk.map(|level| {
            Arc::new(disk::ForDisk {
                stop: stop.clone(),
                decode: decode_queues.clone(),
                level,
            })
        });
        let for_dispatcher = Arc::new(io::ForDispatcher {
            stop: stop.clone(),
            outstanding: outstanding.clone(),
            decode: decode_queues.clone(),
            ranks: reorder.clone(),
            model: model.clone(),
        });
        let for_workers = Arc::new(decode::ForWorkers {
            stop: stop.clone(),
            batch_refused,
            outstanding,
            decode: decode_queues.clone(),
            ranks: reorder.clone(),
            model,
            read_path,
            forms: Arc::new(FormCounters::default()),
            peers,
            tier,
        });
        let stopper = Arc::new(Stopper {
            stop,
            failure,
            decode: decode_queues,
            progress,
            ranks: reorder,
        });
        Handles {
            for_ranks,
            for_planner,
            for_dispatcher,
            for_workers,
            for_disk,
            stopper,
            to_dispatcher: dispatcher_rx,
        }
    }
}

impl<T: Send + 'static> Pipeline<T> {
    /// Starts the planner, the dispatcher (with a reader: pipelined) and the decode workers,
    /// each given only what it touches.
    pub(crate) fn start(
        ctx: Context<T>,
        peers: Option<Peers>,
        (tier, disk): (Option<DecodedTier<T>>, Option<DiskLevel>),
        reader: Option<Reader>,
    ) -> Result<Self, Error> {
        let peers = peers.map(Arc::new);
        let handles = Handles::new(
            &ctx,
            peers.clone(),
            (tier.map(Arc::new), disk.map(Arc::new)),
            reader.is_some(),
        );
        let ctx = Arc::new(ctx);
        if let Some(peers) = &peers {
            peers.transport.serve(peers.served.clone());
        }
        let planner = &handles.for_planner;
        let mut pipeline = Pipeline {
            threads: Vec::new(),
            reader: None,
            layout: ctx.layout.clone(),
            dirs_held: ctx.dirs.as_ref().map_or(0, SampleDirs::held),
            context: ctx.clone(),
            for_ranks: handles.for_ranks.clone(),
            for_planner: planner.clone(),
            stopper: handles.stopper.clone(),
            forms: handles.for_workers.forms.clone(),
            serving: peers.is_some(),
        };
        // On an error, dropping `pipeline` stops and joins what started.
        pipeline.spawn_stages(&ctx, handles, reader.as_ref())?;
        pipeline.reader = reader;
        Ok(pipeline)
    }

    /// Spawns the dispatcher (with a reader), the decode workers and the planner.
    fn spawn_stages(
        &mut self,
        ctx: &Arc<Context<T>>,
        handles: Handles<T>,
        reader: Option<&Reader>,
    ) -> Result<(), Error> {
        let Handles {
            for_planner,
            for_dispatcher,
            for_workers,
            for_disk,
            stopper,
            to_dispatcher,
            ..
        } = handles;
        let mut spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| Error::Stopped {
                    reason: format!("cannot start a thread: {e}"),
                })?;
            self.threads.push(handle);
            Ok::<_, Error>(())
        };
        if let Some(reader) = reader {
            let (c, s, r, x) = (ctx.clone(), for_dispatcher, reader.clone(), stopper.clone());
            spawn(
                "lobster-dispatch".into(),
                Box::new(move || {
                    if let Err(e) = io::dispatcher(&c, &s, &r, to_dispatcher) {
                        x.fail(e);
                    }
                }),
            )?;
        }
        for w in 0..ctx.config.budgets.decode_threads {
            let (c, s) = (ctx.clone(), for_workers.clone());
            spawn(
                format!("lobster-decode-{w}"),
                Box::new(move || decode::decode_worker(&c, &s, w)),
            )?;
        }
        // The planner holds the disk thread's queue: it closes when the planner ends.
        let to_disk = match for_disk {
            Some(d) => {
                let (tx, rx) = crossbeam_channel::unbounded();
                let c = ctx.clone();
                spawn(
                    "lobster-disk".into(),
                    Box::new(move || disk::disk_thread(&c, &d, &rx)),
                )?;
                Some(tx)
            }
            None => None,
        };
        let (c, s, x) = (ctx.clone(), for_planner, stopper);
        spawn(
            "lobster-plan".into(),
            Box::new(move || {
                if let Err(e) = plan::planner(&c, &s, to_disk) {
                    x.fail(e);
                }
                s.outstanding.planner_done();
                s.decode.wake();
            }),
        )
    }
}

impl<T> Pipeline<T> {
    /// Stops every thread and waits for them; in-flight reads are waited for by the reader.
    pub(crate) fn shutdown(&mut self) {
        if std::mem::take(&mut self.serving) {
            if let Some(peers) = &self.for_planner.peers {
                peers.transport.unserve();
            }
        }
        self.stopper.stop.set();
        self.stopper.wake_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(peers) = &self.for_planner.peers {
            peers.gate.close();
        }
        self.reader = None;
        self.for_ranks.free_memory.clear();
    }
}

impl<T> Drop for Pipeline<T> {
    fn drop(&mut self) {
        self.shutdown();
    }
}
