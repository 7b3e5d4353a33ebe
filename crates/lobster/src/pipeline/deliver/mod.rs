//! A rank's side: take the next whole batch in plan order, apply the error policy and the
//! failure budget, and let the planner move on.

pub(super) mod reorder;

use std::time::Instant;

use crate::batch::Batch;
use crate::error::Error;
use crate::faults::ErrorPolicy;
use crate::metrics::SkippedSample;
use crate::pipeline::state::PipelineState;
use crate::pipeline::sync::{lock, stopped};
use reorder::NoBatch;

/// Rank `rank`'s next batch; `None` after its last.
pub(crate) fn next_batch<T>(
    state: &PipelineState<T>,
    rank: usize,
    iterations: usize,
) -> Option<Result<Batch<T>, Error>> {
    let started = Instant::now();
    let taken = match state.ranks[rank].take(&state.stop) {
        Ok(taken) => taken,
        Err(NoBatch::Done) => return None,
        Err(NoBatch::Stopped) => {
            let failure = lock(&state.failure).clone();
            return Some(Err(failure.unwrap_or_else(stopped)));
        }
    };
    let stall = started.elapsed();
    let batch = taken.batch;
    let mut metrics = batch.metrics;
    metrics.load_s = taken.load.as_secs_f64();
    metrics.stall_s = stall.as_secs_f64();
    let len = batch.items.len();
    state.progress.took(rank);
    let mut items = Vec::with_capacity(len);
    let mut first_error = None;
    let mut failed = Vec::new();
    let skip = matches!(state.error_policy, ErrorPolicy::Skip { .. });
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
    let mut collector = lock(&state.collector);
    collector.batch_taken(metrics, len - failed.len(), last_of_epoch);
    let mut skipped = Vec::with_capacity(failed.len());
    if let ErrorPolicy::Skip { max_failures } = state.error_policy {
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
    drop(collector);
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
pub(crate) fn detach<T>(state: &PipelineState<T>, rank: usize) {
    state.ranks[rank].detach();
    state.progress.detach(rank);
}
