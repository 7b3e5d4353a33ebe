//! The fallback backend: a bounded pool of threads, owned by the reader, calling pread(2)
//! for its sessions where no ring can be set up.
//!
//! A session hands a read to the pool once its class is below its io_depth, as it would put
//! it into its ring, and reaps the outcome from a channel of its own in `wait`/`poll`, as it
//! would reap its ring's CQ: the same queues, limits, pool and completions on both backends.
//! A read by path is opened, read and closed on the worker.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::error::ReadError;
use crate::job::{AfterRead, Done, Job};

/// The reads waiting for a worker, each with the channel of the session it goes back to.
#[derive(Debug, Default)]
struct Queue {
    jobs: VecDeque<(Job, Sender<Done>)>,
    /// The reader dropped: workers finish what is queued and return.
    stopping: bool,
    /// Workers waiting on `Work::ready`.
    idle: usize,
}

#[derive(Debug, Default)]
struct Work {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Work {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The reader's pread workers. Every session bounds what it hands them by its
/// `ring_entries`, so the queue holds at most that many reads per session.
#[derive(Debug)]
pub(crate) struct PreadPool {
    work: Arc<Work>,
    threads: Vec<JoinHandle<()>>,
}

impl PreadPool {
    /// Starts `threads` workers; if one cannot be started, stops the others.
    pub(crate) fn start(threads: usize) -> Result<PreadPool, ReadError> {
        let mut pool = PreadPool {
            work: Arc::default(),
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let work = pool.work.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("lobster-pread-{i}"))
                .spawn(move || worker(&work));
            match spawned {
                Ok(t) => pool.threads.push(t),
                // Dropping the pool stops and joins the workers started.
                Err(source) => {
                    return Err(ReadError::Setup {
                        what: "spawning a pread worker",
                        source,
                    })
                }
            }
        }
        Ok(pool)
    }

    /// A session's way to the workers, with at most `cap` of its reads there at once.
    pub(crate) fn port(&self, cap: usize) -> PreadPort {
        let (reply, done) = crossbeam_channel::bounded(cap);
        PreadPort {
            work: self.work.clone(),
            reply,
            done,
            at_workers: 0,
            cap,
        }
    }
}

impl Drop for PreadPool {
    /// Lets the workers finish what is queued, then joins them. Sessions hold the reader,
    /// so none is left to hand them reads.
    fn drop(&mut self) {
        self.work.lock().stopping = true;
        self.work.ready.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Body of one worker: one read at a time, oldest first.
fn worker(work: &Work) {
    loop {
        let (job, reply) = {
            let mut q = work.lock();
            loop {
                if let Some(next) = q.jobs.pop_front() {
                    break next;
                }
                if q.stopping {
                    return;
                }
                q.idle += 1;
                q = work.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                q.idle -= 1;
            }
        };
        // The session waits for its reads before it drops, so it is there to receive; and
        // it has at most the channel's capacity here, so this never waits.
        let _ = reply.send(read(job));
    }
}

/// One session's reads at the workers, and the channel their outcomes come back on.
#[derive(Debug)]
pub(crate) struct PreadPort {
    work: Arc<Work>,
    reply: Sender<Done>,
    done: Receiver<Done>,
    /// Reads handed to the workers and not yet reaped.
    at_workers: usize,
    cap: usize,
}

impl PreadPort {
    /// Reads at the workers.
    pub(crate) fn in_flight(&self) -> usize {
        self.at_workers
    }

    /// Reads the session may still hand over.
    pub(crate) fn room(&self) -> usize {
        self.cap - self.at_workers
    }

    /// Hands a started job to the workers; the caller counted it against [`PreadPort::room`].
    pub(crate) fn start(&mut self, job: Job) {
        assert!(
            self.at_workers < self.cap,
            "more reads at the workers than room"
        );
        self.at_workers += 1;
        let mut q = self.work.lock();
        q.jobs.push_back((job, self.reply.clone()));
        let wake = q.idle > 0;
        drop(q);
        if wake {
            self.work.ready.notify_one();
        }
    }

    /// Moves the reads the workers finished to `finished`, first waiting, with `want > 0`,
    /// until `want` of them are back or `timeout` passes. Nothing here can fail: the
    /// workers answer every read, and the reader (their owner) outlives the session.
    pub(crate) fn reap(
        &mut self,
        want: usize,
        timeout: Option<Duration>,
        finished: &mut Vec<Done>,
    ) {
        let deadline = timeout.map(|t| Instant::now() + t);
        let want = want.min(self.at_workers);
        let mut got = 0;
        while got < want {
            let done = match deadline {
                None => self.done.recv().ok(),
                Some(deadline) => match self.done.recv_deadline(deadline) {
                    Ok(done) => Some(done),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => None,
                },
            };
            let done = done.expect("the port holds a sender of its own channel");
            self.at_workers -= 1;
            finished.push(done);
            got += 1;
        }
        for done in self.done.try_iter() {
            self.at_workers -= 1;
            finished.push(done);
        }
    }
}

/// Reads a job with pread(2) on this thread: opens a read by path's file first and closes
/// it after; retries and short reads as the ring does them (`Job::on_result`).
pub(crate) fn read(mut job: Job) -> Done {
    debug_assert!(!job.is_empty(), "sessions complete empty reads themselves");
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
            let result = job.close_here(result);
            return (job, result);
        }
    }
}
