//! lobster-uring's `Session` against tokio-uring on the same reads, one JSON line per run.
//!
//! Cases, on a file set generated once in `--dir`:
//! - `direct-4k`: O_DIRECT 4 KiB reads at random aligned offsets of one large file;
//! - `direct-128k`: O_DIRECT 128 KiB reads, likewise;
//! - `cached-128k`: buffered 128 KiB reads of the same file, warmed into the page cache first;
//! - `path`: by path, one small file per read, each opened, read whole and closed (buffered,
//!   warm); lobster opens in the held parent directory, as the engine does;
//! - `path-nodir`: the same, lobster opening by full path as tokio-uring must;
//! - `crc`: no reads, the CPU cost of the check alone (both engines pay it on every byte).
//!
//! Both engines run `--depth` reads in flight on one thread, read the same ranges in the same
//! order, and check every read's CRC32 against the one recorded when the data was written.
//!
//! `cargo run --release -- --engine lobster --case direct-4k [--dir D] [--reads N]`

use std::cell::{Cell, RefCell};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lobster_uring::{
    block_bytes, ActiveBackend, Backend, OpenOptions, PathRead, ReadRequest, Reader, Session,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio_uring::buf::fixed::FixedBufRegistry;
use tokio_uring::buf::{IoBuf, IoBufMut};

const SMALL_BLOCK_BYTES: usize = 4 << 10;
const LARGE_BLOCK_BYTES: usize = 128 << 10;
const ALIGN_BYTES: usize = 4096;

#[derive(Clone, Debug)]
struct Args {
    dir: PathBuf,
    engine: String,
    form: String,
    case: String,
    depth: usize,
    reads: Option<usize>,
    large_mib: usize,
    files: usize,
    file_kib: usize,
    seed: u64,
}

fn parse_args() -> Result<Args> {
    let tmp = std::env::temp_dir();
    let mut a = Args {
        dir: tmp.join("lobster-tokio-uring-bench"),
        engine: "lobster".into(),
        form: "fixed".into(),
        case: "direct-4k".into(),
        depth: 32,
        reads: None,
        large_mib: 1024,
        files: 4000,
        file_kib: 100,
        seed: 0x9e37_79b9_7f4a_7c15,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => a.dir = value()?.into(),
            "--engine" => a.engine = value()?,
            "--form" => a.form = value()?,
            "--case" => a.case = value()?,
            "--depth" => a.depth = value()?.parse()?,
            "--reads" => a.reads = Some(value()?.parse()?),
            "--large-mib" => a.large_mib = value()?.parse()?,
            "--files" => a.files = value()?.parse()?,
            "--file-kib" => a.file_kib = value()?.parse()?,
            "--seed" => a.seed = value()?.parse()?,
            "-h" | "--help" => {
                println!(
                    "flags: --dir D --engine lobster|tokio-uring --form workers|unordered|fixed \
                     --case direct-4k|direct-128k|cached-128k|path|path-nodir|crc|gen \
                     --depth 32 --reads N --large-mib 1024 --files 4000 --file-kib 100"
                );
                std::process::exit(0);
            }
            _ => bail!("unknown flag {flag}"),
        }
    }
    ensure!(a.depth > 0, "--depth must be positive");
    Ok(a)
}

