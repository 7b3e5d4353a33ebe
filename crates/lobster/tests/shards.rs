//! WebDataset tar shards read in place (`Dataset::open_shards`), against archives written by
//! Python's tarfile (data/tars/make_tars.py) and the member offsets tarfile reports for them
//! (data/tars/listing.json): pax and GNU long names, members out of order, and the errors
//! for a truncated archive, a key split across shards, a duplicate member and a missing
//! label; labels from `.json` members; shard indexes kept and reused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lobster_io::{CachePolicy, Dataset, LoaderBuilder};
use lobster_testkit::data::ustar;
use lobster_testkit::loader::run_ranks;
use serde_json::Value;

fn tars() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tars")
}

fn listing(shard: &str) -> Vec<(String, u64, u64, u32)> {
    let text = std::fs::read_to_string(tars().join("listing.json")).unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    all[shard]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s[0].as_str().unwrap().to_owned(),
                s[1].as_u64().unwrap(),
                s[2].as_u64().unwrap(),
                s[3].as_u64().unwrap() as u32,
            )
        })
        .collect()
}

/// The bytes make_tars.py wrote for `key`'s image.
fn payload(key: &str, n: u64) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 7 + key.len() as u64) % 256) as u8)
        .collect()
}

/// Opens shards keeping no index: every shard's headers are read.
fn open(spec: &str) -> Result<Dataset, lobster_io::Error> {
    Dataset::open_shards_indexed(spec, None)
}

fn table(ds: &Dataset) -> Vec<(String, u64, u64, u32)> {
    ds.samples()
        .iter()
        .map(|s| (s.key().to_string(), s.offset, s.size_bytes, s.label))
        .collect()
}

#[test]
fn samples_are_the_image_members_at_tarfiles_offsets_in_shard_order() {
    let spec = format!("{}/wds-{{0..1}}.tar", tars().display());
    let ds = open(&spec).unwrap();
    let want: Vec<_> = ["wds-0.tar", "wds-1.tar"]
        .iter()
        .flat_map(|s| listing(s))
        .collect();
    assert_eq!(table(&ds), want);
    assert_eq!(ds.classes(), ["0", "1", "2"]);
    // A list file naming the two shards gives the same table.
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("shards.txt");
    let names: Vec<String> = ["wds-0.tar", "wds-1.tar"]
        .iter()
        .map(|n| tars().join(n).display().to_string())
        .collect();
    std::fs::write(&list, format!("# two shards\n{}\n", names.join("\n"))).unwrap();
    assert_eq!(table(&open(list.to_str().unwrap()).unwrap()), want);
}

#[test]
fn gnu_long_names_and_members_out_of_order_are_read() {
    for shard in ["gnu.tar", "out_of_order.tar"] {
        let ds = open(tars().join(shard).to_str().unwrap()).unwrap();
        assert_eq!(table(&ds), listing(shard), "{shard}");
    }
}

