//! `lobster-bench read-bench`: random aligned reads through the lobster-uring reader, as the
//! loader reads: caller-driven sessions (`--threads` threads, each with its own ring, or on the
//! pread backend its own share of the reader's pread workers); `--by-path` reads the files
//! of a directory by path (opened, read and closed per read).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use lobster_uring::{Backend, FileId, OpenOptions, PathRead, ReadRequest, Reader, Session};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Debug, Args)]
pub struct ReadBenchArgs {
    /// File to read (a few GiB, larger than the page cache share you want to avoid); with
    /// `--by-path`, a directory of sample files.
    #[arg(long)]
    file: PathBuf,
    /// Block size, e.g. 4k, 128k, 1m (bytes without suffix); offsets are multiples of it.
    /// With `--by-path`: each read takes the first `bs` bytes of its file (all of a smaller
    /// file).
    #[arg(long, value_parser = parse_size)]
    bs: usize,
    /// Reads in flight per thread (the io_depth of its class).
    #[arg(long)]
    depth: usize,
    /// Open with O_DIRECT (bypass the page cache).
    #[arg(long)]
    direct: bool,
    /// How long to run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Backend (auto honours LOBSTER_IO).
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// This many threads, each with its own session (ring) that it submits to and reaps
    /// itself, `--depth` reads in flight each (like fio's numjobs), as one class (rank) per
    /// thread.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Read the files of the directory `--file` by path (`Session::submit_path`: each read
    /// opens its file, reads it and closes it), a random file per read.
    #[arg(long)]
    by_path: bool,
    /// In sessions: hand new reads to the kernel after every N completions processed
    /// (like fio's iodepth_batch_submit; 1 keeps a device busiest), 0: once per reap.
    /// Page-cache hits are copied during the submit system call, so batching them saves a
    /// system call per read; O_DIRECT reads gain from reaching the device early.
    #[arg(long, default_value_t = 0)]
    submit_batch: usize,
    /// Set IOSQE_ASYNC: the kernel's workers copy page-cache hits.
    #[arg(long)]
    async_punt: bool,
    /// Threads of the pread backend, shared by the sessions (default: threads x depth, at
    /// most 1024).
    #[arg(long)]
    pread_threads: Option<usize>,
    /// Seed of the offset generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object (mb_per_s, iops, p50_us, p99_us, ...).
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim().to_ascii_lowercase();
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = match &s[digits.len()..] {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?}")),
    };
    let n: usize = digits.parse().map_err(|e| format!("{s:?}: {e}"))?;
    match n.checked_mul(unit) {
        Some(v) if v > 0 => Ok(v),
        _ => Err(format!("{s:?}: size must be positive and fit in usize")),
    }
}

/// Latency histogram in 0.1 µs steps up to 100 ms (bounded memory), plus an overflow count.
struct Histogram {
    buckets: Vec<u64>,
    count: u64,
}

const STEPS_PER_US: u64 = 10;
const MAX_US: u64 = 100_000;

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: vec![0; (MAX_US * STEPS_PER_US) as usize + 1],
            count: 0,
        }
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
    }

    fn record(&mut self, d: Duration) {
        let step = (d.as_nanos() as u64 * STEPS_PER_US / 1000).min(MAX_US * STEPS_PER_US);
        self.buckets[step as usize] += 1;
        self.count += 1;
    }

    /// The latency below which a fraction `q` of reads fell, in µs.
    fn quantile_us(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (step, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return step as f64 / STEPS_PER_US as f64;
            }
        }
        MAX_US as f64
    }
}

pub fn run(args: &ReadBenchArgs) -> anyhow::Result<()> {
    if args.depth == 0 {
        bail!("--depth must be at least 1");
    }
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let backend = args.backend;
    if args.by_path {
        let files = list_files(&args.file, args.bs)?;
        return run_sessions(args, backend, Targets::Paths(files));
    }
    let size = std::fs::metadata(&args.file)
        .with_context(|| format!("reading the size of {}", args.file.display()))?
        .len();
    let blocks = size / args.bs as u64;
    if blocks == 0 {
        bail!(
            "{} is smaller than one block of {} bytes",
            args.file.display(),
            args.bs
        );
    }
    run_sessions(args, backend, Targets::Blocks { file: None, blocks })
}

/// Most files `--by-path` lists (each costs a path in memory).
const MAX_FILES: usize = 1 << 20;

