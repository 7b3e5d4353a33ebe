//! The outcome of one read, as handed to the caller.

use bytes::Bytes;

use crate::error::ReadError;
use crate::pool::PoolBuf;

/// The outcome of one [`crate::ReadRequest`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Completion {
    /// The request's tag.
    pub tag: u64,
    /// The request's class.
    pub class: usize,
    /// Exactly the requested bytes, or what went wrong.
    pub result: Result<Bytes, ReadError>,
    /// Holds a pool buffer while an error completion is undelivered, so that the completion
    /// channel never holds more entries than the pool has blocks.
    _permit: Option<PoolBuf>,
}

impl Completion {
    /// A completion; `permit` is the buffer an error (or empty) result keeps out of the pool.
    pub(crate) fn new(
        tag: u64,
        class: usize,
        result: Result<Bytes, ReadError>,
        permit: Option<PoolBuf>,
    ) -> Completion {
        Completion {
            tag,
            class,
            result,
            _permit: permit,
        }
    }
}
