//! State shared by the submitters and the backend threads: per-class FIFO queues, io_depth
//! limits, in-flight counts, and the per-read state machine both backends drive.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;
use crossbeam_channel::Sender;

use crate::deferred::Pending;
use crate::files::{FileEntry, FileTable, FixedTable};
use crate::pool::{Pool, PoolBuf};
use crate::{FileId, ReadError};

/// Largest single O_DIRECT read handed to the kernel; larger requests are read in chunks.
pub(crate) const MAX_DIRECT_CHUNK_BYTES: usize = 1 << 20;
/// How often one read is retried after EAGAIN, EINTR or EBUSY before it fails.
pub(crate) const MAX_RETRIES: u32 = 1000;

/// A read of `len` bytes at `offset` of `file`, on behalf of `class`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// The file, from [`crate::Reader::open`].
    pub file: FileId,
    /// First byte to read.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// The class (rank) whose io_depth this read counts against.
    pub class: usize,
    /// Caller's tag, returned in the [`Completion`].
    pub tag: u64,
}

/// The outcome of one [`ReadRequest`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Completion {
    /// The request's tag.
    pub tag: u64,
    /// The request's class.
    pub class: usize,
    /// Exactly the requested bytes, or what went wrong.
    pub result: Result<Bytes, ReadError>,
    /// Holds a pool buffer while an error completion is undelivered, so that the completion
    /// channel never holds more entries than the pool has blocks.
    _permit: Option<PoolBuf>,
}

impl Completion {
    /// A read cancelled at shutdown before it got a pool buffer.
    pub(crate) fn cancelled(file: &FileEntry, req: &ReadRequest) -> Completion {
        Completion {
            tag: req.tag,
            class: req.class,
            result: Err(ReadError::Cancelled {
                path: file.path.clone(),
                offset: req.offset,
                len: req.len,
            }),
            _permit: None,
        }
    }
}

/// What the observer hook is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoEventKind {
    /// The read was taken from its class queue and is about to be handed to the kernel.
    Issued,
    /// The kernel finished the read (all its chunks and retries).
    Finished,
}

/// One event seen by [`crate::ReaderConfig::observer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IoEvent {
    /// Issued or finished.
    pub kind: IoEventKind,
    /// The read's class.
    pub class: usize,
    /// The read's tag.
    pub tag: u64,
}

/// A hook called for every read that starts counting against its class's io_depth
/// (`Issued`, before any part of it reaches the kernel) and stops counting (`Finished`, after
/// its last part left the kernel). Called under the scheduler lock, so the events of all
/// threads are seen in one order consistent with the limits; keep it cheap.
pub type Observer = Arc<dyn Fn(IoEvent) + Send + Sync>;

/// Per-class counters, see [`crate::Reader::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClassStats {
    /// The current io_depth limit.
    pub io_depth: usize,
    /// Requests waiting in the class queue.
    pub queued: usize,
    /// Reads in the kernel (or in a pread worker) now.
    pub in_flight: usize,
    /// Most reads in flight at once since the reader started or `reset_peaks`.
    pub peak_in_flight: usize,
    /// Requests completed (successfully or not).
    pub completed: u64,
}

/// A snapshot of the reader's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReaderStats {
    /// One entry per class.
    pub classes: Vec<ClassStats>,
    /// Pool bytes in free blocks (not queued, in flight, or referenced by a `Bytes`).
    pub pool_free_bytes: usize,
    /// The largest free block: the largest read that could start now.
    pub pool_largest_free_bytes: usize,
    /// The pool's budget ([`crate::ReaderConfig::pool_bytes`] rounded up to a page).
    pub pool_budget_bytes: usize,
    /// Files open on the reader.
    pub files_open: usize,
}

/// One request from submission to completion. Owns its buffer until it completes.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) file: Arc<FileEntry>,
    pub(crate) tag: u64,
    pub(crate) class: usize,
    offset: u64,
    len: usize,
    pub(crate) buf: PoolBuf,
    read_start: u64,
    skip: usize,
    read_len: usize,
    done: usize,
    retries: u32,
}

/// What to do with a job after one read returned.
pub(crate) enum Step {
    /// Read the next chunk (remainder of a short read, a retry, the next O_DIRECT chunk).
    Again,
    /// The job is finished.
    Done(Result<(), ReadError>),
}