/// The regular files of `dir` and the bytes a read of each takes (its size, at most `bs`).
fn list_files(dir: &Path, bs: usize) -> anyhow::Result<Vec<(Arc<Path>, usize)>> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let meta = entry.metadata()?;
        if !meta.is_file() || meta.len() == 0 {
            continue;
        }
        if files.len() == MAX_FILES {
            bail!("{} holds more than {MAX_FILES} files", dir.display());
        }
        let len = usize::try_from(meta.len()).unwrap_or(usize::MAX).min(bs);
        files.push((Arc::from(entry.path()), len));
    }
    if files.is_empty() {
        bail!("{} holds no non-empty regular file", dir.display());
    }
    Ok(files)
}

/// What session threads read: random blocks of one file, or random files by path.
enum Targets {
    Blocks { file: Option<FileId>, blocks: u64 },
    Paths(Vec<(Arc<Path>, usize)>),
}

/// Reads to hand to a session, of one kind.
enum Batch {
    Blocks(Vec<ReadRequest>),
    Paths(Vec<PathRead>),
}

impl Batch {
    fn new(targets: &Targets, capacity: usize) -> Batch {
        match targets {
            Targets::Blocks { .. } => Batch::Blocks(Vec::with_capacity(capacity)),
            Targets::Paths(_) => Batch::Paths(Vec::with_capacity(capacity)),
        }
    }

    /// Adds a read of a random target, tagged `slot`, for class `class`.
    fn push(
        &mut self,
        targets: &Targets,
        args: &ReadBenchArgs,
        rng: &mut StdRng,
        slot: usize,
        class: usize,
    ) {
        let tag = slot as u64;
        match (self, targets) {
            (
                Batch::Blocks(v),
                Targets::Blocks {
                    file: Some(file),
                    blocks,
                },
            ) => v.push(ReadRequest {
                file: *file,
                offset: rng.gen_range(0..*blocks) * args.bs as u64,
                len: args.bs,
                class,
                tag,
            }),
            (Batch::Paths(v), Targets::Paths(files)) => {
                let (path, len) = &files[rng.gen_range(0..files.len())];
                v.push(PathRead {
                    path: path.clone(),
                    dir: None,
                    direct: args.direct,
                    offset: 0,
                    len: *len,
                    to_eof: false,
                    class,
                    tag,
                });
            }
            _ => unreachable!("a batch is made for its targets, with the file open"),
        }
    }

    fn len(&self) -> usize {
        match self {
            Batch::Blocks(v) => v.len(),
            Batch::Paths(v) => v.len(),
        }
    }

    /// Submits and empties the batch; the pool is sized for every read in flight, so none
    /// may wait.
    fn submit_all(&mut self, session: &mut Session) -> anyhow::Result<()> {
        let (submitted, len) = match self {
            Batch::Blocks(v) => (session.submit_batch(v)?, v.len()),
            Batch::Paths(v) => (session.submit_path_batch(v)?, v.len()),
        };
        if submitted != len {
            bail!("the session refused reads with buffers to spare");
        }
        match self {
            Batch::Blocks(v) => v.clear(),
            Batch::Paths(v) => v.clear(),
        }
        Ok(())
    }
}

/// Pool bytes for `reads` reads of `bs` bytes, each taking a power-of-two block of pages.
fn pool_bytes(reads: usize, bs: usize) -> usize {
    reads.saturating_mul(lobster_uring::block_bytes(bs))
}

fn open(reader: &Reader, args: &ReadBenchArgs) -> anyhow::Result<lobster_uring::FileId> {
    reader
        .open(
            &args.file,
            OpenOptions {
                direct: args.direct,
            },
        )
        .context("opening the file")
}

