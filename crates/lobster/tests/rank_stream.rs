//! A rank's batches as an async stream: the same batches as the iterator, every rank of a
//! node driven by one runtime thread (which a poll that blocked could not do: the planner
//! waits for the slowest rank), errors as the iterator gives them, and a dropped stream
//! detaching its rank.

use std::sync::Arc;

use lobster_io::{Batch, CachePolicy, Dataset, Loader, LoaderBuilder};
use lobster_testkit::data::make_dataset;
use lobster_testkit::loader::{assert_delivered, rank_plan, run_ranks, Shape};
use lobster_testkit::process::guarded;

const RANKS: usize = 4;
const BATCH: usize = 5;
const EPOCHS: u32 = 3;
const SEED: u64 = 21;

fn build(ds: &Arc<Dataset>) -> Loader<Vec<u8>> {
    LoaderBuilder::new(ds.clone())
        .world(1, RANKS, 0)
        .seed(SEED)
        .batch_size(BATCH)
        .epochs(EPOCHS)
        .cache(CachePolicy::Reuse, ds.total_bytes() / 4)
        .decode_threads(4)
        .io_depth(8)
        // The planner runs one iteration ahead of the slowest rank: a rank blocking the only
        // runtime thread would stop every other rank, and so the planner, for good.
        .prefetch_iterations(1)
        .window_iterations(1)
        .decode(|bytes: &[u8], _meta| Ok::<_, std::io::Error>(bytes.to_vec()))
        .build()
        .unwrap()
}

/// Every rank as a task on one current-thread runtime; each rank's items in order.
fn run_as_tasks(
    loader: &mut Loader<Vec<u8>>,
) -> Vec<Vec<Result<Batch<Vec<u8>>, lobster_io::Error>>> {
    let streams: Vec<_> = loader
        .ranks()
        .unwrap()
        .into_iter()
        .map(|h| h.into_stream())
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|mut s| {
                tokio::spawn(async move {
                    let mut items = Vec::new();
                    // No yield between batches: only a batch not yet complete lets the other
                    // ranks' tasks run.
                    while let Some(item) = s.next_batch().await {
                        items.push(item);
                    }
                    items
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.unwrap());
        }
        all
    })
}

/// A batch as compared: epoch, iteration, and each sample's id, label and bytes.
type Seen = (u32, u32, Vec<(u32, u32, Vec<u8>)>);

fn ids(rank: &[Result<Batch<Vec<u8>>, lobster_io::Error>]) -> Vec<Seen> {
    rank.iter()
        .map(|b| {
            let b = b.as_ref().unwrap();
            let samples = b
                .samples
                .iter()
                .map(|s| (s.id, s.label, s.value.clone()))
                .collect();
            (b.epoch, b.iteration, samples)
        })
        .collect()
}

#[test]
fn streams_on_one_thread_deliver_the_iterators_batches() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 63, 1);
    let mut iterated = build(&ds);
    let threads = run_ranks(&mut iterated);
    let mut loader = build(&ds);
    let (tasks, _) = guarded("every rank as a task on one thread".into(), || {
        run_as_tasks(&mut loader)
    });
    assert_eq!(tasks.len(), RANKS);
    for rank in 0..RANKS {
        assert_eq!(ids(&tasks[rank]), ids(&threads[rank]), "rank {rank}");
    }
    let shape = Shape {
        nodes: 1,
        ranks: RANKS,
        node: 0,
        batch: BATCH,
        epochs: EPOCHS,
        seed: SEED,
    };
    assert_delivered(&rank_plan(ds.len(), shape), tasks, "streams");
    // The same plan: the same hits; 63 samples padded to 64 per epoch.
    let (iterated, streamed) = (iterated.metrics(), loader.metrics());
    assert_eq!(streamed.samples, 64 * u64::from(EPOCHS));
    assert_eq!(streamed.hits, iterated.hits);
    assert!(streamed.hits > 0);
}

#[test]
fn a_missing_file_is_the_streams_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 40, 2);
    let victim = ds.samples()[7].clone();
    std::fs::remove_file(&victim.path).unwrap();
    let mut loader = build(&ds);
    let (tasks, _) = guarded("ranks with a missing sample".into(), || {
        run_as_tasks(&mut loader)
    });
    let errors: Vec<String> = tasks
        .iter()
        .flatten()
        .filter_map(|item| item.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(!errors.is_empty(), "the missing sample fails a batch");
    let name = victim.path.file_name().unwrap().to_str().unwrap();
    assert!(
        errors
            .iter()
            .all(|e| e.contains(name) || e.contains("stopped")),
        "{errors:?}"
    );
    assert!(errors.iter().any(|e| e.contains(name)), "{errors:?}");
}

#[test]
fn a_dropped_stream_lets_the_other_ranks_finish() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 60, 3);
    let mut loader = build(&ds);
    let mut streams: Vec<_> = loader
        .ranks()
        .unwrap()
        .into_iter()
        .map(|h| h.into_stream())
        .collect();
    let dropped = streams.pop().unwrap();
    assert_eq!(dropped.rank(), RANKS - 1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (counts, _) = guarded("ranks after one stream is dropped".into(), || {
        runtime.block_on(async move {
            let mut dropped = dropped;
            // It takes one batch, then goes.
            dropped.next_batch().await.unwrap().unwrap();
            drop(dropped);
            let tasks: Vec<_> = streams
                .into_iter()
                .map(|mut s| {
                    tokio::spawn(async move {
                        let mut samples = 0;
                        while let Some(b) = s.next_batch().await {
                            samples += b.unwrap().samples.len();
                        }
                        samples
                    })
                })
                .collect();
            let mut counts = Vec::new();
            for t in tasks {
                counts.push(t.await.unwrap());
            }
            counts
        })
    });
    assert_eq!(counts, vec![60 / RANKS * EPOCHS as usize; RANKS - 1]);
}
