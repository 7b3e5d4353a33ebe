//! What can go wrong with an array file.

use std::fmt;

/// An `.npy` file or `.npz` archive that cannot be parsed, or arrays that cannot be stacked.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArrayError {
    /// No `\x93NUMPY` magic: the first bytes, in hex.
    NotNpy { magic: String },
    /// A format version other than 1.0, 2.0 and 3.0.
    Version { major: u8, minor: u8 },
    /// Bytes that end inside `what`, which needs `needed_bytes` from the start.
    Truncated {
        what: &'static str,
        needed_bytes: u64,
        actual_bytes: u64,
    },
    /// A header longer than the bound: refused before it is read.
    HeaderTooLong {
        header_bytes: u64,
        header_bytes_max: u64,
    },
    /// A header that is not the dict numpy writes; `offset` counts from the file's start.
    Header { offset: u64, reason: String },
    /// A dtype other than a bool, integer, float or complex scalar (structured, object,
    /// string, datetime...): the descr as written.
    UnsupportedDescr { descr: String },
    /// A shape of more dimensions than the bound.
    TooManyDims { ndim_max: usize },
    /// A shape whose element count or byte size does not fit (more than 2^63 - 1), or a
    /// dimension numpy could not hold.
    SizeOverflow { shape: Vec<u64>, item_bytes: u64 },
    /// Data larger than the caller's bound: refused before anything is copied.
    TooLarge { data_bytes: u64, bytes_max: u64 },
    /// Data of another length than shape and dtype need: cut short, or with bytes after it.
    DataLength {
        expected_bytes: u64,
        actual_bytes: u64,
    },
    /// No zip end-of-central-directory record at the end: not an `.npz` archive.
    NoEndRecord { file_bytes: u64 },
    /// A zip structure that is malformed at `offset` (the record's start).
    Zip { offset: u64, reason: String },
    /// An archive of more members than the bound.
    TooManyMembers { members: u64, members_max: u64 },
    /// A member name longer than the bound; `offset` is its central directory entry's.
    NameTooLong {
        offset: u64,
        name_bytes: u64,
        name_bytes_max: u64,
    },
    /// A member compressed with `method` (8 is deflate, `np.savez_compressed`).
    Compressed { name: String, method: u16 },
    /// An encrypted member.
    Encrypted { name: String },
    /// A member whose name does not end in `.npy` (`np.load` gives its raw bytes).
    NotNpyMember { name: String },
    /// Two members of the same name.
    DuplicateKey { key: String },
    /// A member whose local header or data is malformed or out of place.
    BadMember {
        name: String,
        offset: u64,
        reason: String,
    },
    /// Two members whose bytes overlap.
    Overlap { name: String, other: String },
    /// A member whose data does not have the CRC-32 its directory entry gives.
    Crc {
        name: String,
        expected: u32,
        actual: u32,
    },
    /// A member whose `.npy` bytes do not parse.
    Member {
        name: String,
        source: Box<ArrayError>,
    },
    /// Nothing to stack.
    NoArrays,
    /// An array to stack of another dtype or shape than the first: both, as `descr shape`.
    Mismatch {
        index: usize,
        expected: String,
        actual: String,
    },
    /// An array to stack in Fortran order with more than one dimension longer than 1, so its
    /// bytes are not its C-order bytes.
    FortranOrder { index: usize, shape: Vec<u64> },
    /// An array to stack whose data range lies outside the bytes given with it.
    OutOfInput {
        index: usize,
        start: u64,
        end: u64,
        input_bytes: u64,
    },
    /// A buffer of the wrong size.
    Buffer { expected: u64, actual: u64 },
}

