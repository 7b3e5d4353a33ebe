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

    /// Gives the pages of `[offset, offset + len)` back to the system (MADV_DONTNEED): they
    /// read as zeros when next touched, and are not resident until then.
    ///
    /// # Safety
    /// Nothing may use the range's bytes meanwhile, and no kernel object may hold its pages
    /// pinned (a buffer registered with io_uring): a pinned page would go on receiving
    /// writes that the mapping no longer shows.
    pub(crate) unsafe fn release(&self, offset: usize, len: usize) {
        debug_assert!(offset % 4096 == 0 && offset + len <= self.len);
        // SAFETY: the range lies inside the mapping (checked by the callers' page
        // arithmetic), and the caller vouches that nobody uses or pins it.
        let rc = unsafe {
            libc::madvise(
                self.base.as_ptr().add(offset).cast(),
                len,
                libc::MADV_DONTNEED,
            )
        };
        // Only EINVAL or ENOMEM for a range outside the mapping, which cannot be; the pages
        // then stay resident, which is no harm.
        debug_assert_eq!(rc, 0, "madvise of a range inside the mapping");
    }
}

#[cfg(test)]
impl Mapping {
    /// Pages of the mapping resident now (mincore).
    pub(crate) fn resident_pages(&self) -> usize {
        let pages = self.len.div_ceil(4096);
        let mut vec = vec![0u8; pages];
        // SAFETY: the range is the whole mapping and `vec` has a byte per page.
        let rc = unsafe { libc::mincore(self.base.as_ptr().cast(), self.len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
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
