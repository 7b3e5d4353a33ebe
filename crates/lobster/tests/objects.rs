//! Datasets in an S3-compatible bucket (`s3://...`), read from a real S3 server (s3s-fs,
//! started on loopback by the test kit, uploads by PUT): the same samples, in the same order,
//! as the local shards or folder uploaded; shard indexes kept by ETag; and the errors of a
//! missing bucket, a missing object, bad credentials, and an object replaced after it was
//! indexed, each naming the object; 503 storms and stalled bodies retried with nothing lost.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lobster_io::{CachePolicy, Dataset, LoaderBuilder, OnError, StoreConfig};
use lobster_testkit::data::write_image_folder;
use lobster_testkit::loader::run_ranks;
use lobster_testkit::s3::TestS3;

const BUCKET: &str = "data";

fn tars() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tars")
}

/// A server holding the test shards under `shards/` and a small ImageFolder under `folder/`
/// (also returned as a local directory).
fn server() -> (TestS3, tempfile::TempDir) {
    let s3 = TestS3::start();
    s3.create_bucket(BUCKET);
    for name in ["wds-0.tar", "wds-1.tar", "gnu.tar", "out_of_order.tar"] {
        let bytes = std::fs::read(tars().join(name)).unwrap();
        s3.put(BUCKET, &format!("shards/{name}"), bytes);
    }
    let dir = tempfile::tempdir().unwrap();
    write_image_folder(dir.path(), 23, 3, lobster_testkit::data::content);
    upload_dir(&s3, dir.path(), "folder");
    (s3, dir)
}

fn upload_dir(s3: &TestS3, root: &Path, prefix: &str) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_owned();
                s3.put(
                    BUCKET,
                    &format!("{prefix}/{rel}"),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
}

fn config(s3: &TestS3) -> StoreConfig {
    StoreConfig::from_vars(|_| None, None)
        .unwrap()
        .with_endpoint(&s3.endpoint())
        .with_region("us-east-1")
        .with_credentials(s3.access_key(), s3.secret_key(), None)
        .with_request_deadline(Duration::from_secs(20))
}

fn open(s3: &TestS3, spec: &str, index: Option<&Path>) -> Result<Dataset, lobster_io::Error> {
    Dataset::open_objects_with(spec, &config(s3), index, true)
}

fn table(ds: &Dataset) -> Vec<(String, u64, u64, u32)> {
    ds.samples()
        .iter()
        .map(|s| (s.key().to_string(), s.offset, s.size_bytes, s.label))
        .collect()
}

/// Every sample's bytes as a loader of 2 ranks with a small cache delivers them, by id,
/// over 2 epochs.
fn delivered(ds: &Arc<Dataset>) -> Vec<(u32, Vec<u8>)> {
    let mut loader = LoaderBuilder::new(ds.clone())
        .world(1, 2, 0)
        .batch_size(2)
        .epochs(2)
        .cache(CachePolicy::Reuse, ds.total_bytes() / 3)
        .decode_threads(2)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
        .build()
        .unwrap();
    let mut seen: Vec<(u32, Vec<u8>)> = run_ranks(&mut loader)
        .into_iter()
        .flatten()
        .flat_map(|b| b.unwrap().samples)
        .map(|s| (s.id, s.value))
        .collect();
    seen.sort();
    seen
}

