//! Checkpoint and resume, in the style of torchdata's StatefulDataLoader tests: a loader
//! stopped after `k` batches per rank saves its state, a new loader resumes from it, and the
//! batches it gives are the uninterrupted run's from `k` on, bit for bit (ids, labels, and the
//! pixels' CRC with augmentation and the decoded tier on). Elastic resumes (8 ranks to 4, 4 to
//! 8) take every sample of the interrupted epoch once, beyond the sampler's padding.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use lobster_io::image::Transform;
use lobster_io::images::Pixels;
use lobster_io::{
    Batch, CachePolicy, Dataset, DistributedSampler, EpochOrder, Error, FormChoice, Loader,
    LoaderBuilder, LoaderState,
};

/// One batch as a resume must reproduce it: epoch, iteration, ids, labels, CRC of values.
type Seen = (u32, u32, Vec<u32>, Vec<u32>, u32);

fn seen<T: AsRef<[u8]>>(b: &Batch<T>) -> Seen {
    let mut crc = crc32(0, &[]);
    for s in &b.samples {
        crc = crc32(crc, s.value.as_ref());
    }
    (
        b.epoch,
        b.iteration,
        b.samples.iter().map(|s| s.id).collect(),
        b.samples.iter().map(|s| s.label).collect(),
        crc,
    )
}

