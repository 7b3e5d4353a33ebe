//! Reads as futures on a tokio-uring runtime (feature `tokio-uring`).

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio_uring::buf::BoundedBuf;

use crate::error::ReadError;
use crate::job::MAX_RETRIES;

/// A file opened on the current tokio-uring runtime, read with the same semantics as
/// [`crate::Reader`]: exact ranges, short reads resumed, EAGAIN/EINTR/EBUSY retried, errors
/// naming path, offset and length.
#[derive(Debug)]
pub struct AsyncFile {
    file: tokio_uring::fs::File,
    path: PathBuf,
}

impl AsyncFile {
    /// Opens `path` read-only. Must be called inside `tokio_uring::start`.
    pub async fn open(path: impl AsRef<Path>) -> Result<AsyncFile, ReadError> {
        let path = path.as_ref().to_path_buf();
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => {
                return Err(ReadError::Open {
                    path,
                    source: io::Error::from_raw_os_error(libc::EISDIR),
                })
            }
            _ => {}
        }
        match tokio_uring::fs::File::open(&path).await {
            Ok(file) => Ok(AsyncFile { file, path }),
            Err(source) => Err(ReadError::Open { path, source }),
        }
    }

    /// Reads exactly `len` bytes at `offset`.
    pub async fn read_exact_at(&self, offset: u64, len: usize) -> Result<Bytes, ReadError> {
        let mut buf: Vec<u8> = Vec::with_capacity(len);
        let mut retries = 0;
        while buf.len() < len {
            let done = buf.len();
            let (res, slice) = self
                .file
                .read_at(buf.slice(done..len), offset + done as u64)
                .await;
            buf = slice.into_inner();
            match res {
                Ok(0) => {
                    return Err(ReadError::UnexpectedEof {
                        path: self.path.clone(),
                        offset,
                        len,
                        file_end: offset + done as u64,
                    })
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EAGAIN | libc::EINTR | libc::EBUSY)
                    ) && retries < MAX_RETRIES =>
                {
                    retries += 1
                }
                Err(source) => {
                    return Err(ReadError::Read {
                        path: self.path.clone(),
                        offset,
                        len,
                        source,
                    })
                }
            }
        }
        Ok(Bytes::from(buf))
    }
}
