//! Reads on a decode worker's own thread: the read-then-decode baselines' blocking read (a
//! plain open and read, as PyTorch's workers do), and the pipelined mode's read of a sample
//! the page cache holds. Both go through the same attempt fate as the dispatcher's reads.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use lobster_uring::Resident;

use super::attempt::{Attempt, Fate, ReadFailure, ReadFates};
use super::dirs::SampleDirs;
use crate::dataset::{SampleMeta, Source};
use crate::pipeline::landing::{Loaded, LARGE_FROM_BYTES};
use crate::pipeline::sync::{lock, stopped, StopSignal};
use lobster_sched::{CostModel, Tier};

/// What a read on a worker's thread uses, lent by the worker.
pub(crate) struct WorkerReads<'a> {
    /// The loader reads with O_DIRECT.
    pub(crate) direct: bool,
    pub(crate) dirs: Option<&'a SampleDirs>,
    /// Where the dataset's samples are read from.
    pub(crate) source: &'a Source,
    pub(crate) reader: Option<&'a lobster_uring::Reader>,
    pub(crate) arena: Option<&'a lobster_uring::Arena>,
    pub(crate) storage: &'a ReadFates,
    /// Learns from the workers' storage reads as from the dispatcher's.
    pub(crate) model: &'a Mutex<CostModel>,
    pub(crate) stop: &'a StopSignal,
}

/// What a read on the worker came to.
#[derive(Debug)]
pub(crate) enum OnWorker {
    /// The sample's bytes or its error.
    Done(Loaded),
    /// Attempt `attempt` found the sample not in the page cache: storage must be read.
    NotResident { attempt: u32 },
}

/// Reads `meta` for an access in `epoch` with a blocking open and read (O_DIRECT if the
/// loader reads so), charged to the emulated tier, retrying transient failures with backoff;
/// `first_attempt` counts the attempts made before (a try of the page cache).
pub(crate) fn blocking_read(
    reads: &WorkerReads<'_>,
    meta: &SampleMeta,
    epoch: u32,
    first_attempt: u32,
) -> Loaded {
    let direct = reads.direct;
    // A whole file asks one byte more: a file that grew since the dataset was opened shows.
    let len = meta.read_len();
    let read = || -> Result<Option<Bytes>, ReadFailure> {
        match reads.source {
            Source::Files => {}
            #[cfg(feature = "s3")]
            Source::Objects(objects) => {
                return Ok(Some(objects.store.get(&objects.read(
                    &meta.path,
                    meta.range(),
                    0,
                ))?));
            }
        }
        if direct {
            return Ok(Some(lobster_uring::read_direct(
                &meta.path,
                meta.offset,
                len,
            )?));
        }
        let mut file = File::open(&meta.path)?;
        if meta.offset > 0 {
            file.seek(SeekFrom::Start(meta.offset))?;
        }
        // Room for the probe byte, so an intact file never regrows the buffer.
        let mut buf = Vec::with_capacity(len);
        (&mut file).take(len as u64).read_to_end(&mut buf)?;
        Ok(Some(Bytes::from(buf)))
    };
    let issued = Instant::now();
    match on_worker(reads, meta, (epoch, first_attempt), read) {
        OnWorker::Done(loaded) => {
            // The cost model prices storage against peers' caches: it learns from the
            // workers' reads as from the dispatcher's, emulated tier and retries included.
            if loaded.is_ok() {
                lock(reads.model).observe_read(Tier::Storage, meta.size_bytes, issued.elapsed());
            }
            loaded
        }
        OnWorker::NotResident { .. } => unreachable!("a blocking read always reads"),
    }
}

/// Reads `meta` on the worker if the page cache holds all of it; also says whether the
/// bytes hold a block of the reader's pool. A sample the cache keeps (`admitted`) gets memory
/// of its own, which the cache holds as it is (a large one a run of the cache's arena). A
/// large one that it does not keep gets a pool block when one is free, memory reused read
/// after read where a fresh buffer costs a page fault per page; a small one the heap, which
/// reuses freed memory as well without the pool's shared lock.
pub(crate) fn resident_read(
    reads: &WorkerReads<'_>,
    meta: &SampleMeta,
    epoch: u32,
    admitted: bool,
) -> (OnWorker, bool) {
    let mut pooled = false;
    let read = || -> Result<Option<Bytes>, ReadFailure> {
        let (offset, len) = (meta.offset, meta.read_len());
        let file = match reads.dirs {
            Some(dirs) => dirs.file(meta),
            None => (&*meta.path).into(),
        };
        let in_arena = match reads.arena {
            Some(arena) if admitted && len >= LARGE_FROM_BYTES => {
                arena.read_resident(file, offset, len)?
            }
            _ => None,
        };
        let found = match (in_arena, reads.reader) {
            (Some(found), _) => found,
            (None, Some(reader)) if !admitted && len >= LARGE_FROM_BYTES => {
                reader.read_resident(file, offset, len)?
            }
            (None, _) => lobster_uring::read_resident(file, offset, len)?,
        };
        match found {
            Resident::Read { bytes, pooled: p } => {
                pooled = p;
                Ok(Some(bytes))
            }
            Resident::NotResident | Resident::Unsupported => Ok(None),
        }
    };
    let outcome = on_worker(reads, meta, (epoch, 0), read);
    (outcome, pooled)
}

/// Runs attempts of `read` (`None`: not resident) until its fate is decided.
fn on_worker(
    reads: &WorkerReads<'_>,
    meta: &SampleMeta,
    (epoch, mut number): (u32, u32),
    mut read: impl FnMut() -> Result<Option<Bytes>, ReadFailure>,
) -> OnWorker {
    loop {
        // Reserved before the read, as the dispatcher does, so the tier serves in issue order.
        let due = reads.storage.reserve(Instant::now(), meta.size_bytes);
        let result = match read() {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => return OnWorker::NotResident { attempt: number },
            Err(e) => Err(e),
        };
        let attempt = Attempt {
            meta,
            epoch,
            number,
            due,
        };
        match reads.storage.fate(attempt, result) {
            Fate::Deliver { at, loaded } => {
                let running = at.map_or(!reads.stop.is_set(), |at| reads.stop.sleep_until(at));
                if !running {
                    return OnWorker::Done(Err(stopped()));
                }
                return OnWorker::Done(loaded);
            }
            Fate::Retry { at } => {
                number += 1;
                if !reads.stop.sleep_until(at) {
                    return OnWorker::Done(Err(stopped()));
                }
            }
        }
    }
}
