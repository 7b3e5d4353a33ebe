//! The outcome of one read, as handed to the caller.

use bytes::Bytes;

use crate::error::ReadError;
use crate::pool::PoolBuf;

/// The outcome of one read ([`crate::ReadRequest`] or [`crate::PathRead`]), from
/// [`crate::Session::wait`] or [`crate::Session::poll`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Completion {
    /// The request's tag.
    pub tag: u64,
    /// The request's class.
    pub class: usize,
    /// Exactly the requested bytes, or what went wrong.
    pub result: Result<Bytes, ReadError>,
    /// Holds the read's pool block while an error (or empty) completion lives, as bytes do,
    /// so that the completions a caller holds never outnumber the pool's blocks.
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