impl Job {
    /// Checks that the request is at most `max_read_bytes`; widens O_DIRECT reads to the
    /// alignment.
    pub(crate) fn plan(
        file: &FileEntry,
        req: &ReadRequest,
        max_read_bytes: usize,
    ) -> Result<(u64, usize, usize), ReadError> {
        let too_large = || ReadError::TooLarge {
            path: file.path.clone(),
            offset: req.offset,
            len: req.len,
            max_read_bytes,
        };
        if req.len == 0 {
            return Ok((req.offset, 0, 0));
        }
        let end = req
            .offset
            .checked_add(req.len as u64)
            .ok_or_else(too_large)?;
        let read_start = req.offset - req.offset % file.align;
        let read_end = end.div_ceil(file.align) * file.align;
        let read_len = usize::try_from(read_end - read_start).map_err(|_| too_large())?;
        if read_len > max_read_bytes {
            return Err(too_large());
        }
        Ok((read_start, (req.offset - read_start) as usize, read_len))
    }

    /// The job of a request checked (and planned) at submission, with its buffer.
    pub(crate) fn new(p: Pending, buf: PoolBuf) -> Job {
        debug_assert!(p.read_len <= buf.capacity());
        Job {
            file: p.file,
            tag: p.req.tag,
            class: p.req.class,
            offset: p.req.offset,
            len: p.req.len,
            buf,
            read_start: p.read_start,
            skip: p.skip,
            read_len: p.read_len,
            done: 0,
            retries: 0,
        }
    }

    /// Nothing to read (zero-length request).
    pub(crate) fn is_empty(&self) -> bool {
        self.read_len == 0
    }

    /// The next read: (file offset, offset into the buffer, length).
    pub(crate) fn next_chunk(&self) -> (u64, usize, usize) {
        let remaining = self.read_len - self.done;
        let len = if self.file.direct {
            remaining.min(MAX_DIRECT_CHUNK_BYTES)
        } else {
            remaining
        };
        (self.read_start + self.done as u64, self.done, len)
    }

    /// Bytes from `read_start` that must be read for the request to be satisfied.
    fn needed(&self) -> usize {
        self.skip + self.len
    }

    /// Folds one read's result (bytes read, or a negative errno) into the job.
    pub(crate) fn on_result(&mut self, res: i32) -> Step {
        if res < 0 {
            let errno = -res;
            if matches!(errno, libc::EAGAIN | libc::EINTR | libc::EBUSY)
                && self.retries < MAX_RETRIES
            {
                self.retries += 1;
                return Step::Again;
            }
            return Step::Done(Err(ReadError::Read {
                path: self.file.path.clone(),
                offset: self.offset,
                len: self.len,
                source: io::Error::from_raw_os_error(errno),
            }));
        }
        self.done += res as usize;
        if self.done >= self.needed() {
            return Step::Done(Ok(()));
        }
        // End of file: nothing came back, or an O_DIRECT read stopped off the alignment
        // (which only happens at EOF; a further read there would fail with EINVAL).
        let at_eof = res == 0 || (self.file.direct && self.done as u64 % self.file.align != 0);
        if at_eof || self.done >= self.read_len {
            let read_end = self.read_start + self.done as u64;
            return Step::Done(Err(ReadError::UnexpectedEof {
                path: self.file.path.clone(),
                offset: self.offset,
                len: self.len,
                file_end: file_size(&self.file).map_or(read_end, |size| size.min(read_end)),
            }));
        }
        Step::Again
    }

    /// The completion of a finished job.
    pub(crate) fn complete(self, result: Result<(), ReadError>) -> Completion {
        let (result, permit) = match result {
            Ok(()) if self.len == 0 => (Ok(Bytes::new()), Some(self.buf)),
            Ok(()) => (Ok(self.buf.into_bytes(self.skip, self.len)), None),
            Err(e) => (Err(e), Some(self.buf)),
        };
        Completion {
            tag: self.tag,
            class: self.class,
            result,
            _permit: permit,
        }
    }

    /// The completion of a job dropped from its queue at shutdown.
    pub(crate) fn cancel(self) -> Completion {
        let err = ReadError::Cancelled {
            path: self.file.path.clone(),
            offset: self.offset,
            len: self.len,
        };
        self.complete(Err(err))
    }
}

#[derive(Debug, Default)]
pub(crate) struct ClassState {
    queue: VecDeque<Job>,
    depth: usize,
    in_flight: usize,
    peak_in_flight: usize,
    completed: u64,
}

impl ClassState {
    /// Below its io_depth.
    fn has_room(&self) -> bool {
        self.in_flight < self.depth
    }

