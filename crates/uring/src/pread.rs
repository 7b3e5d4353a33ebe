//! The fallback backend: a bounded pool of threads calling pread(2).

use std::sync::Arc;

use crate::error::ReadError;
use crate::job::{AfterRead, Job};
use crate::state::ReaderState;

/// Body of one pread worker: takes reads within the io_depth limits, one at a time.
pub(crate) fn worker(shared: Arc<ReaderState>) {
    loop {
        let job = {
            let mut s = shared.lock();
            loop {
                if let Some(job) = shared.take_next(&mut s) {
                    shared.room_made(&s);
                    break Some(job);
                }
                if s.shutdown {
                    break None;
                }
                s.idle_workers += 1;
                s = shared.work.wait(s).unwrap_or_else(|e| e.into_inner());
                s.idle_workers -= 1;
            }
        };
        let Some(job) = job else {
            let cancelled = shared.lock().drain_queued();
            for job in cancelled {
                shared.deliver(job.cancel());
            }
            return;
        };
        let (job, result) = read(job);
        shared.finish(&mut shared.lock(), &job);
        shared.deliver(job.complete(result));
    }
}

pub(crate) fn read(mut job: Job) -> (Job, Result<(), ReadError>) {
    if job.is_empty() {
        return (job, Ok(()));
    }
    if let Err(e) = job.open_here() {
        return (job, Err(e));
    }
    let fd = job
        .fd()
        .expect("a reader's file, or a path read opened just now");
    loop {
        let (offset, buf_offset, len) = job.next_chunk();
        // SAFETY: next_chunk stays inside the job's buffer, which the job owns exclusively.
        let n = unsafe {
            libc::pread(
                fd,
                job.buf.as_mut_ptr().add(buf_offset).cast(),
                len,
                offset as libc::off_t,
            )
        };
        let res = if n < 0 {
            -std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        } else {
            n as i32
        };
        if let AfterRead::Done(result) = job.on_result(res) {
            return (job, result);
        }
    }
}
