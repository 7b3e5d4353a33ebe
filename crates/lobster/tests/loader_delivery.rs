//! The loader delivers every planned sample exactly once per epoch per rank, in plan order,
//! with the right label and bytes; hits and misses do not depend on threads or backends.

use lobster_testkit::data::{content, make_dataset};
use lobster_testkit::loader::{rank_plan, run_ranks, Shape};
use std::sync::Arc;

use lobster_io::Backend;
use lobster_io::{
    Batch, CachePolicy, Dataset, Execution, IoOrder, Loader, LoaderBuilder, ResidentReads, Schedule,
};

#[derive(Clone, Copy, Debug)]
struct Setup {
    policy: CachePolicy,
    execution: Execution,
    backend: Backend,
    decode_threads: usize,
    schedule: Schedule,
    io_order: IoOrder,
    window_iterations: usize,
    resident_reads: ResidentReads,
}

const NODES: usize = 3;
const RANKS: usize = 2;
const BATCH: usize = 7;
const EPOCHS: u32 = 4;
const SEED: u64 = 11;

fn build(ds: &Arc<Dataset>, s: Setup, node: usize) -> Loader<Vec<u8>> {
    LoaderBuilder::new(ds.clone())
        .world(NODES, RANKS, node)
        .seed(SEED)
        .batch_size(BATCH)
        .epochs(EPOCHS)
        .cache(s.policy, ds.total_bytes() / 5)
        .execution(s.execution)
        .backend(s.backend)
        .decode_threads(s.decode_threads)
        .io_depth(8)
        .schedule(s.schedule)
        .io_order(s.io_order)
        .window_iterations(s.window_iterations)
        .resident_reads(s.resident_reads)
        .decode(|bytes: &[u8], _meta| Ok::<_, std::io::Error>(bytes.to_vec()))
        .build()
        .unwrap()
}

/// Runs every rank on its own thread and returns each rank's batches, none failing.
fn run(loader: &mut Loader<Vec<u8>>) -> Vec<Vec<Batch<Vec<u8>>>> {
    run_ranks(loader)
        .into_iter()
        .map(|rank| rank.into_iter().map(Result::unwrap).collect())
        .collect()
}

fn check_delivery(ds: &Dataset, node: usize, got: &[Vec<Batch<Vec<u8>>>]) {
    for (rank, batches) in got.iter().enumerate() {
        check_rank(ds, node, rank, batches);
    }
}

/// `batches` are every batch of `rank` on `node`, in plan order, with their labels and bytes.
fn check_rank(ds: &Dataset, node: usize, rank: usize, batches: &[Batch<Vec<u8>>]) {
    let shape = Shape {
        nodes: NODES,
        ranks: RANKS,
        node,
        seed: SEED,
        epochs: EPOCHS,
        batch: BATCH,
    };
    let expected = rank_plan(ds.len(), shape).swap_remove(rank);
    let actual: Vec<_> = batches
        .iter()
        .map(|b| {
            (
                b.epoch,
                b.iteration,
                b.samples.iter().map(|s| s.id).collect::<Vec<_>>(),
            )
        })
        .collect();
    assert_eq!(actual, expected, "rank {rank}: batches in plan order");
    for b in batches {
        for s in &b.samples {
            let meta = &ds.samples()[s.id as usize];
            assert_eq!(s.label, meta.label, "label of sample {}", s.id);
            assert_eq!(s.value, content(meta.path_id()), "bytes of sample {}", s.id);
        }
    }
}

trait PathId {
    fn path_id(&self) -> u32;
}

impl PathId for lobster_io::SampleMeta {
    /// The generator's index, from the file name.
    fn path_id(&self) -> u32 {
        self.path
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    }
}

