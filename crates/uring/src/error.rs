//! The reader's error type.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::types::FileId;

/// Why a read, an open or the reader's setup failed.
///
/// Every variant about a read names the file, the requested range and, where the kernel
/// reported one, the OS error.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReadError {
    /// Opening `path` failed: missing file, no permission, a directory, O_DIRECT refused.
    Open {
        /// The file that was opened.
        path: PathBuf,
        /// The OS error (`EISDIR` for a directory).
        source: io::Error,
    },
    /// Closing a file opened for a read by path ([`crate::Session::submit_path`]) failed
    /// after its bytes were read.
    Close {
        /// The file that was closed.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The kernel failed the read with an OS error (after retrying EAGAIN/EINTR/EBUSY).
    Read {
        /// The file read.
        path: PathBuf,
        /// First byte requested.
        offset: u64,
        /// Bytes requested.
        len: usize,
        /// The OS error.
        source: io::Error,
    },
    /// The file ended before `offset + len`: a read past EOF, or the file shrank after it
    /// was opened.
    UnexpectedEof {
        /// The file read.
        path: PathBuf,
        /// First byte requested.
        offset: u64,
        /// Bytes requested.
        len: usize,
        /// Where the file ended when it was read.
        file_end: u64,
    },
    /// The request (plus O_DIRECT alignment) is larger than the largest read accepted.
    TooLarge {
        /// The file the request named.
        path: PathBuf,
        /// First byte requested.
        offset: u64,
        /// Bytes requested.
        len: usize,
        /// The largest read accepted ([`crate::ReaderConfig::max_read_bytes`]).
        max_read_bytes: usize,
    },
    /// The request named a class the reader was not built with.
    InvalidClass {
        /// The class given.
        class: usize,
        /// Number of classes configured.
        classes: usize,
    },
    /// The request named a file that is not open on this reader (never opened or closed).
    UnknownFile {
        /// The id given.
        file: FileId,
    },
    /// A configuration parameter is out of range.
    InvalidConfig {
        /// The parameter's name.
        parameter: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The io_uring backend was forced but could not be set up, or a session's ring or a
    /// backend thread could not be.
    Setup {
        /// What was being set up.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// A session's class queue or the buffer pool was full while the session had reads
    /// pending; nothing was queued (see [`crate::Session::submit_batch`]).
    WouldBlock {
        /// Which bound was reached: `"buffer pool"` or `"class queue"`.
        bound: &'static str,
    },
    /// `io_uring_enter` failed on a session's ring (not an error of one read); the
    /// session's reads stay pending and a later call may succeed.
    Enter {
        /// The OS error.
        source: io::Error,
    },
}

impl ReadError {
    /// The OS error behind this error, if there is one.
    pub fn os_error(&self) -> Option<&io::Error> {
        match self {
            ReadError::Open { source, .. }
            | ReadError::Close { source, .. }
            | ReadError::Read { source, .. }
            | ReadError::Setup { source, .. }
            | ReadError::Enter { source } => Some(source),
            _ => None,
        }
    }

    /// The raw errno behind this error, if there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.os_error().and_then(io::Error::raw_os_error)
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Open { path, source } => {
                write!(f, "cannot open {}: {source}", path.display())
            }
            ReadError::Close { path, source } => {
                write!(f, "cannot close {} after reading it: {source}", path.display())
            }
            ReadError::Read {
                path,
                offset,
                len,
                source,
            } => write!(
                f,
                "read of {len} bytes at offset {offset} of {} failed: {source}",
                path.display()
            ),
            ReadError::UnexpectedEof {
                path,
                offset,
                len,
                file_end,
            } => write!(
                f,
                "read of {len} bytes at offset {offset} of {} is short: the file ends at byte {file_end}",
                path.display()
            ),
            ReadError::TooLarge {
                path,
                offset,
                len,
                max_read_bytes,
            } => write!(
                f,
                "read of {len} bytes at offset {offset} of {} (widened to the O_DIRECT alignment) exceeds max_read_bytes = {max_read_bytes}",
                path.display()
            ),
            ReadError::InvalidClass { class, classes } => {
                write!(f, "class {class} does not exist (the reader has {classes} classes)")
            }
            ReadError::UnknownFile { file } => write!(f, "{file:?} is not open on this reader"),
            ReadError::InvalidConfig { parameter, reason } => {
                write!(f, "invalid reader configuration `{parameter}`: {reason}")
            }
            ReadError::Setup { what, source } => {
                write!(f, "io_uring setup failed ({what}): {source}")
            }
            ReadError::WouldBlock { bound } => write!(f, "the {bound} is full"),
            ReadError::Enter { source } => {
                write!(f, "io_uring_enter failed on a session's ring: {source}")
            }
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.os_error().map(|e| e as _)
    }
}
