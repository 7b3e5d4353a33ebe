//! Buffers given back once their contents are used and taken again by the decode threads,
//! so that an image is written into memory already mapped and written once: a fresh
//! buffer of a photograph's size costs its page faults or its clearing, about as much again
//! as a tenth of its decode.

use std::sync::Mutex;

/// Buffers given back, kept up to a count and a number of bytes (their capacity).
#[derive(Debug)]
pub struct Recycler {
    free: Mutex<Kept>,
    count_max: usize,
    bytes_max: usize,
}

#[derive(Debug)]
struct Kept {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl Recycler {
    /// Keeps at most `count_max` buffers of at most `bytes_max` bytes in all.
    pub const fn new(count_max: usize, bytes_max: usize) -> Self {
        Recycler {
            free: Mutex::new(Kept {
                buffers: Vec::new(),
                bytes: 0,
            }),
            count_max,
            bytes_max,
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        // A panic while holding the lock leaves only a list of buffers: still usable.
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer given back (its contents are the last sample's), or a new empty one: the
    /// shortest at least `len` long, else the longest, so that as little as possible of it
    /// is cleared again to grow.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let mut kept = self.kept();
        // Lower is better: the length past `len` of a buffer long enough, else how much
        // shorter it is, after every buffer long enough. An exact fit ends the search (the
        // common case: a transform's outputs all have one size).
        let cost = |v: &Vec<u8>| match v.len().checked_sub(len) {
            Some(past) => (false, past),
            None => (true, len - v.len()),
        };
        let mut best: Option<(usize, (bool, usize))> = None;
        for (i, v) in kept.buffers.iter().enumerate().rev() {
            let c = cost(v);
            if best.is_none_or(|(_, b)| c < b) {
                best = Some((i, c));
                if c == (false, 0) {
                    break;
                }
            }
        }
        match best {
            Some((i, _)) => {
                let v = kept.buffers.swap_remove(i);
                kept.bytes -= v.capacity();
                v
            }
            None => Vec::new(),
        }
    }

    /// Keeps `v` for a later [`Recycler::take`], or frees it past the bounds.
    pub fn give(&self, v: Vec<u8>) {
        let mut kept = self.kept();
        if kept.buffers.len() < self.count_max && kept.bytes + v.capacity() <= self.bytes_max {
            kept.bytes += v.capacity();
            kept.buffers.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_within_the_count_and_bytes() {
        let r = Recycler::new(3, 100);
        assert!(r.take(1).is_empty());
        r.give(vec![1; 10]);
        r.give(vec![2; 20]);
        r.give(vec![4; 40]);
        // Past the count: freed.
        r.give(vec![3; 30]);
        assert_eq!(r.kept().buffers.len(), 3);
        assert_eq!(r.kept().bytes, 70);
        // The shortest long enough; else the longest.
        assert_eq!(r.take(15), vec![2; 20]);
        assert_eq!(r.take(50), vec![4; 40]);
        assert_eq!(r.kept().bytes, 10);
        // Past the bytes: freed.
        r.give(Vec::with_capacity(91));
        assert_eq!(r.kept().buffers.len(), 1);
        assert_eq!(r.take(0), vec![1; 10]);
        assert!(r.take(0).is_empty());
    }
}
