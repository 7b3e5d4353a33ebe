//! What sessions' rings are built from: the probe of the kernel when a reader is built, ring
//! setup, buffer registration, and the SQEs of reads and of the open, read, close chains of
//! reads by path.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types, IoUring, Probe};

use crate::file_ref::open_files_limit;
use crate::job::{ChainOp, Job};
use crate::pool::Pool;

/// Largest buffer the kernel registers (one iovec of at most 1 GiB).
const MAX_REGISTERED_BYTES: usize = 1 << 30;

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
    if let Some(why) = registration_refused(pool) {
        return Err(why);
    }
    pool.registering(|| {
        // SAFETY: the iovec describes the pool's mapping (buffer 0, the whole pool); the
        // caller keeps the pool alive until the ring is dropped.
        unsafe { ring.submitter().register_buffers(&[pool.iovec()]) }.map_err(|e| e.to_string())
    })
}

/// Why `pool` cannot be registered as one buffer with a ring, if it cannot.
fn registration_refused(pool: &Pool) -> Option<String> {
    let need = pool.budget_bytes() as u64;
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

/// The soft limit on open descriptors, which bounds the slots a ring's file table may have.
pub(crate) fn nofile_limit() -> u64 {
    open_files_limit().unwrap_or(u64::MAX)
}

/// What the reader needs to know of this kernel's io_uring, probed on a ring of its own.
pub(crate) struct UringProbe {
    /// Reads a session's ring may have in the kernel at once (its SQ size; its CQ is twice
    /// as large, so completions can never overflow).
    pub(crate) cap: usize,
    /// Sessions may register the pool with their rings (`Err`: why not).
    pub(crate) fixed_buffers: Result<(), String>,
    /// Sessions can read by path through direct descriptors (`Err`: why not).
    pub(crate) direct_descriptors: Result<(), String>,
}

/// Why io_uring could not be set up.
pub(crate) struct SetupError {
    pub(crate) what: &'static str,
    pub(crate) source: io::Error,
}

/// Sets up a ring as a session would, probes the read opcodes and direct descriptors, and
/// says whether `pool` may be registered (when `register_buffers`).
pub(crate) fn probe(
    ring_entries: u32,
    register_buffers: bool,
    pool: &Pool,
) -> Result<UringProbe, SetupError> {
    let ring = build_session_ring(ring_entries).map_err(|source| SetupError {
        what: "io_uring_setup",
        source,
    })?;
    let mut probe = Probe::new();
    ring.submitter()
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
    let fixed_buffers = match registration_refused(pool) {
        _ if !register_buffers => Err("ReaderConfig::register_buffers is off".into()),
        Some(why) => Err(why),
        None => Ok(()),
    };
    Ok(UringProbe {
        cap: ring.params().sq_entries() as usize,
        fixed_buffers,
        direct_descriptors: probe_direct_descriptors(&probe),
    })
}

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
