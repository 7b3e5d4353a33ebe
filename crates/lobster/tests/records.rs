//! A caller-built table of byte ranges (`Dataset::from_records`): samples packed into a few
//! files at unaligned offsets are delivered byte for byte on every read path, and a range
//! its file does not hold fails naming the sample.

use std::path::Path;
use std::sync::Arc;

use lobster_io::{CachePolicy, Dataset, LoaderBuilder, ResidentReads, SampleRecord};
use lobster_testkit::data::content;
use lobster_testkit::loader::{rank_plan, run_ranks, Shape};

const SHAPE: Shape = Shape {
    nodes: 1,
    ranks: 2,
    node: 0,
    seed: 11,
    epochs: 2,
    batch: 4,
};

/// `samples` samples packed into 3 files, back to back after a 100-byte header, so that
/// offsets fall anywhere in a block.
fn packed(dir: &Path, samples: u32) -> Arc<Dataset> {
    let mut files: Vec<Vec<u8>> = vec![vec![0xEE; 100]; 3];
    let mut records = Vec::new();
    for i in 0..samples {
        let f = (i % 3) as usize;
        let bytes = content(i);
        records.push(SampleRecord {
            path: dir.join(format!("pack{f}.bin")),
            offset: files[f].len() as u64,
            len: bytes.len() as u64,
            label: i % 2,
            key: format!("sample{i:04}"),
        });
        files[f].extend_from_slice(&bytes);
    }
    for (f, bytes) in files.iter().enumerate() {
        std::fs::write(dir.join(format!("pack{f}.bin")), bytes).unwrap();
    }
    Arc::new(Dataset::from_records(dir, vec!["even".into(), "odd".into()], records).unwrap())
}

fn loader(ds: &Arc<Dataset>, direct: bool, resident: ResidentReads) -> lobster_io::Loader<Vec<u8>> {
    LoaderBuilder::new(ds.clone())
        .world(SHAPE.nodes, SHAPE.ranks, SHAPE.node)
        .seed(SHAPE.seed)
        .batch_size(SHAPE.batch)
        .epochs(SHAPE.epochs)
        .cache(CachePolicy::Reuse, 4096)
        .decode_threads(2)
        .direct(direct)
        .resident_reads(resident)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
        .build()
        .unwrap()
}

#[test]
fn ranges_are_delivered_byte_for_byte_on_every_read_path() {
    let dir = tempfile::tempdir().unwrap();
    let ds = packed(dir.path(), 60);
    let plan = rank_plan(ds.len(), SHAPE);
    for (direct, resident) in [
        (false, ResidentReads::Auto),
        (false, ResidentReads::Dispatcher),
        (true, ResidentReads::Auto),
    ] {
        let mut l = loader(&ds, direct, resident);
        for (rank, (batches, planned)) in run_ranks(&mut l).into_iter().zip(&plan).enumerate() {
            let ids: Vec<u32> = batches
                .into_iter()
                .flat_map(|b| b.unwrap().samples)
                .map(|s| {
                    assert_eq!(s.value, content(s.id), "sample {} direct={direct}", s.id);
                    assert_eq!(s.label, s.id % 2);
                    s.id
                })
                .collect();
            let want: Vec<u32> = planned.iter().flat_map(|(_, _, ids)| ids.clone()).collect();
            assert_eq!(ids, want, "rank {rank} direct={direct} {resident:?}");
        }
    }
}

#[test]
fn a_range_past_its_files_end_fails_naming_the_sample() {
    let dir = tempfile::tempdir().unwrap();
    let ds = packed(dir.path(), 12);
    // Cut the last file inside its last sample.
    let last = ds
        .samples()
        .iter()
        .rev()
        .find(|s| s.path.ends_with("pack2.bin"))
        .unwrap()
        .clone();
    std::fs::write(
        &*last.path,
        &std::fs::read(&*last.path).unwrap()[..(last.offset + last.size_bytes / 2) as usize],
    )
    .unwrap();
    for resident in [ResidentReads::Auto, ResidentReads::Dispatcher] {
        let mut l = loader(&ds, false, resident);
        let errors: Vec<String> = run_ranks(&mut l)
            .into_iter()
            .flatten()
            .filter_map(|b| b.err())
            .map(|e| e.to_string())
            .collect();
        assert!(!errors.is_empty(), "{resident:?}");
        assert!(
            errors
                .iter()
                .all(|e| e.contains(&format!("sample {}", last.id)) && e.contains("pack2.bin")),
            "{resident:?}: {errors:?}"
        );
    }
}

#[test]
fn a_bad_table_is_refused_naming_the_record() {
    let record = |key: &str, label| SampleRecord {
        path: "/data/pack.bin".into(),
        offset: 0,
        len: 10,
        label,
        key: key.into(),
    };
    let classes = || vec!["a".to_string()];
    let e = Dataset::from_records("/data", classes(), [record("x", 1)]).unwrap_err();
    assert!(
        e.to_string().contains("\"x\"") && e.to_string().contains("label 1"),
        "{e}"
    );
    let e =
        Dataset::from_records("/data", classes(), [record("x", 0), record("x", 0)]).unwrap_err();
    assert!(e.to_string().contains("duplicate key"), "{e}");
    let e = Dataset::from_records("/data", classes(), []).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}
