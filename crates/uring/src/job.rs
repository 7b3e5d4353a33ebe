//! One read from submission to completion: the checked request waiting for a buffer
//! ([`Pending`]) and the job that owns its buffer while a backend drives its reads ([`Job`],
//! folding each result into an [`AfterRead`]). A read by path also opens and closes its
//! file: on the calling thread ([`Opened::Fd`]) or as a chain of ring operations on a
//! fixed-file slot ([`Opened::Slot`], folded by [`Job::on_chain_result`]).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::completion::Completion;
use crate::error::ReadError;
use crate::file_ref::FileRef;
use crate::files::{FileEntry, DEFAULT_DIO_ALIGN};
use crate::pool::PoolBuf;

/// Largest single O_DIRECT read handed to the kernel; larger requests are read in chunks.
pub(crate) const MAX_DIRECT_CHUNK_BYTES: usize = 1 << 20;
/// How often one read is retried after EAGAIN, EINTR or EBUSY before it fails.
pub(crate) const MAX_RETRIES: u32 = 1000;

/// The file a job reads.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// A file opened on the reader ([`crate::Reader::open`]).
    File(Arc<FileEntry>),
    /// A file named by path, opened for this read only and closed after it.
    Path {
        /// The file.
        path: Arc<Path>,
        /// Its parent directory, held open: opened by its name there.
        dir: Option<Arc<OwnedFd>>,
        /// Open it with O_DIRECT.
        direct: bool,
        /// Ending early at the end of the file is not an error: the bytes read are the result.
        to_eof: bool,
    },
}

impl Source {
    pub(crate) fn path(&self) -> &Path {
        match self {
            Source::File(file) => &file.path,
            Source::Path { path, .. } => path,
        }
    }

    /// What an open of a path read's file starts from and the path it walks from there: its
    /// held directory and its name, or the working directory and its whole path.
    pub(crate) fn open_at(&self) -> (RawFd, &Path) {
        match self {
            Source::Path {
                dir: Some(dir),
                path,
                ..
            } => match path.file_name() {
                Some(name) => (dir.as_raw_fd(), Path::new(name)),
                None => (libc::AT_FDCWD, path),
            },
            _ => (libc::AT_FDCWD, self.path()),
        }
    }

    pub(crate) fn direct(&self) -> bool {
        match self {
            Source::File(file) => file.direct,
            Source::Path { direct, .. } => *direct,
        }
    }

    /// Offset and length alignment of reads. A path read is planned before its file is
    /// open, so O_DIRECT takes the default alignment (statx cannot be asked yet).
    fn align(&self) -> u64 {
        match self {
            Source::File(file) => file.align,
            Source::Path { direct: true, .. } => DEFAULT_DIO_ALIGN,
            Source::Path { direct: false, .. } => 1,
        }
    }
}

/// A checked request without its buffer yet.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(crate) source: Source,
    pub(crate) tag: u64,
    pub(crate) class: usize,
    /// First byte requested.
    pub(crate) offset: u64,
    /// Bytes requested.
    pub(crate) len: usize,
    /// Where the read starts in the file (the offset, or below it for O_DIRECT alignment).
    pub(crate) read_start: u64,
    /// Bytes read before the requested range (O_DIRECT alignment).
    pub(crate) skip: usize,
    /// Bytes the read needs (after O_DIRECT widening).
    pub(crate) read_len: usize,
}

