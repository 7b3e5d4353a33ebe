//! The I/O dispatcher: issues the node's storage reads in [`IoOrder`] within the io_depth
//! budget, holds each attempt until the emulated tier answers it, retries transient failures,
//! and fills the landings the decode tasks wait on.
//!
//! The dispatcher drives a [`Session`] of its own and reads by path on every backend: on
//! io_uring with direct descriptors a read is one linked open, read and close in its ring,
//! and many go in one system call, with no other thread between the dispatcher and the
//! kernel; on older kernels the session opens and closes the files on this thread around
//! their reads in the ring; on the pread fallback the reader's workers open, read and close.

mod backend;
pub(super) mod order;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use lobster_sched::{CostModel, Tier};
use lobster_uring::Reader;
use slab::Slab;

use crate::config::IoOrder;
use crate::error::Error;
use crate::pipeline::access::{self, Access, Ready};
use crate::pipeline::context::Context;
use crate::pipeline::decode::queue::DecodeQueues;
use crate::pipeline::deliver::reorder::ReorderBuffer;
use crate::pipeline::landing::Loaded;
use crate::pipeline::outstanding::Outstanding;
use crate::pipeline::read::attempt::{Attempt, Fate};
use crate::pipeline::sync::{lock, stopped, StopSignal};
use backend::{Backend, Done, Queued};
use lobster_sched::equal_split;
use order::{next_read, ToDispatcher};

/// What the dispatcher is given.
pub(crate) struct ForDispatcher<T> {
    pub(crate) stop: Arc<StopSignal>,
    pub(crate) outstanding: Arc<Outstanding>,
    pub(crate) decode: Arc<DecodeQueues>,
    /// Whether a rank still takes its batches.
    pub(crate) ranks: Arc<[ReorderBuffer<T>]>,
    pub(crate) model: Arc<Mutex<CostModel>>,
}

/// The longest the dispatcher sleeps without looking at its queue and the stop flag.
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// With room for more reads, the longest it waits in the ring before looking for new ones.
const ROOM_WAIT: Duration = Duration::from_micros(500);
/// Reads completed over a saturated interval before the link's throughput is observed.
const THROUGHPUT_READS: u32 = 64;

/// A read handed to the reader, until it completes on the (emulated) storage.
#[derive(Debug)]
struct InFlight {
    access: Access,
    /// 0 for the first attempt; a retry waiting for its backoff keeps its io_depth unit.
    attempt: u32,
    issued: Instant,
    /// When the emulated tier answers this attempt, reserved at submission.
    due: Option<Instant>,
    /// The attempt's outcome, held until the emulated tier delivers it.
    parked: Option<Loaded>,
}

/// The dispatcher's reads between submission and delivery, and the io_depth unit (counted
/// per rank) each holds.
#[derive(Debug)]
struct Reads {
    slab: Slab<InFlight>,
    in_flight: Vec<u32>,
    /// Attempts in the reader (not parked, not backing off).
    in_reader: usize,
    /// Emulated answers and retry backoffs, by due time.
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
    /// Accesses released by filled landings, queued for decode together.
    released: Vec<Ready>,
    /// Where the cache keeps its copies of large samples.
    arena: Option<lobster_uring::Arena>,
    /// Reads the session refused for want of pool memory, in issue order.
    blocked: VecDeque<usize>,
    /// Where the backend's bytes live.
    origin: crate::pipeline::landing::Origin,
}

impl Reads {
    fn new(
        ranks: usize,
        arena: Option<lobster_uring::Arena>,
        origin: crate::pipeline::landing::Origin,
    ) -> Self {
        Reads {
            arena,
            origin,
            blocked: VecDeque::new(),
            slab: Slab::new(),
            in_flight: vec![0; ranks],
            in_reader: 0,
            timers: BinaryHeap::new(),
            released: Vec::new(),
        }
    }

    /// Takes a read that holds an io_depth unit.
    fn start(&mut self, access: Access) -> usize {
        self.in_flight[access.rank] += 1;
        self.slab.insert(InFlight {
            attempt: 0,
            access,
            issued: Instant::now(),
            due: None,
            parked: None,
        })
    }

