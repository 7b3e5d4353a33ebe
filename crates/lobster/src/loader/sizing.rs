//! What a loader allocates, sized from its configuration and its dataset before any of it is.

use crate::config::{CachePolicy, LoaderConfig};
use crate::dataset::Dataset;
use crate::error::Error;
use crate::memory::MemoryPart;

impl LoaderConfig {
    /// What the parameters make a loader of this configuration over `dataset` allocate: its
    /// cache, the samples it reads ahead and, with a
    /// [`decoded_sample_bytes_max`](crate::SampleLimits::decoded_sample_bytes_max), its
    /// decoded samples in flight. [`LoaderBuilder::build`](crate::LoaderBuilder::build) checks them, with what the
    /// embedder reserves, against [`MachineMemory`](crate::MachineMemory); an embedder running several
    /// configurations may check them all before building any.
    pub fn memory_parts(&self, dataset: &Dataset) -> Vec<MemoryPart> {
        memory_parts(self, dataset, 0)
    }
}

/// [`LoaderConfig::memory_parts`] with `read_ahead_bytes` of peers' plan read ahead.
pub(super) fn memory_parts(
    config: &LoaderConfig,
    dataset: &Dataset,
    read_ahead_bytes: u64,
) -> Vec<MemoryPart> {
    let pool = config
        .execution
        .dispatches()
        .then(|| pool_shape(config, dataset, read_ahead_bytes).0);
    let window_bytes = window_bytes(config, dataset, pool);
    let cache = config.cache.capacity_bytes.min(dataset.total_bytes());
    let mut parts = vec![
        // The arena reserves an eighth over the capacity for its blocks' rounding.
        MemoryPart::new(
            "the cache (cache_bytes, at most the dataset)",
            cache.saturating_add(cache / 8),
        ),
        MemoryPart::new(
            "samples read ahead (prefetch_iterations, window_iterations, ranks_per_node, \
             batch_size)",
            window_bytes,
        ),
    ];
    if let Some(bytes) = config.limits.decoded_sample_bytes_max {
        // Decoded samples waiting in the ranks' reorder buffers, and each rank's batch.
        let samples = window_samples(config) + config.job.ranks_per_node * config.job.batch_size;
        parts.push(MemoryPart::new(
            "decoded samples in flight (decoded_sample_bytes_max x (prefetch_iterations + \
             window_iterations + 1) x ranks_per_node x batch_size)",
            bytes.saturating_mul(samples as u64),
        ));
    }
    parts
}

/// Accesses the planner may have handed out and not yet delivered.
pub(super) fn window_samples(config: &LoaderConfig) -> usize {
    (config.budgets.prefetch_iterations + config.budgets.window_iterations)
        * config.job.ranks_per_node
        * config.job.batch_size
}

/// The reader's allocation unit and O_DIRECT alignment we plan for.
pub(super) const PAGE_BYTES: u64 = 4096;

/// Bytes the reader reads for a sample of `size` bytes (at offset 0): the sample and the
/// byte that shows a file grew, with O_DIRECT widened to the alignment on both ends.
pub(super) fn read_bytes(config: &LoaderConfig, size: u64) -> u64 {
    if config.reads.direct {
        (size + 2 * PAGE_BYTES).next_multiple_of(PAGE_BYTES)
    } else {
        size + 1
    }
}

/// The pool block a read takes: the next power of two pages at or above it.
pub(super) fn block_bytes(read: u64) -> u64 {
    usize::try_from(read).map_or(u64::MAX, |r| lobster_uring::block_bytes(r) as u64)
}

/// Accesses that may hold a pool block at once: those of iterations the planner handed out
/// and the slowest rank has not taken (it plans at most `prefetch_iterations` ahead of it, a
/// window at a time). Reads in flight and samples awaiting decode are among them.
pub(super) fn pool_accesses(config: &LoaderConfig) -> usize {
    config
        .budgets
        .prefetch_iterations
        .max(config.budgets.window_iterations)
        * config.job.ranks_per_node
        * config.job.batch_size
}

