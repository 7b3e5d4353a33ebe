//! The reader handle, its configuration, and the choice of backend.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;

use crate::completion::Completion;
use crate::deferred::Deferred;
use crate::error::ReadError;
use crate::files::FileEntry;
use crate::job::{Job, Pending, Source};
use crate::pool::{block_bytes, Pool, POOL_BYTES_MAX};
use crate::state::ReaderState;
use crate::types::{FileId, IoEvent, Observer, OpenOptions, PathRead, ReadRequest, ReaderStats};
use crate::uring::{Engine, SetupParams};

/// Which backend a reader should use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// io_uring if a ring can be set up, else the pread pool. `LOBSTER_IO=pread|uring`
    /// overrides this choice.
    #[default]
    Auto,
    /// io_uring; building the reader fails if no ring can be set up.
    Uring,
    /// The pread thread pool.
    Pread,
}

/// The backend a reader runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActiveBackend {
    /// One or more io_uring rings, each driven by one engine thread.
    Uring,
    /// A bounded pool of pread threads.
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
    /// Engine threads (rings) or pread workers.
    pub threads: usize,
    /// Reads one ring may have in the kernel at once (io_uring only).
    pub ring_capacity: usize,
    /// The pool is registered with the rings as one buffer (`READ_FIXED`).
    pub fixed_buffers: bool,
    /// Slots of the fixed-file table (0: files are read through plain fds).
    pub fixed_file_slots: u32,
    /// Sessions read by path ([`crate::Session::submit_path`]) with one linked open, read and close
    /// in their ring (direct descriptors, Linux 5.15); else they open, read and close with
    /// separate system calls on the calling thread.
    pub direct_descriptors: bool,
}

/// How to build a [`Reader`]. `Default` gives one class at depth 32 and a pool of 32 MiB for
/// reads of up to 1 MiB (committed when the reader is built).
#[derive(Clone)]
pub struct ReaderConfig {
    /// Which backend to use.
    pub backend: Backend,
    /// io_uring rings, each with its own engine thread, serving [`Reader::submit`].
    /// Page-cache hits are copied on the engine thread, so one ring uses at most one core
    /// for them. 0 on the io_uring backend: no engine threads, reads go through
    /// [`Reader::session`] only (`submit` is refused); the pread backend ignores it.
    pub rings: usize,
    /// Submission queue entries per ring (the completion queue gets twice as many); an
    /// engine's ring has at most `ring_entries - 1` reads in the kernel, a session's
    /// `ring_entries`.
    pub ring_entries: u32,
    /// Set IOSQE_ASYNC on reads: the kernel's worker threads do the page-cache copies,
    /// spreading them over cores, at some cost per read.
    pub async_punt: bool,
    /// Threads of the pread backend; it has at most this many reads in flight.
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
    /// Register the pool with the rings (as one buffer) when RLIMIT_MEMLOCK allows and the
    /// pool is at most 1 GiB.
    pub register_buffers: bool,
    /// Fault the whole pool in when the reader is built (the default). Off, pages are faulted
    /// in when a block first uses them; blocks go lowest address first, so resident memory is
    /// the most the pool held at once, at most the budget, and a budget sized for the worst
    /// case costs nothing until used.
    pub commit_pool: bool,
    /// Slots in each ring's fixed-file table (capped by RLIMIT_NOFILE); files opened beyond
    /// it are read through their plain fd.
    pub fixed_files: u32,
    /// Initial io_depth of each class; its length is the number of classes.
    pub io_depths: Vec<usize>,
    /// Requests each class queue holds before `submit` waits.
    pub queue_capacity: usize,
    /// Called for every read entering and leaving the kernel (tests, tracing).
    pub observer: Option<Observer>,
}