impl Pending {
    /// Checks that the read is at most `max_read_bytes` and widens O_DIRECT reads to the
    /// alignment.
    pub(crate) fn plan(
        source: Source,
        offset: u64,
        len: usize,
        class: usize,
        tag: u64,
        max_read_bytes: usize,
    ) -> Result<Pending, ReadError> {
        let too_large = || ReadError::TooLarge {
            path: source.path().to_path_buf(),
            offset,
            len,
            max_read_bytes,
        };
        let (read_start, skip, read_len) = if len == 0 {
            (offset, 0, 0)
        } else {
            let align = source.align();
            let end = offset.checked_add(len as u64).ok_or_else(too_large)?;
            let read_start = offset - offset % align;
            let read_end = end.div_ceil(align) * align;
            let read_len = usize::try_from(read_end - read_start).map_err(|_| too_large())?;
            if read_len > max_read_bytes {
                return Err(too_large());
            }
            (read_start, (offset - read_start) as usize, read_len)
        };
        Ok(Pending {
            source,
            tag,
            class,
            offset,
            len,
            read_start,
            skip,
            read_len,
        })
    }
}

/// How the file of a path read is open while its job runs.
#[derive(Debug)]
pub(crate) enum Opened {
    /// Nothing opened for this job: a reader's file, or a path read not yet started.
    No,
    /// Opened on the calling thread with openat(2); closed when the job drops.
    Fd(FileEntry),
    /// Opened by the ring into a fixed-file slot: an open, read, close chain.
    Slot(SlotChain),
}

/// Which operation of a path read's chain a completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChainOp {
    Open,
    Read,
    Close,
}

/// A path read in a fixed-file slot: what its open, reads and close have returned.
#[derive(Debug)]
pub(crate) struct SlotChain {
    /// The slot of the ring's fixed-file table the file is opened into.
    pub(crate) slot: u32,
    /// The path as the kernel reads it; must live until the open completes.
    pub(crate) c_path: CString,
    /// The open's outcome once its completion arrived (an errno on failure).
    open: Option<Result<(), i32>>,
    /// The reads' outcome once they are over (or will not run because the open failed).
    read: Option<Result<(), ReadError>>,
    /// The close's outcome once it ran (not cancelled by a broken link).
    close: Option<Result<(), i32>>,
    /// A close of the slot is in the ring.
    close_in_ring: bool,
    /// Operations of this job in the ring.
    ops_in_ring: usize,
}

impl SlotChain {
    pub(crate) fn new(slot: u32, c_path: CString) -> SlotChain {
        SlotChain {
            slot,
            c_path,
            open: None,
            read: None,
            close: None,
            close_in_ring: false,
            ops_in_ring: 0,
        }
    }

    /// Counts operations put into the ring; a close among them is noted.
    pub(crate) fn pushed(&mut self, ops: usize, with_close: bool) {
        self.ops_in_ring += ops;
        self.close_in_ring |= with_close;
    }

    /// The close failed with an error other than a cancellation: the slot's content is
    /// unknown and must be cleared before it is used again.
    pub(crate) fn close_failed(&self) -> bool {
        matches!(self.close, Some(Err(_)))
    }
}

/// What to put into the ring after a completion of a path read's chain.
#[derive(Debug)]
pub(crate) enum ChainNext {
    /// Nothing: more completions of this job are due.
    Wait,
    /// The next read (remainder of a short read, a retry, the next O_DIRECT chunk).
    Read,
    /// A close of the slot (the chained one was cancelled, or none was chained).
    Close,
    /// Every operation is over: the job is finished.
    Done(Result<(), ReadError>),
}

/// One request from submission to completion. Owns its buffer until it completes.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) source: Source,
    /// A path read's open file (`Opened::No` for a reader's file).
    pub(crate) opened: Opened,
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

/// A job that is over, with its outcome: what a backend hands back to its session.
pub(crate) type Done = (Job, Result<(), ReadError>);

/// What to do with a job after one read returned.
pub(crate) enum AfterRead {
    /// Read the next chunk (remainder of a short read, a retry, the next O_DIRECT chunk).
    Again,
    /// The job is finished.
    Done(Result<(), ReadError>),
}

