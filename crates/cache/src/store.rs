//! A byte-bounded map from sample to what the cache keeps of it.

use std::collections::HashMap;
use std::hash::BuildHasher;

use crate::{SampleId, StoreError};

/// Map from sample id to a value of a known size in bytes, whose total never exceeds
/// `capacity_bytes`.
///
/// One owner: the loader's planner makes every cache decision in stream order on one
/// thread, so the store needs no lock. A value is whatever stands for the sample's bytes (the
/// bytes themselves, or the slot they will appear in); its size is given at insertion, so a
/// value whose bytes are still being read is accounted at the size it will have.
///
/// Hashed with `S`, by default ahash: the loader touches the store on every access, and
/// there `benches/cache_maps.rs` measures ahash at about half the cost of std's SipHash.
#[derive(Debug)]
pub struct Store<V, S = ahash::RandomState> {
    capacity_bytes: u64,
    used_bytes: u64,
    entries: HashMap<SampleId, (u64, V), S>,
}

impl<V> Store<V> {
    /// An empty store that holds at most `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_hasher(capacity_bytes, ahash::RandomState::new())
    }
}

impl<V, S: BuildHasher> Store<V, S> {
    /// An empty store that holds at most `capacity_bytes`, hashing with `hasher`.
    pub fn with_hasher(capacity_bytes: u64, hasher: S) -> Self {
        Store {
            capacity_bytes,
            used_bytes: 0,
            entries: HashMap::with_hasher(hasher),
        }
    }

    /// Stores `value` of `size_bytes` for `sample`.
    ///
    /// # Errors
    /// [`StoreError::Full`] if it would exceed the capacity, [`StoreError::AlreadyPresent`]
    /// if the sample is already stored; the store is unchanged in both cases.
    pub fn insert(
        &mut self,
        sample: SampleId,
        size_bytes: u64,
        value: V,
    ) -> Result<(), StoreError> {
        if self.entries.contains_key(&sample) {
            return Err(StoreError::AlreadyPresent { sample });
        }
        let total = self.used_bytes.checked_add(size_bytes);
        match total.filter(|&t| t <= self.capacity_bytes) {
            Some(total) => {
                self.used_bytes = total;
                self.entries.insert(sample, (size_bytes, value));
                Ok(())
            }
            None => Err(StoreError::Full {
                sample,
                size_bytes,
                used_bytes: self.used_bytes,
                capacity_bytes: self.capacity_bytes,
            }),
        }
    }

    /// The value of `sample`, if stored.
    pub fn get(&self, sample: SampleId) -> Option<&V> {
        self.entries.get(&sample).map(|(_, v)| v)
    }

    /// Whether `sample` is stored.
    pub fn contains(&self, sample: SampleId) -> bool {
        self.entries.contains_key(&sample)
    }

    /// Removes `sample` and returns its value, if stored.
    pub fn remove(&mut self, sample: SampleId) -> Option<V> {
        let (size_bytes, value) = self.entries.remove(&sample)?;
        self.used_bytes -= size_bytes;
        Some(value)
    }

    /// Bytes stored now (never more than [`capacity_bytes`](Store::capacity_bytes)).
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// The capacity.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Number of samples stored.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn insert_refuses_to_exceed_capacity_and_leaves_store_unchanged() {
        let mut store = Store::new(10);
        store.insert(1, 6, "a").unwrap();
        let err = store.insert(2, 5, "b").unwrap_err();
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
        store.insert(2, 4, "c").unwrap();
        assert_eq!(store.used_bytes(), 10);
        // A size that overflows the count is refused, not wrapped.
        assert!(matches!(
            store.insert(3, u64::MAX, "d"),
            Err(StoreError::Full { sample: 3, .. })
        ));
    }

    #[test]
    fn duplicate_insert_is_an_error_and_remove_returns_the_value() {
        let mut store = Store::new(100);
        store.insert(7, 3, "abc").unwrap();
        assert_eq!(
            store.insert(7, 1, "x"),
            Err(StoreError::AlreadyPresent { sample: 7 })
        );
        assert_eq!(store.get(7), Some(&"abc"));
        assert_eq!(store.remove(7), Some("abc"));
        assert_eq!(store.remove(7), None);
        assert_eq!(store.used_bytes(), 0);
        assert!(store.is_empty());
    }

    #[test]
    fn used_bytes_match_a_reference_model_over_random_operations_with_either_hasher() {
        check_against_model(Store::new(1000));
        check_against_model(Store::with_hasher(
            1000,
            std::collections::hash_map::RandomState::new(),
        ));
    }

    fn check_against_model<S: BuildHasher>(mut store: Store<SampleId, S>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut model: HashMap<SampleId, u64> = HashMap::new();
        for _ in 0..20_000 {
            let sample = rng.gen_range(0..64);
            let size: u64 = rng.gen_range(0..200);
            if rng.gen_bool(0.5) {
                let fits = model.values().sum::<u64>() + size <= 1000;
                let absent = !model.contains_key(&sample);
                let inserted = store.insert(sample, size, sample).is_ok();
                assert_eq!(inserted, fits && absent);
                if inserted {
                    model.insert(sample, size);
                }
            } else {
                assert_eq!(store.remove(sample), model.remove(&sample).map(|_| sample));
            }
            assert_eq!(store.used_bytes(), model.values().sum::<u64>());
            assert!(store.used_bytes() <= store.capacity_bytes());
            assert_eq!(store.len(), model.len());
        }
    }
}
