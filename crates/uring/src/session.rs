//! Caller-driven reads: a ring owned by the thread that submits and reaps, with no engine
//! thread in between (the way fio and liburing programs drive io_uring).

use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::marker::PhantomData;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::types::{SubmitArgs, Timespec};
use io_uring::{squeue, IoUring};
use slab::Slab;

use crate::completion::Completion;
use crate::error::ReadError;
use crate::job::{AfterRead, ChainNext, ChainOp, Job, Opened, Pending, SlotChain};
use crate::pread;
use crate::reader::{Reader, SessionParams};
use crate::state::ReaderState;
use crate::types::{PathRead, ReadRequest};
use crate::uring::{
    build_session_ring, chain_user_data, close_fixed_sqe, decode_user_data, nofile_limit,
    open_direct_sqe, push_entries, push_entry, read_sqe, register_pool, ReadTarget,
};

struct Ring {
    ring: IoUring,
    fixed_buffers: bool,
    async_punt: bool,
}

static ENTER_ERROR_LOGGED: AtomicBool = AtomicBool::new(false);

/// The slots of a session ring's fixed-file table that reads by path open their files
/// into: one per path read in the ring, so at most `total` of them at once.
#[derive(Debug)]
struct PathSlots {
    free: Vec<u32>,
    total: usize,
}

impl PathSlots {
    fn new(total: u32) -> PathSlots {
        PathSlots {
            free: (0..total).rev().collect(),
            total: total as usize,
        }
    }

    fn take(&mut self) -> Option<u32> {
        let slot = self.free.pop();
        assert!(self.in_use() <= self.total);
        slot
    }

    fn give(&mut self, slot: u32) {
        assert!(
            self.free.len() < self.total && (slot as usize) < self.total,
            "slot {slot} returned twice or never taken"
        );
        debug_assert!(!self.free.contains(&slot));
        self.free.push(slot);
    }

    fn in_use(&self) -> usize {
        self.total - self.free.len()
    }
}

/// A caller-driven view of a [`Reader`]: the thread that owns it submits reads and reaps
/// their completions itself, on a ring of its own, so a read costs no thread hand-off.
/// Page-cache hits are copied on this thread during [`Session::submit_batch`]; run one
/// session per thread to use several cores.
///
/// A session shares the reader's classes, io_depth limits (a class's limit counts the
/// reads of every session and of the reader's own engines together), files and buffer
/// pool, and gives the same completions, errors and retries. Requests wait in the
/// session's own FIFO queue per class until their class is below its io_depth; FIFO order
/// holds within a session, not across sessions and the reader's own queues, which take
/// freed depth in whatever order they ask for it.
/// Completions come back from [`Session::wait`] and [`Session::poll`], not from
/// [`Reader::completions`]. [`Reader::stats`] counts a session's reads in flight and
/// completed in their classes, but not the requests waiting in a session's own queues.
///
/// [`Session::submit_path`] reads a file named by path, opened for that read and closed
/// after it, in the same queues and limits.
///
/// On the pread backend a session reads with pread(2) on the calling thread inside
/// `wait`/`poll`.
///
/// A session is tied to the thread that created it (the ring is set up for a single
/// issuer), so it is neither `Send` nor `Sync`. Dropping it waits for its reads in the
/// kernel; reads still queued in it are dropped without a completion.
pub struct Session {
    // Fields drop in order: the ring (with the pool registered) before the pool's owners.
    ring: Option<Ring>,
    /// Per class: requests not yet counted against the class's io_depth.
    queues: Vec<VecDeque<Job>>,
    queued: usize,
    /// Reads in the kernel, keyed by user_data (less the bits of a chain's operation).
    in_ring: Slab<Job>,
    /// Operations in the kernel: one per read, up to three for a read by path.
    ops_in_ring: usize,
    /// Most operations in the kernel at once (the SQ size; the CQ is twice as large).
    cap: usize,
    /// Fixed-file slots for reads by path; `None`: they open on this thread.
    path_slots: Option<PathSlots>,
    /// A read by path links its close after its read (the SQ holds the three at once).
    link_close: bool,
    cursor: usize,
    started: Vec<Job>,
    finished: Vec<(Job, Result<(), ReadError>)>,
    queue_capacity: usize,
    shared: Arc<ReaderState>,
    reader: Reader,
    _single_thread: PhantomData<*const ()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("uring", &self.ring.is_some())
            .field("queued", &self.queued)
            .field("in_ring", &self.in_ring.len())
            .field("ops_in_ring", &self.ops_in_ring)
            .field("cap", &self.cap)
            .field("path_slots", &self.path_slots())
            .field("path_slots_in_use", &self.path_slots_in_use())
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// A caller-driven session on this reader for the calling thread: its own ring (on
    /// io_uring), sharing this reader's classes, io_depth limits, files and pool; see
    /// [`Session`]. Fails if the ring cannot be set up (e.g. out of file descriptors).
    pub fn session(&self) -> Result<Session, ReadError> {
        Session::new(self.clone(), self.session_params())
    }
}

