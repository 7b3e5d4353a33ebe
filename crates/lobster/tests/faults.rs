//! Faults injected into storage reads: with the skip policy every sample not injected as failing
//! is delivered once per epoch with the right bytes and the skipped set is the injected set;
//! with the fail policy each fault surfaces on its rank naming its sample; same seed, same
//! faults, on both I/O backends and both executions.

use lobster_testkit::data::{content, make_dataset};
use lobster_testkit::loader::{rank_plan, run_ranks, Shape};
use lobster_testkit::process::guarded;
use std::collections::BTreeSet;
use std::sync::Arc;

use lobster_io::Backend;
use lobster_io::{
    AttemptFaults, CachePolicy, Dataset, Error, Execution, FailureBudget, Fault, FaultInjection,
    Loader, LoaderBuilder, OnError, READ_ATTEMPTS,
};

// Datasets here have one class, so a sample's id is its generator index (see `content`).
const SAMPLES: u32 = 150;
const NODES: usize = 2;
const RANKS: usize = 2;
const NODE: usize = 1;
const BATCH: usize = 5;
const EPOCHS: u32 = 3;
const SEED: u64 = 5;

fn faults(seed: u64) -> FaultInjection {
    FaultInjection {
        seed,
        eio: 0.04,
        short: 0.5,
        delay: 0.2,
        corrupt: 0.04,
        delay_us: 300,
    }
}

#[derive(Clone, Copy, Debug)]
struct Setup {
    execution: Execution,
    backend: Backend,
    cache: CachePolicy,
}

fn setups(cache: CachePolicy) -> Vec<Setup> {
    let mut v = Vec::new();
    for backend in [Backend::Uring, Backend::Pread] {
        v.push(Setup {
            execution: Execution::Pipelined,
            backend,
            cache,
        });
    }
    v.push(Setup {
        execution: Execution::ReadThenDecode,
        backend: Backend::Pread,
        cache,
    });
    v
}

/// A decoder that checks the content, so corrupted bytes fail to decode.
fn build(ds: &Arc<Dataset>, s: Setup, policy: OnError, f: FaultInjection) -> Loader<Vec<u8>> {
    build_with_threads(ds, s, policy, f, 3)
}

fn build_with_threads(
    ds: &Arc<Dataset>,
    s: Setup,
    policy: OnError,
    f: FaultInjection,
    decode_threads: usize,
) -> Loader<Vec<u8>> {
    LoaderBuilder::new(ds.clone())
        .world(NODES, RANKS, NODE)
        .seed(SEED)
        .batch_size(BATCH)
        .epochs(EPOCHS)
        .cache(s.cache, ds.total_bytes() / 4)
        .execution(s.execution)
        .backend(s.backend)
        .decode_threads(decode_threads)
        .io_depth(6)
        .on_error(policy)
        .inject_faults(Some(f))
        .decode(|bytes: &[u8], meta| {
            if bytes == content(meta.id).as_slice() {
                Ok(bytes.to_vec())
            } else {
                Err(format!("content of sample {} does not match", meta.id))
            }
        })
        .build()
        .unwrap()
}

const SHAPE: Shape = Shape {
    nodes: NODES,
    ranks: RANKS,
    node: NODE,
    seed: SEED,
    epochs: EPOCHS,
    batch: BATCH,
};

/// Skip every failed access: the tests compare what was skipped against a model.
const SKIP_ALL: OnError = OnError::Skip {
    max_failures: FailureBudget::Count(u64::MAX),
};

/// Each local rank's plan: (epoch, iteration, sample ids) per batch.
fn plan(ds: &Dataset) -> Vec<Vec<(u32, u32, Vec<u32>)>> {
    rank_plan(ds.len(), SHAPE)
}

/// Reference model of the retry loop over every read: (attempts the injector changed,
/// retries, reads recovered by a retry).
fn expected_counts(f: &FaultInjection, reads: impl Iterator<Item = (u32, u32)>) -> [u64; 3] {
    let mut counts = [0; 3];
    for (epoch, sample) in reads {
        for attempt in 0..READ_ATTEMPTS {
            let d = f.decide(sample, epoch, attempt);
            counts[0] += u64::from(d != AttemptFaults::default());
            let failed = d.eio || d.short;
            if failed && attempt + 1 < READ_ATTEMPTS {
                counts[1] += 1;
                continue;
            }
            counts[2] += u64::from(!failed && attempt > 0);
            break;
        }
    }
    counts
}

