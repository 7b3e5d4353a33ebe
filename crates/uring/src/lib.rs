//! lobster-uring: the io_uring sample reader of lobster-io.
//!
//! Turns "class `c` wants bytes `[offset, offset + len)` of file `f`" into [`bytes::Bytes`]
//! in memory, with each class (a rank) limited to its own io_depth of reads in the kernel,
//! changeable at any time.
//!
//! - **Engine.** Each ring is owned by one engine thread that takes requests from per-class
//!   FIFO queues (round robin over classes below their io_depth), keeps at most the ring's
//!   capacity in the kernel, and sleeps in `io_uring_enter` when idle; submitters wake it
//!   through an eventfd whose read it keeps in the ring.
//! - **Sessions.** [`Reader::session`] gives a thread its own ring that it submits to and
//!   reaps from itself ([`Session`]), with no engine thread in between: no hand-off per
//!   read, and page-cache hits copied on the submitting thread, so N sessions on N threads
//!   use N cores the way fio's N jobs do. Sessions share the reader's classes and io_depth
//!   limits (a class's limit counts the reads of every session and engine together), files
//!   and pool. `rings = 0` builds a reader that serves sessions only.
//! - **Reads by path.** [`Session::submit_path`] reads a file it opens for that read only:
//!   where the kernel has direct descriptors (5.15, probed when the reader is built) the open
//!   goes straight into a slot of the session ring's fixed-file table, linked to the read and
//!   the close, so it costs no system call beyond the read's; elsewhere the file is opened,
//!   read and closed with separate calls on the session's thread.
//! - **Files** are opened once and registered in a fixed-file table when a slot is free.
//!   O_DIRECT is per file; its alignment comes from statx (`STATX_DIOALIGN`, else 4096),
//!   and unaligned ranges read the aligned superset and hand out the exact slice.
//! - **Buffers** come from a pool of [`ReaderConfig::pool_bytes`], mapped and committed up
//!   front (resident from the build on, it does not creep) and carved by a buddy allocator
//!   into page-aligned power-of-two blocks (less than twice each read), registered with the
//!   rings as one buffer where RLIMIT_MEMLOCK allows. A completed read is a `Bytes` over its
//!   block; the block returns, merging with its free buddy, when the last `Bytes` drops.
//!   Reads that find no free block wait in the reader in submission order (a large read is
//!   not starved by small ones); `submit` does not wait for memory.
//! - **Failures** (short reads are resumed, EAGAIN/EINTR/EBUSY retried, O_DIRECT reads over
//!   1 MiB split) complete the one request with a [`ReadError`] naming path, offset, length
//!   and OS error.
//! - **Fallback.** When no ring can be set up (seccomp, `kernel.io_uring_disabled`, old
//!   kernel), a bounded pool of pread threads serves the same API; `LOBSTER_IO=pread|uring`
//!   or [`ReaderConfig::backend`] forces a backend. [`Reader::backend`] says which runs and
//!   why.
//! - **Drop** cancels queued reads, waits for those in the kernel, and joins the threads.
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
//! reader.submit(ReadRequest { file, offset: 7, len: 6, class: 1, tag: 42 })?;
//! let done = reader.completions().recv()?;
//! assert_eq!((done.tag, done.class), (42, 1));
//! assert_eq!(&done.result?[..], b"sample");
//! reader.set_io_depth(1, 16)?; // at any time
//!
//! // Caller-driven: this thread submits and reaps on its own ring.
//! let mut session = reader.session()?;
//! session.submit(ReadRequest { file, offset: 0, len: 5, class: 0, tag: 1 })?;
//! let mut done = Vec::new();
//! session.wait(1, &mut done)?;
//! assert_eq!(&done[0].result.as_ref().unwrap()[..], b"hello");
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

#![deny(unsafe_op_in_unsafe_fn)]

mod arena;
mod background;
mod classes;
mod completion;
mod deferred;
mod direct;
mod error;
mod file_ref;
mod files;
mod job;
mod mapping;
mod pages;
mod pool;
mod pread;
mod reader;
mod resident;
mod session;
mod state;
mod types;
mod uring;

pub use arena::Arena;
pub use background::run_as_batch;
pub use completion::Completion;
pub use direct::read_direct;
pub use error::ReadError;
pub use file_ref::{open_dir, open_files_limit, FileRef};
pub use pages::copy_to_pages;
pub use pool::block_bytes;
pub use reader::{ActiveBackend, Backend, BackendInfo, Reader, ReaderBuilder, ReaderConfig};
pub use resident::{read_resident, Resident};
pub use session::Session;
pub use types::{
    ClassStats, FileId, IoEvent, IoEventKind, Observer, OpenOptions, PathRead, ReadRequest,
    ReaderStats,
};

/// `Bytes`, re-exported so users need not depend on the `bytes` crate.
pub use bytes::Bytes;
/// The completion channel's receiver type.
pub use crossbeam_channel::Receiver;