/// The reader's pool: (budget, largest read). Sized from the dataset's actual sizes, not its
/// largest: every access that may hold a block at once ([`pool_accesses`]) at the mean
/// block size the dataset's samples take, plus two largest blocks, so a run of large samples
/// or a fragmented pool still has room; rounded up to whole largest blocks.
///
/// Correctness does not depend on it: blocks are held by reads in flight, completions the
/// dispatcher has not taken yet, reads parked for emulated storage time, and samples awaiting
/// decode. Decode workers always drain (they take no pool memory and wait on nothing that
/// does), and the dispatcher never waits for pool memory (its session refuses a read that
/// finds no free block while others hold some, and the dispatcher tries it again when memory
/// is back), so every block is eventually returned and
/// coalesced and any budget of one largest block or more makes progress. A budget below
/// the working set costs throughput (reads wait for memory), not a deadlock.
pub(super) fn pool_shape(
    config: &LoaderConfig,
    dataset: &Dataset,
    read_ahead_bytes: u64,
) -> (u64, u64) {
    let samples = dataset.samples();
    let largest_read = read_bytes(config, dataset.max_sample_bytes());
    let largest_block = block_bytes(largest_read);
    let (blocks_total, bytes_total) = samples.iter().fold((0, 0), |(blocks, bytes), s| {
        (
            blocks + block_bytes(read_bytes(config, s.size_bytes)),
            bytes + s.size_bytes,
        )
    });
    let count = samples.len().max(1) as u64;
    let mean_block = blocks_total.div_ceil(count);
    let accesses = pool_accesses(config) as u64;
    // Read-ahead blocks come on top, rounded as the blocks are.
    let ahead = read_ahead_bytes.div_ceil((bytes_total / count).max(1)) * mean_block;
    let budget =
        (accesses * mean_block + ahead + 2 * largest_block).next_multiple_of(largest_block);
    (budget, largest_read)
}

/// The most bytes of samples the prefetch window holds outside the cache's capacity. Each
/// planned access holds at most its sample's bytes once: a read in flight or awaiting decode,
/// or a cached copy the planner has since evicted but a planned hit still uses. Pipelined,
/// reads live in the reader's pool (its budget, committed up front) and only evicted copies
/// come on top; read-then-decode, both are among the window's accesses. Either way the
/// accesses are bounded by the largest samples of the dataset, as many as the window plans.
pub(super) fn window_bytes(
    config: &LoaderConfig,
    dataset: &Dataset,
    pool_bytes: Option<u64>,
) -> u64 {
    let accesses = || largest_bytes(dataset, window_samples(config));
    match pool_bytes {
        Some(pool) if config.cache.policy == CachePolicy::None => pool,
        Some(pool) => pool + accesses(),
        None => accesses(),
    }
}

/// The summed size of the `k` largest samples.
pub(super) fn largest_bytes(dataset: &Dataset, k: usize) -> u64 {
    let mut sizes: Vec<u64> = dataset.samples().iter().map(|s| s.size_bytes).collect();
    if k < sizes.len() {
        sizes.select_nth_unstable_by(k, |a, b| b.cmp(a));
        sizes.truncate(k);
    }
    sizes.iter().sum()
}

