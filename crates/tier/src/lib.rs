//! The files of a local disk cache below lobster-io's memory cache (`--disk-cache DIR
//! --disk-cache-bytes N`): bounded, checksummed, keyed by the dataset.
//!
//! The plan (lobster-cache's `TierPlanner`) decides what is on the disk and when; a
//! [`DiskTier`] only keeps it: it writes a sample's bytes as an entry, reads them back
//! checked against their CRC32, drops entries, and keeps an index so that a next run of the
//! same dataset starts with what this one left (its [`entries`](DiskTier::entries) are the
//! plan's seeds).
//!
//! Choices:
//! - Files: `DIR/<fingerprint as 16 hex digits>/` holds up to four segment files (the
//!   capacity, rounded down to 4 KiB, cut in four) and an index, so the number of open files
//!   does not grow with the capacity. Another fingerprint is another directory.
//! - Extents are whole 4 KiB blocks (one at least, see [`extent_bytes`]), taken first fit
//!   over a free list sorted by address, frees coalesced; the extents held never exceed the
//!   capacity (asserted). Fragmentation: a write of `a` aligned bytes is refused
//!   ([`TierError::Full`], nothing written) only when no free extent holds it; free extents
//!   are at most entries + 4, so fewer than `(entries + 4) * a` bytes are then free, and
//!   where all samples have one size, fewer than `a` plus each segment's tail (its length
//!   modulo `a`, under `a`). A plan that budgets the disk in sample bytes must leave room
//!   for this rounding and fragmentation, or treat `Full` as "not kept".
//! - I/O: `pread`/`pwrite` on the caller's thread, O_DIRECT when a probe at open says the
//!   file system takes it (tmpfs does not), else buffered.
//! - The index is sealed with a CRC32, bounded by the geometry (one 24-byte entry per 4 KiB
//!   block at most), and only trusted for the same fingerprint, capacity and size table; it
//!   is a hint: each read checks its entry's CRC, and a damaged entry is dropped.
//! - One open tier per directory: an flock on it ([`TierError::Busy`] otherwise).
//!
//! ```
//! use std::sync::Arc;
//! use lobster_tier::{DiskTier, TierError};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let sizes: Arc<[u32]> = vec![5, 3].into();
//! {
//!     let tier = DiskTier::open(dir.path(), 0xfeed, sizes.clone(), 1 << 20)?;
//!     tier.write(0, b"hello")?;
//!     assert_eq!(&tier.read(0)?[..], b"hello");
//!     tier.persist()?;
//! }
//! // A next run of the same dataset finds the entry.
//! let tier = DiskTier::open(dir.path(), 0xfeed, sizes, 1 << 20)?;
//! assert_eq!(tier.entries(), vec![0]);
//! assert!(matches!(tier.read(1), Err(TierError::Missing { sample: 1 })));
//! # Ok::<(), TierError>(())
//! ```

mod alloc;
mod error;
#[cfg(any(test, fuzzing))]
mod fuzz;
mod index;
mod io;
mod tier;

pub use alloc::{extent_bytes, BLOCK_BYTES};
pub use error::{Damage, TierError};
pub use index::IndexError;
pub use tier::{DiskTier, IndexStatus, TierOptions, TierStats, SEGMENTS_MAX};

/// Checker run by the `tier_index` fuzz target: arbitrary bytes as a tier's index are
/// refused, or give disjoint entries of the size table's sizes that encode back to them.
#[cfg(fuzzing)]
pub fn fuzz_check_tier_index(data: &[u8]) {
    fuzz::check_index(data);
}
