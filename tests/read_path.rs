//! The loader chooses where misses are read by itself: on the decode workers when the page
//! cache holds them, by the dispatcher otherwise, and says so in its metrics.

mod common;

use std::os::fd::AsRawFd;

use common::{make_dataset, rank_plan, run_ranks, Shape};
use lobster_io::{CachePolicy, Dataset, LoaderBuilder, ResidentReads, RunMetrics};

const SHAPE: Shape = Shape {
    nodes: 1,
    ranks: 2,
    node: 0,
    seed: 5,
    epochs: 2,
    batch: 8,
};

fn run(ds: &std::sync::Arc<Dataset>, direct: bool, resident: ResidentReads) -> RunMetrics {
    let mut loader = LoaderBuilder::new(ds.clone())
        .world(SHAPE.nodes, SHAPE.ranks, SHAPE.node)
        .seed(SHAPE.seed)
        .batch_size(SHAPE.batch)
        .epochs(SHAPE.epochs)
        .cache(CachePolicy::None, 0)
        .decode_threads(2)
        .direct(direct)
        .resident_reads(resident)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
        .build()
        .unwrap();
    let got = run_ranks(&mut loader);
    // Each rank gets its planned samples, each with its file's bytes.
    let plan = rank_plan(ds.len(), SHAPE);
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
        assert_eq!(ids, want, "rank {rank}, direct={direct} {resident:?}");
    }
    loader.metrics()
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
    assert_eq!(m.read_path, "resident-on-workers");
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
        assert!(
            m.read_path.starts_with("dispatcher") && m.read_path.contains(why),
            "{}",
            m.read_path
        );
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
    // Every miss is read once: on a worker, or by the dispatcher.
    assert_eq!(m.reads_resident + m.reads_dispatched, misses, "{m:?}");
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
