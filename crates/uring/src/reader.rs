//! The reader handle, its configuration, and the choice of backend.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::ReadError;
use crate::file_ref::FileRef;
use crate::files::FileEntry;
use crate::job::{Pending, Source};
use crate::pool::{block_bytes, Pool, POOL_BYTES_MAX};
use crate::pread::PreadPool;
use crate::resident::{fill_nowait, named, read_into_own_buffer, Resident};
use crate::ring::RingParams;
use crate::state::ReaderState;
use crate::types::{FileId, IoEvent, Observer, OpenOptions, PathRead, ReadRequest, ReaderStats};

/// Which backend a reader should use: `auto`, `uring` or `pread`, as [`Display`](fmt::Display)
/// writes and [`FromStr`](std::str::FromStr) reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Backend {
    /// io_uring if a ring can be set up, else the pread pool. `LOBSTER_IO=pread|uring`
    /// overrides this choice.
    #[default]
    #[cfg_attr(
        feature = "clap",
        value(help = "io_uring, falling back to pread if a ring cannot be set up")
    )]
    Auto,
    /// io_uring; building the reader fails if no ring can be set up.
    #[cfg_attr(feature = "clap", value(help = "io_uring"))]
    Uring,
    /// The pread thread pool.
    Pread,
}

impl Backend {
    /// The backend's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Uring => "uring",
            Backend::Pread => "pread",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Backend {
    type Err = ReadError;

    fn from_str(s: &str) -> Result<Self, ReadError> {
        match s {
            "auto" => Ok(Backend::Auto),
            "uring" => Ok(Backend::Uring),
            "pread" => Ok(Backend::Pread),
            other => Err(ReadError::InvalidConfig {
                parameter: "backend",
                reason: format!("{other:?}: expected auto, uring or pread"),
            }),
        }
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Backend {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Backend {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The backend a reader runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActiveBackend {
    /// io_uring: each session drives a ring of its own.
    Uring,
    /// A bounded pool of pread threads serving the sessions.
    Pread,
}

/// Which backend runs, and why; see [`Reader::backend`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendInfo {
    /// The backend in use.
    pub active: ActiveBackend,
    /// Why this backend (forced by config or `LOBSTER_IO`, or why io_uring was unusable),
    /// followed by notes on what could not be registered.
    pub reason: String,
    /// pread workers the reader started (0 on io_uring, which starts no thread: sessions
    /// drive their own rings).
    pub threads: usize,
    /// Operations one session's ring may have in the kernel at once (io_uring only).
    pub ring_capacity: usize,
    /// Sessions register the pool with their rings as one buffer (`READ_FIXED`): asked for,
    /// and within RLIMIT_MEMLOCK and the kernel's 1 GiB. [`crate::Session::fixed_buffers`]
    /// says whether a session's registration succeeded.
    pub fixed_buffers: bool,
    /// Sessions read by path ([`crate::Session::submit_path`]) with one linked open, read
    /// and close in their ring (direct descriptors, Linux 5.15); else they open, read and
    /// close with separate system calls on the calling thread (on pread: on the worker).
    pub direct_descriptors: bool,
}

/// How to build a [`Reader`]. `Default` gives one class at depth 32 and a pool of 32 MiB for
/// reads of up to 1 MiB (committed when the reader is built).
#[derive(Clone)]
pub struct ReaderConfig {
    /// Which backend to use.
    pub backend: Backend,
    /// Submission queue entries of each session's ring (the completion queue gets twice as
    /// many): at most this many operations of a session are in the kernel at once. On the
    /// pread backend, at most this many reads of a session are at the workers at once.
    pub ring_entries: u32,
    /// Set IOSQE_ASYNC on reads: the kernel's worker threads do the page-cache copies,
    /// spreading them over cores, at some cost per read.
    pub async_punt: bool,
    /// Threads of the pread backend, shared by every session: at most this many reads run
    /// at once, the rest wait for a worker in submission order.
    pub pread_threads: usize,
    /// The buffer pool's budget in bytes (rounded up to a page): it bounds the memory of
    /// in-flight reads plus the `Bytes` consumers hold. It is mapped when the reader is built
    /// and, with `commit_pool`, pre-faulted, so it is resident from then on and does not grow.
    /// Each read takes a
    /// block of the next power of two pages at or above its length (less than twice the
    /// read); must be at least one block of `max_read_bytes` and at most 64 GiB.
    pub pool_bytes: usize,
    /// The largest read (after O_DIRECT alignment) the reader accepts, at most 1 GiB; larger
    /// requests fail with [`ReadError::TooLarge`].
    pub max_read_bytes: usize,
    /// Register the pool with each session's ring (as one buffer) when RLIMIT_MEMLOCK allows
    /// and the pool is at most 1 GiB.
    pub register_buffers: bool,
    /// Fault the whole pool in when the reader is built (the default). Off, pages are faulted
    /// in when a block first uses them; blocks go lowest address first, so resident memory is
    /// the most the pool held at once, at most the budget, and a budget sized for the worst
    /// case costs nothing until used.
    pub commit_pool: bool,
    /// Initial io_depth of each class; its length is the number of classes.
    pub io_depths: Vec<usize>,
    /// Requests each class queue of a session holds; beyond it a session refuses more
    /// ([`ReadError::WouldBlock`]).
    pub queue_capacity: usize,
    /// Called for every read entering and leaving the kernel (tests, tracing).
    pub observer: Option<Observer>,
}

impl Default for ReaderConfig {
    fn default() -> ReaderConfig {
        ReaderConfig {
            backend: Backend::Auto,
            ring_entries: 256,
            async_punt: false,
            pread_threads: 32,
            pool_bytes: 32 << 20,
            max_read_bytes: 1 << 20,
            register_buffers: true,
            commit_pool: true,
            io_depths: vec![32],
            queue_capacity: 1024,
            observer: None,
        }
    }
}

impl fmt::Debug for ReaderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReaderConfig")
            .field("backend", &self.backend)
            .field("ring_entries", &self.ring_entries)
            .field("async_punt", &self.async_punt)
            .field("pread_threads", &self.pread_threads)
            .field("pool_bytes", &self.pool_bytes)
            .field("max_read_bytes", &self.max_read_bytes)
            .field("register_buffers", &self.register_buffers)
            .field("commit_pool", &self.commit_pool)
            .field("io_depths", &self.io_depths)
            .field("queue_capacity", &self.queue_capacity)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl ReaderConfig {
    fn validate(&self) -> Result<(), ReadError> {
        let bad = |parameter: &'static str, reason: &str| {
            Err(ReadError::InvalidConfig {
                parameter,
                reason: reason.to_string(),
            })
        };
        if !(2..=32768).contains(&self.ring_entries) {
            return bad("ring_entries", "must be 2..=32768");
        }
        if !(1..=1024).contains(&self.pread_threads) {
            return bad("pread_threads", "must be 1..=1024");
        }
        if !(1..=1 << 30).contains(&self.max_read_bytes) {
            return bad("max_read_bytes", "must be 1..=1 GiB");
        }
        let block = block_bytes(self.max_read_bytes);
        if !(block..=POOL_BYTES_MAX).contains(&self.pool_bytes) {
            return bad(
                "pool_bytes",
                &format!(
                    "must be {block}..={POOL_BYTES_MAX} bytes: at least one block of \
                     max_read_bytes = {} (a power of two pages), at most 64 GiB",
                    self.max_read_bytes
                ),
            );
        }
        if self.io_depths.is_empty() {
            return bad("io_depths", "needs at least one class");
        }
        if self.queue_capacity == 0 {
            return bad("queue_capacity", "must be at least 1");
        }
        Ok(())
    }
}

/// Builder for [`Reader`]; every setter mirrors a [`ReaderConfig`] field.
#[derive(Clone, Debug, Default)]
pub struct ReaderBuilder {
    config: ReaderConfig,
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.config.$name = value;
                self
            }
        )*
    };
}

