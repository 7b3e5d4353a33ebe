//! Reference writers of `.npy` files and zip archives (as numpy and Python's zipfile write
//! them), for the unit tests, and the fuzz checker: bytes from outside never panic the
//! parsers, and what they return lies in the input, is as long as shape and dtype say, and is
//! what the reference writer's file of the same array parses to.

use std::collections::HashSet;

use crate::collate::{stack_into, stack_layout};
use crate::dtype::DType;
use crate::error::ArrayError;
use crate::header::NDIM_MAX;
use crate::npy::{parse_npy, NpyArray};
use crate::npz::parse_npz;

/// The data bound the checker parses under: the fixtures pass, and a header claiming more is
/// refused before its length is checked.
const CHECK_BYTES_MAX: u64 = 4096;

/// The fixtures numpy wrote: mutated, they reach the parsers' insides far more often than
/// arbitrary bytes do.
const NPY_FIXTURES: [&[u8]; 6] = [
    include_bytes!("../tests/data/f4_3x4.npy"),
    include_bytes!("../tests/data/i8_big_endian.npy"),
    include_bytes!("../tests/data/i2_fortran.npy"),
    include_bytes!("../tests/data/u1_0d.npy"),
    include_bytes!("../tests/data/u4_v2.npy"),
    include_bytes!("../tests/data/structured.npy"),
];
const NPZ_FIXTURES: [&[u8]; 3] = [
    include_bytes!("../tests/data/arrays.npz"),
    include_bytes!("../tests/data/samples.npz"),
    include_bytes!("../tests/data/compressed.npz"),
];

/// An `.npy` file as numpy's `write_array` writes it: the header dict, padded with spaces and
/// a newline so the data starts at a multiple of 64. `shape` is written as given.
pub(crate) fn encode_npy(
    descr: &str,
    fortran_order: bool,
    shape: &[u64],
    version: (u8, u8),
    data: &[u8],
) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let comma = if shape.len() == 1 { "," } else { "" };
    let order = if fortran_order { "True" } else { "False" };
    let dict = format!(
        "{{'descr': '{descr}', 'fortran_order': {order}, 'shape': ({}{comma}), }}",
        dims.join(", ")
    );
    let length_bytes = if version.0 == 1 { 2 } else { 4 };
    let unpadded = 8 + length_bytes + dict.len() + 1;
    let header = format!("{dict}{}\n", " ".repeat(64 - unpadded % 64));
    let mut file = b"\x93NUMPY".to_vec();
    file.extend_from_slice(&[version.0, version.1]);
    let length = header.len() as u32;
    file.extend_from_slice(&length.to_le_bytes()[..length_bytes]);
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(data);
    file
}

/// How [`ZipWriter`] writes an archive.
#[derive(Debug, Clone, Default)]
pub(crate) struct ZipForm {
    /// Local headers with sizes of all ones and a zip64 extra field, as numpy's `savez`.
    pub(crate) zip64_local: bool,
    /// Central entries with sizes and offset of all ones and a zip64 extra field.
    pub(crate) zip64_central: bool,
    /// A zip64 end record and locator, the end record's fields all ones.
    pub(crate) zip64_end: bool,
    pub(crate) method: u16,
    pub(crate) flags: u16,
    pub(crate) comment: Vec<u8>,
}

/// A zip archive written member by member, local records first, then the directory.
#[derive(Debug)]
pub(crate) struct ZipWriter {
    form: ZipForm,
    bytes: Vec<u8>,
    central: Vec<u8>,
    entries: u64,
}

impl ZipWriter {
    pub(crate) fn new(form: ZipForm) -> ZipWriter {
        ZipWriter {
            form,
            bytes: Vec::new(),
            central: Vec::new(),
            entries: 0,
        }
    }

