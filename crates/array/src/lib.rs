//! Array samples for lobster-io, with no I/O: numpy's `.npy` files (format versions 1.0, 2.0
//! and 3.0) and `.npz` archives of stored members (`np.savez`, zip64 included), parsed from
//! bytes already in memory without copying their data. A parsed array gives its dtype (a
//! bool, integer, float or complex scalar; anything else is refused naming its descr), its
//! shape and order, and the range of its data in the bytes, so a caller copies
//! `&bytes[range]` straight into a batch; [`stack_into`] does that for one array per sample,
//! into one `[B, ...]` buffer. Every size from the input is bounded and checked: the header
//! ([`HEADER_BYTES_MAX`]), the dimensions ([`NDIM_MAX`]), the data (the caller's `bytes_max`,
//! refused before anything is copied), an archive's members ([`MEMBERS_MAX`]) and their
//! names ([`MEMBER_NAME_BYTES_MAX`]). Compressed archives (`np.savez_compressed`) are refused.
//!
//! ```
//! use lobster_array::{parse_npy, stack_into, BYTES_MAX_DEFAULT};
//!
//! // np.save of np.arange(3, dtype='<u2'): the header dict, padded to 128 bytes.
//! let mut file = b"\x93NUMPY\x01\x00\x76\x00".to_vec();
//! let header = "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }";
//! file.extend_from_slice(format!("{header:<117}\n").as_bytes());
//! file.extend_from_slice(&[0, 0, 1, 0, 2, 0]);
//!
//! let array = parse_npy(&file, BYTES_MAX_DEFAULT).unwrap();
//! assert_eq!((array.dtype().descr(), array.shape()), ("<u2".to_string(), &[3u64][..]));
//! assert_eq!(&file[array.data_range()], &[0, 0, 1, 0, 2, 0]);
//!
//! // Two samples of it stacked into one [2, 3] batch.
//! let mut batch = vec![0u8; 12];
//! let stack = stack_into(&[(&array, &file[..]), (&array, &file[..])], &mut batch).unwrap();
//! assert_eq!(stack.shape(), &[2, 3]);
//! ```

#![forbid(unsafe_code)]

#[cfg(any(test, fuzzing))]
mod check;
mod collate;
mod dtype;
mod error;
mod header;
mod npy;
mod npz;
mod zip;

pub use collate::{stack_into, stack_layout, Stack};
pub use dtype::{ByteOrder, DType, Kind};
pub use error::ArrayError;
pub use header::NDIM_MAX;
pub use npy::{parse_npy, NpyArray, BYTES_MAX_DEFAULT, HEADER_BYTES_MAX};
pub use npz::{parse_npz, NpzMember};
pub use zip::{MEMBERS_MAX, MEMBER_NAME_BYTES_MAX};

/// Checker run by the array formats fuzz target: arbitrary bytes (or a numpy fixture with
/// arbitrary edits, or an archive of edited fixtures) through the `.npy` and `.npz` parsers
/// and the stacking under a small data bound; panics if any panics, if a data range is not
/// inside the input or not as long as shape and dtype say, if members overlap, or if an
/// array differs from what the reference writer's file of it parses to.
#[cfg(fuzzing)]
pub fn fuzz_check_formats(data: &[u8]) {
    check::check_bytes(data);
}