impl ReaderBuilder {
    /// A builder with the default configuration.
    pub fn new() -> ReaderBuilder {
        ReaderBuilder::default()
    }

    setters! {
        /// See [`ReaderConfig::backend`].
        backend: Backend,
        /// See [`ReaderConfig::ring_entries`].
        ring_entries: u32,
        /// See [`ReaderConfig::async_punt`].
        async_punt: bool,
        /// See [`ReaderConfig::pread_threads`].
        pread_threads: usize,
        /// See [`ReaderConfig::pool_bytes`].
        pool_bytes: usize,
        /// See [`ReaderConfig::max_read_bytes`].
        max_read_bytes: usize,
        /// See [`ReaderConfig::register_buffers`].
        register_buffers: bool,
        /// See [`ReaderConfig::commit_pool`].
        commit_pool: bool,
        /// See [`ReaderConfig::io_depths`].
        io_depths: Vec<usize>,
        /// See [`ReaderConfig::queue_capacity`].
        queue_capacity: usize,
    }

    /// `classes` classes, each starting at `io_depth`.
    pub fn classes(mut self, classes: usize, io_depth: usize) -> Self {
        self.config.io_depths = vec![io_depth; classes];
        self
    }

    /// See [`ReaderConfig::observer`].
    pub fn observer(mut self, observer: impl Fn(IoEvent) + Send + Sync + 'static) -> Self {
        self.config.observer = Some(Arc::new(observer));
        self
    }

