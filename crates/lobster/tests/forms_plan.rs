//! The two-form plan (issue 27): which samples the cache keeps decoded is a pure function of
//! the inputs, not of how fast the machine decoded at build; and a second open of a dataset
//! with the decoded tier reads no image, its headers kept in the dataset's table or indexes.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lobster_io::{CachePolicy, Dataset, FormChoice, LoaderBuilder, RunMetrics, StorageEmulation};
use lobster_testkit::data::ustar;

/// A noisy RGB JPEG of `w` x `h` (noise keeps the encoded size near the decoded one's
/// share a real photo has).
fn jpeg(w: u16, h: u16, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut rgb = Vec::with_capacity(usize::from(w) * usize::from(h) * 3);
    for _ in 0..usize::from(w) * usize::from(h) * 3 {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        rgb.push((state >> 24) as u8);
    }
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 90)
        .encode(&rgb, w, h, jpeg_encoder::ColorType::Rgb)
        .unwrap();
    out
}

/// 24 JPEGs of different sizes in 3 classes under `root`, its directories an hour old (so
/// that a table kept of it is trusted).
fn folder(root: &Path) {
    for i in 0..24u16 {
        let class = root.join(format!("c{}", i % 3));
        std::fs::create_dir_all(&class).unwrap();
        let bytes = jpeg(24 + 4 * i, 20 + 3 * i, u32::from(i));
        std::fs::write(class.join(format!("{i:02}.jpg")), bytes).unwrap();
    }
    age(root);
}

fn age(root: &Path) {
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                std::fs::File::options()
                    .write(true)
                    .open(&p)
                    .unwrap()
                    .set_modified(hour_ago)
                    .unwrap();
            }
        }
        std::fs::File::open(&d)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
    }
    // Change times cannot be set back: older than the racy window, so that a table or an
    // index is kept, only by waiting.
    std::thread::sleep(Duration::from_millis(2100));
}

/// [`folder`] under `dir`, opened without a table.
fn untabled(dir: &Path) -> Arc<Dataset> {
    let root = dir.join("data");
    folder(&root);
    let options = lobster_io::FolderOptions {
        table_dir: None,
        ..Default::default()
    };
    Arc::new(Dataset::open_folder(&root, &options).unwrap())
}

/// The decoded images' bytes: each (24 + 4i) x (20 + 3i) x 3.
fn decoded_bytes() -> u64 {
    (0..24u64).map(|i| (24 + 4 * i) * (20 + 3 * i) * 3).sum()
}

/// A loader over `ds` with the decoded tier on (`forms`) in a cache of `capacity_bytes`,
/// decoding with the built-in decoder behind a user's first stage; `slow` makes that stage
/// sleep 200 ms per image while it is set.
fn builder(
    ds: &Arc<Dataset>,
    forms: FormChoice,
    capacity_bytes: u64,
    slow: &Arc<AtomicBool>,
) -> LoaderBuilder<u64> {
    let slow = slow.clone();
    LoaderBuilder::<u64>::new(ds.clone())
        .world(1, 1, 0)
        .batch_size(4)
        .epochs(3)
        .seed(11)
        .decode_threads(2)
        .cache(CachePolicy::Reuse, capacity_bytes)
        .cache_forms(forms)
        .storage_emulation(Some(StorageEmulation {
            bandwidth_bytes_per_s: 200e6,
            latency_us: 30_000,
        }))
        .decode_in_two_stages(
            move |bytes: &[u8], _: &lobster_io::SampleMeta| {
                if slow.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                lobster_io::images::decode(bytes)
            },
            |image: lobster_io::images::ImageRef<'_>, _: &lobster_io::SampleMeta, _: u32| {
                Ok::<_, lobster_io::images::ImageError>(
                    image.pixels().iter().map(|&p| u64::from(p)).sum(),
                )
            },
        )
}

/// Runs every batch of `loader`, checking each, and returns its metrics.
fn drain(mut loader: lobster_io::Loader<u64>) -> RunMetrics {
    let rank = loader.ranks().unwrap().remove(0);
    for batch in rank {
        batch.unwrap();
    }
    loader.metrics()
}

