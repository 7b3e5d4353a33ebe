//! The io_uring backend: one engine thread per ring.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring, Probe};
use slab::Slab;

use crate::error::ReadError;
use crate::files::FixedTable;
use crate::job::{AfterRead, ChainOp, Job, Source};
use crate::pool::Pool;
use crate::state::ReaderState;

/// user_data of the eventfd read each engine keeps in its ring.
const WAKE_KEY: u64 = u64::MAX;
/// Largest buffer the kernel registers (one iovec of at most 1 GiB).
const MAX_REGISTERED_BYTES: usize = 1 << 30;

/// Rings that were set up, and what could be registered with them.
pub(crate) struct UringSetup {
    pub(crate) rings: Vec<Arc<IoUring>>,
    pub(crate) wakers: Vec<OwnedFd>,
    /// Reads a ring may have in the kernel at once (its SQ size minus the eventfd read;
    /// the CQ is twice the SQ, so completions can never overflow).
    pub(crate) cap: usize,
    pub(crate) fixed_buffers: bool,
    pub(crate) fixed: Option<Arc<FixedTable>>,
    /// Sessions can read by path through direct descriptors; `Err` says why not.
    pub(crate) direct_descriptors: Result<(), String>,
    pub(crate) notes: Vec<String>,
}

/// Why a ring could not be set up.
pub(crate) struct SetupError {
    pub(crate) what: &'static str,
    pub(crate) source: io::Error,
}

fn build_ring(entries: u32) -> io::Result<IoUring> {
    // COOP_TASKRUN (5.19) avoids interrupting the engine for task work; older kernels
    // reject the flag with EINVAL, then we go without it.
    match IoUring::builder()
        .setup_cqsize(entries * 2)
        .setup_coop_taskrun()
        .build(entries)
    {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            IoUring::builder().setup_cqsize(entries * 2).build(entries)
        }
        other => other,
    }
}

/// A ring for a session: used only by the thread that created it, so it asks for
/// SINGLE_ISSUER and DEFER_TASKRUN (6.1: completions are posted when that thread enters the
/// kernel to reap, not by interrupting it), falling back to COOP_TASKRUN (5.19), then to no
/// flags, when the kernel refuses them with EINVAL.
pub(crate) fn build_session_ring(entries: u32) -> io::Result<IoUring> {
    let attempts: [fn(&mut io_uring::Builder); 3] = [
        |b| {
            b.setup_single_issuer()
                .setup_defer_taskrun()
                .setup_taskrun_flag();
        },
        |b| {
            b.setup_coop_taskrun().setup_taskrun_flag();
        },
        |_| {},
    ];
    let mut last = None;
    for flags in attempts {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(entries * 2);
        flags(&mut builder);
        match builder.build(entries) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = Some(e),
            other => return other,
        }
    }
    Err(last.expect("at least one attempt"))
}

/// Registers `pool` with `ring` if RLIMIT_MEMLOCK leaves room for it; `Err` says why not.
pub(crate) fn register_pool(ring: &IoUring, pool: &Pool) -> Result<(), String> {
    if let Some(why) = registration_refused(pool, 1) {
        return Err(why);
    }
    // SAFETY: the iovec describes the pool's mapping (buffer 0, the whole pool); the caller
    // keeps the pool alive until the ring is dropped.
    unsafe { ring.submitter().register_buffers(&[pool.iovec()]) }.map_err(|e| e.to_string())
}

/// Why `pool` cannot be registered as one buffer with each of `rings` rings, if it cannot.
fn registration_refused(pool: &Pool, rings: usize) -> Option<String> {
    let need = pool.budget_bytes() as u64 * rings as u64;
    if pool.budget_bytes() > MAX_REGISTERED_BYTES {
        return Some(format!(
            "the pool's {} bytes exceed the kernel's 1 GiB per buffer",
            pool.budget_bytes()
        ));
    }
    match memlock_limit_bytes() {
        Some(limit) if need > limit => Some(format!(
            "{need} bytes exceed RLIMIT_MEMLOCK ({limit} bytes)"
        )),
        _ => None,
    }
}

fn memlock_limit_bytes() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit to write into.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Some(0);
    }
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

pub(crate) fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit to write into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    lim.rlim_cur
}

