//! The disk cache below the memory cache (`LoaderBuilder::disk_cache`): the batches are those
//! of a run without it; with memory for 10% of the dataset and a disk for 40%, each epoch
//! after the first reads from storage at most 1.1 times the floor F - memory - disk; a second
//! run over the same directory starts with the first's entries and reads that much less in
//! its first epoch; a damaged entry is read from storage instead, counted; the tier never
//! holds more than its capacity; what it cannot go with is refused, named.

use std::path::Path;
use std::sync::Arc;

use lobster_io::net::{InProcessNodes, Transport};
use lobster_io::{
    Batch, CachePolicy, Dataset, DiskCacheMetrics, Error, FormChoice, LoaderBuilder, RunMetrics,
};

const SAMPLES: u32 = 360;

/// Sample `i` of `blocks(i)` 4 KiB blocks, beginning with its id.
fn content(i: u32, blocks: u32) -> Vec<u8> {
    let len = blocks as usize * 4096;
    let mut v = format!("sample {i};").into_bytes();
    v.extend((v.len()..len).map(|k| (k as u32 ^ i.wrapping_mul(31)) as u8));
    v
}

/// Samples of whole 4 KiB blocks, so that the tier's rounding costs nothing: all of 32 KiB
/// (`varied` false), or of 24 to 40 KiB.
fn dataset(dir: &Path, varied: bool) -> Arc<Dataset> {
    let blocks = move |i: u32| if varied { 6 + (i * 7) % 5 } else { 8 };
    lobster_testkit::data::write_image_folder(dir, SAMPLES, 4, |i| content(i, blocks(i)));
    Arc::new(Dataset::open_image_folder(dir).unwrap())
}

/// One batch as the checks compare it: epoch, iteration, ids, the CRC32 of the bytes.
type Seen = (u32, u32, Vec<u32>, u32);

fn seen(b: &Batch<Vec<u8>>) -> Seen {
    let mut h = crc32fast::Hasher::new();
    for s in &b.samples {
        h.update(&s.value);
    }
    (
        b.epoch,
        b.iteration,
        b.samples.iter().map(|s| s.id).collect(),
        h.finalize(),
    )
}

const EPOCHS: u32 = 4;

fn builder(ds: &Arc<Dataset>, memory_bytes: u64, pipelined: bool) -> LoaderBuilder<Vec<u8>> {
    let b = LoaderBuilder::<Vec<u8>>::new(ds.clone())
        .world(1, 2, 0)
        .batch_size(6)
        .epochs(EPOCHS)
        .seed(5)
        .decode_threads(2)
        .cache(CachePolicy::Reuse, memory_bytes)
        .decode(|bytes: &[u8], _| Ok::<_, std::io::Error>(bytes.to_vec()));
    if pipelined {
        b
    } else {
        b.execution(lobster_io::Execution::ReadThenDecode)
    }
}

/// Runs the loader to the end: every rank's batches, and the run's metrics.
fn run(b: LoaderBuilder<Vec<u8>>) -> (Vec<Vec<Seen>>, RunMetrics) {
    let mut loader = b.build().unwrap();
    let ranks = lobster_testkit::loader::run_ranks(&mut loader);
    let seen = ranks
        .iter()
        .map(|r| r.iter().map(|b| seen(b.as_ref().unwrap())).collect())
        .collect();
    (seen, loader.metrics())
}

fn disk(m: &RunMetrics) -> &DiskCacheMetrics {
    m.disk_cache.as_ref().expect("a disk cache")
}

/// What every run with a disk cache must show: within capacity, every planned disk hit
/// read from the disk or, counted, from storage.
fn check_disk(m: &DiskCacheMetrics) {
    assert!(m.used_bytes <= m.capacity_bytes, "{m:?}");
    assert_eq!(m.hits + m.fallbacks, m.planned_hits, "{m:?}");
    assert_eq!(m.io_errors + m.writes_skipped, 0, "{m:?}");
}

struct Sizes {
    dataset_bytes: u64,
    memory_bytes: u64,
    disk_bytes: u64,
}

fn sizes(ds: &Dataset) -> Sizes {
    let f = ds.total_bytes();
    Sizes {
        dataset_bytes: f,
        memory_bytes: f / 10,
        disk_bytes: f * 4 / 10,
    }
}

