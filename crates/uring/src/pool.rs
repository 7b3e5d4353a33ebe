//! A bounded pool of page-aligned buffers, handed out as `Bytes` without copying.

use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;

/// Alignment of every buffer: a page, which covers every O_DIRECT memory alignment we accept.
pub(crate) const BUFFER_ALIGN: usize = 4096;

/// Fixed-count pool of fixed-size buffers in one anonymous mapping (pages are only backed
/// once touched, so a large pool costs address space, not memory, until used).
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    base: NonNull<u8>,
    map_len: usize,
    buffer_size: usize,
    count: usize,
    free: Mutex<FreeList>,
    available: Condvar,
}

#[derive(Debug)]
struct FreeList {
    free: Vec<u32>,
    waiters: usize,
}

// SAFETY: the mapping is owned by PoolInner and each buffer is handed to at most one PoolBuf
// at a time (the free list is behind a Mutex), so sharing the base pointer is sound.
unsafe impl Send for PoolInner {}
// SAFETY: see Send; PoolInner itself only exposes the pointer through PoolBuf ownership.
unsafe impl Sync for PoolInner {}

impl Pool {
    /// Maps `count` buffers of `buffer_size` bytes (rounded up to [`BUFFER_ALIGN`]).
    pub(crate) fn new(count: usize, buffer_size: usize) -> std::io::Result<Pool> {
        let buffer_size = buffer_size.div_ceil(BUFFER_ALIGN) * BUFFER_ALIGN;
        let map_len = buffer_size
            .checked_mul(count)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).expect("mmap returned null");
        // Reversed so that pop() hands out low indices first.
        let free = (0..count as u32).rev().collect();
        Ok(Pool {
            inner: Arc::new(PoolInner {
                base,
                map_len,
                buffer_size,
                count,
                free: Mutex::new(FreeList { free, waiters: 0 }),
                available: Condvar::new(),
            }),
        })
    }

    pub(crate) fn buffer_size(&self) -> usize {
        self.inner.buffer_size
    }

    pub(crate) fn count(&self) -> usize {
        self.inner.count
    }

    pub(crate) fn free_count(&self) -> usize {
        self.inner.lock().free.len()
    }

    /// One iovec per buffer, index `i` describing buffer `i` (for `register_buffers`).
    pub(crate) fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.inner.count)
            .map(|i| libc::iovec {
                iov_base: self.inner.buffer_ptr(i as u32).cast(),
                iov_len: self.inner.buffer_size,
            })
            .collect()
    }

    /// Takes a buffer, waiting until one is returned if the pool is empty.
    pub(crate) fn acquire(&self) -> PoolBuf {
        let mut list = self.inner.lock();
        loop {
            if let Some(index) = list.free.pop() {
                return PoolBuf {
                    pool: self.inner.clone(),
                    index,
                };
            }
            list.waiters += 1;
            list = self
                .inner
                .available
                .wait(list)
                .unwrap_or_else(|e| e.into_inner());
            list.waiters -= 1;
        }
    }

    /// Takes a buffer if one is free.
    pub(crate) fn try_acquire(&self) -> Option<PoolBuf> {
        let index = self.inner.lock().free.pop()?;
        Some(PoolBuf {
            pool: self.inner.clone(),
            index,
        })
    }
}

impl PoolInner {
    fn lock(&self) -> MutexGuard<'_, FreeList> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn buffer_ptr(&self, index: u32) -> *mut u8 {
        debug_assert!((index as usize) < self.count);
        // SAFETY: index < count, so the offset stays inside the mapping of map_len bytes.
        unsafe { self.base.as_ptr().add(index as usize * self.buffer_size) }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // SAFETY: every PoolBuf holds an Arc to this PoolInner, so none is alive and nothing
        // (kernel included: the engines hold a Pool until their last read completed) uses
        // the mapping any more.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.map_len);
        }
    }
}

/// Exclusive ownership of one pool buffer; returns it to the pool on drop.
#[derive(Debug)]
pub(crate) struct PoolBuf {
    pool: Arc<PoolInner>,
    index: u32,
}

impl PoolBuf {
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    pub(crate) fn capacity(&self) -> usize {
        self.pool.buffer_size
    }

    /// Start of the buffer. Writing through it is allowed while this `PoolBuf` is owned and
    /// no `Bytes` made from it exists.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.pool.buffer_ptr(self.index)
    }

    /// Hands out `[start, start + len)` of the buffer as `Bytes`, without copying. The buffer
    /// returns to the pool when the last clone of the `Bytes` drops.
    pub(crate) fn into_bytes(self, start: usize, len: usize) -> Bytes {
        assert!(start + len <= self.capacity(), "slice outside the buffer");
        Bytes::from_owner(PoolSlice {
            buf: self,
            start,
            len,
        })
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        let mut list = self.pool.lock();
        list.free.push(self.index);
        let wake = list.waiters > 0;
        drop(list);
        if wake {
            self.pool.available.notify_one();
        }
    }
}

struct PoolSlice {
    buf: PoolBuf,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for PoolSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the range is inside the buffer (checked in into_bytes); the buffer is owned
        // by this slice and no longer written (its read completed before into_bytes).
        unsafe {
            std::slice::from_raw_parts(
                self.buf.pool.buffer_ptr(self.buf.index).add(self.start),
                self.len,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_and_return_on_last_drop() {
        let pool = Pool::new(2, 5000).unwrap();
        assert_eq!(pool.buffer_size(), 8192);
        let mut a = pool.acquire();
        assert_eq!(a.as_mut_ptr() as usize % BUFFER_ALIGN, 0);
        // SAFETY: `a` is exclusively owned and within its 8192 bytes.
        unsafe { std::ptr::write_bytes(a.as_mut_ptr(), 7, 100) };
        let b = pool.acquire();
        assert!(pool.try_acquire().is_none());
        let bytes = a.into_bytes(10, 20);
        let clone = bytes.slice(5..);
        assert_eq!(&bytes[..], &[7u8; 20][..]);
        drop(bytes);
        assert_eq!(pool.free_count(), 0, "a clone still refers to the buffer");
        drop(clone);
        assert_eq!(pool.free_count(), 1);
        drop(b);
        assert_eq!(pool.free_count(), 2);
    }

    #[test]
    fn acquire_waits_for_a_returned_buffer() {
        let pool = Pool::new(1, 4096).unwrap();
        let held = pool.acquire();
        let p2 = pool.clone();
        let t = std::thread::spawn(move || p2.acquire().index());
        drop(held);
        assert_eq!(t.join().unwrap(), 0);
    }
}
