//! Image batches through the facade: samples decoded and transformed on the decode threads
//! (`LoaderBuilder::decode_images`) and collated per rank into `[B, H, W, 3]` buffers from a
//! fixed number of slots (`ImageBatches`).

use std::path::Path;
use std::sync::Arc;

use lobster_io::images::Transform;
use lobster_io::images::{Decoding, ImageBatches, Pixels};
use lobster_io::{CacheForms, Dataset, LoaderBuilder, Mode};

/// A folder of 3 classes x 4 JPEGs, each a gradient of its own size (so that crops differ).
fn folder(dir: &Path) -> Arc<Dataset> {
    lobster_testkit::data::gradient_jpegs(dir, 12, 3, |i| (20 + 3 * i, 16 + 2 * i), 95)
}

fn loader(ds: &Arc<Dataset>, transform: Transform, seed: u64) -> lobster_io::Loader<Pixels> {
    LoaderBuilder::<Pixels>::new(ds.clone())
        .world(1, 1, 0)
        .batch_size(4)
        .epochs(2)
        .seed(seed)
        .decode_threads(2)
        .decode_images(transform)
        .build()
        .unwrap()
}

/// Every batch of a run: ids, labels, shape and image bytes.
type Run = Vec<(Vec<u32>, Vec<u32>, [usize; 4], Vec<u8>)>;

fn run(ds: &Arc<Dataset>, transform: Transform, seed: u64) -> (Run, usize) {
    let mut l = loader(ds, transform, seed);
    let rank = l.ranks().unwrap().remove(0);
    let mut out = Vec::new();
    let mut buffers = std::collections::HashSet::new();
    for batch in ImageBatches::new(rank, ds.clone(), 2) {
        let b = batch.unwrap();
        buffers.insert(b.images().as_ptr() as usize);
        out.push((
            b.ids.clone(),
            b.labels().to_vec(),
            b.shape(),
            b.images().to_vec(),
        ));
    }
    (out, buffers.len())
}

#[test]
fn batches_are_collated_with_their_labels_into_reused_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let (batches, buffers) = run(&ds, Transform::Train { size: 5 }, 3);
    assert_eq!(batches.len(), 2 * 3);
    for (ids, labels, shape, images) in &batches {
        assert_eq!(*shape, [4, 5, 5, 3]);
        assert_eq!(images.len(), 4 * 5 * 5 * 3);
        let want: Vec<u32> = ids
            .iter()
            .map(|&i| ds.samples()[i as usize].label)
            .collect();
        assert_eq!(*labels, want);
    }
    // Each epoch holds every sample once.
    for epoch in batches.chunks(3) {
        let mut ids: Vec<u32> = epoch.iter().flat_map(|b| b.0.clone()).collect();
        ids.sort();
        assert_eq!(ids, (0..12).collect::<Vec<_>>());
    }
    // One batch held at a time: its slot's buffer serves every batch.
    assert_eq!(buffers, 1);
}

#[test]
fn the_same_seed_gives_the_same_bytes_and_another_seed_other_crops() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let (a, _) = run(&ds, Transform::Train { size: 6 }, 11);
    let (b, _) = run(&ds, Transform::Train { size: 6 }, 11);
    assert_eq!(a, b);
    // Another shuffle seed: other orders and other crops. Match images by sample id.
    let (c, _) = run(&ds, Transform::Train { size: 6 }, 12);
    let by_id = |r: &Run| {
        let mut m = std::collections::BTreeMap::new();
        for (ids, _, shape, images) in &r[..3] {
            let each = shape[1] * shape[2] * 3;
            for (k, id) in ids.iter().enumerate() {
                m.insert(*id, images[k * each..(k + 1) * each].to_vec());
            }
        }
        m
    };
    assert_ne!(by_id(&a), by_id(&c));
    // Evaluation crops do not depend on the seed.
    let (e1, _) = run(&ds, Transform::Eval { size: 6 }, 11);
    let (e2, _) = run(&ds, Transform::Eval { size: 6 }, 12);
    assert_eq!(by_id(&e1), by_id(&e2));
}

#[test]
fn holding_more_batches_than_slots_is_refused_and_a_dropped_batch_frees_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let mut l = loader(&ds, Transform::Eval { size: 4 }, 0);
    let rank = l.ranks().unwrap().remove(0);
    let mut batches = ImageBatches::new(rank, ds.clone(), 2);
    let first = batches.next().unwrap().unwrap();
    let second = batches.next().unwrap().unwrap();
    assert_ne!(first.images().as_ptr(), second.images().as_ptr());
    let e = batches.next().unwrap().unwrap_err().to_string();
    assert!(e.contains("slots") && e.contains('2'), "{e}");
    let held = first.images().as_ptr();
    drop(first);
    let fourth = batches.next().unwrap().unwrap();
    assert_eq!(fourth.images().as_ptr(), held);
}

