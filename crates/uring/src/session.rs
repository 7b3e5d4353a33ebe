//! Caller-driven reads: a ring owned by the thread that submits and reaps, with no engine
//! thread in between (the way fio and liburing programs drive io_uring).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use io_uring::IoUring;
use slab::Slab;

use crate::completion::Completion;
use crate::error::ReadError;
use crate::job::{AfterRead, Job};
use crate::pread;
use crate::reader::Reader;
use crate::state::ReaderState;
use crate::types::ReadRequest;
use crate::uring::{build_session_ring, push_entry, read_sqe, register_pool};

struct Ring {
    ring: IoUring,
    fixed_buffers: bool,
    async_punt: bool,
}

static ENTER_ERROR_LOGGED: AtomicBool = AtomicBool::new(false);

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
    /// Reads in the kernel, keyed by user_data.
    in_ring: Slab<Job>,
    /// Most reads in the kernel at once (the SQ size; the CQ is twice as large).
    cap: usize,
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
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// A caller-driven session on this reader for the calling thread: its own ring (on
    /// io_uring), sharing this reader's classes, io_depth limits, files and pool; see
    /// [`Session`]. Fails if the ring cannot be set up (e.g. out of file descriptors).
    pub fn session(&self) -> Result<Session, ReadError> {
        Session::new(self.clone())
    }
}

impl Session {
    fn new(reader: Reader) -> Result<Session, ReadError> {
        let shared = reader.state().clone();
        let params = reader.session_params();
        let (ring, cap) = if params.uring {
            let ring =
                build_session_ring(params.ring_entries).map_err(|source| ReadError::Setup {
                    what: "io_uring_setup for a session",
                    source,
                })?;
            let fixed_buffers =
                params.register_buffers && register_pool(&ring, &shared.pool).is_ok();
            let cap = ring.params().sq_entries() as usize;
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
            cap,
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
        let mut accepted = 0;
        let mut refused = None;
        for (req, p) in reqs.iter().zip(pending) {
            if self.queues[req.class].len() >= self.queue_capacity {
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
            self.queues[req.class].push_back(Job::new(p, buf));
            self.queued += 1;
            accepted += 1;
        }
        self.start_queued();
        self.enter(0)?;
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

    /// Appends every completion available now to `out` without waiting; returns how many.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, ReadError> {
        self.start_queued();
        self.enter(0)?;
        Ok(self.deliver(out))
    }

    /// Moves queued jobs whose class is below its io_depth into `started` (one lock round),
    /// round robin over classes, and puts them into the SQ (or reads them, on pread).
    fn start_queued(&mut self) {
        if self.queued > 0 && self.in_ring.len() < self.cap {
            let room = self.cap - self.in_ring.len();
            let n = self.queues.len();
            let mut s = self.shared.lock();
            let mut progress = true;
            while progress && self.started.len() < room {
                progress = false;
                for i in 0..n {
                    let c = (self.cursor + i) % n;
                    let Some(job) = self.queues[c].front() else {
                        continue;
                    };
                    if !self.shared.try_start(&mut s, job) {
                        continue;
                    }
                    let job = self.queues[c].pop_front().expect("front exists");
                    self.queued -= 1;
                    self.started.push(job);
                    progress = true;
                    if self.started.len() == room {
                        self.cursor = (c + 1) % n;
                        break;
                    }
                }
            }
        }
        for job in self.started.drain(..) {
            if job.is_empty() {
                self.finished.push((job, Ok(())));
                continue;
            }
            match &self.ring {
                Some(ring) => {
                    let key = self.in_ring.insert(job);
                    push_sqe(ring, key, &mut self.in_ring[key]);
                }
                None => {
                    let (job, result) = pread::read(job);
                    self.finished.push((job, result));
                }
            }
        }
    }

    /// Submits what is in the SQ and, with `want > 0`, sleeps until the CQ holds `want`
    /// entries; then folds every CQE into its job (resubmitting short reads and retries).
    fn enter(&mut self, want: usize) -> Result<(), ReadError> {
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
            loop {
                match ring.ring.submit_and_wait(want) {
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
            let key = cqe.user_data() as usize;
            let job = &mut self.in_ring[key];
            match job.on_result(cqe.result()) {
                AfterRead::Again => push_sqe(ring, key, job),
                AfterRead::Done(result) => self.finished.push((self.in_ring.remove(key), result)),
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

/// Puts the SQE of `job`'s next chunk into the SQ, submitting first if it is full.
fn push_sqe(ring: &Ring, key: usize, job: &mut Job) {
    // Sessions have no fixed-file table: files are read through their fds.
    let entry = read_sqe(key, job, false, ring.fixed_buffers, ring.async_punt);
    // SAFETY: only this session's thread touches its ring, and the job (and its buffer)
    // stays in the session's slab until its completion is reaped; Drop waits for every read
    // in the ring.
    unsafe { push_entry(&ring.ring, &entry) }
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
