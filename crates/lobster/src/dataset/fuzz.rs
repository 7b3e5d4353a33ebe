//! Checkers of the files a dataset is opened from, run by the fuzz targets and by the unit
//! tests below: on any bytes, indexing a tar shard, reading a shard's index and reading a
//! folder's table end (each moves forward through its input), allocate in proportion to
//! the input, never panic, and refuse what they cannot read with an error naming the file.

use std::path::Path;

use super::folder::{self, FolderOptions};
use super::shards::{self, ShardNow};
use super::table_file::{seal, Stamp};
use super::tar_index::members;

const TAR: &str = "/fuzz/shard.tar";
const INDEX: &str = "/fuzz/shard-0.idx";
const TABLE: &str = "/fuzz/folder-0.table";
/// The shard an index is checked against: its size, device, inode and change time.
const SHARD_LEN: u64 = 1 << 20;
const SHARD_STAMP: Stamp = Stamp {
    dev: 2049,
    ino: 77,
    ctime_ns: 1_000_000_000_000,
};

/// `data` as a tar shard: indexed, grouped into samples, labels read.
pub(crate) fn check_tar(data: &[u8]) {
    let path = Path::new(TAR);
    let named = |e: &crate::Error| {
        let e = e.to_string();
        assert!(e.contains(TAR), "an error not naming the shard: {e}");
    };
    match members(data, path) {
        Ok(list) => {
            let mut last_end = 0;
            for m in &list {
                let end = m.offset.checked_add(m.size).expect("a member's end fits");
                assert!(end <= data.len() as u64, "a member past the archive's end");
                assert!(m.offset >= last_end, "members in archive order");
                last_end = end;
            }
        }
        Err(e) => return named(&e),
    }
    match shards::group(data, path).and_then(|g| shards::judge(path, g)) {
        Ok(samples) => {
            for s in samples {
                assert!(s.offset + s.size <= data.len() as u64);
            }
        }
        Err(e) => named(&e),
    }
}

/// The file a checker reads: `data` whole (its header and check line as they come), or,
/// where its first byte is odd, a valid `head` followed by `data` and sealed, so that the
/// fuzzer's bytes reach the sample lines.
fn file(head: &[u8], data: &[u8]) -> Vec<u8> {
    match data.split_first() {
        Some((first, rest)) if first & 1 == 1 => {
            let mut out = head.to_vec();
            out.extend_from_slice(rest);
            seal(&mut out);
            out
        }
        _ => data.to_vec(),
    }
}

/// [`SHARD_STAMP`] as an index's shard line holds it.
fn stamp_fields() -> String {
    let mut out = Vec::new();
    SHARD_STAMP.write(&mut out);
    String::from_utf8(out).expect("digits and tabs")
}

/// `data` as a shard's index, for a shard of [`SHARD_LEN`] bytes.
pub(crate) fn check_shard_index(data: &[u8]) {
    let mut head = shards::MAGIC.to_vec();
    head.extend_from_slice(
        format!(
            "\nshard\t{TAR}\t{SHARD_LEN}\t{}\t9000000000000\n",
            stamp_fields()
        )
        .as_bytes(),
    );
    let now = ShardNow {
        absolute: TAR.as_bytes(),
        len: SHARD_LEN,
        stamp: SHARD_STAMP,
    };
    match shards::index_from_file(file(&head, data), Path::new(INDEX), &now) {
        Ok(Some(found)) => {
            for s in &found.samples {
                assert!(s.offset + s.size <= SHARD_LEN, "a sample past the shard");
            }
        }
        Ok(None) => {}
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains(INDEX), "an error not naming the index: {e}");
        }
    }
}