    /// The configuration built so far.
    pub fn config(&self) -> &ReaderConfig {
        &self.config
    }

    /// Builds the reader.
    pub fn build(self) -> Result<Reader, ReadError> {
        Reader::new(self.config)
    }
}

/// What to try first, from the configured backend and `LOBSTER_IO`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Try io_uring; `forced` means fail rather than fall back.
    Uring {
        forced: bool,
        why: String,
    },
    Pread {
        why: String,
    },
}

pub(crate) fn plan(backend: Backend, env: Option<&str>) -> Plan {
    match backend {
        Backend::Uring => Plan::Uring {
            forced: true,
            why: "forced by ReaderConfig::backend".into(),
        },
        Backend::Pread => Plan::Pread {
            why: "forced by ReaderConfig::backend".into(),
        },
        Backend::Auto => match env.map(str::trim) {
            Some("uring") => Plan::Uring {
                forced: true,
                why: "forced by LOBSTER_IO=uring".into(),
            },
            Some("pread") => Plan::Pread {
                why: "forced by LOBSTER_IO=pread".into(),
            },
            Some(other) if !other.is_empty() => {
                log::warn!(
                    "lobster-uring: ignoring LOBSTER_IO={other:?} (expected pread or uring)"
                );
                Plan::Uring {
                    forced: false,
                    why: "io_uring available".into(),
                }
            }
            _ => Plan::Uring {
                forced: false,
                why: "io_uring available".into(),
            },
        },
    }
}

static FALLBACK_REPORTED: AtomicBool = AtomicBool::new(false);

fn report_fallback(reason: &str) {
    if FALLBACK_REPORTED.swap(true, Ordering::Relaxed) {
        return;
    }
    if log::log_enabled!(log::Level::Warn) {
        log::warn!("lobster-uring: {reason}");
    } else {
        eprintln!("lobster-uring: {reason}");
    }
}

/// What a session needs from the reader's configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SessionParams {
    /// How its ring is set up (io_uring); `ring_entries` also bounds its reads at the pread
    /// workers.
    pub(crate) ring: RingParams,
    pub(crate) queue_capacity: usize,
}

/// The sample reader: a cheap, cloneable, thread-safe handle that sessions read through
/// ([`Reader::session`]). The pread workers (on that backend) stop when the last clone and
/// the last session drop.
#[derive(Clone, Debug)]
pub struct Reader {
    inner: Arc<ReaderInner>,
}