/// `--threads N`: N threads, each driving its own session with `--depth` reads in flight.
fn run_sessions(
    args: &ReadBenchArgs,
    backend: Backend,
    mut targets: Targets,
) -> anyhow::Result<()> {
    let ring_entries = args.depth.next_power_of_two().max(8) as u32;
    // A read by path holds up to three operations in the ring (open, read, close).
    let ring_entries = if args.by_path {
        ring_entries * 4
    } else {
        ring_entries
    };
    let pread_threads = args.threads.saturating_mul(args.depth);
    let reader = Reader::builder()
        .backend(backend)
        .ring_entries(ring_entries)
        .async_punt(args.async_punt)
        .pread_threads(args.pread_threads.unwrap_or(pread_threads).min(1024))
        .classes(args.threads, args.depth)
        .queue_capacity(args.depth)
        .pool_bytes(pool_bytes(args.threads * (args.depth + 2), args.bs))
        .max_read_bytes(args.bs)
        .build()
        .context("building the reader")?;
    if let Targets::Blocks { file, .. } = &mut targets {
        *file = Some(open(&reader, args)?);
    }
    let targets = &targets;
    let begin = Instant::now();
    let deadline = begin + Duration::from_secs_f64(args.seconds);
    let results = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.threads)
            .map(|thread| {
                let reader = &reader;
                scope.spawn(move || -> anyhow::Result<(Histogram, u64, Instant)> {
                    let mut session = reader.session().context("starting a session")?;
                    let mut rng = StdRng::seed_from_u64(args.seed.wrapping_add(thread as u64));
                    let mut started = vec![begin; args.depth];
                    let mut hist = Histogram::new();
                    let mut batch = Batch::new(targets, args.depth);
                    let mut done = Vec::with_capacity(args.depth);
                    for slot in 0..args.depth {
                        batch.push(targets, args, &mut rng, slot, thread);
                    }
                    let mut bytes_read = 0u64;
                    let mut end = begin;
                    while batch.len() > 0 || session.pending() > 0 {
                        batch.submit_all(&mut session)?;
                        session.wait(1, &mut done)?;
                        let now = Instant::now();
                        for c in done.drain(..) {
                            let data = c.result.context("read failed")?;
                            let slot = c.tag as usize;
                            hist.record(now - started[slot]);
                            bytes_read += data.len() as u64;
                            if now < deadline {
                                started[slot] = now;
                                batch.push(targets, args, &mut rng, slot, thread);
                                if batch.len() == args.submit_batch {
                                    batch.submit_all(&mut session)?;
                                }
                            }
                        }
                        end = now;
                    }
                    Ok((hist, bytes_read, end))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("read-bench thread panicked"))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let mut hist = Histogram::new();
    let mut bytes_read = 0;
    let mut end = begin;
    for (h, b, e) in &results {
        hist.merge(h);
        bytes_read += b;
        end = end.max(*e);
    }
    report(args, &hist, bytes_read, end - begin, reader.backend())
}

/// The mode's name in the report.
fn mode(args: &ReadBenchArgs) -> &'static str {
    if args.by_path {
        "by-path"
    } else {
        "sessions"
    }
}

fn report(
    args: &ReadBenchArgs,
    hist: &Histogram,
    bytes_read: u64,
    elapsed: Duration,
    info: &lobster_uring::BackendInfo,
) -> anyhow::Result<()> {
    let secs = elapsed.as_secs_f64();
    let mb_per_s = bytes_read as f64 / secs / 1e6;
    let iops = hist.count as f64 / secs;
    let (p50, p99) = (hist.quantile_us(0.50), hist.quantile_us(0.99));
    let backend_name = format!("{:?}", info.active).to_lowercase();
    if args.json {
        let out = serde_json::json!({
            "mb_per_s": mb_per_s,
            "iops": iops,
            "p50_us": p50,
            "p99_us": p99,
            "backend": backend_name,
            "threads": args.threads,
            "mode": mode(args),
            "direct_descriptors": info.direct_descriptors,
            "bs": args.bs,
            "depth": args.depth,
            "direct": args.direct,
            "seconds": secs,
            "reads": hist.count,
        });
        println!("{out}");
    } else {
        println!(
            "read-bench {}: backend {} ({}), {} {}, bs {} depth {}{}",
            args.file.display(),
            backend_name,
            info.reason,
            args.threads,
            match mode(args) {
                "by-path" => "thread(s) each reading files by path on a session",
                _ => "thread(s) each driving a session",
            },
            args.bs,
            args.depth,
            if args.direct { " O_DIRECT" } else { "" }
        );
        println!(
            "{mb_per_s:.1} MB/s, {iops:.0} IOPS, p50 {p50:.1} us, p99 {p99:.1} us ({} reads in {secs:.2} s)",
            hist.count
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("128KiB"), Ok(128 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("0").is_err());
        assert!(parse_size("4q").is_err());
    }

    #[test]
    fn quantiles_follow_a_reference_sort() {
        let mut h = Histogram::new();
        let mut rng = StdRng::seed_from_u64(3);
        let mut all: Vec<u64> = (0..10_000).map(|_| rng.gen_range(1..5_000_000)).collect();
        for &ns in &all {
            h.record(Duration::from_nanos(ns));
        }
        all.sort_unstable();
        for q in [0.5, 0.9, 0.99] {
            let reference_us = all[(q * all.len() as f64).ceil() as usize - 1] as f64 / 1000.0;
            assert!((h.quantile_us(q) - reference_us).abs() <= 0.1, "q {q}");
        }
    }
}
