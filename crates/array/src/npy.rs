//! `.npy` files: the magic, the version, the header, and where the data lies.

use std::ops::Range;

use crate::dtype::DType;
use crate::error::ArrayError;
use crate::header::{self, Header};

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The bound on a header's length. numpy refuses to read headers past the same 10000 bytes
/// unless told to trust the file (`max_header_size`); the header of the largest simple array
/// (64 dimensions of 20 digits) is under 1500.
pub const HEADER_BYTES_MAX: usize = 10_000;

/// A default for the bound on an array's data (`bytes_max`): 1 GiB, more than a training
/// sample holds, small enough that a hostile header cannot make a caller reserve much.
pub const BYTES_MAX_DEFAULT: u64 = 1 << 30;

/// An array in `.npy` bytes: its dtype, shape and order, and where its data lies in the
/// bytes it was parsed from, so a caller copies `&bytes[array.data_range()]` straight into
/// a batch. The data range's length is always `elements() * dtype().item_bytes()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyArray {
    dtype: DType,
    shape: Vec<u64>,
    fortran_order: bool,
    data: Range<usize>,
}

impl NpyArray {
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dimensions; empty for a 0-d array (one element).
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Whether the data is in column-major (Fortran) order rather than row-major (C).
    pub fn fortran_order(&self) -> bool {
        self.fortran_order
    }

    /// Where the data lies in the bytes parsed (for an `.npz` member, in the whole archive).
    pub fn data_range(&self) -> Range<usize> {
        self.data.clone()
    }

    /// The data, from the bytes this array was parsed from; `None` if they are shorter.
    pub fn data<'a>(&self, bytes: &'a [u8]) -> Option<&'a [u8]> {
        bytes.get(self.data.clone())
    }

    /// The product of the shape (1 for a 0-d array).
    pub fn elements(&self) -> u64 {
        // Checked when parsed: a zero dimension makes 0, else the product fits.
        if self.shape.contains(&0) {
            0
        } else {
            self.shape.iter().product()
        }
    }

    pub fn data_bytes(&self) -> u64 {
        self.data.len() as u64
    }

    /// The same array in bytes that hold the bytes it was parsed from at `offset`.
    pub(crate) fn shifted(mut self, offset: usize) -> NpyArray {
        // Both ends are indices into those larger bytes: no overflow.
        self.data = self.data.start + offset..self.data.end + offset;
        self
    }
}

/// Parses `.npy` bytes (format versions 1.0, 2.0 and 3.0) without copying its data. Refuses
/// a dtype other than a bool, integer, float or complex scalar, a header past
/// [`HEADER_BYTES_MAX`], a shape past [`NDIM_MAX`](crate::NDIM_MAX) dimensions, data of more
/// than `bytes_max` bytes (before anything is copied), and data of another length than shape
/// and dtype need.
pub fn parse_npy(bytes: &[u8], bytes_max: u64) -> Result<NpyArray, ArrayError> {
    let file_bytes = bytes.len() as u64;
    let truncated = |what, needed_bytes: usize| ArrayError::Truncated {
        what,
        needed_bytes: needed_bytes as u64,
        actual_bytes: file_bytes,
    };
    if !bytes.starts_with(MAGIC) {
        if MAGIC.starts_with(bytes) {
            return Err(truncated("npy magic", MAGIC.len()));
        }
        let magic = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Err(ArrayError::NotNpy { magic });
    }
    let (major, minor) = match bytes.get(6..8) {
        Some(&[major, minor]) => (major, minor),
        _ => return Err(truncated("npy version", 8)),
    };
    let (length_bytes, long_ints) = match (major, minor) {
        (1, 0) => (2, true),
        (2, 0) => (4, true),
        (3, 0) => (4, false),
        _ => return Err(ArrayError::Version { major, minor }),
    };
    let header_start = 8 + length_bytes;
    let Some(length) = bytes.get(8..header_start) else {
        return Err(truncated("npy header length", header_start));
    };
    // Little-endian, of 2 or 4 bytes.
    let header_bytes = length
        .iter()
        .rev()
        .fold(0u64, |value, &b| value << 8 | u64::from(b));
    if header_bytes > HEADER_BYTES_MAX as u64 {
        return Err(ArrayError::HeaderTooLong {
            header_bytes,
            header_bytes_max: HEADER_BYTES_MAX as u64,
        });
    }
    // At most 12 + HEADER_BYTES_MAX.
    let data_start = header_start + header_bytes as usize;
    let Some(text) = bytes.get(header_start..data_start) else {
        return Err(truncated("npy header", data_start));
    };
    let Header {
        descr,
        fortran_order,
        shape,
    } = header::parse(text, header_start as u64, long_ints)?;
    let dtype = DType::from_descr(&descr)?;
    let expected_bytes = data_bytes(&shape, dtype)?;
    if expected_bytes > bytes_max {
        return Err(ArrayError::TooLarge {
            data_bytes: expected_bytes,
            bytes_max,
        });
    }
    let actual_bytes = (bytes.len() - data_start) as u64;
    if actual_bytes != expected_bytes {
        return Err(ArrayError::DataLength {
            expected_bytes,
            actual_bytes,
        });
    }
    Ok(NpyArray {
        dtype,
        shape,
        fortran_order,
        data: data_start..bytes.len(),
    })
}