#[test]
fn images_of_different_sizes_cannot_share_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let mut l = loader(&ds, Transform::None, 0);
    let rank = l.ranks().unwrap().remove(0);
    let errors: Vec<String> = ImageBatches::new(rank, ds.clone(), 1)
        .filter_map(|b| b.err().map(|e| e.to_string()))
        .collect();
    assert!(errors.iter().any(|e| e.contains("one size")), "{errors:?}");
}

/// Every batch of a run with the cache keeping `forms` in `capacity_bytes` (no cache for
/// `None`), and the run's metrics.
fn run_with_forms(
    ds: &Arc<Dataset>,
    forms: Option<lobster_io::FormChoice>,
    capacity_bytes: u64,
    decoding: Decoding,
) -> (Run, lobster_io::RunMetrics) {
    let builder = LoaderBuilder::<Pixels>::new(ds.clone())
        .world(1, 1, 0)
        .batch_size(4)
        .epochs(3)
        .seed(5)
        .decode_threads(2)
        .decode_images_as(Transform::Train { size: 8 }, decoding);
    let mut l = match forms {
        Some(f) => builder
            .cache(lobster_io::CachePolicy::Reuse, capacity_bytes)
            .cache_forms(f),
        None => builder.cache(lobster_io::CachePolicy::None, 0),
    }
    .build()
    .unwrap();
    let rank = l.ranks().unwrap().remove(0);
    let mut out = Vec::new();
    for batch in ImageBatches::new(rank, ds.clone(), 2) {
        let b = batch.unwrap();
        out.push((
            b.ids.clone(),
            b.labels().to_vec(),
            b.shape(),
            b.images().to_vec(),
        ));
    }
    (out, l.metrics())
}

#[test]
fn decoded_images_in_the_cache_give_the_same_batches_bit_for_bit_when_decoded_whole() {
    use lobster_io::FormChoice;
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    // The 12 images decoded: (20 + 3i) x (16 + 2i) x 3 bytes each.
    let decoded: u64 = (0..12u64).map(|i| (20 + 3 * i) * (16 + 2 * i) * 3).sum();
    let (plain, _) = run_with_forms(&ds, None, 0, Decoding::Whole);
    assert_eq!(plain.len(), 3 * 3);
    for forms in [FormChoice::Encoded, FormChoice::Decoded, FormChoice::Auto] {
        for capacity in [decoded / 4, decoded / 2, decoded] {
            let (batches, m) = run_with_forms(&ds, Some(forms), capacity, Decoding::Whole);
            assert!(
                batches == plain,
                "{forms} in {capacity} bytes: other batches than with no cache"
            );
            assert_eq!(m.cache_forms, Mode::chosen(forms.into()));
            assert_eq!(m.samples, 36);
            if forms == FormChoice::Decoded {
                assert!(m.hits_decoded > 0, "{forms} {capacity}: {m:?}");
                assert_eq!(m.hits_encoded, 0);
                // Every planned decoded hit found its image or decoded again, and said so.
                assert_eq!(m.decoded_hits_served + m.decoded_again, m.hits_decoded);
                assert!(m.decoded_hits_served > 0 && m.decode_saved_seconds > 0.0);
                assert!(m.peak_cached_decoded_bytes <= capacity);
            }
            if forms == FormChoice::Encoded {
                assert_eq!(m.hits_decoded, 0);
                assert_eq!(m.decoded_hits_served, 0);
            }
        }
    }
    // A whole decoded set in budget: auto keeps every image decoded.
    let (_, m) = run_with_forms(&ds, Some(FormChoice::Auto), decoded, Decoding::Whole);
    assert_eq!((m.hits_encoded, m.hits_decoded), (0, 24), "{m:?}");
}

/// Mean absolute difference per byte between two runs' images, which must have the same
/// batches of the same samples.
fn mean_difference(a: &Run, b: &Run) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut sum, mut n) = (0u64, 0usize);
    for (x, y) in a.iter().zip(b) {
        assert_eq!((&x.0, &x.1, x.2), (&y.0, &y.1, y.2));
        sum +=
            x.3.iter()
                .zip(&y.3)
                .map(|(p, q)| u64::from(p.abs_diff(*q)))
                .sum::<u64>();
        n += x.3.len();
    }
    sum as f64 / n.max(1) as f64
}

#[test]
fn decoding_only_the_crop_repeats_exactly_and_stays_near_the_whole_decode_whatever_the_cache_keeps()
{
    use lobster_io::FormChoice;
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let decoded: u64 = (0..12u64).map(|i| (20 + 3 * i) * (16 + 2 * i) * 3).sum();
    let (whole, _) = run_with_forms(&ds, None, 0, Decoding::Whole);
    let (plain, _) = run_with_forms(&ds, None, 0, Decoding::Region);
    // lobster-image's region tests' bound for scaled decodes (mean per byte).
    let bound = 2.5;
    let d = mean_difference(&plain, &whole);
    assert!(d <= bound, "region against whole, no cache: {d}");
    for forms in [FormChoice::Encoded, FormChoice::Decoded, FormChoice::Auto] {
        let (first, m) = run_with_forms(&ds, Some(forms), decoded / 2, Decoding::Region);
        let (second, _) = run_with_forms(&ds, Some(forms), decoded / 2, Decoding::Region);
        assert!(first == second, "{forms}: two runs gave other batches");
        let d = mean_difference(&first, &whole);
        assert!(d <= bound, "{forms}: {d} from the whole decode");
        if forms == FormChoice::Encoded {
            // Nothing is kept decoded: every sample took the region path, as with no cache.
            assert!(first == plain, "{forms}: other batches than with no cache");
        } else {
            assert!(m.hits_decoded > 0, "{forms}: {m:?}");
        }
    }
}

