//! Per-class io_depth accounting: whether a class may start another read, and the counters
//! behind [`crate::ReaderStats`]. Every session of a reader counts its reads here, so a
//! class's limit holds across all of them.

use crate::error::ReadError;
use crate::types::ClassStats;

/// One class: its io_depth and what it has in flight.
#[derive(Debug, Default)]
struct ClassState {
    depth: usize,
    in_flight: usize,
    peak_in_flight: usize,
    completed: u64,
}

/// The classes' io_depth accounting, and the sessions waiting on it; always behind the lock
/// of [`crate::state::ReaderState`].
#[derive(Debug)]
pub(crate) struct Classes {
    classes: Vec<ClassState>,
    /// Sessions waiting on `ReaderState::depth` for a class to get below its io_depth.
    pub(crate) depth_waiters: usize,
}

impl Classes {
    pub(crate) fn new(depths: &[usize]) -> Classes {
        Classes {
            classes: depths
                .iter()
                .map(|&depth| ClassState {
                    depth,
                    ..ClassState::default()
                })
                .collect(),
            depth_waiters: 0,
        }
    }

    /// Counts one more read of `class` in flight if the class is below its io_depth.
    pub(crate) fn try_start(&mut self, class: usize) -> bool {
        let class = &mut self.classes[class];
        if class.in_flight >= class.depth {
            return false;
        }
        class.in_flight += 1;
        class.peak_in_flight = class.peak_in_flight.max(class.in_flight);
        true
    }

    /// A read of `class` left the kernel (or its pread worker) for good.
    pub(crate) fn finish(&mut self, class: usize) {
        let class = &mut self.classes[class];
        class.in_flight -= 1;
        class.completed += 1;
    }

    /// `class` is below its io_depth.
    pub(crate) fn has_room(&self, class: usize) -> bool {
        let class = &self.classes[class];
        class.in_flight < class.depth
    }

    pub(crate) fn stats(&self) -> Vec<ClassStats> {
        self.classes
            .iter()
            .map(|c| ClassStats {
                io_depth: c.depth,
                in_flight: c.in_flight,
                peak_in_flight: c.peak_in_flight,
                completed: c.completed,
            })
            .collect()
    }

    /// The io_depth of `class`, `None` if there is no such class.
    pub(crate) fn depth(&self, class: usize) -> Option<usize> {
        self.classes.get(class).map(|c| c.depth)
    }

    /// Sets `class`'s io_depth; says whether it grew.
    pub(crate) fn set_depth(&mut self, class: usize, depth: usize) -> Result<bool, ReadError> {
        let classes = self.classes.len();
        let state = self
            .classes
            .get_mut(class)
            .ok_or(ReadError::InvalidClass { class, classes })?;
        let grew = depth > state.depth;
        state.depth = depth;
        Ok(grew)
    }

    /// Restarts every class's peak from its current in-flight count.
    pub(crate) fn reset_peaks(&mut self) {
        for c in &mut self.classes {
            c.peak_in_flight = c.in_flight;
        }
    }
}