#[test]
fn shards_in_a_bucket_are_the_local_shards_and_load_the_same_bytes() {
    let (s3, _) = server();
    let local =
        Dataset::open_shards_indexed(&format!("{}/wds-{{0..1}}.tar", tars().display()), None)
            .unwrap();
    for spec in [
        "s3://data/shards/wds-{0..1}.tar".to_string(),
        "s3://data/shards/wds-0.tar".to_string(),
    ] {
        let ds = open(&s3, &spec, None).unwrap();
        let want: Vec<_> = table(&local)
            .into_iter()
            .take(if spec.contains('{') {
                local.len()
            } else {
                ds.len()
            })
            .collect();
        assert_eq!(table(&ds), want, "{spec}");
        assert!(ds.samples()[0]
            .path
            .to_str()
            .unwrap()
            .starts_with("s3://data/shards/wds-0.tar"));
    }
    let ds = Arc::new(open(&s3, "s3://data/shards/wds-{0..1}.tar", None).unwrap());
    let local = Arc::new(local);
    assert_eq!(delivered(&ds), delivered(&local));
    // A prefix holding .tar objects and no deeper prefix names every shard in it.
    let all = open(&s3, "s3://data/shards", None).unwrap();
    assert_eq!(all.root(), Path::new("s3://data/shards"));
    let names: Vec<String> = ["gnu.tar", "out_of_order.tar", "wds-0.tar", "wds-1.tar"]
        .iter()
        .map(|n| tars().join(n).display().to_string())
        .collect();
    let list = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(list.path(), names.join("\n")).unwrap();
    let local_all = Dataset::open_shards_indexed(list.path().to_str().unwrap(), None).unwrap();
    assert_eq!(table(&all), table(&local_all));
    // A local list file of objects, an URL a line (comments and blank lines skipped).
    let objects = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        objects.path(),
        "# two shards\ns3://data/shards/wds-0.tar\n\n  s3://data/shards/wds-1.tar\n",
    )
    .unwrap();
    let listed = open(&s3, objects.path().to_str().unwrap(), None).unwrap();
    assert_eq!(table(&listed), table(&ds));
    // One bucket a dataset, and every line an URL: named.
    std::fs::write(
        objects.path(),
        "s3://data/shards/wds-0.tar\ns3://other/wds-1.tar\n",
    )
    .unwrap();
    let err = open(&s3, objects.path().to_str().unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("s3://other/wds-1.tar is not in"), "{err}");
    std::fs::write(objects.path(), "s3://data/shards/wds-0.tar\nwds-1.tar\n").unwrap();
    let err = open(&s3, objects.path().to_str().unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("wds-1.tar") && err.contains("s3://"), "{err}");
}

#[test]
fn a_folder_prefix_is_the_image_folder_in_torchvision_order() {
    let (s3, dir) = server();
    let local = Arc::new(Dataset::open_image_folder(dir.path()).unwrap());
    let ds = Arc::new(open(&s3, "s3://data/folder", None).unwrap());
    assert_eq!(ds.classes(), local.classes());
    assert_eq!(table(&ds), table(&local));
    assert_eq!(delivered(&ds), delivered(&local));
    // Nested directories: a-x/ sorts before a/b/ as Python's sorted(os.walk) puts them.
    let nested = tempfile::tempdir().unwrap();
    for (i, rel) in [
        "c/a/b/1.jpg",
        "c/a-x/2.jpg",
        "c/a/0.jpg",
        "c/3.png",
        "d/z.jpg",
    ]
    .iter()
    .enumerate()
    {
        let p = nested.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, vec![i as u8; 10 + i]).unwrap();
    }
    upload_dir(&s3, nested.path(), "nested");
    let want = table(&Dataset::open_image_folder(nested.path()).unwrap());
    assert_eq!(table(&open(&s3, "s3://data/nested/", None).unwrap()), want);
}

#[test]
fn a_kept_index_is_reused_while_the_object_is_the_same_and_made_again_when_it_changes() {
    let (s3, _) = server();
    let index = tempfile::tempdir().unwrap();
    let spec = "s3://data/shards/wds-{0..1}.tar";
    let first = table(&open(&s3, spec, Some(index.path())).unwrap());
    let before = s3.requests();
    let again = open(&s3, spec, Some(index.path())).unwrap();
    assert_eq!(table(&again), first);
    // The bucket check and a HEAD per shard: no GET of a header.
    assert_eq!(s3.requests() - before, 3, "reopening reads no shard");
    // wds-1 replaced by gnu.tar's bytes: a new ETag, so its index is made again.
    s3.put(
        BUCKET,
        "shards/wds-1.tar",
        std::fs::read(tars().join("gnu.tar")).unwrap(),
    );
    let changed = open(&s3, spec, Some(index.path())).unwrap();
    let local = |name: &str| {
        table(&Dataset::open_shards_indexed(tars().join(name).to_str().unwrap(), None).unwrap())
    };
    let want: Vec<_> = local("wds-0.tar")
        .into_iter()
        .chain(local("gnu.tar"))
        .collect();
    assert_eq!(table(&changed), want);
}

#[test]
fn a_prefix_of_shards_keeps_its_indexes_too() {
    let (s3, _) = server();
    let index = tempfile::tempdir().unwrap();
    let spec = "s3://data/shards/";
    let first = table(&open(&s3, spec, Some(index.path())).unwrap());
    let kept = std::fs::read_dir(index.path()).unwrap().count();
    assert_eq!(kept, 4, "an index kept per shard");
    let before = s3.requests();
    let again = open(&s3, spec, Some(index.path())).unwrap();
    assert_eq!(table(&again), first);
    // The bucket check, the listing, and a HEAD per shard if the listing has no ETags: no
    // GET of a header (each shard needs at least one).
    let made = s3.requests() - before;
    assert!(made <= 2 + 4, "reopening reads no shard: {made} requests");
}

