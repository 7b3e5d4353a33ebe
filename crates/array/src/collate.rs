//! Stacking one array per sample into a `[B, ...]` batch.

use crate::dtype::DType;
use crate::error::ArrayError;
use crate::npy::NpyArray;

/// The layout of arrays stacked into one C-order `[B, ...]` array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    dtype: DType,
    shape: Vec<u64>,
    sample_bytes: usize,
    bytes: usize,
}

impl Stack {
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// `[B, ...]`: the number of arrays, then their common shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The data of one array.
    pub fn sample_bytes(&self) -> usize {
        self.sample_bytes
    }

    /// The data of all: the size of the buffer [`stack_into`] fills.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// `<f4 (3, 4)`: how an error shows an array.
fn describe(array: &NpyArray) -> String {
    let dims: Vec<String> = array.shape().iter().map(u64::to_string).collect();
    let comma = if dims.len() == 1 { "," } else { "" };
    format!("{} ({}{comma})", array.dtype().descr(), dims.join(", "))
}

/// Whether `arrays` stack into one `[B, ...]` array, and its layout if they do: each of the
/// first's dtype and shape, and in C order (Fortran order is refused where it changes the
/// bytes, with two or more dimensions longer than 1).
pub fn stack_layout(arrays: &[&NpyArray]) -> Result<Stack, ArrayError> {
    let first = arrays.first().ok_or(ArrayError::NoArrays)?;
    for (index, array) in arrays.iter().enumerate() {
        if array.dtype() != first.dtype() || array.shape() != first.shape() {
            return Err(ArrayError::Mismatch {
                index,
                expected: describe(first),
                actual: describe(array),
            });
        }
        let long_dims = array.shape().iter().filter(|&&d| d > 1).count();
        if array.fortran_order() && array.elements() > 0 && long_dims > 1 {
            return Err(ArrayError::FortranOrder {
                index,
                shape: array.shape().to_vec(),
            });
        }
    }
    let mut shape = Vec::with_capacity(first.shape().len() + 1);
    shape.push(arrays.len() as u64);
    shape.extend_from_slice(first.shape());
    // A parsed array's data range is within the bytes it came from, so its length fits.
    let sample_bytes = first.data_range().len();
    let bytes = arrays
        .len()
        .checked_mul(sample_bytes)
        .filter(|&b| b as u64 <= i64::MAX as u64)
        .ok_or_else(|| ArrayError::SizeOverflow {
            shape: shape.clone(),
            item_bytes: first.dtype().item_bytes() as u64,
        })?;
    Ok(Stack {
        dtype: first.dtype(),
        shape,
        sample_bytes,
        bytes,
    })
}

/// Stacks `samples`, each an array and the bytes it was parsed from, into `out`, which must
/// be [`Stack::bytes`] long: the arrays' data one after the other. Nothing is written unless
/// every array stacks and lies in its bytes.
pub fn stack_into(samples: &[(&NpyArray, &[u8])], out: &mut [u8]) -> Result<Stack, ArrayError> {
    let arrays: Vec<&NpyArray> = samples.iter().map(|(array, _)| *array).collect();
    let stack = stack_layout(&arrays)?;
    if out.len() != stack.bytes {
        return Err(ArrayError::Buffer {
            expected: stack.bytes as u64,
            actual: out.len() as u64,
        });
    }
    let mut data = Vec::with_capacity(samples.len());
    for (index, (array, bytes)) in samples.iter().enumerate() {
        let range = array.data_range();
        let Some(d) = bytes.get(range.clone()) else {
            return Err(ArrayError::OutOfInput {
                index,
                start: range.start as u64,
                end: range.end as u64,
                input_bytes: bytes.len() as u64,
            });
        };
        data.push(d);
    }
    if stack.sample_bytes > 0 {
        for (row, d) in out.chunks_exact_mut(stack.sample_bytes).zip(data) {
            row.copy_from_slice(d);
        }
    }
    Ok(stack)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::encode_npy;
    use crate::npy::parse_npy;

    fn npy(descr: &str, fortran: bool, shape: &[u64], first: u8) -> (NpyArray, Vec<u8>) {
        let dtype = DType::from_descr(descr).unwrap();
        let n = shape.iter().product::<u64>() as usize * dtype.item_bytes();
        let data: Vec<u8> = (0..n).map(|i| first.wrapping_add(i as u8)).collect();
        let file = encode_npy(descr, fortran, shape, (1, 0), &data);
        (parse_npy(&file, 1000).unwrap(), file)
    }

    #[test]
    fn arrays_of_one_dtype_and_shape_stack_in_order() {
        let samples = [
            npy("<i2", false, &[2, 3], 0),
            npy("<i2", false, &[2, 3], 12),
            npy("<i2", false, &[2, 3], 24),
        ];
        let pairs: Vec<(&NpyArray, &[u8])> = samples.iter().map(|(a, f)| (a, &f[..])).collect();
        let mut out = vec![0; 36];
        let stack = stack_into(&pairs, &mut out).unwrap();
        assert_eq!(out, (0..36).collect::<Vec<u8>>());
        assert_eq!(
            (stack.shape(), stack.sample_bytes(), stack.bytes()),
            (&[3u64, 2, 3][..], 12, 36)
        );
        assert_eq!(stack.dtype().descr(), "<i2");
    }

    #[test]
    fn a_buffer_of_the_wrong_size_is_refused_untouched() {
        let (a, f) = npy("|u1", false, &[4], 1);
        let mut out = vec![9; 7];
        assert_eq!(
            stack_into(&[(&a, &f[..]), (&a, &f[..])], &mut out),
            Err(ArrayError::Buffer {
                expected: 8,
                actual: 7
            })
        );
        assert_eq!(out, [9; 7]);
    }

    #[test]
    fn other_dtypes_and_shapes_are_refused_naming_both() {
        let (a, _) = npy("<f4", false, &[3, 4], 0);
        let (b, _) = npy(">f4", false, &[3, 4], 0);
        let (c, _) = npy("<f4", false, &[4, 3], 0);
        let (d, _) = npy("<f4", false, &[12], 0);
        assert_eq!(
            stack_layout(&[&a, &a, &b]),
            Err(ArrayError::Mismatch {
                index: 2,
                expected: "<f4 (3, 4)".into(),
                actual: ">f4 (3, 4)".into()
            })
        );
        assert!(matches!(
            stack_layout(&[&a, &c]),
            Err(ArrayError::Mismatch { index: 1, .. })
        ));
        assert!(matches!(
            stack_layout(&[&a, &d]),
            Err(ArrayError::Mismatch { actual, .. }) if actual == "<f4 (12,)"
        ));
        assert_eq!(stack_layout(&[]), Err(ArrayError::NoArrays));
    }

    #[test]
    fn fortran_order_is_refused_only_where_it_changes_the_bytes() {
        let (f, _) = npy("<f4", true, &[3, 4], 0);
        assert_eq!(
            stack_layout(&[&f]),
            Err(ArrayError::FortranOrder {
                index: 0,
                shape: vec![3, 4]
            })
        );
        for shape in [&[5u64][..], &[1, 5], &[5, 1, 1], &[], &[0, 3, 4]] {
            let (f, _) = npy("<f4", true, shape, 0);
            assert!(stack_layout(&[&f, &f]).is_ok(), "{shape:?}");
        }
    }

    #[test]
    fn empty_arrays_stack_to_an_empty_buffer() {
        let (a, f) = npy("<f8", false, &[0, 5], 0);
        let stack = stack_into(&[(&a, &f[..]), (&a, &f[..])], &mut []).unwrap();
        assert_eq!((stack.shape(), stack.bytes()), (&[2u64, 0, 5][..], 0));
    }

    #[test]
    fn data_outside_its_bytes_is_refused() {
        let (a, f) = npy("|u1", false, &[4], 1);
        let mut out = vec![0; 8];
        assert_eq!(
            stack_into(&[(&a, &f[..]), (&a, &f[..f.len() - 1])], &mut out),
            Err(ArrayError::OutOfInput {
                index: 1,
                start: f.len() as u64 - 4,
                end: f.len() as u64,
                input_bytes: f.len() as u64 - 1
            })
        );
        assert_eq!(out, [0; 8], "nothing is written");
    }
}
