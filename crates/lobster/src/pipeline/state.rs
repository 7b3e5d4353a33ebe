//! The state every pipeline thread and rank handle shares, composed of the rooms' own parts.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crossbeam_channel::Sender;
use lobster_sched::CostModel;

use crate::config::PipelineThreads;
use crate::error::Error;
use crate::faults::OnError;
use crate::metrics::Collector;
use crate::pipeline::access::Ready;
use crate::pipeline::decode::forms::FormCounters;
use crate::pipeline::decode::queue::DecodeQueues;
use crate::pipeline::deliver::reorder::ReorderBuffer;
use crate::pipeline::io::order::ToDispatcher;
use crate::pipeline::progress::Progress;
use crate::pipeline::read_path::ReadPathCounters;
use crate::pipeline::sync::{lock, StopSignal};

pub(crate) struct PipelineState<T> {
    pub(crate) stop: StopSignal,
    /// Accesses planned and not yet delivered to a reorder buffer.
    pub(crate) outstanding: AtomicUsize,
    pub(crate) planner_done: AtomicBool,
    pub(crate) ranks: Vec<ReorderBuffer<T>>,
    pub(crate) decode: DecodeQueues,
    pub(crate) progress: Progress,
    pub(crate) collector: Mutex<Collector>,
    pub(crate) model: Mutex<CostModel>,
    /// A failure that ends the pipeline (planner or dispatcher error).
    pub(crate) failure: Mutex<Option<Error>>,
    pub(crate) on_error: OnError,
    /// The node's accesses per epoch, the base of a fractional failure budget.
    pub(crate) epoch_accesses: u64,
    /// An epoch went over its failure budget: every rank's next batch reports it.
    pub(crate) budget_failure: Mutex<Option<Error>>,
    pub(crate) read_path: ReadPathCounters,
    /// The dispatcher's queue (pipelined only): the planner's reads, and the reads of
    /// misses a peer did not serve.
    pub(crate) to_dispatcher: Option<Sender<ToDispatcher>>,
    /// Why a pipeline thread could not run as `SCHED_BATCH`, if one could not.
    pub(crate) batch_refused: Mutex<Option<String>>,
    /// What the decoded tier did.
    pub(crate) forms: FormCounters,
    /// The planner's form decisions, once it is done (with a decoded tier).
    pub(crate) form_plan: Mutex<Option<lobster_cache::FormStats>>,
    /// This node's share of the cluster plan, once the planner is done (under it).
    pub(crate) cluster_plan: Mutex<Option<crate::metrics::ClusterPlanMetrics>>,
    /// Given back at each epoch's end.
    pub(crate) free_memory: crate::pipeline::free_memory::FreeMemory,
}

impl<T> std::fmt::Debug for PipelineState<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineState")
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

impl<T> PipelineState<T> {
    /// Hands tasks whose bytes are known to the decode workers.
    pub(crate) fn ready(&self, ready: impl IntoIterator<Item = Ready>) {
        self.decode.push(ready);
    }

    /// Every planned access was delivered and the planner is done: no task will come.
    pub(crate) fn drained(&self) -> bool {
        self.planner_done.load(Ordering::SeqCst) && self.outstanding.load(Ordering::SeqCst) == 0
    }

    /// One access reached its reorder buffer.
    pub(crate) fn delivered(&self) {
        if self.outstanding.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.decode.wake();
        }
    }

    /// Schedules the calling planner or decode worker as the config asks.
    pub(crate) fn schedule_this_thread(&self, threads: PipelineThreads) {
        if threads == PipelineThreads::Batch {
            if let Err(e) = lobster_uring::run_as_batch() {
                lock(&self.batch_refused).get_or_insert(e.to_string());
            }
        }
    }

    pub(crate) fn wake_all(&self) {
        self.decode.wake();
        self.progress.wake();
        for r in &self.ranks {
            r.wake();
        }
    }

    /// Records a failure that ends the pipeline and stops; rank handles report it.
    pub(crate) fn fail(&self, error: Error) {
        lock(&self.failure).get_or_insert(error);
        self.stop.set();
        self.wake_all();
    }
}
