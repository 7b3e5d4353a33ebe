//! A session's own io_uring: the reads it has in the kernel, keyed by user_data in a slab
//! that owns their jobs (and buffers) until their last completion is reaped, the fixed-file
//! slots its reads by path open their files into, and the enter that submits and reaps.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use io_uring::types::{SubmitArgs, Timespec};
use io_uring::{squeue, IoUring};
use slab::Slab;

use crate::error::ReadError;
use crate::job::{AfterRead, ChainNext, ChainOp, Done, Job, Opened, SlotChain};
use crate::pool::Pool;
use crate::uring::{
    build_session_ring, chain_user_data, close_fixed_sqe, decode_user_data, nofile_limit,
    open_direct_sqe, push_entries, push_entry, read_sqe, register_pool, ReadTarget,
};

static ENTER_ERROR_LOGGED: AtomicBool = AtomicBool::new(false);

/// How long a timed wait naps where the kernel cannot time an enter.
const NAP_WITHOUT_EXT_ARG: Duration = Duration::from_micros(200);

/// How a session's ring is set up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingParams {
    pub(crate) ring_entries: u32,
    pub(crate) register_buffers: bool,
    pub(crate) async_punt: bool,
    /// Reads by path open their files into the ring's file table (direct descriptors).
    pub(crate) direct_descriptors: bool,
}

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

/// A ring's submission side: the ring, and how its reads are built.
struct Sq {
    ring: IoUring,
    fixed_buffers: bool,
    async_punt: bool,
}

/// A ring used by the one thread that built it, and the reads it has in the kernel.
pub(crate) struct Ring {
    sq: Sq,
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
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("in_ring", &self.in_ring.len())
            .field("ops_in_ring", &self.ops_in_ring)
            .field("cap", &self.cap)
            .field("path_slots", &self.path_slots())
            .field("path_slots_in_use", &self.path_slots_in_use())
            .finish_non_exhaustive()
    }
}

impl Ring {
    /// Sets up a ring for the calling thread, with `pool` registered where allowed and a
    /// sparse file table for reads by path where the kernel has direct descriptors.
    pub(crate) fn new(params: RingParams, pool: &Pool) -> Result<Ring, ReadError> {
        let ring = build_session_ring(params.ring_entries).map_err(|source| ReadError::Setup {
            what: "io_uring_setup for a session",
            source,
        })?;
        let fixed_buffers = params.register_buffers && register_pool(&ring, pool).is_ok();
        let cap = ring.params().sq_entries() as usize;
        let mut path_slots = None;
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
        Ok(Ring {
            sq: Sq {
                ring,
                fixed_buffers,
                async_punt: params.async_punt,
            },
            in_ring: Slab::with_capacity(cap),
            ops_in_ring: 0,
            cap,
            path_slots,
            link_close: chain_ops(cap) == 3,
        })
    }

    /// The pool is registered with this ring (`READ_FIXED`).
    pub(crate) fn fixed_buffers(&self) -> bool {
        self.sq.fixed_buffers
    }

    /// Fixed-file slots kept for reads by path.
    pub(crate) fn path_slots(&self) -> usize {
        self.path_slots.as_ref().map_or(0, |p| p.total)
    }

    /// Fixed-file slots held by reads by path in the kernel now.
    pub(crate) fn path_slots_in_use(&self) -> usize {
        self.path_slots.as_ref().map_or(0, PathSlots::in_use)
    }

    /// Fixed-file slots free for reads by path to start.
    pub(crate) fn free_slots(&self) -> usize {
        self.path_slots.as_ref().map_or(0, |p| p.free.len())
    }