fn setups() -> Vec<Setup> {
    let base = Setup {
        policy: CachePolicy::Reuse,
        execution: Execution::Pipelined,
        backend: Backend::Uring,
        decode_threads: 3,
        schedule: Schedule::Allocate { hysteresis: 0.05 },
        io_order: IoOrder::Deadline,
        window_iterations: 1,
        resident_reads: ResidentReads::Auto,
    };
    let mut v = Vec::new();
    for policy in [
        CachePolicy::Reuse,
        CachePolicy::Static,
        CachePolicy::Lru,
        CachePolicy::None,
    ] {
        for backend in [Backend::Uring, Backend::Pread] {
            // The page cache holds the test's files: Auto reads them on the decode workers,
            // Dispatcher through the reader (by path where the kernel has direct descriptors).
            for resident_reads in [ResidentReads::Auto, ResidentReads::Dispatcher] {
                v.push(Setup {
                    policy,
                    backend,
                    resident_reads,
                    ..base
                });
            }
        }
        v.push(Setup {
            policy,
            io_order: IoOrder::Shares,
            ..base
        });
        v.push(Setup {
            policy,
            execution: Execution::ReadThenDecode,
            schedule: Schedule::EqualSplit,
            ..base
        });
    }
    v.push(Setup {
        decode_threads: 2,
        schedule: Schedule::EqualSplit,
        ..base
    });
    v.push(Setup {
        decode_threads: 5,
        ..base
    });
    // Windows of several iterations, crossing epoch boundaries, in both read orders.
    for io_order in [IoOrder::Deadline, IoOrder::Shares] {
        v.push(Setup {
            window_iterations: 3,
            io_order,
            ..base
        });
    }
    v
}

#[test]
fn every_sample_is_delivered_once_per_epoch_in_plan_order() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 101, 4);
    for setup in setups() {
        for node in [0, 2] {
            eprintln!("{setup:?} node {node}");
            let mut loader = build(&ds, setup, node);
            let got = run(&mut loader);
            check_delivery(&ds, node, &got);
            let m = loader.metrics();
            let per_rank: usize = got[0].iter().map(|b| b.samples.len()).sum();
            assert_eq!(m.samples as usize, per_rank * RANKS, "{setup:?}");
        }
    }
}

#[test]
fn hits_and_misses_do_not_depend_on_threads_or_backends() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 101, 4);
    for policy in [CachePolicy::Reuse, CachePolicy::Static, CachePolicy::Lru] {
        let mut seen = Vec::new();
        for setup in setups().into_iter().filter(|s| s.policy == policy) {
            let mut loader = build(&ds, setup, 1);
            let _ = run(&mut loader);
            let m = loader.metrics();
            let per_iteration: Vec<_> = m
                .iterations
                .iter()
                .map(|i| (i.epoch, i.iteration, i.rank, i.hits, i.misses))
                .collect();
            seen.push((setup, m.hits, m.accesses, per_iteration));
        }
        assert!(seen[0].1 > 0, "{policy:?} has hits in this setting");
        for s in &seen[1..] {
            assert_eq!(
                (s.1, s.2),
                (seen[0].1, seen[0].2),
                "{:?} vs {:?}",
                s.0,
                seen[0].0
            );
            let mut a = s.3.clone();
            let mut b = seen[0].3.clone();
            a.sort();
            b.sort();
            assert_eq!(a, b, "per-iteration hits of {:?} vs {:?}", s.0, seen[0].0);
        }
    }
}

