//! Memory the loader holds free, given back once an epoch.

use std::sync::Mutex;

use lobster_uring::{Arena, Reader};

/// What the loader's memory has free that a long run would otherwise keep resident: the
/// C heap's free pages, the reader's free pool blocks, the cache arena's free runs.
pub(crate) struct FreeMemory {
    /// Until the pipeline shuts down: the rank handles outlive it, and a reader kept here
    /// would keep its pread workers running.
    parts: Mutex<(Option<Reader>, Option<Arena>)>,
}

impl FreeMemory {
    pub(crate) fn new(reader: Option<Reader>, arena: Option<Arena>) -> Self {
        FreeMemory {
            parts: Mutex::new((reader, arena)),
        }
    }

    /// Gives it back to the system, once an epoch (when every rank took the epoch's last
    /// batch), so that resident memory follows what is live however long the run: the
    /// pages come back on first use, a fault each, once an epoch.
    pub(crate) fn release(&self) {
        lobster_uring::release_free_heap();
        let (reader, arena) = &*self.parts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = reader {
            r.release_free_pages();
        }
        if let Some(a) = arena {
            a.release_free_pages();
        }
    }

    /// Lets the reader and the arena go with the pipeline.
    pub(crate) fn clear(&self) {
        *self.parts.lock().unwrap_or_else(|e| e.into_inner()) = (None, None);
    }
}
