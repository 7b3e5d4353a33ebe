//! The tier's index file: which sample's bytes lie where, for a next run to reuse.
//!
//! Layout, little-endian: the magic `LOBTIER1`; the geometry it was written for
//! (fingerprint, capacity, segment size, samples in the size table: 8 bytes each); the
//! number of entries (8 bytes); the entries, 24 bytes each (sample, size and CRC32 of its
//! bytes: 4 bytes each; 4 zero bytes; address: 8 bytes), sorted by address; then the
//! CRC32 of everything before it (4 bytes), the seal. An index is only a hint: each read
//! still checks its entry's CRC.

use std::fmt;

use crate::alloc::{extent_bytes, BLOCK_BYTES};

const MAGIC: &[u8; 8] = b"LOBTIER1";
const HEADER_BYTES: usize = 8 + 5 * 8;
const ENTRY_BYTES: usize = 24;
const SEAL_BYTES: usize = 4;

/// What an index must have been written for to be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) fingerprint: u64,
    /// Bytes of extents in all, a multiple of [`BLOCK_BYTES`].
    pub(crate) capacity_bytes: u64,
    /// Bytes of each segment file but maybe the last, a multiple of [`BLOCK_BYTES`].
    pub(crate) segment_bytes: u64,
    pub(crate) num_samples: u64,
}

impl Geometry {
    /// The most entries an index may hold: one per sample, each at least one block.
    pub(crate) fn entries_max(&self) -> u64 {
        self.num_samples.min(self.capacity_bytes / BLOCK_BYTES)
    }

    /// The most bytes an index may hold; a longer file is refused unread.
    pub(crate) fn index_bytes_max(&self) -> u64 {
        (HEADER_BYTES + SEAL_BYTES) as u64 + self.entries_max() * ENTRY_BYTES as u64
    }
}

/// One sample's bytes on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub(crate) sample: u32,
    /// The sample's size, as the size table says.
    pub(crate) len: u32,
    pub(crate) crc: u32,
    /// Start of its extent in the segments' address space.
    pub(crate) addr: u64,
}

/// Why an index was not trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexError {
    /// Longer than the geometry allows.
    TooLarge { len_bytes: u64, max_bytes: u64 },
    /// Shorter than its header and seal, or than its entries say.
    Truncated { len_bytes: u64 },
    /// Not a tier index (or of another format).
    BadMagic,
    /// The seal does not match the bytes: damaged or cut short.
    BadSeal,
    /// Written for another dataset, capacity or layout.
    Foreign {
        field: &'static str,
        found: u64,
        expected: u64,
    },
    /// More entries than the geometry allows.
    EntryCount { count: u64, max: u64 },
    /// A length that is not the header, `count` entries and the seal.
    Length { count: u64, len_bytes: u64 },
    /// An entry that cannot be right.
    Entry {
        position: u64,
        sample: u32,
        what: &'static str,
    },
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexError::TooLarge {
                len_bytes,
                max_bytes,
            } => write!(
                f,
                "{len_bytes} bytes, more than the {max_bytes} it may hold"
            ),
            IndexError::Truncated { len_bytes } => write!(f, "cut short at {len_bytes} bytes"),
            IndexError::BadMagic => f.write_str("not a disk tier index"),
            IndexError::BadSeal => f.write_str("its check does not match its bytes"),
            IndexError::Foreign {
                field,
                found,
                expected,
            } => write!(f, "written for {field} {found}, not {expected}"),
            IndexError::EntryCount { count, max } => {
                write!(f, "{count} entries, more than {max}")
            }
            IndexError::Length { count, len_bytes } => {
                write!(f, "{len_bytes} bytes do not hold {count} entries")
            }
            IndexError::Entry {
                position,
                sample,
                what,
            } => write!(f, "entry {position} (sample {sample}): {what}"),
        }
    }
}

