//! A byte-bounded store of sample bytes shared by concurrent ranks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

use crate::{SampleId, StoreError};

const SHARDS: usize = 16;

/// Map from sample id to its bytes whose total size never exceeds `capacity_bytes`.
///
/// `Sync`: ranks insert, get and remove concurrently. Bytes are reserved against the capacity
/// with an atomic compare-and-swap before a value goes in, so the bound holds at every
/// instant, not just between calls. Values are `Bytes`: `get` hands out a reference-counted
/// view, no copy.
#[derive(Debug)]
pub struct Store {
    capacity_bytes: u64,
    used_bytes: AtomicU64,
    shards: Box<[Mutex<HashMap<SampleId, Bytes>>]>,
}

impl Store {
    /// An empty store that holds at most `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> Self {
        Store {
            capacity_bytes,
            used_bytes: AtomicU64::new(0),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, sample: SampleId) -> MutexGuard<'_, HashMap<SampleId, Bytes>> {
        // A panic while holding a shard cannot leave the map half-updated: recover it.
        self.shards[sample as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `value` for `sample`.
    ///
    /// # Errors
    /// [`StoreError::Full`] if it would exceed the capacity, [`StoreError::AlreadyPresent`]
    /// if the sample is already stored; the store is unchanged in both cases.
    pub fn insert(&self, sample: SampleId, value: Bytes) -> Result<(), StoreError> {
        let size_bytes = value.len() as u64;
        let mut shard = self.shard(sample);
        if shard.contains_key(&sample) {
            return Err(StoreError::AlreadyPresent { sample });
        }
        let reserved = self
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(size_bytes)
                    .filter(|&total| total <= self.capacity_bytes)
            });
        match reserved {
            Ok(before) => {
                assert!(
                    before + size_bytes <= self.capacity_bytes,
                    "store over capacity"
                );
                shard.insert(sample, value);
                Ok(())
            }
            Err(used_bytes) => Err(StoreError::Full {
                sample,
                size_bytes,
                used_bytes,
                capacity_bytes: self.capacity_bytes,
            }),
        }
    }

    /// The bytes of `sample`, if stored.
    pub fn get(&self, sample: SampleId) -> Option<Bytes> {
        self.shard(sample).get(&sample).cloned()
    }

    /// Whether `sample` is stored.
    pub fn contains(&self, sample: SampleId) -> bool {
        self.shard(sample).contains_key(&sample)
    }

    /// Removes `sample` and returns its bytes, if stored.
    pub fn remove(&self, sample: SampleId) -> Option<Bytes> {
        let value = self.shard(sample).remove(&sample)?;
        self.used_bytes
            .fetch_sub(value.len() as u64, Ordering::AcqRel);
        Some(value)
    }

    /// Bytes stored now (never more than [`capacity_bytes`](Store::capacity_bytes)).
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Acquire)
    }

    /// The capacity.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Number of samples stored.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn insert_refuses_to_exceed_capacity_and_leaves_store_unchanged() {
        let store = Store::new(10);
        store.insert(1, Bytes::from(vec![0u8; 6])).unwrap();
        let err = store.insert(2, Bytes::from(vec![0u8; 5])).unwrap_err();
        assert_eq!(
            err,
            StoreError::Full {
                sample: 2,
                size_bytes: 5,
                used_bytes: 6,
                capacity_bytes: 10
            }
        );
        assert_eq!(store.used_bytes(), 6);
        assert!(!store.contains(2));
        store.insert(2, Bytes::from(vec![0u8; 4])).unwrap();
        assert_eq!(store.used_bytes(), 10);
    }

    #[test]
    fn duplicate_insert_is_an_error_and_remove_returns_bytes() {
        let store = Store::new(100);
        store.insert(7, Bytes::from_static(b"abc")).unwrap();
        assert_eq!(
            store.insert(7, Bytes::from_static(b"x")),
            Err(StoreError::AlreadyPresent { sample: 7 })
        );
        assert_eq!(store.get(7).as_deref(), Some(&b"abc"[..]));
        assert_eq!(store.remove(7).as_deref(), Some(&b"abc"[..]));
        assert_eq!(store.remove(7), None);
        assert_eq!(store.used_bytes(), 0);
        assert!(store.is_empty());
    }

    #[test]
    fn concurrent_ranks_never_push_store_over_capacity() {
        let store = Arc::new(Store::new(1000));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut max = 0;
                while !stop.load(Ordering::Relaxed) {
                    max = max.max(store.used_bytes());
                }
                max
            })
        };
        let workers: Vec<_> = (0..4u32)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let mut x = 0x9E37_79B9u32.wrapping_mul(t + 1);
                    let mut inserted = 0u32;
                    for _ in 0..20_000 {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        let sample = x % 64;
                        let len = (x >> 8) as usize % 200;
                        if x & 1 == 0 {
                            if store
                                .insert(sample, Bytes::from(vec![t as u8; len]))
                                .is_ok()
                            {
                                inserted += 1;
                            }
                        } else {
                            store.remove(sample);
                        }
                        assert!(store.used_bytes() <= store.capacity_bytes());
                    }
                    inserted
                })
            })
            .collect();
        let inserted: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        stop.store(true, Ordering::Relaxed);
        let max_seen = watcher.join().unwrap();
        assert!(inserted > 0);
        assert!(max_seen <= 1000, "saw {max_seen} bytes in a store of 1000");
        let held: u64 = (0..64)
            .filter_map(|s| store.get(s))
            .map(|b| b.len() as u64)
            .sum();
        assert_eq!(held, store.used_bytes());
    }
}