#[derive(Debug)]
struct ReaderInner {
    shared: Arc<ReaderState>,
    /// The pread backend's workers; `None` on io_uring.
    pread: Option<PreadPool>,
    backend: BackendInfo,
    max_read_bytes: usize,
    session: SessionParams,
}

impl Reader {
    /// A builder with the default configuration.
    pub fn builder() -> ReaderBuilder {
        ReaderBuilder::new()
    }

    /// Builds a reader from `config`, choosing the backend (see [`Backend`]).
    pub fn new(config: ReaderConfig) -> Result<Reader, ReadError> {
        config.validate()?;
        let env = std::env::var("LOBSTER_IO").ok();
        let pool = Pool::with_commit(config.pool_bytes, config.max_read_bytes, config.commit_pool)
            .map_err(|source| ReadError::Setup {
                what: "mapping the buffer pool",
                source,
            })?;
        let (forced, why) = match plan(config.backend, env.as_deref()) {
            Plan::Uring { forced, why } => (forced, why),
            Plan::Pread { why } => return Self::pread(config, pool, why),
        };
        let probe = match crate::uring::probe(config.ring_entries, config.register_buffers, &pool) {
            Ok(probe) => probe,
            Err(e) if forced => {
                return Err(ReadError::Setup {
                    what: e.what,
                    source: e.source,
                })
            }
            Err(e) => {
                let reason = format!(
                    "io_uring unusable ({} failed: {}); falling back to {} pread threads",
                    e.what, e.source, config.pread_threads
                );
                report_fallback(&reason);
                return Self::pread(config, pool, reason);
            }
        };
        let mut reason = why;
        if let Err(why) = &probe.direct_descriptors {
            reason.push_str("; path reads open and close on the calling thread: ");
            reason.push_str(why);
        }
        if let (true, Err(why)) = (config.register_buffers, &probe.fixed_buffers) {
            reason.push_str("; buffers not registered: ");
            reason.push_str(why);
        }
        let backend = BackendInfo {
            active: ActiveBackend::Uring,
            reason,
            threads: 0,
            ring_capacity: probe.cap,
            fixed_buffers: probe.fixed_buffers.is_ok(),
            direct_descriptors: probe.direct_descriptors.is_ok(),
        };
        Ok(Self::assemble(&config, pool, None, backend))
    }

    fn pread(config: ReaderConfig, pool: Pool, reason: String) -> Result<Reader, ReadError> {
        let workers = PreadPool::start(config.pread_threads)?;
        let backend = BackendInfo {
            active: ActiveBackend::Pread,
            reason,
            threads: config.pread_threads,
            ring_capacity: 0,
            fixed_buffers: false,
            direct_descriptors: false,
        };
        Ok(Self::assemble(&config, pool, Some(workers), backend))
    }

    fn assemble(
        config: &ReaderConfig,
        pool: Pool,
        pread: Option<PreadPool>,
        backend: BackendInfo,
    ) -> Reader {
        let session = SessionParams {
            ring: RingParams {
                ring_entries: config.ring_entries,
                register_buffers: config.register_buffers,
                async_punt: config.async_punt,
                direct_descriptors: backend.direct_descriptors,
            },
            queue_capacity: config.queue_capacity,
        };
        let shared = ReaderState::new(&config.io_depths, pool, config.observer.clone());
        Reader {
            inner: Arc::new(ReaderInner {
                shared: Arc::new(shared),
                pread,
                backend,
                max_read_bytes: config.max_read_bytes,
                session,
            }),
        }
    }

    /// Which backend runs, and why.
    pub fn backend(&self) -> &BackendInfo {
        &self.inner.backend
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.inner.shared.classes()
    }

    /// Opens `path` for reading, for every session of this reader to read
    /// ([`crate::Session::submit`]) through its descriptor. A directory or a missing file
    /// gives [`ReadError::Open`] with the OS error.
    pub fn open(&self, path: impl AsRef<Path>, options: OpenOptions) -> Result<FileId, ReadError> {
        let entry = FileEntry::open(FileRef::from(path.as_ref()), options.direct)?;
        Ok(self.inner.shared.files.insert(entry))
    }

