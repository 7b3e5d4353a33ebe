//! WebDataset tar shards read in place (`Dataset::open_shards`), against archives written by
//! Python's tarfile (data/tars/make_tars.py) and the member offsets tarfile reports for them
//! (data/tars/listing.json): pax and GNU long names, members out of order, and the errors
//! for a truncated archive, a key split across shards, a duplicate member and a missing
//! label.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::run_ranks;
use lobster_io::{CachePolicy, Dataset, LoaderBuilder};
use serde_json::Value;

fn tars() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tars")
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

fn table(ds: &Dataset) -> Vec<(String, u64, u64, u32)> {
    ds.samples()
        .iter()
        .map(|s| (s.key.to_string(), s.offset, s.size_bytes, s.label))
        .collect()
}

#[test]
fn samples_are_the_image_members_at_tarfiles_offsets_in_shard_order() {
    let spec = format!("{}/wds-{{0..1}}.tar", tars().display());
    let ds = Dataset::open_shards(&spec).unwrap();
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
    assert_eq!(
        table(&Dataset::open_shards(list.to_str().unwrap()).unwrap()),
        want
    );
}

#[test]
fn gnu_long_names_and_members_out_of_order_are_read() {
    for shard in ["gnu.tar", "out_of_order.tar"] {
        let ds = Dataset::open_shards(tars().join(shard).to_str().unwrap()).unwrap();
        assert_eq!(table(&ds), listing(shard), "{shard}");
    }
}

#[test]
fn the_loader_delivers_each_shard_members_bytes() {
    let spec = format!("{}/wds-{{0..1}}.tar", tars().display());
    let ds = Arc::new(Dataset::open_shards(&spec).unwrap());
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
            assert_eq!(s.value, payload(&meta.key, meta.size_bytes), "{}", meta.key);
            seen += 1;
        }
    }
    assert_eq!(seen, 2 * ds.len());
}

fn refused(spec: &str) -> String {
    Dataset::open_shards(spec).unwrap_err().to_string()
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