    /// Ends read `key`, giving back its io_depth unit.
    fn retire(&mut self, key: usize) -> InFlight {
        let done = self.slab.remove(key);
        self.in_flight[done.access.rank] -= 1;
        done
    }

    /// Queues the released accesses for decode, under one lock.
    fn hand_off<T>(&mut self, state: &ForDispatcher<T>) {
        if !self.released.is_empty() {
            state.decode.push(self.released.drain(..));
        }
    }

    /// Fills the access's landing; it and the accesses waiting there go to decode with the
    /// others released since the last hand-off.
    fn fill(&mut self, access: Access, loaded: Loaded) {
        let arena = self.arena.as_ref();
        access::fill_for(access, loaded, (self.origin, arena), &mut self.released);
    }
}

/// Bytes the link delivered while reads queued behind it: the cost model's bandwidth.
#[derive(Debug, Default)]
struct Saturation {
    since: Option<Instant>,
    bytes: u64,
    reads: u32,
}

impl Saturation {
    /// Whether reads are waiting for io_depth now.
    fn set(&mut self, saturated: bool, now: Instant) {
        match (saturated, self.since) {
            (true, None) => {
                *self = Saturation {
                    since: Some(now),
                    ..Default::default()
                }
            }
            (false, Some(_)) => *self = Saturation::default(),
            _ => {}
        }
    }

    /// A read of `bytes` was delivered; the throughput of a long enough interval, if one ends.
    fn delivered(&mut self, bytes: u64, now: Instant) -> Option<(u64, Duration)> {
        let since = self.since?;
        self.bytes += bytes;
        self.reads += 1;
        if self.reads < THROUGHPUT_READS {
            return None;
        }
        let observed = (self.bytes, now - since);
        *self = Saturation {
            since: Some(now),
            ..Default::default()
        };
        Some(observed)
    }
}

/// The dispatcher thread's body.
pub(crate) fn dispatcher<T>(
    ctx: &Context<T>,
    state: &ForDispatcher<T>,
    reader: &Reader,
    requests: Receiver<ToDispatcher>,
) -> Result<(), Error> {
    let ranks = ctx.layout.ranks;
    let budget = ctx.config.budgets.io_depth as u32;
    let mut session = Backend::new(ctx, reader)?;
    // Under the deadline order the node's reads share the whole budget, so the reader holds
    // no rank to a share of it.
    let mut depth: Vec<u32> = match ctx.config.reads.io_order {
        IoOrder::Deadline => vec![budget; ranks],
        IoOrder::Shares => equal_split(budget, ranks),
    };
    let mut pending: Vec<VecDeque<Access>> = (0..ranks).map(|_| VecDeque::new()).collect();
    let mut reads = Reads::new(ranks, ctx.arena.clone(), session.origin());
    let mut allocations: VecDeque<(u64, Vec<u32>)> = VecDeque::new();
    let mut saturation = Saturation::default();
    let mut completed = Vec::new();
    for (r, &d) in depth.iter().enumerate() {
        set_depth(reader, r, d)?;
    }
    loop {
        if state.stop.is_set() {
            return Ok(());
        }
        while let Ok(msg) = requests.try_recv() {
            take(msg, &mut pending, &mut allocations);
        }
        apply_due_allocations(reader, &pending, &mut allocations, &mut depth)?;
        submit_blocked(ctx, state, &mut session, &mut reads);
        issue(ctx, state, &mut session, &mut reads, &mut pending, &depth);
        let now = Instant::now();
        let room = reads.slab.len() < budget as usize;
        saturation.set(!room && pending.iter().any(|q| !q.is_empty()), now);
        reads.hand_off(state);
        // Workers may send reads until every access is delivered.
        if state.outstanding.drained()
            && reads.slab.is_empty()
            && pending.iter().all(VecDeque::is_empty)
        {
            return Ok(());
        }
        // Pool memory comes back as decode workers drop their samples: look again soon.
        let idle_wait = if reads.blocked.is_empty() {
            IDLE_WAIT
        } else {
            ROOM_WAIT
        };
        let until_timer = reads
            .timers
            .peek()
            .map_or(idle_wait, |Reverse((t, _))| {
                t.saturating_duration_since(now)
            })
            .min(idle_wait);
        if reads.in_reader > 0 {
            // With room for more, new requests are worth a look soon.
            let wait = if room {
                until_timer.min(ROOM_WAIT)
            } else {
                until_timer
            };
            session.wait_timeout(1, wait, &mut completed)?;
        } else {
            match requests.recv_timeout(until_timer) {
                Ok(msg) => take(msg, &mut pending, &mut allocations),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::Stopped {
                        reason: "the dispatcher's queue closed".into(),
                    })
                }
            }
        }
        for c in completed.drain(..) {
            on_completion(ctx, state, &mut reads, &mut saturation, c);
        }
        fire_timers(ctx, state, &mut session, &mut reads, &mut saturation);
        reads.hand_off(state);
    }
}