/// CRC-32 (IEEE), bitwise: the test's own, so it checks the loader's bytes independently.
fn crc32(crc: u32, bytes: &[u8]) -> u32 {
    let mut c = !crc;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A folder of 4 classes x 10 JPEGs of different sizes, so that crops and flips differ.
fn jpegs(dir: &Path) -> Arc<Dataset> {
    for i in 0..40u16 {
        let class = dir.join(format!("c{}", i % 4));
        std::fs::create_dir_all(&class).unwrap();
        let (w, h) = (24 + i, 18 + (i * 7) % 13);
        let mut rgb = Vec::with_capacity(usize::from(w) * usize::from(h) * 3);
        for y in 0..h {
            for x in 0..w {
                rgb.extend_from_slice(&[(x * 9) as u8, (y * 13) as u8, ((x + y) * 5 + i) as u8]);
            }
        }
        jpeg_encoder::Encoder::new_file(class.join(format!("{i:02}.jpg")), 90)
            .unwrap()
            .encode(&rgb, w, h, jpeg_encoder::ColorType::Rgb)
            .unwrap();
    }
    let options = lobster_io::FolderOptions {
        table_dir: None,
        ..Default::default()
    };
    Arc::new(Dataset::open_folder(dir, &options).unwrap())
}

/// 2 ranks of batch 3 over 40 images, 3 epochs: 7 iterations an epoch, the last of 2.
/// Augmented (random crops and flips seeded by seed, epoch, id); the cache keeps decoded
/// images where that pays, so hits run only the transform.
fn image_loader(ds: &Arc<Dataset>, resume: Option<LoaderState>) -> Result<Loader<Pixels>, Error> {
    let mut b = LoaderBuilder::<Pixels>::new(ds.clone())
        .world(1, 2, 0)
        .batch_size(3)
        .epochs(3)
        .seed(11)
        .decode_threads(2)
        .prefetch_iterations(2)
        .cache(CachePolicy::Reuse, 40 << 10)
        .cache_forms(FormChoice::Decoded)
        .decode_images(Transform::Train { size: 8 });
    if let Some(state) = resume {
        b = b.resume_from(state);
    }
    b.build()
}

/// Takes `k` batches on every rank (each on its own thread), then every rank's rest if
/// `rest`; returns what each rank saw.
fn take<T: AsRef<[u8]> + Send>(loader: &mut Loader<T>, k: Option<usize>) -> Vec<Vec<Seen>> {
    let handles = loader.ranks().unwrap();
    std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .into_iter()
            .map(|h| {
                s.spawn(move || {
                    h.take(k.unwrap_or(usize::MAX))
                        .map(|b| seen(&b.unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// Each rank's batches from `from` on.
fn after(run: &[Vec<Seen>], from: usize) -> Vec<Vec<Seen>> {
    run.iter()
        .map(|r| r[from.min(r.len())..].to_vec())
        .collect()
}

#[test]
fn a_resumed_loader_gives_the_uninterrupted_runs_batches_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let ds = jpegs(dir.path());
    let mut whole = image_loader(&ds, None).unwrap();
    assert_eq!(whole.iterations_per_epoch(), 7);
    let full = take(&mut whole, None);
    assert_eq!(full[0].len(), 21);
    let decoded_hits = whole.metrics().decoded_hits_served;
    assert!(
        decoded_hits > 0,
        "the decoded tier must serve hits, or it is not tested"
    );
    drop(whole);
    // 0, 1, mid-epoch, the last iteration of epoch 0, the first of epoch 1, the last of the
    // run, and after it.
    for k in [0, 1, 3, 6, 7, 13, 20, 21] {
        let mut first = image_loader(&ds, None).unwrap();
        let before = take(&mut first, Some(k));
        assert_eq!(
            before,
            full.iter().map(|r| r[..k].to_vec()).collect::<Vec<_>>()
        );
        let state = first.state();
        drop(first);
        // Through its JSON, as a job saves it.
        let state = LoaderState::from_json(&state.to_json()).unwrap();
        let mut resumed = image_loader(&ds, Some(state)).unwrap();
        assert_eq!(resumed.steps(), 21 - k as u64, "after {k}");
        let rest = take(&mut resumed, None);
        assert_eq!(rest, after(&full, k), "resumed after {k} batches");
        // Nothing delivered twice: the resumed run counts only its own batches.
        assert_eq!(
            resumed.metrics().samples,
            (full[0][k..].iter().chain(&full[1][k..]))
                .map(|b| b.2.len() as u64)
                .sum::<u64>()
        );
    }
}

#[test]
fn two_consecutive_resumes_give_the_same_batches_as_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let ds = jpegs(dir.path());
    let full = take(&mut image_loader(&ds, None).unwrap(), None);
    let mut a = image_loader(&ds, None).unwrap();
    take(&mut a, Some(4));
    let state = a.state();
    drop(a);
    let mut b = image_loader(&ds, Some(state)).unwrap();
    let middle = take(&mut b, Some(5));
    assert_eq!(
        middle,
        full.iter().map(|r| r[4..9].to_vec()).collect::<Vec<_>>()
    );
    let state = b.state();
    assert_eq!(state.ranks[0].epoch, 1);
    assert_eq!(state.ranks[0].iteration, 2);
    drop(b);
    let rest = take(&mut image_loader(&ds, Some(state)).unwrap(), None);
    assert_eq!(rest, after(&full, 9));
}

/// A byte-decoded loader of `ranks` ranks on one node, batch 4, 3 epochs.
fn bytes_loader(
    ds: &Arc<Dataset>,
    ranks: usize,
    resume: Option<LoaderState>,
) -> Result<Loader<Vec<u8>>, Error> {
    let mut b = LoaderBuilder::new(ds.clone())
        .world(1, ranks, 0)
        .batch_size(4)
        .epochs(3)
        .seed(3)
        .decode_threads(ranks)
        .cache(CachePolicy::Reuse, 64 << 10)
        .decode(|bytes: &[u8], _| Ok::<_, std::io::Error>(bytes.to_vec()));
    if let Some(state) = resume {
        b = b.resume_from(state);
    }
    b.build()
}

/// World `from` stops after `k` batches of epoch 1; world `to` resumes. Every sample of epoch 1
/// is taken, none twice beyond the two worlds' padding, and epoch 2 is the new world's own.
fn elastic(from: usize, to: usize, k: usize) {
    let dir = tempfile::tempdir().unwrap();
    let samples = 203u32;
    let ds = common::make_dataset(dir.path(), samples, 3);
    let mut old = bytes_loader(&ds, from, None).unwrap();
    let per_epoch = old.iterations_per_epoch();
    let before = take(&mut old, Some(per_epoch + k));
    let state = old.state();
    drop(old);
    assert_eq!(
        (state.ranks[0].epoch, state.ranks[0].iteration),
        (1, k as u32)
    );
    let mut new = bytes_loader(&ds, to, Some(state)).unwrap();
    let rest = take(&mut new, None);
    let mut count: HashMap<u32, usize> = HashMap::new();
    for batch in before.iter().chain(&rest).flatten() {
        if batch.0 == 1 {
            for &id in &batch.2 {
                *count.entry(id).or_default() += 1;
            }
        }
    }
    assert_eq!(
        count.len(),
        samples as usize,
        "{from}->{to}: every sample of epoch 1"
    );
    let repeats: usize = count.values().map(|c| c - 1).sum();
    let padding = |w: usize| (samples as usize).div_ceil(w) * w - samples as usize;
    assert!(
        repeats <= padding(from) + padding(to),
        "{from}->{to}: {repeats} repeats, padding {} + {}",
        padding(from),
        padding(to)
    );
    // Bytes are each sample's.
    for batch in rest.iter().flatten() {
        assert_eq!(batch.3.len(), batch.2.len());
    }
    // Epoch 2 is the new world's DistributedSampler order.
    let sampler =
        DistributedSampler::new(samples as usize, to, false, EpochOrder::Shuffle { seed: 3 })
            .unwrap();
    for (rank, batches) in rest.iter().enumerate() {
        let got: Vec<u32> = batches
            .iter()
            .filter(|b| b.0 == 2)
            .flat_map(|b| b.2.clone())
            .collect();
        assert_eq!(
            got,
            sampler.rank_indices(2, rank),
            "{from}->{to}: rank {rank}"
        );
    }
    // Every rank of the new world got as many batches in epoch 1 (steps stay in lockstep).
    let counts: Vec<usize> = rest
        .iter()
        .map(|r| r.iter().filter(|b| b.0 == 1).count())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] == w[1]), "{counts:?}");
}

#[test]
fn elastic_resume_from_8_ranks_to_4_takes_every_sample_of_the_epoch_once() {
    elastic(8, 4, 3);
}

#[test]
fn elastic_resume_from_4_ranks_to_8_takes_every_sample_of_the_epoch_once() {
    elastic(4, 8, 5);
}

#[test]
fn a_state_from_another_job_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let ds = common::make_dataset(dir.path(), 50, 2);
    let mut a = bytes_loader(&ds, 2, None).unwrap();
    take(&mut a, Some(2));
    let state = a.state();
    drop(a);
    let refused = |b: LoaderBuilder<Vec<u8>>, field: &str| {
        let err = b.resume_from(state.clone()).build().unwrap_err();
        match &err {
            Error::Resume { field: f, .. } => assert_eq!(*f, field, "{err}"),
            other => panic!("expected a refusal naming {field}, got {other}"),
        }
        assert!(err.to_string().contains(field), "{err}");
    };
    let builder = || {
        LoaderBuilder::new(ds.clone())
            .world(1, 2, 0)
            .batch_size(4)
            .epochs(3)
            .seed(3)
            .decode(|bytes: &[u8], _| Ok::<_, std::io::Error>(bytes.to_vec()))
    };
    refused(builder().seed(4), "order");
    refused(builder().batch_size(5), "batch_size");
    refused(builder().drop_last(true), "drop_last");
    let other = tempfile::tempdir().unwrap();
    let ds2 = common::make_dataset(other.path(), 51, 2);
    let err = LoaderBuilder::new(ds2)
        .world(1, 2, 0)
        .batch_size(4)
        .seed(3)
        .decode(|bytes: &[u8], _| Ok::<_, std::io::Error>(bytes.to_vec()))
        .resume_from(state.clone())
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Resume {
                field: "samples",
                ..
            }
        ),
        "{err}"
    );
    // Same count, one file changed: the dataset's digest differs.
    let third = tempfile::tempdir().unwrap();
    common::make_dataset(third.path(), 50, 2);
    std::fs::write(third.path().join("c0").join("000000.jpg"), b"other bytes").unwrap();
    let ds3 = Arc::new(Dataset::open_image_folder(third.path()).unwrap());
    let err = LoaderBuilder::new(ds3)
        .world(1, 2, 0)
        .batch_size(4)
        .seed(3)
        .decode(|bytes: &[u8], _| Ok::<_, std::io::Error>(bytes.to_vec()))
        .resume_from(state.clone())
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Resume {
                field: "dataset",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn ranks_saved_at_different_batches_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ds = common::make_dataset(dir.path(), 50, 2);
    let mut a = bytes_loader(&ds, 2, None).unwrap();
    let mut handles = a.ranks().unwrap();
    let mut second = handles.pop().unwrap();
    let mut first = handles.pop().unwrap();
    first.next().unwrap().unwrap();
    first.next().unwrap().unwrap();
    second.next().unwrap().unwrap();
    let state = a.state();
    assert_eq!(
        state.ranks.iter().map(|r| r.iteration).collect::<Vec<_>>(),
        vec![2, 1],
        "the state names what each rank was given"
    );
    drop((first, second, a));
    let err = bytes_loader(&ds, 2, Some(state)).unwrap_err();
    assert!(matches!(err, Error::Resume { field: "ranks", .. }), "{err}");
}

#[test]
fn a_damaged_state_file_is_an_error_not_a_fresh_start() {
    let dir = tempfile::tempdir().unwrap();
    let ds = common::make_dataset(dir.path(), 50, 2);
    let mut a = bytes_loader(&ds, 2, None).unwrap();
    take(&mut a, Some(3));
    let json = a.state().to_json();
    for (what, damaged) in [
        ("truncated", json[..json.len() - 5].to_string()),
        ("empty", String::new()),
        (
            "a digit changed",
            json.replacen("\"iteration\": 3", "\"iteration\": 0", 1),
        ),
        ("a field added", json.replacen("{", "{\"extra\": 1,", 1)),
    ] {
        assert_ne!(damaged, json, "{what}: the damage must change the file");
        let err = LoaderState::from_json(&damaged).unwrap_err();
        assert!(
            matches!(err, Error::StateUnreadable { .. }),
            "{what}: {err}"
        );
    }
}
