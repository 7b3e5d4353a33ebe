//! The checker of the `tier_index` fuzz target, run by the unit tests too: arbitrary bytes as
//! an index are refused or give entries a tier can hold, never a panic.

use crate::alloc::{extent_bytes, FreeList, BLOCK_BYTES};
use crate::index::{encode, parse, Geometry, IndexEntry};

const GEOMETRY: Geometry = Geometry {
    fingerprint: 0x0123_4567_89ab_cdef,
    capacity_bytes: 40 * BLOCK_BYTES,
    segment_bytes: 12 * BLOCK_BYTES,
    num_samples: 12,
};

const SIZES: [u32; 12] = [
    0, 1, 4095, 4096, 4097, 8192, 20_000, 40_000, 49_152, 3, 100, 12_288,
];

/// A valid index of the checker's geometry, a seed for the fuzzer and the unit tests.
pub(crate) fn sample_index() -> Vec<u8> {
    let e = |sample: u32, blocks: u64| IndexEntry {
        sample,
        len: SIZES[sample as usize],
        crc: sample.wrapping_mul(0x9e37_79b9),
        addr: blocks * BLOCK_BYTES,
    };
    encode(
        &GEOMETRY,
        &[e(1, 0), e(6, 2), e(8, 12), e(4, 30), e(11, 33)],
    )
}

/// `data[0]` picks repairs that let the fuzzer past the outer checks (bit 0: seal the
/// rest again; bit 1: write the checker's geometry into its header; bit 2: set the entry
/// count from its length), `data[1..]` is the index. Whatever the parser accepts must be
/// entries the allocator can reserve, each of its sample's size, and must encode to an
/// index that parses back the same.
pub(crate) fn check_index(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if mode & 2 != 0 && bytes.len() >= 48 {
        for (i, v) in [
            GEOMETRY.fingerprint,
            GEOMETRY.capacity_bytes,
            GEOMETRY.segment_bytes,
            GEOMETRY.num_samples,
        ]
        .into_iter()
        .enumerate()
        {
            bytes[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
    }
    if mode & 4 != 0 && bytes.len() >= 52 {
        let count = ((bytes.len() - 52) / 24) as u64;
        bytes[40..48].copy_from_slice(&count.to_le_bytes());
    }
    if mode & 1 != 0 && bytes.len() >= 4 {
        let body = bytes.len() - 4;
        let seal = crc32fast::hash(&bytes[..body]);
        bytes[body..].copy_from_slice(&seal.to_le_bytes());
    }
    let Ok(entries) = parse(&bytes, &GEOMETRY, &SIZES) else {
        return;
    };
    assert!(bytes.len() as u64 <= GEOMETRY.index_bytes_max());
    assert!(entries.len() as u64 <= GEOMETRY.entries_max());
    let mut free = FreeList::new(GEOMETRY.capacity_bytes, GEOMETRY.segment_bytes);
    let mut held_bytes = 0;
    for e in &entries {
        assert_eq!(e.len, SIZES[e.sample as usize]);
        let extent = extent_bytes(e.len);
        assert!(free.reserve(e.addr, extent), "{e:?} not free");
        held_bytes += extent;
    }
    assert_eq!(free.free_bytes() + held_bytes, GEOMETRY.capacity_bytes);
    let again = encode(&GEOMETRY, &entries);
    assert_eq!(
        again, bytes,
        "an accepted index is the encoding of its entries"
    );
    assert_eq!(parse(&again, &GEOMETRY, &SIZES).as_ref(), Ok(&entries));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_index_is_accepted_and_each_repair_alone_keeps_it() {
        assert_eq!(parse(&sample_index(), &GEOMETRY, &SIZES).unwrap().len(), 5);
        for mode in 0..8u8 {
            check_index(&[&[mode][..], &sample_index()].concat());
        }
    }
}
