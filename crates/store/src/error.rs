//! What can go wrong between a range and its bytes, each naming the object and byte range.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The error a request failed with, shared by clones of the error.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store operation failed. Every variant names what it failed on (`s3://bucket/key`, the
/// byte range `a..b`, the file and line of a profile); none carries a credential.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// A store URL that is not `s3://bucket[/key]`.
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A setting that cannot be used.
    Config {
        /// The setting: an environment variable, a profile key, a builder method.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A line of an AWS config or credentials file that cannot be used.
    Profile {
        /// The file.
        file: PathBuf,
        /// The line, from 1; 0 for the file as a whole.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The bucket does not exist at the endpoint.
    NoSuchBucket {
        /// `s3://bucket`.
        url: String,
        /// The server's answer.
        cause: Cause,
    },
    /// The credentials are refused, or lack the permission.
    AccessDenied {
        /// `s3://bucket` or `s3://bucket/key`.
        url: String,
        /// The server's answer.
        cause: Cause,
    },
    /// No object under that key.
    NotFound {
        /// `s3://bucket/key`.
        url: String,
    },
    /// The object no longer has the ETag it was indexed with: it was replaced.
    Changed {
        /// `s3://bucket/key`.
        url: String,
        /// The byte range asked for.
        range: Range<u64>,
        /// The ETag it was indexed with.
        etag: Arc<str>,
    },
    /// Fewer bytes came back than were asked for: the object is shorter than its index says.
    Short {
        /// `s3://bucket/key`.
        url: String,
        /// The byte range asked for.
        range: Range<u64>,
        /// The bytes that came back.
        got_bytes: u64,
    },
    /// A whole object is longer than its index says.
    Grew {
        /// `s3://bucket/key`.
        url: String,
        /// The size it was indexed with.
        size_bytes: u64,
    },
    /// No answer within the request deadline, retries included.
    Deadline {
        /// `s3://bucket/key`, or `s3://bucket/prefix` for a listing.
        url: String,
        /// The byte range asked for, for a read.
        range: Option<Range<u64>>,
        /// The deadline.
        deadline: Duration,
        /// The last failure before the deadline, when one came back.
        cause: Option<Cause>,
    },
    /// The request failed for good: a final HTTP status, or the store's retries spent.
    Request {
        /// `s3://bucket/key`, or `s3://bucket/prefix` for a listing.
        url: String,
        /// The byte range asked for, for a read.
        range: Option<Range<u64>>,
        /// The HTTP status, when the server answered one.
        status: Option<u16>,
        /// What failed.
        cause: Cause,
    },
    /// A listing longer than the bound on one listing.
    TooManyObjects {
        /// `s3://bucket/prefix`.
        url: String,
        /// The most one listing returns.
        max: usize,
    },
    /// The store thread could not start.
    Start {
        /// What failed.
        cause: Cause,
    },
    /// The store thread has stopped: the request was not made, or its answer was dropped.
    Stopped,
}

impl StoreError {
    /// Whether trying again soon may succeed where the store itself did not retry.
    ///
    /// The store retries 5xx, 429, timeouts and stalled bodies until the request deadline, so a
    /// `Deadline` is not transient: the deadline is spent. A `Request` error is transient only
    /// when it is one of those kinds (a 5xx or 429, or no status at all) and came back before
    /// the deadline, which is when the client's retry count ran out first. Final answers (403,
    /// 404, 412, 416, a short or grown object) never are.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Request { status, .. }
            if matches!(status, None | Some(429) | Some(500..=599)))
    }

    /// The `s3://bucket/key` the error names, if it names one.
    pub fn url(&self) -> Option<&str> {
        match self {
            StoreError::Url { url, .. }
            | StoreError::NoSuchBucket { url, .. }
            | StoreError::AccessDenied { url, .. }
            | StoreError::NotFound { url }
            | StoreError::Changed { url, .. }
            | StoreError::Short { url, .. }
            | StoreError::Grew { url, .. }
            | StoreError::Deadline { url, .. }
            | StoreError::Request { url, .. }
            | StoreError::TooManyObjects { url, .. } => Some(url),
            StoreError::Config { .. }
            | StoreError::Profile { .. }
            | StoreError::Start { .. }
            | StoreError::Stopped => None,
        }
    }
}

struct Bytes<'a>(&'a Option<Range<u64>>);

impl fmt::Display for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, " bytes {}..{}", r.start, r.end),
            None => Ok(()),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Url { url, reason } => write!(f, "store URL {url:?}: {reason}"),
            StoreError::Config { key, reason } => write!(f, "store setting {key}: {reason}"),
            StoreError::Profile { file, line, reason } => {
                write!(f, "{}", file.display())?;
                if *line > 0 {
                    write!(f, ":{line}")?;
                }
                write!(f, ": {reason}")
            }
            StoreError::NoSuchBucket { url, cause } => {
                write!(f, "{url}: no such bucket ({cause})")
            }
            StoreError::AccessDenied { url, cause } => {
                write!(f, "{url}: access denied, check the credentials ({cause})")
            }
            StoreError::NotFound { url } => write!(f, "{url}: no such object"),
            StoreError::Changed { url, range, etag } => write!(
                f,
                "{url} bytes {}..{}: the object changed since it was indexed (ETag {etag} no longer matches)",
                range.start, range.end
            ),
            StoreError::Short { url, range, got_bytes } => write!(
                f,
                "{url} bytes {}..{}: got {got_bytes} bytes, the object is shorter than its index says",
                range.start, range.end
            ),
            StoreError::Grew { url, size_bytes } => write!(
                f,
                "{url}: the object is longer than the {size_bytes} bytes it was indexed with"
            ),
            StoreError::Deadline { url, range, deadline, cause } => {
                write!(f, "{url}{}: no answer within the deadline of {deadline:?}", Bytes(range))?;
                match cause {
                    Some(c) => write!(f, " (last failure: {c})"),
                    None => Ok(()),
                }
            }
            StoreError::Request { url, range, status, cause } => {
                write!(f, "{url}{}: request failed", Bytes(range))?;
                if let Some(s) = status {
                    write!(f, " with HTTP {s}")?;
                }
                write!(f, ": {cause}")
            }
            StoreError::TooManyObjects { url, max } => {
                write!(f, "{url}: more than {max} objects under the prefix, list a narrower one")
            }
            StoreError::Start { cause } => write!(f, "the store thread could not start: {cause}"),
            StoreError::Stopped => write!(f, "the store thread has stopped"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::NoSuchBucket { cause, .. }
            | StoreError::AccessDenied { cause, .. }
            | StoreError::Request { cause, .. }
            | StoreError::Start { cause }
            | StoreError::Deadline {
                cause: Some(cause), ..
            } => Some(&**cause),
            _ => None,
        }
    }
}

/// A cause made from a message of ours.
pub(crate) fn message(text: impl Into<String>) -> Cause {
    Arc::new(Message(text.into()))
}

#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Message {}
