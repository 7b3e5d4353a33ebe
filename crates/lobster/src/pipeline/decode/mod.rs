//! The decode workers: take a access whose bytes are known (or, read-then-decode, read them),
//! run the user's decode function, and deliver the sample to its rank's reorder buffer.

pub(super) mod forms;
pub(super) mod queue;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lobster_sched::CostModel;

use crate::batch::Sample;
use crate::dataset::SampleMeta;
use crate::error::{Cause, Error};
use crate::pipeline::access::{self, Access, AccessLanding, Read, Ready};
use crate::pipeline::context::Context;
use crate::pipeline::deliver::reorder::ReorderBuffer;
use crate::pipeline::landing::{Loaded, Origin};
use crate::pipeline::outstanding::Outstanding;
use crate::pipeline::peers::{fetch, Peers};
use crate::pipeline::read::on_worker::{blocking_read, resident_read, OnWorker, WorkerReads};
use crate::pipeline::read_path::ReadPathCounters;
use crate::pipeline::sync::{lock, StopSignal};
use crate::pipeline::threads::schedule_this_thread;
use forms::{decode_in_stages, finish_cached, AsKept, DecodedTier, FormCounters, Keep};
use queue::{DecodeQueues, GROUP_MAX};

/// What the decode workers are given.
pub(crate) struct ForWorkers<T> {
    pub(crate) stop: Arc<StopSignal>,
    /// Why a worker could not run as `SCHED_BATCH`, if one could not.
    pub(crate) batch_refused: Arc<Mutex<Option<String>>>,
    pub(crate) outstanding: Arc<Outstanding>,
    pub(crate) decode: Arc<DecodeQueues>,
    pub(crate) ranks: Arc<[ReorderBuffer<T>]>,
    pub(crate) model: Arc<Mutex<CostModel>>,
    pub(crate) read_path: Arc<ReadPathCounters>,
    /// What the decoded tier did.
    pub(crate) forms: Arc<FormCounters>,
    /// Peer nodes a read-then-decode worker fetches planned misses from.
    pub(crate) peers: Option<Arc<Peers>>,
    /// The decoded tier, where the cache may keep decoded images.
    pub(crate) tier: Option<Arc<DecodedTier<T>>>,
}

/// Worker `w`'s body.
pub(crate) fn decode_worker<T>(ctx: &Context<T>, state: &ForWorkers<T>, w: usize) {
    schedule_this_thread(ctx.config.budgets.pipeline_threads, &state.batch_refused);
    let reads = WorkerReads {
        direct: ctx.config.reads.direct,
        dirs: ctx.dirs.as_ref(),
        source: ctx.dataset.source(),
        reader: ctx.reader.as_ref(),
        arena: ctx.arena.as_ref(),
        storage: &ctx.storage,
        model: &state.model,
        stop: &state.stop,
    };
    let mut released = Vec::new();
    let mut observed = DecodeObservations::default();
    let mut taken: Vec<Ready> = Vec::with_capacity(GROUP_MAX);
    let mut group = std::vec::IntoIter::default();
    loop {
        if observed.samples >= OBSERVE_EVERY_SAMPLES {
            observed.flush(state);
        }
        let Some(Ready { access, bytes }) = group.next().or_else(|| {
            let more = state.decode.take(
                w,
                &ctx.layout,
                &state.stop,
                || state.outstanding.drained(),
                &mut taken,
            );
            group = std::mem::take(&mut taken).into_iter();
            more.then(|| group.next()).flatten()
        }) else {
            break;
        };
        let meta = ctx.meta(access.sample);
        if let Some((item, elapsed)) = decoded_hit(state, &access, meta) {
            let last = group.len() == 0;
            hand_over(state, &access, (item, elapsed, None), last, &mut observed);
            continue;
        }
        // A planned hit that had to read storage after all (counted as the miss it is).
        let mut reread = false;
        // What the worker read itself fills the sample's landing (`Some`: where the bytes live).
        let (bytes, read_here) = load(
            &reads,
            state,
            (&access, meta),
            bytes,
            &mut observed,
            &mut reread,
        );
        if let Some(origin) = read_here {
            fill(state, ctx, &access, bytes.clone(), origin, &mut released);
        }
        let keep = access
            .landing
            .as_ref()
            .filter(|_| access.cached.keep_decoded());
        let stages = (keep, access.cached.hit_decoded());
        let (mut item, mut elapsed) =
            decode_sample(ctx, state, meta, access.epoch, bytes, stages, &mut observed);
        if access.cached.hit() && !reread && matches!(item, Err(Error::Decode { .. })) {
            // Cached bytes the admitting access has not yet found bad (it may still be
            // decoding them): the same verdict, reached before the mark.
            reread = true;
            let again = decode_sample(
                ctx,
                state,
                meta,
                access.epoch,
                blocking_read(&reads, meta, access.epoch, 0),
                stages,
                &mut observed,
            );
            item = again.0;
            elapsed += again.1;
        }
        // Bytes the cache keeps (or keeps until their image is made) that fail to decode.
        if access.cached.admitted() || access.cached.keep_decoded() {
            if let (Err(e @ Error::Decode { .. }), Some(landing)) = (&item, &access.landing) {
                landing.spoil(e.clone());
            }
        }
        let reread = reread.then_some(meta.size_bytes);
        let last = group.len() == 0;
        hand_over(state, &access, (item, elapsed, reread), last, &mut observed);
    }
    observed.flush(state);
}