    /// Writes a member's local record and its directory entry; returns where the record is.
    pub(crate) fn member(&mut self, name: &str, data: &[u8]) -> u64 {
        let at = self.bytes.len() as u64;
        let size = data.len() as u64;
        let (sizes, extra) = if self.form.zip64_local {
            let mut extra = vec![1, 0, 16, 0];
            extra.extend_from_slice(&size.to_le_bytes());
            extra.extend_from_slice(&size.to_le_bytes());
            (u32::MAX, extra)
        } else {
            (size as u32, Vec::new())
        };
        let b = &mut self.bytes;
        b.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        b.extend_from_slice(&45u16.to_le_bytes());
        b.extend_from_slice(&self.form.flags.to_le_bytes());
        b.extend_from_slice(&self.form.method.to_le_bytes());
        b.extend_from_slice(&[0, 0, 0x21, 0]);
        b.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
        b.extend_from_slice(&sizes.to_le_bytes());
        b.extend_from_slice(&sizes.to_le_bytes());
        b.extend_from_slice(&(name.len() as u16).to_le_bytes());
        b.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&extra);
        b.extend_from_slice(data);
        self.central_entry(name, data, at);
        at
    }

    /// Writes a directory entry alone, for a member whose local record is at `local`.
    pub(crate) fn central_entry(&mut self, name: &str, data: &[u8], local: u64) {
        let size = data.len() as u64;
        let (size32, local32, extra) = if self.form.zip64_central {
            let mut extra = vec![1, 0, 24, 0];
            extra.extend_from_slice(&size.to_le_bytes());
            extra.extend_from_slice(&size.to_le_bytes());
            extra.extend_from_slice(&local.to_le_bytes());
            (u32::MAX, u32::MAX, extra)
        } else {
            (size as u32, local as u32, Vec::new())
        };
        let c = &mut self.central;
        c.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        c.extend_from_slice(&[45, 3, 45, 0]);
        c.extend_from_slice(&self.form.flags.to_le_bytes());
        c.extend_from_slice(&self.form.method.to_le_bytes());
        c.extend_from_slice(&[0, 0, 0x21, 0]);
        c.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
        c.extend_from_slice(&size32.to_le_bytes());
        c.extend_from_slice(&size32.to_le_bytes());
        c.extend_from_slice(&(name.len() as u16).to_le_bytes());
        c.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        // Comment length, disk, internal attributes; external attributes (rw-r--r--).
        c.extend_from_slice(&[0; 6]);
        c.extend_from_slice(&[0, 0, 0x80, 1]);
        c.extend_from_slice(&local32.to_le_bytes());
        c.extend_from_slice(name.as_bytes());
        c.extend_from_slice(&extra);
        self.entries += 1;
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        let offset = self.bytes.len() as u64;
        let size = self.central.len() as u64;
        self.bytes.append(&mut self.central);
        let (entries16, size32, offset32) = if self.form.zip64_end {
            let end64 = self.bytes.len() as u64;
            let b = &mut self.bytes;
            b.extend_from_slice(&0x0606_4b50u32.to_le_bytes());
            b.extend_from_slice(&44u64.to_le_bytes());
            b.extend_from_slice(&[45, 3, 45, 0]);
            b.extend_from_slice(&[0; 8]);
            b.extend_from_slice(&self.entries.to_le_bytes());
            b.extend_from_slice(&self.entries.to_le_bytes());
            b.extend_from_slice(&size.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            b.extend_from_slice(&0x0706_4b50u32.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&end64.to_le_bytes());
            b.extend_from_slice(&1u32.to_le_bytes());
            (u16::MAX, u32::MAX, u32::MAX)
        } else {
            (self.entries as u16, size as u32, offset as u32)
        };
        let b = &mut self.bytes;
        b.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&entries16.to_le_bytes());
        b.extend_from_slice(&entries16.to_le_bytes());
        b.extend_from_slice(&size32.to_le_bytes());
        b.extend_from_slice(&offset32.to_le_bytes());
        b.extend_from_slice(&(self.form.comment.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.form.comment);
        self.bytes
    }
}

