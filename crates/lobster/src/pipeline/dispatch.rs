//! The I/O dispatcher: issues the node's storage reads in [`IoOrder`] within the io_depth
//! budget, holds each attempt until the emulated tier answers it, retries transient failures,
//! and fills the slots the decode tasks wait on.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};
use lobster_sched::Tier;
use lobster_uring::{Completion, FileId, ReadRequest, Reader};
use slab::Slab;

use super::allocate::equal_split;
use super::attempt::{self, fate, Attempt, Fate, ReadFailure};
use super::context::Context;
use super::files::OpenFiles;
use super::order::{next_read, IoRequest, ToDispatcher};
use super::slot::{Keep, Loaded};
use super::state::PipelineState;
use super::sync::{lock, stopped};
use crate::config::IoOrder;
use crate::error::Error;

/// A read handed to the reader, until it completes on the (emulated) storage.
#[derive(Debug)]
struct InFlight {
    req: IoRequest,
    file: FileId,
    /// 0 for the first attempt; a retry waiting for its backoff keeps its io_depth slot.
    attempt: u32,
    issued: Instant,
    /// When the emulated tier answers this attempt, reserved at submission.
    due: Option<Instant>,
    /// The attempt's outcome, held until the emulated tier delivers it.
    parked: Option<Loaded>,
}

/// The dispatcher's reads between submission and delivery, and what they hold: an io_depth
/// slot (counted per rank) and an open file.
#[derive(Debug)]
struct Reads {
    slab: Slab<InFlight>,
    in_flight: Vec<u32>,
    files: OpenFiles,
    /// Emulated answers and retry backoffs, by due time.
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
}

impl Reads {
    fn new(ranks: usize) -> Self {
        Reads {
            slab: Slab::new(),
            in_flight: vec![0; ranks],
            files: OpenFiles::default(),
            timers: BinaryHeap::new(),
        }
    }

    /// Takes a read that holds an io_depth slot and an open file.
    fn start(&mut self, req: IoRequest, file: FileId) -> usize {
        self.in_flight[req.rank] += 1;
        self.slab.insert(InFlight {
            attempt: req.attempt,
            req,
            file,
            issued: Instant::now(),
            due: None,
            parked: None,
        })
    }

    /// Ends read `key`, giving back its io_depth slot and its file.
    fn retire(&mut self, key: usize) -> InFlight {
        let done = self.slab.remove(key);
        self.in_flight[done.req.rank] -= 1;
        self.files.release(done.req.sample);
        done
    }
}

/// The dispatcher thread's body.
pub(crate) fn dispatcher<T>(
    ctx: &Context<T>,
    state: &PipelineState<T>,
    reader: &Reader,
    requests: Receiver<ToDispatcher>,
) -> Result<(), Error> {
    let ranks = ctx.layout.ranks;
    let budget = ctx.config.io_depth_budget as u32;
    // Under the deadline order the node's reads share the whole budget, so the engine holds
    // no rank to a share of it.
    let mut depth: Vec<u32> = match ctx.config.io_order {
        IoOrder::Deadline => vec![budget; ranks],
        IoOrder::Shares => equal_split(budget, ranks),
    };
    let mut pending: Vec<VecDeque<IoRequest>> = (0..ranks).map(|_| VecDeque::new()).collect();
    let mut reads = Reads::new(ranks);
    let mut allocations: VecDeque<(u64, Vec<u32>)> = VecDeque::new();
    let completions = reader.completions();
    let mut requests = Some(requests);
    for (r, &d) in depth.iter().enumerate() {
        set_depth(reader, r, d)?;
    }
    loop {
        if state.stop.is_set() {
            return Ok(());
        }
        // A window's allocation takes effect when its first request is the oldest pending one,
        // not when it was planned, which is up to the prefetch window earlier.
        let oldest = (0..ranks)
            .filter_map(|r| pending[r].front().map(|q| q.seq))
            .min();
        while let Some((from_seq, _)) = allocations.front() {
            if oldest.is_none_or(|o| o < *from_seq) {
                break;
            }
            let (_, d) = allocations.pop_front().expect("front checked");
            for (r, &v) in d.iter().enumerate() {
                set_depth(reader, r, v)?;
            }
            depth = d;
        }
        while let Some(r) = next_read(
            ctx.config.io_order,
            &pending,
            &reads.in_flight,
            &depth,
            budget,
        ) {
            let req = pending[r].pop_front().expect("front checked");
            if !req.admitted && state.ranks[req.rank].is_detached() {
                // Only the dropped rank's own access waits on this slot.
                fill(state, req, Err(stopped()));
                continue;
            }
            let meta = ctx.meta(req.sample);
            match reads.files.acquire(reader, meta, ctx.config.direct) {
                Ok(file) => {
                    let key = reads.start(req, file);
                    debug_assert!(
                        ctx.config.io_order != IoOrder::Deadline
                            || reads.in_flight.iter().sum::<u32>() <= budget,
                        "the node holds at most its io_depth budget in flight"
                    );
                    submit(ctx, state, reader, &mut reads, key);
                }
                Err(e) => fill(state, req, Err(e)),
            }
        }
        // Workers may send reads until every access is delivered.
        if state.drained() && reads.slab.is_empty() && pending.iter().all(VecDeque::is_empty) {
            return Ok(());
        }
        let now = Instant::now();
        let wait = reads
            .timers
            .peek()
            .map_or(Duration::from_millis(100), |Reverse((t, _))| {
                t.saturating_duration_since(now)
            })
            .min(Duration::from_millis(100));
        let never = crossbeam_channel::never();
        let rx = requests.as_ref().unwrap_or(&never);
        select! {
            recv(rx) -> msg => match msg {
                Ok(ToDispatcher::Reads(window)) => {
                    for req in window {
                        pending[req.rank].push_back(req);
                    }
                }
                Ok(ToDispatcher::Depths { from_seq, io_depth }) => {
                    allocations.push_back((from_seq, io_depth));
                }
                Err(_) => requests = None,
            },
            recv(completions) -> c => {
                let Ok(c) = c else {
                    return Err(Error::Stopped { reason: "the reader's completion queue closed".into() });
                };
                on_completion(ctx, state, &mut reads, c);
            },
            default(wait) => {}
        }
        let now = Instant::now();
        while let Some(Reverse((t, key))) = reads.timers.peek().copied() {
            if t > now {
                break;
            }
            reads.timers.pop();
            match reads.slab[key].parked.take() {
                Some(loaded) => {
                    let done = reads.retire(key);
                    finish(ctx, state, done, loaded);
                }
                // A retry's backoff is over.
                None => submit(ctx, state, reader, &mut reads, key),
            }
        }
    }
}

