//! First-fit allocation of 4 KiB-aligned extents over the segment files, seen as one
//! address space: segment `i` holds the addresses `[i * segment_bytes, (i + 1) *
//! segment_bytes)`, the last one possibly shorter.
//!
//! Fragmentation: free extents are coalesced, so each one lies between two held extents or
//! a segment's ends, and there are at most `entries + segments` of them. A request of `a`
//! aligned bytes fails only when no free extent holds `a`, so the free bytes it cannot use
//! are less than `(entries + segments) * a`. Where every entry has one aligned size `a`,
//! first fit keeps every extent at a multiple of `a` from its segment's start, so every free
//! extent but a segment's last is a multiple of `a`: a request then fails only when the
//! free bytes are under `a + sum over segments of (segment length mod a)`.

use std::collections::BTreeMap;

/// The unit of the tier's extents: O_DIRECT needs offsets and lengths aligned to the
/// device's logical block, which 4 KiB is a multiple of on every common device.
pub const BLOCK_BYTES: u64 = 4096;

/// The bytes of disk an entry of `size_bytes` holds: its size rounded up to whole 4 KiB
/// blocks, one block at least (so the entries are bounded by the capacity's blocks).
pub fn extent_bytes(size_bytes: u32) -> u64 {
    u64::from(size_bytes).max(1).next_multiple_of(BLOCK_BYTES)
}

/// The free extents of an address space, sorted by address, never two adjacent within a
/// segment.
#[derive(Debug)]
pub(crate) struct FreeList {
    /// Start address to length.
    free: BTreeMap<u64, u64>,
    segment_bytes: u64,
    total_bytes: u64,
    free_bytes: u64,
}