    /// Reads in the kernel.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_ring.len()
    }

    /// Operations the ring has room for now.
    pub(crate) fn room(&self) -> usize {
        self.cap.saturating_sub(self.ops_in_ring)
    }

    /// Operations `job` may have in the kernel at once once started.
    pub(crate) fn ops_of(&self, job: &Job) -> usize {
        if self.path_slots.is_some() && job.by_path() {
            chain_ops(self.cap)
        } else {
            1
        }
    }

    /// Puts a started job's first operations into the SQ: a read, or a read by path's open,
    /// read (and close) in a free slot, or, without slots, its open on this thread and then
    /// its read. A job that fails before reaching the kernel goes to `finished`. The caller
    /// counted its operations (and slot) against [`Ring::room`] and [`Ring::free_slots`].
    pub(crate) fn start(&mut self, mut job: Job, finished: &mut Vec<Done>) {
        if job.by_path() {
            if let Some(slots) = &mut self.path_slots {
                let c_path = match c_path_of(&job) {
                    Ok(c_path) => c_path,
                    Err(e) => {
                        finished.push((job, Err(e)));
                        return;
                    }
                };
                let slot = slots.take().expect("a free slot was counted for this read");
                let link_close = self.link_close;
                self.ops_in_ring +=
                    start_chain(&self.sq, &mut self.in_ring, job, slot, c_path, link_close);
                // The CQ (twice the SQ) can never overflow.
                assert!(self.ops_in_ring <= self.cap);
                return;
            }
            // No direct descriptors: open here, read through the descriptor.
            if let Err(e) = job.open_here() {
                finished.push((job, Err(e)));
                return;
            }
        }
        let key = self.in_ring.insert(job);
        self.sq.push_read(key, &mut self.in_ring[key]);
        self.ops_in_ring += 1;
        assert!(self.ops_in_ring <= self.cap);
    }

    /// Submits what is in the SQ and, with `want > 0`, sleeps until the CQ holds `want`
    /// entries or `timeout` passes; then folds every CQE into its job (resubmitting short
    /// reads and retries, and the next operation of a read by path), and moves the jobs
    /// that are over to `finished`.
    pub(crate) fn enter(
        &mut self,
        want: usize,
        timeout: Option<Duration>,
        finished: &mut Vec<Done>,
    ) -> Result<(), ReadError> {
        let idle = want == 0 && {
            // SAFETY: only this session's thread touches its ring.
            let sq = unsafe { self.sq.ring.submission_shared() };
            // TASKRUN: completions wait for an enter to be posted (DEFER_TASKRUN).
            sq.is_empty() && !sq.taskrun()
        };
        if !idle {
            self.submit_and_wait(want, timeout)?;
        }
        // SAFETY: only this session's thread touches its ring.
        let cq = unsafe { self.sq.ring.completion_shared() };
        for cqe in cq {
            self.ops_in_ring -= 1;
            let (key, op) = decode_user_data(cqe.user_data());
            let job = &mut self.in_ring[key];
            if !matches!(job.opened, Opened::Slot(_)) {
                match job.on_result(cqe.result()) {
                    AfterRead::Again => {
                        self.sq.push_read(key, job);
                        self.ops_in_ring += 1;
                    }
                    AfterRead::Done(result) => {
                        let mut job = self.in_ring.remove(key);
                        let result = job.close_here(result);
                        finished.push((job, result));
                    }
                }
                continue;
            }
            match job.on_chain_result(op, cqe.result()) {
                ChainNext::Wait => {}
                ChainNext::Read => {
                    self.sq.push_chain_op(key, job, ChainOp::Read);
                    self.ops_in_ring += 1;
                }
                ChainNext::Close => {
                    self.sq.push_chain_op(key, job, ChainOp::Close);
                    self.ops_in_ring += 1;
                }
                ChainNext::Done(result) => {
                    let job = self.in_ring.remove(key);
                    let Opened::Slot(chain) = &job.opened else {
                        unreachable!()
                    };
                    if chain.close_failed() {
                        // What the slot holds is unknown: empty it before it is used again.
                        let _ = self
                            .sq
                            .ring
                            .submitter()
                            .register_files_update(chain.slot, &[-1]);
                    }
                    let slots = self.path_slots.as_mut().expect("chains run in slots");
                    slots.give(chain.slot);
                    finished.push((job, result));
                }
            }
        }
        Ok(())
    }

    /// One io_uring_enter: submits, and waits for `want` completions (until `timeout`).
    fn submit_and_wait(&self, want: usize, timeout: Option<Duration>) -> Result<(), ReadError> {
        let timespec = timeout.map(Timespec::from);
        loop {
            let entered = match (&timespec, want) {
                (Some(ts), 1..) => {
                    let args = SubmitArgs::new().timespec(ts);
                    match self.sq.ring.submitter().submit_with_args(want, &args) {
                        // Timed out: whatever completed is reaped by the caller.
                        Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(0),
                        // No EXT_ARG (before Linux 5.11): submit, and a short nap stands
                        // for the timed wait.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                            let submitted = self.sq.ring.submit();
                            let nap = timeout.unwrap_or(Duration::ZERO);
                            std::thread::sleep(nap.min(NAP_WITHOUT_EXT_ARG));
                            submitted
                        }
                        other => other,
                    }
                }
                _ => self.sq.ring.submit_and_wait(want),
            };
            match entered {
                Ok(_) => return Ok(()),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) =>
                {
                    if want == 0 {
                        return Ok(());
                    }
                    // EBUSY/EAGAIN: completions are pending to be reaped; reap them first.
                    // SAFETY: only this session's thread touches its ring.
                    if !unsafe { self.sq.ring.completion_shared() }.is_empty() {
                        return Ok(());
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

    /// Gives up on the reads in the kernel after an enter failed while the session drops:
    /// the kernel may still write their buffers, so they never return to the pool.
    pub(crate) fn abandon(&mut self) {
        for job in self.in_ring.drain() {
            std::mem::forget(job);
        }
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
    sq: &Sq,
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
    let read = sq.read(
        chain_user_data(key, ChainOp::Read),
        job,
        ReadTarget::Fixed(slot),
    );
    let ops = if with_close {
        let read = read.flags(squeue::Flags::IO_LINK);
        let close = close_fixed_sqe(chain_user_data(key, ChainOp::Close), slot);
        // SAFETY: only this session's thread touches its ring; the job (its path, its
        // buffer) stays in the slab until every operation's completion is reaped, and a
        // session waits for them before it drops.
        unsafe { push_entries(&sq.ring, &[open, read, close]) };
        3
    } else {
        // SAFETY: as above.
        unsafe { push_entries(&sq.ring, &[open, read]) };
        2
    };
    let Opened::Slot(chain) = &mut job.opened else {
        unreachable!()
    };
    chain.pushed(ops, with_close);
    ops
}

impl Sq {
    /// The SQE of `job`'s next chunk through `target`.
    fn read(&self, user_data: u64, job: &mut Job, target: ReadTarget) -> squeue::Entry {
        read_sqe(user_data, job, target, self.fixed_buffers, self.async_punt)
    }

    /// Puts the SQE of `job`'s next chunk into the SQ, submitting first if it is full.
    fn push_read(&self, key: usize, job: &mut Job) {
        // A session reads through plain descriptors: its fixed-file table, if any, holds
        // only the files of reads by path.
        let fd = job
            .fd()
            .expect("a reader's file, or a path read opened on this thread");
        let entry = self.read(key as u64, job, ReadTarget::Fd(fd));
        // SAFETY: only this session's thread touches its ring, and the job (and its buffer)
        // stays in the ring's slab until its completion is reaped; a session waits for every
        // read in its ring before it drops.
        unsafe { push_entry(&self.ring, &entry) }
    }

    /// Puts the next read or the close of a read by path into the SQ.
    fn push_chain_op(&self, key: usize, job: &mut Job, op: ChainOp) {
        let Opened::Slot(chain) = &job.opened else {
            unreachable!("chain operations are for reads by path in a slot")
        };
        let slot = chain.slot;
        let entry = match op {
            ChainOp::Close => close_fixed_sqe(chain_user_data(key, op), slot),
            _ => self.read(
                chain_user_data(key, ChainOp::Read),
                job,
                ReadTarget::Fixed(slot),
            ),
        };
        // SAFETY: as in `push_read`.
        unsafe { push_entry(&self.ring, &entry) }
        let Opened::Slot(chain) = &mut job.opened else {
            unreachable!()
        };
        chain.pushed(1, op == ChainOp::Close);
    }
}