#[test]
fn indexing_a_shard_reads_it_about_once() {
    let (s3, _) = server();
    // 48 samples of 100 kB (an image and a label each): 4.8 MB, several of the index's
    // 1 MiB spans, and a label after every image.
    let images: Vec<(String, Vec<u8>)> = (0..48u32)
        .map(|i| (format!("s{i:03}"), vec![i as u8; 100_000]))
        .collect();
    let labels: Vec<(String, String)> = (0..48u32)
        .map(|i| (format!("s{i:03}"), (i % 5).to_string()))
        .collect();
    let mut members: Vec<(String, &[u8])> = Vec::new();
    for ((key, image), (_, label)) in images.iter().zip(&labels) {
        members.push((format!("{key}.jpg"), image));
        members.push((format!("{key}.cls"), label.as_bytes()));
    }
    let named: Vec<(&str, &[u8])> = members.iter().map(|(n, b)| (n.as_str(), *b)).collect();
    let shard = lobster_testkit::data::ustar(&named);
    let size = shard.len() as u64;
    s3.put(BUCKET, "big/one.tar", shard);
    let before = s3.requests();
    let ds = open(&s3, "s3://data/big/one.tar", None).unwrap();
    assert_eq!(ds.len(), 48);
    assert!(ds
        .samples()
        .iter()
        .enumerate()
        .all(|(i, s)| s.label == i as u32 % 5));
    // The bucket check and a HEAD, then a GET per span of 1 MiB: labels read in archive
    // order, each in the span its header was fetched with, not a span per label.
    let spans = size.div_ceil(1 << 20);
    let made = s3.requests() - before;
    assert!(
        made <= 2 + 2 * spans,
        "{made} requests for a shard of {spans} spans"
    );
}

#[test]
fn a_missing_bucket_a_missing_object_and_bad_credentials_are_named() {
    let (s3, _) = server();
    let err = open(&s3, "s3://nobucket/shards/wds-0.tar", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("nobucket"), "{err}");
    let err = open(&s3, "s3://data/shards/wds-{0..2}.tar", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("s3://data/shards/wds-2.tar"), "{err}");
    let bad = config(&s3).with_credentials(s3.access_key(), "S3CR3T-canary", Some("T0K3N-canary"));
    let err = Dataset::open_objects_with("s3://data/shards", &bad, None, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("data"), "{err}");
    assert!(!err.contains("S3CR3T") && !err.contains("T0K3N"), "{err}");
    assert!(!format!("{bad:?}").contains("S3CR3T"), "{bad:?}");
}

#[test]
fn an_object_replaced_after_it_was_indexed_fails_its_reads_naming_it() {
    let (s3, _) = server();
    let ds = Arc::new(open(&s3, "s3://data/shards/wds-{0..1}.tar", None).unwrap());
    // Shorter than the index says.
    let mut short = std::fs::read(tars().join("wds-1.tar")).unwrap();
    short.truncate(short.len() / 2);
    s3.put(BUCKET, "shards/wds-1.tar", short);
    let mut loader = LoaderBuilder::new(ds.clone())
        .world(1, 1, 0)
        .batch_size(1)
        .epochs(1)
        .decode_threads(1)
        .on_error(OnError::Fail)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.len()))
        .build()
        .unwrap();
    let items: Vec<_> = run_ranks(&mut loader).into_iter().flatten().collect();
    let err = items
        .iter()
        .find_map(|b| b.as_ref().err())
        .expect("a read of the replaced object fails")
        .to_string();
    assert!(err.contains("s3://data/shards/wds-1.tar"), "{err}");
    // Every sample of the shard not replaced was delivered before or besides the error.
    let first_shard = ds
        .samples()
        .iter()
        .filter(|s| s.path.to_str().unwrap().ends_with("wds-0.tar"))
        .count();
    assert!(first_shard > 0);
}

#[test]
fn a_storm_of_503s_and_stalled_bodies_are_retried_and_nothing_is_lost() {
    let (s3, _) = server();
    let ds = Arc::new(open(&s3, "s3://data/shards/wds-{0..1}.tar", None).unwrap());
    let want = delivered(&ds);
    s3.slow_down_next(12);
    assert_eq!(delivered(&ds), want);
    let stalls = config(&s3).with_stall_timeout(Duration::from_millis(300));
    let ds = Arc::new(
        Dataset::open_objects_with("s3://data/shards/wds-{0..1}.tar", &stalls, None, true).unwrap(),
    );
    s3.stall_next(3);
    assert_eq!(delivered(&ds), want);
}