/// `data` as a folder's table, for a root that does not exist (a directory line ends the
/// read: its directory is not there).
pub(crate) fn check_table(data: &[u8]) {
    let root = Path::new("/nonexistent/lobster-fuzz-root");
    let options = FolderOptions {
        extensions: vec![".jpg".into()],
        table_dir: None,
    };
    let mut head = folder::MAGIC.to_vec();
    head.extend_from_slice(
        format!(
            "\nroot\t{}\next\t.jpg\nwritten\t9000000000000\n",
            root.display()
        )
        .as_bytes(),
    );
    // Small enough that sample lines are read in two halves too.
    let parallel_from_bytes = 64;
    match folder::from_file(
        file(&head, data),
        Path::new(TABLE),
        root,
        &options,
        parallel_from_bytes,
    ) {
        Ok(Some(ds)) => {
            assert!(!ds.samples.is_empty());
            for (i, s) in ds.samples.iter().enumerate() {
                assert_eq!(s.id as usize, i, "ids in order");
                assert!(
                    (s.label as usize) < ds.classes.len(),
                    "a label without a class"
                );
            }
            assert!(ds.probes.is_empty() || ds.probes.len() == ds.samples.len());
        }
        Ok(None) => {}
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains(TABLE), "an error not naming the table: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // Bytes only: the kit links its own build of this crate.
    use lobster_testkit::data::ustar;

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    /// `seed` with a few random bytes changed, cut or repeated; or random bytes.
    fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
        if rng.below(4) == 0 {
            let len = rng.below(2048) as usize;
            return (0..len).map(|_| rng.next() as u8).collect();
        }
        let mut out = seed.to_vec();
        for _ in 0..=rng.below(4) {
            if out.is_empty() {
                break;
            }
            let at = rng.below(out.len() as u64) as usize;
            match rng.below(4) {
                0 => out[at] = rng.next() as u8,
                1 => out.truncate(at),
                2 => {
                    let b = *b"\t\n\\x0123456789-?jp";
                    out.insert(at, b[rng.below(b.len() as u64) as usize]);
                }
                _ => out[at] = b"0123456789"[rng.below(10) as usize],
            }
        }
        out
    }

    #[test]
    fn seeded_random_tar_shards_are_indexed_or_refused_naming_the_shard() {
        let seed = ustar(&[
            ("a.jpg", b"\xff\xd8xx"),
            ("a.cls", b"3"),
            ("b.png", b"\x89PNG"),
            ("b.json", br#"{"label": 2}"#),
        ]);
        check_tar(&seed);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..3000 {
            check_tar(&mutate(&mut rng, &seed));
        }
    }

    #[test]
    fn seeded_random_shard_indexes_are_read_or_refused_naming_the_index() {
        let seed = b"\x01\
            3\t512\t100\tj640x480\tkey0\n\
            0\t1024\t7\t-\tk\\tey\\n1\n\
            2\t2048\t9\t?\tk2\n";
        check_shard_index(seed);
        let mut rng = Rng(7);
        for _ in 0..3000 {
            check_shard_index(&mutate(&mut rng, seed));
        }
    }

    #[test]
    fn seeded_random_folder_tables_are_read_or_refused_naming_the_table() {
        let seed = b"\x01\
            class\ta\n\
            class\tb\n\
            s\t0\t100\tj640x480\ta/0.jpg\n\
            s\t1\t7\t-\tb/x\\ty.jpg\n\
            s\t1\t9\tp1x1\tb/z.jpg\n";
        check_table(seed);
        let mut rng = Rng(11);
        for _ in 0..3000 {
            check_table(&mutate(&mut rng, seed));
        }
    }

    #[test]
    fn a_time_of_writing_near_the_smallest_i128_is_refused_not_overflowed() {
        // `written - 2 s` overflowed (a panic in a debug build) before it saturated.
        let mut index = shards::MAGIC.to_vec();
        index.extend_from_slice(
            format!(
                "\nshard\t{TAR}\t{SHARD_LEN}\t{}\t{}\n",
                stamp_fields(),
                i128::MIN
            )
            .as_bytes(),
        );
        seal(&mut index);
        let mut data = vec![0u8];
        data.extend_from_slice(&index);
        check_shard_index(&data);
        let now = ShardNow {
            absolute: TAR.as_bytes(),
            len: SHARD_LEN,
            stamp: SHARD_STAMP,
        };
        assert!(shards::index_from_file(index, Path::new(INDEX), &now)
            .unwrap()
            .is_none());
    }
}
