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

/// What [`read_resident`] found.
#[derive(Debug)]
pub enum Resident {
    /// Every byte up to the end of the file, read without waiting: at most `len + 1` bytes,
    /// so a file that grew past `len` shows as one byte too long.
    Read(Bytes),
    /// Some of the file is not in the page cache: read it from storage.
    NotResident,
    /// The kernel refuses non-blocking buffered reads of this file (`EOPNOTSUPP`): never
    /// resident as far as this path can tell.
    Unsupported,
}

/// Reads `path` (expected to hold `len` bytes) if the page cache holds all of it.
///
/// # Errors
/// The file cannot be opened or the read fails for another reason than not being resident;
/// the error names the path.
pub fn read_resident(path: &Path, len: usize) -> Result<Resident, io::Error> {
    let file = File::open(path).map_err(|e| named(path, e))?;
    let want = len + 1;
    let mut buf: Vec<u8> = Vec::with_capacity(want);
    loop {
        let spare = buf.spare_capacity_mut();
        if spare.is_empty() {
            break;
        }
        let iov = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: spare.len(),
        };
        // SAFETY: `iov` points into `buf`'s spare capacity, which nothing else uses during
        // the call; `file` is open for the whole call.
        let n = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                &iov,
                1,
                buf.len() as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => Ok(Resident::NotResident),
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => Ok(Resident::Unsupported),
                _ => Err(named(path, e)),
            };
        }
        if n == 0 {
            break;
        }
        // SAFETY: the kernel wrote `n` initialised bytes at the start of the spare capacity,
        // and `n <= spare.len()`.
        unsafe { buf.set_len(buf.len() + n as usize) };
    }
    Ok(Resident::Read(Bytes::from(buf)))
}

fn named(path: &Path, e: io::Error) -> io::Error {
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
        match read_resident(&path, data.len()).unwrap() {
            Resident::Read(b) => assert_eq!(&b[..], &data[..]),
            Resident::Unsupported => eprintln!("skipped: RWF_NOWAIT refused by this kernel"),
            Resident::NotResident => panic!("a file just written is in the page cache"),
        }
    }

    #[test]
    fn a_file_longer_than_expected_reads_one_byte_more_and_a_shorter_one_reads_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 100]).unwrap();
        if let Resident::Read(b) = read_resident(&path, 50).unwrap() {
            assert_eq!(b.len(), 51);
        }
        if let Resident::Read(b) = read_resident(&path, 200).unwrap() {
            assert_eq!(b.len(), 100);
        }
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let err = read_resident(Path::new("/nonexistent/lobster-sample"), 1).unwrap_err();
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
        match read_resident(&path, 1 << 20).unwrap() {
            Resident::NotResident => {}
            Resident::Unsupported => eprintln!("skipped: RWF_NOWAIT refused by this kernel"),
            // tmpfs keeps its pages: nothing to drop there.
            Resident::Read(_) => {
                eprintln!("skipped: {} keeps pages resident", dir.path().display())
            }
        }
    }
}
