//! The loader chooses where misses are read by itself: on the decode workers when the page
//! cache holds them, by the dispatcher otherwise, and says so in its metrics. Samples the
//! cache admits that the page cache holds stay there, until the page cache lets them go.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Barrier};

use lobster_io::{
    CachePolicy, CacheStore, Dataset, LoaderBuilder, Mode, ReadPath, ResidentReads, RunMetrics,
};
use lobster_testkit::data::make_dataset;
use lobster_testkit::loader::{rank_plan, run_ranks, Shape};

const SHAPE: Shape = Shape {
    nodes: 1,
    ranks: 2,
    node: 0,
    seed: 5,
    epochs: 2,
    batch: 8,
};

fn run(ds: &Arc<Dataset>, direct: bool, resident: ResidentReads) -> RunMetrics {
    run_cached(ds, direct, resident, CachePolicy::None, 0)
}

fn builder(
    ds: &Arc<Dataset>,
    direct: bool,
    resident: ResidentReads,
    (policy, capacity_bytes): (CachePolicy, u64),
) -> LoaderBuilder<Vec<u8>> {
    LoaderBuilder::new(ds.clone())
        .world(SHAPE.nodes, SHAPE.ranks, SHAPE.node)
        .seed(SHAPE.seed)
        .batch_size(SHAPE.batch)
        .epochs(SHAPE.epochs)
        .cache(policy, capacity_bytes)
        .decode_threads(2)
        .direct(direct)
        .resident_reads(resident)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
}

fn run_cached(
    ds: &Arc<Dataset>,
    direct: bool,
    resident: ResidentReads,
    policy: CachePolicy,
    capacity_bytes: u64,
) -> RunMetrics {
    let mut loader = builder(ds, direct, resident, (policy, capacity_bytes))
        .build()
        .unwrap();
    let got = run_ranks(&mut loader);
    check(ds, got, SHAPE, &format!("direct={direct} {resident:?}"));
    loader.metrics()
}

/// Each rank got its planned samples, each with its file's bytes.
fn check(
    ds: &Dataset,
    got: Vec<Vec<Result<lobster_io::Batch<Vec<u8>>, lobster_io::Error>>>,
    shape: Shape,
    what: &str,
) {
    let plan = rank_plan(ds.len(), shape);
    for (rank, (batches, planned)) in got.into_iter().zip(plan).enumerate() {
        let ids: Vec<u32> = batches
            .into_iter()
            .flat_map(|b| b.unwrap().samples)
            .map(|s| {
                let path = &ds.samples()[s.id as usize].path;
                assert_eq!(s.value, std::fs::read(path).unwrap(), "sample {}", s.id);
                s.id
            })
            .collect();
        let want: Vec<u32> = planned.into_iter().flat_map(|(_, _, ids)| ids).collect();
        assert_eq!(ids, want, "rank {rank}, {what}");
    }
}

/// Drops the dataset's pages from the page cache.
fn evict(ds: &Dataset) {
    for s in ds.samples() {
        let f = std::fs::File::open(&s.path).unwrap();
        f.sync_all().unwrap();
        // SAFETY: advice on a descriptor this function holds open.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
    }
}

#[test]
fn samples_in_the_page_cache_are_read_on_the_decode_workers() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    let m = run(&ds, false, ResidentReads::Auto);
    assert_eq!(m.read_path, Mode::chosen(ReadPath::ResidentOnWorkers));
    let misses = m.accesses - m.hits;
    assert_eq!(m.reads_resident, misses, "{m:?}");
    assert_eq!((m.reads_not_resident, m.reads_dispatched), (0, 0));
}

#[test]
fn with_resident_reads_off_or_o_direct_every_read_goes_to_the_dispatcher() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    for (direct, resident, why) in [
        (false, ResidentReads::Dispatcher, "off"),
        (true, ResidentReads::Auto, "O_DIRECT"),
    ] {
        let m = run(&ds, direct, resident);
        assert_eq!(m.read_path.mode, ReadPath::Dispatcher);
        let reason = m.read_path.reason.as_deref().unwrap_or_default();
        assert!(reason.contains(why), "{}", m.read_path);
        assert_eq!(m.reads_dispatched, m.accesses - m.hits);
        assert_eq!((m.reads_resident, m.reads_not_resident), (0, 0));
    }
}

