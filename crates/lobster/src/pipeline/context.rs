//! What every pipeline thread reads and never changes: the layout, the configuration, the
//! dataset, the decode function and the emulated storage tier. What only some stages read
//! (the peers, the decoded tier) is handed to those stages alone, in `pipeline/mod.rs`.

use std::sync::Arc;

use crate::config::LoaderConfig;
use crate::dataset::{Dataset, SampleMeta};
use crate::error::Cause;
use crate::pipeline::access::{Read, StorageRead};
use crate::pipeline::layout::Layout;
use crate::pipeline::read::attempt::ReadFates;
use crate::pipeline::read::dirs::SampleDirs;

/// The user's decode function, type-erased.
/// The user's decode function: a sample's bytes, what is known of it, and the epoch of the
/// access (to seed augmentation).
pub(crate) type DecodeFn<T> =
    Arc<dyn Fn(&[u8], &SampleMeta, u32) -> Result<T, Cause> + Send + Sync>;

/// Everything the threads need, fixed at build time.
pub(crate) struct Context<T> {
    pub(crate) layout: Layout,
    pub(crate) config: LoaderConfig,
    pub(crate) dataset: Arc<Dataset>,
    /// The dataset's directories held open (pipelined): the workers open files in them.
    pub(crate) dirs: Option<SampleDirs>,
    pub(crate) decode: DecodeFn<T>,
    /// What every storage read meets: the emulated tier and injected faults.
    pub(crate) storage: ReadFates,
    /// The reader (pipelined): its pool also takes the workers' page-cache reads.
    pub(crate) reader: Option<lobster_uring::Reader>,
    /// Where the cache keeps large samples (`None`: no cache, or no room for the mapping).
    pub(crate) arena: Option<lobster_uring::Arena>,
    /// Each sample's size as the cache plans with it (`None` without a cache).
    pub(crate) sizes: Option<Arc<[u32]>>,
}

impl<T> Context<T> {
    pub(crate) fn meta(&self, sample: u32) -> &SampleMeta {
        &self.dataset.samples()[sample as usize]
    }

    /// A storage read of `sample` for iteration `iteration` of `epoch`, due at its step and
    /// first among its batch's reads until the planner spreads them (a peer's fallback is
    /// late already).
    pub(crate) fn storage_read(&self, epoch: u32, iteration: usize, sample: u32) -> Read {
        Read::Storage(StorageRead {
            step: self.layout.step(epoch, iteration),
            finish_ppm: 0,
            bytes: self.meta(sample).size_bytes,
        })
    }
}