/// (epoch, rank, sample) of every skipped access, from the metrics.
fn skipped_set(loader: &Loader<Vec<u8>>) -> BTreeSet<(u32, usize, u32)> {
    let m = loader.metrics();
    assert_eq!(m.skipped as usize, m.skipped_samples.len());
    m.skipped_samples
        .iter()
        .map(|s| (s.epoch, s.rank, s.sample))
        .collect()
}

#[test]
fn skip_delivers_every_sample_not_injected_and_skips_exactly_the_injected() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), SAMPLES, 1);
    let f = faults(SEED);
    let skip = OnError::Skip {
        max_failures: FailureBudget::Fraction(1.0),
    };
    let plan = plan(&ds);
    // Without a cache every access is a storage read, so the injector alone says which fail.
    let mut expected_skipped = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    for (rank, batches) in plan.iter().enumerate() {
        for (epoch, _, ids) in batches {
            for &s in ids {
                if let Some(fault) = f.outcome(s, *epoch) {
                    expected_skipped.insert((*epoch, rank, s));
                    kinds.insert(format!("{fault:?}"));
                }
            }
        }
    }
    assert_eq!(
        kinds.len(),
        3,
        "every kind of failure is exercised: {kinds:?}"
    );
    for setup in setups(CachePolicy::None) {
        let mut loader = build(&ds, setup, skip, f);
        let got = run_ranks(&mut loader);
        for (rank, results) in got.into_iter().enumerate() {
            assert_eq!(results.len(), plan[rank].len(), "{setup:?} rank {rank}");
            for (result, (epoch, iteration, ids)) in results.into_iter().zip(&plan[rank]) {
                let batch = result.unwrap_or_else(|e| panic!("{setup:?}: {e}"));
                assert_eq!((batch.epoch, batch.iteration), (*epoch, *iteration));
                let (bad, good): (Vec<u32>, Vec<u32>) =
                    ids.iter().partition(|&&s| f.outcome(s, *epoch).is_some());
                let delivered: Vec<u32> = batch.samples.iter().map(|s| s.id).collect();
                assert_eq!(delivered, good, "{setup:?} rank {rank} epoch {epoch}");
                assert_eq!(batch.skipped, bad, "{setup:?} rank {rank} epoch {epoch}");
                for s in &batch.samples {
                    assert_eq!(s.value, content(s.id), "bytes of sample {}", s.id);
                }
            }
        }
        assert_eq!(skipped_set(&loader), expected_skipped, "{setup:?}");
        let m = loader.metrics();
        let accesses: usize = plan.iter().flatten().map(|b| b.2.len()).sum();
        assert_eq!(
            m.samples as usize + expected_skipped.len(),
            accesses,
            "{setup:?}"
        );
        let reads = plan
            .iter()
            .flatten()
            .flat_map(|(epoch, _, ids)| ids.iter().map(move |&s| (*epoch, s)));
        let counts = expected_counts(&f, reads);
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        assert_eq!(
            [m.faults_injected, m.read_retries, m.reads_recovered],
            counts,
            "{setup:?}"
        );
    }
}

#[test]
fn with_a_cache_the_same_seed_skips_the_same_accesses_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), SAMPLES, 1);
    let skip = SKIP_ALL;
    let plan = plan(&ds);
    for seed in [SEED, SEED + 1] {
        let f = faults(seed);
        let mut seen: Option<BTreeSet<_>> = None;
        // Every setup twice: neither timing nor backend nor execution changes the faults.
        for setup in setups(CachePolicy::Reuse).into_iter().flat_map(|s| [s, s]) {
            let mut loader = build(&ds, setup, skip, f);
            let got = run_ranks(&mut loader);
            for (rank, results) in got.into_iter().enumerate() {
                for (result, (epoch, _, ids)) in results.into_iter().zip(&plan[rank]) {
                    let batch = result.unwrap();
                    let mut all: Vec<u32> = batch.samples.iter().map(|s| s.id).collect();
                    all.extend(&batch.skipped);
                    all.sort();
                    let mut want = ids.clone();
                    want.sort();
                    assert_eq!(all, want, "{setup:?}: delivered + skipped = planned");
                    for s in &batch.samples {
                        assert_eq!(s.value, content(s.id));
                    }
                    // A hit on a copy whose read failed or was corrupt reads storage again,
                    // so a skipped access's sample failed a read in this very epoch.
                    for &s in &batch.skipped {
                        assert!(
                            f.outcome(s, *epoch).is_some(),
                            "{setup:?}: sample {s} skipped in epoch {epoch} without a fault"
                        );
                    }
                }
            }
            let skipped = skipped_set(&loader);
            assert!(!skipped.is_empty());
            match &seen {
                None => seen = Some(skipped),
                Some(first) => assert_eq!(&skipped, first, "{setup:?} seed {seed}"),
            }
        }
    }
}