/// Deterministic file content: a xorshift64* stream per seed.
fn fill(seed: u64, out: &mut [u8]) {
    let mut x = seed | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

fn write_u32s(path: &Path, v: &[u32]) -> Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn read_u32s(path: &Path) -> Result<Vec<u32>> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

/// The file set and the CRC32 of every block a read can ask for.
struct Data {
    large: PathBuf,
    large_bytes: u64,
    crc_small: Vec<u32>,
    crc_large: Vec<u32>,
    files_dir: PathBuf,
    files: Vec<Arc<Path>>,
    file_bytes: usize,
    crc_files: Vec<u32>,
}

impl Data {
    /// Generates the set unless `dir` holds one made with the same parameters.
    fn open_or_generate(args: &Args) -> Result<Data> {
        let dir = &args.dir;
        let stamp = format!("{} {} {}\n", args.large_mib, args.files, args.file_kib);
        let ready = dir.join("ready");
        let files_dir = dir.join("files");
        if fs::read_to_string(&ready).ok().as_deref() != Some(stamp.as_str()) {
            let _ = fs::remove_dir_all(dir);
            fs::create_dir_all(&files_dir)?;
            generate(args, dir, &files_dir)?;
            fs::write(&ready, &stamp)?;
        }
        let file_bytes = args.file_kib << 10;
        Ok(Data {
            large: dir.join("large.bin"),
            large_bytes: (args.large_mib as u64) << 20,
            crc_small: read_u32s(&dir.join("large.crc4k"))?,
            crc_large: read_u32s(&dir.join("large.crc128k"))?,
            files: (0..args.files)
                .map(|i| Arc::from(files_dir.join(format!("f{i:05}.bin"))))
                .collect(),
            files_dir,
            file_bytes,
            crc_files: read_u32s(&dir.join("files.crc"))?,
        })
    }
}

fn generate(args: &Args, dir: &Path, files_dir: &Path) -> Result<()> {
    eprintln!("generating the file set in {}", dir.display());
    let mut out = fs::File::create(dir.join("large.bin"))?;
    let mut chunk = vec![0u8; LARGE_BLOCK_BYTES];
    let (mut crc_small, mut crc_large) = (Vec::new(), Vec::new());
    for i in 0..(args.large_mib << 20) / LARGE_BLOCK_BYTES {
        fill(args.seed ^ (i as u64).wrapping_mul(0x1000_0001), &mut chunk);
        crc_large.push(crc32fast::hash(&chunk));
        crc_small.extend(chunk.chunks(SMALL_BLOCK_BYTES).map(crc32fast::hash));
        out.write_all(&chunk)?;
    }
    out.sync_all()?;
    write_u32s(&dir.join("large.crc4k"), &crc_small)?;
    write_u32s(&dir.join("large.crc128k"), &crc_large)?;
    let mut crc_files = Vec::new();
    let mut content = vec![0u8; args.file_kib << 10];
    for i in 0..args.files {
        fill(
            !args.seed ^ (i as u64).wrapping_mul(0x2000_0003),
            &mut content,
        );
        crc_files.push(crc32fast::hash(&content));
        fs::write(files_dir.join(format!("f{i:05}.bin")), &content)?;
    }
    write_u32s(&dir.join("files.crc"), &crc_files)
}

/// One case's reads: for file cases, offsets into the large file; for path cases, file
/// indices. Each read's expected CRC is `crc[index]`.
struct Plan {
    direct: bool,
    by_path: bool,
    use_dir: bool,
    len: usize,
    /// Per read: the block (file cases) or file (path cases) index.
    index: Vec<usize>,
}

impl Plan {
    fn new(args: &Args, data: &Data) -> Result<Plan> {
        let mut rng = StdRng::seed_from_u64(args.seed);
        let blocks = |len: usize| (data.large_bytes / len as u64) as usize;
        let random = |rng: &mut StdRng, n: usize, range: usize| {
            (0..n).map(|_| rng.gen_range(0..range)).collect::<Vec<_>>()
        };
        let (direct, by_path, use_dir, len, n) = match args.case.as_str() {
            "direct-4k" => (true, false, false, SMALL_BLOCK_BYTES, 200_000),
            "direct-128k" => (true, false, false, LARGE_BLOCK_BYTES, 16_000),
            "cached-128k" => (false, false, false, LARGE_BLOCK_BYTES, 80_000),
            "path" => (false, true, true, data.file_bytes, 10 * data.files.len()),
            "path-nodir" => (false, true, false, data.file_bytes, 10 * data.files.len()),
            other => bail!("unknown case {other}"),
        };
        let n = args.reads.unwrap_or(n);
        let index = if by_path {
            // Whole passes over the files, each in its own random order.
            let mut order = Vec::with_capacity(n);
            let mut pass: Vec<usize> = (0..data.files.len()).collect();
            while order.len() < n {
                pass.shuffle(&mut rng);
                order.extend(pass.iter().take(n - order.len()));
            }
            order
        } else {
            random(&mut rng, n, blocks(len))
        };
        Ok(Plan {
            direct,
            by_path,
            use_dir,
            len,
            index,
        })
    }

    fn offset(&self, i: usize) -> u64 {
        if self.by_path {
            0
        } else {
            (self.index[i] * self.len) as u64
        }
    }

    fn crcs<'a>(&self, data: &'a Data) -> &'a [u32] {
        match (self.by_path, self.len) {
            (true, _) => &data.crc_files,
            (false, SMALL_BLOCK_BYTES) => &data.crc_small,
            _ => &data.crc_large,
        }
    }
}