/// An archive of `members` (name, data) written in `form`.
#[cfg(test)]
pub(crate) fn encode_zip(members: &[(&str, &[u8])], form: &ZipForm) -> Vec<u8> {
    let mut w = ZipWriter::new(form.clone());
    for (name, data) in members {
        w.member(name, data);
    }
    w.finish()
}

/// A fixture with `edits` applied, each 3 bytes: an offset (u16, wrapped to the file) and a
/// byte to xor there.
fn edited(fixture: &[u8], edits: &[u8]) -> Vec<u8> {
    let mut file = fixture.to_vec();
    if file.is_empty() {
        return file;
    }
    for e in edits.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([e[0], e[1]])) % file.len();
        file[at] ^= e[2];
    }
    file
}

/// Checks one input. The first byte picks how it makes a file: the rest as it is; a fixture
/// (the second byte's pick) with the rest as edits; or an archive written by [`ZipWriter`]
/// (in the form the second byte's bits pick) of up to 3 edited `.npy` fixtures, so that
/// members with valid CRCs reach the member parser.
pub(crate) fn check_bytes(data: &[u8]) {
    let file = match data {
        [mode, pick, edits @ ..] if mode % 3 == 1 => {
            let pick = usize::from(*pick);
            let fixture = if pick % 2 == 0 {
                NPY_FIXTURES[pick / 2 % NPY_FIXTURES.len()]
            } else {
                NPZ_FIXTURES[pick / 2 % NPZ_FIXTURES.len()]
            };
            edited(fixture, edits)
        }
        [mode, form, rest @ ..] if mode % 3 == 2 => archive(*form, rest),
        [_, rest @ ..] => rest.to_vec(),
        [] => Vec::new(),
    };
    check_npy(&file);
    check_npz(&file);
}

/// An archive of members made from `rest`: each a fixture pick, an edit count and the edits.
fn archive(form: u8, rest: &[u8]) -> Vec<u8> {
    let bit = |i: u8| form & (1 << i) != 0;
    let mut w = ZipWriter::new(ZipForm {
        zip64_local: bit(0),
        zip64_central: bit(1),
        zip64_end: bit(2),
        comment: if bit(3) {
            b"PK\x05\x06".to_vec()
        } else {
            Vec::new()
        },
        ..ZipForm::default()
    });
    let mut rest = rest;
    for i in 0..3 {
        let [pick, edits, after @ ..] = rest else {
            break;
        };
        let (edits, after) = after.split_at(after.len().min(usize::from(*edits) * 3));
        let npy = edited(NPY_FIXTURES[usize::from(*pick) % NPY_FIXTURES.len()], edits);
        let name = match (bit(4), bit(5)) {
            (true, _) => "same.npy".to_string(),
            (_, true) => format!("m{i}"),
            _ => format!("m{i}.npy"),
        };
        w.member(&name, &npy);
        rest = after;
    }
    w.finish()
}