#[test]
fn with_fail_each_fault_surfaces_on_its_rank_naming_its_sample() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), SAMPLES, 1);
    let f = faults(SEED + 2);
    let plan = plan(&ds);
    for setup in setups(CachePolicy::None) {
        let mut loader = build(&ds, setup, OnError::Fail, f);
        let got = run_ranks(&mut loader);
        let mut errors = 0;
        for (rank, results) in got.into_iter().enumerate() {
            assert_eq!(results.len(), plan[rank].len(), "{setup:?} rank {rank}");
            for (result, (epoch, _, ids)) in results.into_iter().zip(&plan[rank]) {
                // The batch fails with its first failing sample in plan order.
                let first_bad = ids
                    .iter()
                    .find_map(|&s| f.outcome(s, *epoch).map(|k| (s, k)));
                match (result, first_bad) {
                    (Ok(batch), None) => {
                        let delivered: Vec<u32> = batch.samples.iter().map(|s| s.id).collect();
                        assert_eq!(&delivered, ids);
                        assert!(batch.skipped.is_empty());
                    }
                    (Err(e), Some((sample, kind))) => {
                        errors += 1;
                        assert_eq!(e.sample(), Some(sample), "{setup:?} rank {rank}: {e}");
                        let text = e.to_string();
                        assert!(text.contains(&format!("sample {sample}")), "{text}");
                        let path = ds.samples()[sample as usize].path.display().to_string();
                        assert!(text.contains(&path), "{text}");
                        match kind {
                            Fault::Eio | Fault::Short => {
                                assert!(matches!(e, Error::Read { .. }), "{kind:?}: {e}");
                                assert!(text.contains("injected"), "{text}");
                            }
                            Fault::Corrupt => {
                                assert!(matches!(e, Error::Decode { .. }), "{kind:?}: {e}")
                            }
                        }
                    }
                    (result, expected) => panic!(
                        "{setup:?} rank {rank} epoch {epoch}: got {:?}, expected failure {expected:?}",
                        result.map(|b| b.samples.len())
                    ),
                }
            }
        }
        assert!(errors > 0, "{setup:?}: faults were injected");
        assert_eq!(loader.metrics().skipped, 0, "fail does not skip");
    }
}

#[test]
fn going_over_the_budget_fails_every_rank_with_a_summary_and_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), SAMPLES, 1);
    let f = faults(SEED);
    let allowed = 3;
    let plan = plan(&ds);
    let injected_in = |epoch: u32| -> BTreeSet<u32> {
        plan.iter()
            .flatten()
            .filter(|b| b.0 == epoch)
            .flat_map(|b| b.2.iter().copied())
            .filter(|&s| f.outcome(s, epoch).is_some())
            .collect()
    };
    assert!(
        injected_in(0).len() > allowed as usize,
        "the budget is exceeded"
    );
    for setup in setups(CachePolicy::None) {
        let mut loader = build(
            &ds,
            setup,
            OnError::Skip {
                max_failures: FailureBudget::Count(allowed),
            },
            f,
        );
        let got = run_ranks(&mut loader);
        for (rank, results) in got.into_iter().enumerate() {
            let last = results.last().expect("at least one batch");
            let Err(
                e @ Error::TooManyFailures {
                    epoch,
                    failed,
                    allowed: a,
                    first,
                    ..
                },
            ) = last
            else {
                panic!("{setup:?} rank {rank}: ends with {last:?}");
            };
            assert_eq!(*a, allowed);
            assert!(*failed > allowed, "{e}");
            let injected = injected_in(*epoch);
            assert!(!first.is_empty() && first.len() <= 5, "{e}");
            for (sample, cause) in first {
                assert!(
                    injected.contains(sample),
                    "{setup:?}: {sample} not injected"
                );
                assert!(e.to_string().contains(cause.as_str()));
            }
            // Only the last item is an error: the iterator ends after reporting it.
            assert!(results[..results.len() - 1].iter().all(Result::is_ok));
            assert!(results.len() < plan[rank].len(), "{setup:?}: stopped early");
        }
    }
}