/// What every run adds up, the same for both engines when both read right.
#[derive(Default, Debug)]
struct Totals {
    reads: u64,
    bytes: u64,
    crc_sum: u64,
}

impl Totals {
    /// Checks read `i`'s bytes against the recorded CRC.
    fn check(&mut self, plan: &Plan, crcs: &[u32], i: usize, bytes: &[u8]) {
        assert_eq!(bytes.len(), plan.len, "read {i}: {} bytes", bytes.len());
        let crc = crc32fast::hash(bytes);
        assert_eq!(
            crc, crcs[plan.index[i]],
            "read {i} (index {}): wrong bytes",
            plan.index[i]
        );
        self.reads += 1;
        self.bytes += bytes.len() as u64;
        self.crc_sum = self.crc_sum.wrapping_add(crc as u64);
    }
}

/// User plus system CPU seconds of this process (its threads, and the kernel's io_uring
/// workers, which belong to it).
fn cpu_s() -> f64 {
    // SAFETY: getrusage writes one `rusage` into the zeroed value we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Wall and CPU time of the measured part of a run.
struct Clock {
    wall: Instant,
    cpu_s: f64,
}

impl Clock {
    fn start() -> Clock {
        Clock {
            cpu_s: cpu_s(),
            wall: Instant::now(),
        }
    }

    /// (wall seconds, CPU seconds) since `start`.
    fn stop(&self) -> (f64, f64) {
        (self.wall.elapsed().as_secs_f64(), cpu_s() - self.cpu_s)
    }
}

fn report(args: &Args, form: &str, extra: &str, totals: &Totals, wall_s: f64, cpu_s: f64) {
    let gb = totals.bytes as f64 / 1e9;
    println!(
        "{{\"engine\":\"{}\",\"form\":\"{}\",\"case\":\"{}\",\"depth\":{},\"reads\":{},\
         \"bytes\":{},\"crc_sum\":{},\"wall_s\":{:.4},\"mb_per_s\":{:.1},\
         \"samples_per_s\":{:.0},\"cpu_s\":{:.4},\"cpu_s_per_gb\":{:.4}{}}}",
        args.engine,
        form,
        args.case,
        args.depth,
        totals.reads,
        totals.bytes,
        totals.crc_sum,
        wall_s,
        totals.bytes as f64 / 1e6 / wall_s,
        totals.reads as f64 / wall_s,
        cpu_s,
        cpu_s / gb,
        extra,
    );
}

/// Reads the large file once, buffered, so that `cached-128k` finds it in the page cache.
fn warm(path: &Path) -> Result<()> {
    let f = fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    loop {
        let n = f.read_at(&mut buf, off)?;
        if n == 0 {
            return Ok(());
        }
        off += n as u64;
    }
}

// ---- lobster-uring: a Session, driven as the engine drives it ----

fn run_lobster(args: &Args, data: &Data, plan: &Plan) -> Result<()> {
    // Whole files ask one byte more, as the engine does, to see a file that grew. The pool
    // holds every read in flight twice over, and at 8 MiB or less for 128 KiB reads it fits
    // a default RLIMIT_MEMLOCK, so it is registered (READ_FIXED) as the engine's would be.
    let read_len = if plan.by_path { plan.len + 1 } else { plan.len };
    let reader = Reader::builder()
        .backend(Backend::Uring)
        .classes(1, args.depth)
        .max_read_bytes(read_len.next_multiple_of(ALIGN_BYTES))
        .pool_bytes(2 * args.depth * block_bytes(read_len))
        .build()?;
    ensure!(
        reader.backend().active == ActiveBackend::Uring,
        "lobster-uring fell back to pread"
    );
    let info = reader.backend().clone();
    let mut session = reader.session()?;
    let (totals, clock) = if plan.by_path {
        lobster_by_path(args, data, plan, &mut session, read_len)?
    } else {
        lobster_ranges(args, data, plan, &reader, &mut session)?
    };
    let (wall_s, cpu_s) = clock.stop();
    let extra = format!(
        ",\"fixed_buffers\":{},\"direct_descriptors\":{}",
        session.fixed_buffers(),
        info.direct_descriptors
    );
    report(args, "session", &extra, &totals, wall_s, cpu_s);
    Ok(())
}

/// Reads every file of the plan by path, open, read and close linked, `args.depth` in flight,
/// queued without a system call (they reach the kernel with the next wait); the clock starts
/// with the first read.
fn lobster_by_path(
    args: &Args,
    data: &Data,
    plan: &Plan,
    session: &mut Session,
    read_len: usize,
) -> Result<(Totals, Clock)> {
    let crcs = plan.crcs(data);
    let n = plan.index.len();
    let mut totals = Totals::default();
    let mut done = Vec::with_capacity(args.depth);
    let (mut next, mut finished) = (0, 0);
    let dir = if plan.use_dir {
        Some(Arc::new(lobster_uring::open_dir(&data.files_dir)?))
    } else {
        None
    };
    let path_read = |i: usize| PathRead {
        path: data.files[plan.index[i]].clone(),
        dir: dir.clone(),
        direct: plan.direct,
        offset: 0,
        len: read_len,
        to_eof: true,
        class: 0,
        tag: i as u64,
    };
    let clock = Clock::start();
    while next < n.min(args.depth) {
        session.queue_path(path_read(next))?;
        next += 1;
    }
    while finished < n {
        session.wait(1, &mut done)?;
        for c in done.drain(..) {
            let i = c.tag as usize;
            totals.check(
                plan,
                crcs,
                i,
                &c.result.with_context(|| format!("read {i}"))?,
            );
            finished += 1;
            if next < n {
                session.queue_path(path_read(next))?;
                next += 1;
            }
        }
    }
    Ok((totals, clock))
}

/// Reads the plan's ranges of the large file, opened once, `args.depth` in flight, each
/// completion's replacement submitted with the others of its wait; the clock starts with the
/// first read.
fn lobster_ranges(
    args: &Args,
    data: &Data,
    plan: &Plan,
    reader: &Reader,
    session: &mut Session,
) -> Result<(Totals, Clock)> {
    let crcs = plan.crcs(data);
    let n = plan.index.len();
    let mut totals = Totals::default();
    let mut done = Vec::with_capacity(args.depth);
    let mut finished = 0;
    let file = reader.open(
        &data.large,
        OpenOptions {
            direct: plan.direct,
        },
    )?;
    let request = |i: usize| ReadRequest {
        file,
        offset: plan.offset(i),
        len: plan.len,
        class: 0,
        tag: i as u64,
    };
    let mut batch: Vec<ReadRequest> = (0..n.min(args.depth)).map(request).collect();
    let clock = Clock::start();
    ensure!(
        session.submit_batch(&batch)? == batch.len(),
        "a first read was refused"
    );
    let mut next = batch.len();
    while finished < n {
        session.wait(1, &mut done)?;
        batch.clear();
        for c in done.drain(..) {
            let i = c.tag as usize;
            totals.check(
                plan,
                crcs,
                i,
                &c.result.with_context(|| format!("read {i}"))?,
            );
            finished += 1;
            if next < n {
                batch.push(request(next));
                next += 1;
            }
        }
        ensure!(
            session.submit_batch(&batch)? == batch.len(),
            "a read was refused"
        );
    }
    Ok((totals, clock))
}

// ---- tokio-uring: File::open + read_at futures on tokio_uring::start ----

/// A page-aligned heap buffer (O_DIRECT wants aligned memory; Vec gives no such promise).
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    init: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (at least one page).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            len,
            init: len,
        }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1).next_multiple_of(ALIGN_BYTES), ALIGN_BYTES)
            .expect("buffer layout")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