fn check_npy(file: &[u8]) {
    let array = match parse_npy(file, CHECK_BYTES_MAX) {
        Ok(array) => array,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    check_array(&array, file);
    assert_eq!(array.data_range().end, file.len(), "data after the range");
    // The reference writer's file of the same array parses to it.
    let data = array.data(file).unwrap_or_default();
    let dtype = array.dtype();
    let again = encode_npy(
        &dtype.descr(),
        array.fortran_order(),
        array.shape(),
        (1, 0),
        data,
    );
    match parse_npy(&again, CHECK_BYTES_MAX) {
        Ok(same) => {
            assert_eq!(
                (same.dtype(), same.shape(), same.fortran_order()),
                (dtype, array.shape(), array.fortran_order())
            );
            assert_eq!(same.data(&again), Some(data));
        }
        Err(e) => panic!("the reference writer's file of {array:?} is refused: {e}"),
    }
    // One byte fewer, or a bound one byte lower, is refused.
    assert!(parse_npy(&file[..file.len() - 1], CHECK_BYTES_MAX).is_err());
    if let Some(below) = array.data_bytes().checked_sub(1) {
        assert_eq!(
            parse_npy(file, below),
            Err(ArrayError::TooLarge {
                data_bytes: array.data_bytes(),
                bytes_max: below
            })
        );
    }
}

/// What holds of every parsed array: its data lies in `file`, as long as shape and dtype say
/// and within the bound; its descr rebuilds its dtype.
fn check_array(array: &NpyArray, file: &[u8]) {
    let range = array.data_range();
    assert!(
        range.start <= range.end && range.end <= file.len(),
        "{range:?}"
    );
    let product = array
        .shape()
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d));
    assert!(array.shape().contains(&0) || product == Some(array.elements()));
    assert_eq!(
        array.data_bytes(),
        array.elements() * array.dtype().item_bytes() as u64
    );
    assert_eq!(range.len() as u64, array.data_bytes());
    assert!(array.data_bytes() <= CHECK_BYTES_MAX);
    assert!(array.shape().len() <= NDIM_MAX);
    assert_eq!(DType::from_descr(&array.dtype().descr()), Ok(array.dtype()));
}

fn check_npz(file: &[u8]) {
    let members = match parse_npz(file, CHECK_BYTES_MAX) {
        Ok(members) => members,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let mut keys = HashSet::new();
    let mut spans = Vec::new();
    for m in &members {
        assert!(keys.insert(m.key()), "the key {:?} twice", m.key());
        let npy = m.npy_range();
        let array = m.array();
        check_array(array, file);
        let data = array.data_range();
        assert!(
            npy.start <= data.start && data.end == npy.end,
            "{npy:?} {data:?}"
        );
        // The member alone parses to the same array.
        let alone = parse_npy(&file[npy.clone()], CHECK_BYTES_MAX)
            .unwrap_or_else(|e| panic!("member {:?} alone: {e}", m.key()));
        assert_eq!(alone.shifted(npy.start), *array);
        spans.push(npy);
    }
    spans.sort_by_key(|s| s.start);
    for pair in spans.windows(2) {
        assert!(
            pair[0].end <= pair[1].start,
            "overlapping members {spans:?}"
        );
    }
    let arrays: Vec<&NpyArray> = members.iter().map(|m| m.array()).collect();
    if let Ok(stack) = stack_layout(&arrays) {
        let samples: Vec<(&NpyArray, &[u8])> = arrays.iter().map(|a| (*a, file)).collect();
        let mut out = vec![0; stack.bytes()];
        assert_eq!(stack_into(&samples, &mut out), Ok(stack.clone()));
        let expected: Vec<u8> = arrays
            .iter()
            .flat_map(|a| a.data(file).unwrap_or_default())
            .copied()
            .collect();
        assert_eq!(out, expected);
        out.push(0);
        assert!(stack_into(&samples, &mut out).is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_writer_pads_as_numpy_does() {
        let file = encode_npy("<f4", false, &[3, 4], (1, 0), &[0; 48]);
        assert_eq!(file.len(), 128 + 48);
        assert_eq!(&file[..10], b"\x93NUMPY\x01\x00\x76\x00");
        assert_eq!(&file[127..128], b"\n");
        let file = encode_npy("|u1", false, &[5], (2, 0), &[0; 5]);
        assert_eq!(file.len() % 64, 5);
    }

    #[test]
    fn the_checker_passes_every_fixture_and_its_forms() {
        for pick in 0..(2 * NPZ_FIXTURES.len().max(NPY_FIXTURES.len())) as u8 {
            check_bytes(&[1, pick]);
        }
        for form in 0..64 {
            check_bytes(&[2, form, 0, 0, 1, 0, 2, 1, 10, 0, 0x55]);
        }
        for npy in NPY_FIXTURES {
            let mut data = vec![0];
            data.extend_from_slice(npy);
            check_bytes(&data);
        }
        check_bytes(&[]);
        check_bytes(&[0]);
    }
}
