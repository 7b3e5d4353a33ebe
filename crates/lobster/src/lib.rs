//! lobster-io: load balance-aware sample loading for distributed DNN training.
//!
//! The facade over the three engine crates, re-exported whole so one dependency is enough:
//! [`uring`] reads samples with io_uring and per-rank io_depth, [`cache`] decides hits and
//! evictions on the known access stream, [`sched`] splits io_depth and decode threads among
//! the node's ranks.

pub use lobster_cache as cache;
pub use lobster_sched as sched;
pub use lobster_uring as uring;

mod config;
mod dataset;
mod emulate;
mod error;
mod loader;
mod metrics;
mod pipeline;
mod sampler;

pub use config::{CachePolicy, Execution, LoaderConfig, Schedule};
pub use dataset::{Dataset, SampleMeta};
pub use emulate::StorageEmulation;
pub use error::{Cause, Error};
pub use loader::{Batch, Loader, LoaderBuilder, RankHandle, Sample};
pub use metrics::{imbalance, AllocationRecord, IterationMetrics, RunMetrics};
pub use sampler::{torch_randperm, DistributedSampler, EpochOrder};
