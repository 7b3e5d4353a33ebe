//! lobster-io: load balance-aware sample loading for distributed DNN training.
//!
//! Synchronous training waits every step for the slowest rank's batch. lobster-io plans
//! instead of guessing, because the shuffle seed fixes every rank's access order: the cache
//! evicts the sample whose next use is farthest away ([`CachePolicy::Reuse`]), reads go to
//! io_uring ([`Backend`]) in deadline order, so that every rank's batch finishes its reads
//! together ([`IoOrder`]), and every window the ranks predicted to be slowest get more decode
//! threads, and under [`IoOrder::Shares`] more io_depth. What an embedder names is here:
//! the loader and its configuration at the root, image decoding and batches in [`images`],
//! numpy array samples in [`arrays`], other nodes' caches in [`net`]; the engine crates
//! underneath (lobster-cache, -sched, -uring, -image, -array, -net) are dependencies of their own for whoever needs more.
//!
//! Features: `mpi` (peers over MPI: Open MPI and libclang to build) and `lab` (an emulated
//! storage tier and deterministic fault injection, [`ReadConfig`]'s `storage_emulation` and
//! `inject_faults`: what the CLI, the benches and the tests stand in for storage with; an
//! embedder has no need of it).
//!
//! A loader embedded in a training job: one [`RankHandle`] per local rank, each driven by its
//! rank's thread.
//!
//! ```
//! use lobster_io::{CachePolicy, Dataset, LoaderBuilder};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # for i in 0..40u32 {
//! #     let class = dir.path().join(format!("class{}", i % 4));
//! #     std::fs::create_dir_all(&class)?;
//! #     std::fs::write(class.join(format!("{i:03}.jpg")), vec![i as u8; 100 + i as usize])?;
//! # }
//! // root/<class>/<file>, like torchvision's ImageFolder.
//! let dataset = Dataset::open_image_folder(dir.path())?;
//! let mut loader = LoaderBuilder::new(dataset)
//!     .world(2, 2, 0) // 2 nodes of 2 ranks; this is node 0
//!     .seed(42) // DistributedSampler(shuffle=True, seed=42)
//!     .batch_size(4)
//!     .epochs(2)
//!     .cache(CachePolicy::Reuse, 2 << 10)
//!     .io_depth(8)
//!     .decode_threads(2)
//!     .decode(|bytes: &[u8], meta| Ok::<_, std::io::Error>((meta.label, bytes.len())))
//!     .build()?;
//! let ranks = loader.ranks().expect("first call");
//! std::thread::scope(|s| {
//!     for handle in ranks {
//!         s.spawn(move || {
//!             for batch in handle {
//!                 let batch = batch.expect("no sample fails here");
//!                 // The training step consumes batch.samples (id, label, decoded value).
//!                 assert!(batch.samples.len() <= 4);
//!             }
//!         });
//!     }
//! });
//! let metrics = loader.metrics();
//! assert_eq!(metrics.samples, 2 * 2 * 10); // 2 ranks x 2 epochs x 10 samples each
//! println!("hit ratio {:.2}, stall {:.1}%", metrics.hit_ratio, 100.0 * metrics.stall_fraction);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

#[macro_use]
mod names;

pub mod arrays;
mod batch;
mod config;
mod dataset;
mod emulate;
mod error;
mod faults;
pub mod images;
mod loader;
mod memory;
mod metrics;
pub mod net;
mod pipeline;
mod recycle;
mod resume;
mod sampler;

/// Checker run by the `tar_index` fuzz target: arbitrary bytes as a tar shard are indexed
/// and grouped into samples, or refused naming the shard; never a panic or a loop.
#[cfg(fuzzing)]
pub fn fuzz_check_tar_index(data: &[u8]) {
    dataset::fuzz::check_tar(data);
}

/// Checker run by the `shard_index` fuzz target: arbitrary bytes as a shard's kept index.
#[cfg(fuzzing)]
pub fn fuzz_check_shard_index(data: &[u8]) {
    dataset::fuzz::check_shard_index(data);
}

/// Checker run by the `table_file` fuzz target: arbitrary bytes as a folder's kept table.
#[cfg(fuzzing)]
pub fn fuzz_check_table_file(data: &[u8]) {
    dataset::fuzz::check_table(data);
}

/// Checker run by the `loader_state` fuzz target: arbitrary bytes as a saved loader state.
#[cfg(fuzzing)]
pub fn fuzz_check_loader_state(data: &[u8]) {
    resume::fuzz_check(data);
}

pub use batch::{Batch, Sample};
pub use config::{
    BudgetConfig, CacheConfig, CachePolicy, DiskCache, Execution, IoOrder, JobConfig, LoaderConfig,
    PeerPlanChoice, PipelineThreads, ReadConfig, ResidentReads, SampleLimits, Schedule,
    LINK_BYTES_PER_S, THREADS_MAX,
};
pub use dataset::{
    Dataset, FolderOptions, Probe, SampleMeta, SampleRecord, CLASSES_MAX, IMAGE_EXTENSIONS,
};
#[cfg(feature = "lab")]
pub use emulate::StorageEmulation;
pub use error::{Cause, Error};
#[cfg(feature = "lab")]
pub use faults::{AttemptFaults, Fault, FaultInjection};
pub use faults::{FailureBudget, OnError, READ_ATTEMPTS};
pub use loader::{Loader, LoaderBuilder, RankHandle, RankStream};
pub use lobster_cache::{
    Assign, ClusterCounts, Form, FormChoice, FormCosts, LinkPrices, PeerPlanKind,
};
/// The object store a dataset in S3 is read from (feature `s3`): its endpoint, region,
/// credentials and deadlines, for [`Dataset::open_objects_with`].
#[cfg(feature = "s3")]
pub use lobster_store::{StoreConfig, StoreError};
pub use lobster_uring::{hold_heap, ActiveBackend, Backend, BackendInfo, HeapLimits};
pub use memory::{MachineMemory, MemoryPart, MemoryShort};
pub use metrics::{
    AllocationRecord, CacheForms, CacheStore, ClusterPlanMetrics, DiskCacheMetrics,
    FormCostsReport, IterationMetrics, Mode, ReadPath, RunMetrics, SkippedSample, ThreadClass,
};
pub use recycle::Recycler;
// Which peer holds each access's sample, for the plan-bench's figures of its size and start.
#[cfg(feature = "lab")]
pub use pipeline::{PeerHolders, PeerHoldersInputs};
pub use resume::{
    JobFingerprint, LoaderState, Positions, RankPosition, STATE_JSON_MAX_BYTES, STATE_VERSION,
    STATE_WORLD_MAX,
};
pub use sampler::{torch_randperm, DistributedSampler, EpochOrder, SamplerOrders};

#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[doc = include_str!("../../../docs/embedding.md")]
#[cfg(doctest)]
pub struct EmbeddingDoctests;