#[test]
fn a_sample_whose_decode_fails_names_its_id_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 60, 3);
    let bad = 17u32;
    for execution in [Execution::Pipelined, Execution::ReadThenDecode] {
        let mut loader = LoaderBuilder::new(ds.clone())
            .world(1, 2, 0)
            .batch_size(5)
            .execution(execution)
            .decode_threads(2)
            .decode(move |bytes: &[u8], meta| {
                if meta.id == bad {
                    Err(format!("corrupt header ({} bytes)", bytes.len()))
                } else {
                    Ok(())
                }
            })
            .build()
            .unwrap();
        let handles = loader.ranks().unwrap();
        let errors: Vec<(usize, String)> = std::thread::scope(|s| {
            let threads: Vec<_> = handles
                .into_iter()
                .map(|h| {
                    s.spawn(move || {
                        let rank = h.rank();
                        h.filter_map(|b| b.err())
                            .map(|e| (rank, e.to_string()))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        assert_eq!(errors.len(), 1, "{errors:?}");
        let path = ds.samples()[bad as usize].path.display().to_string();
        assert!(
            errors[0].1.contains("sample 17") && errors[0].1.contains(&path),
            "{errors:?}"
        );
        assert!(errors[0].1.contains("corrupt header"), "{errors:?}");
    }
}

#[test]
fn a_file_that_changed_size_since_open_is_reported_as_such() {
    let ways = [
        (Execution::Pipelined, ResidentReads::Auto),
        (Execution::Pipelined, ResidentReads::Dispatcher),
        (Execution::ReadThenDecode, ResidentReads::Auto),
    ];
    for (execution, resident_reads) in ways {
        for grow in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let ds = make_dataset(dir.path(), 30, 2);
            let victim = &ds.samples()[7];
            let mut bytes = std::fs::read(&victim.path).unwrap();
            if grow {
                bytes.extend_from_slice(b"appended");
            } else {
                bytes.truncate(bytes.len() / 2);
            }
            std::fs::write(&victim.path, &bytes).unwrap();
            let mut loader = LoaderBuilder::new(ds.clone())
                .world(1, 1, 0)
                .batch_size(5)
                .execution(execution)
                .resident_reads(resident_reads)
                .decode_threads(2)
                .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.len()))
                .build()
                .unwrap();
            let handle = loader.ranks().unwrap().pop().unwrap();
            let errors: Vec<String> = handle
                .filter_map(|b| b.err())
                .map(|e| e.to_string())
                .collect();
            assert_eq!(
                errors.len(),
                1,
                "{execution:?} {resident_reads:?} grow={grow}: {errors:?}"
            );
            let e = &errors[0];
            assert!(e.contains("sample 7") && e.contains("changed size"), "{e}");
            assert!(e.contains(&victim.path.display().to_string()), "{e}");
        }
    }
}

#[test]
fn a_rank_that_drops_its_handle_leaves_the_others_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 101, 4);
    let base = setups()[0];
    for io_order in [IoOrder::Deadline, IoOrder::Shares] {
        let setup = Setup { io_order, ..base };
        let mut loader = build(&ds, setup, 0);
        let mut handles = loader.ranks().unwrap();
        let mut quitter = handles.pop().unwrap();
        let stayer = handles.pop().unwrap();
        let got = std::thread::scope(|s| {
            s.spawn(move || {
                // One batch, then the rank's handle goes; its planned reads that later hits
                // of the other rank rely on (cache admissions) must still be made.
                assert!(quitter.next().unwrap().is_ok());
            });
            s.spawn(move || stayer.map(|b| b.unwrap()).collect::<Vec<_>>())
                .join()
                .unwrap()
        });
        check_rank(&ds, 0, 0, &got);
        assert!(loader.metrics().hits > 0, "{setup:?}: the cache is used");
    }
}

#[test]
fn the_decode_function_is_told_each_accesss_epoch_cache_hits_too() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 40, 2);
    let bytes: u64 = ds.samples().iter().map(|s| s.size_bytes).sum();
    let mut loader = LoaderBuilder::new(ds.clone())
        .world(1, 2, 0)
        .batch_size(4)
        .epochs(3)
        .cache(CachePolicy::Reuse, bytes / 2)
        .decode_in_epoch(|_, meta, epoch| Ok::<_, std::io::Error>((meta.id, epoch)))
        .build()
        .unwrap();
    let mut seen = 0;
    for batch in lobster_testkit::loader::run_ranks(&mut loader)
        .into_iter()
        .flatten()
    {
        let batch = batch.unwrap();
        for s in &batch.samples {
            assert_eq!(s.value, (s.id, batch.epoch));
            seen += 1;
        }
    }
    assert_eq!(seen, 3 * 40);
    assert!(
        loader.metrics().hits > 0,
        "hits are decoded for their own epoch too"
    );
}