#[test]
fn dropping_the_loader_while_faults_are_retried_returns_and_stops_the_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), SAMPLES, 1);
    // Nearly every attempt is short or delayed: reads sit in backoff or in delay timers.
    let f = FaultInjection {
        seed: 1,
        short: 0.8,
        delay: 0.2,
        delay_us: 20_000,
        ..FaultInjection::default()
    };
    let skip = OnError::Skip {
        max_failures: FailureBudget::Fraction(1.0),
    };
    for setup in setups(CachePolicy::Reuse) {
        let mut loader = build(&ds, setup, skip, f);
        let mut handles = loader.ranks().unwrap();
        let first = handles[0].next().unwrap().unwrap();
        assert_eq!(first.samples.len() + first.skipped.len(), BATCH);
        let ((), took) = guarded(format!("{setup:?}: dropping the loader"), || drop(loader));
        println!("{setup:?}: drop took {:.1} ms", took.as_secs_f64() * 1e3);
        // A rank blocked on a batch, or asking after the drop, is told the loader stopped.
        for h in &mut handles {
            for item in h.by_ref() {
                if let Err(e) = item {
                    assert!(matches!(e, Error::Stopped { .. }), "{setup:?}: {e}");
                }
            }
        }
    }
}

#[test]
fn a_cached_sample_whose_read_failed_is_read_again_by_later_hits() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), SAMPLES, 1);
    let skip = SKIP_ALL;
    // Permanent read errors only: an access can then fail only through its own epoch's read.
    let f = FaultInjection {
        eio: 0.15,
        short: 0.0,
        delay: 0.0,
        corrupt: 0.0,
        ..faults(SEED + 3)
    };
    for setup in setups(CachePolicy::Reuse) {
        let mut loader = build(&ds, setup, skip, f);
        let _ = run_ranks(&mut loader);
        let m = loader.metrics();
        assert!(m.hits > 0, "{setup:?}: the cache serves hits");
        let skipped = skipped_set(&loader);
        assert!(!skipped.is_empty(), "{setup:?}: faults were injected");
        for (epoch, _, sample) in skipped {
            assert!(
                f.outcome(sample, epoch).is_some(),
                "{setup:?}: sample {sample} skipped in epoch {epoch}, whose reads of it succeed"
            );
        }
    }
}

/// One access of the node stream as the planner decided it, in canonical order.
struct PlannedAccess {
    epoch: u32,
    rank: usize,
    sample: u32,
    hit: bool,
    admitted: bool,
}

/// The node stream in canonical order (epoch, iteration, local rank, position), with the cache
/// planner's decision for each access.
fn planned_accesses(ds: &Dataset, policy: lobster_cache::PolicyKind) -> Vec<PlannedAccess> {
    let plan = plan(ds);
    let mut stream: Vec<Vec<(usize, u32)>> = vec![Vec::new(); EPOCHS as usize];
    let iterations = plan[0].len() / EPOCHS as usize;
    for (epoch, order) in stream.iter_mut().enumerate() {
        for iteration in 0..iterations {
            for (rank, batches) in plan.iter().enumerate() {
                let (e, i, ids) = &batches[epoch * iterations + iteration];
                assert_eq!((*e as usize, *i as usize), (epoch, iteration));
                order.extend(ids.iter().map(|&s| (rank, s)));
            }
        }
    }
    let sizes: Arc<[u32]> = ds.samples().iter().map(|s| s.size_bytes as u32).collect();
    let source = lobster_cache::VecSource::new(
        stream
            .iter()
            .map(|e| e.iter().map(|&(_, s)| s).collect())
            .collect(),
    );
    let mut planner =
        lobster_cache::Planner::new(source, sizes, ds.total_bytes() / 4, policy).unwrap();
    let mut evicted = Vec::new();
    let mut out = Vec::new();
    for (epoch, order) in stream.iter().enumerate() {
        for &(rank, sample) in order {
            let d = planner.next(&mut evicted).unwrap().expect("one per access");
            assert_eq!((d.sample, d.epoch), (sample, epoch as u32));
            out.push(PlannedAccess {
                epoch: epoch as u32,
                rank,
                sample,
                hit: d.hit,
                admitted: d.admitted,
            });
        }
    }
    assert!(planner.next(&mut evicted).unwrap().is_none());
    out
}

