//! The read-then-decode workers' blocking read (the PyTorch and NoPFS baselines): a plain
//! open and read on the worker's own thread, with the same attempt fate as the dispatcher's.

use std::fs::File;
use std::io::Read;
use std::time::Instant;

use bytes::Bytes;

use super::attempt::{self, fate, Attempt, Fate, ReadFailure};
use super::context::Context;
use super::slot::Loaded;
use super::state::PipelineState;
use super::sync::stopped;
use crate::dataset::SampleMeta;

/// Reads `meta` for an access in `epoch`, charged to the emulated tier, retrying transient
/// failures with backoff.
pub(crate) fn blocking_read<T>(
    ctx: &Context<T>,
    state: &PipelineState<T>,
    meta: &SampleMeta,
    epoch: u32,
) -> Loaded {
    let read = || -> std::io::Result<Bytes> {
        let mut file = File::open(&meta.path)?;
        let mut buf = Vec::with_capacity(meta.size_bytes as usize);
        // One byte more than expected reveals a file that grew since the dataset was opened.
        (&mut file)
            .take(meta.size_bytes + 1)
            .read_to_end(&mut buf)?;
        Ok(Bytes::from(buf))
    };
    let mut number = 0;
    loop {
        // Reserved before the read, as the dispatcher does, so the tier serves in issue order.
        let due = attempt::reserve(ctx.device.as_deref(), Instant::now(), meta.size_bytes);
        let attempt = Attempt {
            meta,
            epoch,
            number,
            due,
        };
        let outcome = fate(
            attempt,
            ctx.config.fault_injection.as_ref(),
            &state.faults,
            read().map_err(ReadFailure::from),
        );
        match outcome {
            Fate::Deliver { at, loaded } => {
                if !state.stop.sleep_until(at) {
                    return Err(stopped());
                }
                return loaded;
            }
            Fate::Retry { at } => {
                number += 1;
                if !state.stop.sleep_until(at) {
                    return Err(stopped());
                }
            }
        }
    }
}
