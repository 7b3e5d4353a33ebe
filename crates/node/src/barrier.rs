//! The step barrier of a node's rank processes, in the arena's first page: synchronous
//! training meets every rank at the end of each step (as an all-reduce would), and a failed
//! step is seen by all. Waiting sleeps on a futex in the shared page, waking every
//! [`POLL`] to see whether the job stopped or the host went away.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::arena::SharedArena;

/// Bytes the header takes at the arena's start; slots follow.
pub(crate) const HEADER_BYTES: u64 = 4096;

/// How often a waiting rank looks up from the futex.
const POLL: Duration = Duration::from_millis(50);

/// The shared words. `repr(C)`: every process maps the same layout.
#[repr(C)]
struct Header {
    /// Ranks arrived at the current barrier.
    arrived: AtomicU32,
    /// Bumped when the last rank arrives: the word waiters sleep on.
    generation: AtomicU32,
    /// Non-zero once the job stopped (a rank went away): set by the host.
    stopped: AtomicU32,
    _pad: u32,
    /// The first step that failed on some rank (`u64::MAX`: none).
    failed_step: AtomicU64,
}

/// Why a barrier wait ended without every rank arriving.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Broken {
    /// The host marked the job stopped.
    Stopped,
    /// The caller's liveness check failed (the host went away).
    Dead,
}

/// The header of `arena`.
fn header(arena: &SharedArena) -> &Header {
    const _: () = assert!(std::mem::size_of::<Header>() as u64 <= HEADER_BYTES);
    // SAFETY: the header's bytes lie in the mapping (checked by range_ptr), which is page
    // aligned (mmap), so aligned for the atomics; a memfd starts zeroed, which is a valid
    // Header; every process touches these bytes only through atomics, never through slices
    // of slots; the reference borrows `arena`, so it cannot outlive the mapping.
    unsafe {
        &*arena
            .range_ptr(0, std::mem::size_of::<Header>())
            .cast::<Header>()
    }
}

/// Readies a new arena's header (the host, before any rank attaches).
pub(crate) fn init(arena: &SharedArena) {
    header(arena).failed_step.store(u64::MAX, Ordering::Release);
}

/// Marks the job stopped and wakes every waiting rank (the host).
pub(crate) fn stop(arena: &SharedArena) {
    let h = header(arena);
    h.stopped.store(1, Ordering::Release);
    // The generation stays: a barrier every rank completed is not undone by a later stop.
    // A waiter about to sleep misses this wake and sees the stop within POLL.
    futex_wake(&h.generation);
}

/// Waits until all `parties` ranks reached the barrier of `step`, recording `failed` for
/// this rank. `Ok(true)` when some rank failed at or before `step`. `alive` is asked every
/// [`POLL`] while waiting.
pub(crate) fn wait(
    arena: &SharedArena,
    parties: u32,
    step: u64,
    failed: bool,
    alive: impl Fn() -> bool,
) -> Result<bool, Broken> {
    let h = header(arena);
    let generation = h.generation.load(Ordering::Acquire);
    if h.stopped.load(Ordering::Acquire) != 0 {
        return Err(Broken::Stopped);
    }
    if failed {
        h.failed_step.fetch_min(step, Ordering::AcqRel);
    }
    if h.arrived.fetch_add(1, Ordering::AcqRel) + 1 == parties {
        h.arrived.store(0, Ordering::Release);
        h.generation.fetch_add(1, Ordering::AcqRel);
        futex_wake(&h.generation);
    } else {
        while h.generation.load(Ordering::Acquire) == generation {
            futex_wait(&h.generation, generation, POLL);
            if h.generation.load(Ordering::Acquire) != generation {
                break;
            }
            if h.stopped.load(Ordering::Acquire) != 0 {
                return Err(Broken::Stopped);
            }
            if !alive() {
                return Err(Broken::Dead);
            }
        }
    }
    Ok(h.failed_step.load(Ordering::Acquire) <= step)
}

/// Sleeps while `word` holds `expected`, at most `timeout` (shared futex: other processes
/// map the word too).
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: the futex word is a live, aligned u32 in a shared mapping; FUTEX_WAIT only
    // reads it and the timespec, which outlives the call. A spurious or interrupted return
    // is handled by the caller's loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: the word is a live, aligned u32; FUTEX_WAKE reads nothing else.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn arena() -> Arc<SharedArena> {
        let a = SharedArena::create("barrier test", HEADER_BYTES).unwrap();
        init(&a);
        Arc::new(a)
    }

    #[test]
    fn every_party_waits_for_the_last_and_all_see_a_failure() {
        let a = arena();
        let parties = 4;
        for step in 0..50u64 {
            let results: Vec<bool> = std::thread::scope(|s| {
                let t: Vec<_> = (0..parties)
                    .map(|p| {
                        let a = &a;
                        s.spawn(move || {
                            wait(a, parties, step, step == 30 && p == 2, || true).unwrap()
                        })
                    })
                    .collect();
                t.into_iter().map(|t| t.join().unwrap()).collect()
            });
            // A failure at step 30 is seen by every rank from step 30 on, and not before.
            assert_eq!(results, vec![step >= 30; parties as usize], "step {step}");
        }
    }

    #[test]
    fn a_stop_or_a_dead_host_breaks_the_wait() {
        let a = arena();
        let waiter = {
            let a = Arc::clone(&a);
            std::thread::spawn(move || wait(&a, 2, 0, false, || true))
        };
        std::thread::sleep(Duration::from_millis(100));
        stop(&a);
        assert_eq!(waiter.join().unwrap(), Err(Broken::Stopped));
        let b = arena();
        assert_eq!(wait(&b, 2, 0, false, || false), Err(Broken::Dead));
    }
}
