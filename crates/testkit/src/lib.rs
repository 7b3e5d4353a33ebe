//! lobster-testkit: oracles, data makers and helpers for lobster-io's tests, benches and fuzz
//! targets.
//!
//! It is never a dependency of a product crate: only of dev-dependencies, `benches/` and
//! `fuzz/`, so none of it is public API of lobster-io or its engines.
//!
//! - [`cluster_optimum`] and [`forms_optimum`]: exhaustive optima of the cluster plan and the
//!   two-form rule on small cases, and their checkers.
//! - [`tiers_optimum`]: Belady on unit sizes and the exhaustive best two-level (memory over
//!   disk) placement, a loader model of the two-level plan, and their checker.
//! - [`gen`]: shuffled multi-epoch streams, log-normal sizes and small two-form cases.
//! - [`data`]: sample bytes, ImageFolders of them, JPEGs and ustar archives.
//! - [`process`]: the test process's threads and descriptors, and a watchdog for hangs.
//! - `loader` (feature `loader`): rank plans and drivers of lobster-io's loaders.
//! - `proxy` (feature `proxy`): a delaying proxy on loopback, per-request latency and per-node
//!   bandwidth between clients and one upstream server, with counts per node.
//! - `s3` (feature `s3`): a real S3 server (s3s-fs) on loopback with switchable faults.
//!
//! The fuzz targets of the cluster plan and the two-form rule are one-liners that call a
//! checker here ([`cluster_optimum::check_cluster_bytes`], [`forms_optimum::check_form_bytes`]);
//! lobster-cache's tests run the same checkers over seeded inputs.
//!
//! A unit test of lobster-cache links a second build of it (the one this crate depends on),
//! whose types are not its own: it takes only plain data from here, such as
//! [`gen::ShuffledStream::to_epochs`]. Integration tests share this crate's build.
//!
//! ```
//! use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};
//! use lobster_testkit::cluster_optimum::{check_cluster_case, ClusterCase};
//!
//! let stream = ShuffledStream { num_samples: 6, epochs: 2, nodes: 1, node: 0, seed: 1 };
//! let orders = stream.to_epochs();
//! let mut first = orders[0].clone();
//! first.sort_unstable();
//! assert_eq!(first, (0..6).collect::<Vec<_>>());
//! // Two nodes of one rank: the plan keeps every invariant and reads at least the optimum.
//! let case = ClusterCase {
//!     orders,
//!     sizes: lognormal_sizes(6, 100.0, 0.5, 1),
//!     nodes: 2,
//!     ranks_per_node: 1,
//!     batch_size: 1,
//!     capacity_bytes: 150,
//! };
//! let c = check_cluster_case(&case, 4);
//! assert!(c.cluster_bytes >= c.floor_bytes);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;

use lobster_cache::CacheError;

pub mod cluster_optimum;
pub mod data;
pub mod forms_optimum;
pub mod gen;
#[cfg(feature = "loader")]
pub mod loader;
pub mod process;
#[cfg(feature = "proxy")]
pub mod proxy;
#[cfg(feature = "s3")]
pub mod s3;
pub mod tiers_optimum;

/// Why an exhaustive search gave no optimum.
#[derive(Debug)]
#[non_exhaustive]
pub enum OracleError {
    /// lobster-cache refused the case: a sample without a size, size tables of two lengths,
    /// a cost that is not finite.
    Cache(CacheError),
    /// A stream too long for the exhaustive search.
    TooManyIntervals {
        /// Reuse intervals in the stream.
        intervals: usize,
        /// The most the search takes.
        max: usize,
    },
}

impl fmt::Display for OracleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OracleError::Cache(e) => e.fmt(f),
            OracleError::TooManyIntervals { intervals, max } => write!(
                f,
                "{intervals} reuse intervals: the exhaustive search takes at most {max}"
            ),
        }
    }
}

impl std::error::Error for OracleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OracleError::Cache(e) => e.source(),
            OracleError::TooManyIntervals { .. } => None,
        }
    }
}

impl From<CacheError> for OracleError {
    fn from(e: CacheError) -> Self {
        OracleError::Cache(e)
    }
}
