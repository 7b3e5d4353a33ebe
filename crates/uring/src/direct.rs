//! A blocking O_DIRECT read of a file's range on the caller's thread, into a buffer aligned
//! for the device: what a read-then-decode worker does when the page cache must be bypassed.

use std::alloc::Layout;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use bytes::Bytes;

use crate::files::DEFAULT_DIO_ALIGN;

/// An aligned heap buffer; `len` bytes of it are initialised.
struct Aligned {
    ptr: std::ptr::NonNull<u8>,
    layout: Layout,
    len: usize,
}

// SAFETY: the buffer is owned memory with no thread affinity.
unsafe impl Send for Aligned {}
// SAFETY: shared access only reads it.
unsafe impl Sync for Aligned {}

impl Aligned {
    fn new(capacity: usize) -> io::Result<Aligned> {
        let layout = Layout::from_size_align(capacity.max(1), DEFAULT_DIO_ALIGN as usize)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let ptr = std::ptr::NonNull::new(ptr)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(Aligned {
            ptr,
            layout,
            len: 0,
        })
    }
}

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written by the kernel and are initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Reads `len` bytes of `path` from `offset` with O_DIRECT, fewer if the file ends first.
/// The device reads whole aligned blocks around the range; the range is handed out as a
/// slice of them. Asking one byte more than a whole file should hold tells whether it grew.
///
/// # Errors
/// The file cannot be opened with O_DIRECT (some file systems refuse it) or a read fails;
/// the error names the path.
pub fn read_direct(path: &Path, offset: u64, len: usize) -> io::Result<Bytes> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(named)?;
    let align = DEFAULT_DIO_ALIGN as usize;
    let skip = (offset % align as u64) as usize;
    let start = offset - skip as u64;
    let end = skip + len;
    let capacity = end.next_multiple_of(align).max(align);
    let mut buf = Aligned::new(capacity).map_err(named)?;
    while buf.len < end {
        let want = capacity - buf.len;
        // SAFETY: the range [len, capacity) lies in the buffer, which nothing else uses; the
        // offset and length stay aligned while every read before was whole.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf.ptr.as_ptr().add(buf.len).cast(),
                want,
                (start + buf.len as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(named(e));
        }
        buf.len += n as usize;
        // A short O_DIRECT read is the end of the file.
        if (n as usize) < want {
            break;
        }
    }
    buf.len = buf.len.min(end);
    let read = Bytes::from_owner(buf);
    Ok(read.slice(skip.min(read.len())..))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_whole_file_up_to_len_at_any_size() {
        let dir = tempfile::tempdir().unwrap();
        for size in [0usize, 1, 4095, 4096, 4097, 100_000] {
            let path = dir.path().join(format!("f{size}"));
            let data: Vec<u8> = (0..size).map(|i| (i * 31 + size) as u8).collect();
            std::fs::write(&path, &data).unwrap();
            match read_direct(&path, 0, size + 1) {
                Ok(b) => assert_eq!(&b[..], &data[..], "size {size}"),
                // tmpfs and some others refuse O_DIRECT.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    eprintln!("skipped: no O_DIRECT in {}: {e}", dir.path().display());
                    return;
                }
                Err(e) => panic!("{e}"),
            }
            if size > 1 {
                // Asked for less than the file holds: exactly that much.
                assert_eq!(
                    &read_direct(&path, 0, size - 1).unwrap()[..],
                    &data[..size - 1]
                );
                // A range off the alignment, on either side of a block's end.
                let (offset, len) = (size / 3, size / 2);
                assert_eq!(
                    &read_direct(&path, offset as u64, len).unwrap()[..],
                    &data[offset..offset + len],
                    "size {size}"
                );
            }
        }
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let err = read_direct(Path::new("/nonexistent/lobster-direct"), 0, 10).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/lobster-direct"),
            "{err}"
        );
    }
}