impl Session {
    fn new(reader: Reader, params: SessionParams) -> Result<Session, ReadError> {
        let shared = reader.state().clone();
        let mut path_slots = None;
        let (ring, cap) = if params.uring {
            let ring =
                build_session_ring(params.ring_entries).map_err(|source| ReadError::Setup {
                    what: "io_uring_setup for a session",
                    source,
                })?;
            let fixed_buffers =
                params.register_buffers && register_pool(&ring, &shared.pool).is_ok();
            let cap = ring.params().sq_entries() as usize;
            if params.direct_descriptors {
                // As many slots as chains fit in the ring at once (see `ops_of`).
                let slots = (cap / chain_ops(cap)) as u64;
                let slots = slots.min(nofile_limit()) as u32;
                match ring.submitter().register_files_sparse(slots) {
                    Ok(()) if slots > 0 => path_slots = Some(PathSlots::new(slots)),
                    Ok(()) => {}
                    Err(e) => log::debug!(
                        "lobster-uring: no fixed-file slots for path reads in a session ({e}); \
                         they open on the calling thread"
                    ),
                }
            }
            let ring = Ring {
                ring,
                fixed_buffers,
                async_punt: params.async_punt,
            };
            (Some(ring), cap)
        } else {
            (None, params.ring_entries as usize)
        };
        Ok(Session {
            queues: (0..shared.classes()).map(|_| VecDeque::new()).collect(),
            reader,
            shared,
            ring,
            queued: 0,
            in_ring: Slab::with_capacity(cap),
            ops_in_ring: 0,
            cap,
            path_slots,
            link_close: chain_ops(cap) == 3,
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
        self.ring.as_ref().is_some_and(|r| r.fixed_buffers)
    }

    /// Fixed-file slots this session's ring keeps for reads by path: at most this many
    /// such reads are in the kernel at once. 0 when reads by path open, read and close with
    /// separate system calls on the calling thread (pread backend, no direct descriptors).
    pub fn path_slots(&self) -> usize {
        self.path_slots.as_ref().map_or(0, |p| p.total)
    }

    /// Fixed-file slots held by reads by path in the kernel now.
    pub fn path_slots_in_use(&self) -> usize {
        self.path_slots.as_ref().map_or(0, PathSlots::in_use)
    }

    /// Requests submitted and not yet returned by `wait`/`poll` (queued, in flight, or
    /// done and not yet returned).
    pub fn pending(&self) -> usize {
        self.queued + self.in_ring.len() + self.started.len() + self.finished.len()
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
    /// ends. A zero-length read completes at once without opening the file.
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
    pub fn queue_path(&mut self, req: PathRead) -> Result<(), ReadError> {
        let pending = self.reader.check_path(&req)?;
        self.queue(vec![pending]).map(drop)
    }

    /// Queues checked requests in order while the bounds allow, starts what the limits
    /// allow, and hands them to the kernel; see [`Session::submit_batch`].
    fn queue_and_start(&mut self, pending: Vec<Pending>) -> Result<usize, ReadError> {
        let accepted = self.queue(pending);
        self.enter(0)?;
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
                None => self.shared.pool.acquire(p.read_len).expect(
                    "the pool only closes when the reader drops, and this session holds it",
                ),
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
                self.enter(0)?;
                got += self.deliver(out);
                return Ok(got);
            }
            if self.in_ring.is_empty() {
                let s = self.shared.lock();
                let blocked = self
                    .queues
                    .iter()
                    .enumerate()
                    .all(|(class, q)| q.is_empty() || !self.shared.class_has_room(&s, class));
                if blocked {
                    drop(self.shared.wait_for_depth(s));
                }
                continue;
            }
            self.enter((min - got).min(self.in_ring.len()))?;
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
            if got >= min || self.pending() == 0 || now >= deadline || self.in_ring.is_empty() {
                self.enter(0)?;
                got += self.deliver(out);
                return Ok(got);
            }
            self.enter_with((min - got).min(self.in_ring.len()), Some(deadline - now))?;
        }
    }

    /// Appends every completion available now to `out` without waiting; returns how many.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, ReadError> {
        self.start_queued();
        self.enter(0)?;
        Ok(self.deliver(out))
    }

