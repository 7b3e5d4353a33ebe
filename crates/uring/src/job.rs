//! One read from submission to completion: the checked request waiting for a buffer
//! ([`Pending`]) and the job that owns its buffer while both backends drive its reads
//! ([`Job`], folding each result into an [`AfterRead`]).

use std::io;
use std::sync::Arc;

use bytes::Bytes;

use crate::completion::Completion;
use crate::error::ReadError;
use crate::files::FileEntry;
use crate::pool::PoolBuf;
use crate::types::ReadRequest;

/// Largest single O_DIRECT read handed to the kernel; larger requests are read in chunks.
pub(crate) const MAX_DIRECT_CHUNK_BYTES: usize = 1 << 20;
/// How often one read is retried after EAGAIN, EINTR or EBUSY before it fails.
pub(crate) const MAX_RETRIES: u32 = 1000;

/// A checked request without its buffer yet.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(crate) file: Arc<FileEntry>,
    pub(crate) req: ReadRequest,
    /// Where the read starts in the file (the offset, or below it for O_DIRECT alignment).
    pub(crate) read_start: u64,
    /// Bytes read before the requested range (O_DIRECT alignment).
    pub(crate) skip: usize,
    /// Bytes the read needs (after O_DIRECT widening).
    pub(crate) read_len: usize,
}

impl Pending {
    /// The completion of a request cancelled at shutdown before it got a pool buffer.
    pub(crate) fn cancelled(&self) -> Completion {
        let err = ReadError::Cancelled {
            path: self.file.path.clone(),
            offset: self.req.offset,
            len: self.req.len,
        };
        Completion::new(self.req.tag, self.req.class, Err(err), None)
    }
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
pub(crate) enum AfterRead {
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
                path: self.file.path.clone(),
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
        let at_eof = res == 0 || (self.file.direct && self.done as u64 % self.file.align != 0);
        if at_eof || self.done >= self.read_len {
            let read_end = self.read_start + self.done as u64;
            return AfterRead::Done(Err(ReadError::UnexpectedEof {
                path: self.file.path.clone(),
                offset: self.offset,
                len: self.len,
                file_end: file_size(&self.file).map_or(read_end, |size| size.min(read_end)),
            }));
        }
        AfterRead::Again
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