impl Default for ReaderConfig {
    fn default() -> ReaderConfig {
        ReaderConfig {
            backend: Backend::Auto,
            rings: 1,
            ring_entries: 256,
            async_punt: false,
            pread_threads: 32,
            pool_bytes: 32 << 20,
            max_read_bytes: 1 << 20,
            register_buffers: true,
            commit_pool: true,
            fixed_files: 4096,
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
            .field("rings", &self.rings)
            .field("ring_entries", &self.ring_entries)
            .field("async_punt", &self.async_punt)
            .field("pread_threads", &self.pread_threads)
            .field("pool_bytes", &self.pool_bytes)
            .field("max_read_bytes", &self.max_read_bytes)
            .field("register_buffers", &self.register_buffers)
            .field("commit_pool", &self.commit_pool)
            .field("fixed_files", &self.fixed_files)
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
        if self.rings > 64 {
            return bad("rings", "must be 0..=64");
        }
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
        /// See [`ReaderConfig::rings`].
        rings: usize,
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
        /// See [`ReaderConfig::fixed_files`].
        fixed_files: u32,
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
    /// The reader runs io_uring (else sessions read with pread on the calling thread).
    pub(crate) uring: bool,
    pub(crate) ring_entries: u32,
    pub(crate) register_buffers: bool,
    pub(crate) async_punt: bool,
    pub(crate) queue_capacity: usize,
    /// Path reads go through direct descriptors (see [`BackendInfo::direct_descriptors`]).
    pub(crate) direct_descriptors: bool,
}

/// The sample reader: a cheap, cloneable, thread-safe handle. The backend threads stop
/// when the last clone drops (see `Drop`).
#[derive(Clone, Debug)]
pub struct Reader {
    inner: Arc<ReaderInner>,
}

#[derive(Debug)]
struct ReaderInner {
    shared: Arc<ReaderState>,
    threads: Vec<JoinHandle<()>>,
    backend: BackendInfo,
    completions: Receiver<Completion>,
    /// Reads waiting for pool memory, served by the last thread of `threads`.
    deferred: Arc<Deferred>,
    max_read_bytes: usize,
    session: SessionParams,
    /// `submit` has a backend thread to serve it (not an io_uring reader with 0 rings).
    serves_submit: bool,
}

impl Drop for ReaderInner {
    /// Cancels queued reads, waits for the reads in the kernel to complete (their buffers
    /// stay owned by the engines until then), and joins the backend threads.
    fn drop(&mut self) {
        self.deferred.close();
        self.shared.pool.close();
        self.shared.shut_down();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
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
        let (sender, completions) = crossbeam_channel::unbounded();
        match plan(config.backend, env.as_deref()) {
            Plan::Uring { forced, why } => {
                let params = SetupParams {
                    rings: config.rings,
                    ring_entries: config.ring_entries,
                    register_buffers: config.register_buffers,
                    fixed_files: config.fixed_files,
                };
                match crate::uring::setup(&params, &pool) {
                    Ok(setup) => {
                        let mut reason = why;
                        if let Err(why) = &setup.direct_descriptors {
                            reason.push_str("; path reads open and close on the calling thread: ");
                            reason.push_str(why);
                        }
                        for note in &setup.notes {
                            reason.push_str("; ");
                            reason.push_str(note);
                        }
                        let backend = BackendInfo {
                            active: ActiveBackend::Uring,
                            reason,
                            threads: setup.rings.len(),
                            ring_capacity: setup.cap,
                            fixed_buffers: setup.fixed_buffers,
                            fixed_file_slots: setup.fixed.as_ref().map_or(0, |_| {
                                config.fixed_files.min(crate::uring::nofile_limit() as u32)
                            }),
                            direct_descriptors: setup.direct_descriptors.is_ok(),
                        };
                        let shared = Arc::new(ReaderState::new(
                            &config.io_depths,
                            setup.wakers,
                            setup.fixed,
                            pool,
                            sender,
                            config.queue_capacity,
                            config.observer.clone(),
                        ));
                        let mut threads = Vec::with_capacity(setup.rings.len());
                        for (id, ring) in setup.rings.into_iter().enumerate() {
                            let engine = Engine {
                                id,
                                ring,
                                shared: shared.clone(),
                                cap: setup.cap,
                                fixed_buffers: setup.fixed_buffers,
                                async_punt: config.async_punt,
                            };
                            spawn_or_stop(&shared, &mut threads, format!("lobster-uring-{id}"), {
                                move || engine.run()
                            })?;
                        }
                        Self::assemble(&config, shared, threads, backend, completions)
                    }
                    Err(e) if forced => Err(ReadError::Setup {
                        what: e.what,
                        source: e.source,
                    }),
                    Err(e) => {
                        let reason = format!(
                            "io_uring unusable ({} failed: {}); falling back to {} pread threads",
                            e.what, e.source, config.pread_threads
                        );
                        report_fallback(&reason);
                        Self::pread(config, pool, sender, completions, reason)
                    }
                }
            }
            Plan::Pread { why } => Self::pread(config, pool, sender, completions, why),
        }
    }

    fn pread(
        config: ReaderConfig,
        pool: Pool,
        sender: crossbeam_channel::Sender<Completion>,
        completions: Receiver<Completion>,
        reason: String,
    ) -> Result<Reader, ReadError> {
        let shared = Arc::new(ReaderState::new(
            &config.io_depths,
            Vec::new(),
            None,
            pool,
            sender,
            config.queue_capacity,
            config.observer.clone(),
        ));
        let mut threads = Vec::with_capacity(config.pread_threads);
        for i in 0..config.pread_threads {
            let worker_shared = shared.clone();
            spawn_or_stop(
                &shared,
                &mut threads,
                format!("lobster-pread-{i}"),
                move || crate::pread::worker(worker_shared),
            )?;
        }
        let backend = BackendInfo {
            active: ActiveBackend::Pread,
            reason,
            threads: config.pread_threads,
            ring_capacity: 0,
            fixed_buffers: false,
            fixed_file_slots: 0,
            direct_descriptors: false,
        };
        Self::assemble(&config, shared, threads, backend, completions)
    }

    /// Starts the thread that serves reads waiting for pool memory and wraps up the reader.
    fn assemble(
        config: &ReaderConfig,
        shared: Arc<ReaderState>,
        mut threads: Vec<JoinHandle<()>>,
        backend: BackendInfo,
        completions: Receiver<Completion>,
    ) -> Result<Reader, ReadError> {
        let uring = backend.active == ActiveBackend::Uring;
        // An io_uring reader with no rings has no engine to serve `submit`.
        let serves_submit = !uring || config.rings > 0;
        let session = SessionParams {
            uring,
            ring_entries: config.ring_entries,
            register_buffers: config.register_buffers,
            async_punt: config.async_punt,
            queue_capacity: config.queue_capacity,
            direct_descriptors: backend.direct_descriptors,
        };
        let deferred = Arc::new(Deferred::new(
            config.queue_capacity.saturating_mul(config.io_depths.len()),
        ));
        let (d, sh) = (deferred.clone(), shared.clone());
        spawn_or_stop(&shared, &mut threads, "lobster-pool".into(), move || {
            d.run(&sh)
        })?;
        Ok(Reader {
            inner: Arc::new(ReaderInner {
                shared,
                threads,
                backend,
                completions,
                deferred,
                max_read_bytes: config.max_read_bytes,
                session,
                serves_submit,
            }),
        })
    }

    /// Which backend runs, and why.
    pub fn backend(&self) -> &BackendInfo {
        &self.inner.backend
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.inner.shared.classes()
    }

    /// Opens `path` for reading and registers it as a fixed file when a slot is free.
    /// A directory or a missing file gives [`ReadError::Open`] with the OS error.
    pub fn open(&self, path: impl AsRef<Path>, options: OpenOptions) -> Result<FileId, ReadError> {
        let mut entry = FileEntry::open(path.as_ref(), options.direct)?;
        if let Some(fixed) = &self.inner.shared.fixed {
            entry.fixed = fixed.register(entry.raw_fd());
        }
        Ok(self.inner.shared.files.insert(entry))
    }

    /// Closes a file. Reads of it already submitted still complete; the descriptor and
    /// the fixed-file slot are released after the last of them.
    pub fn close(&self, file: FileId) -> Result<(), ReadError> {
        self.inner
            .shared
            .files
            .remove(file)
            .map(drop)
            .ok_or(ReadError::UnknownFile { file })
    }

    /// The state this reader shares with its sessions and backend threads.
    pub(crate) fn state(&self) -> &Arc<ReaderState> {
        &self.inner.shared
    }

    /// What a session of this reader needs from its configuration.
    pub(crate) fn session_params(&self) -> SessionParams {
        self.inner.session
    }

    /// `submit` needs a backend thread; an io_uring reader with 0 rings has none.
    fn serves_submit(&self) -> Result<(), ReadError> {
        if self.inner.serves_submit {
            Ok(())
        } else {
            Err(ReadError::InvalidConfig {
                parameter: "rings",
                reason: "0 rings: this reader reads through Reader::session only".into(),
            })
        }
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
        crate::resident::read_resident_in(Some(&self.inner.shared.pool), file.into(), offset, len)
    }

    /// Queues a read at the back of its class's FIFO. Waits while the class queue is full.
    /// Never waits for pool memory: when no block is free (or earlier reads wait for one)
    /// the read waits in the reader, in submission order, and `submit` returns. Errors here
    /// are about the request itself (class, file id, size); I/O errors arrive as completions.
    pub fn submit(&self, req: ReadRequest) -> Result<(), ReadError> {
        self.serves_submit()?;
        let pending = self.check(&req)?;
        let shared = &self.inner.shared;
        match self.inner.deferred.admit(&shared.pool, &pending, true)? {
            Some(buf) => shared.enqueue(Job::new(pending, buf), true),
            None => Ok(()),
        }
    }

    /// Submits several reads with one lock round and one wake-up of the backend, which
    /// matters when reads are cheap (page-cache hits). Every request is checked before any
    /// is queued; then they are queued in order as [`Reader::submit`] does: those that get
    /// a block at once first, the rest (from the first that finds none) wait in the reader
    /// for pool memory, so a batch larger than the pool cannot wait on itself.
    pub fn submit_batch(&self, reqs: &[ReadRequest]) -> Result<(), ReadError> {
        self.serves_submit()?;
        let pending = reqs
            .iter()
            .map(|req| self.check(req))
            .collect::<Result<Vec<_>, _>>()?;
        let shared = &self.inner.shared;
        let mut jobs = Vec::with_capacity(reqs.len());
        let mut rest = pending.into_iter();
        let mut later = None;
        for p in rest.by_ref() {
            match self.inner.deferred.admit(&shared.pool, &p, false) {
                Ok(Some(buf)) => jobs.push(Job::new(p, buf)),
                Ok(None) => unreachable!("admit without blocking never defers"),
                Err(ReadError::WouldBlock { .. }) => {
                    later = Some(p);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        shared.enqueue_many(jobs)?;
        for p in later.into_iter().chain(rest) {
            self.inner.deferred.push(p)?;
        }
        Ok(())
    }

    /// Like [`Reader::submit`], but returns [`ReadError::WouldBlock`] instead of waiting
    /// (for pool memory or class queue room).
    pub fn try_submit(&self, req: ReadRequest) -> Result<(), ReadError> {
        self.serves_submit()?;
        let pending = self.check(&req)?;
        let shared = &self.inner.shared;
        let buf = self
            .inner
            .deferred
            .admit(&shared.pool, &pending, false)?
            .expect("admit without blocking never defers");
        shared.enqueue(Job::new(pending, buf), false)
    }

    /// Sets the number of reads `class` may have in the kernel. Takes effect at once for
    /// new reads; reads already in flight above a lowered limit finish normally. Depth 0
    /// pauses the class.
    pub fn set_io_depth(&self, class: usize, io_depth: usize) -> Result<(), ReadError> {
        self.inner.shared.set_io_depth(class, io_depth)
    }

    /// The current io_depth of `class`.
    pub fn io_depth(&self, class: usize) -> Option<usize> {
        self.inner.shared.io_depth(class)
    }

    /// The completion channel (every clone receives from the same queue). Each completion
    /// holds a pool block (at least a page) until received and dropped, except the
    /// cancellations of reads that never got one, so it holds at most
    /// [`ReaderConfig::pool_bytes`] / 4096 + classes × [`ReaderConfig::queue_capacity`]
    /// completions. It disconnects once the reader is dropped and drained.
    pub fn completions(&self) -> Receiver<Completion> {
        self.inner.completions.clone()
    }

    /// Counters per class, and pool use.
    pub fn stats(&self) -> ReaderStats {
        self.inner.shared.stats()
    }

    /// Restarts `peak_in_flight` of every class from its current in-flight count.
    pub fn reset_peaks(&self) {
        self.inner.shared.reset_peaks()
    }
}

/// Starts a backend thread; if that fails, stops and joins the ones already started.
fn spawn_or_stop(
    shared: &ReaderState,
    threads: &mut Vec<JoinHandle<()>>,
    name: String,
    f: impl FnOnce() + Send + 'static,
) -> Result<(), ReadError> {
    match std::thread::Builder::new().name(name).spawn(f) {
        Ok(t) => {
            threads.push(t);
            Ok(())
        }
        Err(source) => {
            shared.shut_down();
            threads.drain(..).for_each(|t| {
                let _ = t.join();
            });
            Err(ReadError::Setup {
                what: "spawning a backend thread",
                source,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        send_sync::<Completion>();
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
}