/// The reader, with the pool of [`pool_shape`] (`(budget, largest read)`) and class queues
/// that hold the whole prefetch window, so a submission never waits on a later stage.
pub(super) fn build_reader(
    config: &LoaderConfig,
    (pool_bytes, max_read_bytes): (u64, u64),
) -> Result<lobster_uring::Reader, Error> {
    let window_samples = window_samples(config);
    // Past usize, the reader's own range check names the parameter.
    let fit = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    lobster_uring::Reader::builder()
        .backend(config.reads.backend)
        .max_read_bytes(fit(max_read_bytes))
        .pool_bytes(fit(pool_bytes))
        .classes(
            config.job.ranks_per_node,
            (config.budgets.io_depth / config.job.ranks_per_node).max(1),
        )
        .queue_capacity(window_samples.max(1))
        // The budget is sized for the window's worst case; pages come in as blocks first
        // use them, so a run of small or page-cache reads never pays for the rest.
        .commit_pool(false)
        .build()
        .map_err(|e| Error::engine("I/O reader", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CachePolicy;
    use crate::dataset::SampleMeta;
    use crate::loader::{Loader, LoaderBuilder};
    use std::sync::Arc;

    /// 64 samples, every other one 200 KiB (a 256 KiB block), the rest 1 KiB.
    fn dataset(dir: &std::path::Path) -> Arc<Dataset> {
        for class in ["a", "b"] {
            std::fs::create_dir_all(dir.join(class)).unwrap();
        }
        for i in 0..64u32 {
            let size = if i % 2 == 0 { 200 << 10 } else { 1 << 10 };
            let bytes: Vec<u8> = (0..size).map(|k| (k as u32 ^ i) as u8).collect();
            let class = if i % 3 == 0 { "a" } else { "b" };
            std::fs::write(dir.join(class).join(format!("{i:03}.jpg")), bytes).unwrap();
        }
        Arc::new(Dataset::open_image_folder(dir).unwrap())
    }

    /// `n` samples of exactly `size` bytes each.
    fn uniform_dataset(dir: &std::path::Path, n: u32, size: usize) -> Dataset {
        std::fs::create_dir_all(dir.join("a")).unwrap();
        for i in 0..n {
            std::fs::write(
                dir.join("a").join(format!("{i:03}.jpg")),
                vec![i as u8; size],
            )
            .unwrap();
        }
        Dataset::open_image_folder(dir).unwrap()
    }

    /// Two ranks of eight samples, `prefetch` iterations ahead, one-iteration windows,
    /// buffered reads: the shape of the draining test below.
    fn pool_config(prefetch: usize) -> LoaderConfig {
        let mut c = LoaderConfig::default();
        (c.job.ranks_per_node, c.job.batch_size) = (2, 8);
        (c.budgets.prefetch_iterations, c.budgets.window_iterations) = (prefetch, 1);
        c.reads.direct = false;
        c
    }

    /// Worked out by hand from what the pool must hold, not from `pool_shape`'s code. Every
    /// sample is 16 KiB, so a buffered read asks 16 KiB + 1 byte (the byte that shows a
    /// grown file): 4 pages and a byte, 5 pages, whose power-of-two block is 8 pages,
    /// 32 KiB. Every block is the largest block. Two ranks of eight, one iteration ahead:
    /// 16 accesses may hold a block at once, plus two spare largest blocks, 18 blocks of
    /// 32 KiB = 589,824 bytes, already whole largest blocks. (Forgetting the extra byte would
    /// give 16 KiB blocks, 294,912; not rounding to a power of two, 20 KiB blocks, 368,640.)
    #[test]
    fn the_pool_of_same_size_samples_holds_every_access_in_the_block_its_read_takes_and_two_spare()
    {
        let dir = tempfile::tempdir().unwrap();
        let ds = uniform_dataset(dir.path(), 8, 16 << 10);
        let (budget, largest_read) = pool_shape(&pool_config(1), &ds, 0);
        assert_eq!(
            largest_read, 16_385,
            "the sample and the byte that shows growth"
        );
        assert_eq!(budget, 589_824);
        // Two iterations ahead: 32 accesses + 2 spare = 34 blocks of 32 KiB.
        assert_eq!(pool_shape(&pool_config(2), &ds, 0).0, 1_114_112);
    }

    /// Whatever the prefetch depth, the budget is a whole number of largest blocks (so the
    /// largest read always finds a block once the pool is free), holds at least one, and grows
    /// as the planner may run further ahead: more accesses hold blocks at once. The largest
    /// block is worked out by hand: a 200 KiB sample reads 200 KiB + 1 byte, 51 pages, in a
    /// 64-page block, 256 KiB.
    #[test]
    fn the_pool_is_whole_largest_blocks_and_grows_with_the_prefetch_depth() {
        let dir = tempfile::tempdir().unwrap();
        let ds = dataset(dir.path());
        let largest_block: u64 = 256 << 10;
        let budgets: Vec<u64> = (1..=4)
            .map(|prefetch| pool_shape(&pool_config(prefetch), &ds, 0).0)
            .collect();
        for (prefetch, &budget) in (1..).zip(&budgets) {
            assert_eq!(budget % largest_block, 0, "prefetch {prefetch}: {budget}");
            assert!(budget >= largest_block, "prefetch {prefetch}: {budget}");
        }
        assert!(
            budgets.windows(2).all(|w| w[0] < w[1]),
            "the budget must grow with prefetch_iterations: {budgets:?}"
        );
    }

    /// The budget follows the mean block, not the largest: worked out by hand for this
    /// dataset, and below every access at the largest size. A loader whose window of large
    /// samples exceeds it still delivers every sample intact: reads wait for memory, the
    /// pipeline does not deadlock.
    #[test]
    fn the_pool_is_sized_by_mean_block_and_a_window_larger_than_it_still_drains() {
        let dir = tempfile::tempdir().unwrap();
        let ds = dataset(dir.path());
        let mut loader = LoaderBuilder::new(ds.clone())
            .world(1, 2, 0)
            .batch_size(8)
            .epochs(3)
            .cache(CachePolicy::None, 0)
            .io_depth(4)
            .decode_threads(2)
            .prefetch_iterations(1)
            .decode(|bytes: &[u8], meta: &SampleMeta| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                let id = meta.path.file_stem().unwrap().to_str().unwrap();
                let id: u32 = id.parse().unwrap();
                let ok = bytes
                    .iter()
                    .enumerate()
                    .all(|(k, &b)| b == (k as u32 ^ id) as u8);
                if ok {
                    Ok(bytes.len())
                } else {
                    Err(format!("sample {id}: bytes differ"))
                }
            })
            .build()
            .unwrap();
        // By hand from what the pool must hold: 32 samples of 200 KiB read 200 KiB + 1 byte,
        // 51 pages, in 64-page (256 KiB) blocks; 32 of 1 KiB read 1 KiB + 1 byte in one-page
        // (4 KiB) blocks. Mean block (32 * 256 + 32 * 4) / 64 = 130 KiB. Two ranks of eight,
        // one iteration ahead: 16 accesses * 130 KiB = 2,080 KiB, plus two spare 256 KiB
        // blocks = 2,592 KiB = 10.125 largest blocks, rounded up to 11: 2,816 KiB. (Sized by
        // the largest block instead, it would be 18 blocks, 4,608 KiB.)
        let budget = pool_shape(loader.config(), &ds, 0).0;
        assert_eq!(budget, 2_883_584);
        assert!(
            budget < 2 * 8 * (200 << 10),
            "a window of large samples must not fit, or the test proves nothing"
        );
        assert_eq!(drain(&mut loader), 3 * 64);
        // The same through the dispatcher alone: its reads wait for pool memory, none fails.
        let mut loader = LoaderBuilder::new(ds.clone())
            .config(loader.config().clone())
            .resident_reads(crate::config::ResidentReads::Dispatcher)
            .decode(|bytes: &[u8], _meta: &SampleMeta| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                Ok::<_, std::io::Error>(bytes.len())
            })
            .build()
            .unwrap();
        assert_eq!(pool_shape(loader.config(), &ds, 0).0, budget);
        assert_eq!(drain(&mut loader), 3 * 64);
    }

    /// Every rank's samples, each batch unwrapped.
    fn drain(loader: &mut Loader<usize>) -> usize {
        let handles = loader.ranks().unwrap();
        std::thread::scope(|s| {
            let threads: Vec<_> = handles
                .into_iter()
                .map(|h| s.spawn(move || h.map(|b| b.unwrap().samples.len()).sum::<usize>()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        })
    }
}