/// What the plan decided, and the costs it priced with.
fn plan(m: &RunMetrics) -> (u64, u64, u64, u64) {
    (
        m.hits_encoded,
        m.hits_decoded,
        m.peak_cached_encoded_bytes,
        m.peak_cached_decoded_bytes,
    )
}

#[test]
fn the_plan_does_not_depend_on_how_fast_the_decoder_ran_at_build() {
    let dir = tempfile::tempdir().unwrap();
    let ds = untabled(dir.path());
    let slow = Arc::new(AtomicBool::new(false));
    for capacity in [decoded_bytes() / 4, decoded_bytes() / 2] {
        // The first build with a decoder slowed down (as by a loaded machine), the second not.
        slow.store(true, Ordering::Relaxed);
        let first = builder(&ds, FormChoice::Auto, capacity, &slow)
            .build()
            .unwrap();
        slow.store(false, Ordering::Relaxed);
        let first = drain(first);
        let second = drain(
            builder(&ds, FormChoice::Auto, capacity, &slow)
                .build()
                .unwrap(),
        );
        assert_eq!(plan(&first), plan(&second), "capacity {capacity}");
        assert_eq!(first.form_costs, second.form_costs, "capacity {capacity}");
        assert_eq!(first.hits_encoded + first.hits_decoded, first.hits);
        let costs = first.form_costs.unwrap();
        assert_eq!(
            (costs.read_source, costs.decode_source),
            ("emulation", "model"),
            "{costs:?}"
        );
        // Every sample has a header: the model saw all their pixels.
        let pixels: u64 = (0..24u64).map(|i| (24 + 4 * i) * (20 + 3 * i)).sum();
        assert_eq!(costs.model_pixels, pixels);
        assert_eq!(costs.model_encoded_bytes, ds.total_bytes());
    }
}

/// `path` renamed away while `f` runs, then put back.
fn without<R>(path: &Path, f: impl FnOnce() -> R) -> R {
    let away = path.with_extension("away");
    std::fs::rename(path, &away).unwrap();
    let out = f();
    std::fs::rename(&away, path).unwrap();
    out
}

#[test]
fn a_second_open_of_a_folder_with_the_decoded_tier_reads_no_image() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
    folder(&root);
    let options = lobster_io::FolderOptions {
        table_dir: Some(tables),
        ..Default::default()
    };
    let slow = Arc::new(AtomicBool::new(false));
    let capacity = decoded_bytes() / 2;
    // The first open scans and probes every header (and keeps them with the table).
    let first = Arc::new(Dataset::open_folder(&root, &options).unwrap());
    let first = drain(
        builder(&first, FormChoice::Decoded, capacity, &slow)
            .build()
            .unwrap(),
    );
    assert!(first.hits_decoded > 0, "{first:?}");
    // The second opens from the table; its loader is built with every image away, so that
    // reading one would find nothing (and size the sample 0: never decoded in the cache).
    let second = Arc::new(Dataset::open_folder(&root, &options).unwrap());
    assert!(second.table().is_some(), "the second open reads the table");
    let classes: Vec<_> = (0..3).map(|c| root.join(format!("c{c}"))).collect();
    let built = without(&classes[0], || {
        without(&classes[1], || {
            without(&classes[2], || {
                builder(&second, FormChoice::Decoded, capacity, &slow).build()
            })
        })
    })
    .unwrap();
    assert_eq!(plan(&drain(built)), plan(&first));
}