/// A window's allocation takes effect when its first request is the oldest pending one, not
/// when it was planned, which is up to the prefetch window earlier.
fn apply_due_allocations(
    reader: &Reader,
    pending: &[VecDeque<Access>],
    allocations: &mut VecDeque<(u64, Vec<u32>)>,
    depth: &mut Vec<u32>,
) -> Result<(), Error> {
    let oldest = pending
        .iter()
        .filter_map(|q| q.front().map(|a| a.seq))
        .min();
    while let Some((from_seq, _)) = allocations.front() {
        if oldest.is_none_or(|o| o < *from_seq) {
            break;
        }
        let (_, d) = allocations.pop_front().expect("front checked");
        for (r, &v) in d.iter().enumerate() {
            set_depth(reader, r, v)?;
        }
        *depth = d;
    }
    Ok(())
}

/// Starts pending reads in the io order while the budget has room and no read waits for
/// pool memory.
fn issue<T>(
    ctx: &Context<T>,
    state: &ForDispatcher<T>,
    session: &mut Backend,
    reads: &mut Reads,
    pending: &mut [VecDeque<Access>],
    depth: &[u32],
) {
    let budget = ctx.config.budgets.io_depth as u32;
    while let Some(r) = next_read(
        ctx.config.reads.io_order,
        pending,
        &reads.in_flight,
        depth,
        budget,
    )
    .filter(|_| reads.blocked.is_empty())
    {
        let access = pending[r].pop_front().expect("front checked");
        if !access.cached.admitted() && state.ranks[access.rank].is_detached() {
            // No other access waits on this landing.
            reads.fill(access, Err(stopped()));
            continue;
        }
        let key = reads.start(access);
        debug_assert!(
            ctx.config.reads.io_order != IoOrder::Deadline
                || reads.in_flight.iter().sum::<u32>() <= budget,
            "the node holds at most its io_depth budget in flight"
        );
        if !submit(ctx, state, session, reads, key) {
            reads.blocked.push_back(key);
        }
    }
}

/// Reads whose emulated answer time has come are finished; retries whose backoff is over
/// are submitted again.
fn fire_timers<T>(
    ctx: &Context<T>,
    state: &ForDispatcher<T>,
    session: &mut Backend,
    reads: &mut Reads,
    saturation: &mut Saturation,
) {
    let now = Instant::now();
    while let Some(Reverse((t, key))) = reads.timers.peek().copied() {
        if t > now {
            break;
        }
        reads.timers.pop();
        match reads.slab[key].parked.take() {
            Some(loaded) => {
                let done = reads.retire(key);
                finish(ctx, state, reads, saturation, done, loaded);
            }
            // A retry's backoff is over.
            None => {
                if !submit(ctx, state, session, reads, key) {
                    reads.blocked.push_back(key);
                }
            }
        }
    }
}