/// A hit on a decoded image runs the second stage only: its sample and how long that took.
/// `None` for any other access, or when the image is gone (counted: it is decoded again).
fn decoded_hit<T>(
    state: &ForWorkers<T>,
    access: &Access,
    meta: &SampleMeta,
) -> Option<(Result<Sample<T>, Error>, Duration)> {
    let tier = state
        .tier
        .as_ref()
        .filter(|_| access.cached.hit_decoded())?;
    let Some(image) = access.landing.as_ref().and_then(|s| s.decoded()) else {
        state.forms.decoded_again.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let started = Instant::now();
    let item = decode_step(meta, || {
        finish_cached(&tier.staged, &image, meta, access.epoch, &state.forms)
    });
    Some((item, started.elapsed()))
}

/// The bytes of `access`'s sample: those it came with, or what the worker reads itself, and
/// then where they live (`Some`: they fill the sample's landing). `reread`: a planned hit
/// that had to read storage after all.
fn load<T>(
    reads: &WorkerReads<'_>,
    state: &ForWorkers<T>,
    (access, meta): (&Access, &SampleMeta),
    bytes: Loaded,
    observed: &mut DecodeObservations,
    reread: &mut bool,
) -> (Loaded, Option<Origin>) {
    match access.read {
        Read::Blocking { peer } => {
            let from_peer = peer.and_then(|p| {
                let peers = state.peers.as_deref().expect("a peer fetch has peers");
                fetch::blocking(peers, &state.model, (access.sample, meta.size_bytes), p)
            });
            let loaded = match from_peer {
                Some(bytes) => Ok(bytes),
                None => blocking_read(reads, meta, access.epoch, 0),
            };
            (loaded, Some(Origin::Own))
        }
        Read::IfResident => {
            observed.tried += 1;
            // An admitted sample the page cache holds can stay there, read like any other.
            let leave = access.cached.admitted() && state.read_path.leave_in_page_cache();
            let copy = access.cached.keeps_bytes() && !leave;
            match resident_read(reads, meta, access.epoch, copy) {
                (OnWorker::Done(loaded), pooled) => {
                    observed.resident += 1;
                    observed.left_in_page_cache += u64::from(leave && loaded.is_ok());
                    let origin = match (leave, pooled) {
                        (true, _) => Origin::PageCache,
                        (false, true) => Origin::Pool,
                        (false, false) => Origin::Own,
                    };
                    (loaded, Some(origin))
                }
                // Read from storage here: through the dispatcher the access would cross
                // two more threads and the decode queue again.
                (OnWorker::NotResident { attempt }, _) => (
                    blocking_read(reads, meta, access.epoch, attempt),
                    Some(Origin::Own),
                ),
            }
        }
        Read::PageCacheHit => match resident_read(reads, meta, access.epoch, false) {
            (OnWorker::Done(loaded), _) => {
                observed.page_cache_hits += 1;
                (loaded, None)
            }
            (OnWorker::NotResident { .. }, _) => {
                observed.page_cache_lost += 1;
                *reread = true;
                (blocking_read(reads, meta, access.epoch, 0), None)
            }
        },
        Read::Cached if matches!(bytes, Err(Error::Read { .. } | Error::Decode { .. })) => {
            // The read that admitted this sample failed, or its bytes failed to decode:
            // read it again for this access rather than fail every later hit on it. The
            // landing keeps the failure, so each such hit reads for itself and its outcome
            // depends only on its own epoch, not on timing.
            *reread = true;
            (blocking_read(reads, meta, access.epoch, 0), None)
        }
        // The disk thread filled the landing with what it read.
        Read::Cached | Read::Storage(_) | Read::Peer(_) | Read::Disk => (bytes, None),
    }
}

/// Delivers a access's sample to its rank (`reread`: the bytes of a planned hit that read
/// storage after all); the read-path counts go out before the last of a worker's group.
fn hand_over<T>(
    state: &ForWorkers<T>,
    access: &Access,
    (item, elapsed, reread): (Result<Sample<T>, Error>, Duration, Option<u64>),
    last_of_group: bool,
    observed: &mut DecodeObservations,
) {
    if last_of_group {
        observed.flush_read_path(state);
    }
    state.ranks[access.rank].deliver(access, item, elapsed, reread);
    if state.outstanding.delivered() {
        state.decode.wake();
    }
}

/// Decodes a worker observed and has not yet given the cost model: one lock per batch of
/// them, not per sample. The fit is a line in the sample size, so a batch's mean is a point
/// on it.
#[derive(Debug, Default)]
struct DecodeObservations {
    samples: u64,
    bytes: u64,
    elapsed: Duration,
    /// Page-cache reads tried, and of those read, since the last report: counted here so
    /// that workers do not share a counter's cache line per sample.
    tried: u64,
    resident: u64,
    /// Admitted samples left in the page cache, and hits read back from it or lost by it.
    left_in_page_cache: u64,
    page_cache_hits: u64,
    page_cache_lost: u64,
}

/// Samples a worker decodes between reports to the cost model.
const OBSERVE_EVERY_SAMPLES: u64 = 16;

impl DecodeObservations {
    fn flush<T>(&mut self, state: &ForWorkers<T>) {
        if self.samples > 0 {
            lock(&state.model).observe_decode(self.samples, self.bytes, self.elapsed);
        }
        self.flush_read_path(state);
        *self = DecodeObservations::default();
    }

    /// The read-path counts, exact in the metrics once every sample is delivered: reported
    /// before the last delivery of each group a worker takes.
    fn flush_read_path<T>(&mut self, state: &ForWorkers<T>) {
        let path = &state.read_path;
        if self.tried > 0 {
            path.tried.fetch_add(self.tried, Ordering::Relaxed);
            path.resident.fetch_add(self.resident, Ordering::Relaxed);
            path.left_in_page_cache
                .fetch_add(self.left_in_page_cache, Ordering::Relaxed);
            (self.tried, self.resident, self.left_in_page_cache) = (0, 0, 0);
        }
        if self.page_cache_hits + self.page_cache_lost > 0 {
            path.page_cache_hits(self.page_cache_hits, self.page_cache_lost);
            (self.page_cache_hits, self.page_cache_lost) = (0, 0);
        }
    }
}

/// Fills the landing of a read the worker made and queues the hits waiting on it.
fn fill<T>(
    state: &ForWorkers<T>,
    ctx: &Context<T>,
    access: &Access,
    loaded: Loaded,
    origin: Origin,
    released: &mut Vec<Ready>,
) {
    let landing = access
        .landing
        .as_ref()
        .expect("an access read on its worker never waited");
    // The worker decodes the bytes it read; the landing keeps its own copy where it makes one.
    let _kept = access::fill(
        landing,
        loaded,
        access.cached.keeps_bytes(),
        (origin, ctx.arena.as_ref()),
        released,
    );
    state.decode.push(released.drain(..));
}

/// Checks a sample's length and runs the user's decode function on it; with `keep`, the
/// decoded image goes into that landing, and a planned decoded hit (`hit_decoded`) is decoded
/// as the cache keeps images.
fn decode_sample<T>(
    ctx: &Context<T>,
    state: &ForWorkers<T>,
    meta: &SampleMeta,
    epoch: u32,
    bytes: Loaded,
    (keep, hit_decoded): (Option<&Arc<AccessLanding>>, bool),
    observed: &mut DecodeObservations,
) -> (Result<Sample<T>, Error>, Duration) {
    let started = Instant::now();
    let item = bytes.and_then(|b| {
        if b.len() as u64 != meta.size_bytes {
            return Err(Error::SizeChanged {
                sample: meta.id,
                path: meta.path.to_path_buf(),
                expected_bytes: meta.size_bytes,
                actual_bytes: b.len() as u64,
            });
        }
        decode_step(meta, || match &state.tier {
            Some(tier) => {
                let keep = keep.map(|landing| Keep {
                    landing,
                    arena: ctx.arena.as_ref(),
                    max_side: tier.max_side,
                    planned_bytes: tier.decoded_sizes[meta.id as usize],
                });
                let as_kept = hit_decoded.then_some(AsKept {
                    max_side: tier.max_side,
                });
                decode_in_stages(&tier.staged, &b, meta, epoch, keep, as_kept, &state.forms)
            }
            None => (ctx.decode)(&b, meta, epoch),
        })
    });
    let elapsed = started.elapsed();
    observed.samples += 1;
    observed.bytes += meta.size_bytes;
    observed.elapsed += elapsed;
    (item, elapsed)
}

/// Runs a decode step to the sample it makes, or the decode error naming it. A step that
/// panics fails its sample, not the worker: the batch must still come.
fn decode_step<T>(
    meta: &SampleMeta,
    step: impl FnOnce() -> Result<T, Cause>,
) -> Result<Sample<T>, Error> {
    let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(step))
        .unwrap_or_else(|panic| {
            Err(Cause::from(
                Box::<dyn std::error::Error + Send + Sync>::from(panic_message(&panic)),
            ))
        })
        .map_err(|cause| Error::Decode {
            sample: meta.id,
            path: meta.path.to_path_buf(),
            cause,
        })?;
    Ok(Sample {
        id: meta.id,
        label: meta.label,
        value,
    })
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".into());
    format!("the decode function panicked: {text}")
}
