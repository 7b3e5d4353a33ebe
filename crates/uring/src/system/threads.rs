//! Scheduling of a loader's background threads.

/// Puts the calling thread under `SCHED_BATCH`. The kernel still gives it its fair share of
/// the CPU, but its wake-ups no longer preempt the thread running on the core (Linux's fair
/// class lets only normal threads preempt on wake-up): a training thread that wakes a
/// loader thread, or runs while one wakes, keeps its core. No privilege is needed.
pub fn run_as_batch() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` lives across the call, which only reads it; pid 0 is this thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_runs_as_batch_and_others_do_not() {
        std::thread::spawn(|| {
            run_as_batch().unwrap();
            // SAFETY: sched_getscheduler reads nothing of ours.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_BATCH);
        })
        .join()
        .unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
    }
}
