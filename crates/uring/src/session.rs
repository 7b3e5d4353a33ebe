//! Caller-driven reads: the thread that owns a session submits and reaps, on a ring of its
//! own (the way fio and liburing programs drive io_uring) or, on the pread backend, through
//! the reader's pread workers, with the same queues, limits and completions.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::completion::Completion;
use crate::error::ReadError;
use crate::job::{Done, Job, Pending};
use crate::pread::PreadPort;
use crate::reader::{Reader, SessionParams};
use crate::ring::Ring;
use crate::state::ReaderState;
use crate::types::{PathRead, ReadRequest};

/// Where a session's started reads go.
#[derive(Debug)]
enum Driver {
    /// Its own ring (io_uring).
    Ring(Box<Ring>),
    /// The reader's pread workers.
    Pread(PreadPort),
}

impl Driver {
    /// Reads in the kernel or at the workers.
    fn in_flight(&self) -> usize {
        match self {
            Driver::Ring(ring) => ring.in_flight(),
            Driver::Pread(port) => port.in_flight(),
        }
    }

    /// Operations there is room for now.
    fn room(&self) -> usize {
        match self {
            Driver::Ring(ring) => ring.room(),
            Driver::Pread(port) => port.room(),
        }
    }

    /// Fixed-file slots free for reads by path (0 without them).
    fn free_slots(&self) -> usize {
        match self {
            Driver::Ring(ring) => ring.free_slots(),
            Driver::Pread(_) => 0,
        }
    }

    /// Operations `job` takes of the room once started.
    fn ops_of(&self, job: &Job) -> usize {
        match self {
            Driver::Ring(ring) => ring.ops_of(job),
            Driver::Pread(_) => 1,
        }
    }

    fn start(&mut self, job: Job, finished: &mut Vec<Done>) {
        match self {
            Driver::Ring(ring) => ring.start(job, finished),
            Driver::Pread(port) => port.start(job),
        }
    }

    /// Hands what was started to the kernel (or finds what the workers finished), waiting,
    /// with `want > 0`, for `want` completions or until `timeout`.
    fn enter(
        &mut self,
        want: usize,
        timeout: Option<Duration>,
        finished: &mut Vec<Done>,
    ) -> Result<(), ReadError> {
        match self {
            Driver::Ring(ring) => ring.enter(want, timeout, finished),
            Driver::Pread(port) => {
                port.reap(want, timeout, finished);
                Ok(())
            }
        }
    }
}

/// A caller-driven view of a [`Reader`]: the thread that owns it submits reads and reaps
/// their completions itself. On io_uring it drives a ring of its own, so a read costs no
/// thread hand-off and page-cache hits are copied on this thread during
/// [`Session::submit_batch`]: run one session per thread to use several cores. On the pread
/// backend it hands its reads to the reader's pread workers and reaps them in
/// [`Session::wait`] and [`Session::poll`] just the same.
///
/// A session shares the reader's classes, io_depth limits (a class's limit counts the
/// reads of every session together), files and buffer pool, and gives the same
/// completions, errors and retries on both backends. Requests wait in the session's own
/// FIFO queue per class until their class is below its io_depth; FIFO order holds within a
/// session, not across sessions, which take freed depth in whatever order they ask for it.
/// [`Reader::stats`] counts a session's reads in flight and completed in their classes, but
/// not the requests waiting in a session's own queues.
///
/// [`Session::submit_path`] reads a file named by path, opened for that read and closed
/// after it, in the same queues and limits.
///
/// A session is tied to the thread that created it (the ring is set up for a single
/// issuer), so it is neither `Send` nor `Sync`. Dropping it waits for its reads in the
/// kernel (or at the workers) and gives back their io_depth; reads still queued in it are
/// dropped without a completion.
pub struct Session {
    // Fields drop in order: the ring (with the pool registered) before the pool's owners.
    driver: Driver,
    /// Per class: requests not yet counted against the class's io_depth.
    queues: Vec<VecDeque<Job>>,
    queued: usize,
    cursor: usize,
    started: Vec<Job>,
    finished: Vec<Done>,
    queue_capacity: usize,
    shared: Arc<ReaderState>,
    reader: Reader,
    _single_thread: PhantomData<*const ()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("driver", &self.driver)
            .field("queued", &self.queued)
            .field("in_flight", &self.driver.in_flight())
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// A caller-driven session on this reader for the calling thread: its own ring (on
    /// io_uring) or a way to the reader's pread workers, sharing this reader's classes,
    /// io_depth limits, files and pool; see [`Session`]. Fails if the ring cannot be set up
    /// (e.g. out of file descriptors).
    pub fn session(&self) -> Result<Session, ReadError> {
        Session::new(self.clone(), self.session_params())
    }
}

