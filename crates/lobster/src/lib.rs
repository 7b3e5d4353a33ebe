//! lobster-io: load balance-aware sample loading for distributed DNN training.
//!
//! The facade over the three engine crates, re-exported whole so one dependency is enough.

pub use lobster_cache as cache;
pub use lobster_sched as sched;
pub use lobster_uring as uring;

mod dataset;
mod error;
mod sampler;

pub use dataset::{Dataset, SampleMeta};
pub use error::{Cause, Error};
pub use sampler::{torch_randperm, DistributedSampler, EpochOrder};
