//! Parsing files numpy wrote (tests/data/make.py): every dtype kind, order and header version
//! parses to the shape, dtype and data bytes the script wrote; dtypes outside the simple
//! scalars and compressed archives are refused by name.

use std::path::Path;

use lobster_array::{
    parse_npy, parse_npz, stack_into, ArrayError, ByteOrder, Kind, NpyArray, BYTES_MAX_DEFAULT,
};

fn data(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn npy(name: &str) -> (NpyArray, Vec<u8>) {
    let file = data(name);
    let array = parse_npy(&file, BYTES_MAX_DEFAULT).unwrap_or_else(|e| panic!("{name}: {e}"));
    (array, file)
}

/// The bytes of `values` each written by `bytes`.
fn bytes_of<T, const N: usize>(
    values: impl IntoIterator<Item = T>,
    bytes: fn(T) -> [u8; N],
) -> Vec<u8> {
    values.into_iter().flat_map(bytes).collect()
}

/// IEEE half-precision bits of a small integer (exactly representable), from its f32 bits.
fn f16_bits(value: u16) -> u16 {
    if value == 0 {
        return 0;
    }
    let bits = f32::from(value).to_bits();
    let exponent = ((bits >> 23) & 0xff) as u16 - 127 + 15;
    let mantissa = ((bits & 0x7f_ffff) >> 13) as u16;
    exponent << 10 | mantissa
}

/// A fixture: its file, descr, shape, order and data.
type Case = (&'static str, &'static str, Vec<u64>, bool, Vec<u8>);

#[test]
fn arrays_of_every_dtype_kind_parse_to_the_bytes_numpy_wrote() {
    let cases: Vec<Case> = vec![
        (
            "f4_3x4.npy",
            "<f4",
            vec![3, 4],
            false,
            bytes_of((0..12u8).map(f32::from), f32::to_le_bytes),
        ),
        (
            "i8_big_endian.npy",
            ">i8",
            vec![2, 3],
            false,
            bytes_of(0..6i64, i64::to_be_bytes),
        ),
        (
            "i2_fortran.npy",
            "<i2",
            vec![2, 3],
            true,
            bytes_of([0i16, 3, 1, 4, 2, 5], i16::to_le_bytes),
        ),
        ("u1_0d.npy", "|u1", vec![], false, vec![7]),
        ("f8_empty.npy", "<f8", vec![0, 5], false, vec![]),
        ("bool.npy", "|b1", vec![3], false, vec![1, 0, 1]),
        (
            "c8.npy",
            "<c8",
            vec![4],
            false,
            bytes_of(
                (0..4u8).flat_map(|i| [f32::from(i), f32::from(i + 4)]),
                f32::to_le_bytes,
            ),
        ),
        (
            "f2.npy",
            "<f2",
            vec![5],
            false,
            bytes_of((0..5).map(f16_bits), u16::to_le_bytes),
        ),
        (
            "u8_3d.npy",
            "<u8",
            vec![2, 3, 4],
            false,
            bytes_of(0..24u64, u64::to_le_bytes),
        ),
        (
            "u4_v2.npy",
            "<u4",
            vec![10],
            false,
            bytes_of(0..10u32, u32::to_le_bytes),
        ),
        (
            "i4_v3.npy",
            ">i4",
            vec![3],
            false,
            bytes_of(0..3i32, i32::to_be_bytes),
        ),
    ];
    for (name, descr, shape, fortran, expected) in cases {
        let (array, file) = npy(name);
        assert_eq!(array.dtype().descr(), descr, "{name}");
        assert_eq!(array.shape(), shape, "{name}");
        assert_eq!(array.fortran_order(), fortran, "{name}");
        assert_eq!(array.data(&file), Some(&expected[..]), "{name}");
        assert_eq!(array.data_range().end, file.len(), "{name}");
        assert_eq!(
            array.data_range().start % 64,
            0,
            "{name}: numpy aligns the data"
        );
    }
    let (array, _) = npy("i8_big_endian.npy");
    assert_eq!(
        (
            array.dtype().kind(),
            array.dtype().item_bytes(),
            array.dtype().byte_order()
        ),
        (Kind::Int, 8, ByteOrder::Big)
    );
    assert_eq!(npy("c8.npy").0.dtype().kind(), Kind::Complex);
    assert_eq!(npy("bool.npy").0.dtype().kind(), Kind::Bool);
    assert_eq!(npy("u1_0d.npy").0.elements(), 1);
}

#[test]
fn structured_string_and_datetime_dtypes_are_refused_naming_the_descr() {
    for (name, descr) in [
        ("structured.npy", "[('a', '<f4'), ('b', '<i2')]"),
        ("unicode.npy", "<U2"),
        ("datetime.npy", "<M8[D]"),
    ] {
        let e = parse_npy(&data(name), BYTES_MAX_DEFAULT).unwrap_err();
        assert_eq!(
            e,
            ArrayError::UnsupportedDescr {
                descr: descr.into()
            },
            "{name}"
        );
        assert!(e.to_string().contains(descr), "{e}");
    }
}

#[test]
fn a_cut_or_extended_numpy_file_is_refused_with_both_sizes() {
    let file = data("f4_3x4.npy");
    assert_eq!(
        parse_npy(&file[..file.len() - 5], BYTES_MAX_DEFAULT),
        Err(ArrayError::DataLength {
            expected_bytes: 48,
            actual_bytes: 43
        })
    );
    let mut longer = file.clone();
    longer.extend_from_slice(&[0; 3]);
    assert_eq!(
        parse_npy(&longer, BYTES_MAX_DEFAULT),
        Err(ArrayError::DataLength {
            expected_bytes: 48,
            actual_bytes: 51
        })
    );
    assert_eq!(
        parse_npy(&file, 40),
        Err(ArrayError::TooLarge {
            data_bytes: 48,
            bytes_max: 40
        })
    );
}

#[test]
fn a_savez_archive_parses_to_its_members_in_order() {
    let file = data("arrays.npz");
    let members = parse_npz(&file, BYTES_MAX_DEFAULT).unwrap();
    let keys: Vec<_> = members.iter().map(|m| m.key()).collect();
    assert_eq!(keys, ["image", "label", "mask"]);
    let expected: [(&str, &[u64], Vec<u8>); 3] = [
        ("|u1", &[2, 3, 4], (0..24).collect()),
        ("<i8", &[], 3i64.to_le_bytes().to_vec()),
        ("|b1", &[2], vec![1, 0]),
    ];
    for (m, (descr, shape, bytes)) in members.iter().zip(expected) {
        assert_eq!(m.array().dtype().descr(), descr, "{}", m.key());
        assert_eq!(m.array().shape(), shape, "{}", m.key());
        assert_eq!(m.array().data(&file), Some(&bytes[..]), "{}", m.key());
        // The member's own bytes are an .npy file of the same array.
        let alone = parse_npy(&file[m.npy_range()], BYTES_MAX_DEFAULT).unwrap();
        assert_eq!(
            (alone.dtype(), alone.shape()),
            (m.array().dtype(), m.array().shape())
        );
    }
}

#[test]
fn one_array_per_sample_stacks_into_one_batch() {
    let file = data("samples.npz");
    let members = parse_npz(&file, BYTES_MAX_DEFAULT).unwrap();
    let keys: Vec<_> = members.iter().map(|m| m.key()).collect();
    assert_eq!(keys, ["arr_0", "arr_1", "arr_2"]);
    let samples: Vec<(&NpyArray, &[u8])> = members.iter().map(|m| (m.array(), &file[..])).collect();
    let mut batch = vec![0; 3 * 6 * 4];
    let stack = stack_into(&samples, &mut batch).unwrap();
    assert_eq!(stack.shape(), [3, 2, 3]);
    assert_eq!(stack.dtype().descr(), "<f4");
    assert_eq!(batch, bytes_of((0..18u8).map(f32::from), f32::to_le_bytes));
}

#[test]
fn a_compressed_archive_is_refused_naming_the_member() {
    let e = parse_npz(&data("compressed.npz"), BYTES_MAX_DEFAULT).unwrap_err();
    assert_eq!(
        e,
        ArrayError::Compressed {
            name: "a.npy".into(),
            method: 8
        }
    );
    assert!(e.to_string().contains("np.savez_compressed"), "{e}");
}

#[test]
fn an_npy_file_is_not_an_archive_and_an_archive_is_not_an_npy_file() {
    assert!(matches!(
        parse_npz(&data("f4_3x4.npy"), BYTES_MAX_DEFAULT),
        Err(ArrayError::NoEndRecord { .. })
    ));
    assert_eq!(
        parse_npy(&data("arrays.npz"), BYTES_MAX_DEFAULT),
        Err(ArrayError::NotNpy {
            magic: "504b03042d000000".into()
        })
    );
}