// SAFETY: the pointer is to a heap block owned by the value: moving the value does not move
// the block, which lives until drop; `init <= len` bytes of it are initialized (all, as it is
// allocated zeroed).
unsafe impl IoBuf for AlignedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.init
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

// SAFETY: as for `IoBuf`; the block is writable and exclusively owned.
unsafe impl IoBufMut for AlignedBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    unsafe fn set_init(&mut self, pos: usize) {
        self.init = self.init.max(pos);
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `init` bytes from `ptr` are initialized and owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.init) }
    }
}

/// State the tokio-uring tasks share on their one thread.
struct Shared<'a> {
    plan: &'a Plan,
    data: &'a Data,
    next: Cell<usize>,
    totals: RefCell<Totals>,
}

impl Shared<'_> {
    fn take(&self) -> Option<usize> {
        let i = self.next.get();
        (i < self.plan.index.len()).then(|| {
            self.next.set(i + 1);
            i
        })
    }

    fn check(&self, i: usize, bytes: &[u8]) {
        let crcs = self.plan.crcs(self.data);
        self.totals.borrow_mut().check(self.plan, crcs, i, bytes);
    }

    fn open_options(&self) -> tokio_uring::fs::OpenOptions {
        let mut o = tokio_uring::fs::OpenOptions::new();
        o.read(true);
        if self.plan.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o
    }
}

