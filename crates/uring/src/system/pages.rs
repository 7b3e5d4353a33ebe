//! Copies of bytes into their own anonymous mappings, for data held long and freed in any
//! order (a node cache). The heap keeps its high-water mark when such copies come and go in
//! many sizes; a mapping gives its pages back to the system when it drops.

use bytes::Bytes;

use crate::system::mapping::Mapping;

/// Copies `data` into a private anonymous mapping of whole pages and returns it as `Bytes`;
/// the mapping is unmapped when the last clone drops. The copy costs at most one page over
/// `data.len()`. Empty input gives empty `Bytes` without a mapping.
///
/// # Errors
/// The `mmap` error when the system refuses the mapping.
pub fn copy_to_pages(data: &[u8]) -> std::io::Result<Bytes> {
    if data.is_empty() {
        return Ok(Bytes::new());
    }
    let page = page_bytes();
    let mapping = Mapping::new(data.len().div_ceil(page) * page, false)?;
    // SAFETY: the mapping is at least `data.len()` writable bytes, new, so it cannot overlap
    // `data`.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), mapping.base().as_ptr(), data.len());
    }
    Ok(Bytes::from_owner(Pages {
        mapping,
        len: data.len(),
    }))
}

fn page_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// One mapping holding `len` bytes of data.
#[derive(Debug)]
struct Pages {
    mapping: Mapping,
    len: usize,
}

// SAFETY: the mapping is written once before `Pages` exists and only read afterwards; it is
// owned by this value alone.
unsafe impl Send for Pages {}
// SAFETY: as above: shared access is read-only.
unsafe impl Sync for Pages {}

impl AsRef<[u8]> for Pages {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the mapping holds at least `len` bytes, the first `len` initialised by the
        // copy, and it lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.mapping.base().as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_equal_and_independent_of_their_source() {
        for len in [1usize, 4095, 4096, 4097, 100_000] {
            let mut data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let copy = copy_to_pages(&data).unwrap();
            let clone = copy.clone();
            assert_eq!(&copy[..], &data[..]);
            data.iter_mut().for_each(|b| *b = 0);
            drop(copy);
            assert!(clone
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i * 31 % 251) as u8));
        }
        assert!(copy_to_pages(&[]).unwrap().is_empty());
    }
}
