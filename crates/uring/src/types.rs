//! The public plain types: file ids and open options, read requests, observer events and
//! counters. No logic lives here, so every module may use them.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

/// A file opened on a [`crate::Reader`]. Ids of closed files are never reused for other files
/// (a generation counter tells them apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// How [`crate::Reader::open`] opens a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Bypass the page cache (O_DIRECT). Reads are widened to the file system's alignment
    /// (statx `STATX_DIOALIGN`, else 4096) and the exact range is handed out as a slice.
    pub direct: bool,
}

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
    /// Caller's tag, returned in the [`crate::Completion`].
    pub tag: u64,
}

/// A read of `len` bytes at `offset` of the file at `path`, on behalf of `class`: the file
/// is opened for this read only and closed after it; see [`crate::Session::submit_path`].
#[derive(Clone, Debug)]
pub struct PathRead {
    /// The file (an `Arc`, so that a request is cheap to clone and to keep until its open).
    pub path: Arc<Path>,
    /// `path`'s parent directory, held open ([`crate::open_dir`]): the file is opened by
    /// its name in it, one lookup instead of one per component of `path`.
    pub dir: Option<Arc<OwnedFd>>,
    /// Open it with O_DIRECT: the read is widened to 4096 bytes (the file is not open yet to
    /// ask its alignment) and the exact range handed out as a slice.
    pub direct: bool,
    /// First byte to read.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Read up to `len` bytes: a file that ends first gives what it has instead of an
    /// [`crate::ReadError::UnexpectedEof`]. Asking one byte more than a file should hold then
    /// tells whether it grew, without a stat.
    pub to_eof: bool,
    /// The class (rank) whose io_depth this read counts against.
    pub class: usize,
    /// Caller's tag, returned in the [`crate::Completion`].
    pub tag: u64,
}

/// What the observer hook is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoEventKind {
    /// The read left its session's class queue and is about to be handed to the kernel (or
    /// to a pread worker).
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
/// its last part left the kernel and its session reaped it). Called under the lock of the
/// classes' accounting, so the events of all sessions are seen in one order consistent with
/// the limits; keep it cheap.
pub type Observer = Arc<dyn Fn(IoEvent) + Send + Sync>;

/// Per-class counters, see [`crate::Reader::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClassStats {
    /// The current io_depth limit.
    pub io_depth: usize,
    /// Reads in the kernel (or at the pread workers) now; requests waiting in sessions'
    /// queues are not counted (see [`crate::Session::pending`]).
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
    /// Sessions waiting for a block (with no read pending, a session waits for pool
    /// memory; they are served in the order they came).
    pub pool_waiters: usize,
    /// Files open on the reader.
    pub files_open: usize,
}
