//! Per-class FIFO queues and io_depth accounting: which class may start a read next
//! (round robin over the classes below their limits), and the counters behind
//! [`crate::ReaderStats`].

use std::collections::VecDeque;

use crate::error::ReadError;
use crate::job::Job;
use crate::types::ClassStats;

/// What [`ClassQueues::set_depth`] changed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DepthChange {
    /// The limit went up.
    pub(crate) grew: bool,
    /// The class had requests queued.
    pub(crate) queued: bool,
}

/// One class: its FIFO of requests not yet in the kernel and its io_depth accounting.
#[derive(Debug, Default)]
struct ClassState {
    queue: VecDeque<Job>,
    depth: usize,
    in_flight: usize,
    peak_in_flight: usize,
    completed: u64,
}

impl ClassState {
    /// Below its io_depth.
    fn has_room(&self) -> bool {
        self.in_flight < self.depth
    }

    /// Counts one more read in flight.
    fn start(&mut self) {
        self.in_flight += 1;
        self.peak_in_flight = self.peak_in_flight.max(self.in_flight);
        debug_assert!(self.in_flight <= self.depth);
    }
}

/// The per-class queues and io_depth accounting, and who waits on them; always behind the
/// lock of [`crate::state::ReaderState`].
#[derive(Debug)]
pub(crate) struct ClassQueues {
    classes: Vec<ClassState>,
    /// Round-robin start for the next `take_next`, so no class starves another.
    cursor: usize,
    pub(crate) shutdown: bool,
    /// Per io_uring engine: it found no work and may be asleep in the kernel.
    pub(crate) parked: Vec<bool>,
    /// pread workers waiting on `ReaderState::work`.
    pub(crate) idle_workers: usize,
    /// Submitters waiting on `ReaderState::space` for room in a class queue.
    pub(crate) space_waiters: usize,
    /// Sessions waiting on `ReaderState::depth` for a class to get below its io_depth.
    pub(crate) depth_waiters: usize,
}

impl ClassQueues {
    pub(crate) fn new(depths: &[usize], engines: usize) -> ClassQueues {
        ClassQueues {
            classes: depths
                .iter()
                .map(|&depth| ClassState {
                    depth,
                    ..ClassState::default()
                })
                .collect(),
            cursor: 0,
            shutdown: false,
            parked: vec![false; engines],
            idle_workers: 0,
            space_waiters: 0,
            depth_waiters: 0,
        }
    }

    /// Pops the oldest request of the next class (round robin) that is below its io_depth,
    /// and counts it in flight.
    pub(crate) fn take_next(&mut self) -> Option<Job> {
        let n = self.classes.len();
        for i in 0..n {
            let c = (self.cursor + i) % n;
            let class = &mut self.classes[c];
            if class.has_room() {
                if let Some(job) = class.queue.pop_front() {
                    class.start();
                    self.cursor = (c + 1) % n;
                    return Some(job);
                }
            }
        }
        None
    }

    /// Counts one more read of `class` in flight if the class is below its io_depth.
    pub(crate) fn try_start(&mut self, class: usize) -> bool {
        let class = &mut self.classes[class];
        if !class.has_room() {
            return false;
        }
        class.start();
        true
    }

    /// A class has queued requests (in the shared queues) and room below its io_depth.
    pub(crate) fn runnable(&self) -> bool {
        self.classes
            .iter()
            .any(|c| !c.queue.is_empty() && c.has_room())
    }

    /// A job of `class` left the kernel for good.
    pub(crate) fn finish(&mut self, class: usize) {
        let class = &mut self.classes[class];
        class.in_flight -= 1;
        class.completed += 1;
    }

    /// Requests waiting in all class queues.
    pub(crate) fn queued(&self) -> usize {
        self.classes.iter().map(|c| c.queue.len()).sum()
    }

    /// Empties every queue (at shutdown).
    pub(crate) fn drain_queued(&mut self) -> Vec<Job> {
        self.classes
            .iter_mut()
            .flat_map(|c| c.queue.drain(..))
            .collect()
    }

    pub(crate) fn stats(&self) -> Vec<ClassStats> {
        self.classes
            .iter()
            .map(|c| ClassStats {
                io_depth: c.depth,
                queued: c.queue.len(),
                in_flight: c.in_flight,
                peak_in_flight: c.peak_in_flight,
                completed: c.completed,
            })
            .collect()
    }

    /// Requests waiting in `class`'s queue.
    pub(crate) fn queue_len(&self, class: usize) -> usize {
        self.classes[class].queue.len()
    }

    /// `class` is below its io_depth.
    pub(crate) fn has_room(&self, class: usize) -> bool {
        self.classes[class].has_room()
    }

    /// A request queued now behind those already queued would find `class` below its
    /// io_depth.
    pub(crate) fn would_start(&self, class: usize) -> bool {
        let c = &self.classes[class];
        c.in_flight + c.queue.len() < c.depth
    }

    /// Queues `job` at the back of its class's FIFO.
    pub(crate) fn push_back(&mut self, job: Job) {
        self.classes[job.class].queue.push_back(job);
    }

    /// The io_depth of `class`, `None` if there is no such class.
    pub(crate) fn depth(&self, class: usize) -> Option<usize> {
        self.classes.get(class).map(|c| c.depth)
    }

    /// Sets `class`'s io_depth; says whether it grew and whether requests were queued.
    pub(crate) fn set_depth(
        &mut self,
        class: usize,
        depth: usize,
    ) -> Result<DepthChange, ReadError> {
        let classes = self.classes.len();
        let state = self
            .classes
            .get_mut(class)
            .ok_or(ReadError::InvalidClass { class, classes })?;
        let grew = depth > state.depth;
        let queued = !state.queue.is_empty();
        state.depth = depth;
        Ok(DepthChange { grew, queued })
    }

    /// Restarts every class's peak from its current in-flight count.
    pub(crate) fn reset_peaks(&mut self) {
        for c in &mut self.classes {
            c.peak_in_flight = c.in_flight;
        }
    }
}