#[test]
fn the_loader_delivers_each_shard_members_bytes() {
    let spec = format!("{}/wds-{{0..1}}.tar", tars().display());
    let ds = Arc::new(open(&spec).unwrap());
    let mut loader = LoaderBuilder::new(ds.clone())
        .world(1, 2, 0)
        .batch_size(1)
        .epochs(2)
        .cache(CachePolicy::Reuse, 2048)
        .decode_threads(2)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
        .build()
        .unwrap();
    let mut seen = 0;
    for batch in run_ranks(&mut loader).into_iter().flatten() {
        for s in batch.unwrap().samples {
            let meta = &ds.samples()[s.id as usize];
            assert_eq!(
                s.value,
                payload(&meta.key(), meta.size_bytes),
                "{}",
                meta.key()
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 2 * ds.len());
}

fn refused(spec: &str) -> String {
    open(spec).unwrap_err().to_string()
}

#[test]
fn bad_shards_are_refused_naming_the_shard_and_the_member() {
    let t = |n: &str| tars().join(n).display().to_string();
    let e = refused(&format!("{}/split-{{0..1}}.tar", tars().display()));
    assert!(
        e.contains("split-1.tar") && e.contains("\"k2\"") && e.contains("split-0.tar"),
        "{e}"
    );
    let e = refused(&t("dup.tar"));
    assert!(
        e.contains("dup.tar") && e.contains("d.jpg appears twice"),
        "{e}"
    );
    let e = refused(&t("no_label.tar"));
    assert!(
        e.contains("no_label.tar") && e.contains("\"n2\"") && e.contains(".cls"),
        "{e}"
    );
    // Cut inside the second sample's image.
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.tar");
    let bytes = std::fs::read(tars().join("wds-0.tar")).unwrap();
    std::fs::write(&cut, &bytes[..5000]).unwrap();
    let e = refused(cut.to_str().unwrap());
    assert!(
        e.contains("cut.tar") && e.contains("truncated") && e.contains("xxxx"),
        "{e}"
    );
    let e = refused(&format!("{}/nothing-{{0..1}}.tar", dir.path().display()));
    assert!(e.contains("nothing-0.tar"), "{e}");
}

#[test]
fn labels_come_from_json_members_when_there_is_no_cls() {
    let ds = open(tars().join("json.tar").to_str().unwrap()).unwrap();
    assert_eq!(table(&ds), listing("json.tar"));
    let e = refused(&tars().join("json_bad.tar").display().to_string());
    assert!(
        e.contains("json_bad.tar") && e.contains("b0.json") && e.contains("\"label\""),
        "{e}"
    );
}

/// Sets `path`'s modification time `ago` before now.
fn age(path: &Path, ago: Duration) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - ago).unwrap();
}

fn indexes(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "idx"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_shards_index_is_reused_until_the_shard_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (data, kept) = (dir.path().join("data"), dir.path().join("indexes"));
    std::fs::create_dir(&data).unwrap();
    for n in ["wds-0.tar", "wds-1.tar"] {
        std::fs::copy(tars().join(n), data.join(n)).unwrap();
        age(&data.join(n), Duration::from_secs(3600));
    }
    // Their change times cannot be set back: older than the racy window, so that their
    // indexes are kept, only by waiting.
    std::thread::sleep(Duration::from_millis(2100));
    let spec = format!("{}/wds-{{0..1}}.tar", data.display());
    let want = table(&open(&spec).unwrap());
    let first = Dataset::open_shards_indexed(&spec, Some(&kept)).unwrap();
    assert_eq!(table(&first), want);
    assert_eq!(indexes(&kept).len(), 2);
    assert_eq!(
        table(&Dataset::open_shards_indexed(&spec, Some(&kept)).unwrap()),
        want
    );
    // The shard's bytes replaced, its size and modification time kept (as tar and rsync -a
    // keep them): its change time tells, so the shard is read again and found to hold
    // nothing.
    let shard = data.join("wds-1.tar");
    let len = std::fs::metadata(&shard).unwrap().len() as usize;
    let stamp = std::fs::metadata(&shard).unwrap().modified().unwrap();
    std::fs::write(&shard, vec![0u8; len]).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    let e = Dataset::open_shards_indexed(&spec, Some(&kept))
        .unwrap_err()
        .to_string();
    assert!(e.contains("wds-1.tar") && e.contains("no samples"), "{e}");
    // Another modification time: the same.
    age(&shard, Duration::from_secs(60));
    let e = Dataset::open_shards_indexed(&spec, Some(&kept))
        .unwrap_err()
        .to_string();
    assert!(e.contains("wds-1.tar") && e.contains("no samples"), "{e}");
    // Restored, then its index damaged: the index is not trusted, the shard is read.
    std::fs::copy(tars().join("wds-1.tar"), &shard).unwrap();
    age(&shard, Duration::from_secs(3600));
    assert_eq!(
        table(&Dataset::open_shards_indexed(&spec, Some(&kept)).unwrap()),
        want
    );
    for idx in indexes(&kept) {
        let mut bytes = std::fs::read(&idx).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        std::fs::write(&idx, bytes).unwrap();
    }
    assert_eq!(
        table(&Dataset::open_shards_indexed(&spec, Some(&kept)).unwrap()),
        want
    );
}