/// One read of plan entry `i` into `buf`: of the open `file`, or by path (open, read, close).
async fn tokio_read(
    shared: &Shared<'_>,
    file: Option<&tokio_uring::fs::File>,
    i: usize,
    buf: AlignedBuf,
) -> Result<AlignedBuf> {
    let plan = shared.plan;
    match file {
        Some(f) => {
            let (res, buf) = f.read_exact_at(buf, plan.offset(i)).await;
            res.with_context(|| format!("read {i}"))?;
            Ok(buf)
        }
        None => {
            let path = &shared.data.files[plan.index[i]];
            let f = shared.open_options().open(path).await?;
            // One byte more than the file, as lobster asks: a short read says it ended.
            let (res, buf) = f.read_at(buf, 0).await;
            let n = res.with_context(|| format!("read {i}"))?;
            ensure!(n == plan.len, "read {i}: {n} bytes");
            f.close().await?;
            Ok(buf)
        }
    }
}

fn run_tokio(args: &Args, data: &Data, plan: &Plan) -> Result<()> {
    let buf_len = if plan.by_path { plan.len + 1 } else { plan.len };
    let shared = Shared {
        plan,
        data,
        next: Cell::new(0),
        totals: RefCell::new(Totals::default()),
    };
    let shared = &shared;
    let depth = args.depth;
    tokio_uring::start(async {
        let file = if plan.by_path {
            None
        } else {
            Some(shared.open_options().open(&data.large).await?)
        };
        let file = file.as_ref();
        let clock;
        match args.form.as_str() {
            // `depth` futures on this task, each buffer reused by the next read.
            "unordered" => {
                clock = Clock::start();
                let mut in_flight = FuturesUnordered::new();
                let start = |buf, in_flight: &mut FuturesUnordered<_>| {
                    if let Some(i) = shared.take() {
                        in_flight.push(async move { (i, tokio_read(shared, file, i, buf).await) });
                    }
                };
                for _ in 0..depth {
                    start(AlignedBuf::new(buf_len), &mut in_flight);
                }
                while let Some((i, buf)) = in_flight.next().await {
                    let buf = buf?;
                    shared.check(i, &buf[..plan.len]);
                    start(buf, &mut in_flight);
                }
            }
            // `depth` futures, each a loop over the next read with its own buffer, joined on
            // this task (tokio_uring::spawn needs 'static; join_all polls them all the same).
            "workers" => {
                clock = Clock::start();
                let workers = (0..depth).map(|_| async move {
                    let mut buf = AlignedBuf::new(buf_len);
                    while let Some(i) = shared.take() {
                        buf = tokio_read(shared, file, i, buf).await?;
                        shared.check(i, &buf[..plan.len]);
                    }
                    anyhow::Ok(())
                });
                for r in futures_util::future::join_all(workers).await {
                    r?;
                }
            }
            // As `workers`, with registered buffers (read_fixed_at), lobster's READ_FIXED.
            "fixed" => {
                let registry = FixedBufRegistry::new((0..depth).map(|_| AlignedBuf::new(buf_len)));
                registry.register()?;
                clock = Clock::start();
                let workers = (0..depth).map(|w| {
                    let registry = &registry;
                    async move {
                        let mut buf = registry.check_out(w).context("fixed buffer")?;
                        while let Some(i) = shared.take() {
                            let (n, b) = match file {
                                Some(f) => f.read_fixed_at(buf, plan.offset(i)).await,
                                None => {
                                    let path = &data.files[plan.index[i]];
                                    let f = shared.open_options().open(path).await?;
                                    let (n, b) = f.read_fixed_at(buf, 0).await;
                                    f.close().await?;
                                    (n, b)
                                }
                            };
                            let n = n.with_context(|| format!("read {i}"))?;
                            ensure!(n == plan.len, "read {i}: {n} bytes");
                            shared.check(i, &b[..n]);
                            buf = b;
                        }
                        anyhow::Ok(())
                    }
                });
                for r in futures_util::future::join_all(workers).await {
                    r?;
                }
            }
            other => bail!("unknown tokio-uring form {other}"),
        }
        let (wall_s, cpu_s) = clock.stop();
        report(args, &args.form, "", &shared.totals.borrow(), wall_s, cpu_s);
        anyhow::Ok(())
    })
}