fn take(
    msg: ToDispatcher,
    pending: &mut [VecDeque<Access>],
    allocations: &mut VecDeque<(u64, Vec<u32>)>,
) {
    match msg {
        ToDispatcher::Reads(window) => {
            for access in window {
                pending[access.rank].push_back(access);
            }
        }
        ToDispatcher::Depths { from_seq, io_depth } => {
            allocations.push_back((from_seq, io_depth));
        }
    }
}

/// Hands read `key` (a first attempt or a retry) to the session; a refused submission fails
/// the sample. `false`: the session has no pool memory for it while its other reads hold
/// some; it keeps its io_depth unit and goes again when memory is back.
fn submit<T>(
    ctx: &Context<T>,
    state: &ForDispatcher<T>,
    session: &mut Backend,
    reads: &mut Reads,
    key: usize,
) -> bool {
    let read = &reads.slab[key];
    let sample = read.access.sample;
    match session.queue(ctx, sample, read.access.rank, key as u64) {
        Queued::Yes => {
            let read = &mut reads.slab[key];
            read.issued = Instant::now();
            read.due = ctx
                .storage
                .reserve(read.issued, ctx.meta(sample).size_bytes);
            reads.in_reader += 1;
        }
        Queued::WouldBlock => return false,
        Queued::Refused(e) => {
            let done = reads.retire(key);
            let loaded = Err(ctx.meta(sample).read_error(e.cause));
            finish(ctx, state, reads, &mut Saturation::default(), done, loaded);
        }
    }
    true
}

/// Submits the reads waiting for pool memory, in order, while it lasts.
fn submit_blocked<T>(
    ctx: &Context<T>,
    state: &ForDispatcher<T>,
    session: &mut Backend,
    reads: &mut Reads,
) {
    while let Some(&key) = reads.blocked.front() {
        if !submit(ctx, state, session, reads, key) {
            return;
        }
        reads.blocked.pop_front();
    }
}

/// The reader finished an attempt: decide its fate, and deliver now, park it until the
/// emulated tier answers, or schedule its retry.
fn on_completion<T>(
    ctx: &Context<T>,
    state: &ForDispatcher<T>,
    reads: &mut Reads,
    saturation: &mut Saturation,
    c: Done,
) {
    reads.in_reader -= 1;
    let key = c.tag as usize;
    let read = &reads.slab[key];
    let attempt = Attempt {
        meta: ctx.meta(read.access.sample),
        epoch: read.access.epoch,
        number: read.attempt,
        due: read.due,
    };
    if c.shared {
        ctx.storage.shared_request(attempt.epoch);
    }
    let outcome = ctx.storage.fate(attempt, c.result);
    match outcome {
        Fate::Retry { at } => {
            // Keeps its io_depth unit.
            reads.slab[key].attempt += 1;
            reads.timers.push(Reverse((at, key)));
        }
        Fate::Deliver {
            at: Some(at),
            loaded,
        } if at > Instant::now() => {
            reads.slab[key].parked = Some(loaded);
            reads.timers.push(Reverse((at, key)));
        }
        Fate::Deliver { loaded, .. } => {
            let done = reads.retire(key);
            finish(ctx, state, reads, saturation, done, loaded);
        }
    }
}

/// A read is over: teach the cost model, and fill its landing.
fn finish<T>(
    ctx: &Context<T>,
    state: &ForDispatcher<T>,
    reads: &mut Reads,
    saturation: &mut Saturation,
    done: InFlight,
    loaded: Loaded,
) {
    if loaded.is_ok() {
        let bytes = ctx.meta(done.access.sample).size_bytes;
        let now = Instant::now();
        let mut model = lock(&state.model);
        model.observe_read(Tier::Storage, bytes, now - done.issued);
        if let Some((bytes, elapsed)) = saturation.delivered(bytes, now) {
            model.observe_throughput(Tier::Storage, bytes, elapsed);
        }
    }
    reads.fill(done.access, loaded);
}

fn set_depth(reader: &Reader, class: usize, depth: u32) -> Result<(), Error> {
    reader
        .set_io_depth(class, depth as usize)
        .map_err(|e| Error::engine("reader io_depth", e))
}
