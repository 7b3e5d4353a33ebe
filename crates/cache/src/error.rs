//! Errors of lobster-cache.

use std::fmt;

use crate::SampleId;

/// What went wrong while building a plan or replaying a stream.
#[derive(Debug)]
#[non_exhaustive]
pub enum CacheError {
    /// A policy name that is not `reuse`, `lru` or `static`.
    UnknownPolicy {
        /// The name given.
        name: String,
    },
    /// The stream named a sample id that has no size in the size table.
    SampleOutOfRange {
        /// The sample id.
        sample: SampleId,
        /// The epoch in which it appeared.
        epoch: u32,
        /// Number of samples in the size table.
        num_samples: usize,
    },
    /// The size table has more samples than a `SampleId` can name.
    TooManySamples {
        /// Number of samples given.
        num_samples: usize,
    },
    /// A form choice that is not `encoded`, `decoded` or `auto`.
    UnknownFormChoice {
        /// The name given.
        name: String,
    },
    /// A name that is none of a choice's values (`assign`, `peer plan`).
    UnknownChoice {
        /// The choice.
        choice: &'static str,
        /// The name given.
        name: String,
        /// The names it takes.
        expected: &'static str,
    },
    /// A cost of the two-form rule that is negative or not finite.
    InvalidCost {
        /// Which cost.
        parameter: &'static str,
        /// Its value.
        value: f64,
    },
    /// The encoded and decoded size tables differ in length.
    SizeTables {
        /// Samples in the encoded table.
        encoded: usize,
        /// Samples in the decoded table.
        decoded: usize,
    },
    /// A policy that has no two-level (memory and disk) plan.
    NoTieredPlan {
        /// The policy's name.
        policy: &'static str,
    },
    /// A sample said to be on the disk already has no size in the size table.
    SeedOutOfRange {
        /// The sample id.
        sample: SampleId,
        /// Number of samples in the size table.
        num_samples: usize,
    },
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::UnknownPolicy { name } => {
                write!(f, "unknown cache policy {name:?} (expected reuse, lru or static)")
            }
            CacheError::SampleOutOfRange {
                sample,
                epoch,
                num_samples,
            } => write!(
                f,
                "sample {sample} in epoch {epoch} is outside the size table of {num_samples} samples"
            ),
            CacheError::TooManySamples { num_samples } => write!(
                f,
                "{num_samples} samples do not fit in a 32-bit sample id"
            ),
            CacheError::UnknownFormChoice { name } => write!(
                f,
                "unknown cache forms {name:?} (expected encoded, decoded or auto)"
            ),
            CacheError::UnknownChoice {
                choice,
                name,
                expected,
            } => write!(f, "unknown {choice} {name:?} (expected {expected})"),
            CacheError::InvalidCost { parameter, value } => write!(
                f,
                "cache form cost {parameter} = {value}: must be finite and at least 0"
            ),
            CacheError::SizeTables { encoded, decoded } => write!(
                f,
                "the decoded size table has {decoded} samples, the encoded one {encoded}"
            ),
            CacheError::NoTieredPlan { policy } => write!(
                f,
                "cache policy {policy} has no memory and disk plan (expected reuse or static)"
            ),
            CacheError::SeedOutOfRange {
                sample,
                num_samples,
            } => write!(
                f,
                "sample {sample} on the disk cache is outside the size table of {num_samples} samples"
            ),
        }
    }
}

impl std::error::Error for CacheError {}

/// Why a [`Store`](crate::Store) refused an insertion.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// Inserting the value would make the store exceed its capacity.
    Full {
        /// The sample being inserted.
        sample: SampleId,
        /// Its size in bytes.
        size_bytes: u64,
        /// Bytes held when the insertion was tried.
        used_bytes: u64,
        /// The store's capacity.
        capacity_bytes: u64,
    },
    /// The sample is already in the store.
    AlreadyPresent {
        /// The sample being inserted.
        sample: SampleId,
    },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Full {
                sample,
                size_bytes,
                used_bytes,
                capacity_bytes,
            } => write!(
                f,
                "store full: sample {sample} of {size_bytes} bytes does not fit \
                 ({used_bytes} of {capacity_bytes} bytes used)"
            ),
            StoreError::AlreadyPresent { sample } => {
                write!(f, "sample {sample} is already in the store")
            }
        }
    }
}

impl std::error::Error for StoreError {}

/// Why a trace could not be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum TraceError {
    /// Reading the trace failed.
    Io {
        /// 1-based number of the line being read.
        line: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line is not `SAMPLE_ID SIZE_BYTES` (with an optional `#` comment).
    Malformed {
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A sample appears with two different sizes.
    ConflictingSize {
        /// The sample id as written in the trace.
        sample: SampleId,
        /// 1-based line number of the conflicting access.
        line: u64,
        /// The size it had first.
        first_size_bytes: u32,
        /// The size on this line.
        size_bytes: u32,
    },
    /// The trace has more accesses than the replay supports (`u32::MAX`).
    TooLong {
        /// 1-based line number at which the limit was reached.
        line: u64,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io { line, source } => {
                write!(f, "reading trace line {line}: {source}")
            }
            TraceError::Malformed { line, reason } => {
                write!(f, "trace line {line}: {reason}")
            }
            TraceError::ConflictingSize {
                sample,
                line,
                first_size_bytes,
                size_bytes,
            } => write!(
                f,
                "trace line {line}: sample {sample} has size {size_bytes} bytes but was \
                 {first_size_bytes} bytes before"
            ),
            TraceError::TooLong { line } => {
                write!(f, "trace line {line}: more than {} accesses", u32::MAX)
            }
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TraceError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
