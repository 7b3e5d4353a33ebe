//! The tier's system calls: extents written and read whole (with O_DIRECT from buffers
//! aligned to [`BLOCK_BYTES`], found inside a larger `Vec`, so no allocator call is unsafe),
//! the probe of O_DIRECT, and the lock of a tier's directory.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use bytes::Bytes;

use crate::alloc::BLOCK_BYTES;

const ALIGN: usize = BLOCK_BYTES as usize;

/// `len` zeroed bytes starting at an address aligned to [`BLOCK_BYTES`], within `buf`.
struct AlignedBuf {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn zeroed(len: usize) -> AlignedBuf {
        let buf = vec![0u8; len + ALIGN];
        let start = buf.as_ptr().align_offset(ALIGN);
        assert!(start < ALIGN, "no aligned start in {} bytes", buf.len());
        AlignedBuf { buf, start, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }

    fn as_ref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    /// The first `len` bytes, without a copy.
    fn into_bytes(self, len: usize) -> Bytes {
        let start = self.start;
        Bytes::from(self.buf).slice(start..start + len.min(self.len))
    }
}

/// Opens (creating) a segment file, with O_DIRECT if `direct`.
pub(crate) fn open_segment(path: &Path, direct: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).mode(0o600);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path)
}

/// Writes `bytes` at `offset` (aligned). With O_DIRECT the whole extent of `extent_len`
/// bytes is written, zero-padded, from an aligned copy; else `bytes` alone.
pub(crate) fn write_extent(
    file: &File,
    offset: u64,
    bytes: &[u8],
    extent_len: usize,
    direct: bool,
) -> io::Result<()> {
    if !direct {
        return file.write_all_at(bytes, offset);
    }
    let mut buf = AlignedBuf::zeroed(extent_len);
    buf.as_mut()[..bytes.len()].copy_from_slice(bytes);
    file.write_all_at(buf.as_ref(), offset)
}

/// Reads up to `len` bytes at `offset` (aligned), fewer if the file ends first. With
/// O_DIRECT the whole extent of `extent_len` bytes is read into an aligned buffer.
pub(crate) fn read_extent(
    file: &File,
    offset: u64,
    len: usize,
    extent_len: usize,
    direct: bool,
) -> io::Result<Bytes> {
    let want = if direct { extent_len } else { len };
    let mut buf = AlignedBuf::zeroed(want);
    let mut got = 0;
    while got < want {
        match file.read_at(&mut buf.as_mut()[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        // After a short O_DIRECT read the next offset is not aligned: the file has ended.
        if direct && got % ALIGN != 0 {
            break;
        }
    }
    Ok(buf.into_bytes(got.min(len)))
}

/// Whether files in `dir` take O_DIRECT: a block written with it and read back the same
/// (tmpfs refuses the open; some file systems refuse only the I/O). The probe file is
/// removed.
pub(crate) fn probe_direct(dir: &Path) -> bool {
    let path = dir.join("probe");
    let result = (|| -> io::Result<bool> {
        let file = open_segment(&path, true)?;
        let mut block = AlignedBuf::zeroed(ALIGN);
        for (i, b) in block.as_mut().iter_mut().enumerate() {
            *b = i as u8;
        }
        file.write_all_at(block.as_ref(), 0)?;
        let back = read_extent(&file, 0, ALIGN, ALIGN, true)?;
        Ok(back[..] == *block.as_ref())
    })();
    let _ = std::fs::remove_file(&path);
    result.unwrap_or(false)
}

/// An exclusive lock on `dir`, held while the returned file is open; `None` if another
/// open file holds it (in this process or another).
pub(crate) fn lock_dir(dir: &Path) -> io::Result<Option<File>> {
    let file = File::open(dir)?;
    loop {
        // SAFETY: flock takes a descriptor, which `file` keeps open across the call, and
        // integer flags; it touches no memory of ours.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(Some(file));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(None),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed_at_any_length() {
        for len in [0, 1, 4095, 4096, 10_000] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_mut().as_ptr() as usize % ALIGN, 0);
            assert!(b.as_ref().iter().all(|&x| x == 0));
            assert_eq!(b.into_bytes(len).len(), len);
        }
    }

    #[test]
    fn extents_read_back_what_was_written_with_or_without_o_direct() {
        let dir = tempfile::tempdir().unwrap();
        let direct = probe_direct(dir.path());
        if !direct {
            eprintln!("no O_DIRECT in {}: buffered only", dir.path().display());
        }
        for mode in [false, direct] {
            let file = open_segment(&dir.path().join(format!("s{mode}")), mode).unwrap();
            let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
            write_extent(&file, 8192, &data, 8192, mode).unwrap();
            let back = read_extent(&file, 8192, 5000, 8192, mode).unwrap();
            assert_eq!(&back[..], &data[..]);
            // Past the end of the file: nothing.
            assert!(read_extent(&file, 1 << 20, 10, 4096, mode)
                .unwrap()
                .is_empty());
        }
    }

    #[test]
    fn a_locked_directory_refuses_a_second_lock_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_dir(dir.path()).unwrap().expect("first lock");
        assert!(lock_dir(dir.path()).unwrap().is_none());
        drop(first);
        assert!(lock_dir(dir.path()).unwrap().is_some());
    }
}
