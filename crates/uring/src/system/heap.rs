//! The C heap's free pages given back to the system.

/// Gives the C heap's free pages back to the system (glibc's `malloc_trim`). Decode buffers
/// and cached copies are freed in another order than they came, on many threads, so a long
/// run leaves free pages resident inside the allocator's arenas and resident memory creeps
/// up epoch after epoch though the live heap does not; a loader calls this once an epoch.
/// Elsewhere than glibc it does nothing.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists, under its own locks, and
    // returns free pages inside them with madvise; no memory in use is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releasing_leaves_live_memory_intact() {
        let live: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 100_000]).collect();
        let freed: Vec<Vec<u8>> = (0..64).map(|_| vec![0u8; 100_000]).collect();
        drop(freed);
        release_free_heap();
        for (i, v) in live.iter().enumerate() {
            assert!(v.iter().all(|&b| b == i as u8));
        }
    }
}