/// The bytes of an array of `shape` and `dtype`, if numpy could hold it: every dimension and
/// the byte size at most 2^63 - 1 (numpy's `intp`), a zero dimension making 0 whatever the
/// others are, as numpy counts.
fn data_bytes(shape: &[u64], dtype: DType) -> Result<u64, ArrayError> {
    let item_bytes = dtype.item_bytes() as u64;
    let overflow = || ArrayError::SizeOverflow {
        shape: shape.to_vec(),
        item_bytes,
    };
    let intp_max = i64::MAX as u64;
    if shape.iter().any(|&d| d > intp_max) {
        return Err(overflow());
    }
    if shape.contains(&0) {
        return Ok(0);
    }
    let bytes = shape
        .iter()
        .try_fold(item_bytes, |bytes, &d| bytes.checked_mul(d))
        .filter(|&bytes| bytes <= intp_max && usize::try_from(bytes).is_ok())
        .ok_or_else(overflow)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::encode_npy;

    const HEADER: &str = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";

    fn f4_3x4() -> Vec<u8> {
        let data: Vec<u8> = (0..12u8).flat_map(|i| f32::from(i).to_le_bytes()).collect();
        encode_npy("<f4", false, &[3, 4], (1, 0), &data)
    }

    #[test]
    fn an_array_parses_to_its_dtype_shape_and_data() {
        let file = f4_3x4();
        let a = parse_npy(&file, BYTES_MAX_DEFAULT).unwrap();
        assert_eq!(a.dtype().descr(), "<f4");
        assert_eq!((a.shape(), a.fortran_order()), (&[3u64, 4][..], false));
        assert_eq!((a.elements(), a.data_bytes()), (12, 48));
        assert_eq!(a.data_range(), file.len() - 48..file.len());
        assert_eq!(a.data_range().start % 64, 0, "numpy aligns the data to 64");
        assert_eq!(&a.data(&file).unwrap()[4..8], &1f32.to_le_bytes());
    }

    #[test]
    fn versions_2_and_3_parse_and_others_are_refused() {
        for version in [(2, 0), (3, 0)] {
            let file = encode_npy("|u1", true, &[2], version, &[5, 6]);
            let a = parse_npy(&file, 100).unwrap();
            assert_eq!((a.shape(), a.fortran_order()), (&[2u64][..], true));
            assert_eq!(a.data(&file), Some(&[5u8, 6][..]));
        }
        for (major, minor) in [(0, 0), (1, 1), (4, 0), (2, 1)] {
            let mut file = encode_npy("|u1", false, &[2], (1, 0), &[5, 6]);
            file[6..8].copy_from_slice(&[major, minor]);
            assert_eq!(
                parse_npy(&file, 100),
                Err(ArrayError::Version { major, minor })
            );
        }
    }

    #[test]
    fn zero_d_and_empty_arrays_parse() {
        let file = encode_npy("<i8", false, &[], (1, 0), &7i64.to_le_bytes());
        let a = parse_npy(&file, 8).unwrap();
        assert_eq!((a.shape().len(), a.elements(), a.data_bytes()), (0, 1, 8));
        // A zero dimension makes 0 elements however large the others are.
        let big = i64::MAX as u64;
        let file = encode_npy("<c16", false, &[big, 0, big], (1, 0), &[]);
        let a = parse_npy(&file, 0).unwrap();
        assert_eq!((a.elements(), a.data_bytes()), (0, 0));
        assert_eq!(a.data_range(), file.len()..file.len());
    }

    #[test]
    fn other_magic_and_short_preambles_are_refused() {
        assert_eq!(
            parse_npy(b"PK\x03\x04 not npy", 100),
            Err(ArrayError::NotNpy {
                magic: "504b0304206e6f74".into()
            })
        );
        assert!(matches!(
            parse_npy(b"", 100),
            Err(ArrayError::Truncated {
                what: "npy magic",
                ..
            })
        ));
        assert!(matches!(
            parse_npy(b"\x93NUM", 100),
            Err(ArrayError::Truncated {
                what: "npy magic",
                ..
            })
        ));
        let file = f4_3x4();
        for (cut, what) in [
            (7, "npy version"),
            (9, "npy header length"),
            (60, "npy header"),
        ] {
            match parse_npy(&file[..cut], 100) {
                Err(ArrayError::Truncated {
                    what: w,
                    actual_bytes,
                    ..
                }) => assert_eq!((w, actual_bytes), (what, cut as u64)),
                other => panic!("{cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_header_past_the_bound_is_refused_before_it_is_read() {
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(&[2, 0]);
        file.extend_from_slice(&(HEADER_BYTES_MAX as u32 + 1).to_le_bytes());
        assert_eq!(
            parse_npy(&file, 100),
            Err(ArrayError::HeaderTooLong {
                header_bytes: HEADER_BYTES_MAX as u64 + 1,
                header_bytes_max: HEADER_BYTES_MAX as u64
            })
        );
        // Exactly the bound is read.
        let mut text = HEADER.replace("(3, 4)", "(0,)");
        text.push_str(&" ".repeat(HEADER_BYTES_MAX - text.len() - 1));
        text.push('\n');
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(&[2, 0]);
        file.extend_from_slice(&(text.len() as u32).to_le_bytes());
        file.extend_from_slice(text.as_bytes());
        assert_eq!(parse_npy(&file, 0).unwrap().elements(), 0);
    }

    #[test]
    fn data_past_the_bound_is_refused_before_its_length_is_checked() {
        // The header claims 2^40 floats; the file holds none of them.
        let file = encode_npy("<f4", false, &[1 << 20, 1 << 20], (1, 0), &[]);
        assert_eq!(
            parse_npy(&file, BYTES_MAX_DEFAULT),
            Err(ArrayError::TooLarge {
                data_bytes: 4 << 40,
                bytes_max: BYTES_MAX_DEFAULT
            })
        );
        let file = f4_3x4();
        assert!(parse_npy(&file, 48).is_ok());
        assert_eq!(
            parse_npy(&file, 47),
            Err(ArrayError::TooLarge {
                data_bytes: 48,
                bytes_max: 47
            })
        );
    }

    #[test]
    fn truncated_and_over_long_data_say_expected_and_actual_bytes() {
        let file = f4_3x4();
        let e = parse_npy(&file[..file.len() - 1], 100).unwrap_err();
        assert_eq!(
            e,
            ArrayError::DataLength {
                expected_bytes: 48,
                actual_bytes: 47
            }
        );
        assert!(e.to_string().contains("cut short"), "{e}");
        let mut longer = file.clone();
        longer.push(0);
        let e = parse_npy(&longer, 100).unwrap_err();
        assert_eq!(
            e,
            ArrayError::DataLength {
                expected_bytes: 48,
                actual_bytes: 49
            }
        );
        assert!(e.to_string().contains("after"), "{e}");
    }

    #[test]
    fn sizes_past_what_numpy_holds_are_refused() {
        let cases: [(&str, &[u64]); 3] = [
            ("<f8", &[1 << 62, 2]),
            ("|u1", &[1 << 63]),
            ("<u8", &[u64::MAX / 7, 9]),
        ];
        for (descr, shape) in cases {
            let file = encode_npy(descr, false, shape, (1, 0), &[]);
            match parse_npy(&file, u64::MAX) {
                Err(ArrayError::SizeOverflow { shape: s, .. }) => assert_eq!(s, shape),
                other => panic!("{shape:?}: {other:?}"),
            }
        }
        // The largest: 2^63 - 1 bytes.
        let file = encode_npy("|u1", false, &[i64::MAX as u64], (1, 0), &[]);
        assert!(matches!(
            parse_npy(&file, u64::MAX),
            Err(ArrayError::DataLength { expected_bytes, .. }) if expected_bytes == i64::MAX as u64
        ));
    }

    #[test]
    fn unsupported_descrs_and_bad_headers_are_refused() {
        let file = encode_npy("<U3", false, &[2], (1, 0), &[0; 24]);
        assert_eq!(
            parse_npy(&file, 100),
            Err(ArrayError::UnsupportedDescr {
                descr: "<U3".into()
            })
        );
        let file = encode_npy("<f4", false, &[2], (1, 0), &[0; 8]);
        let mut bad = file.clone();
        let at = bad.iter().position(|&b| b == b'F').unwrap();
        bad[at] = b'f';
        assert!(matches!(
            parse_npy(&bad, 100),
            Err(ArrayError::Header { offset, .. }) if offset == at as u64
        ));
        // Python 2's `2L` in versions 1.0 and 2.0 only.
        for (version, ok) in [((1, 0), true), ((2, 0), true), ((3, 0), false)] {
            let mut file = encode_npy("<f4", false, &[2], version, &[0; 8]);
            let at = file.windows(3).position(|w| w == b"(2,").unwrap();
            file[at..at + 3].copy_from_slice(b"(2L");
            // "(2L)" is not a tuple: put back the comma where a space was.
            let space = file.iter().rposition(|&b| b == b' ').unwrap();
            file.remove(space);
            file.insert(at + 3, b',');
            assert_eq!(parse_npy(&file, 100).is_ok(), ok, "{version:?}");
        }
    }
}