    /// Counts one more read in flight.
    fn start(&mut self) {
        self.in_flight += 1;
        self.peak_in_flight = self.peak_in_flight.max(self.in_flight);
        debug_assert!(self.in_flight <= self.depth);
    }
}

/// The scheduler proper, always behind `Shared::sched`.
#[derive(Debug)]
pub(crate) struct Sched {
    classes: Vec<ClassState>,
    /// Round-robin start for the next `take_next`, so no class starves another.
    cursor: usize,
    pub(crate) shutdown: bool,
    /// Per io_uring engine: it found no work and may be asleep in the kernel.
    pub(crate) parked: Vec<bool>,
    /// pread workers waiting on `Shared::work`.
    pub(crate) idle_workers: usize,
    space_waiters: usize,
    /// Sessions waiting on `Shared::depth` for a class to get below its io_depth.
    depth_waiters: usize,
}

impl Sched {
    pub(crate) fn new(depths: &[usize], engines: usize) -> Sched {
        Sched {
            classes: depths
                .iter()
                .map(|&depth| ClassState {
                    depth,
                    ..ClassState::default()
                })
                .collect(),
            cursor: 0,
            shutdown: false,
            parked: vec![false; engines],
            idle_workers: 0,
            space_waiters: 0,
            depth_waiters: 0,
        }
    }

    /// Pops the oldest request of the next class (round robin) that is below its io_depth,
    /// and counts it in flight.
    fn take_next(&mut self) -> Option<Job> {
        let n = self.classes.len();
        for i in 0..n {
            let c = (self.cursor + i) % n;
            let class = &mut self.classes[c];
            if class.has_room() {
                if let Some(job) = class.queue.pop_front() {
                    class.start();
                    self.cursor = (c + 1) % n;
                    return Some(job);
                }
            }
        }
        None
    }

    /// Counts one more read of `class` in flight if the class is below its io_depth.
    fn try_start(&mut self, class: usize) -> bool {
        let class = &mut self.classes[class];
        if !class.has_room() {
            return false;
        }
        class.start();
        true
    }

    /// A class has queued requests (in the shared queues) and room below its io_depth.
    fn runnable(&self) -> bool {
        self.classes
            .iter()
            .any(|c| !c.queue.is_empty() && c.has_room())
    }

    /// A job of `class` left the kernel for good.
    fn finish(&mut self, class: usize) {
        let class = &mut self.classes[class];
        class.in_flight -= 1;
        class.completed += 1;
    }

    /// Requests waiting in all class queues.
    pub(crate) fn queued(&self) -> usize {
        self.classes.iter().map(|c| c.queue.len()).sum()
    }

    /// Empties every queue (at shutdown).
    pub(crate) fn drain_queued(&mut self) -> Vec<Job> {
        self.classes
            .iter_mut()
            .flat_map(|c| c.queue.drain(..))
            .collect()
    }

    fn stats(&self) -> Vec<ClassStats> {
        self.classes
            .iter()
            .map(|c| ClassStats {
                io_depth: c.depth,
                queued: c.queue.len(),
                in_flight: c.in_flight,
                peak_in_flight: c.peak_in_flight,
                completed: c.completed,
            })
            .collect()
    }
}

/// Current size of the file, to report where it ended.
fn file_size(file: &FileEntry) -> Option<u64> {
    // SAFETY: stat is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open (the entry owns it) and st is a valid buffer.
    if unsafe { libc::fstat(file.raw_fd(), &mut st) } != 0 {
        return None;
    }
    u64::try_from(st.st_size).ok()
}

/// Whom to wake after the scheduler state changed.
#[must_use]
pub(crate) enum Wake {
    Nobody,
    Engine(usize),
    Engines(Vec<usize>),
    Worker,
    Workers,
}