/// Samples of one size: the tier's first fit then never leaves a hole a sample cannot use,
/// so the disk holds all the plan budgets and the bound is the plan's. (With sizes that
/// vary, a write may find no hole large enough: counted as `full`, and that entry's planned
/// hits read storage; `a_damaged_entry_...` runs such a set.)
#[test]
fn a_disk_below_memory_keeps_the_batches_reads_near_the_floor_and_is_reused() {
    for pipelined in [true, false] {
        let data = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let ds = dataset(data.path(), false);
        let z = sizes(&ds);
        let (plain, plain_m) = run(builder(&ds, z.memory_bytes, pipelined));
        let with_disk =
            || builder(&ds, z.memory_bytes, pipelined).disk_cache(cache.path(), z.disk_bytes);

        let (first, m1) = run(with_disk());
        assert_eq!(
            first, plain,
            "pipelined {pipelined}: batches with the disk cache"
        );
        let d1 = disk(&m1);
        check_disk(d1);
        assert_eq!(d1.seeds, 0);
        assert!(d1.hits > 0 && d1.writes > 0, "{d1:?}");
        // One size: every write finds room, every planned hit reads the disk.
        assert_eq!((d1.full, d1.fallbacks), (0, 0), "{d1:?}");
        // Memory hits are the memory-only plan's: the disk takes only what memory cannot.
        assert_eq!(m1.hits, plain_m.hits, "pipelined {pipelined}");
        let floor = z.dataset_bytes - z.memory_bytes - z.disk_bytes;
        let by_epoch = &m1.storage_bytes_by_epoch;
        assert_eq!(by_epoch.len(), EPOCHS as usize);
        assert_eq!(
            by_epoch[0], z.dataset_bytes,
            "a cold first epoch reads everything"
        );
        for (e, &bytes) in by_epoch.iter().enumerate().skip(1) {
            assert!(
                bytes as f64 <= 1.1 * floor as f64,
                "pipelined {pipelined}: epoch {e} read {bytes} bytes, floor {floor} \
                 (F {}, memory {}, disk {}); {d1:?}",
                z.dataset_bytes,
                z.memory_bytes,
                z.disk_bytes
            );
        }

        // The same dataset again: the first run's entries are the plan's seeds.
        let (second, m2) = run(with_disk());
        assert_eq!(
            second, plain,
            "pipelined {pipelined}: batches of a reusing run"
        );
        let d2 = disk(&m2);
        check_disk(d2);
        assert_eq!(d2.seeds, d1.entries, "the entries the first run left");
        assert!(d2.seed_bytes > 0 && d2.planned_seed_hits > 0, "{d2:?}");
        let saved = m1.storage_bytes_by_epoch[0] - m2.storage_bytes_by_epoch[0];
        assert!(
            saved as f64 >= 0.9 * d2.seed_bytes as f64 && saved <= d2.seed_bytes,
            "pipelined {pipelined}: epoch 0 read {saved} bytes less with {} bytes found; {d2:?}",
            d2.seed_bytes
        );
    }
}

#[test]
fn a_damaged_entry_is_read_from_storage_and_counted() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let ds = dataset(data.path(), true);
    let z = sizes(&ds);
    let with_disk = || builder(&ds, z.memory_bytes, true).disk_cache(cache.path(), z.disk_bytes);
    let (first, m1) = run(with_disk());
    let tier_dir = std::path::PathBuf::from(&disk(&m1).dir);

    let fingerprint =
        u64::from_str_radix(tier_dir.file_name().unwrap().to_str().unwrap(), 16).unwrap();
    let sizes: Arc<[u32]> = ds.samples().iter().map(|s| s.size_bytes as u32).collect();
    // The first entry the next run accesses, in the node stream's order (epoch, iteration,
    // rank, position): kept by its plan (seeds go nearest first use first) and read from
    // the disk before any other.
    let sample = {
        let tier =
            lobster_tier::DiskTier::open(cache.path(), fingerprint, sizes, z.disk_bytes).unwrap();
        let iterations = first[0].len();
        (0..iterations)
            .flat_map(|it| {
                first
                    .iter()
                    .flat_map(move |rank| rank[it].2.iter().copied())
            })
            .find(|&s| tier.contains(s))
            .expect("the first run left entries")
    };
    // Flip a byte of every block that starts with the sample's bytes (its entry, and any
    // copy left in a freed extent).
    let head = std::fs::read(&ds.samples()[sample as usize].path).unwrap()[..64].to_vec();
    let mut flipped = 0;
    for entry in std::fs::read_dir(&tier_dir).unwrap() {
        let path = entry.unwrap().path();
        if !path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("seg-")
        {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        for block in bytes.chunks_mut(4096) {
            if block.starts_with(&head) {
                block[100] ^= 0x40;
                flipped += 1;
            }
        }
        std::fs::write(&path, bytes).unwrap();
    }
    assert!(flipped >= 1);

    let (second, m2) = run(with_disk());
    assert_eq!(second, first, "the batches are unchanged");
    let d2 = disk(&m2);
    check_disk(d2);
    assert_eq!(d2.damaged, 1, "{d2:?}");
    assert!(d2.fallbacks >= 1, "{d2:?}");
}

#[test]
fn the_disk_cache_refuses_what_it_cannot_go_with_naming_both() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let ds = dataset(data.path(), false);
    let refused = |b: LoaderBuilder<Vec<u8>>, parameter: &str, mentions: &str| match b.build() {
        Err(e @ Error::InvalidParameter { .. }) => {
            let Error::InvalidParameter { parameter: p, .. } = &e else {
                unreachable!()
            };
            assert_eq!(*p, parameter, "{e}");
            assert!(e.to_string().contains(mentions), "{e}");
        }
        Err(e) => panic!("expected InvalidParameter {parameter}, got {e}"),
        Ok(_) => panic!("expected InvalidParameter {parameter}, got a loader"),
    };
    let b = || builder(&ds, 1 << 20, true).disk_cache(cache.path(), 1 << 20);

    let nodes = InProcessNodes::connect(2);
    refused(
        b().world(2, 2, 0)
            .peers(nodes[0].clone() as Arc<dyn Transport>),
        "disk_cache",
        "peers",
    );
    refused(
        b().cache_forms(FormChoice::Decoded),
        "disk_cache",
        "cache_forms",
    );
    refused(b().cache(CachePolicy::Lru, 1 << 20), "disk_cache", "lru");
    refused(
        builder(&ds, 1 << 20, true).disk_cache(cache.path(), 100),
        "disk_cache_bytes",
        "4096",
    );
    // A directory that cannot be made: a path under a regular file.
    let file = cache.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    refused(
        builder(&ds, 1 << 20, true).disk_cache(file.join("tier"), 1 << 20),
        "disk_cache",
        "a-file",
    );
}