#[test]
fn decoded_forms_are_refused_where_they_cannot_be_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let e = LoaderBuilder::<Vec<u8>>::new(ds.clone())
        .world(1, 1, 0)
        .batch_size(4)
        .decode(|b: &[u8], _: &lobster_io::SampleMeta| Ok::<_, std::io::Error>(b.to_vec()))
        .cache_forms(lobster_io::FormChoice::Decoded)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cache_forms") && e.contains("decode_images"),
        "{e}"
    );
    let e = LoaderBuilder::<Pixels>::new(ds.clone())
        .world(1, 1, 0)
        .batch_size(4)
        .cache(lobster_io::CachePolicy::Lru, 1 << 20)
        .decode_images(Transform::None)
        .cache_forms(lobster_io::FormChoice::Auto)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("cache_forms") && e.contains("reuse"), "{e}");
    // Unasked, a generic decoder keeps encoded bytes and says why.
    let mut l = LoaderBuilder::<Vec<u8>>::new(ds)
        .world(1, 1, 0)
        .batch_size(4)
        .decode(|b: &[u8], _: &lobster_io::SampleMeta| Ok::<_, std::io::Error>(b.to_vec()))
        .build()
        .unwrap();
    for r in l.ranks().unwrap() {
        for b in r {
            b.unwrap();
        }
    }
    let m = l.metrics();
    assert!(
        m.cache_forms.mode == CacheForms::Encoded
            && m.cache_forms.reason.is_some()
            && m.form_costs.is_none(),
        "{}",
        m.cache_forms
    );
}

#[test]
fn a_max_side_keeps_smaller_images_and_says_it_is_lossy() {
    use lobster_io::FormChoice;
    let dir = tempfile::tempdir().unwrap();
    let ds = folder(dir.path());
    let run = |max_side: Option<u32>| {
        let mut b = LoaderBuilder::<Pixels>::new(ds.clone())
            .world(1, 1, 0)
            .batch_size(4)
            .epochs(3)
            .seed(5)
            .decode_threads(2)
            .cache(lobster_io::CachePolicy::Reuse, 1 << 20)
            .cache_forms(FormChoice::Decoded)
            .decode_images(Transform::Train { size: 8 });
        if let Some(side) = max_side {
            b = b.decoded_max_side(side);
        }
        let mut l = b.build().unwrap();
        let rank = l.ranks().unwrap().remove(0);
        let batches: Vec<(u32, Vec<u32>, Vec<u8>)> = ImageBatches::new(rank, ds.clone(), 2)
            .map(|b| {
                let b = b.unwrap();
                (b.epoch, b.ids.clone(), b.images().to_vec())
            })
            .collect();
        let images: Vec<Vec<u8>> = batches.iter().map(|b| b.2.clone()).collect();
        (images, l.metrics(), batches)
    };
    let (full, m_full, _) = run(None);
    let (small, m_small, batches) = run(Some(10));
    // Every image is kept either way (1 MiB holds them all), each at most 10 px a side.
    let kept: u64 = (0..12u64)
        .map(|i| {
            let (w, h) =
                lobster_io::images::downscaled_shape(20 + 3 * i as u32, 16 + 2 * i as u32, 10);
            u64::from(w * h * 3)
        })
        .sum();
    assert_eq!(m_small.peak_cached_decoded_bytes, kept, "{m_small:?}");
    assert!(m_full.peak_cached_decoded_bytes > kept);
    assert!(
        m_small
            .cache_forms
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("lossy")),
        "{}",
        m_small.cache_forms
    );
    assert!(m_small.decoded_hits_served > 0);
    // Every access, the one that keeps the image as much as the hits, transforms the image
    // as kept: decoded brought down to 10 px (at a DCT scale where one reaches it).
    let mut t = lobster_image::Transformer::new(Transform::Train { size: 8 });
    for (epoch, ids, images) in &batches {
        let expected: Vec<u8> = ids
            .iter()
            .flat_map(|&id| {
                let bytes = std::fs::read(&ds.samples()[id as usize].path).unwrap();
                let kept = lobster_image::decode_downscaled(&bytes, 1 << 26, 10).unwrap();
                let mut out = vec![0; 8 * 8 * 3];
                t.apply(&kept, (5, *epoch, id), &mut out).unwrap();
                out
            })
            .collect();
        assert!(*images == expected, "epoch {epoch}, samples {ids:?}");
    }
    assert_ne!(full, small);
    assert_eq!(run(Some(10)).0, small, "lossy, but the same every run");
}
