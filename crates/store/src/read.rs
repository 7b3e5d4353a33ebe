//! What a read asks for and what comes back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::error::StoreError;

/// One ranged GET of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRead {
    /// The object's key in the store's bucket.
    pub key: Arc<str>,
    /// The first byte.
    pub offset: u64,
    /// Bytes to read: exactly these come back, or an error.
    pub len: u64,
    /// The sample is the whole object: ask one byte more, so an object that grew shows
    /// ([`StoreError::Grew`]), as the local reader does for whole files.
    pub whole_object: bool,
    /// Sent as `If-Match`: an object replaced since it was indexed is [`StoreError::Changed`].
    pub if_match: Option<Arc<str>>,
    /// The caller's name for the read, given back with its completion.
    pub tag: u64,
}

impl RangeRead {
    /// A read of `len` bytes of `key` from `offset`, tagged `tag`.
    pub fn new(key: impl Into<Arc<str>>, offset: u64, len: u64, tag: u64) -> RangeRead {
        RangeRead {
            key: key.into(),
            offset,
            len,
            whole_object: false,
            if_match: None,
            tag,
        }
    }

    /// The byte range the caller wants.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset.saturating_add(self.len)
    }
}

/// An object as a listing or HEAD shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The key.
    pub key: String,
    /// The size.
    pub size_bytes: u64,
    /// The ETag, quotes included, as the server sends it.
    pub etag: Option<String>,
}

/// One level of a listing: the common prefixes and the objects.
pub(crate) type Listing = (Vec<String>, Vec<ObjectInfo>);

/// The end of one queued read.
#[derive(Debug)]
pub struct StoreCompletion {
    /// The read's tag.
    pub tag: u64,
    /// Exactly the bytes asked for, or why not.
    pub result: Result<Bytes, StoreError>,
    /// Served by a GET that an earlier read of the same flush made (coalesced): no request
    /// of its own.
    pub shared: bool,
}

/// Cumulative counts of a store's requests (not counting the client's own retries).
///
/// Each read that needs a request is either a GET of its own or one of a coalesced GET's
/// members: `get_requests` counts the GETs, `coalesced_reads` the members beyond the first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Ranged GETs made, coalesced ones counted once.
    pub get_requests: u64,
    /// Bytes of GET bodies received: the reads' bytes, and the gaps of coalesced GETs.
    pub bytes_received: u64,
    /// Reads served by another read's GET: a coalesced GET's members beyond the first.
    pub coalesced_reads: u64,
    /// Bytes received only to bridge the gaps between a coalesced GET's members, and dropped.
    pub gap_bytes: u64,
    /// LIST pages asked for.
    pub list_requests: u64,
    /// HEADs made.
    pub head_requests: u64,
    /// Requests of any kind that ended in an error.
    pub failed_requests: u64,
}

/// The counters behind [`StoreStats`], bumped by the store thread.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) get_requests: AtomicU64,
    pub(crate) bytes_received: AtomicU64,
    pub(crate) coalesced_reads: AtomicU64,
    pub(crate) gap_bytes: AtomicU64,
    pub(crate) list_requests: AtomicU64,
    pub(crate) head_requests: AtomicU64,
    pub(crate) failed_requests: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StoreStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreStats {
            get_requests: get(&self.get_requests),
            bytes_received: get(&self.bytes_received),
            coalesced_reads: get(&self.coalesced_reads),
            gap_bytes: get(&self.gap_bytes),
            list_requests: get(&self.list_requests),
            head_requests: get(&self.head_requests),
            failed_requests: get(&self.failed_requests),
        }
    }
}
