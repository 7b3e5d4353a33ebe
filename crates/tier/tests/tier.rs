//! The disk tier's files end to end: round trips, bounds, reopening, damage, the O_DIRECT
//! fallback, the directory lock, and threads.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lobster_tier::{
    extent_bytes, Damage, DiskTier, IndexError, IndexStatus, TierError, TierOptions, SEGMENTS_MAX,
};
use rand::{Rng, SeedableRng};

const FP: u64 = 0x00c0_ffee_0041_0001;

/// Sample `s`'s bytes: the same in every run, different for every sample.
fn bytes_of(s: u32, size: u32) -> Vec<u8> {
    (0..size)
        .map(|i| (i.wrapping_mul(131) ^ s.wrapping_mul(2_654_435_761)) as u8)
        .collect()
}

fn random_sizes(rng: &mut impl Rng, n: usize, max: u32) -> Arc<[u32]> {
    (0..n)
        .map(|_| match rng.gen_range(0..4) {
            0 => rng.gen_range(0..=16),
            1 => 4096 * rng.gen_range(1..=3),
            _ => rng.gen_range(1..=max),
        })
        .collect()
}

fn both_modes() -> [TierOptions; 2] {
    [
        TierOptions::default(),
        TierOptions {
            allow_direct: false,
        },
    ]
}

fn segment(tier_dir: &Path, i: u64) -> PathBuf {
    tier_dir.join(format!("seg-{i}"))
}

/// The tier's files' bytes, index aside.
fn segment_bytes_on_disk(tier_dir: &Path) -> u64 {
    (0..SEGMENTS_MAX)
        .filter_map(|i| fs::metadata(segment(tier_dir, i)).ok())
        .map(|m| m.len())
        .sum()
}

#[test]
fn writes_read_back_and_removes_forget_at_random_sizes() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for options in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = random_sizes(&mut rng, 200, 30_000);
        let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), 64 << 20, options).unwrap();
        if options.allow_direct && !tier.direct() {
            eprintln!(
                "no O_DIRECT in {}: buffered path only",
                dir.path().display()
            );
        }
        for s in 0..200u32 {
            tier.write(s, &bytes_of(s, sizes[s as usize])).unwrap();
        }
        for s in 0..200u32 {
            assert_eq!(
                &tier.read(s).unwrap()[..],
                &bytes_of(s, sizes[s as usize])[..]
            );
        }
        let mut held: u64 = sizes.iter().map(|&z| extent_bytes(z)).sum();
        assert_eq!(tier.used_bytes(), held);
        for s in (0..200u32).step_by(3) {
            assert!(tier.remove(s));
            assert!(!tier.remove(s));
            assert!(!tier.contains(s));
            assert!(matches!(tier.read(s), Err(TierError::Missing { sample }) if sample == s));
            held -= extent_bytes(sizes[s as usize]);
        }
        assert_eq!(tier.used_bytes(), held);
        let want: Vec<u32> = (0..200).filter(|s| s % 3 != 0).collect();
        assert_eq!(tier.entries(), want);
        // Rewritten where the removed ones were.
        for s in (0..200u32).step_by(3) {
            tier.write(s, &bytes_of(s, sizes[s as usize])).unwrap();
        }
        for s in 0..200u32 {
            assert_eq!(
                &tier.read(s).unwrap()[..],
                &bytes_of(s, sizes[s as usize])[..]
            );
        }
        let st = tier.stats();
        assert_eq!(
            (st.writes, st.reads, st.removes, st.damaged),
            (267, 400, 67, 0)
        );
        assert_eq!(st.entries, 200);
    }
}

#[test]
fn bad_writes_are_refused_naming_the_sample() {
    let dir = tempfile::tempdir().unwrap();
    let sizes: Arc<[u32]> = vec![10, 20].into();
    let tier = DiskTier::open(dir.path(), FP, sizes, 1 << 20).unwrap();
    assert!(matches!(
        tier.write(2, &[0; 10]),
        Err(TierError::SampleOutOfRange {
            sample: 2,
            num_samples: 2
        })
    ));
    let e = tier.write(1, &[0; 10]).unwrap_err();
    assert!(matches!(
        e,
        TierError::SizeMismatch {
            sample: 1,
            len_bytes: 10,
            size_bytes: 20
        }
    ));
    assert!(e.to_string().contains("sample 1"), "{e}");
    tier.write(0, &[1; 10]).unwrap();
    assert!(matches!(
        tier.write(0, &[1; 10]),
        Err(TierError::Exists { sample: 0 })
    ));
    assert_eq!(tier.used_bytes(), 4096);
    assert!(matches!(
        DiskTier::open(dir.path(), FP + 1, vec![1].into(), 4095),
        Err(TierError::Capacity {
            capacity_bytes: 4095
        })
    ));
}

