//! Hostile or broken samples through the facade (issue 27): an image above the pixel bound
//! and a sample that decodes past its byte bound each fail as one bad sample, naming it
//! and its file, and go through `on_error` like any other.

use std::path::Path;
use std::sync::Arc;

use lobster_io::images::Pixels;
use lobster_io::images::Transform;
use lobster_io::{Batch, Dataset, Error, FailureBudget, LoaderBuilder, OnError};

const BATCH: usize = 4;
const SAMPLES: u16 = 12;
/// The one sample larger than the others: 64 x 48 where every other is at most 31 x 24.
const BIG: u16 = 7;

fn open(dir: &Path) -> Arc<Dataset> {
    let options = lobster_io::FolderOptions {
        table_dir: None,
        ..Default::default()
    };
    Arc::new(Dataset::open_folder(dir, &options).unwrap())
}

/// One class of 12 JPEGs; sample [`BIG`] is 64 x 48 (3072 pixels), the others 20 x 16 to
/// 31 x 24 (at most 744).
fn folder(dir: &Path) -> Arc<Dataset> {
    let class = dir.join("c0");
    std::fs::create_dir_all(&class).unwrap();
    for i in 0..SAMPLES {
        let (w, h) = if i == BIG { (64, 48) } else { (20 + i, 16 + i) };
        let rgb: Vec<u8> = (0..u32::from(w) * u32::from(h) * 3)
            .map(|k| (k * 7 + u32::from(i)) as u8)
            .collect();
        jpeg_encoder::Encoder::new_file(class.join(format!("{i:02}.jpg")), 90)
            .unwrap()
            .encode(&rgb, w, h, jpeg_encoder::ColorType::Rgb)
            .unwrap();
    }
    open(dir)
}

/// The id of the file named `name` (ids follow the folder's sorted order).
fn id_of(ds: &Dataset, name: &str) -> u32 {
    ds.samples()
        .iter()
        .find(|s| s.path.file_name().and_then(|n| n.to_str()) == Some(name))
        .unwrap()
        .id
}

/// Every batch of one rank, to the first error (kept).
fn drain<T>(mut loader: lobster_io::Loader<T>) -> (Vec<Batch<T>>, Option<Error>, u64) {
    let rank = loader.ranks().unwrap().remove(0);
    let mut batches = Vec::new();
    let mut error = None;
    for b in rank {
        match b {
            Ok(b) => batches.push(b),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    (batches, error, loader.metrics().skipped)
}

fn images(ds: &Arc<Dataset>, policy: OnError, pixels_max: u64) -> lobster_io::Loader<Pixels> {
    LoaderBuilder::<Pixels>::new(ds.clone())
        .batch_size(BATCH)
        .epochs(2)
        .seed(3)
        .decode_threads(2)
        .on_error(policy)
        .image_pixels_max(pixels_max)
        .decode_images(Transform::Eval { size: 16 })
        .build()
        .unwrap()
}

const SKIP_ONE_AN_EPOCH: OnError = OnError::Skip {
    max_failures: FailureBudget::Count(1),
};

#[test]
fn an_image_above_the_pixel_bound_is_skipped_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let big = id_of(&ds, &format!("{BIG:02}.jpg"));
    // Between the others' largest (744) and the big one's 3072 pixels.
    let (batches, error, skipped) = drain(images(&ds, SKIP_ONE_AN_EPOCH, 1000));
    assert!(error.is_none(), "{error:?}");
    assert_eq!(batches.len(), 2 * usize::from(SAMPLES) / BATCH);
    for b in &batches {
        assert!(b.samples.iter().all(|s| s.id != big));
        let planned = b.samples.len() + b.skipped.len();
        assert_eq!(planned, BATCH);
    }
    let skipped_ids: Vec<u32> = batches.iter().flat_map(|b| b.skipped.clone()).collect();
    assert_eq!(skipped_ids, [big, big], "once an epoch");
    assert_eq!(skipped, 2);
    // The default bound lets the same image through.
    let (batches, error, skipped) = drain(images(
        &ds,
        SKIP_ONE_AN_EPOCH,
        lobster_io::images::PIXELS_MAX_DEFAULT,
    ));
    assert!(error.is_none() && skipped == 0, "{error:?}");
    assert!(batches.iter().all(|b| b.skipped.is_empty()));
}

#[test]
fn an_image_above_the_pixel_bound_counts_against_the_budget_and_fails_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let big = id_of(&ds, &format!("{BIG:02}.jpg"));
    let path = ds.samples()[big as usize].path.display().to_string();
    // A budget of none: the one refusal is past it.
    let none = OnError::Skip {
        max_failures: FailureBudget::Count(0),
    };
    let (_, error, _) = drain(images(&ds, none, 1000));
    let e = error.expect("the budget is exceeded");
    let Error::TooManyFailures { first, .. } = &e else {
        panic!("{e}");
    };
    assert_eq!(first.len(), 1, "{e}");
    assert_eq!(first[0].0, big);
    assert!(
        first[0].1.contains("64x48") && first[0].1.contains("1000"),
        "{e}"
    );
    // Under fail, the error is the sample's: its id, its file, its size and the bound.
    let (_, error, _) = drain(images(&ds, OnError::Fail, 1000));
    let e = error.expect("the big image fails");
    assert!(
        matches!(e, Error::Decode { sample, .. } if sample == big),
        "{e}"
    );
    let text = e.to_string();
    for part in [path.as_str(), "64x48", "3072 pixels", "1000", "pixels_max"] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
}