    /// Closes a file. Reads of it already submitted still complete; the descriptor is
    /// released after the last of them.
    pub fn close(&self, file: FileId) -> Result<(), ReadError> {
        self.inner
            .shared
            .files
            .remove(file)
            .map(drop)
            .ok_or(ReadError::UnknownFile { file })
    }

    /// The state this reader shares with its sessions.
    pub(crate) fn state(&self) -> &Arc<ReaderState> {
        &self.inner.shared
    }

    /// What a session of this reader needs from its configuration.
    pub(crate) fn session_params(&self) -> SessionParams {
        self.inner.session
    }

    /// The pread backend's workers, which serve the sessions; `None` on io_uring.
    pub(crate) fn pread_pool(&self) -> Option<&PreadPool> {
        self.inner.pread.as_ref()
    }

    /// Checks that `class` exists.
    fn check_class(&self, class: usize) -> Result<(), ReadError> {
        let classes = self.inner.shared.classes();
        if class >= classes {
            return Err(ReadError::InvalidClass { class, classes });
        }
        Ok(())
    }

    /// Checks a request against the classes, the open files and `max_read_bytes`.
    pub(crate) fn check(&self, req: &ReadRequest) -> Result<Pending, ReadError> {
        self.check_class(req.class)?;
        let file = self
            .inner
            .shared
            .files
            .get(req.file)
            .ok_or(ReadError::UnknownFile { file: req.file })?;
        let max = self.inner.max_read_bytes;
        Pending::plan(
            Source::File(file),
            req.offset,
            req.len,
            req.class,
            req.tag,
            max,
        )
    }

    /// Checks a read by path against the classes and `max_read_bytes`.
    pub(crate) fn check_path(&self, req: &PathRead) -> Result<Pending, ReadError> {
        self.check_class(req.class)?;
        let source = Source::Path {
            path: req.path.clone(),
            dir: req.dir.clone(),
            direct: req.direct,
            to_eof: req.to_eof,
        };
        let max = self.inner.max_read_bytes;
        Pending::plan(source, req.offset, req.len, req.class, req.tag, max)
    }

    /// Reads `path` (expected to hold `len` bytes) on the calling thread if the page cache
    /// holds all of it, into a block of this reader's pool when one is free (memory reused
    /// read after read); see [`crate::read_resident`].
    ///
    /// # Errors
    /// The file cannot be opened or the read fails for another reason than not being
    /// resident; the error names the path.
    pub fn read_resident<'a>(
        &self,
        file: impl Into<crate::FileRef<'a>>,
        offset: u64,
        len: usize,
    ) -> Result<crate::Resident, std::io::Error> {
        read_resident_in(Some(&self.inner.shared.pool), file.into(), offset, len)
    }

    /// Sets the number of reads `class` may have in the kernel, over all sessions. Takes
    /// effect at once for new reads; reads already in flight above a lowered limit finish
    /// normally. Depth 0 pauses the class.
    pub fn set_io_depth(&self, class: usize, io_depth: usize) -> Result<(), ReadError> {
        self.inner.shared.set_io_depth(class, io_depth)
    }

    /// The current io_depth of `class`.
    pub fn io_depth(&self, class: usize) -> Option<usize> {
        self.inner.shared.io_depth(class)
    }

    /// Counters per class, and pool use.
    pub fn stats(&self) -> ReaderStats {
        self.inner.shared.stats()
    }

    /// Gives the pages of the pool's free blocks back to the system, unless the pool is
    /// committed ([`ReaderConfig::commit_pool`]) or registered with a ring; returns the bytes
    /// given. With an uncommitted pool, resident memory otherwise stays at the most the
    /// pool ever held at once; a loader calls this once an epoch.
    pub fn release_free_pages(&self) -> u64 {
        self.inner.shared.pool.release_free_pages() as u64
    }

    /// Restarts `peak_in_flight` of every class from its current in-flight count.
    pub fn reset_peaks(&self) {
        self.inner.shared.reset_peaks()
    }
}

