//! lobster-cache: a clairvoyant sample cache over a known access stream.
//!
//! The shuffle seed fixes every future access, so the cache can follow Belady's rule
//! exactly: evict the cached sample whose next use is farthest away, and do not admit a
//! sample that would push out samples needed sooner than itself ("do no harm"). LRU and
//! NoPFS-style static placement are the baselines, behind the same [`Policy`] trait.
//!
//! - [`Planner`] drives a policy over a multi-epoch [`StreamSource`] in stream order, one
//!   [`Decision`] per access, holding only a batch of epochs ([`NextUseIndex`]).
//! - [`Store`] holds what the cache keeps of each sample, never over capacity.
//! - [`TierPlanner`] plans a memory cache over a local disk as two levels of one rule.
//! - [`ClusterPlanner`] plans the nodes' caches of a multi-node job as one (see [`PeerPlanKind`]).
//! - [`trace`] parses and replays `SAMPLE_ID SIZE_BYTES` traces (the `lobster replay`
//!   command).
//!
//! The exhaustive optima that check the cluster plan and the two-form rule, and the shuffled
//! streams of the tests and benches, are in the `lobster-testkit` crate.
//!
//! Pure logic: no I/O, no threads of its own, no `unsafe`.
//!
//! ```
//! use std::sync::Arc;
//! use lobster_cache::{Planner, PolicyKind, VecSource};
//!
//! // Two epochs over samples 0..4 of 10 bytes each; room for two samples.
//! let source = VecSource::new(vec![vec![0, 1, 2, 3], vec![3, 2, 1, 0]]);
//! let sizes: Arc<[u32]> = vec![10; 4].into();
//! let mut planner = Planner::new(source, sizes, 20, PolicyKind::Reuse)?;
//! let mut evicted = Vec::new();
//! while let Some(d) = planner.next(&mut evicted)? {
//!     // A loader would take hits from the store, read misses, store admitted samples
//!     // and drop the evicted ones.
//!     let _ = (d.hit, d.admitted, &evicted);
//! }
//! // Belady keeps 2 and 3 (needed first in epoch 1) and hits them there.
//! assert_eq!(planner.stats().hits, 2);
//! # Ok::<(), lobster_cache::CacheError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[macro_use]
mod names;

mod cluster;
mod error;
mod forms;
mod heap;
mod index;
mod lru;
mod planner;
mod policy;
mod reuse;
mod static_;
mod store;
mod tiers;

pub mod trace;

#[cfg(any(test, fuzzing))]
mod check;

pub use cluster::{
    Assign, ClusterConfig, ClusterCounts, ClusterDecision, ClusterError, ClusterLayout,
    ClusterPlanner, ClusterStats, ClusterView, LinkPrices, PeerPlanKind, Served,
};
pub use error::{CacheError, StoreError, TraceError};
pub use forms::{
    Form, FormChoice, FormCosts, FormDecision, FormOutcome, FormPlanner, FormPolicy, FormStats,
};
pub use index::{Access, NextUseIndex, StreamSource, VecSource};
pub use lru::LruPolicy;
pub use planner::{Decision, Planner, PlannerConfig, Stats};
pub use policy::{Outcome, Policy, PolicyKind, NEVER};
pub use reuse::ReusePolicy;
pub use static_::StaticPolicy;
pub use store::Store;
pub use tiers::{Tier, TierDecision, TierEvicted, TierPlanner, TierStats};

/// Checker run by the fuzz targets: decodes `data` into a short multi-epoch stream, sizes and
/// a capacity, runs every policy through the planner and through a naive reference model,
/// and panics if hits, admissions or evictions differ or an invariant breaks.
#[cfg(fuzzing)]
pub fn fuzz_check(data: &[u8]) {
    check::check_bytes(data);
}

/// Checker run by the trace fuzz target: arbitrary bytes parsed as a trace never panic, and a
/// parsed trace round-trips and replays like the reference model.
#[cfg(fuzzing)]
pub fn fuzz_check_trace(data: &[u8]) {
    check::check_trace_bytes(data);
}

/// A sample's index in the dataset.
pub type SampleId = u32;
