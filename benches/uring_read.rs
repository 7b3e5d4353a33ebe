//! Per-read cost of the lobster-uring reader against `FileExt::read_at` for 4 KiB
//! page-cache hits, on both backends, through a caller-driven `Session` (its own ring on
//! io_uring, the reader's pread workers on the fallback); ends with a plain ratio table
//! measured in the same run.
//!
//! `cargo bench -p lobster-benches --bench uring_read`

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use lobster_uring::{Backend, OpenOptions, ReadRequest, Reader, Session};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const FILE_BYTES: u64 = 64 << 20;
const BS: usize = 4096;
const DEPTH: usize = 32;

/// Random block-aligned reads of the bench file.
struct Offsets(StdRng);

impl Offsets {
    fn new(seed: u64) -> Offsets {
        Offsets(StdRng::seed_from_u64(seed))
    }

    fn offset(&mut self) -> u64 {
        self.0.gen_range(0..FILE_BYTES / BS as u64) * BS as u64
    }

    /// A read of one block at a random offset of `file`.
    fn request(&mut self, file: lobster_uring::FileId, tag: u64) -> ReadRequest {
        ReadRequest {
            file,
            offset: self.offset(),
            len: BS,
            class: 0,
            tag,
        }
    }
}

/// A file written just now, so its pages are in the page cache.
struct TestFile(PathBuf);

impl TestFile {
    fn new() -> TestFile {
        let path = std::env::temp_dir().join(format!("lobster-uring-bench-{}", std::process::id()));
        let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + 3) as u8).collect();
        let mut data = Vec::with_capacity(FILE_BYTES as usize);
        while (data.len() as u64) < FILE_BYTES {
            data.extend_from_slice(&chunk);
        }
        std::fs::write(&path, &data).expect("writing the bench file");
        let file = File::open(&path).unwrap();
        let mut buf = vec![0; 1 << 20];
        for off in (0..FILE_BYTES).step_by(1 << 20) {
            file.read_at(&mut buf, off).unwrap(); // warm
        }
        TestFile(path)
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn reader(backend: Backend) -> Reader {
    Reader::builder()
        .backend(backend)
        .pread_threads(2)
        .classes(1, DEPTH)
        .pool_bytes(2 * DEPTH * lobster_uring::block_bytes(BS))
        .max_read_bytes(BS)
        .build()
        .expect("building the reader")
}

/// `n` reads with `read_at` into one buffer.
fn run_read_at(file: &File, rng: &mut Offsets, n: u64) -> Duration {
    let mut buf = vec![0u8; BS];
    let start = Instant::now();
    for _ in 0..n {
        file.read_at(&mut buf, rng.offset()).unwrap();
        black_box(&buf);
    }
    start.elapsed()
}

/// `n` reads through a session, `depth` in flight, resubmitted once per reap.
fn run_session(
    session: &mut Session,
    file: lobster_uring::FileId,
    rng: &mut Offsets,
    n: u64,
    depth: usize,
) -> Duration {
    let mut req = |tag| rng.request(file, tag);
    let start = Instant::now();
    let first = (depth as u64).min(n);
    let batch: Vec<_> = (0..first).map(&mut req).collect();
    session.submit_batch(&batch).unwrap();
    let (mut submitted, mut done) = (first, 0);
    let mut batch = Vec::with_capacity(depth);
    let mut completions = Vec::with_capacity(depth);
    while done < n {
        session.wait(1, &mut completions).unwrap();
        batch.clear();
        for c in completions.drain(..) {
            black_box(c.result.unwrap());
            done += 1;
            if submitted < n {
                batch.push(req(submitted));
                submitted += 1;
            }
        }
        session.submit_batch(&batch).unwrap();
    }
    start.elapsed()
}

fn bench(c: &mut Criterion, tf: &TestFile) {
    let file = File::open(&tf.0).unwrap();
    let mut group = c.benchmark_group("read_4k_page_cache");
    group.throughput(Throughput::Elements(1));
    let mut rng = Offsets::new(0x9e37_79b9_7f4a_7c15);
    group.bench_function("read_at", |b| {
        b.iter_custom(|n| run_read_at(&file, &mut rng, n))
    });
    for (name, backend) in [("uring", Backend::Uring), ("pread", Backend::Pread)] {
        let Ok(r) = std::panic::catch_unwind(|| reader(backend)) else {
            eprintln!("{name} backend unavailable, skipped");
            continue;
        };
        let id = r.open(&tf.0, OpenOptions::default()).unwrap();
        let mut session = r.session().unwrap();
        for depth in [1, DEPTH] {
            group.bench_function(format!("{name}_session_depth{depth}"), |b| {
                b.iter_custom(|n| run_session(&mut session, id, &mut rng, n, depth))
            });
        }
    }
    group.finish();
}

/// Median of five runs of 200,000 reads each, as ns per read.
fn median_ns(mut run: impl FnMut() -> Duration) -> f64 {
    const N: u64 = 200_000;
    let mut v: Vec<f64> = (0..5).map(|_| run().as_nanos() as f64 / N as f64).collect();
    v.sort_by(f64::total_cmp);
    v[2]
}

fn ratio_table(tf: &TestFile) {
    let file = File::open(&tf.0).unwrap();
    let mut rng = Offsets::new(42);
    let base = median_ns(|| run_read_at(&file, &mut rng, 200_000));
    println!("\nper-read cost, 4 KiB page-cache hits (median of 5 x 200k reads)");
    println!(
        "{:<22} {:>10} {:>16}",
        "path", "ns/read", "ratio to read_at"
    );
    println!("{:<22} {:>10.0} {:>16.2}", "FileExt::read_at", base, 1.0);
    for (name, backend) in [("uring", Backend::Uring), ("pread", Backend::Pread)] {
        let Ok(r) = std::panic::catch_unwind(|| reader(backend)) else {
            continue;
        };
        let id = r.open(&tf.0, OpenOptions::default()).unwrap();
        let mut session = r.session().unwrap();
        for depth in [1, DEPTH] {
            let ns = median_ns(|| run_session(&mut session, id, &mut rng, 200_000, depth));
            println!(
                "{:<22} {:>10.0} {:>16.2}",
                format!("{name} session depth {depth}"),
                ns,
                ns / base
            );
        }
    }
}

fn main() {
    // One file (64 MiB written and read into the page cache) for both.
    let tf = TestFile::new();
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, &tf);
    c.final_summary();
    ratio_table(&tf);
}