/// Everything the reader handle, the submitters and the backend threads share.
pub(crate) struct Shared {
    sched: Mutex<Sched>,
    /// Submitters waiting for room in a class queue.
    space: Condvar,
    /// Idle pread workers.
    pub(crate) work: Condvar,
    /// Sessions waiting for a class to get below its io_depth.
    depth: Condvar,
    /// Number of classes (fixed when the reader is built).
    class_count: usize,
    /// One eventfd per io_uring engine; each engine keeps a read of it in its ring.
    pub(crate) wakers: Vec<OwnedFd>,
    pub(crate) files: FileTable,
    pub(crate) fixed: Option<Arc<FixedTable>>,
    pub(crate) pool: Pool,
    pub(crate) sender: Sender<Completion>,
    queue_capacity: usize,
    pub(crate) observer: Option<Observer>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("engines", &self.wakers.len())
            .field("queue_capacity", &self.queue_capacity)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn new(
        depths: &[usize],
        wakers: Vec<OwnedFd>,
        fixed: Option<Arc<FixedTable>>,
        pool: Pool,
        sender: Sender<Completion>,
        queue_capacity: usize,
        observer: Option<Observer>,
    ) -> Shared {
        Shared {
            sched: Mutex::new(Sched::new(depths, wakers.len())),
            space: Condvar::new(),
            work: Condvar::new(),
            depth: Condvar::new(),
            class_count: depths.len(),
            wakers,
            files: FileTable::default(),
            fixed,
            pool,
            sender,
            queue_capacity,
            observer,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn classes(&self) -> usize {
        self.class_count
    }

    /// [`Sched::take_next`], telling the observer.
    pub(crate) fn take_next(&self, s: &mut Sched) -> Option<Job> {
        let job = s.take_next()?;
        self.observe(IoEventKind::Issued, &job);
        Some(job)
    }

    /// [`Sched::try_start`] for a job a session holds, telling the observer.
    pub(crate) fn try_start(&self, s: &mut Sched, job: &Job) -> bool {
        if !s.try_start(job.class) {
            return false;
        }
        self.observe(IoEventKind::Issued, job);
        true
    }

    /// [`Sched::finish`], telling the observer and waking sessions that wait for depth.
    pub(crate) fn finish(&self, s: &mut Sched, job: &Job) {
        self.observe(IoEventKind::Finished, job);
        s.finish(job.class);
        if s.depth_waiters > 0 {
            self.depth.notify_all();
        }
    }

    /// After a session finished reads: the depth it freed may let an engine or a pread
    /// worker start reads queued on the reader, and they only look when woken.
    pub(crate) fn wake_for_freed_depth(&self, s: &mut Sched) -> Wake {
        if s.runnable() {
            self.wake_one(s)
        } else {
            Wake::Nobody
        }
    }

    /// `class` is below its io_depth.
    pub(crate) fn class_has_room(&self, s: &Sched, class: usize) -> bool {
        s.classes[class].has_room()
    }

    /// Sleeps until a read finishes or an io_depth changes (a session whose queued reads
    /// are all held back by their classes' limits).
    pub(crate) fn wait_for_depth<'a>(&self, mut s: MutexGuard<'a, Sched>) -> MutexGuard<'a, Sched> {
        s.depth_waiters += 1;
        s = self.depth.wait(s).unwrap_or_else(|e| e.into_inner());
        s.depth_waiters -= 1;
        s
    }

    fn observe(&self, kind: IoEventKind, job: &Job) {
        if let Some(observer) = &self.observer {
            observer(IoEvent {
                kind,
                class: job.class,
                tag: job.tag,
            });
        }
    }

    /// Queues jobs in order under one lock and with at most one wake-up, waiting for room
    /// in the class queues (after waking an engine for what is already queued).
    pub(crate) fn enqueue_many(&self, jobs: Vec<Job>) -> Result<(), ReadError> {
        let mut s = self.lock();
        // Requests of this batch the backend could start at once.
        let mut woken_for = 0usize;
        for job in jobs {
            loop {
                if s.shutdown {
                    return Err(ReadError::ShutDown);
                }
                if s.classes[job.class].queue.len() < self.queue_capacity {
                    break;
                }
                if woken_for > 0 {
                    woken_for = 0;
                    let wake = self.wake_one(&mut s);
                    drop(s);
                    self.wake(wake);
                    s = self.lock();
                    continue;
                }
                s.space_waiters += 1;
                s = self.space.wait(s).unwrap_or_else(|e| e.into_inner());
                s.space_waiters -= 1;
            }
            let state = &mut s.classes[job.class];
            if state.in_flight + state.queue.len() < state.depth {
                woken_for += 1;
            }
            state.queue.push_back(job);
        }
        let wake = match woken_for {
            0 => Wake::Nobody,
            1 => self.wake_one(&mut s),
            _ => self.wake_all(&mut s),
        };
        drop(s);
        self.wake(wake);
        Ok(())
    }

