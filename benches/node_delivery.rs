//! Per-batch delivery cost across processes: a host in another process (this bench run
//! again with `LOBSTER_BENCH_HOST` set) places each batch of 16 decoded 224x224x3 images in
//! the shared arena, and this process, as the node's one rank, asks for it, waits, and
//! touches every image in place; against taking the same batches from the in-process
//! `RankHandle`. Between batches the rank sleeps 1 ms outside the timed region, so the loader
//! is ahead and what is timed is delivery, not loading. Ends with the median and p99 in
//! microseconds of each, measured in the same run.
//!
//! `cargo bench -p lobster-benches --bench node_delivery`

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use lobster_io::{Dataset, Loader, LoaderBuilder, LoaderConfig};
use lobster_node::{fingerprint, HostOptions, NodeEnv, NodeHost, NodeRank};

const BATCH: usize = 16;
const IMAGE_BYTES: usize = 224 * 224 * 3;
const SEED: u64 = 1;
/// Outside the timed region: lets the loader get ahead of the rank.
const BETWEEN: Duration = Duration::from_millis(1);

fn config() -> LoaderConfig {
    LoaderConfig {
        job: lobster_io::JobConfig {
            batch_size: BATCH,
            // Far more batches than the bench takes; the loader stops when dropped.
            epochs: 1_000_000,
            ..Default::default()
        },
        ..LoaderConfig::default()
    }
}

fn dataset(dir: &Path) -> Arc<Dataset> {
    let options = lobster_io::FolderOptions {
        table_dir: None,
        ..Default::default()
    };
    Arc::new(Dataset::open_folder(dir, &options).expect("the bench dataset"))
}

/// Every sample decodes to a 224x224x3 image of its id's byte.
fn loader(ds: &Arc<Dataset>) -> Loader<Vec<u8>> {
    LoaderBuilder::new(ds.clone())
        .config(config())
        .seed(SEED)
        .decode(|_: &[u8], meta| Ok::<_, std::io::Error>(vec![meta.id as u8; IMAGE_BYTES]))
        .build()
        .expect("the bench loader")
}

fn env(job: &str) -> NodeEnv {
    NodeEnv::new(0, 1, 0, 1, 0, 1, job).expect("a one-rank node")
}

/// The host process: serves until the rank goes away.
fn host(job: &str, dir: &Path) {
    let ds = dataset(dir);
    let options = HostOptions {
        slots_per_rank: 3,
        slot_bytes: (BATCH * IMAGE_BYTES) as u64,
        attach_timeout: Duration::from_secs(60),
    };
    let host = NodeHost::start(
        &env(job),
        loader(&ds),
        fingerprint(&ds, &config(), SEED),
        options,
    )
    .expect("starting the host");
    // The rank leaving before the last batch ends the host with an error: expected here.
    let _ = host.wait();
}

/// Times each of `iters` batches from `next`, which returns the batch's first bytes per
/// image (touched), recording each duration in `all`.
fn timed(iters: u64, all: &mut Vec<Duration>, mut next: impl FnMut() -> u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        std::thread::sleep(BETWEEN);
        let started = Instant::now();
        black_box(next());
        let took = started.elapsed();
        all.push(took);
        total += took;
    }
    total
}

fn percentile_us(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e6
}

fn main() {
    if let Ok(job) = std::env::var("LOBSTER_BENCH_HOST") {
        let dir = std::env::var("LOBSTER_BENCH_DATA").expect("LOBSTER_BENCH_DATA");
        host(&job, Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    for i in 0..64u32 {
        let class = dir.path().join(format!("c{}", i % 2));
        std::fs::create_dir_all(&class).expect("a class directory");
        std::fs::write(class.join(format!("{i:03}.jpg")), [i as u8; 64]).expect("a sample");
    }
    let ds = dataset(dir.path());
    let job = format!("bench-{}", std::process::id());
    let mut child = std::process::Command::new(std::env::current_exe().expect("this bench"))
        .env("LOBSTER_BENCH_HOST", &job)
        .env("LOBSTER_BENCH_DATA", dir.path())
        .spawn()
        .expect("starting the host process");
    let mut rank = NodeRank::attach(
        &env(&job),
        fingerprint(&ds, &config(), SEED),
        Duration::from_secs(60),
    )
    .expect("attaching to the host");
    let mut in_process = loader(&ds);
    let mut handle = in_process.ranks().expect("handles").remove(0);

    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let (mut across, mut within) = (Vec::new(), Vec::new());
    let mut g = c.benchmark_group("batch of 16 x 224x224x3 u8");
    g.bench_function("across processes (lobster-node)", |b| {
        b.iter_custom(|iters| {
            timed(iters, &mut across, || {
                let batch = rank.next().expect("a batch").expect("delivered");
                (0..batch.samples.len())
                    .map(|i| u64::from(batch.bytes(i)[IMAGE_BYTES / 2]))
                    .sum()
            })
        })
    });
    g.bench_function("in-process RankHandle", |b| {
        b.iter_custom(|iters| {
            timed(iters, &mut within, || {
                let batch = handle.next().expect("a batch").expect("delivered");
                batch
                    .samples
                    .iter()
                    .map(|s| u64::from(s.value[IMAGE_BYTES / 2]))
                    .sum()
            })
        })
    });
    g.finish();
    c.final_summary();
    drop(rank);
    let _ = child.wait();
    if across.is_empty() || within.is_empty() {
        return;
    }
    println!(
        "\n{:<36} {:>10} {:>10} {:>8}",
        "per batch (16 x 224x224x3 u8)", "median us", "p99 us", "batches"
    );
    for (name, v) in [
        ("across processes (lobster-node)", &mut across),
        ("in-process RankHandle", &mut within),
    ] {
        let n = v.len();
        let (med, p99) = (percentile_us(v, 0.5), percentile_us(v, 0.99));
        println!("{name:<36} {med:>10.1} {p99:>10.1} {n:>8}");
    }
}