/// Reference model of a run with a cache: a miss reads storage in its epoch; a hit takes the
/// bytes its sample's admitting read left in the cache, unless that read failed or delivered
/// corrupt bytes, in which case the hit reads storage again in its own epoch (and counts as a
/// miss).
fn cached_run_model(f: &FaultInjection, accesses: &[PlannedAccess]) -> ModelRun {
    let mut cached_bad = std::collections::HashMap::new();
    let (mut skipped, mut reads, mut hits) = (BTreeSet::new(), Vec::new(), 0);
    for a in accesses {
        let reads_storage = !a.hit || cached_bad[&a.sample];
        if reads_storage {
            reads.push((a.epoch, a.sample));
            if f.outcome(a.sample, a.epoch).is_some() {
                skipped.insert((a.epoch, a.rank, a.sample));
            }
        } else {
            hits += 1;
        }
        if a.admitted && !a.hit {
            cached_bad.insert(a.sample, f.outcome(a.sample, a.epoch).is_some());
        }
    }
    ModelRun {
        skipped,
        reads,
        hits,
    }
}

/// What [`cached_run_model`] expects of a run.
struct ModelRun {
    /// Skipped accesses: (epoch, rank, sample).
    skipped: BTreeSet<(u32, usize, u32)>,
    /// Storage reads: (epoch, sample).
    reads: Vec<(u32, u32)>,
    /// Hits served from the cache.
    hits: u64,
}

#[test]
fn with_a_cache_the_skipped_set_is_the_injected_set_and_corrupt_bytes_are_not_served_again() {
    use lobster_cache::PolicyKind;
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), SAMPLES, 1);
    let skip = SKIP_ALL;
    for (cache, kind) in [
        (CachePolicy::Reuse, PolicyKind::Reuse),
        (CachePolicy::Static, PolicyKind::Static),
    ] {
        let accesses = planned_accesses(&ds, kind);
        for (seed, f) in [
            // Corruption only: every failure comes from bytes the decoder rejects.
            (
                SEED,
                FaultInjection {
                    eio: 0.0,
                    short: 0.0,
                    delay: 0.0,
                    corrupt: 0.15,
                    ..faults(SEED)
                },
            ),
            (SEED + 4, faults(SEED + 4)),
        ] {
            let ModelRun {
                skipped: expected,
                reads,
                hits: expected_hits,
            } = cached_run_model(&f, &accesses);
            // The case this test is about: a hit on a sample whose cached copy is corrupt.
            let corrupt_cached_hits = {
                let mut bad = std::collections::HashMap::new();
                accesses
                    .iter()
                    .filter(|a| {
                        if a.admitted && !a.hit {
                            bad.insert(a.sample, f.outcome(a.sample, a.epoch));
                        }
                        a.hit && bad[&a.sample] == Some(Fault::Corrupt)
                    })
                    .count()
            };
            assert!(
                corrupt_cached_hits > 0,
                "{cache:?} seed {seed}: hits on corrupt cached copies are exercised"
            );
            assert!(!expected.is_empty());
            let planned_hits = accesses.iter().filter(|a| a.hit).count() as u64;
            assert!(
                expected_hits < planned_hits,
                "some planned hits read storage"
            );
            let counts = expected_counts(&f, reads.iter().copied());
            let mut seen = None;
            // Every setup twice, with different decode thread counts.
            for (setup, threads) in setups(cache).into_iter().flat_map(|s| [(s, 2), (s, 5)]) {
                let mut loader = build_with_threads(&ds, setup, skip, f, threads);
                let got = run_ranks(&mut loader);
                for results in got {
                    for result in results {
                        for s in &result.unwrap().samples {
                            assert_eq!(s.value, content(s.id), "{setup:?}: bytes of {}", s.id);
                        }
                    }
                }
                let m = loader.metrics();
                assert_eq!(
                    skipped_set(&loader),
                    expected,
                    "{setup:?} seed {seed}: skipped = injected"
                );
                assert_eq!(m.accesses as usize, accesses.len(), "{setup:?}");
                assert_eq!(
                    m.hits, expected_hits,
                    "{setup:?} seed {seed}: re-reads of planned hits count as misses"
                );
                assert_eq!(
                    [m.faults_injected, m.read_retries, m.reads_recovered],
                    counts,
                    "{setup:?} seed {seed}: the fault counters include the re-reads"
                );
                let figures = (m.hits, m.accesses, m.samples, m.faults_injected);
                println!(
                    "{cache:?} seed {seed} {setup:?} {threads} decode threads: hits {} of {} accesses, {} samples, \
                     {} skipped, {} faults injected, {corrupt_cached_hits} hits on corrupt copies",
                    m.hits, m.accesses, m.samples, m.skipped, m.faults_injected
                );
                match seen {
                    None => seen = Some(figures),
                    Some(first) => assert_eq!(figures, first, "{setup:?}: same seed, same figures"),
                }
            }
        }
    }
}
