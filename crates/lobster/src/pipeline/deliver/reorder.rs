//! Each rank's reorder buffer: decoded samples land at their batch position, and whole
//! batches leave in plan order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::batch::Sample;
use crate::error::Error;
use crate::metrics::IterationMetrics;
use crate::pipeline::access::Access;
use crate::pipeline::sync::{lock, StopSignal};

/// A batch being assembled.
#[derive(Debug)]
pub(crate) struct PendingBatch<T> {
    pub(crate) epoch: u32,
    pub(crate) iteration: u32,
    pub(crate) items: Vec<Option<Result<Sample<T>, Error>>>,
    remaining: usize,
    /// When the planner handed the batch out.
    pub(crate) issued: Instant,
    ready_at: Option<Instant>,
    pub(crate) metrics: IterationMetrics,
}

impl<T> PendingBatch<T> {
    pub(crate) fn new(
        epoch: u32,
        iteration: u32,
        len: usize,
        issued: Instant,
        metrics: IterationMetrics,
    ) -> Self {
        PendingBatch {
            epoch,
            iteration,
            items: (0..len).map(|_| None).collect(),
            remaining: len,
            issued,
            ready_at: None,
            metrics,
        }
    }
}

#[derive(Debug)]
struct Buffer<T> {
    batches: VecDeque<PendingBatch<T>>,
    /// The planner has queued every batch of this rank.
    planned_all: bool,
    prev_ready: Option<Instant>,
    /// The task of a rank taking its batches as a stream, woken with the condition variable.
    waker: Option<Waker>,
}

impl<T> Buffer<T> {
    /// Wakes whoever takes the rank's batches, on a thread or as an async task.
    fn notify(&mut self, ready: &Condvar) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
        ready.notify_all();
    }

    /// The front batch if it is complete; `None` while the rank must wait for it.
    fn try_take(&mut self, stop: &StopSignal) -> Option<Result<TakenBatch<T>, NoBatch>> {
        match self.batches.front() {
            Some(front) if front.remaining == 0 => {}
            None if self.planned_all => return Some(Err(NoBatch::Done)),
            _ if stop.is_set() => return Some(Err(NoBatch::Stopped)),
            _ => return None,
        }
        let batch = self.batches.pop_front().expect("front checked");
        let ready_at = batch.ready_at.expect("a complete batch has its time");
        let load_from = self
            .prev_ready
            .map_or(batch.issued, |p| p.max(batch.issued));
        self.prev_ready = Some(ready_at);
        Some(Ok(TakenBatch {
            batch,
            load: ready_at.saturating_duration_since(load_from),
        }))
    }
}

/// One rank's reorder buffer.
#[derive(Debug)]
pub(crate) struct ReorderBuffer<T> {
    buffer: Mutex<Buffer<T>>,
    ready: Condvar,
    /// The rank's handle is gone: its batches are dropped, and its reads that no other access
    /// needs are not made. Set under the buffer's lock, so a holder of the lock sees it settled.
    detached: AtomicBool,
}

/// A complete batch as the rank takes it.
#[derive(Debug)]
pub(crate) struct TakenBatch<T> {
    pub(crate) batch: PendingBatch<T>,
    /// From when the rank could use it (its previous batch, or the planner's hand-out) to
    /// when it was complete.
    pub(crate) load: Duration,
}

/// Why a rank got no batch.
#[derive(Debug)]
pub(crate) enum NoBatch {
    /// Every batch was taken.
    Done,
    /// The loader stopped first.
    Stopped,
}

impl<T> ReorderBuffer<T> {
    pub(crate) fn new() -> Self {
        ReorderBuffer {
            buffer: Mutex::new(Buffer {
                batches: VecDeque::new(),
                planned_all: false,
                prev_ready: None,
                waker: None,
            }),
            ready: Condvar::new(),
            detached: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_detached(&self) -> bool {
        self.detached.load(Ordering::SeqCst)
    }

    /// Queues batches the planner handed out; a detached rank's are dropped.
    pub(crate) fn open(&self, batches: impl Iterator<Item = PendingBatch<T>>) {
        let mut buffer = lock(&self.buffer);
        if self.is_detached() {
            return;
        }
        buffer.batches.extend(batches);
    }

    pub(crate) fn planned_all(&self) {
        let mut buffer = lock(&self.buffer);
        buffer.planned_all = true;
        buffer.notify(&self.ready);
    }

    /// Puts a decoded sample in its batch and wakes the rank if the batch is complete. A
    /// planned hit that read storage after all (`reread_bytes`) is counted as the miss it is.
    pub(crate) fn deliver(
        &self,
        access: &Access,
        item: Result<Sample<T>, Error>,
        decode: Duration,
        reread_bytes: Option<u64>,
    ) {
        let mut buffer = lock(&self.buffer);
        let Some(batch) = buffer
            .batches
            .iter_mut()
            .find(|b| b.epoch == access.epoch && b.iteration == access.iteration)
        else {
            return;
        };
        debug_assert!(
            batch.items[access.pos].is_none(),
            "a position is delivered once"
        );
        if let Some(bytes) = reread_bytes {
            let m = &mut batch.metrics;
            m.hits -= 1;
            m.hit_bytes -= bytes;
            m.misses += 1;
            m.miss_bytes += bytes;
        }
        batch.items[access.pos] = Some(item);
        batch.remaining -= 1;
        batch.metrics.decode_s += decode.as_secs_f64();
        if batch.remaining == 0 {
            batch.ready_at = Some(Instant::now());
            buffer.notify(&self.ready);
        }
    }

    /// Waits for the front batch to be complete and takes it.
    pub(crate) fn take(&self, stop: &StopSignal) -> Result<TakenBatch<T>, NoBatch> {
        let mut buffer = lock(&self.buffer);
        loop {
            if let Some(taken) = buffer.try_take(stop) {
                return taken;
            }
            buffer = self.ready.wait(buffer).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Takes the front batch if it is complete, or has `cx`'s task woken when it may be.
    pub(crate) fn poll_take(
        &self,
        stop: &StopSignal,
        cx: &mut Context<'_>,
    ) -> Poll<Result<TakenBatch<T>, NoBatch>> {
        let mut buffer = lock(&self.buffer);
        match buffer.try_take(stop) {
            Some(taken) => Poll::Ready(taken),
            None => {
                buffer.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// The rank's handle is gone: drop its batches.
    pub(crate) fn detach(&self) {
        let mut buffer = lock(&self.buffer);
        self.detached.store(true, Ordering::SeqCst);
        buffer.batches.clear();
    }

    pub(crate) fn wake(&self) {
        lock(&self.buffer).notify(&self.ready);
    }
}