impl fmt::Display for ArrayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArrayError::NotNpy { magic } => {
                write!(f, "not an .npy file (first bytes {magic}, not 93 NUMPY)")
            }
            ArrayError::Version { major, minor } => write!(
                f,
                "npy format version {major}.{minor} (only 1.0, 2.0 and 3.0 are known)"
            ),
            ArrayError::Truncated {
                what,
                needed_bytes,
                actual_bytes,
            } => write!(
                f,
                "cut short: the {what} needs {needed_bytes} bytes, the input has {actual_bytes}"
            ),
            ArrayError::HeaderTooLong {
                header_bytes,
                header_bytes_max,
            } => write!(
                f,
                "an npy header of {header_bytes} bytes, more than the bound of \
                 {header_bytes_max}"
            ),
            ArrayError::Header { offset, reason } => {
                write!(f, "npy header, at byte {offset}: {reason}")
            }
            ArrayError::UnsupportedDescr { descr } => write!(
                f,
                "dtype {descr:?} is not supported: only bool, int, uint, float and complex \
                 scalars (b1 i1 u1 i2 u2 i4 u4 i8 u8 f2 f4 f8 c8 c16)"
            ),
            ArrayError::TooManyDims { ndim_max } => {
                write!(f, "a shape of more than {ndim_max} dimensions")
            }
            ArrayError::SizeOverflow { shape, item_bytes } => write!(
                f,
                "shape {shape:?} of {item_bytes}-byte items is too large to address"
            ),
            ArrayError::TooLarge {
                data_bytes,
                bytes_max,
            } => write!(
                f,
                "{data_bytes} bytes of data, more than the bound of {bytes_max} (bytes_max)"
            ),
            ArrayError::DataLength {
                expected_bytes,
                actual_bytes,
            } => {
                let how = if actual_bytes < expected_bytes {
                    "cut short"
                } else {
                    "bytes after the data"
                };
                write!(
                    f,
                    "{actual_bytes} bytes of data where shape and dtype need {expected_bytes} \
                     ({how})"
                )
            }
            ArrayError::NoEndRecord { file_bytes } => write!(
                f,
                "no zip end-of-central-directory record in the last bytes of {file_bytes}: \
                 not an .npz archive"
            ),
            ArrayError::Zip { offset, reason } => write!(f, "zip, at byte {offset}: {reason}"),
            ArrayError::TooManyMembers {
                members,
                members_max,
            } => write!(
                f,
                "an archive of {members} members, more than the bound of {members_max}"
            ),
            ArrayError::NameTooLong {
                offset,
                name_bytes,
                name_bytes_max,
            } => write!(
                f,
                "the member of the directory entry at byte {offset} has a name of \
                 {name_bytes} bytes, more than the bound of {name_bytes_max}"
            ),
            ArrayError::Compressed { name, method } => {
                let how = if *method == 8 {
                    "deflated, as np.savez_compressed writes"
                } else {
                    "compressed"
                };
                write!(
                    f,
                    "member {name:?} is {how} (zip method {method}): compressed .npz is not \
                     decoded natively, only stored members (np.savez)"
                )
            }
            ArrayError::Encrypted { name } => write!(f, "member {name:?} is encrypted"),
            ArrayError::NotNpyMember { name } => write!(
                f,
                "member {name:?} is not an .npy array (its name does not end in .npy)"
            ),
            ArrayError::DuplicateKey { key } => {
                write!(f, "two members of the key {key:?}")
            }
            ArrayError::BadMember {
                name,
                offset,
                reason,
            } => write!(f, "member {name:?}, at byte {offset}: {reason}"),
            ArrayError::Overlap { name, other } => {
                write!(f, "the bytes of members {name:?} and {other:?} overlap")
            }
            ArrayError::Crc {
                name,
                expected,
                actual,
            } => write!(
                f,
                "member {name:?} has CRC-32 {actual:08x} where its directory entry gives \
                 {expected:08x}"
            ),
            ArrayError::Member { name, source } => write!(f, "member {name:?}: {source}"),
            ArrayError::NoArrays => write!(f, "no arrays to stack"),
            ArrayError::Mismatch {
                index,
                expected,
                actual,
            } => write!(
                f,
                "array {index} is {actual} where the first is {expected}: they do not stack"
            ),
            ArrayError::FortranOrder { index, shape } => write!(
                f,
                "array {index} of shape {shape:?} is in Fortran order: its bytes are not \
                 those of a C-order row of the stack"
            ),
            ArrayError::OutOfInput {
                index,
                start,
                end,
                input_bytes,
            } => write!(
                f,
                "array {index}'s data at bytes {start}..{end} is outside the {input_bytes} \
                 bytes given with it"
            ),
            ArrayError::Buffer { expected, actual } => {
                write!(f, "a buffer of {actual} bytes where {expected} are needed")
            }
        }
    }
}

impl std::error::Error for ArrayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ArrayError::Member { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}
