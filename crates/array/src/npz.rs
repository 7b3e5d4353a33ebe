//! `.npz` archives: a zip of `NAME.npy` members, as `np.savez` writes them.

use std::collections::HashSet;
use std::ops::Range;

use crate::error::ArrayError;
use crate::npy::{parse_npy, NpyArray};
use crate::zip;

/// One array of an `.npz` archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpzMember {
    key: String,
    npy: Range<usize>,
    array: NpyArray,
}

impl NpzMember {
    /// The member's name without `.npy`, as `np.load` names it.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Where the member's `.npy` bytes lie in the archive.
    pub fn npy_range(&self) -> Range<usize> {
        self.npy.clone()
    }

    /// The array, its data range counted in the whole archive.
    pub fn array(&self) -> &NpyArray {
        &self.array
    }

    pub fn into_array(self) -> NpyArray {
        self.array
    }
}

/// Parses an `.npz` archive of stored members (`np.savez`; zip64 too) without copying any
/// data: its members in archive order. Refuses compressed members (`np.savez_compressed`),
/// members not named `*.npy`, two of one name, members that overlap or lie outside the
/// archive, data not of its CRC-32, more than [`MEMBERS_MAX`](crate::MEMBERS_MAX) members or
/// names past [`MEMBER_NAME_BYTES_MAX`](crate::MEMBER_NAME_BYTES_MAX), and any member that
/// [`parse_npy`] refuses, each array's data bounded by `bytes_max`.
pub fn parse_npz(bytes: &[u8], bytes_max: u64) -> Result<Vec<NpzMember>, ArrayError> {
    let directory = zip::directory(bytes)?;
    let entries = &directory.entries;
    // The archive's structure first, then the members' contents.
    let mut keys = HashSet::with_capacity(entries.len());
    let mut stored = Vec::with_capacity(entries.len());
    for entry in entries {
        let Some(key) = entry.name.strip_suffix(".npy") else {
            return Err(ArrayError::NotNpyMember {
                name: entry.name.clone(),
            });
        };
        if !keys.insert(key) {
            return Err(ArrayError::DuplicateKey { key: key.into() });
        }
        stored.push(zip::stored(bytes, entry, directory.start)?);
    }
    let mut spans: Vec<_> = stored.iter().map(|s| s.span.clone()).zip(0..).collect();
    zip::disjoint(&mut spans, entries)?;
    entries
        .iter()
        .zip(stored)
        .map(|(entry, stored)| {
            let member = |source| ArrayError::Member {
                name: entry.name.clone(),
                source: Box::new(source),
            };
            let npy = stored.data;
            let array = parse_npy(bytes.get(npy.clone()).unwrap_or_default(), bytes_max)
                .map_err(member)?
                .shifted(npy.start);
            let key = entry.name.strip_suffix(".npy").unwrap_or_default().into();
            Ok(NpzMember { key, npy, array })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{encode_npy, encode_zip, ZipForm, ZipWriter};
    use crate::{MEMBERS_MAX, MEMBER_NAME_BYTES_MAX};

    fn u8s(values: std::ops::Range<u8>) -> Vec<u8> {
        let n = values.len() as u64;
        encode_npy("|u1", false, &[n], (1, 0), &values.collect::<Vec<_>>())
    }

    fn savez() -> Vec<u8> {
        let form = ZipForm {
            zip64_local: true,
            ..ZipForm::default()
        };
        encode_zip(&[("a.npy", &u8s(0..3)), ("b.npy", &u8s(10..15))], &form)
    }

    #[test]
    fn members_parse_in_archive_order_with_ranges_in_the_archive() {
        for form in [
            ZipForm::default(),
            ZipForm {
                zip64_local: true,
                ..ZipForm::default()
            },
            ZipForm {
                zip64_central: true,
                zip64_end: true,
                ..ZipForm::default()
            },
            ZipForm {
                zip64_local: true,
                zip64_central: true,
                zip64_end: true,
                flags: 8, // a data descriptor: sizes from the directory
                comment: b"PK\x05\x06 a comment holding the signature".to_vec(),
                ..ZipForm::default()
            },
        ] {
            let members: [(&str, &[u8]); 2] = [("b.npy", &u8s(0..3)), ("a.npy", &u8s(10..15))];
            let file = encode_zip(&members, &form);
            let parsed = parse_npz(&file, 100).unwrap_or_else(|e| panic!("{form:?}: {e}"));
            let keys: Vec<_> = parsed.iter().map(|m| m.key()).collect();
            assert_eq!(keys, ["b", "a"]);
            for (m, (_, npy)) in parsed.iter().zip(members) {
                assert_eq!(&file[m.npy_range()], npy);
                assert_eq!(
                    m.array().data(&file),
                    Some(&npy[npy.len() - m.array().data_range().len()..])
                );
            }
            assert_eq!(
                parsed[1].array().data(&file),
                Some(&[10u8, 11, 12, 13, 14][..])
            );
            assert_eq!(parsed[1].clone().into_array().shape(), [5]);
        }
    }

    #[test]
    fn an_empty_archive_has_no_members() {
        assert_eq!(
            parse_npz(&encode_zip(&[], &ZipForm::default()), 100),
            Ok(vec![])
        );
    }

    #[test]
    fn bytes_without_an_end_record_are_not_an_archive() {
        let mut file = savez();
        for cut in [0, 10, file.len() - 1] {
            assert_eq!(
                parse_npz(&file[..cut], 100),
                Err(ArrayError::NoEndRecord {
                    file_bytes: cut as u64
                })
            );
        }
        // A comment length that does not reach the end.
        let at = file.len() - 2;
        file[at] = 1;
        assert!(matches!(
            parse_npz(&file, 100),
            Err(ArrayError::NoEndRecord { .. })
        ));
        assert!(matches!(
            parse_npz(&u8s(0..3), 100),
            Err(ArrayError::NoEndRecord { .. })
        ));
    }

    #[test]
    fn a_compressed_member_is_refused_by_name() {
        let form = ZipForm {
            method: 8,
            ..ZipForm::default()
        };
        let e = parse_npz(&encode_zip(&[("x.npy", &u8s(0..3))], &form), 100).unwrap_err();
        assert_eq!(
            e,
            ArrayError::Compressed {
                name: "x.npy".into(),
                method: 8
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("\"x.npy\"") && text.contains("compressed .npz is not decoded natively"),
            "{text}"
        );
    }

    #[test]
    fn an_encrypted_member_is_refused_by_name() {
        let form = ZipForm {
            flags: 1,
            ..ZipForm::default()
        };
        assert_eq!(
            parse_npz(&encode_zip(&[("x.npy", &u8s(0..3))], &form), 100),
            Err(ArrayError::Encrypted {
                name: "x.npy".into()
            })
        );
    }

    #[test]
    fn members_not_npy_and_duplicate_keys_are_refused() {
        let form = ZipForm::default();
        assert_eq!(
            parse_npz(
                &encode_zip(&[("a.npy", &u8s(0..3)), ("notes.txt", b"hi")], &form),
                100
            ),
            Err(ArrayError::NotNpyMember {
                name: "notes.txt".into()
            })
        );
        assert_eq!(
            parse_npz(
                &encode_zip(&[("a.npy", &u8s(0..3)), ("a.npy", &u8s(0..3))], &form),
                100
            ),
            Err(ArrayError::DuplicateKey { key: "a".into() })
        );
    }

    #[test]
    fn a_crc_mismatch_is_refused_by_name() {
        let mut file = savez();
        let data = parse_npz(&file, 100).unwrap()[1].array().data_range();
        file[data.start] ^= 1;
        assert!(matches!(
            parse_npz(&file, 100),
            Err(ArrayError::Crc { name, expected, actual }) if name == "b.npy" && expected != actual
        ));
    }

    #[test]
    fn a_member_that_is_not_npy_inside_is_refused_by_name() {
        let file = encode_zip(&[("a.npy", b"not an npy")], &ZipForm::default());
        match parse_npz(&file, 100) {
            Err(e @ ArrayError::Member { .. }) => {
                let ArrayError::Member { name, source } = &e else {
                    unreachable!()
                };
                assert_eq!(name, "a.npy");
                assert!(matches!(**source, ArrayError::NotNpy { .. }));
                assert!(std::error::Error::source(&e).is_some());
            }
            other => panic!("{other:?}"),
        }
        // The data bound applies to each member.
        assert!(matches!(
            parse_npz(&savez(), 4),
            Err(ArrayError::Member { source, .. })
                if *source == ArrayError::TooLarge { data_bytes: 5, bytes_max: 4 }
        ));
    }

    #[test]
    fn overlapping_members_are_refused() {
        // Member a's data is b's whole local record, and the directory lists b there too.
        let b = u8s(0..3);
        let inner = encode_zip(&[("b.npy", &b)], &ZipForm::default());
        let local_b = &inner[..30 + 5 + b.len()];
        let mut w = ZipWriter::new(ZipForm::default());
        let a_at = w.member("a.npy", local_b);
        w.central_entry("b.npy", &b, a_at + 30 + 5);
        assert_eq!(
            parse_npz(&w.finish(), 100),
            Err(ArrayError::Overlap {
                name: "a.npy".into(),
                other: "b.npy".into()
            })
        );
    }

    /// Where the central directory starts, read from the end record.
    fn central_start(file: &[u8]) -> usize {
        let end = file.len() - 22;
        u32::from_le_bytes(file[end + 16..end + 20].try_into().unwrap()) as usize
    }

    fn patch(file: &mut [u8], at: usize, bytes: &[u8]) {
        file[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn refused(file: &[u8], what: &str) -> String {
        match parse_npz(file, 100) {
            Err(e @ (ArrayError::Zip { .. } | ArrayError::BadMember { .. })) => {
                let text = e.to_string();
                assert!(text.contains(what), "{text} lacks {what:?}");
                text
            }
            other => panic!("{what}: {other:?}"),
        }
    }

    #[test]
    fn malformed_directories_are_refused_at_their_offset() {
        let file = savez();
        let end = file.len() - 22;
        let cd = central_start(&file);

        let mut f = file.clone();
        patch(&mut f, end + 4, &[1, 0]);
        refused(&f, "several disks");

        let mut f = file.clone();
        patch(&mut f, end + 12, &1000u32.to_le_bytes());
        refused(&f, "runs past the end records");

        let mut f = file.clone();
        patch(&mut f, end + 8, &[3, 0]);
        patch(&mut f, end + 10, &[3, 0]);
        refused(&f, "3 entries cannot fit");

        let mut f = file.clone();
        patch(&mut f, end + 8, &[1, 0]);
        patch(&mut f, end + 10, &[1, 0]);
        refused(&f, "more than its 1 entries");

        let mut f = file.clone();
        f[cd] = b'X';
        assert!(refused(&f, "no central directory entry signature").contains(&format!("byte {cd}")));

        // The first entry's name runs past the directory.
        let mut f = file.clone();
        patch(&mut f, cd + 28, &[200, 0]);
        refused(&f, "runs past the directory");

        let mut f = file.clone();
        f[cd + 46] = 0xff;
        refused(&f, "not UTF-8");

        // The local header offset past the directory, and the sizes disagreeing.
        let mut f = file.clone();
        patch(&mut f, cd + 42, &(cd as u32).to_le_bytes());
        refused(&f, "is not before the central directory");

        let mut f = file.clone();
        patch(&mut f, cd + 20, &4u32.to_le_bytes());
        refused(&f, "stored, yet");

        let mut f = file.clone();
        patch(&mut f, cd + 24, &1000u32.to_le_bytes());
        patch(&mut f, cd + 20, &1000u32.to_le_bytes());
        refused(&f, "run past the central directory");

        // A size of all ones without a zip64 extra field.
        let mut f = file.clone();
        patch(&mut f, cd + 24, &u32::MAX.to_le_bytes());
        refused(&f, "no zip64 extra field for its size");

        let mut f = file.clone();
        patch(&mut f, cd + 34, &[1, 0]);
        refused(&f, "another disk");
    }

    #[test]
    fn malformed_local_headers_are_refused() {
        let file = savez();
        let mut f = file.clone();
        f[0] = b'X';
        refused(&f, "no local header signature");

        let mut f = file.clone();
        f[30] = b'z';
        refused(&f, "local header names \"z.npy\"");

        let mut f = file.clone();
        patch(&mut f, 8, &[8, 0]);
        refused(&f, "local header gives method 8");

        // An extra field claiming more bytes than the local header has before the directory.
        let mut f = file.clone();
        let b_local = parse_npz(&file, 100).unwrap()[1].npy_range().start - 30 - 5 - 20;
        patch(&mut f, b_local + 28, &[0xff, 0xff]);
        refused(&f, "run past the central directory");
    }

    #[test]
    fn a_broken_extra_field_is_refused() {
        let form = ZipForm {
            zip64_central: true,
            ..ZipForm::default()
        };
        let file = encode_zip(&[("a.npy", &u8s(0..3))], &form);
        let cd = central_start(&file);
        let mut f = file.clone();
        // The zip64 field's length past the extra fields.
        patch(&mut f, cd + 46 + 5 + 2, &[200, 0]);
        refused(&f, "an extra field runs past");
        let mut f = file.clone();
        // A zip64 field too short for the local header offset.
        patch(&mut f, cd + 46 + 5 + 2, &[16, 0]);
        patch(&mut f, cd + 46 + 5 + 20, &[1, 0, 4, 0]);
        refused(&f, "no zip64 extra field for its local header offset");
    }

    #[test]
    fn malformed_zip64_end_records_are_refused() {
        let form = ZipForm {
            zip64_end: true,
            ..ZipForm::default()
        };
        let file = encode_zip(&[("a.npy", &u8s(0..3))], &form);
        let locator = file.len() - 22 - 20;
        let end64 = locator - 56;
        assert_eq!(parse_npz(&file, 100).unwrap().len(), 1);

        let mut f = file.clone();
        patch(&mut f, locator + 8, &(locator as u64).to_le_bytes());
        refused(&f, "not before its locator");

        let mut f = file.clone();
        f[end64] = b'X';
        refused(&f, "no zip64 end record signature");

        let mut f = file.clone();
        patch(&mut f, end64 + 4, &45u64.to_le_bytes());
        refused(&f, "wrong size");

        let mut f = file.clone();
        patch(&mut f, locator + 16, &2u32.to_le_bytes());
        refused(&f, "several disks");

        let mut f = file.clone();
        patch(&mut f, end64 + 24, &2u64.to_le_bytes());
        refused(&f, "several disks");

        let mut f = file.clone();
        let members = MEMBERS_MAX + 1;
        patch(&mut f, end64 + 24, &members.to_le_bytes());
        patch(&mut f, end64 + 32, &members.to_le_bytes());
        assert_eq!(
            parse_npz(&f, 100),
            Err(ArrayError::TooManyMembers {
                members,
                members_max: MEMBERS_MAX
            })
        );
    }

    #[test]
    fn a_name_past_the_bound_is_refused() {
        let long = format!("{}.npy", "k".repeat(MEMBER_NAME_BYTES_MAX - 4));
        assert_eq!(
            parse_npz(
                &encode_zip(&[(&long, &u8s(0..3))], &ZipForm::default()),
                100
            )
            .unwrap()[0]
                .key()
                .len(),
            MEMBER_NAME_BYTES_MAX - 4
        );
        let longer = format!("k{long}");
        let file = encode_zip(&[(&longer, &u8s(0..3))], &ZipForm::default());
        assert_eq!(
            parse_npz(&file, 100),
            Err(ArrayError::NameTooLong {
                offset: central_start(&file) as u64,
                name_bytes: MEMBER_NAME_BYTES_MAX as u64 + 1,
                name_bytes_max: MEMBER_NAME_BYTES_MAX as u64
            })
        );
    }
}