#[test]
fn a_second_open_of_shards_with_the_decoded_tier_reads_no_image() {
    let dir = tempfile::tempdir().unwrap();
    let (shards, indexes) = (dir.path().join("shards"), dir.path().join("indexes"));
    std::fs::create_dir_all(&shards).unwrap();
    for s in 0..2u16 {
        let mut members = Vec::new();
        for i in s * 12..s * 12 + 12 {
            let key = format!("k{i:02}");
            members.push((
                format!("{key}.jpg"),
                jpeg(24 + 4 * i, 20 + 3 * i, u32::from(i)),
            ));
            members.push((format!("{key}.cls"), (i % 3).to_string().into_bytes()));
        }
        std::fs::write(
            shards.join(format!("s{s}.tar")),
            ustar(
                &members
                    .iter()
                    .map(|(n, b)| (n.as_str(), b.as_slice()))
                    .collect::<Vec<_>>(),
            ),
        )
        .unwrap();
    }
    age(&shards);
    let spec = shards.to_str().unwrap();
    let slow = Arc::new(AtomicBool::new(false));
    let capacity = decoded_bytes() / 2;
    let first = Arc::new(Dataset::open_shards_indexed(spec, Some(&indexes)).unwrap());
    let first = drain(
        builder(&first, FormChoice::Decoded, capacity, &slow)
            .build()
            .unwrap(),
    );
    assert!(first.hits_decoded > 0, "{first:?}");
    let second = Arc::new(Dataset::open_shards_indexed(spec, Some(&indexes)).unwrap());
    let tars: Vec<_> = (0..2).map(|s| shards.join(format!("s{s}.tar"))).collect();
    let built = without(&tars[0], || {
        without(&tars[1], || {
            builder(&second, FormChoice::Decoded, capacity, &slow).build()
        })
    })
    .unwrap();
    assert_eq!(plan(&drain(built)), plan(&first));
}

#[test]
fn an_image_larger_than_its_kept_header_says_is_not_kept_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tables) = (dir.path().join("data"), dir.path().join("tables"));
    folder(&root);
    // Sample 0 padded to the size of a far larger image that will replace it in place.
    let first_file = root.join("c0/00.jpg");
    let larger = jpeg(120, 100, 99);
    let mut small = std::fs::read(&first_file).unwrap();
    assert!(small.len() < larger.len());
    small.resize(larger.len(), 0);
    std::fs::write(&first_file, &small).unwrap();
    age(&root);
    let options = lobster_io::FolderOptions {
        table_dir: Some(tables),
        ..Default::default()
    };
    let slow = Arc::new(AtomicBool::new(false));
    let run = || {
        let ds = Arc::new(Dataset::open_folder(&root, &options).unwrap());
        let m = drain(
            builder(&ds, FormChoice::Decoded, decoded_bytes(), &slow)
                .build()
                .unwrap(),
        );
        (ds.table().is_some(), m)
    };
    let (_, before) = run();
    assert_eq!(before.decoded_again, 0, "{before:?}");
    // Rewritten in place, same size: its directory does not change, the table stays valid
    // with the old header's size, and the decoded image is larger than planned.
    std::fs::write(&first_file, &larger).unwrap();
    let (from_table, after) = run();
    assert!(from_table);
    assert_eq!(plan(&after), plan(&before));
    assert!(after.images_kept < before.images_kept, "{after:?}");
    assert!(after.decoded_again > 0, "{after:?}");
}

#[test]
fn images_kept_smaller_price_the_scaled_decode_a_hit_saves() {
    let dir = tempfile::tempdir().unwrap();
    let ds = untabled(dir.path());
    let slow = Arc::new(AtomicBool::new(false));
    let decode_per_byte_s = |side: Option<u32>| {
        let mut b = builder(&ds, FormChoice::Auto, decoded_bytes() / 2, &slow);
        if let Some(side) = side {
            b = b.decoded_max_side(side);
        }
        let m = drain(b.build().unwrap());
        let costs = m.form_costs.unwrap();
        assert_eq!(costs.decode_source, "model", "{costs:?}");
        costs.costs.decode_per_byte_s
    };
    let full = decode_per_byte_s(None);
    // Larger than every image: decoded at full scale, priced so.
    assert_eq!(decode_per_byte_s(Some(200)), full);
    // 16 px a side: the larger images at 1/2 or 1/4 (the smallest, under 32 px, at 1/1),
    // priced at those scales' shares of a full decode (0.7 to 0.9), never at their pixels'.
    let small = decode_per_byte_s(Some(16));
    assert!(small < full && small > 0.7 * full, "{small} against {full}");
}