    /// Queues a job, waiting for room in its class queue if `blocking`.
    pub(crate) fn enqueue(&self, job: Job, blocking: bool) -> Result<(), ReadError> {
        let class = job.class;
        let mut s = self.lock();
        loop {
            if s.shutdown {
                return Err(ReadError::ShutDown);
            }
            if s.classes[class].queue.len() < self.queue_capacity {
                break;
            }
            if !blocking {
                return Err(ReadError::WouldBlock {
                    bound: "class queue",
                });
            }
            s.space_waiters += 1;
            s = self.space.wait(s).unwrap_or_else(|e| e.into_inner());
            s.space_waiters -= 1;
        }
        let state = &mut s.classes[class];
        state.queue.push_back(job);
        let wake = if state.in_flight < state.depth {
            self.wake_one(&mut s)
        } else {
            Wake::Nobody
        };
        drop(s);
        self.wake(wake);
        Ok(())
    }

    /// Called by a backend thread after `take_next` made room in the queues.
    pub(crate) fn room_made(&self, s: &Sched) {
        if s.space_waiters > 0 {
            self.space.notify_all();
        }
    }

    fn wake_one(&self, s: &mut Sched) -> Wake {
        if !self.wakers.is_empty() {
            match s.parked.iter().position(|&p| p) {
                Some(i) => {
                    s.parked[i] = false;
                    Wake::Engine(i)
                }
                None => Wake::Nobody,
            }
        } else if s.idle_workers > 0 {
            Wake::Worker
        } else {
            Wake::Nobody
        }
    }

    fn wake_all(&self, s: &mut Sched) -> Wake {
        if !self.wakers.is_empty() {
            let parked: Vec<usize> = (0..s.parked.len()).filter(|&i| s.parked[i]).collect();
            for &i in &parked {
                s.parked[i] = false;
            }
            Wake::Engines(parked)
        } else {
            Wake::Workers
        }
    }

    pub(crate) fn wake(&self, wake: Wake) {
        match wake {
            Wake::Nobody => {}
            Wake::Engine(i) => self.kick(i),
            Wake::Engines(list) => list.into_iter().for_each(|i| self.kick(i)),
            Wake::Worker => self.work.notify_one(),
            Wake::Workers => self.work.notify_all(),
        }
    }

    /// Writes engine `i`'s eventfd, completing the read it keeps in its ring.
    pub(crate) fn kick(&self, i: usize) {
        let one: u64 = 1;
        // SAFETY: the eventfd is open for the lifetime of Shared and `one` is 8 readable
        // bytes, the size an eventfd write takes.
        let rc = unsafe {
            libc::write(
                self.wakers[i].as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        // EAGAIN means the counter is saturated: the engine is woken anyway.
        debug_assert!(rc == 8 || io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN));
    }

    pub(crate) fn set_io_depth(&self, class: usize, depth: usize) -> Result<(), ReadError> {
        let mut s = self.lock();
        let classes = s.classes.len();
        let state = s
            .classes
            .get_mut(class)
            .ok_or(ReadError::InvalidClass { class, classes })?;
        let grew = depth > state.depth;
        let raised = grew && !state.queue.is_empty();
        state.depth = depth;
        if grew && s.depth_waiters > 0 {
            self.depth.notify_all();
        }
        let wake = if raised {
            self.wake_all(&mut s)
        } else {
            Wake::Nobody
        };
        drop(s);
        self.wake(wake);
        Ok(())
    }

    pub(crate) fn io_depth(&self, class: usize) -> Option<usize> {
        self.lock().classes.get(class).map(|c| c.depth)
    }

    pub(crate) fn stats(&self) -> ReaderStats {
        let classes = self.lock().stats();
        ReaderStats {
            classes,
            pool_free_bytes: self.pool.free_bytes(),
            pool_largest_free_bytes: self.pool.largest_free_bytes(),
            pool_budget_bytes: self.pool.budget_bytes(),
            files_open: self.files.len(),
        }
    }

    pub(crate) fn reset_peaks(&self) {
        let mut s = self.lock();
        for c in &mut s.classes {
            c.peak_in_flight = c.in_flight;
        }
    }

    /// Stops accepting requests and wakes every backend thread so it can wind down.
    pub(crate) fn shut_down(&self) {
        let mut s = self.lock();
        s.shutdown = true;
        for p in &mut s.parked {
            *p = false;
        }
        drop(s);
        self.space.notify_all();
        self.work.notify_all();
        for i in 0..self.wakers.len() {
            self.kick(i);
        }
    }

    /// Delivers a completion. The consumer may have dropped every receiver; then the
    /// completion (and its buffer) is simply dropped.
    pub(crate) fn deliver(&self, completion: Completion) {
        let _ = self.sender.send(completion);
    }
}