/// A random workload of writes and removes against a map of what should be there: the
/// extents held never exceed the capacity and are the map's, every entry reads back its
/// bytes, and a refused write is one that the free bytes could not have held in one piece.
#[test]
fn the_capacity_is_never_exceeded_under_a_random_workload() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    for round in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        let sizes = random_sizes(&mut rng, 300, 20_000);
        let capacity = rng.gen_range(4096..=600_000u64);
        let options = both_modes()[round % 2];
        let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), capacity, options).unwrap();
        let cap = tier.capacity_bytes();
        assert_eq!(cap, capacity / 4096 * 4096);
        let mut model: HashMap<u32, u64> = HashMap::new();
        let mut fulls = 0;
        for _ in 0..1_500 {
            let s = rng.gen_range(0..300u32);
            let size = sizes[s as usize];
            if model.contains_key(&s) {
                if rng.gen_bool(0.5) {
                    assert!(tier.remove(s));
                    model.remove(&s);
                } else {
                    assert_eq!(&tier.read(s).unwrap()[..], &bytes_of(s, size)[..]);
                }
            } else {
                let used: u64 = model.values().sum();
                match tier.write(s, &bytes_of(s, size)) {
                    Ok(()) => {
                        model.insert(s, extent_bytes(size));
                    }
                    Err(TierError::Full {
                        sample,
                        extent_bytes: e,
                        free_bytes,
                        capacity_bytes,
                    }) => {
                        assert_eq!((sample, e, capacity_bytes), (s, extent_bytes(size), cap));
                        assert_eq!(free_bytes, cap - used);
                        // In one piece: bounded by the entries and segments around it.
                        let pieces = model.len() as u64 + SEGMENTS_MAX;
                        assert!(free_bytes < e * pieces, "{free_bytes} free refused {e}");
                        fulls += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let used: u64 = model.values().sum();
            assert_eq!(tier.used_bytes(), used);
            assert!(used <= cap);
        }
        assert!(segment_bytes_on_disk(tier.dir()) <= cap);
        let mut want: Vec<u32> = model.keys().copied().collect();
        want.sort_unstable();
        assert_eq!(tier.entries(), want);
        for &s in &want {
            assert_eq!(
                &tier.read(s).unwrap()[..],
                &bytes_of(s, sizes[s as usize])[..]
            );
        }
        assert_eq!(tier.stats().full, fulls);
    }
}

#[test]
fn a_reopened_tier_has_the_entries_and_bytes_it_persisted() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for options in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = random_sizes(&mut rng, 100, 50_000);
        let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), 8 << 20, options).unwrap();
        assert_eq!(tier.index_status(), &IndexStatus::Missing);
        for s in 0..100u32 {
            tier.write(s, &bytes_of(s, sizes[s as usize])).unwrap();
        }
        for s in (0..100u32).filter(|s| s % 4 == 1) {
            tier.remove(s);
        }
        tier.persist().unwrap();
        let want = tier.entries();
        let used = tier.used_bytes();
        drop(tier);
        // Either I/O mode reads what the other wrote.
        for reopen in both_modes() {
            let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), 8 << 20, reopen).unwrap();
            assert_eq!(
                tier.index_status(),
                &IndexStatus::Loaded {
                    kept: want.len() as u64,
                    dropped: 0
                }
            );
            assert_eq!(tier.entries(), want);
            assert_eq!(tier.used_bytes(), used);
            for &s in &want {
                assert_eq!(
                    &tier.read(s).unwrap()[..],
                    &bytes_of(s, sizes[s as usize])[..]
                );
            }
            // New writes go around the loaded entries.
            for s in (0..100u32).filter(|s| s % 4 == 1).take(5) {
                tier.write(s, &bytes_of(s, sizes[s as usize])).unwrap();
            }
            for &s in &want {
                assert_eq!(
                    &tier.read(s).unwrap()[..],
                    &bytes_of(s, sizes[s as usize])[..]
                );
            }
            for s in (0..100u32).filter(|s| s % 4 == 1).take(5) {
                assert!(tier.remove(s));
            }
        }
    }
}

#[test]
fn dropping_a_tier_persists_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let sizes: Arc<[u32]> = vec![100; 10].into();
    {
        let tier = DiskTier::open(dir.path(), FP, sizes.clone(), 1 << 20).unwrap();
        tier.write(7, &bytes_of(7, 100)).unwrap();
        tier.write(2, &bytes_of(2, 100)).unwrap();
    }
    let tier = DiskTier::open(dir.path(), FP, sizes, 1 << 20).unwrap();
    assert_eq!(tier.entries(), vec![2, 7]);
    assert_eq!(&tier.read(7).unwrap()[..], &bytes_of(7, 100)[..]);
}