impl FreeList {
    /// All of `total_bytes` free, in segments of `segment_bytes` (both multiples of
    /// [`BLOCK_BYTES`], the segment not zero).
    pub(crate) fn new(total_bytes: u64, segment_bytes: u64) -> FreeList {
        assert!(segment_bytes > 0 && segment_bytes % BLOCK_BYTES == 0);
        assert!(total_bytes % BLOCK_BYTES == 0);
        let mut free = BTreeMap::new();
        let mut start = 0;
        while start < total_bytes {
            let len = segment_bytes.min(total_bytes - start);
            free.insert(start, len);
            start += len;
        }
        FreeList {
            free,
            segment_bytes,
            total_bytes,
            free_bytes: total_bytes,
        }
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Free extents now (at most entries + segments).
    #[cfg(test)]
    pub(crate) fn extents(&self) -> usize {
        self.free.len()
    }

    /// The address of `len` bytes (a multiple of [`BLOCK_BYTES`]) taken from the first free
    /// extent that holds them; `None` if none does.
    pub(crate) fn alloc(&mut self, len: u64) -> Option<u64> {
        debug_assert!(len > 0 && len % BLOCK_BYTES == 0);
        let (&start, &have) = self.free.iter().find(|(_, &have)| have >= len)?;
        self.free.remove(&start);
        if have > len {
            self.free.insert(start + len, have - len);
        }
        self.free_bytes -= len;
        Some(start)
    }

    /// Takes `[addr, addr + len)` if it is free and inside one segment (an entry a previous
    /// run left); false, and nothing taken, otherwise.
    pub(crate) fn reserve(&mut self, addr: u64, len: u64) -> bool {
        if len == 0 || addr % BLOCK_BYTES != 0 || len % BLOCK_BYTES != 0 {
            return false;
        }
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        let Some((&start, &have)) = self.free.range(..=addr).next_back() else {
            return false;
        };
        if end > start + have {
            return false;
        }
        self.free.remove(&start);
        if addr > start {
            self.free.insert(start, addr - start);
        }
        if start + have > end {
            self.free.insert(end, start + have - end);
        }
        self.free_bytes -= len;
        true
    }

    /// Gives back `[addr, addr + len)`, taken before, joining it with the free extents on
    /// either side within its segment.
    pub(crate) fn free(&mut self, addr: u64, len: u64) {
        let end = addr + len;
        assert!(
            end <= self.total_bytes,
            "extent {addr}+{len} outside the tier"
        );
        let (mut start, mut len) = (addr, len);
        if addr % self.segment_bytes != 0 {
            if let Some((&p, &plen)) = self.free.range(..addr).next_back() {
                assert!(p + plen <= addr, "extent {addr}+{len} freed twice");
                if p + plen == addr {
                    self.free.remove(&p);
                    start = p;
                    len += plen;
                }
            }
        }
        if let Some((&n, &nlen)) = self.free.range(addr..).next() {
            assert!(n >= end, "extent {addr}+{} freed twice", end - addr);
            if n == end && end % self.segment_bytes != 0 {
                self.free.remove(&n);
                len += nlen;
            }
        }
        self.free.insert(start, len);
        self.free_bytes += end - addr;
        debug_assert!(self.free_bytes <= self.total_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const B: u64 = BLOCK_BYTES;

    #[test]
    fn extents_are_whole_blocks_one_at_least() {
        assert_eq!(extent_bytes(0), B);
        assert_eq!(extent_bytes(1), B);
        assert_eq!(extent_bytes(4096), B);
        assert_eq!(extent_bytes(4097), 2 * B);
        assert_eq!(extent_bytes(u32::MAX), 1 << 32);
    }

    #[test]
    fn first_fit_takes_the_lowest_free_extent_that_holds_the_request() {
        let mut f = FreeList::new(16 * B, 8 * B);
        let a = f.alloc(2 * B).unwrap();
        let b = f.alloc(2 * B).unwrap();
        let c = f.alloc(2 * B).unwrap();
        assert_eq!((a, b, c), (0, 2 * B, 4 * B));
        f.free(a, 2 * B);
        // The hole at 0 holds 2 blocks: a request of 3 goes past it, one of 1 into it.
        assert_eq!(f.alloc(3 * B), Some(8 * B));
        assert_eq!(f.alloc(B), Some(0));
        assert_eq!(f.free_bytes(), 16 * B - 8 * B);
    }

    #[test]
    fn frees_coalesce_within_a_segment_but_not_across_its_end() {
        let mut f = FreeList::new(16 * B, 8 * B);
        let a = f.alloc(8 * B).unwrap();
        let b = f.alloc(8 * B).unwrap();
        assert_eq!(f.alloc(B), None);
        f.free(a, 8 * B);
        f.free(b, 8 * B);
        // Two segments, two extents: an extent never spans two files.
        assert_eq!(f.extents(), 2);
        assert_eq!(f.alloc(9 * B), None);
        let x = f.alloc(4 * B).unwrap();
        let y = f.alloc(4 * B).unwrap();
        f.free(x, 4 * B);
        f.free(y, 4 * B);
        assert_eq!(f.extents(), 2);
        assert_eq!(f.alloc(8 * B), Some(0));
    }

    #[test]
    fn reserve_takes_only_free_aligned_ranges_within_a_segment() {
        let mut f = FreeList::new(16 * B, 8 * B);
        assert!(f.reserve(2 * B, 2 * B));
        assert!(!f.reserve(3 * B, B), "overlaps the reserved range");
        assert!(!f.reserve(7 * B, 2 * B), "spans two segments");
        assert!(!f.reserve(15 * B, 2 * B), "past the end");
        assert!(!f.reserve(B + 1, B), "misaligned");
        assert!(!f.reserve(u64::MAX - B + 1, B), "wraps");
        assert_eq!(f.free_bytes(), 14 * B);
        assert_eq!(f.alloc(2 * B), Some(0));
        assert_eq!(f.alloc(B), Some(4 * B));
    }

    /// The allocator against a map of blocks, with random sizes: every taken extent is free in
    /// the map, inside one segment, the free bytes agree, and a refused request has no run
    /// of free blocks long enough in any segment.
    #[test]
    fn random_workload_agrees_with_a_block_map() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(41);
        for round in 0..20 {
            let segment_blocks = rng.gen_range(1..=24u64);
            let total_blocks = rng.gen_range(1..=80u64);
            let mut f = FreeList::new(total_blocks * B, segment_blocks * B);
            let mut used = vec![false; total_blocks as usize];
            let mut held: Vec<(u64, u64)> = Vec::new();
            for _ in 0..2_000 {
                if rng.gen_bool(0.55) || held.is_empty() {
                    let blocks = rng.gen_range(1..=segment_blocks.min(8) + 1);
                    match f.alloc(blocks * B) {
                        Some(addr) => {
                            let first = addr / B;
                            assert_eq!(
                                first / segment_blocks,
                                (first + blocks - 1) / segment_blocks
                            );
                            for b in first..first + blocks {
                                assert!(!used[b as usize], "round {round}: block {b} given twice");
                                used[b as usize] = true;
                            }
                            held.push((addr, blocks * B));
                        }
                        None => {
                            let fits = used
                                .chunks(segment_blocks as usize)
                                .any(|seg| seg.split(|&u| u).any(|run| run.len() as u64 >= blocks));
                            assert!(!fits, "round {round}: {blocks} blocks refused with room");
                        }
                    }
                } else {
                    let (addr, len) = held.swap_remove(rng.gen_range(0..held.len()));
                    f.free(addr, len);
                    for b in addr / B..(addr + len) / B {
                        used[b as usize] = false;
                    }
                }
                let free = used.iter().filter(|&&u| !u).count() as u64 * B;
                assert_eq!(f.free_bytes(), free);
                assert!(f.extents() <= held.len() + total_blocks.div_ceil(segment_blocks) as usize);
            }
        }
    }

    /// The bound the module's docs give for one size: filled until refused, the free bytes
    /// are under one request plus each segment's remainder.
    #[test]
    fn with_one_size_a_refusal_leaves_less_than_a_request_and_the_segments_tails() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..50 {
            let segment_bytes = rng.gen_range(1..=40u64) * B;
            let total_bytes = rng.gen_range(1..=200u64) * B;
            let a = rng.gen_range(1..=10u64) * B;
            let mut f = FreeList::new(total_bytes, segment_bytes);
            let mut held = Vec::new();
            // Churn first, so the holes are where frees left them.
            for _ in 0..300 {
                if rng.gen_bool(0.6) {
                    if let Some(x) = f.alloc(a) {
                        held.push(x);
                    }
                } else if !held.is_empty() {
                    let x = held.swap_remove(rng.gen_range(0..held.len()));
                    f.free(x, a);
                }
            }
            while f.alloc(a).is_some() {}
            let mut tails = 0;
            let mut start = 0;
            while start < total_bytes {
                let len = segment_bytes.min(total_bytes - start);
                tails += len % a;
                start += len;
            }
            assert!(
                f.free_bytes() < a + tails,
                "{} free, a {a}, tails {tails}",
                f.free_bytes()
            );
        }
    }
}
