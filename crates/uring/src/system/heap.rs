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

/// Holds the C heap's thresholds where they are set (glibc's `M_MMAP_THRESHOLD`, from which
/// an allocation gets a mapping of its own, and `M_TRIM_THRESHOLD`, the free top of the heap
/// kept rather than given back at once); returns whether the allocator took both.
///
/// Left to itself, glibc raises the mmap threshold to the size of each large block freed, and
/// the trim threshold to twice that; decode threads' arenas then keep growing, and a loader's
/// resident memory creeps up for hundreds of epochs (BENCHMARKS.md, "Soak memory over 420
/// epochs"). Held (the `lobster` command: 1 MiB and 64 MiB, at start) the level is lower and
/// holds: decoded images under the mmap threshold still come from the arenas, larger ones
/// come and go as mappings, and a high trim threshold spares the heap's top a give-back and
/// fault-in per image (the loader trims once an epoch). A process-wide choice: an embedder
/// may call this or set `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_`. Elsewhere
/// than glibc it does nothing and returns false.
pub fn hold_heap_thresholds(mmap_bytes: usize, trim_bytes: usize) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let (Ok(mmap), Ok(trim)) = (
            libc::c_int::try_from(mmap_bytes),
            libc::c_int::try_from(trim_bytes),
        ) else {
            return false;
        };
        // SAFETY: mallopt only sets parameters of the allocator, under its own lock.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = (mmap_bytes, trim_bytes);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn thresholds_past_an_int_are_refused_and_held_ones_leave_allocation_working() {
        assert!(!hold_heap_thresholds(usize::MAX, 1 << 26));
        assert!(!hold_heap_thresholds(1 << 20, usize::MAX));
        // Whether the allocator takes them is glibc's (a sanitizer's allocator refuses).
        hold_heap_thresholds(1 << 20, 1 << 26);
        let v = vec![7u8; 4 << 20];
        assert!(v.iter().all(|&b| b == 7));
    }

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
