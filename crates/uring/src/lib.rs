//! lobster-uring: the io_uring sample reader of lobster-io.
//!
//! Turns "class `c` wants bytes `[offset, offset + len)` of file `f`" into [`bytes::Bytes`]
//! in memory, with each class (a rank) limited to its own io_depth of reads in the kernel,
//! changeable at any time.
//!
//! - **Sessions, the one way to read.** [`Reader::session`] gives a thread a [`Session`]
//!   that it submits to and reaps from itself, on a ring of its own: no thread between the
//!   caller and the kernel, no hand-off per read, and page-cache hits copied on the
//!   submitting thread, so N sessions on N threads use N cores the way fio's N jobs do.
//!   Sessions share the reader's classes and io_depth limits (a class's limit counts the
//!   reads of every session together), its open files and its buffer pool. A session's
//!   requests wait in its own FIFO per class until their class is below its io_depth.
//! - **Reads by path.** [`Session::submit_path`] reads a file it opens for that read only:
//!   where the kernel has direct descriptors (5.15, probed when the reader is built) the open
//!   goes straight into a slot of the session ring's fixed-file table, linked to the read and
//!   the close, so it costs no system call beyond the read's; elsewhere the file is opened,
//!   read and closed with separate calls on the session's thread.
//! - **Files** opened on the reader ([`Reader::open`]) are read by every session through
//!   their descriptor. O_DIRECT is per file; its alignment comes from statx
//!   (`STATX_DIOALIGN`, else 4096), and unaligned ranges read the aligned superset and hand
//!   out the exact slice.
//! - **Buffers** come from a pool of [`ReaderConfig::pool_bytes`], mapped and committed up
//!   front (resident from the build on, it does not creep) and carved by a buddy allocator
//!   into page-aligned power-of-two blocks (less than twice each read), registered with each
//!   session's ring as one buffer where RLIMIT_MEMLOCK allows. A completed read is a `Bytes`
//!   over its block; the block returns, merging with its free buddy, when the last `Bytes`
//!   drops. A session with reads pending takes no more than the pool holds
//!   ([`ReadError::WouldBlock`]); one with none waits for memory behind earlier waiters, so
//!   a large read is not starved by small ones.
//! - **Failures** (short reads are resumed, EAGAIN/EINTR/EBUSY retried, O_DIRECT reads over
//!   1 MiB split) complete the one request with a [`ReadError`] naming path, offset, length
//!   and OS error.
//! - **Fallback.** When no ring can be set up (seccomp, `kernel.io_uring_disabled`, old
//!   kernel), sessions hand their reads to a bounded pool of pread threads that the reader
//!   owns and reap them in [`Session::wait`] and [`Session::poll`] as they would reap their
//!   ring: same methods, limits, completions and errors (a read by path is opened, read and
//!   closed on the worker). `LOBSTER_IO=pread|uring` or [`ReaderConfig::backend`] forces a
//!   backend; [`Reader::backend`] says which runs and why.
//! - **Besides reads**, in a room of their own (the `system` module, none of it io_uring's):
//!   the memory a node cache keeps samples in after their reads, apart from the pool
//!   ([`Arena`], [`copy_to_pages`]), and [`run_as_batch`], the scheduling class of a loader's
//!   background threads.
//! - **Drop.** A session waits for its reads in the kernel (or at the workers) and drops
//!   those still queued; the reader joins its pread workers once the last session and
//!   handle are gone.
//!
//! ```
//! use lobster_uring::{OpenOptions, PathRead, ReadRequest, Reader};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::env::temp_dir().join(format!("lobster-uring-doc-{}", std::process::id()));
//! std::fs::write(&path, b"hello, sample reader")?;
//!
//! let reader = Reader::builder().classes(2, 8).build()?;
//! let file = reader.open(&path, OpenOptions { direct: false })?;
//!
//! // Caller-driven: this thread submits and reaps on its own ring (or the pread workers).
//! let mut session = reader.session()?;
//! session.submit(ReadRequest { file, offset: 7, len: 6, class: 1, tag: 42 })?;
//! let mut done = Vec::new();
//! session.wait(1, &mut done)?;
//! assert_eq!((done[0].tag, done[0].class), (42, 1));
//! assert_eq!(&done[0].result.as_ref().unwrap()[..], b"sample");
//! reader.set_io_depth(1, 16)?; // at any time, for every session
//!
//! // By path: opened, read and closed for this read only.
//! let shared_path: std::sync::Arc<std::path::Path> = path.as_path().into();
//! let (direct, class, tag) = (false, 0, 2);
//! let read = PathRead { path: shared_path, dir: None, direct, offset: 15, len: 5, to_eof: false, class, tag };
//! session.submit_path(read)?;
//! done.clear();
//! session.wait(1, &mut done)?;
//! assert_eq!(&done[0].result.as_ref().unwrap()[..], b"eader");
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Why not tokio-uring
//!
//! tokio-uring could read for an embedder already on tokio, so it was measured against a
//! `Session` on the same reads at depth 32 (`benches/tokio-uring/run.sh`, a standalone
//! crate; `docs/benchmarks/tokio-uring.md`). At its best (registered buffers, 32 reads in
//! flight) it is level: medians of 7 runs each, engines alternating, on a quiet 2-vCPU machine
//! (2026-12-07) put tokio-uring / lobster at 0.955, 1.004 and 1.003 in MB/s for O_DIRECT
//! 4 KiB, O_DIRECT 128 KiB and page-cache 128 KiB reads, 1.010 by path in a held directory
//! (the engine's way) and 1.025 by full path, and at 0.97 to 1.08 in CPU per GB.
//! No gain of 5% in MB/s or 10% in CPU held up, and it would cost what this crate is for:
//! tokio-uring panics where no ring can be set up (no pread fallback), runs its own
//! single-thread runtime (it panics inside another tokio runtime), has no io_depth classes,
//! no memory bound, and no direct descriptors or linked open, read and close (three round
//! trips a sample by path), and it pins io-uring 0.6. So the engine drives its rings itself,
//! and tokio embedders take batches through the facade's async stream, on any runtime.

#![deny(unsafe_op_in_unsafe_fn)]

mod classes;
mod completion;
mod direct;
mod error;
mod file_ref;
mod files;
mod job;
mod pool;
mod pread;
mod reader;
mod resident;
mod ring;
mod session;
mod state;
mod system;
mod types;
mod uring;

pub use completion::Completion;
pub use direct::read_direct;
pub use error::ReadError;
pub use file_ref::{open_dir, open_files_limit, FileRef};
pub use pool::block_bytes;
pub use reader::{ActiveBackend, Backend, BackendInfo, Reader, ReaderBuilder, ReaderConfig};
pub use resident::{read_resident, Resident};
pub use session::Session;
pub use system::arena::Arena;
pub use system::heap::{hold_heap, release_free_heap, HeapLimits};
pub use system::pages::copy_to_pages;
pub use system::threads::run_as_batch;
pub use types::{
    ClassStats, FileId, IoEvent, IoEventKind, Observer, OpenOptions, PathRead, ReadRequest,
    ReaderStats,
};

/// `Bytes`, re-exported so users need not depend on the `bytes` crate.
pub use bytes::Bytes;