/// Hands read `key` (a first attempt or a retry) to the reader; a refused submission fails
/// the sample.
fn submit<T>(
    ctx: &Context<T>,
    state: &PipelineState<T>,
    reader: &Reader,
    reads: &mut Reads,
    key: usize,
) {
    let read = &mut reads.slab[key];
    let meta = ctx.meta(read.req.sample);
    read.issued = Instant::now();
    read.due = attempt::reserve(ctx.device.as_deref(), read.issued, meta.size_bytes);
    let request = ReadRequest {
        file: read.file,
        offset: 0,
        len: meta.size_bytes as usize,
        class: read.req.rank,
        tag: key as u64,
    };
    if let Err(e) = reader.submit(request) {
        let done = reads.retire(key);
        finish(
            ctx,
            state,
            done,
            Err(attempt::read_error(meta, std::sync::Arc::new(e))),
        );
    }
}

/// The reader finished an attempt: decide its fate, and deliver now, park it until the
/// emulated tier answers, or schedule its retry.
fn on_completion<T>(ctx: &Context<T>, state: &PipelineState<T>, reads: &mut Reads, c: Completion) {
    let key = c.tag as usize;
    let read = &reads.slab[key];
    let attempt = Attempt {
        meta: ctx.meta(read.req.sample),
        epoch: read.req.epoch,
        number: read.attempt,
        due: read.due,
    };
    let outcome = fate(
        attempt,
        ctx.config.fault_injection.as_ref(),
        &state.faults,
        c.result.map_err(ReadFailure::from),
    );
    match outcome {
        Fate::Retry { at } => {
            // Keeps its io_depth slot and its open file.
            reads.slab[key].attempt += 1;
            reads.timers.push(Reverse((at, key)));
        }
        Fate::Deliver { at, loaded } if at > Instant::now() => {
            reads.slab[key].parked = Some(loaded);
            reads.timers.push(Reverse((at, key)));
        }
        Fate::Deliver { loaded, .. } => {
            let done = reads.retire(key);
            finish(ctx, state, done, loaded);
        }
    }
}

fn finish<T>(ctx: &Context<T>, state: &PipelineState<T>, done: InFlight, loaded: Loaded) {
    if loaded.is_ok() {
        let bytes = ctx.meta(done.req.sample).size_bytes;
        lock(&state.model).observe_read(Tier::Storage, bytes, done.issued.elapsed());
    }
    fill(state, done.req, loaded);
}

/// Fills the request's slot and queues the tasks waiting on it for decode.
fn fill<T>(state: &PipelineState<T>, req: IoRequest, loaded: Loaded) {
    let mut released = Vec::new();
    // The dispatcher's bytes are pool buffers.
    let keep = if req.admitted { Keep::Copy } else { Keep::AsIs };
    req.slot.fill(loaded, keep, &mut released);
    state.ready(released);
}

fn set_depth(reader: &Reader, class: usize, depth: u32) -> Result<(), Error> {
    reader
        .set_io_depth(class, depth as usize)
        .map_err(|e| Error::Engine {
            part: "reader io_depth",
            cause: std::sync::Arc::new(e),
        })
}