#[test]
fn a_flipped_byte_in_a_segment_is_damage_and_drops_the_entry() {
    for options in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let sizes: Arc<[u32]> = vec![5000, 300, 9000].into();
        let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), 1 << 20, options).unwrap();
        for s in 0..3u32 {
            tier.write(s, &bytes_of(s, sizes[s as usize])).unwrap();
        }
        // Sample 1 lies in the first segment after sample 0's two blocks.
        let seg0 = segment(tier.dir(), 0);
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&seg0)
            .unwrap();
        let mut b = [0u8];
        f.read_at(&mut b, 8192 + 123).unwrap();
        f.write_at(&[b[0] ^ 0x10], 8192 + 123).unwrap();
        f.sync_all().unwrap();
        let e = tier.read(1).unwrap_err();
        match &e {
            TierError::Damaged {
                sample: 1,
                file,
                offset: 8192,
                damage: Damage::Checksum { .. },
            } => assert_eq!(file, &seg0),
            other => panic!("{other:?}"),
        }
        let shown = e.to_string();
        assert!(
            shown.contains("sample 1") && shown.contains("seg-0"),
            "{shown}"
        );
        assert!(!tier.contains(1));
        assert!(matches!(
            tier.read(1),
            Err(TierError::Missing { sample: 1 })
        ));
        assert_eq!(tier.entries(), vec![0, 2]);
        assert_eq!(tier.used_bytes(), 2 * 4096 + 3 * 4096);
        assert_eq!(tier.stats().damaged, 1);
        // The others are untouched.
        assert_eq!(&tier.read(0).unwrap()[..], &bytes_of(0, 5000)[..]);
        assert_eq!(&tier.read(2).unwrap()[..], &bytes_of(2, 9000)[..]);
    }
}

#[test]
fn a_truncated_segment_is_damage_while_open_and_dropped_at_reopen() {
    for options in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let sizes: Arc<[u32]> = vec![5000, 6000, 7000].into();
        let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), 1 << 20, options).unwrap();
        for s in 0..3u32 {
            tier.write(s, &bytes_of(s, sizes[s as usize])).unwrap();
        }
        tier.persist().unwrap();
        // Sample 2 starts at block 4; cut the file inside it.
        let seg0 = segment(tier.dir(), 0);
        fs::OpenOptions::new()
            .write(true)
            .open(&seg0)
            .unwrap()
            .set_len(4 * 4096 + 100)
            .unwrap();
        match tier.read(2) {
            Err(TierError::Damaged {
                sample: 2,
                damage:
                    Damage::Short {
                        got_bytes: 100,
                        want_bytes: 7000,
                    },
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(tier.entries(), vec![0, 1]);
        drop(tier);
        // Cut again, inside sample 1 this time, with the index still naming it.
        let dir_of = dir.path().join(format!("{FP:016x}"));
        fs::OpenOptions::new()
            .write(true)
            .open(segment(&dir_of, 0))
            .unwrap()
            .set_len(2 * 4096 + 10)
            .unwrap();
        let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), 1 << 20, options).unwrap();
        assert_eq!(
            tier.index_status(),
            &IndexStatus::Loaded {
                kept: 1,
                dropped: 1
            }
        );
        assert_eq!(tier.entries(), vec![0]);
        assert_eq!(&tier.read(0).unwrap()[..], &bytes_of(0, 5000)[..]);
        // The dropped one's room is free again.
        tier.write(1, &bytes_of(1, 6000)).unwrap();
        assert_eq!(&tier.read(1).unwrap()[..], &bytes_of(1, 6000)[..]);
    }
}

/// Writes and persists three entries, then returns the tier's directory.
fn persisted(root: &Path, fp: u64, sizes: &Arc<[u32]>, capacity: u64) -> PathBuf {
    let tier = DiskTier::open(root, fp, sizes.clone(), capacity).unwrap();
    for s in 0..3u32 {
        tier.write(s, &bytes_of(s, sizes[s as usize])).unwrap();
    }
    tier.persist().unwrap();
    tier.dir().to_path_buf()
}