    /// Operations `job` may have in the kernel at once once started.
    fn ops_of(&self, job: &Job) -> usize {
        if self.path_slots.is_some() && job.by_path() {
            chain_ops(self.cap)
        } else {
            1
        }
    }

    /// Moves queued jobs whose class is below its io_depth into `started` (one lock round),
    /// round robin over classes, as long as the ring has room for their operations and a
    /// fixed-file slot is free for each read by path; then puts them into the SQ (or reads
    /// them, on pread).
    fn start_queued(&mut self) {
        let mut budget = self.cap.saturating_sub(self.ops_in_ring);
        if self.queued > 0 && budget > 0 {
            let mut free_slots = self.path_slots.as_ref().map_or(0, |p| p.free.len());
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
                    let ops = self.ops_of(job);
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
        let mut started = std::mem::take(&mut self.started);
        for mut job in started.drain(..) {
            if job.is_empty() {
                self.finished.push((job, Ok(())));
                continue;
            }
            let Some(ring) = &self.ring else {
                self.finished.push(pread::read(job));
                continue;
            };
            if job.by_path() {
                if let Some(slots) = &mut self.path_slots {
                    let c_path = match c_path_of(&job) {
                        Ok(c_path) => c_path,
                        Err(e) => {
                            self.finished.push((job, Err(e)));
                            continue;
                        }
                    };
                    let slot = slots.take().expect("a free slot was counted for this read");
                    self.ops_in_ring +=
                        start_chain(ring, &mut self.in_ring, job, slot, c_path, self.link_close);
                    continue;
                }
                // No direct descriptors: open here, read through the descriptor.
                if let Err(e) = job.open_here() {
                    self.finished.push((job, Err(e)));
                    continue;
                }
            }
            let key = self.in_ring.insert(job);
            push_read(ring, key, &mut self.in_ring[key]);
            self.ops_in_ring += 1;
        }
        self.started = started;
        // The CQ (twice the SQ) can never overflow.
        assert!(self.ring.is_none() || self.ops_in_ring <= self.cap);
    }

    /// Submits what is in the SQ and, with `want > 0`, sleeps until the CQ holds `want`
    /// entries; then folds every CQE into its job (resubmitting short reads and retries,
    /// and the next operation of a read by path).
    fn enter(&mut self, want: usize) -> Result<(), ReadError> {
        self.enter_with(want, None)
    }

    /// Submits and waits for `want` completions, or until `timeout` passes.
    fn enter_with(&mut self, want: usize, timeout: Option<Duration>) -> Result<(), ReadError> {
        let Some(ring) = &self.ring else {
            return Ok(());
        };
        let idle = want == 0 && {
            // SAFETY: only this session's thread touches its ring.
            let sq = unsafe { ring.ring.submission_shared() };
            // TASKRUN: completions wait for an enter to be posted (DEFER_TASKRUN).
            sq.is_empty() && !sq.taskrun()
        };
        if !idle {
            let timespec = timeout.map(Timespec::from);
            loop {
                let entered = match (&timespec, want) {
                    (Some(ts), 1..) => {
                        let args = SubmitArgs::new().timespec(ts);
                        match ring.ring.submitter().submit_with_args(want, &args) {
                            // Timed out: whatever completed is reaped below.
                            Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(0),
                            // No EXT_ARG (before Linux 5.11): submit, and a short nap
                            // stands for the timed wait.
                            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                                let submitted = ring.ring.submit();
                                std::thread::sleep(ts_duration(timeout).min(NAP_WITHOUT_EXT_ARG));
                                submitted
                            }
                            other => other,
                        }
                    }
                    _ => ring.ring.submit_and_wait(want),
                };
                match entered {
                    Ok(_) => break,
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                        ) =>
                    {
                        if want == 0 {
                            break;
                        }
                        // EBUSY/EAGAIN: completions are pending to be reaped; reap them first.
                        // SAFETY: only this session's thread touches its ring.
                        if !unsafe { ring.ring.completion_shared() }.is_empty() {
                            break;
                        }
                    }
                    Err(e) => {
                        if !ENTER_ERROR_LOGGED.swap(true, Ordering::Relaxed) {
                            log::error!("lobster-uring: io_uring_enter failed in a session: {e}");
                        }
                        return Err(ReadError::Enter { source: e });
                    }
                }
            }
        }
        // SAFETY: only this session's thread touches its ring.
        let cq = unsafe { ring.ring.completion_shared() };
        for cqe in cq {
            self.ops_in_ring -= 1;
            let (key, op) = decode_user_data(cqe.user_data());
            let job = &mut self.in_ring[key];
            if !matches!(job.opened, Opened::Slot(_)) {
                match job.on_result(cqe.result()) {
                    AfterRead::Again => {
                        push_read(ring, key, job);
                        self.ops_in_ring += 1;
                    }
                    AfterRead::Done(result) => {
                        self.finished.push((self.in_ring.remove(key), result))
                    }
                }
                continue;
            }
            match job.on_chain_result(op, cqe.result()) {
                ChainNext::Wait => {}
                ChainNext::Read => {
                    push_chain_op(ring, key, job, ChainOp::Read);
                    self.ops_in_ring += 1;
                }
                ChainNext::Close => {
                    push_chain_op(ring, key, job, ChainOp::Close);
                    self.ops_in_ring += 1;
                }
                ChainNext::Done(result) => {
                    let job = self.in_ring.remove(key);
                    let Opened::Slot(chain) = &job.opened else {
                        unreachable!()
                    };
                    if chain.close_failed() {
                        // What the slot holds is unknown: empty it before it is used again.
                        let _ = ring
                            .ring
                            .submitter()
                            .register_files_update(chain.slot, &[-1]);
                    }
                    let slots = self.path_slots.as_mut().expect("chains run in slots");
                    slots.give(chain.slot);
                    self.finished.push((job, result));
                }
            }
        }
        Ok(())
    }

    /// Stops counting finished jobs against their classes (one lock round) and appends
    /// their completions to `out`.
    fn deliver(&mut self, out: &mut Vec<Completion>) -> usize {
        if self.finished.is_empty() {
            return 0;
        }
        let wake = {
            let mut s = self.shared.lock();
            for (job, _) in &self.finished {
                self.shared.finish(&mut s, job);
            }
            self.shared.wake_for_freed_depth(&mut s)
        };
        self.shared.wake(wake);
        let n = self.finished.len();
        out.extend(
            self.finished
                .drain(..)
                .map(|(job, result)| job.complete(result)),
        );
        n
    }
}