pub(crate) struct SetupParams {
    pub(crate) rings: usize,
    pub(crate) ring_entries: u32,
    pub(crate) register_buffers: bool,
    pub(crate) fixed_files: u32,
}

/// Sets up `rings` rings, probes the read opcode, and registers buffers and a fixed-file
/// table where the kernel and the limits allow.
pub(crate) fn setup(params: &SetupParams, pool: &Pool) -> Result<UringSetup, SetupError> {
    let mut rings = Vec::with_capacity(params.rings.max(1));
    // With 0 rings (sessions only) one ring is still built, to probe the kernel.
    for _ in 0..params.rings.max(1) {
        let ring = build_ring(params.ring_entries).map_err(|source| SetupError {
            what: "io_uring_setup",
            source,
        })?;
        rings.push(Arc::new(ring));
    }
    let mut probe = Probe::new();
    rings[0]
        .submitter()
        .register_probe(&mut probe)
        .map_err(|source| SetupError {
            what: "probing opcodes",
            source,
        })?;
    if !probe.is_supported(opcode::Read::CODE) || !probe.is_supported(opcode::ReadFixed::CODE) {
        return Err(SetupError {
            what: "probing opcodes",
            source: io::Error::new(io::ErrorKind::Unsupported, "IORING_OP_READ not supported"),
        });
    }
    let direct_descriptors = probe_direct_descriptors(&probe);
    let mut wakers = Vec::with_capacity(params.rings);
    for _ in 0..params.rings {
        // Blocking: io_uring answers reads of an O_NONBLOCK file with EAGAIN instead of
        // waiting. SAFETY: eventfd has no memory preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(SetupError {
                what: "eventfd",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        wakers.push(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let sq_entries = rings[0].params().sq_entries() as usize;
    let cq_entries = rings[0].params().cq_entries() as usize;
    let cap = sq_entries.min(cq_entries) - 1;
    rings.truncate(params.rings);
    wakers.truncate(params.rings);
    let mut notes = Vec::new();

    let mut fixed_buffers = false;
    if params.register_buffers && params.rings > 0 {
        match registration_refused(pool, params.rings) {
            Some(why) => notes.push(format!("buffers not registered: {why}")),
            None => {
                // The whole pool as buffer 0: READ_FIXED may target any range inside it.
                let iovecs = [pool.iovec()];
                let mut registered = 0;
                for ring in &rings {
                    // SAFETY: the iovecs describe the pool's mapping, which outlives every
                    // ring: each engine holds the Pool until its ring is dropped, and the
                    // rings are only used by engines.
                    match unsafe { ring.submitter().register_buffers(&iovecs) } {
                        Ok(()) => registered += 1,
                        Err(e) => {
                            notes.push(format!("buffers not registered: {e}"));
                            break;
                        }
                    }
                }
                fixed_buffers = registered == rings.len();
                if !fixed_buffers {
                    for ring in &rings[..registered] {
                        let _ = ring.submitter().unregister_buffers();
                    }
                }
            }
        }
    }

    let slots = u64::from(params.fixed_files).min(nofile_limit()) as u32;
    let fixed = if slots == 0 || rings.is_empty() {
        None
    } else {
        match FixedTable::new(rings.clone(), slots) {
            Ok(t) => Some(Arc::new(t)),
            Err(e) => {
                for ring in &rings {
                    let _ = ring.submitter().unregister_files();
                }
                notes.push(format!("no fixed files: {e}"));
                None
            }
        }
    };
    Ok(UringSetup {
        rings,
        wakers,
        cap,
        fixed_buffers,
        fixed,
        direct_descriptors,
        notes,
    })
}

/// One ring and the reads it has in the kernel.
pub(crate) struct Engine {
    pub(crate) id: usize,
    pub(crate) ring: Arc<IoUring>,
    pub(crate) shared: Arc<ReaderState>,
    pub(crate) cap: usize,
    pub(crate) fixed_buffers: bool,
    pub(crate) async_punt: bool,
}

static SUBMIT_ERROR_LOGGED: AtomicBool = AtomicBool::new(false);

/// Pushes `entry` into `ring`'s SQ, submitting first whenever the SQ is full.
///
/// # Safety
/// The calling thread is the only one touching `ring`'s SQ, and the memory `entry` points at
/// stays valid until its completion is reaped.
pub(crate) unsafe fn push_entry(ring: &IoUring, entry: &squeue::Entry) {
    loop {
        // SAFETY: the caller is the SQ's only user.
        let mut sq = unsafe { ring.submission_shared() };
        // SAFETY: the caller keeps the entry's memory valid until its completion.
        if unsafe { sq.push(entry) }.is_ok() {
            return;
        }
        drop(sq);
        let _ = ring.submit();
    }
}

/// Pushes `entries` into `ring`'s SQ in one batch: if they do not all fit, submits what is
/// there first, so that no submission cuts a linked chain in two.
///
/// # Safety
/// As for [`push_entry`], for every entry; `entries` fits in the SQ.
pub(crate) unsafe fn push_entries(ring: &IoUring, entries: &[squeue::Entry]) {
    loop {
        // SAFETY: the caller is the SQ's only user.
        let mut sq = unsafe { ring.submission_shared() };
        assert!(entries.len() <= sq.capacity(), "a chain longer than the SQ");
        if sq.capacity() - sq.len() >= entries.len() {
            for entry in entries {
                // SAFETY: the caller keeps each entry's memory valid until its completion;
                // there is room (checked above).
                unsafe { sq.push(entry) }.expect("room was checked");
            }
            return;
        }
        drop(sq);
        let _ = ring.submit();
    }
}

/// The file a read SQE names.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReadTarget {
    /// A plain descriptor.
    Fd(RawFd),
    /// A slot of the ring's fixed-file table.
    Fixed(u32),
}

/// Builds the SQE for the next chunk of `job` through `target`, into the registered buffer
/// if `fixed_buffers`.
pub(crate) fn read_sqe(
    user_data: u64,
    job: &mut Job,
    target: ReadTarget,
    fixed_buffers: bool,
    async_punt: bool,
) -> squeue::Entry {
    let (offset, buf_offset, len) = job.next_chunk();
    // Buffer 0 is the whole pool (see `setup` and `register_pool`).
    let buf_index = 0;
    // SAFETY: next_chunk stays inside the buffer (buf_offset + len <= read_len <=
    // capacity), and the job owns the buffer until its completion is reaped.
    let ptr = unsafe { job.buf.as_mut_ptr().add(buf_offset) };
    let len = len as u32;
    let entry = match (target, fixed_buffers) {
        (ReadTarget::Fixed(slot), true) => {
            opcode::ReadFixed::new(types::Fixed(slot), ptr, len, buf_index)
                .offset(offset)
                .build()
        }
        (ReadTarget::Fixed(slot), false) => opcode::Read::new(types::Fixed(slot), ptr, len)
            .offset(offset)
            .build(),
        (ReadTarget::Fd(fd), true) => opcode::ReadFixed::new(types::Fd(fd), ptr, len, buf_index)
            .offset(offset)
            .build(),
        (ReadTarget::Fd(fd), false) => opcode::Read::new(types::Fd(fd), ptr, len)
            .offset(offset)
            .build(),
    };
    let entry = entry.user_data(user_data);
    if async_punt {
        entry.flags(squeue::Flags::ASYNC)
    } else {
        entry
    }
}

/// Bits of user_data above the slab key that say which operation of a path read's chain
/// completed; a plain read has 0 there, so its user_data is its key.
const OP_SHIFT: u32 = 56;

/// The user_data of operation `op` of the job under `key`.
pub(crate) fn chain_user_data(key: usize, op: ChainOp) -> u64 {
    debug_assert!((key as u64) < 1 << OP_SHIFT);
    let op_bits: u64 = match op {
        ChainOp::Read => 0,
        ChainOp::Open => 1,
        ChainOp::Close => 2,
    };
    key as u64 | op_bits << OP_SHIFT
}

/// The key and operation of a session's user_data.
pub(crate) fn decode_user_data(user_data: u64) -> (usize, ChainOp) {
    let key = (user_data & ((1 << OP_SHIFT) - 1)) as usize;
    let op = match user_data >> OP_SHIFT {
        0 => ChainOp::Read,
        1 => ChainOp::Open,
        _ => ChainOp::Close,
    };
    (key, op)
}

/// An openat of `path` (relative to `dir`, or `AT_FDCWD`) straight into fixed-file slot
/// `slot` (a direct descriptor, 5.15). O_CLOEXEC is not given: the kernel refuses it with a
/// slot, and a slot is never inherited.
pub(crate) fn open_direct_sqe(
    user_data: u64,
    dir: RawFd,
    path: &CStr,
    direct: bool,
    slot: u32,
) -> squeue::Entry {
    let mut flags = libc::O_RDONLY;
    if direct {
        flags |= libc::O_DIRECT;
    }
    let dest = types::DestinationSlot::try_from_slot_target(slot).expect("slots are small");
    opcode::OpenAt::new(types::Fd(dir), path.as_ptr())
        .flags(flags)
        .file_index(Some(dest))
        .build()
        .user_data(user_data)
}

/// A close of fixed-file slot `slot`.
pub(crate) fn close_fixed_sqe(user_data: u64, slot: u32) -> squeue::Entry {
    opcode::Close::new(types::Fixed(slot))
        .build()
        .user_data(user_data)
}

/// Whether this kernel opens files straight into a ring's fixed-file table, reads them
/// there in the same linked chain and closes them there (direct descriptors, 5.15; a linked
/// read finds the file its open put in the slot only since the kernel assigns files at
/// issue, 5.18): on a ring of its own with a sparse table, an open of /dev/null into slot 0
/// linked to an empty read of the slot linked to its close. `Err` says why not.
pub(crate) fn probe_direct_descriptors(probe: &Probe) -> Result<(), String> {
    if !probe.is_supported(opcode::OpenAt::CODE) || !probe.is_supported(opcode::Close::CODE) {
        return Err("IORING_OP_OPENAT or IORING_OP_CLOSE not supported".into());
    }
    let ring = IoUring::new(4).map_err(|e| format!("io_uring_setup: {e}"))?;
    ring.submitter()
        .register_files_sparse(1)
        .map_err(|e| format!("registering a sparse file table: {e}"))?;
    let mut byte = 0u8;
    let open =
        open_direct_sqe(1, libc::AT_FDCWD, c"/dev/null", false, 0).flags(squeue::Flags::IO_LINK);
    // Empty: a short read would break the link and cancel the close.
    let read = opcode::Read::new(types::Fixed(0), &mut byte, 0)
        .build()
        .user_data(2)
        .flags(squeue::Flags::IO_LINK);
    let close = close_fixed_sqe(3, 0);
    // SAFETY: this thread is the ring's only user; the path is a static C string and
    // `byte` outlives the wait below, which reaps all three completions.
    unsafe { push_entries(&ring, &[open, read, close]) };
    ring.submit_and_wait(3)
        .map_err(|e| format!("io_uring_enter: {e}"))?;
    let mut results = [None; 3];
    // SAFETY: this thread is the ring's only user.
    for cqe in unsafe { ring.completion_shared() } {
        if let Some(r) = (cqe.user_data() as usize)
            .checked_sub(1)
            .and_then(|i| results.get_mut(i))
        {
            *r = Some(cqe.result());
        }
    }
    match results {
        [Some(0), Some(0), Some(0)] => Ok(()),
        [Some(fd), ..] if fd > 0 => {
            // SAFETY: the kernel ignored the slot and handed this descriptor to us.
            unsafe { libc::close(fd) };
            Err("the kernel ignores the open's file slot".into())
        }
        [open, read, close] => Err(format!(
            "an open of /dev/null into a fixed slot returned {open:?}, the linked read of the \
             slot {read:?}, its close {close:?}"
        )),
    }
}

impl Engine {
    fn read_sqe(&self, key: usize, job: &mut Job) -> squeue::Entry {
        // Engines serve `Reader::submit`, which names only the reader's own files.
        let Source::File(file) = &job.source else {
            unreachable!("engines only read files opened on the reader")
        };
        let target = match &file.fixed {
            Some(slot) => ReadTarget::Fixed(slot.index),
            None => ReadTarget::Fd(file.raw_fd()),
        };
        read_sqe(key as u64, job, target, self.fixed_buffers, self.async_punt)
    }

    /// Pushes entries, submitting first whenever the SQ is full.
    fn push(&self, entry: &squeue::Entry) {
        // SAFETY: only this engine thread touches this ring's SQ and CQ, and the entry's
        // buffers (job buffers, the wake buffer) stay valid until its completion is reaped:
        // the engine owns them until then.
        unsafe { push_entry(&self.ring, entry) }
    }

    pub(crate) fn run(self) {
        let shared = self.shared.clone();
        let mut jobs: Slab<Job> = Slab::with_capacity(self.cap);
        let mut taken: Vec<Job> = Vec::with_capacity(self.cap);
        let mut to_issue: Vec<usize> = Vec::with_capacity(self.cap);
        let mut finished: Vec<(Job, Result<(), ReadError>)> = Vec::new();
        let mut wake_buf = Box::new(0u64);
        let mut wake_armed = false;
        let mut wake_kicked = false;
        let wake_fd = shared.wakers[self.id].as_raw_fd();
        loop {
            let mut cancelled = Vec::new();
            let shutdown;
            {
                let mut s = shared.lock();
                s.parked[self.id] = false;
                shutdown = s.shutdown;
                if shutdown {
                    cancelled = s.drain_queued();
                } else {
                    // With several rings, take a fair share so that page-cache copies (done
                    // inline by whoever submits) spread over the engine threads.
                    let engines = shared.wakers.len();
                    let share = if engines > 1 {
                        s.queued().div_ceil(engines).max(1)
                    } else {
                        usize::MAX
                    };
                    let mut out_of_work = false;
                    while jobs.len() + taken.len() < self.cap && taken.len() < share {
                        match shared.take_next(&mut s) {
                            Some(job) => taken.push(job),
                            None => {
                                out_of_work = true;
                                break;
                            }
                        }
                    }
                    // No work left and room in the ring: submitters must wake us for more.
                    s.parked[self.id] = out_of_work;
                    if !taken.is_empty() {
                        shared.room_made(&s);
                    }
                }
            }
            for job in cancelled {
                shared.deliver(job.cancel());
            }
            for job in taken.drain(..) {
                if job.is_empty() {
                    finished.push((job, Ok(())));
                } else {
                    to_issue.push(jobs.insert(job));
                }
            }
            for key in to_issue.drain(..) {
                let job = &mut jobs[key];
                let entry = self.read_sqe(key, job);
                self.push(&entry);
            }
            if !finished.is_empty() {
                self.finish(&mut finished);
                continue;
            }
            if shutdown && jobs.is_empty() {
                if !wake_armed {
                    break;
                }
                if !wake_kicked {
                    // Complete our own eventfd read so nothing of ours is left in the ring.
                    shared.kick(self.id);
                    wake_kicked = true;
                }
            }
            if !wake_armed && !shutdown {
                let entry =
                    opcode::Read::new(types::Fd(wake_fd), (&mut *wake_buf as *mut u64).cast(), 8)
                        .build()
                        .user_data(WAKE_KEY);
                self.push(&entry);
                wake_armed = true;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(e) => {
                    if !SUBMIT_ERROR_LOGGED.swap(true, Ordering::Relaxed) {
                        log::error!("lobster-uring: io_uring_enter failed: {e}; retrying");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            // SAFETY: only this engine thread touches this ring's SQ and CQ.
            let cq = unsafe { self.ring.completion_shared() };
            for cqe in cq {
                let key = cqe.user_data();
                if key == WAKE_KEY {
                    wake_armed = false;
                    continue;
                }
                let key = key as usize;
                let job = &mut jobs[key];
                match job.on_result(cqe.result()) {
                    AfterRead::Again => to_issue.push(key),
                    AfterRead::Done(result) => finished.push((jobs.remove(key), result)),
                }
            }
            self.finish(&mut finished);
        }
    }

    fn finish(&self, finished: &mut Vec<(Job, Result<(), ReadError>)>) {
        if finished.is_empty() {
            return;
        }
        {
            let mut s = self.shared.lock();
            for (job, _) in finished.iter() {
                self.shared.finish(&mut s, job);
            }
        }
        for (job, result) in finished.drain(..) {
            self.shared.deliver(job.complete(result));
        }
    }
}