/// Opens the tier over a damaged index: it must start empty and reuse all its room.
fn assert_empty_and_usable(tier: &DiskTier, sizes: &Arc<[u32]>) {
    assert!(tier.entries().is_empty(), "{:?}", tier.entries());
    assert_eq!(tier.used_bytes(), 0);
    let mut s = 0u32;
    while (s as usize) < sizes.len() && tier.write(s, &bytes_of(s, sizes[s as usize])).is_ok() {
        s += 1;
    }
    assert!(tier.used_bytes() <= tier.capacity_bytes());
    if (s as usize) < sizes.len() {
        // Full with one size: less than an extent free, plus each segment's tail (under
        // an extent each).
        let extent = extent_bytes(sizes[s as usize]);
        assert!(tier.used_bytes() + (1 + SEGMENTS_MAX) * extent > tier.capacity_bytes());
    }
    for t in 0..s {
        assert_eq!(
            &tier.read(t).unwrap()[..],
            &bytes_of(t, sizes[t as usize])[..]
        );
    }
}

#[test]
fn a_garbage_or_truncated_index_is_ignored_and_the_tier_starts_empty() {
    let sizes: Arc<[u32]> = vec![4096; 64].into();
    let cap = 40 * 4096;
    let root = tempfile::tempdir().unwrap();
    let tier_dir = persisted(root.path(), FP, &sizes, cap);
    let index = tier_dir.join("index");
    let good = fs::read(&index).unwrap();
    let mut flipped = good.clone();
    flipped[60] ^= 1;
    let too_long = vec![0u8; 10 << 20];
    let cases: [(&str, &[u8]); 5] = [
        ("empty", &[]),
        ("cut", &good[..good.len() - 1]),
        ("flipped", &flipped),
        (
            "garbage",
            b"this is not an index at all, but it is long enough to hold a header",
        ),
        ("too long", &too_long),
    ];
    for (name, bytes) in cases {
        fs::write(&index, bytes).unwrap();
        let tier = DiskTier::open(root.path(), FP, sizes.clone(), cap).unwrap();
        match tier.index_status() {
            IndexStatus::Ignored { .. } => {}
            other => panic!("{name}: {other:?}"),
        }
        assert_empty_and_usable(&tier, &sizes);
        drop(tier);
    }
    // Not a file at all.
    fs::remove_file(&index).unwrap();
    fs::create_dir(&index).unwrap();
    let tier = DiskTier::open(root.path(), FP, sizes.clone(), cap).unwrap();
    assert!(matches!(
        tier.index_status(),
        IndexStatus::Unreadable { .. }
    ));
    assert!(tier.entries().is_empty());
    // Its persist fails naming the index; the directory stays.
    match tier.persist() {
        Err(TierError::Io { path, .. }) => assert_eq!(path, index),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_index_of_another_fingerprint_or_capacity_is_ignored() {
    let sizes: Arc<[u32]> = vec![5000; 32].into();
    let root = tempfile::tempdir().unwrap();
    let a = persisted(root.path(), FP, &sizes, 1 << 20);
    // Another dataset's index copied into this one's directory.
    let b = DiskTier::open(root.path(), FP + 1, sizes.clone(), 1 << 20)
        .unwrap()
        .dir()
        .to_path_buf();
    assert_ne!(a, b);
    fs::copy(a.join("index"), b.join("index")).unwrap();
    let tier = DiskTier::open(root.path(), FP + 1, sizes.clone(), 1 << 20).unwrap();
    assert!(matches!(
        tier.index_status(),
        IndexStatus::Ignored {
            reason: IndexError::Foreign {
                field: "fingerprint",
                ..
            }
        }
    ));
    assert_empty_and_usable(&tier, &sizes);
    drop(tier);
    // The same dataset with a smaller capacity: ignored, and its files cut to the new bound.
    let small = 5 * 4096;
    let tier = DiskTier::open(root.path(), FP, sizes.clone(), small).unwrap();
    assert!(matches!(
        tier.index_status(),
        IndexStatus::Ignored {
            reason: IndexError::Foreign {
                field: "capacity_bytes",
                ..
            }
        }
    ));
    assert!(segment_bytes_on_disk(&a) <= small);
    assert!(!segment(&a, SEGMENTS_MAX - 1).exists());
    assert_empty_and_usable(&tier, &sizes);
    drop(tier);
    // Another size table (same count, another size).
    let other: Arc<[u32]> = vec![5001; 32].into();
    let tier = DiskTier::open(root.path(), FP, other.clone(), small).unwrap();
    assert!(matches!(
        tier.index_status(),
        IndexStatus::Ignored {
            reason: IndexError::Entry { .. }
        }
    ));
    assert_empty_and_usable(&tier, &other);
}

#[test]
fn without_o_direct_the_tier_falls_back_to_buffered_io() {
    let dir = tempfile::tempdir().unwrap();
    let sizes: Arc<[u32]> = vec![1, 4096, 4097, 70_000].into();
    let options = TierOptions {
        allow_direct: false,
    };
    let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), 1 << 20, options).unwrap();
    assert!(!tier.direct());
    for s in 0..4u32 {
        tier.write(s, &bytes_of(s, sizes[s as usize])).unwrap();
        assert_eq!(
            &tier.read(s).unwrap()[..],
            &bytes_of(s, sizes[s as usize])[..]
        );
    }
    // Buffered writes hold the sample's bytes, not its whole extent.
    assert_eq!(
        fs::metadata(segment(tier.dir(), 0)).unwrap().len(),
        4 * 4096 + 70_000
    );
    drop(tier);
    // Where the probe finds O_DIRECT, it is used by default.
    let tier = DiskTier::open(dir.path(), FP, sizes.clone(), 1 << 20).unwrap();
    eprintln!("O_DIRECT in {}: {}", dir.path().display(), tier.direct());
    assert!(!tier.dir().join("probe").exists());
    for s in 0..4u32 {
        assert_eq!(
            &tier.read(s).unwrap()[..],
            &bytes_of(s, sizes[s as usize])[..]
        );
    }
}

