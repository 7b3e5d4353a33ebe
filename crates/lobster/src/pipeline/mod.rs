//! The pipeline: how a sample walks from the sampler to a rank's batch. Its rooms are the
//! stages a sample meets, read in this order:
//! 1. [`plan`]: the planner thread walks the node stream ([`layout`]) in canonical
//!    order a window at a time and makes every cache decision, so hits and misses are a pure
//!    function of the inputs; it opens the window's batches, runs the allocator, stays within
//!    the prefetch distance of the slowest rank, and says who reads each miss.
//! 2. [`io`]: the dispatcher issues the window's reads in deadline order within the io_depth
//!    budget and fills each sample's [`landing`] when its read completes; every read
//!    attempt's fate (emulated tier, injected fault, retry, error) is decided in
//!    [`read`], for the reads made on worker threads too.
//! 3. [`decode`]: decode workers take accesses whose bytes are known, run the user's
//!    function (in two stages with a decoded tier) and deliver each sample.
//! 4. [`deliver`]: each rank's reorder buffer, and a rank taking its next whole batch.
//! 5. [`peers`]: other nodes' caches: which peer holds each access's sample, the fetch and
//!    its fallback to storage, and this node's cache as its peers see it.
//!
//! [`state`] composes the stages' shared parts; [`context`] holds what never changes.

mod access;
mod context;
mod decode;
mod deliver;
mod free_memory;
mod io;
mod landing;
mod layout;
pub(crate) mod peers;
mod plan;
mod progress;
mod read;
mod read_path;
mod state;
mod sync;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use lobster_sched::CostModel;
use lobster_uring::Reader;

pub(crate) use context::{Context, DecodeFn, DecodedTier};
pub(crate) use decode::forms::{decoded_sizes, form_costs, CostsFrom, Staged};
pub(crate) use deliver::{detach, next_batch, poll_next_batch};
pub(crate) use layout::{EpochEnds, Head, Layout};
pub use peers::plan::{PeerPlan, PeerPlanInputs};
pub(crate) use peers::{PeerCounters, Peers, ServedLandings};
pub(crate) use plan::read_ahead_budget_bytes;
pub(crate) use read::attempt::Storage;
pub(crate) use read::dirs::SampleDirs;
pub(crate) use state::PipelineState;
pub(crate) use sync::lock;

use crate::error::Error;
use crate::metrics::Collector;

/// The running pipeline: its threads and shared state.
pub(crate) struct Pipeline<T> {
    pub(crate) state: Arc<PipelineState<T>>,
    threads: Vec<JoinHandle<()>>,
    reader: Option<Reader>,
    pub(crate) layout: Layout,
    /// Directories the workers and the dispatcher open files in.
    pub(crate) dirs_held: usize,
    /// What the threads share and never change.
    pub(crate) context: Arc<Context<T>>,
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

impl<T: Send + 'static> Pipeline<T> {
    /// Starts the planner, the dispatcher (with a reader: pipelined) and the decode workers.
    pub(crate) fn start(ctx: Context<T>, reader: Option<Reader>) -> Result<Self, Error> {
        let ranks = ctx.layout.ranks;
        let config = &ctx.config;
        let workers = config.budgets.decode_threads;
        let (to_dispatcher, dispatcher_rx) = crossbeam_channel::unbounded();
        let state = Arc::new(PipelineState {
            stop: sync::StopSignal::default(),
            outstanding: AtomicUsize::new(0),
            planner_done: AtomicBool::new(false),
            ranks: (0..ranks)
                .map(|_| deliver::reorder::ReorderBuffer::new())
                .collect(),
            decode: decode::queue::DecodeQueues::new(
                ranks,
                &lobster_sched::equal_split(workers as u32, ranks),
                if config.execution.workers_per_rank() {
                    decode::queue::TakeRule::OwnRank
                } else {
                    decode::queue::TakeRule::OldestIteration
                },
            ),
            progress: progress::Progress::new(ranks),
            collector: Mutex::new(Collector::new(
                ranks,
                ctx.layout.epochs,
                ctx.layout.start_epoch,
            )),
            model: Mutex::new(CostModel::new()),
            failure: Mutex::new(None),
            on_error: config.on_error,
            epoch_accesses: (ctx.layout.per_rank * ranks) as u64,
            budget_failure: Mutex::new(None),
            // Peers are served from the cache's own copies.
            read_path: read_path::ReadPathCounters::new(
                config.cache_in_page_cache().is_ok() && ctx.peers.is_none(),
            ),
            to_dispatcher: reader.is_some().then_some(to_dispatcher),
            batch_refused: Mutex::new(None),
            forms: decode::forms::FormCounters::default(),
            form_plan: Mutex::new(None),
            cluster_plan: Mutex::new(None),
            free_memory: free_memory::FreeMemory::new(ctx.reader.clone(), ctx.arena.clone()),
        });
        let ctx = Arc::new(ctx);
        if let Some(peers) = &ctx.peers {
            peers.transport.serve(peers.served.clone());
        }
        let mut pipeline = Pipeline {
            state: state.clone(),
            threads: Vec::new(),
            reader: None,
            layout: ctx.layout.clone(),
            dirs_held: ctx.dirs.as_ref().map_or(0, SampleDirs::held),
            context: ctx.clone(),
            serving: ctx.peers.is_some(),
        };
        // On an error below, dropping `pipeline` stops and joins what started.
        let mut spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|e| Error::Stopped {
                    reason: format!("cannot start a thread: {e}"),
                })?;
            pipeline.threads.push(handle);
            Ok::<_, Error>(())
        };
        if let Some(reader) = &reader {
            let (c, s, r) = (ctx.clone(), state.clone(), reader.clone());
            spawn(
                "lobster-dispatch".into(),
                Box::new(move || {
                    if let Err(e) = io::dispatcher(&c, &s, &r, dispatcher_rx) {
                        s.fail(e);
                    }
                }),
            )?;
        }
        for w in 0..workers {
            let (c, s) = (ctx.clone(), state.clone());
            spawn(
                format!("lobster-decode-{w}"),
                Box::new(move || decode::decode_worker(&c, &s, w)),
            )?;
        }
        {
            let (c, s) = (ctx.clone(), state.clone());
            spawn(
                "lobster-plan".into(),
                Box::new(move || {
                    if let Err(e) = plan::planner(&c, &s) {
                        s.fail(e);
                    }
                    s.planner_done.store(true, Ordering::SeqCst);
                    s.decode.wake();
                }),
            )?;
        }
        pipeline.reader = reader;
        Ok(pipeline)
    }
}

impl<T> Pipeline<T> {
    /// Stops every thread and waits for them; in-flight reads are waited for by the reader.
    pub(crate) fn shutdown(&mut self) {
        if std::mem::take(&mut self.serving) {
            if let Some(peers) = &self.context.peers {
                peers.transport.unserve();
            }
        }
        self.state.stop.set();
        self.state.wake_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(peers) = &self.context.peers {
            peers.gate.close();
        }
        self.reader = None;
        self.state.free_memory.clear();
    }
}

impl<T> Drop for Pipeline<T> {
    fn drop(&mut self) {
        self.shutdown();
    }
}