/// A shard replaced by another of the same size and modification time (renamed over it, or
/// rewritten in place, its time set back as tar and rsync -a set it) is read again.
#[test]
fn a_shard_replaced_by_one_of_the_same_size_and_time_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("indexes");
    let shard = dir.path().join("s.tar");
    let first = ustar(&[("k0.jpg", b"abc"), ("k0.cls", b"1")]);
    let second = ustar(&[("k1.jpg", b"xyz"), ("k1.cls", b"2")]);
    assert_eq!(first.len(), second.len());
    let stamp = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
    let put = |bytes: &[u8], at: &Path| {
        std::fs::write(at, bytes).unwrap();
        let f = std::fs::File::options().write(true).open(at).unwrap();
        f.set_modified(stamp).unwrap();
    };
    let keys = || -> Vec<(String, u32)> {
        Dataset::open_shards_indexed(shard.to_str().unwrap(), Some(&kept))
            .unwrap()
            .samples()
            .iter()
            .map(|s| (s.key().into_owned(), s.label))
            .collect()
    };
    put(&first, &shard);
    // The shard's status change must be older than the racy window for its index to be
    // kept: a real wait, as for shards written before a job starts.
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(keys(), [("k0".to_string(), 1)]);
    assert_eq!(indexes(&kept).len(), 1, "the index is kept");
    // Renamed over: another file.
    let tmp = dir.path().join("s.tar.new");
    put(&second, &tmp);
    std::fs::rename(&tmp, &shard).unwrap();
    assert_eq!(keys(), [("k1".to_string(), 2)]);
    // Rewritten in place: the same file, changed.
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(keys(), [("k1".to_string(), 2)]);
    put(&first, &shard);
    assert_eq!(keys(), [("k0".to_string(), 1)]);
}

#[test]
fn a_shard_written_just_now_keeps_no_index() {
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("indexes");
    let shard = dir.path().join("fresh.tar");
    std::fs::copy(tars().join("wds-0.tar"), &shard).unwrap();
    age(&shard, Duration::ZERO);
    let ds = Dataset::open_shards_indexed(shard.to_str().unwrap(), Some(&kept)).unwrap();
    assert_eq!(table(&ds), listing("wds-0.tar"));
    assert!(!kept.exists() || indexes(&kept).is_empty());
}

#[test]
fn a_label_past_the_class_bound_is_refused_naming_the_sample() {
    let dir = tempfile::tempdir().unwrap();
    for label in [
        "4000000000",
        "4294967295",
        &lobster_io::CLASSES_MAX.to_string(),
    ] {
        let shard = dir.path().join("labels.tar");
        let archive = ustar(&[
            ("k0.jpg", b"abc"),
            ("k0.cls", b"1"),
            ("k1.jpg", b"defg"),
            ("k1.cls", label.as_bytes()),
        ]);
        std::fs::write(&shard, archive).unwrap();
        let e = refused(shard.to_str().unwrap());
        assert!(
            e.contains("labels.tar") && e.contains("\"k1\"") && e.contains(label),
            "{label}: {e}"
        );
    }
    // The largest supported label opens, with a name for every class below it.
    let shard = dir.path().join("ok.tar");
    let largest = (lobster_io::CLASSES_MAX - 1).to_string();
    std::fs::write(
        &shard,
        ustar(&[("k0.jpg", b"abc"), ("k0.cls", largest.as_bytes())]),
    )
    .unwrap();
    let ds = open(shard.to_str().unwrap()).unwrap();
    assert_eq!(ds.classes().len(), lobster_io::CLASSES_MAX as usize);
}
