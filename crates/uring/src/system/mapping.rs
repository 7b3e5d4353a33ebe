//! A private anonymous memory mapping, unmapped when dropped: the pool's and the cached
//! copies' memory.

use std::ptr::NonNull;

/// `len` bytes of private anonymous memory, read-write.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes (a whole number of pages, not zero); `populate` asks the kernel to
    /// fault the pages in now (MAP_POPULATE).
    pub(crate) fn new(len: usize, populate: bool) -> std::io::Result<Mapping> {
        let populate = if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a fresh private anonymous mapping with no address hint has no
        // preconditions and replaces nothing.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).expect("mmap succeeded with a null address");
        Ok(Mapping { base, len })
    }

    /// The first byte.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was created with this address and length, and its owner drops
        // it only once nothing (the kernel included) uses it any more.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}
