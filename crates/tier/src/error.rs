//! What a tier's calls can fail on, naming the file and the sample.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// How an entry's bytes on the disk were found wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Damage {
    /// The file ended before the entry did.
    Short { got_bytes: u64, want_bytes: u64 },
    /// The bytes' CRC32 is not the one written.
    Checksum { expected: u32, found: u32 },
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::Short {
                got_bytes,
                want_bytes,
            } => write!(f, "short read: {got_bytes} of {want_bytes} bytes"),
            Damage::Checksum { expected, found } => {
                write!(f, "CRC32 {found:08x}, written as {expected:08x}")
            }
        }
    }
}

/// An error of the disk tier.
#[derive(Debug)]
#[non_exhaustive]
pub enum TierError {
    /// A capacity under one 4 KiB block.
    Capacity { capacity_bytes: u64 },
    /// A system call on `path` failed (`sample`: the entry it was for, if any).
    Io {
        path: PathBuf,
        op: &'static str,
        sample: Option<u32>,
        source: io::Error,
    },
    /// Another open tier (in this process or another) holds the directory.
    Busy { dir: PathBuf },
    /// A sample id past the size table.
    SampleOutOfRange { sample: u32, num_samples: usize },
    /// Bytes of another length than the size table's for the sample.
    SizeMismatch {
        sample: u32,
        len_bytes: usize,
        size_bytes: u32,
    },
    /// No free extent holds the sample's: nothing was written.
    Full {
        sample: u32,
        extent_bytes: u64,
        free_bytes: u64,
        capacity_bytes: u64,
    },
    /// The sample has an entry already (or one being written).
    Exists { sample: u32 },
    /// The sample has no entry.
    Missing { sample: u32 },
    /// The sample's entry is still being written.
    Pending { sample: u32 },
    /// The sample's bytes on the disk are not those written: the entry was dropped.
    Damaged {
        sample: u32,
        file: PathBuf,
        offset: u64,
        damage: Damage,
    },
}

impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TierError::Capacity { capacity_bytes } => write!(
                f,
                "disk tier capacity of {capacity_bytes} bytes is under one 4096-byte block"
            ),
            TierError::Io {
                path,
                op,
                sample,
                source,
            } => {
                write!(f, "disk tier: {op} {}", path.display())?;
                if let Some(s) = sample {
                    write!(f, " (sample {s})")?;
                }
                write!(f, ": {source}")
            }
            TierError::Busy { dir } => write!(
                f,
                "disk tier {} is in use by another loader (it holds its lock)",
                dir.display()
            ),
            TierError::SampleOutOfRange {
                sample,
                num_samples,
            } => write!(
                f,
                "disk tier: sample {sample} is past the size table's {num_samples} samples"
            ),
            TierError::SizeMismatch {
                sample,
                len_bytes,
                size_bytes,
            } => write!(
                f,
                "disk tier: sample {sample} has {len_bytes} bytes, its size is {size_bytes}"
            ),
            TierError::Full {
                sample,
                extent_bytes,
                free_bytes,
                capacity_bytes,
            } => write!(
                f,
                "disk tier full: no free extent of {extent_bytes} bytes for sample {sample} \
                 ({free_bytes} of {capacity_bytes} bytes free)"
            ),
            TierError::Exists { sample } => {
                write!(f, "disk tier: sample {sample} has an entry already")
            }
            TierError::Missing { sample } => {
                write!(f, "disk tier: sample {sample} has no entry")
            }
            TierError::Pending { sample } => {
                write!(f, "disk tier: sample {sample} is still being written")
            }
            TierError::Damaged {
                sample,
                file,
                offset,
                damage,
            } => write!(
                f,
                "disk tier: sample {sample} in {} at {offset}: {damage}; entry dropped",
                file.display()
            ),
        }
    }
}

impl std::error::Error for TierError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TierError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
