//! A caller-driven queue of reads: the shape of the io_uring session, for an object store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::error::StoreError;
use crate::read::{RangeRead, StoreCompletion};
use crate::runtime::{Job, ReadReply, Reply, StoreThread};

/// Reads queued by one thread, completed in any order. Every queued read completes exactly
/// once, with [`StoreError::Stopped`] if the store thread stopped first.
///
/// The session never bounds what is in flight: its owner does (its io_depth), and the
/// completion queue holds at most that many.
pub struct StoreSession {
    thread: Arc<StoreThread>,
    done_tx: Sender<StoreCompletion>,
    done_rx: Receiver<StoreCompletion>,
    in_flight: usize,
}

impl std::fmt::Debug for StoreSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSession")
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl StoreSession {
    pub(crate) fn new(thread: Arc<StoreThread>) -> StoreSession {
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        StoreSession {
            thread,
            done_tx,
            done_rx,
            in_flight: 0,
        }
    }

    /// Queues a read; never blocks. An error means it was not queued and will not complete.
    pub fn queue(&mut self, read: RangeRead) -> Result<(), StoreError> {
        let fallback = StoreCompletion {
            tag: read.tag,
            result: Err(StoreError::Stopped),
        };
        let reply = ReadReply::Session(Reply::new(self.done_tx.clone(), fallback));
        self.thread.send(Job::Read(read, reply))?;
        self.in_flight += 1;
        Ok(())
    }

    /// Reads queued and not yet handed out by [`StoreSession::wait_timeout`].
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Waits until `min` completions are out (at most those in flight) or `timeout` has
    /// passed, then appends to `out` all that are ready; returns how many it appended.
    pub fn wait_timeout(
        &mut self,
        min: usize,
        timeout: Duration,
        out: &mut Vec<StoreCompletion>,
    ) -> Result<usize, StoreError> {
        let min = min.min(self.in_flight);
        let until = Instant::now() + timeout;
        let mut got = 0;
        while got < min {
            match self.done_rx.recv_deadline(until) {
                Ok(c) => {
                    out.push(c);
                    got += 1;
                }
                Err(RecvTimeoutError::Timeout) => break,
                // The session holds a sender itself: never disconnected.
                Err(RecvTimeoutError::Disconnected) => return Err(StoreError::Stopped),
            }
        }
        while got < self.in_flight {
            match self.done_rx.try_recv() {
                Ok(c) => {
                    out.push(c);
                    got += 1;
                }
                Err(_) => break,
            }
        }
        self.in_flight -= got;
        Ok(got)
    }
}
