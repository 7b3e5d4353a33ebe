//! lobster-cache: a clairvoyant sample cache over a known access stream.
//!
//! Pure logic: no I/O, no threads of its own.
#![forbid(unsafe_code)]