/// [`crate::read_resident`], into a block of `pool` when one is free: memory already faulted
/// in and reused read after read, where a fresh buffer of a large sample costs a page fault
/// per page.
fn read_resident_in(
    pool: Option<&Pool>,
    file: FileRef<'_>,
    offset: u64,
    len: usize,
) -> Result<Resident, std::io::Error> {
    let path = file.path;
    let file = file.open(0).map_err(|e| named(path, e))?;
    if let Some(mut block) = pool.and_then(|p| p.try_acquire(len)) {
        let base = block.as_mut_ptr();
        // SAFETY: the block is ours alone until it becomes `Bytes` below, and holds `len`.
        let filled = unsafe { fill_nowait(&file, offset, base, len) };
        return Ok(filled
            .map_err(|e| named(path, e))?
            .resident(|n| (block.into_bytes(0, n), true)));
    }
    read_into_own_buffer(&file, path, offset, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_parse_back_and_unknown_ones_are_named() {
        for b in [Backend::Auto, Backend::Uring, Backend::Pread] {
            assert_eq!(b.to_string().parse::<Backend>().unwrap(), b);
        }
        let e = "spdk".parse::<Backend>().unwrap_err().to_string();
        assert!(e.contains("spdk") && e.contains("backend"), "{e}");
    }

    #[cfg(feature = "clap")]
    #[test]
    fn clap_takes_the_backend_names() {
        use clap::ValueEnum;
        for b in Backend::value_variants() {
            assert_eq!(b.to_possible_value().unwrap().get_name(), b.to_string());
        }
    }

    #[test]
    fn lobster_io_overrides_auto_only() {
        assert!(matches!(
            plan(Backend::Auto, Some("pread")),
            Plan::Pread { .. }
        ));
        assert!(matches!(
            plan(Backend::Auto, Some("uring")),
            Plan::Uring { forced: true, .. }
        ));
        assert!(matches!(
            plan(Backend::Auto, None),
            Plan::Uring { forced: false, .. }
        ));
        assert!(matches!(
            plan(Backend::Auto, Some("bogus")),
            Plan::Uring { forced: false, .. }
        ));
        assert!(matches!(
            plan(Backend::Uring, Some("pread")),
            Plan::Uring { forced: true, .. }
        ));
        assert!(matches!(
            plan(Backend::Pread, Some("uring")),
            Plan::Pread { .. }
        ));
    }

    #[test]
    fn handles_and_completions_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Reader>();
        send_sync::<crate::completion::Completion>();
        send_sync::<ReadError>();
    }

    #[test]
    fn invalid_config_names_the_parameter() {
        let err = Reader::builder().io_depths(vec![]).build().unwrap_err();
        assert!(matches!(
            err,
            ReadError::InvalidConfig {
                parameter: "io_depths",
                ..
            }
        ));
    }

    #[test]
    fn a_pool_block_holds_the_bytes_while_one_is_free_and_a_buffer_of_their_own_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 13) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        // Room for two blocks of 8 KiB (a read of 5001 bytes takes two pages).
        let pool = Pool::new(16 << 10, 8 << 10).unwrap();
        let mut held = Vec::new();
        for expect_pooled in [true, true, false] {
            match read_resident_in(Some(&pool), (&path).into(), 0, data.len() + 1).unwrap() {
                Resident::Read { bytes, pooled } => {
                    assert_eq!(&bytes[..], &data[..]);
                    assert_eq!(pooled, expect_pooled);
                    held.push(bytes);
                }
                Resident::Unsupported => {
                    eprintln!("skipped: RWF_NOWAIT refused by this kernel");
                    return;
                }
                Resident::NotResident => panic!("a file just written is in the page cache"),
            }
        }
        assert_eq!(pool.free_bytes(), 0);
        drop(held);
        assert_eq!(pool.free_bytes(), 16 << 10, "the blocks went back");
    }
}