#[test]
fn samples_not_in_the_page_cache_go_to_the_dispatcher_and_the_planner_stops_trying() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 400, 4);
    evict(&ds);
    let m = run(&ds, false, ResidentReads::Auto);
    let misses = m.accesses - m.hits;
    // Every miss is read once: on a worker (from the page cache, or from storage after a
    // try), or by the dispatcher.
    assert_eq!(
        m.reads_resident + m.reads_not_resident + m.reads_dispatched,
        misses,
        "{m:?}"
    );
    let tried = m.reads_resident + m.reads_not_resident;
    if m.reads_not_resident == 0 {
        eprintln!("skipped: the page cache kept the evicted files ({m:?})");
        return;
    }
    // The first epoch starts cold: tries fail, and the planner backs off, sending windows
    // straight to the dispatcher, so fewer misses were tried than were read.
    assert!(tried < misses, "{m:?}");
    assert!(m.reads_dispatched > m.reads_not_resident, "{m:?}");
}

fn dataset_bytes(ds: &Dataset) -> u64 {
    ds.samples().iter().map(|s| s.size_bytes).sum()
}

#[test]
fn cached_samples_the_page_cache_holds_stay_there_and_their_hits_read_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 200, 4);
    let half = dataset_bytes(&ds) / 2;
    let m = run_cached(&ds, false, ResidentReads::Auto, CachePolicy::Reuse, half);
    assert_eq!(
        m.cache_store,
        Mode::chosen(CacheStore::PageCacheWhereResident),
        "{m:?}"
    );
    assert!(m.hits > 0, "{m:?}");
    // Every admitted sample was found in the page cache, and every hit read it back there.
    assert!(m.cached_in_page_cache > 0, "{m:?}");
    assert_eq!(m.hits_from_page_cache, m.hits, "{m:?}");
    assert_eq!(m.hits_lost_by_page_cache, 0);
    // The plan is the one the cache makes with copies.
    let copies = run_cached(
        &ds,
        false,
        ResidentReads::Dispatcher,
        CachePolicy::Reuse,
        half,
    );
    assert_eq!(copies.cache_store.mode, CacheStore::Copies, "{copies:?}");
    assert!(copies.cache_store.reason.is_some(), "{copies:?}");
    assert_eq!((copies.hits, copies.cached_in_page_cache), (m.hits, 0));
    assert_eq!(copies.hits_from_page_cache, 0);
}

#[test]
fn when_the_page_cache_lets_cached_samples_go_their_hits_read_storage_and_copies_follow() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 400, 4);
    let shape = Shape {
        epochs: 3,
        batch: 4,
        ..SHAPE
    };
    let half_cached = |resident| {
        builder(
            &ds,
            false,
            resident,
            (CachePolicy::Reuse, dataset_bytes(&ds) / 2),
        )
        .epochs(shape.epochs)
        .batch_size(shape.batch)
        .build()
        .unwrap()
    };
    let mut loader = half_cached(ResidentReads::Auto);
    let per_epoch = loader.iterations_per_epoch();
    // Every rank stops after the first epoch while the dataset leaves the page cache.
    let barrier = Barrier::new(shape.ranks + 1);
    let handles = loader.ranks().unwrap();
    let got = std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .into_iter()
            .map(|mut h| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut batches: Vec<_> = h.by_ref().take(per_epoch).collect();
                    barrier.wait();
                    barrier.wait();
                    batches.extend(h);
                    batches
                })
            })
            .collect();
        barrier.wait();
        evict(&ds);
        barrier.wait();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    check(&ds, got, shape, "evicted after epoch 1");
    let m = loader.metrics();
    let mut with_copies = half_cached(ResidentReads::Dispatcher);
    check(&ds, run_ranks(&mut with_copies), shape, "with copies");
    let planned = with_copies.metrics().hits;
    // A hit the page cache lost is the miss it was: hits fall short of the plan by them.
    assert_eq!(m.hits + m.hits_lost_by_page_cache, planned, "{m:?}");
    assert!(m.hits_from_page_cache <= m.hits, "{m:?}");
    if m.hits_lost_by_page_cache < 16 {
        eprintln!("skipped: the page cache kept the evicted files ({m:?})");
        return;
    }
    assert_eq!(m.cache_store.mode, CacheStore::Copies, "{m:?}");
    assert!(
        m.cache_store
            .to_string()
            .starts_with("copies (the page cache let"),
        "{m:?}"
    );
}

#[test]
fn the_pipeline_opens_files_in_their_held_directories_and_the_baselines_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    // Warm: the workers read in the held directories; direct: the dispatcher's ring does.
    for direct in [false, true] {
        let m = run(&ds, direct, ResidentReads::Auto);
        assert_eq!(m.dirs_held, 3, "direct={direct}: one per class directory");
    }
    let mut loader = builder(&ds, false, ResidentReads::Auto, (CachePolicy::None, 0))
        .execution(lobster_io::Execution::ReadThenDecode)
        .build()
        .unwrap();
    let got = run_ranks(&mut loader);
    check(&ds, got, SHAPE, "read-then-decode");
    assert_eq!(loader.metrics().dirs_held, 0);
}
