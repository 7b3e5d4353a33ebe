//! The Python loader's sample buffers: given back to the decode threads' [`Recycler`] when
//! Python lets go of their batch.

use lobster_io::{Batch, Recycler};

/// Most bytes of buffers kept for reuse: above what a rank's batches in flight hold
/// (4 batches of 64 images of 0.4 MiB is 100 MiB), so that a steady run reuses them all; a
/// buffer given back past it is freed.
pub(crate) const KEPT_BYTES_MAX: usize = 256 << 20;

/// A batch of samples whose buffers go back to their recycler when it is dropped.
pub(crate) struct GivesBack {
    pub(crate) batch: Batch<Vec<u8>>,
    pub(crate) to: std::sync::Arc<Recycler>,
}

impl Drop for GivesBack {
    fn drop(&mut self) {
        for s in self.batch.samples.drain(..) {
            self.to.give(s.value);
        }
    }
}