impl std::error::Error for IndexError {}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The index of `entries` (any order; written sorted by address) for `geometry`.
pub(crate) fn encode(geometry: &Geometry, entries: &[IndexEntry]) -> Vec<u8> {
    let mut sorted = entries.to_vec();
    sorted.sort_unstable_by_key(|e| e.addr);
    let mut out = Vec::with_capacity(HEADER_BYTES + sorted.len() * ENTRY_BYTES + SEAL_BYTES);
    out.extend_from_slice(MAGIC);
    for v in [
        geometry.fingerprint,
        geometry.capacity_bytes,
        geometry.segment_bytes,
        geometry.num_samples,
        sorted.len() as u64,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for e in &sorted {
        out.extend_from_slice(&e.sample.to_le_bytes());
        out.extend_from_slice(&e.len.to_le_bytes());
        out.extend_from_slice(&e.crc.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&e.addr.to_le_bytes());
    }
    let seal = crc32fast::hash(&out);
    out.extend_from_slice(&seal.to_le_bytes());
    out
}

/// The entries of `bytes`, an index read from outside, if it is sealed, written for
/// `geometry`, and every entry is a sample of `sizes` with its size there, in one segment,
/// aligned, apart from the others and from every other entry of its sample. Sorted by
/// address.
///
/// # Errors
/// The first thing found wrong; nothing of a refused index is used.
pub(crate) fn parse(
    bytes: &[u8],
    geometry: &Geometry,
    sizes: &[u32],
) -> Result<Vec<IndexEntry>, IndexError> {
    debug_assert_eq!(sizes.len() as u64, geometry.num_samples);
    let len_bytes = bytes.len() as u64;
    let max_bytes = geometry.index_bytes_max();
    if len_bytes > max_bytes {
        return Err(IndexError::TooLarge {
            len_bytes,
            max_bytes,
        });
    }
    if bytes.len() < HEADER_BYTES + SEAL_BYTES {
        return Err(IndexError::Truncated { len_bytes });
    }
    if &bytes[..8] != MAGIC {
        return Err(IndexError::BadMagic);
    }
    let (body, seal) = bytes.split_at(bytes.len() - SEAL_BYTES);
    if crc32fast::hash(body) != u32_at(seal, 0) {
        return Err(IndexError::BadSeal);
    }
    for (i, (field, expected)) in [
        ("fingerprint", geometry.fingerprint),
        ("capacity_bytes", geometry.capacity_bytes),
        ("segment_bytes", geometry.segment_bytes),
        ("num_samples", geometry.num_samples),
    ]
    .into_iter()
    .enumerate()
    {
        let found = u64_at(body, 8 + 8 * i);
        if found != expected {
            return Err(IndexError::Foreign {
                field,
                found,
                expected,
            });
        }
    }
    let count = u64_at(body, 8 + 32);
    let max = geometry.entries_max();
    if count > max {
        return Err(IndexError::EntryCount { count, max });
    }
    if (body.len() - HEADER_BYTES) as u64 != count * ENTRY_BYTES as u64 {
        return Err(IndexError::Length { count, len_bytes });
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut seen = vec![0u64; sizes.len().div_ceil(64)];
    let mut end_before = 0u64;
    for (position, raw) in body[HEADER_BYTES..].chunks_exact(ENTRY_BYTES).enumerate() {
        let e = IndexEntry {
            sample: u32_at(raw, 0),
            len: u32_at(raw, 4),
            crc: u32_at(raw, 8),
            addr: u64_at(raw, 16),
        };
        let bad = |what| IndexError::Entry {
            position: position as u64,
            sample: e.sample,
            what,
        };
        let Some(&size) = sizes.get(e.sample as usize) else {
            return Err(bad("no such sample in the size table"));
        };
        if e.len != size {
            return Err(bad("its size is not the size table's"));
        }
        if u32_at(raw, 12) != 0 {
            return Err(bad("reserved bytes are not zero"));
        }
        if e.addr % BLOCK_BYTES != 0 {
            return Err(bad("not aligned to a block"));
        }
        let extent = extent_bytes(e.len);
        let end = e
            .addr
            .checked_add(extent)
            .filter(|&end| end <= geometry.capacity_bytes)
            .ok_or_else(|| bad("past the tier's capacity"))?;
        if e.addr / geometry.segment_bytes != (end - 1) / geometry.segment_bytes {
            return Err(bad("spans two segments"));
        }
        if e.addr < end_before {
            return Err(bad("overlaps the entry before it, or is out of order"));
        }
        end_before = end;
        let (word, bit) = (e.sample as usize / 64, 1u64 << (e.sample % 64));
        if seen[word] & bit != 0 {
            return Err(bad("its sample has another entry"));
        }
        seen[word] |= bit;
        entries.push(e);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Geometry {
        Geometry {
            fingerprint: 0xfeed,
            capacity_bytes: 64 * BLOCK_BYTES,
            segment_bytes: 16 * BLOCK_BYTES,
            num_samples: 8,
        }
    }

    const SIZES: [u32; 8] = [1, 4096, 4097, 10_000, 0, 65_536, 3, 12_288];

    fn some_entries() -> Vec<IndexEntry> {
        vec![
            IndexEntry {
                sample: 3,
                len: 10_000,
                crc: 7,
                addr: 0,
            },
            IndexEntry {
                sample: 5,
                len: 65_536,
                crc: 9,
                addr: 16 * BLOCK_BYTES,
            },
            IndexEntry {
                sample: 0,
                len: 1,
                crc: 1,
                addr: 3 * BLOCK_BYTES,
            },
        ]
    }

    #[test]
    fn an_index_reads_back_its_entries_sorted_by_address() {
        let bytes = encode(&geometry(), &some_entries());
        let mut want = some_entries();
        want.sort_by_key(|e| e.addr);
        assert_eq!(parse(&bytes, &geometry(), &SIZES).unwrap(), want);
        assert!(bytes.len() as u64 <= geometry().index_bytes_max());
    }

    #[test]
    fn every_flipped_byte_and_every_cut_is_refused() {
        let bytes = encode(&geometry(), &some_entries());
        for at in 0..bytes.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = bytes.clone();
                b[at] ^= bit;
                assert!(parse(&b, &geometry(), &SIZES).is_err(), "flip at {at}");
            }
        }
        for len in 0..bytes.len() {
            assert!(
                parse(&bytes[..len], &geometry(), &SIZES).is_err(),
                "cut at {len}"
            );
        }
    }

    #[test]
    fn an_index_of_another_geometry_is_foreign() {
        let bytes = encode(&geometry(), &some_entries());
        for (g, field) in [
            (
                Geometry {
                    fingerprint: 1,
                    ..geometry()
                },
                "fingerprint",
            ),
            (
                Geometry {
                    capacity_bytes: 128 * BLOCK_BYTES,
                    ..geometry()
                },
                "capacity_bytes",
            ),
            (
                Geometry {
                    segment_bytes: 32 * BLOCK_BYTES,
                    ..geometry()
                },
                "segment_bytes",
            ),
        ] {
            match parse(&bytes, &g, &SIZES) {
                Err(IndexError::Foreign { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        let sizes9 = [SIZES.as_slice(), &[1]].concat();
        let g9 = Geometry {
            num_samples: 9,
            ..geometry()
        };
        assert!(matches!(
            parse(&bytes, &g9, &sizes9),
            Err(IndexError::Foreign {
                field: "num_samples",
                ..
            })
        ));
    }

    #[test]
    fn sealed_entries_that_cannot_be_right_are_refused() {
        let e = |sample, len, addr| IndexEntry {
            sample,
            len,
            crc: 0,
            addr,
        };
        let b = BLOCK_BYTES;
        for (entries, what) in [
            (vec![e(9, 1, 0)], "no such sample in the size table"),
            (vec![e(0, 2, 0)], "its size is not the size table's"),
            (vec![e(0, 1, 1)], "not aligned to a block"),
            (vec![e(5, 65_536, 60 * b)], "past the tier's capacity"),
            (vec![e(5, 65_536, 8 * b)], "spans two segments"),
            (
                vec![e(3, 10_000, 0), e(0, 1, 2 * b)],
                "overlaps the entry before it, or is out of order",
            ),
            (vec![e(0, 1, 0), e(0, 1, b)], "its sample has another entry"),
        ] {
            let bytes = encode(&geometry(), &entries);
            match parse(&bytes, &geometry(), &SIZES) {
                Err(IndexError::Entry { what: w, .. }) => assert_eq!(w, what),
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn more_entries_than_the_geometry_allows_are_refused_before_they_are_read() {
        let g = Geometry {
            num_samples: 2,
            ..geometry()
        };
        let e = |sample, addr| IndexEntry {
            sample,
            len: 1,
            crc: 0,
            addr,
        };
        let three = encode(&g, &[e(0, 0), e(1, BLOCK_BYTES), e(0, 2 * BLOCK_BYTES)]);
        assert!(matches!(
            parse(&three, &g, &[1, 1]),
            Err(IndexError::TooLarge { .. })
        ));
        // The count field alone past the bound, the file within it.
        let mut one = encode(&g, &[e(0, 0)]);
        one[40..48].copy_from_slice(&3u64.to_le_bytes());
        let body = one.len() - 4;
        let seal = crc32fast::hash(&one[..body]);
        one[body..].copy_from_slice(&seal.to_le_bytes());
        assert_eq!(
            parse(&one, &g, &[1, 1]),
            Err(IndexError::EntryCount { count: 3, max: 2 })
        );
    }

    #[test]
    fn the_fuzz_checker_holds_on_random_and_mutated_indexes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let good = crate::fuzz::sample_index();
        crate::fuzz::check_index(&[&[3u8][..], &good].concat());
        for _ in 0..3_000 {
            let mut data = [&[rng.gen::<u8>()][..], &good].concat();
            for _ in 0..rng.gen_range(0..4) {
                let at = rng.gen_range(0..data.len());
                data[at] = rng.gen();
            }
            data.truncate(rng.gen_range(0..=data.len()));
            crate::fuzz::check_index(&data);
        }
    }
}
