//! Reads of files whose bytes are already in the page cache, on the caller's thread and
//! without waiting for storage (`preadv2` with `RWF_NOWAIT`).
//!
//! A page-cache hit costs a memory copy; sending it through a ring and another thread costs
//! more than the copy. The caller tries here first and sends what is not resident to the
//! reader.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use bytes::Bytes;

use crate::file_ref::FileRef;

/// What [`read_resident`] found.
#[derive(Debug)]
pub enum Resident {
    /// The bytes asked for, read without waiting: `len` of them, fewer if the file ends
    /// first (ask one byte more than a whole file should hold to see whether it grew).
    /// `pooled`: the bytes hold a block of the reader's pool until dropped (keep a copy to
    /// hold them long).
    Read { bytes: Bytes, pooled: bool },
    /// Some of the file is not in the page cache: read it from storage.
    NotResident,
    /// The kernel refuses non-blocking buffered reads of this file (`EOPNOTSUPP`): never
    /// resident as far as this path can tell.
    Unsupported,
}

/// Reads `len` bytes of `path` from `offset` (fewer if the file ends first) if the page
/// cache holds all of them, into a buffer of its own. [`crate::Reader::read_resident`] reads
/// into the reader's pool instead.
///
/// # Errors
/// The file cannot be opened or the read fails for another reason than not being resident;
/// the error names the path.
pub fn read_resident<'a>(
    file: impl Into<FileRef<'a>>,
    offset: u64,
    len: usize,
) -> Result<Resident, io::Error> {
    let file = file.into();
    let path = file.path;
    let file = file.open(0).map_err(|e| named(path, e))?;
    read_into_own_buffer(&file, path, offset, len)
}

/// [`read_resident`] once the file is open, into a buffer of its own.
pub(crate) fn read_into_own_buffer(
    file: &File,
    path: &Path,
    offset: u64,
    len: usize,
) -> Result<Resident, io::Error> {
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    // SAFETY: the vector's spare capacity holds `len` bytes nothing else uses.
    let filled = unsafe { fill_nowait(file, offset, buf.as_mut_ptr(), len) };
    Ok(filled.map_err(|e| named(path, e))?.resident(|n| {
        // SAFETY: `fill_nowait` initialised the first `n <= len` bytes.
        unsafe { buf.set_len(n) };
        (Bytes::from(buf), false)
    }))
}

pub(crate) enum Fill {
    Read(usize),
    NotResident,
    Unsupported,
}

impl Fill {
    /// What the caller gets: for `n` bytes read, the bytes `read(n)` makes of its buffer and
    /// whether they hold a pool block.
    pub(crate) fn resident(self, read: impl FnOnce(usize) -> (Bytes, bool)) -> Resident {
        match self {
            Fill::Read(n) => {
                let (bytes, pooled) = read(n);
                Resident::Read { bytes, pooled }
            }
            Fill::NotResident => Resident::NotResident,
            Fill::Unsupported => Resident::Unsupported,
        }
    }
}

/// Pages are at least this large (and a multiple of it) on every Linux target.
const EOF_PROOF_ALIGN_BYTES: u64 = 4096;

/// Reads `file` from `offset` into `base[..cap]` without waiting for storage, up to `cap`
/// bytes or the end of the file.
///
/// # Safety
/// `base` must be valid for writes of `cap` bytes, used by nothing else during the call.
pub(crate) unsafe fn fill_nowait(
    file: &File,
    offset: u64,
    base: *mut u8,
    cap: usize,
) -> io::Result<Fill> {
    let mut done = 0;
    while done < cap {
        let iov = libc::iovec {
            // SAFETY: `done < cap`, inside the buffer the caller vouches for.
            iov_base: unsafe { base.add(done) }.cast(),
            iov_len: cap - done,
        };
        // SAFETY: `iov` covers the rest of the caller's buffer; `file` is open.
        let n = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                &iov,
                1,
                (offset + done as u64) as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => Ok(Fill::NotResident),
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => Ok(Fill::Unsupported),
                _ => Err(e),
            };
        }
        if n == 0 {
            break;
        }
        done += n as usize;
        // A non-blocking read stops short where a page is not cached, which is at a page
        // boundary; short inside a page, it stopped at the end of the file. That spares the
        // empty read that would say so (asking one byte more than a whole file holds).
        if done < cap && (offset + done as u64) % EOF_PROOF_ALIGN_BYTES != 0 {
            break;
        }
    }
    Ok(Fill::Read(done))
}