impl Session {
    fn new(reader: Reader, params: SessionParams) -> Result<Session, ReadError> {
        let shared = reader.state().clone();
        let cap = params.ring.ring_entries as usize;
        let driver = match reader.pread_pool() {
            Some(workers) => Driver::Pread(workers.port(cap)),
            None => Driver::Ring(Box::new(Ring::new(params.ring, &shared.pool)?)),
        };
        Ok(Session {
            queues: (0..shared.classes()).map(|_| VecDeque::new()).collect(),
            reader,
            shared,
            driver,
            queued: 0,
            cursor: 0,
            started: Vec::with_capacity(cap),
            finished: Vec::with_capacity(cap),
            queue_capacity: params.queue_capacity,
            _single_thread: PhantomData,
        })
    }

    /// The reader this session belongs to.
    pub fn reader(&self) -> &Reader {
        &self.reader
    }

    /// This session uses a ring with pool buffers registered (`READ_FIXED`).
    pub fn fixed_buffers(&self) -> bool {
        matches!(&self.driver, Driver::Ring(ring) if ring.fixed_buffers())
    }

    /// Fixed-file slots this session's ring keeps for reads by path: at most this many
    /// such reads are in the kernel at once. 0 when reads by path open, read and close with
    /// separate system calls (on the calling thread without direct descriptors, on the
    /// workers on the pread backend).
    pub fn path_slots(&self) -> usize {
        match &self.driver {
            Driver::Ring(ring) => ring.path_slots(),
            Driver::Pread(_) => 0,
        }
    }

    /// Fixed-file slots held by reads by path in the kernel now.
    pub fn path_slots_in_use(&self) -> usize {
        match &self.driver {
            Driver::Ring(ring) => ring.path_slots_in_use(),
            Driver::Pread(_) => 0,
        }
    }

    /// Requests submitted and not yet returned by `wait`/`poll` (queued, in flight, or
    /// done and not yet returned).
    pub fn pending(&self) -> usize {
        self.queued + self.driver.in_flight() + self.started.len() + self.finished.len()
    }

    /// Queues one read and starts what the limits allow; see [`Session::submit_batch`].
    pub fn submit(&mut self, req: ReadRequest) -> Result<(), ReadError> {
        self.submit_batch(std::slice::from_ref(&req)).map(drop)
    }

    /// Queues reads at the back of their classes' FIFOs in this session, then hands to the
    /// kernel, in one system call, every queued read its class's io_depth and the ring
    /// allow (page-cache hits are copied during that call). Every request is checked first;
    /// on an error nothing is queued.
    ///
    /// Returns how many of `reqs` were queued, in order: all of them unless a bound was
    /// reached. Bounds: a class queue of the session holds
    /// [`crate::ReaderConfig::queue_capacity`] requests, and each request takes a block of
    /// pool memory. When a bound is reached while this session has reads pending, the rest is
    /// not queued (call [`Session::wait`], drop completions, and submit the rest), and if
    /// not even the first could be queued this returns [`ReadError::WouldBlock`]; with
    /// nothing pending, an empty pool makes this wait for a buffer another thread returns.
    pub fn submit_batch(&mut self, reqs: &[ReadRequest]) -> Result<usize, ReadError> {
        let pending = reqs
            .iter()
            .map(|req| self.reader.check(req))
            .collect::<Result<Vec<_>, _>>()?;
        self.queue_and_start(pending)
    }

    /// Queues one read of a file named by path; see [`Session::submit_path_batch`].
    pub fn submit_path(&mut self, req: PathRead) -> Result<(), ReadError> {
        self.submit_path_batch(std::slice::from_ref(&req)).map(drop)
    }

    /// Queues reads of files named by path, as [`Session::submit_batch`] queues reads of
    /// open files (same queues, io_depth, pool, bounds and return value): each opens its
    /// file, reads it and closes it, and its [`Completion`] says which of the three failed
    /// ([`ReadError::Open`], [`ReadError::Read`] or [`ReadError::UnexpectedEof`],
    /// [`ReadError::Close`]) with the path and the OS error.
    ///
    /// Where the kernel has direct descriptors (see
    /// [`crate::BackendInfo::direct_descriptors`]) the open goes straight into a slot of
    /// this ring's fixed-file table, linked to the read and the close of that slot, so a
    /// read by path goes into the kernel with the same one system call as a read of an open
    /// file; a read waits in its queue while all [`Session::path_slots`] are held, as it
    /// does over its class's io_depth. Otherwise the file is opened (openat, statx) on this
    /// thread when its read starts, read through its descriptor and closed when the read
    /// ends. On the pread backend a worker opens, reads and closes the file. A zero-length
    /// read completes at once without opening the file.
    pub fn submit_path_batch(&mut self, reqs: &[PathRead]) -> Result<usize, ReadError> {
        let pending = reqs
            .iter()
            .map(|req| self.reader.check_path(req))
            .collect::<Result<Vec<_>, _>>()?;
        self.queue_and_start(pending)
    }

