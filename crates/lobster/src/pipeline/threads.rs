//! How the planner and the decode workers are scheduled.

use std::sync::Mutex;

use crate::config::PipelineThreads;
use crate::pipeline::sync::lock;

/// Schedules the calling planner or decode worker as the config asks; why the system refused
/// `SCHED_BATCH`, if it did, goes in `refused`.
pub(crate) fn schedule_this_thread(threads: PipelineThreads, refused: &Mutex<Option<String>>) {
    if threads == PipelineThreads::Batch {
        if let Err(e) = lobster_uring::run_as_batch() {
            lock(refused).get_or_insert(e.to_string());
        }
    }
}
