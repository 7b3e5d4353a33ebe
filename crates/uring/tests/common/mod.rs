//! Helpers shared by the reader's integration tests (each test crate uses a subset).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use lobster_uring::{
    Backend, Bytes, Completion, FileId, IoEvent, IoEventKind, ReadError, ReadRequest, Reader,
    ReaderBuilder, Session,
};
pub use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// A deterministic generator: the same seed gives the same test.
pub fn seeded_rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// A read range inside a file of `size` bytes: lengths from one byte to past 1 MiB (which
/// O_DIRECT splits), page multiples among them, and half the offsets page-aligned.
pub fn random_range(rng: &mut StdRng, size: usize) -> (u64, usize) {
    let len = match rng.gen_range(0..10) {
        0 => rng.gen_range(1..=2_500_000),
        1..=4 => 4096 * rng.gen_range(1..=32),
        _ => rng.gen_range(1..=200_000),
    };
    let mut offset = rng.gen_range(0..(size - len) as u64);
    if rng.gen_bool(0.5) {
        offset -= offset % 4096;
    }
    (offset, len)
}

/// Cuts the file at `path` to `len` bytes.
pub fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// `c` carries the bytes `data[offset..offset + len]` of its tag's `expected` range, and its
/// tag's class of `classes` (tags go round the classes).
pub fn check(
    c: &Completion,
    expected: &HashMap<u64, (u64, usize)>,
    data: &[u8],
    classes: u64,
    backend: Backend,
    direct: bool,
) {
    let (offset, len) = expected[&c.tag];
    assert_eq!(c.class, (c.tag % classes) as usize);
    let bytes = c
        .result
        .as_ref()
        .unwrap_or_else(|e| panic!("{backend:?} direct={direct}: {e}"));
    assert_eq!(bytes.len(), len);
    assert!(
        bytes[..] == data[offset as usize..offset as usize + len],
        "{backend:?} direct={direct}: bytes differ at offset {offset} len {len}"
    );
}

/// A directory on the target's file system (O_DIRECT needs a real one, not tmpfs).
pub fn test_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// A file of `size` pseudo-random bytes, and the bytes.
pub fn make_file(dir: &Path, name: &str, size: usize, seed: u64) -> (PathBuf, Vec<u8>) {
    let mut data = vec![0u8; size];
    seeded_rng(seed).fill_bytes(&mut data);
    let path = dir.join(name);
    std::fs::write(&path, &data).unwrap();
    (path, data)
}

/// The backends to test: both, unless this kernel cannot run io_uring (then said so).
pub fn backends() -> Vec<Backend> {
    match Reader::builder().backend(Backend::Uring).build() {
        Ok(_) => vec![Backend::Uring, Backend::Pread],
        Err(e) => {
            eprintln!("io_uring unavailable on this kernel, testing pread only: {e}");
            vec![Backend::Pread]
        }
    }
}

/// A builder for `backend` with 8 pread threads.
pub fn builder(backend: Backend) -> ReaderBuilder {
    Reader::builder().backend(backend).pread_threads(8)
}

/// A read of `len` bytes at `offset` of `file` for `class`, tagged `tag`.
pub fn req(file: FileId, offset: u64, len: usize, class: usize, tag: u64) -> ReadRequest {
    ReadRequest {
        file,
        offset,
        len,
        class,
        tag,
    }
}

/// Reads one range of `file` (class 0) through `session`, waiting for it.
pub fn read_one(
    session: &mut Session,
    file: FileId,
    offset: u64,
    len: usize,
) -> Result<Bytes, ReadError> {
    session.submit(req(file, offset, len, 0, 9))?;
    let mut done = Vec::new();
    session.wait(1, &mut done)?;
    assert_eq!(done.len(), 1);
    let c = done.pop().unwrap();
    assert_eq!(c.tag, 9);
    c.result
}

/// Waits for every read pending in `session`, appending the completions to `out`.
pub fn wait_all(session: &mut Session, out: &mut Vec<Completion>) {
    while session.pending() > 0 {
        session.wait(1, out).unwrap();
    }
}

/// Counts each class's reads in flight through a reader's observer, and notes whether a
/// class ever had more issued than it was allowed.
pub struct DepthWatch {
    in_flight: Vec<AtomicUsize>,
    allowed: Vec<AtomicUsize>,
    peak: Vec<AtomicUsize>,
    violated: AtomicBool,
}

impl DepthWatch {
    /// A watch of `classes` classes, each allowed `depth` reads at first.
    pub fn new(classes: usize, depth: usize) -> Arc<Self> {
        let counters = |v: usize| (0..classes).map(|_| AtomicUsize::new(v)).collect();
        Arc::new(Self {
            in_flight: counters(0),
            allowed: counters(depth),
            peak: counters(0),
            violated: AtomicBool::new(false),
        })
    }

    /// The observer to give the reader's builder.
    pub fn observer(self: &Arc<Self>) -> impl Fn(IoEvent) + Send + Sync + 'static {
        let w = self.clone();
        move |e: IoEvent| match e.kind {
            IoEventKind::Issued => {
                let n = w.in_flight[e.class].fetch_add(1, Ordering::SeqCst) + 1;
                w.peak[e.class].fetch_max(n, Ordering::SeqCst);
                if n > w.allowed[e.class].load(Ordering::SeqCst) {
                    w.violated.store(true, Ordering::SeqCst);
                }
            }
            _ => {
                w.in_flight[e.class].fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Sets `class`'s io_depth on `reader`. Reads issued under the old limit may still be
    /// in flight: the bound is the larger of the two until the change took effect.
    pub fn set_io_depth(&self, reader: &Reader, class: usize, depth: usize) {
        let old = reader.io_depth(class).unwrap();
        self.allowed[class].store(old.max(depth), Ordering::SeqCst);
        reader.set_io_depth(class, depth).unwrap();
        self.allowed[class].store(depth, Ordering::SeqCst);
    }

    /// No class went over its limit, and reads did overlap (else the check proves nothing).
    pub fn assert_held(&self, backend: Backend) {
        assert!(
            !self.violated.load(Ordering::SeqCst),
            "{backend:?}: a class exceeded its io_depth"
        );
        let max_peak = self.peak.iter().map(|p| p.load(Ordering::SeqCst)).max();
        assert!(
            max_peak.unwrap() >= 2,
            "{backend:?}: reads never overlapped, the test proves nothing"
        );
    }

    /// Reads of `class` issued and not yet completed.
    pub fn in_flight(&self, class: usize) -> usize {
        self.in_flight[class].load(Ordering::SeqCst)
    }
}