    /// Like [`Session::submit_path`], but without the system call: the read's operations go
    /// into the submission queue, and reach the kernel with the next call of this session
    /// that enters it ([`Session::wait`], [`Session::wait_timeout`], [`Session::poll`], a
    /// submission). A caller that queues many reads between waits saves a system call each.
    /// (On the pread backend a read the limits allow goes to the workers at once.)
    pub fn queue_path(&mut self, req: PathRead) -> Result<(), ReadError> {
        let pending = self.reader.check_path(&req)?;
        self.queue(vec![pending]).map(drop)
    }

    /// Queues checked requests in order while the bounds allow, starts what the limits
    /// allow, and hands them to the kernel; see [`Session::submit_batch`].
    fn queue_and_start(&mut self, pending: Vec<Pending>) -> Result<usize, ReadError> {
        let accepted = self.queue(pending);
        self.enter(0, None)?;
        accepted
    }

    /// [`Session::queue_and_start`] up to the system call.
    fn queue(&mut self, pending: Vec<Pending>) -> Result<usize, ReadError> {
        let mut accepted = 0;
        let mut refused = None;
        for p in pending {
            if self.queues[p.class].len() >= self.queue_capacity {
                refused = Some("class queue");
                break;
            }
            let buf = match self.shared.pool.try_acquire(p.read_len) {
                Some(buf) => buf,
                None if self.pending() > 0 => {
                    refused = Some("buffer pool");
                    break;
                }
                None => self.shared.pool.acquire(p.read_len),
            };
            let class = p.class;
            self.queues[class].push_back(Job::new(p, buf));
            self.queued += 1;
            accepted += 1;
        }
        self.start_queued();
        match refused {
            Some(bound) if accepted == 0 => Err(ReadError::WouldBlock { bound }),
            _ => Ok(accepted),
        }
    }

    /// Waits until at least `min` of this session's reads have completed (fewer if fewer
    /// are pending), appends every completion available to `out`, and returns how many it
    /// appended. Sleeps in the kernel, or, when every queued read is held back by its
    /// class's io_depth, until another thread finishes a read or raises a limit (a class
    /// paused at depth 0 keeps this waiting until its depth is raised).
    pub fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<usize, ReadError> {
        let mut got = 0;
        loop {
            self.start_queued();
            got += self.deliver(out);
            if got >= min || self.pending() == 0 {
                // Reads started above still have to reach the kernel.
                self.enter(0, None)?;
                got += self.deliver(out);
                return Ok(got);
            }
            let in_flight = self.driver.in_flight();
            if in_flight == 0 {
                let s = self.shared.lock();
                let blocked = self
                    .queues
                    .iter()
                    .enumerate()
                    .all(|(class, q)| q.is_empty() || !s.has_room(class));
                if blocked {
                    drop(self.shared.wait_for_depth(s));
                }
                continue;
            }
            self.enter((min - got).min(in_flight), None)?;
        }
    }

    /// Like [`Session::wait`], but returns after `timeout` even if fewer than `min` reads
    /// completed, and at once when every queued read is held back by its class's io_depth
    /// (the caller decides what to wait for then).
    pub fn wait_timeout(
        &mut self,
        min: usize,
        timeout: Duration,
        out: &mut Vec<Completion>,
    ) -> Result<usize, ReadError> {
        let deadline = Instant::now() + timeout;
        let mut got = 0;
        loop {
            self.start_queued();
            got += self.deliver(out);
            let now = Instant::now();
            let in_flight = self.driver.in_flight();
            if got >= min || self.pending() == 0 || now >= deadline || in_flight == 0 {
                self.enter(0, None)?;
                got += self.deliver(out);
                return Ok(got);
            }
            self.enter((min - got).min(in_flight), Some(deadline - now))?;
        }
    }