/// Operations a read by path in a slot has in a ring of `cap` SQ entries at once: open,
/// read and close linked, or, when the SQ cannot hold three, open and read (the close goes
/// in after them).
fn chain_ops(cap: usize) -> usize {
    if cap >= 3 {
        3
    } else {
        2
    }
}

/// Puts the SQE of `job`'s next chunk into the SQ, submitting first if it is full.
fn push_read(ring: &Ring, key: usize, job: &mut Job) {
    // A session reads through plain descriptors: its fixed-file table, if any, holds only
    // the files of reads by path.
    let fd = job
        .fd()
        .expect("a reader's file, or a path read opened on this thread");
    let entry = read_sqe(
        key as u64,
        job,
        ReadTarget::Fd(fd),
        ring.fixed_buffers,
        ring.async_punt,
    );
    // SAFETY: only this session's thread touches its ring, and the job (and its buffer)
    // stays in the session's slab until its completion is reaped; Drop waits for every read
    // in the ring.
    unsafe { push_entry(&ring.ring, &entry) }
}

/// The path of a read by path as the kernel takes it: its name in its held directory, or its
/// whole path.
fn c_path_of(job: &Job) -> Result<CString, ReadError> {
    let (_, walked) = job.source.open_at();
    CString::new(walked.as_os_str().as_bytes()).map_err(|_| ReadError::Open {
        path: job.source.path().to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "the path holds a NUL byte"),
    })
}

