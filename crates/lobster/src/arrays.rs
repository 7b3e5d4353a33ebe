//! Array samples: numpy's `.npy` files and stored `.npz` archives, parsed in memory without
//! copying their data (lobster-array): a parsed array names its dtype, shape and order and
//! the range of its data in the sample's bytes, which a decode copies straight into its
//! output.
//!
//! ```
//! use lobster_io::arrays::{parse_npy, BYTES_MAX_DEFAULT};
//!
//! fn values(sample: &[u8]) -> Result<Vec<u8>, lobster_io::arrays::ArrayError> {
//!     let array = parse_npy(sample, BYTES_MAX_DEFAULT)?;
//!     Ok(sample[array.data_range()].to_vec())
//! }
//! # let _ = values;
//! ```

pub use lobster_array::{
    parse_npy, parse_npz, stack_into, stack_layout, ArrayError, ByteOrder, DType, Kind, NpyArray,
    NpzMember, Stack, BYTES_MAX_DEFAULT, HEADER_BYTES_MAX, MEMBERS_MAX, MEMBER_NAME_BYTES_MAX,
    NDIM_MAX,
};