/// The CPU cost of the CRC check alone, on 128 KiB in the CPU cache.
fn run_crc(args: &Args) {
    let mut buf = AlignedBuf::new(LARGE_BLOCK_BYTES);
    fill(args.seed, &mut buf_mut(&mut buf)[..]);
    let mut totals = Totals::default();
    let clock = Clock::start();
    for _ in 0..40_000 {
        let crc = crc32fast::hash(std::hint::black_box(&buf));
        totals.reads += 1;
        totals.bytes += buf.len() as u64;
        totals.crc_sum = totals.crc_sum.wrapping_add(crc as u64);
    }
    let (wall_s, cpu_s) = clock.stop();
    report(args, "crc32fast", "", &totals, wall_s, cpu_s);
}

fn buf_mut(buf: &mut AlignedBuf) -> &mut [u8] {
    // SAFETY: the block holds `len` initialized bytes, owned by `buf`, borrowed mutably.
    unsafe { std::slice::from_raw_parts_mut(buf.ptr.as_ptr(), buf.len) }
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let data = Data::open_or_generate(&args)?;
    match args.case.as_str() {
        "gen" => return Ok(()),
        "crc" => {
            run_crc(&args);
            return Ok(());
        }
        _ => {}
    }
    let plan = Plan::new(&args, &data)?;
    if args.case == "cached-128k" {
        warm(&data.large)?;
    }
    // The direct cases open O_DIRECT themselves; checked here so a file system without it
    // fails before either engine runs.
    if plan.direct {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&data.large)
            .context("O_DIRECT open")?;
    }
    match args.engine.as_str() {
        "lobster" => run_lobster(&args, &data, &plan),
        "tokio-uring" => run_tokio(&args, &data, &plan),
        other => bail!("unknown engine {other}"),
    }
}