    /// Appends every completion available now to `out` without waiting; returns how many.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, ReadError> {
        self.start_queued();
        self.enter(0, None)?;
        Ok(self.deliver(out))
    }

    /// Moves queued jobs whose class is below its io_depth into `started` (one lock round),
    /// round robin over classes, as long as the driver has room for their operations and a
    /// fixed-file slot is free for each read by path in a slot; then hands them to the
    /// driver (the SQ, or the pread workers).
    fn start_queued(&mut self) {
        let mut budget = self.driver.room();
        if self.queued > 0 && budget > 0 {
            let mut free_slots = self.driver.free_slots();
            let n = self.queues.len();
            let mut s = self.shared.lock();
            let mut progress = true;
            while progress && budget > 0 {
                progress = false;
                for i in 0..n {
                    let c = (self.cursor + i) % n;
                    let Some(job) = self.queues[c].front() else {
                        continue;
                    };
                    let ops = self.driver.ops_of(job);
                    let needs_slot = ops > 1 && !job.is_empty();
                    if ops > budget || (needs_slot && free_slots == 0) {
                        continue;
                    }
                    if !self.shared.try_start(&mut s, job) {
                        continue;
                    }
                    let job = self.queues[c].pop_front().expect("front exists");
                    self.queued -= 1;
                    self.started.push(job);
                    budget -= ops;
                    free_slots -= usize::from(needs_slot);
                    progress = true;
                    if budget == 0 {
                        self.cursor = (c + 1) % n;
                        break;
                    }
                }
            }
        }
        for job in self.started.drain(..) {
            if job.is_empty() {
                self.finished.push((job, Ok(())));
            } else {
                self.driver.start(job, &mut self.finished);
            }
        }
    }

    /// [`Driver::enter`] into this session's list of finished jobs.
    fn enter(&mut self, want: usize, timeout: Option<Duration>) -> Result<(), ReadError> {
        self.driver.enter(want, timeout, &mut self.finished)
    }

    /// Stops counting finished jobs against their classes (one lock round) and appends
    /// their completions to `out`.
    fn deliver(&mut self, out: &mut Vec<Completion>) -> usize {
        if self.finished.is_empty() {
            return 0;
        }
        {
            let mut s = self.shared.lock();
            for (job, _) in &self.finished {
                self.shared.finish(&mut s, job);
            }
        }
        let n = self.finished.len();
        out.extend(
            self.finished
                .drain(..)
                .map(|(job, result)| job.complete(result)),
        );
        n
    }
}

impl Drop for Session {
    /// Waits for the reads in the kernel or at the workers (their buffers must outlive the
    /// kernel's writes), releases their io_depth, and drops the reads still queued.
    fn drop(&mut self) {
        self.queues.iter_mut().for_each(VecDeque::clear);
        self.queued = 0;
        let mut sink = Vec::new();
        while self.driver.in_flight() > 0 {
            if self.enter(1, None).is_err() {
                if let Driver::Ring(ring) = &mut self.driver {
                    ring.abandon();
                }
                break;
            }
            self.deliver(&mut sink);
            sink.clear();
        }
        self.deliver(&mut sink);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::reader::Backend;

    fn path_read(path: &Path, direct: bool, offset: u64, len: usize, tag: u64) -> PathRead {
        PathRead {
            dir: None,
            path: Arc::from(path),
            direct,
            offset,
            len,
            to_eof: false,
            class: 0,
            tag,
        }
    }

    /// The fallback of a ring whose kernel has no direct descriptors: open on this thread,
    /// read through the descriptor in the ring, close when the read is over.
    #[test]
    fn without_direct_descriptors_reads_by_path_open_on_the_calling_thread() {
        let reader = match Reader::builder().backend(Backend::Uring).build() {
            Ok(reader) => reader,
            Err(e) => {
                eprintln!("io_uring unavailable, fallback test skipped: {e}");
                return;
            }
        };
        // Beside the test binary: a real file system, where O_DIRECT works.
        let exe = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let missing = dir.path().join("missing");
        let mut reqs = Vec::new();
        for i in 0..12u64 {
            let path = dir.path().join(format!("f{i}"));
            std::fs::write(&path, &data).unwrap();
            reqs.push(path_read(&path, i % 2 == 1, i * 1000, 20_000, i));
        }
        reqs.push(path_read(&missing, false, 0, 10, 99));
        let mut params = reader.session_params();
        params.ring.direct_descriptors = false;
        params.ring.ring_entries = 4;
        let mut session = Session::new(reader.clone(), params).unwrap();
        assert!(matches!(session.driver, Driver::Ring(_)));
        assert_eq!(session.path_slots(), 0);
        let mut rest = &reqs[..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            rest = &rest[session.submit_path_batch(rest).unwrap()..];
            session.wait(1, &mut out).unwrap();
        }
        while session.pending() > 0 {
            session.wait(1, &mut out).unwrap();
        }
        assert_eq!(out.len(), reqs.len());
        for c in out {
            if c.tag == 99 {
                assert!(
                    matches!(&c.result, Err(ReadError::Open { path, .. }) if path == &missing),
                    "{:?}",
                    c.result
                );
                continue;
            }
            let offset = c.tag as usize * 1000;
            assert_eq!(c.result.unwrap()[..], data[offset..offset + 20_000]);
        }
    }
}
