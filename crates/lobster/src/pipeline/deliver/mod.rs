//! A rank's side: take the next whole batch in plan order, apply the error policy and the
//! failure budget, and let the planner move on.

pub(super) mod reorder;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::batch::Batch;
use crate::error::Error;
use crate::faults::OnError;
use crate::metrics::{Collector, SkippedSample};
use crate::pipeline::free_memory::FreeMemory;
use crate::pipeline::layout::EpochEnds;
use crate::pipeline::progress::Progress;
use crate::pipeline::sync::{lock, stopped, StopSignal};
use reorder::{NoBatch, ReorderBuffer};

/// What the ranks' handles are given: their reorder buffers, and what taking a batch tells
/// or asks.
pub(crate) struct ForRanks<T> {
    pub(crate) stop: Arc<StopSignal>,
    /// A failure that ended the pipeline (planner or dispatcher error).
    pub(crate) failure: Arc<Mutex<Option<Error>>>,
    pub(crate) ranks: Arc<[ReorderBuffer<T>]>,
    pub(crate) progress: Arc<Progress>,
    pub(crate) collector: Arc<Mutex<Collector>>,
    pub(crate) on_error: OnError,
    /// The node's accesses per epoch, the base of a fractional failure budget.
    pub(crate) epoch_accesses: u64,
    /// An epoch went over its failure budget: every rank's next batch reports it.
    pub(crate) budget_failure: Mutex<Option<Error>>,
    /// Given back at each epoch's end.
    pub(crate) free_memory: Arc<FreeMemory>,
}

impl<T> std::fmt::Debug for ForRanks<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForRanks")
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

/// Rank `rank`'s next batch; `None` after its last.
pub(crate) fn next_batch<T>(
    state: &ForRanks<T>,
    rank: usize,
    ends: EpochEnds,
) -> Option<Result<Batch<T>, Error>> {
    let started = Instant::now();
    let taken = state.ranks[rank].take(&state.stop);
    finish(state, rank, ends, taken, started.elapsed())
}

/// Rank `rank`'s next batch as an async task takes it: `Pending` (with the task woken when
/// it may be ready) until the batch is complete. `waiting` is when the rank began to wait
/// for this batch, its stall, kept by the caller across polls.
pub(crate) fn poll_next_batch<T>(
    state: &ForRanks<T>,
    rank: usize,
    ends: EpochEnds,
    cx: &mut std::task::Context<'_>,
    waiting: &mut Option<Instant>,
) -> std::task::Poll<Option<Result<Batch<T>, Error>>> {
    let started = *waiting.get_or_insert_with(Instant::now);
    let taken = std::task::ready!(state.ranks[rank].poll_take(&state.stop, cx));
    *waiting = None;
    std::task::Poll::Ready(finish(state, rank, ends, taken, started.elapsed()))
}

/// A taken batch as the rank gets it: the error policy and the failure budget applied, the
/// planner let move on.
fn finish<T>(
    state: &ForRanks<T>,
    rank: usize,
    ends: EpochEnds,
    taken: Result<reorder::TakenBatch<T>, NoBatch>,
    stall: Duration,
) -> Option<Result<Batch<T>, Error>> {
    let taken = match taken {
        Ok(taken) => taken,
        Err(NoBatch::Done) => return None,
        Err(NoBatch::Stopped) => {
            let failure = lock(&state.failure).clone();
            return Some(Err(failure.unwrap_or_else(stopped)));
        }
    };
    let batch = taken.batch;
    let mut metrics = batch.metrics;
    metrics.load_s = taken.load.as_secs_f64();
    metrics.stall_s = stall.as_secs_f64();
    let len = batch.items.len();
    state.progress.took(rank);
    let mut items = Vec::with_capacity(len);
    let mut first_error = None;
    let mut failed = Vec::new();
    let skip = matches!(state.on_error, OnError::Skip { .. });
    for item in batch.items {
        match item.expect("a complete batch has every item") {
            Ok(s) => items.push(s),
            Err(e) if skip => failed.push(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let last_of_epoch = ends.is_last(batch.epoch, batch.iteration);
    let mut collector = lock(&state.collector);
    let delivered = len - failed.len();
    let mut skipped = Vec::with_capacity(failed.len());
    if let OnError::Skip { max_failures } = state.on_error {
        let allowed = max_failures.allowed(state.epoch_accesses);
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
                lock(&state.budget_failure).get_or_insert_with(|| Error::TooManyFailures {
                    epoch: batch.epoch,
                    failed: count,
                    allowed,
                    accesses: state.epoch_accesses,
                    first: first.to_vec(),
                });
            }
        }
    }
    // After the skips: the epoch's last batch lets the collector drop its failures.
    let epoch_ended = collector.batch_taken(metrics, delivered, last_of_epoch);
    drop(collector);
    if epoch_ended {
        state.free_memory.release();
    }
    if let Some(e) = lock(&state.budget_failure).clone() {
        return Some(Err(e));
    }
    Some(match first_error {
        Some(e) => Err(e),
        None => Ok(Batch {
            epoch: batch.epoch,
            iteration: batch.iteration,
            samples: items,
            skipped,
        }),
    })
}

/// Rank `rank`'s handle was dropped: its batches are discarded and it no longer holds back
/// the planner.
pub(crate) fn detach<T>(state: &ForRanks<T>, rank: usize) {
    state.ranks[rank].detach();
    state.progress.detach(rank);
}
