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

/// Where a process holds the C heap (glibc's `M_MMAP_THRESHOLD`, `M_TRIM_THRESHOLD` and
/// `M_ARENA_MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapLimits {
    /// From this size an allocation gets a mapping of its own, given back when freed.
    pub mmap_threshold_bytes: usize,
    /// Free memory at the top of an arena beyond this goes back to the system when freed.
    pub trim_threshold_bytes: usize,
    /// Arenas the threads share; `None` leaves glibc's (eight per core).
    pub arenas: Option<usize>,
}

impl HeapLimits {
    /// What `lobster` holds: mmap and trim at 1 MiB, one arena per core.
    ///
    /// Left to itself, glibc raises the mmap threshold to the size of each large block freed
    /// and the trim threshold to twice that, and never shrinks a thread arena's top below
    /// it: each of the decode threads' arenas keeps the most it ever held, and resident
    /// memory creeps up for hundreds of epochs as rarer highs come (docs/benchmarks/
    /// reliability.md, "Soak memory over 420 epochs"). Held, an arena keeps at most 1 MiB free at its top, and
    /// with one arena per core (threads beyond the cores do not allocate at once) the
    /// arenas' free tops add up to little. Decoded images under 1 MiB still come from the
    /// arenas; the decode-bound run's throughput is unchanged within its spread.
    pub fn for_loader(cores: usize) -> Self {
        HeapLimits {
            mmap_threshold_bytes: 1 << 20,
            trim_threshold_bytes: 1 << 20,
            arenas: Some(cores.max(1)),
        }
    }
}

/// Holds the C heap where `limits` say, for the whole process; returns whether the allocator
/// took every one. Call it before threads start. An embedder may call this or set glibc's
/// `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` and `MALLOC_ARENA_MAX`. Elsewhere than
/// glibc it does nothing and returns false.
pub fn hold_heap(limits: HeapLimits) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let arenas = limits.arenas.map(libc::c_int::try_from);
        let (Ok(mmap), Ok(trim)) = (
            libc::c_int::try_from(limits.mmap_threshold_bytes),
            libc::c_int::try_from(limits.trim_threshold_bytes),
        ) else {
            return false;
        };
        if matches!(arenas, Some(Err(_)) | Some(Ok(0))) {
            return false;
        }
        // SAFETY: mallopt only sets parameters of the allocator, under its own lock.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
                && match arenas {
                    Some(Ok(n)) => libc::mallopt(libc::M_ARENA_MAX, n) == 1,
                    _ => true,
                }
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = limits;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn limits_past_an_int_or_no_arena_are_refused_and_held_ones_leave_allocation_working() {
        let held = HeapLimits::for_loader(2);
        assert!(!hold_heap(HeapLimits {
            mmap_threshold_bytes: usize::MAX,
            ..held
        }));
        assert!(!hold_heap(HeapLimits {
            trim_threshold_bytes: usize::MAX,
            ..held
        }));
        assert!(!hold_heap(HeapLimits {
            arenas: Some(0),
            ..held
        }));
        assert!(!hold_heap(HeapLimits {
            arenas: Some(usize::MAX),
            ..held
        }));
        // Whether the allocator takes them is glibc's (a sanitizer's allocator refuses).
        hold_heap(held);
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
