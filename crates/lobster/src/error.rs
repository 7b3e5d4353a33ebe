//! The facade's error type: every variant names what failed.

use std::fmt;
use std::path::PathBuf;

/// Why a cause is shared: one failed read can fail several batches (a cached sample is used
/// again), so causes are reference counted rather than cloned.
pub type Cause = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in lobster-io.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// A configuration parameter is outside its allowed range.
    InvalidParameter {
        /// The parameter's name as the builder or CLI spells it.
        parameter: &'static str,
        /// The value given.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// The dataset could not be opened or has an entry that cannot be used.
    Dataset {
        /// The file or directory concerned.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading a sample failed.
    Read {
        /// The sample's id.
        sample: u32,
        /// The file the sample lives in.
        path: PathBuf,
        /// The byte offset of the read.
        offset: u64,
        /// The cause, naming the OS error.
        cause: Cause,
    },
    /// A file's size differs from the size recorded when the dataset was opened.
    SizeChanged {
        /// The sample's id.
        sample: u32,
        /// The file.
        path: PathBuf,
        /// Size at open.
        expected_bytes: u64,
        /// Bytes the read returned.
        actual_bytes: u64,
    },
    /// The user's decode function rejected a sample.
    Decode {
        /// The sample's id.
        sample: u32,
        /// The file the sample came from.
        path: PathBuf,
        /// The decoder's error.
        cause: Cause,
    },
    /// The loader's pipeline stopped (a thread died or the loader was dropped).
    Stopped {
        /// Why.
        reason: String,
    },
    /// With [`OnError::Skip`](crate::OnError::Skip), an epoch skipped more samples
    /// than its budget allows.
    TooManyFailures {
        /// The epoch.
        epoch: u32,
        /// Accesses skipped in the epoch so far.
        failed: u64,
        /// Accesses the budget allows to skip in the epoch.
        allowed: u64,
        /// The node's accesses in the epoch.
        accesses: u64,
        /// The first failures of the epoch (bounded): sample id and cause.
        first: Vec<(u32, String)>,
    },
    /// A saved loader state cannot resume this loader: it belongs to another job, or its
    /// ranks disagree.
    Resume {
        /// The state's field that differs.
        field: &'static str,
        /// Its value in the state.
        saved: String,
        /// What this loader has or needs.
        now: String,
    },
    /// Bytes given as a loader state are not one (truncated, edited, damaged).
    StateUnreadable {
        /// What is wrong with them.
        reason: String,
    },
    /// The run's parameters ask for more memory than this process may have (see
    /// [`MachineMemory`](crate::MachineMemory)); refused before anything is allocated.
    Memory(crate::memory::MemoryShort),
    /// An engine crate rejected its inputs.
    Engine {
        /// Which part.
        part: &'static str,
        /// The engine's error.
        cause: Cause,
    },
}

impl Error {
    pub(crate) fn invalid(
        parameter: &'static str,
        value: impl fmt::Display,
        allowed: impl fmt::Display,
    ) -> Self {
        Error::InvalidParameter {
            parameter,
            value: value.to_string(),
            allowed: allowed.to_string(),
        }
    }

    /// A part of the engine (reader, cache planner, allocator) failed.
    pub(crate) fn engine(
        part: &'static str,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Engine {
            part,
            cause: std::sync::Arc::new(cause),
        }
    }

    pub(crate) fn dataset(path: impl Into<PathBuf>, reason: impl fmt::Display) -> Self {
        Error::Dataset {
            path: path.into(),
            reason: reason.to_string(),
        }
    }

    /// The file the error concerns, where there is one.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Error::Read { path, .. }
            | Error::SizeChanged { path, .. }
            | Error::Decode { path, .. }
            | Error::Dataset { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The sample id the error concerns, where there is one.
    pub fn sample(&self) -> Option<u32> {
        match self {
            Error::Read { sample, .. }
            | Error::SizeChanged { sample, .. }
            | Error::Decode { sample, .. } => Some(*sample),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidParameter {
                parameter,
                value,
                allowed,
            } => {
                write!(f, "invalid {parameter} = {value}: allowed {allowed}")
            }
            // A store's errors name their object already: the entry once, not twice.
            Error::Dataset { path, reason } => match path.to_str() {
                Some(p) if reason.strip_prefix(p).is_some_and(|r| r.starts_with(':')) => {
                    write!(f, "dataset entry {reason}")
                }
                _ => write!(f, "dataset entry {}: {reason}", path.display()),
            },
            Error::Read {
                sample,
                path,
                offset,
                cause,
            } => write!(
                f,
                "reading sample {sample} from {} at offset {offset} failed: {cause}",
                path.display()
            ),
            Error::SizeChanged {
                sample,
                path,
                expected_bytes,
                actual_bytes,
            } => write!(
                f,
                "sample {sample} ({}) changed size since the dataset was opened: \
                 {expected_bytes} bytes expected, {actual_bytes} read",
                path.display()
            ),
            Error::Decode {
                sample,
                path,
                cause,
            } => {
                write!(
                    f,
                    "decoding sample {sample} ({}) failed: {cause}",
                    path.display()
                )
            }
            Error::Stopped { reason } => write!(f, "loader stopped: {reason}"),
            Error::Memory(short) => short.fmt(f),
            Error::TooManyFailures {
                epoch,
                failed,
                allowed,
                accesses,
                first,
            } => {
                write!(
                    f,
                    "epoch {epoch} skipped {failed} of {accesses} samples, more than the \
                     {allowed} allowed; first failures:"
                )?;
                for (sample, cause) in first {
                    write!(f, " [sample {sample}: {cause}]")?;
                }
                Ok(())
            }
            Error::Resume { field, saved, now } => write!(
                f,
                "cannot resume from this state: its {field} is {saved}, this loader's {now}"
            ),
            Error::StateUnreadable { reason } => write!(f, "unreadable loader state: {reason}"),
            Error::Engine { part, cause } => write!(f, "{part}: {cause}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Read { cause, .. }
            | Error::Decode { cause, .. }
            | Error::Engine { cause, .. } => Some(cause.as_ref()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn a_dataset_entry_is_named_once() {
        let store = Error::dataset("s3://b/k.tar", "s3://b/k.tar: no such object");
        assert_eq!(
            store.to_string(),
            "dataset entry s3://b/k.tar: no such object"
        );
        let other = Error::dataset("s3://b/", "s3://b/k.tar: no such object");
        assert_eq!(
            other.to_string(),
            "dataset entry s3://b/: s3://b/k.tar: no such object"
        );
        let file = Error::dataset("/data/x.tar", "truncated header");
        assert_eq!(
            file.to_string(),
            "dataset entry /data/x.tar: truncated header"
        );
    }
}