#[test]
fn a_pixel_bound_past_the_limit_is_refused_at_build() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let e = LoaderBuilder::<Pixels>::new(ds)
        .batch_size(BATCH)
        .image_pixels_max(lobster_io::images::PIXELS_MAX_LIMIT + 1)
        .decode_images(Transform::None)
        .build()
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidParameter { parameter, .. } if parameter == "image_pixels_max"),
        "{e}"
    );
}

/// A loader of each sample's bytes, bounded at `bytes_max` a decoded sample.
fn bytes_loader(ds: &Arc<Dataset>, policy: OnError, bytes_max: u64) -> lobster_io::Loader<Vec<u8>> {
    LoaderBuilder::<Vec<u8>>::new(ds.clone())
        .batch_size(BATCH)
        .epochs(2)
        .seed(3)
        .decode_threads(2)
        .on_error(policy)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
        .decoded_sample_bytes_max(bytes_max)
        .build()
        .unwrap()
}

#[test]
fn a_sample_decoded_past_its_byte_bound_goes_through_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let big = id_of(&ds, &format!("{BIG:02}.jpg"));
    let sizes: Vec<u64> = ds.samples().iter().map(|s| s.size_bytes).collect();
    let others_max = (0..sizes.len())
        .filter(|&i| i != big as usize)
        .map(|i| sizes[i])
        .max()
        .unwrap();
    assert!(sizes[big as usize] > others_max);
    let (batches, error, skipped) = drain(bytes_loader(&ds, SKIP_ONE_AN_EPOCH, others_max));
    assert!(error.is_none(), "{error:?}");
    let skipped_ids: Vec<u32> = batches.iter().flat_map(|b| b.skipped.clone()).collect();
    assert_eq!((skipped_ids, skipped), (vec![big, big], 2));
    for b in &batches {
        for s in &b.samples {
            assert_eq!(
                s.value,
                std::fs::read(&ds.samples()[s.id as usize].path).unwrap()
            );
        }
    }
    let (_, error, _) = drain(bytes_loader(&ds, OnError::Fail, others_max));
    let e = error.expect("the big sample fails");
    assert!(
        matches!(e, Error::Decode { sample, .. } if sample == big),
        "{e}"
    );
    let text = e.to_string();
    let path = ds.samples()[big as usize].path.display().to_string();
    for part in [
        path.as_str(),
        &sizes[big as usize].to_string(),
        &others_max.to_string(),
        "decoded_sample_bytes_max",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
}

#[test]
fn a_byte_bound_set_in_the_config_without_a_measure_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let mut config = lobster_io::LoaderConfig::default();
    config.job.batch_size = BATCH;
    config.limits.decoded_sample_bytes_max = Some(100);
    let e = LoaderBuilder::<u64>::new(ds)
        .config(config)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.len() as u64))
        .build()
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidParameter { parameter, .. } if parameter == "decoded_sample_bytes_max"),
        "{e}"
    );
}