pub(crate) fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_just_written_is_resident_and_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        match read_resident(&path, 0, data.len() + 1).unwrap() {
            Resident::Read { bytes: b, .. } => assert_eq!(&b[..], &data[..]),
            Resident::Unsupported => eprintln!("skipped: RWF_NOWAIT refused by this kernel"),
            Resident::NotResident => panic!("a file just written is in the page cache"),
        }
    }

    #[test]
    fn a_file_longer_than_expected_reads_one_byte_more_and_a_shorter_one_reads_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 100]).unwrap();
        if let Resident::Read { bytes: b, .. } = read_resident(&path, 0, 51).unwrap() {
            assert_eq!(b.len(), 51);
        }
        if let Resident::Read { bytes: b, .. } = read_resident(&path, 0, 201).unwrap() {
            assert_eq!(b.len(), 100);
        }
    }

    #[test]
    fn a_file_ending_at_or_beside_a_page_boundary_is_read_whole_and_its_growth_shows() {
        // A short read inside a page ends the read; at a page boundary it asks again. Either
        // way the bytes are the file's, and one byte more than expected shows a grown file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        for size in [1, 4095, 4096, 4097, 8191, 8192, 8193, 3 * 4096 + 100] {
            let data: Vec<u8> = (0..size as u32).map(|i| (i % 251) as u8).collect();
            std::fs::write(&path, &data).unwrap();
            // Asked one byte more than it holds (intact), and as much as it holds (expected
            // one byte shorter: grown, which the extra byte shows).
            for asked in [size + 1, size] {
                match read_resident(&path, 0, asked).unwrap() {
                    Resident::Read { bytes, .. } => {
                        assert_eq!(&bytes[..], &data[..], "size {size}, asked {asked}")
                    }
                    Resident::Unsupported => return eprintln!("skipped: RWF_NOWAIT refused"),
                    Resident::NotResident => panic!("a file just written is in the page cache"),
                }
            }
        }
    }

    #[test]
    fn a_range_reads_from_its_offset_and_ends_with_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        for (offset, len, want) in [
            (30, 20, 30..50),
            (4090, 10, 4090..4100),
            (8990, 50, 8990..9000),
        ] {
            match read_resident(&path, offset, len).unwrap() {
                Resident::Read { bytes, .. } => assert_eq!(&bytes[..], &data[want], "{offset}"),
                Resident::Unsupported => return eprintln!("skipped: RWF_NOWAIT refused"),
                Resident::NotResident => panic!("a file just written is in the page cache"),
            }
        }
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let err = read_resident(Path::new("/nonexistent/lobster-sample"), 0, 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string().contains("/nonexistent/lobster-sample"),
            "{err}"
        );
    }

    #[test]
    fn pages_dropped_from_the_cache_are_not_resident() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![3u8; 1 << 20]).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        // SAFETY: a plain advice call on an open descriptor.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        match read_resident(&path, 0, 1 << 20).unwrap() {
            Resident::NotResident => {}
            Resident::Unsupported => eprintln!("skipped: RWF_NOWAIT refused by this kernel"),
            // tmpfs keeps its pages: nothing to drop there.
            Resident::Read { .. } => {
                eprintln!("skipped: {} keeps pages resident", dir.path().display())
            }
        }
    }
}
