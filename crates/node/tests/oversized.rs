//! One sample that decodes larger than its share of a slot (issue 27): the host's setup
//! bounds each decoded sample at `slot_bytes / batch_size`, so the sample fails as one bad
//! sample under `on_error` instead of stopping every rank of the node. The host and its
//! ranks run in this process, each rank on its own thread, attached as a process would be.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lobster_io::{CachePolicy, Dataset, FailureBudget, LoaderBuilder, LoaderConfig, OnError};
use lobster_node::{fingerprint, HostOptions, NodeEnv, NodeHost, NodeRank};

const RANKS: usize = 2;
const BATCH: usize = 4;
const SAMPLES: u32 = 32;
/// Bytes of every sample but [`BIG`].
const SMALL_BYTES: usize = 40;
const BIG: u32 = 13;
/// More than a whole slot.
const BIG_BYTES: usize = 5000;
const SLOT_BYTES: u64 = BATCH as u64 * 256;

fn dataset(dir: &Path) -> Arc<Dataset> {
    let class = dir.join("c0");
    std::fs::create_dir_all(&class).unwrap();
    for i in 0..SAMPLES {
        let len = if i == BIG { BIG_BYTES } else { SMALL_BYTES };
        let mut v = i.to_le_bytes().to_vec();
        v.resize(len, (i % 251) as u8);
        std::fs::write(class.join(format!("{i:04}.bin")), v).unwrap();
    }
    let options = lobster_io::FolderOptions {
        table_dir: None,
        extensions: vec!["bin".into()],
    };
    Arc::new(Dataset::open_folder(dir, &options).unwrap())
}

fn config(on_error: OnError) -> LoaderConfig {
    LoaderConfig {
        job: lobster_io::JobConfig {
            ranks_per_node: RANKS,
            batch_size: BATCH,
            epochs: 2,
            ..Default::default()
        },
        cache: lobster_io::CacheConfig {
            policy: CachePolicy::None,
            ..Default::default()
        },
        budgets: lobster_io::BudgetConfig {
            decode_threads: RANKS,
            ..Default::default()
        },
        on_error,
        ..LoaderConfig::default()
    }
}

/// What each rank saw: every batch's (delivered ids, skipped ids), and how it ended.
type Seen = (Vec<(Vec<u32>, Vec<u32>)>, String);

/// Runs a node of [`RANKS`] ranks over `ds`, the host set up as a node's host is: each
/// decoded sample bounded at its share of a slot.
fn run_node(ds: &Arc<Dataset>, on_error: OnError, job: &str) -> Vec<Seen> {
    let config = config(on_error);
    let loader = LoaderBuilder::<Vec<u8>>::new(ds.clone())
        .config(config.clone())
        .seed(5)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
        .decoded_sample_bytes_max(SLOT_BYTES / BATCH as u64)
        .build()
        .unwrap();
    let job = format!("{job}-{}", std::process::id());
    let env = |r: usize| NodeEnv::new(r, RANKS, r, RANKS, 0, 1, job.as_str()).unwrap();
    let agreed = fingerprint(ds, &config, 5);
    let options = HostOptions {
        slots_per_rank: 2,
        slot_bytes: SLOT_BYTES,
        attach_timeout: Duration::from_secs(30),
    };
    let host = NodeHost::start(&env(0), loader, agreed.clone(), options).unwrap();
    let ranks: Vec<_> = (0..RANKS)
        .map(|r| {
            let (env, agreed, ds) = (env(r), agreed.clone(), ds.clone());
            std::thread::spawn(move || {
                let rank = NodeRank::attach(&env, agreed, Duration::from_secs(30)).unwrap();
                let mut batches = Vec::new();
                for b in rank {
                    match b {
                        Ok(b) => {
                            for (i, p) in b.samples.iter().enumerate() {
                                let file = std::fs::read(&ds.samples()[p.id as usize].path);
                                assert_eq!(b.bytes(i), file.unwrap(), "sample {}", p.id);
                            }
                            let ids = b.samples.iter().map(|p| p.id).collect();
                            batches.push((ids, b.skipped.clone()));
                        }
                        Err(e) => return (batches, format!("error {e}")),
                    }
                }
                (batches, "end".to_string())
            })
        })
        .collect();
    let seen = ranks.into_iter().map(|t| t.join().unwrap()).collect();
    let _ = host.wait();
    seen
}

#[test]
fn an_oversized_sample_is_skipped_within_the_budget_and_every_rank_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let big = ds
        .samples()
        .iter()
        .position(|s| s.size_bytes == BIG_BYTES as u64)
        .unwrap() as u32;
    let skip = OnError::Skip {
        max_failures: FailureBudget::Count(1),
    };
    let seen = run_node(&ds, skip, "oversized-skip");
    let per_rank_batches = 2 * SAMPLES as usize / RANKS / BATCH;
    let mut skipped: Vec<u32> = Vec::new();
    let mut delivered = 0;
    for (r, (batches, end)) in seen.iter().enumerate() {
        assert_eq!(end, "end", "rank {r}");
        assert_eq!(batches.len(), per_rank_batches, "rank {r}");
        for (ids, left_out) in batches {
            assert_eq!(ids.len() + left_out.len(), BATCH, "rank {r}");
            assert!(!ids.contains(&big), "rank {r}");
            delivered += ids.len();
            skipped.extend(left_out);
        }
    }
    // Once an epoch, and nothing else.
    assert_eq!(skipped, [big, big]);
    assert_eq!(delivered, 2 * SAMPLES as usize - 2);
}

#[test]
fn an_oversized_sample_under_fail_names_itself_and_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let big = ds
        .samples()
        .iter()
        .find(|s| s.size_bytes == BIG_BYTES as u64)
        .unwrap();
    let seen = run_node(&ds, OnError::Fail, "oversized-fail");
    let ends: Vec<&String> = seen.iter().map(|(_, end)| end).collect();
    let named = format!("decoding sample {} ({})", big.id, big.path.display());
    let failed: Vec<&&String> = ends.iter().filter(|e| e.contains(&named)).collect();
    assert_eq!(failed.len(), 1, "{ends:?}");
    assert!(
        failed[0].contains(&BIG_BYTES.to_string())
            && failed[0].contains("decoded_sample_bytes_max"),
        "{ends:?}"
    );
    // No rank was told of a slot too small: the host never met the sample.
    assert!(ends.iter().all(|e| !e.contains("slot_bytes")), "{ends:?}");
}