/// Opens `job`'s file into fixed slot `slot`, linked to its first read and (with
/// `link_close`, when that read is the whole job) to the close of the slot, all in one SQ
/// batch. Returns how many operations went into the ring.
fn start_chain(
    ring: &Ring,
    in_ring: &mut Slab<Job>,
    mut job: Job,
    slot: u32,
    c_path: CString,
    link_close: bool,
) -> usize {
    let with_close = link_close && job.single_chunk();
    job.opened = Opened::Slot(SlotChain::new(slot, c_path));
    let key = in_ring.insert(job);
    let job = &mut in_ring[key];
    let direct = job.source_is_direct();
    let Opened::Slot(chain) = &job.opened else {
        unreachable!()
    };
    let (dir, _) = job.source.open_at();
    let open = open_direct_sqe(
        chain_user_data(key, ChainOp::Open),
        dir,
        &chain.c_path,
        direct,
        slot,
    )
    .flags(squeue::Flags::IO_LINK);
    let read = read_sqe(
        chain_user_data(key, ChainOp::Read),
        job,
        ReadTarget::Fixed(slot),
        ring.fixed_buffers,
        ring.async_punt,
    );
    let ops = if with_close {
        let read = read.flags(squeue::Flags::IO_LINK);
        let close = close_fixed_sqe(chain_user_data(key, ChainOp::Close), slot);
        // SAFETY: only this session's thread touches its ring; the job (its path, its
        // buffer) stays in the slab until every operation's completion is reaped, and Drop
        // waits for them.
        unsafe { push_entries(&ring.ring, &[open, read, close]) };
        3
    } else {
        // SAFETY: as above.
        unsafe { push_entries(&ring.ring, &[open, read]) };
        2
    };
    let Opened::Slot(chain) = &mut job.opened else {
        unreachable!()
    };
    chain.pushed(ops, with_close);
    ops
}

/// Puts the next read or the close of a read by path into the SQ.
fn push_chain_op(ring: &Ring, key: usize, job: &mut Job, op: ChainOp) {
    let Opened::Slot(chain) = &job.opened else {
        unreachable!("chain operations are for reads by path in a slot")
    };
    let slot = chain.slot;
    let entry = match op {
        ChainOp::Close => close_fixed_sqe(chain_user_data(key, op), slot),
        _ => read_sqe(
            chain_user_data(key, ChainOp::Read),
            job,
            ReadTarget::Fixed(slot),
            ring.fixed_buffers,
            ring.async_punt,
        ),
    };
    // SAFETY: as in `push_read`.
    unsafe { push_entry(&ring.ring, &entry) }
    let Opened::Slot(chain) = &mut job.opened else {
        unreachable!()
    };
    chain.pushed(1, op == ChainOp::Close);
}

impl Drop for Session {
    /// Waits for the reads in the kernel (their buffers must outlive them), releases their
    /// io_depth, and drops the reads still queued.
    fn drop(&mut self) {
        self.queues.iter_mut().for_each(VecDeque::clear);
        self.queued = 0;
        let mut sink = Vec::new();
        while !self.in_ring.is_empty() {
            if self.enter(1).is_err() {
                // The kernel may still write these buffers: never return them to the pool.
                for job in self.in_ring.drain() {
                    std::mem::forget(job);
                }
                break;
            }
            self.deliver(&mut sink);
            sink.clear();
        }
        self.deliver(&mut sink);
    }
}

/// How long a timed wait naps where the kernel cannot time an enter.
const NAP_WITHOUT_EXT_ARG: Duration = Duration::from_micros(200);

fn ts_duration(timeout: Option<Duration>) -> Duration {
    timeout.unwrap_or(Duration::ZERO)
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
        let reader = match Reader::builder().backend(Backend::Uring).rings(0).build() {
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
        let params = SessionParams {
            direct_descriptors: false,
            ring_entries: 4,
            ..reader.session_params()
        };
        let mut session = Session::new(reader.clone(), params).unwrap();
        assert!(session.ring.is_some());
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