#[test]
fn a_second_open_of_the_same_directory_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    let sizes: Arc<[u32]> = vec![10; 4].into();
    let tier = DiskTier::open(dir.path(), FP, sizes.clone(), 1 << 20).unwrap();
    tier.write(1, &bytes_of(1, 10)).unwrap();
    match DiskTier::open(dir.path(), FP, sizes.clone(), 1 << 20) {
        Err(TierError::Busy { dir: d }) => {
            assert_eq!(d, tier.dir());
            let shown = TierError::Busy { dir: d }.to_string();
            assert!(shown.contains(&format!("{FP:016x}")), "{shown}");
        }
        other => panic!("{other:?}"),
    }
    // Another dataset in the same root is not.
    drop(DiskTier::open(dir.path(), FP + 1, sizes.clone(), 1 << 20).unwrap());
    // The refused open touched nothing.
    assert_eq!(&tier.read(1).unwrap()[..], &bytes_of(1, 10)[..]);
    drop(tier);
    let tier = DiskTier::open(dir.path(), FP, sizes, 1 << 20).unwrap();
    assert_eq!(tier.entries(), vec![1]);
}

/// Writers, readers and removers on shared samples at once: a read returns the sample's
/// bytes or says it has no entry (or one being written), never damage, since an extent is
/// not reused under an I/O; at the end the tier's accounting is its entries'.
#[test]
fn threads_read_write_and_remove_at_once() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    for options in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = random_sizes(&mut rng, 64, 20_000);
        // Room for about half the samples: writes meet Full too.
        let cap = sizes.iter().map(|&z| extent_bytes(z)).sum::<u64>() / 2;
        let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), cap, options).unwrap();
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let (tier, sizes) = (&tier, &sizes);
                scope.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t);
                    for _ in 0..1_500 {
                        let s = rng.gen_range(0..64u32);
                        let want = bytes_of(s, sizes[s as usize]);
                        match rng.gen_range(0..10) {
                            0..=2 => match tier.write(s, &want) {
                                Ok(()) | Err(TierError::Exists { .. } | TierError::Full { .. }) => {
                                }
                                Err(e) => panic!("{e}"),
                            },
                            3 => {
                                tier.remove(s);
                            }
                            _ => match tier.read(s) {
                                Ok(b) => assert_eq!(&b[..], &want[..], "sample {s}"),
                                Err(TierError::Missing { .. } | TierError::Pending { .. }) => {}
                                Err(e) => panic!("{e}"),
                            },
                        }
                        assert!(tier.used_bytes() <= tier.capacity_bytes());
                    }
                });
            }
        });
        let entries = tier.entries();
        let held: u64 = entries
            .iter()
            .map(|&s| extent_bytes(sizes[s as usize]))
            .sum();
        assert_eq!(tier.used_bytes(), held);
        for &s in &entries {
            assert_eq!(
                &tier.read(s).unwrap()[..],
                &bytes_of(s, sizes[s as usize])[..]
            );
        }
        let st = tier.stats();
        assert_eq!(st.damaged + st.io_errors, 0);
        assert!(st.writes > 0 && st.reads > 0 && st.removes > 0, "{st:?}");
        // What is left persists and reopens whole.
        drop(tier);
        let tier = DiskTier::open_with(dir.path(), FP, sizes.clone(), cap, options).unwrap();
        assert_eq!(tier.entries(), entries);
        assert_eq!(tier.used_bytes(), held);
    }
}