impl Job {
    /// The job of a request checked (and planned) at submission, with its buffer.
    pub(crate) fn new(p: Pending, buf: PoolBuf) -> Job {
        debug_assert!(p.read_len <= buf.capacity());
        Job {
            source: p.source,
            opened: Opened::No,
            tag: p.tag,
            class: p.class,
            offset: p.offset,
            len: p.len,
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

    /// The file is read with O_DIRECT.
    pub(crate) fn source_is_direct(&self) -> bool {
        self.source.direct()
    }

    /// A read by path (its file is opened for it).
    pub(crate) fn by_path(&self) -> bool {
        matches!(self.source, Source::Path { .. })
    }

    /// The plain descriptor to read through: the reader's file, or a path read's file opened
    /// on this thread. `None` for a path read not opened that way.
    pub(crate) fn fd(&self) -> Option<RawFd> {
        match (&self.source, &self.opened) {
            (Source::File(file), _) => Some(file.raw_fd()),
            (Source::Path { .. }, Opened::Fd(file)) => Some(file.raw_fd()),
            (Source::Path { .. }, _) => None,
        }
    }

    /// Opens a path read's file on this thread (openat in its held directory, and statx, as
    /// `Reader::open` does).
    pub(crate) fn open_here(&mut self) -> Result<(), ReadError> {
        if let Source::Path {
            path, dir, direct, ..
        } = &self.source
        {
            let file = FileRef {
                path,
                dir: dir.as_deref().map(AsFd::as_fd),
            };
            self.opened = Opened::Fd(FileEntry::open(file, *direct)?);
        }
        Ok(())
    }

    /// Closes the file `open_here` opened, now that the read is over with `result`: a close
    /// that fails after the bytes were read fails the read, as a ring's close does.
    pub(crate) fn close_here(&mut self, result: Result<(), ReadError>) -> Result<(), ReadError> {
        let Opened::Fd(file) = std::mem::replace(&mut self.opened, Opened::No) else {
            return result;
        };
        let fd = file.fd.into_raw_fd();
        // SAFETY: the descriptor was this job's alone, and `into_raw_fd` gave up its owner.
        let failed = (unsafe { libc::close(fd) } != 0).then(io::Error::last_os_error);
        match (result, failed) {
            // Linux frees the descriptor even when close is interrupted.
            (Ok(()), Some(e)) if e.raw_os_error() != Some(libc::EINTR) => Err(ReadError::Close {
                path: self.source.path().to_path_buf(),
                source: e,
            }),
            (result, _) => result,
        }
    }

    /// Whether the whole read is one chunk (then a chained close can follow it).
    pub(crate) fn single_chunk(&self) -> bool {
        self.next_chunk().2 == self.read_len - self.done
    }

    /// The next read: (file offset, offset into the buffer, length).
    pub(crate) fn next_chunk(&self) -> (u64, usize, usize) {
        let remaining = self.read_len - self.done;
        let len = if self.source.direct() {
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
    pub(crate) fn on_result(&mut self, res: i32) -> AfterRead {
        if res < 0 {
            let errno = -res;
            if matches!(errno, libc::EAGAIN | libc::EINTR | libc::EBUSY)
                && self.retries < MAX_RETRIES
            {
                self.retries += 1;
                return AfterRead::Again;
            }
            return AfterRead::Done(Err(ReadError::Read {
                path: self.source.path().to_path_buf(),
                offset: self.offset,
                len: self.len,
                source: io::Error::from_raw_os_error(errno),
            }));
        }
        self.done += res as usize;
        if self.done >= self.needed() {
            return AfterRead::Done(Ok(()));
        }
        // End of file: nothing came back, or an O_DIRECT read stopped off the alignment
        // (which only happens at EOF; a further read there would fail with EINVAL).
        let at_eof =
            res == 0 || (self.source.direct() && self.done as u64 % self.source.align() != 0);
        if at_eof && matches!(self.source, Source::Path { to_eof: true, .. }) {
            self.len = self.len.min(self.done.saturating_sub(self.skip));
            return AfterRead::Done(Ok(()));
        }
        if at_eof || self.done >= self.read_len {
            let read_end = self.read_start + self.done as u64;
            return AfterRead::Done(Err(ReadError::UnexpectedEof {
                path: self.source.path().to_path_buf(),
                offset: self.offset,
                len: self.len,
                file_end: self.file_size().map_or(read_end, |size| size.min(read_end)),
            }));
        }
        AfterRead::Again
    }

    /// Folds the completion of one operation of a path read's chain (open, read or close)
    /// and says what to put into the ring next. The job must be `Opened::Slot`.
    pub(crate) fn on_chain_result(&mut self, op: ChainOp, res: i32) -> ChainNext {
        let Opened::Slot(chain) = &mut self.opened else {
            unreachable!("chain results only come for path reads in a slot");
        };
        chain.ops_in_ring -= 1;
        match op {
            ChainOp::Open if res > 0 => {
                // A kernel that ignored the slot opened a plain descriptor (the probe
                // rules such kernels out); close it and fail this read.
                // SAFETY: the kernel just handed this descriptor to us and nobody else.
                unsafe { libc::close(res) };
                chain.open = Some(Err(libc::EOPNOTSUPP));
            }
            ChainOp::Open => chain.open = Some(if res < 0 { Err(-res) } else { Ok(()) }),
            ChainOp::Read if chain.open != Some(Ok(())) && res == -libc::ECANCELED => {
                // The open failed: its linked read never ran.
                chain.read = Some(Ok(()));
            }
            ChainOp::Read => match self.on_result(res) {
                AfterRead::Again => return ChainNext::Read,
                AfterRead::Done(result) => {
                    let Opened::Slot(chain) = &mut self.opened else {
                        unreachable!()
                    };
                    chain.read = Some(result);
                }
            },
            ChainOp::Close => {
                chain.close_in_ring = false;
                // A short or failed read breaks the link: the close was cancelled, not run.
                if res != -libc::ECANCELED {
                    chain.close = Some(if res < 0 { Err(-res) } else { Ok(()) });
                }
            }
        }
        let Opened::Slot(chain) = &mut self.opened else {
            unreachable!()
        };
        if chain.read.is_none() {
            return ChainNext::Wait;
        }
        if chain.open == Some(Ok(())) && chain.close.is_none() && !chain.close_in_ring {
            return ChainNext::Close;
        }
        if chain.ops_in_ring > 0 {
            return ChainNext::Wait;
        }
        let path = || self.source.path().to_path_buf();
        let result = match (chain.open, chain.read.take(), chain.close) {
            (Some(Err(errno)), _, _) => Err(ReadError::Open {
                path: path(),
                source: io::Error::from_raw_os_error(errno),
            }),
            (_, Some(Err(e)), _) => Err(e),
            (_, _, Some(Err(errno))) => Err(ReadError::Close {
                path: path(),
                source: io::Error::from_raw_os_error(errno),
            }),
            _ => Ok(()),
        };
        ChainNext::Done(result)
    }

    /// The completion of a finished job.
    pub(crate) fn complete(self, result: Result<(), ReadError>) -> Completion {
        let (result, permit) = match result {
            Ok(()) if self.len == 0 => (Ok(Bytes::new()), Some(self.buf)),
            Ok(()) => (Ok(self.buf.into_bytes(self.skip, self.len)), None),
            Err(e) => (Err(e), Some(self.buf)),
        };
        Completion::new(self.tag, self.class, result, permit)
    }

    /// Current size of the file, to report where it ended.
    fn file_size(&self) -> Option<u64> {
        let Some(fd) = self.fd() else {
            // A file in a ring slot has no descriptor here: ask by path.
            return std::fs::metadata(self.source.path()).ok().map(|m| m.len());
        };
        // SAFETY: stat is plain old data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open (the job's file entry owns it) and st is a valid buffer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return None;
        }
        u64::try_from(st.st_size).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Pool;

    /// A path read of `len` bytes at 0 in a slot, as the session starts it: `ops` pushed,
    /// a close among them if `linked_close`.
    fn chained(pool: &Pool, len: usize, ops: usize, linked_close: bool) -> Job {
        let source = Source::Path {
            path: Arc::from(Path::new("/nonexistent/lobster-chain")),
            dir: None,
            direct: false,
            to_eof: false,
        };
        let p = Pending::plan(source, 0, len, 0, 7, 1 << 20).unwrap();
        let mut job = Job::new(p, pool.try_acquire(len).unwrap());
        let mut chain = SlotChain::new(3, CString::new("x").unwrap());
        chain.pushed(ops, linked_close);
        job.opened = Opened::Slot(chain);
        job
    }

    fn done(next: ChainNext) -> Result<(), ReadError> {
        match next {
            ChainNext::Done(result) => result,
            other => panic!("expected Done, got {other:?}"),
        }
    }

    #[test]
    fn a_chain_finishes_only_after_its_file_is_closed() {
        let pool = Pool::new(1 << 20, 1 << 16).unwrap();
        use ChainOp::*;

        // open, read, close all succeed.
        let mut job = chained(&pool, 100, 3, true);
        assert!(matches!(job.on_chain_result(Open, 0), ChainNext::Wait));
        assert!(matches!(job.on_chain_result(Read, 100), ChainNext::Wait));
        assert!(done(job.on_chain_result(Close, 0)).is_ok());

        // The open fails: read and close were cancelled, nothing to close.
        let mut job = chained(&pool, 100, 3, true);
        assert!(matches!(
            job.on_chain_result(Open, -libc::ENOENT),
            ChainNext::Wait
        ));
        assert!(matches!(
            job.on_chain_result(Read, -libc::ECANCELED),
            ChainNext::Wait
        ));
        let err = done(job.on_chain_result(Close, -libc::ECANCELED)).unwrap_err();
        assert!(matches!(err, ReadError::Open { .. }), "{err:?}");
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));

        // A short read at the end of the file breaks the link: the close must be resent.
        let mut job = chained(&pool, 100, 3, true);
        assert!(matches!(job.on_chain_result(Open, 0), ChainNext::Wait));
        assert!(matches!(job.on_chain_result(Read, 0), ChainNext::Wait));
        assert!(matches!(
            job.on_chain_result(Close, -libc::ECANCELED),
            ChainNext::Close
        ));
        if let Opened::Slot(chain) = &mut job.opened {
            chain.pushed(1, true);
        }
        let err = done(job.on_chain_result(Close, 0)).unwrap_err();
        assert!(
            matches!(err, ReadError::UnexpectedEof { file_end: 0, .. }),
            "{err:?}"
        );

        // A retried read: the next read goes in; the close follows the last read.
        let mut job = chained(&pool, 100, 3, true);
        assert!(matches!(job.on_chain_result(Open, 0), ChainNext::Wait));
        assert!(matches!(
            job.on_chain_result(Read, -libc::EAGAIN),
            ChainNext::Read
        ));
        if let Opened::Slot(chain) = &mut job.opened {
            chain.pushed(1, false);
        }
        assert!(matches!(
            job.on_chain_result(Close, -libc::ECANCELED),
            ChainNext::Wait
        ));
        assert!(matches!(job.on_chain_result(Read, 100), ChainNext::Close));
        if let Opened::Slot(chain) = &mut job.opened {
            chain.pushed(1, true);
        }
        assert!(done(job.on_chain_result(Close, 0)).is_ok());

        // A failed close is the completion's error once the bytes are read.
        let mut job = chained(&pool, 100, 2, false);
        assert!(matches!(job.on_chain_result(Open, 0), ChainNext::Wait));
        assert!(matches!(job.on_chain_result(Read, 100), ChainNext::Close));
        if let Opened::Slot(chain) = &mut job.opened {
            chain.pushed(1, true);
        }
        let err = done(job.on_chain_result(Close, -libc::EBADF)).unwrap_err();
        assert!(matches!(err, ReadError::Close { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/lobster-chain"));
    }
}
