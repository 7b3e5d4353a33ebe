//! The node's host: the in-process loader for every local rank, on local rank 0's threads,
//! delivering each rank's batches into that rank's slots of the shared arena.
//!
//! Threads: one accepts the ranks' connections (refusing at once, with nothing said, a peer of
//! another user than the host's, root excepted), one per trusted connection reads its hello
//! under one deadline and checks its configuration (at most [`HELLOS_MAX`] at once), one per
//! rank reads its releases, one per rank feeds it (takes its batches from the loader, waits for
//! a free slot, copies the samples into the slot, sends the placements). A rank whose socket
//! closes before its last batch stops the job: the loader is dropped (its threads stop), and
//! every other rank is told why.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lobster_io::{Dataset, Loader, LoaderConfig, RankHandle, RunMetrics};

use crate::arena::SharedArena;
use crate::barrier;
use crate::cred::{self, Peer};
use crate::error::{Failure, NodeError};
use crate::fdpass::send_with_fd;
use crate::launch::NodeEnv;
use crate::wire::{read_frame, stop_error, Placed, ToHost, ToRank};

/// How the host lays out the arena and how long it waits for the ranks.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Batches each rank may hold or have in flight at once: its slots in the arena.
    pub slots_per_rank: usize,
    /// Bytes of one slot: a batch's decoded samples must fit.
    pub slot_bytes: u64,
    /// How long the host waits for every local rank to attach.
    pub attach_timeout: Duration,
}

/// The configuration every rank of a node must share, as (field, value) pairs; a rank
/// started with another is refused naming the first field that differs.
pub fn fingerprint(dataset: &Dataset, config: &LoaderConfig, seed: u64) -> Vec<(String, String)> {
    let mut v = vec![
        ("dataset", dataset.root().display().to_string()),
        ("samples", dataset.len().to_string()),
        ("dataset_bytes", dataset.total_bytes().to_string()),
        ("seed", seed.to_string()),
        ("batch_size", config.job.batch_size.to_string()),
        ("epochs", config.job.epochs.to_string()),
        ("nodes", config.job.nodes.to_string()),
        ("node", config.job.node.to_string()),
        ("ranks_per_node", config.job.ranks_per_node.to_string()),
        ("drop_last", config.job.drop_last.to_string()),
        // Both change which node reads what: nodes that differ would plan different jobs.
        ("assign", config.job.assign.to_string()),
        (
            "link_prices",
            config.cache.link_prices.map_or_else(
                || "none".to_owned(),
                |p| format!("{} {}", p.storage_bytes_per_s, p.net_bytes_per_s),
            ),
        ),
    ];
    v.push((
        "cache",
        format!("{:?} {}", config.cache.policy, config.cache.capacity_bytes),
    ));
    // What the cache keeps changes the pixels only when lossy, but every rank says the same.
    v.push((
        "cache_forms",
        format!(
            "{:?} {:?}",
            config.cache.forms, config.cache.decoded_max_side
        ),
    ));
    v.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The loader, whatever its sample type: what the host asks of it after start.
trait HostedLoader: Send {
    fn metrics(&self) -> RunMetrics;
}

impl<T: Send + 'static> HostedLoader for Loader<T> {
    fn metrics(&self) -> RunMetrics {
        Loader::metrics(self)
    }
}

/// Why the job stopped early, first cause kept.
#[derive(Clone, Debug)]
enum Stopped {
    RankGone { rank: usize, reason: String },
    Loader(String),
}

impl Stopped {
    /// The rank that went away (`None`: the loader stopped) and why.
    fn cause(&self) -> (Option<u32>, String) {
        match self {
            Stopped::RankGone { rank, reason } => (Some(*rank as u32), reason.clone()),
            Stopped::Loader(reason) => (None, reason.clone()),
        }
    }

    fn message(&self) -> ToRank {
        let (rank, reason) = self.cause();
        ToRank::Stop { rank, reason }
    }

    fn error(&self) -> NodeError {
        let (rank, reason) = self.cause();
        stop_error(rank, reason)
    }
}

/// One local rank as the host sees it.
#[derive(Default)]
struct RankState {
    /// Its socket once attached (its feeder and its reader hold clones).
    stream: Option<UnixStream>,
    /// Its slots not lent out.
    free: VecDeque<u32>,
    /// A connection's hello passed and its welcome is being sent: no other may take the rank.
    attaching: bool,
    /// Its last batch was sent: a close after this is not a failure.
    ended: bool,
    /// Batches it asked for and has not been sent.
    wants: u32,
}

struct State {
    ranks: Vec<RankState>,
    stopped: Option<Stopped>,
    attached: usize,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    arena: SharedArena,
    options: HostOptions,
    config: Vec<(String, String)>,
    /// The loader's `Positions` as JSON, sent in every welcome.
    positions: String,
    address: String,
    /// Hellos being read, each on its own thread (at most [`HELLOS_MAX`]).
    hellos: AtomicUsize,
    /// Dropped (its threads stopped) when the job stops early.
    loader: Mutex<Option<Box<dyn HostedLoader>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("host state poisoned")
    }

    /// Stops the job for `why` (the first cause wins): the loader is dropped and every
    /// waiting thread woken.
    fn stop(&self, why: Stopped) {
        {
            let mut s = self.lock();
            if s.stopped.is_some() {
                return;
            }
            log::warn!(
                "lobster-node host {}: stopping: {}",
                self.address,
                why.error()
            );
            s.stopped = Some(why);
        }
        self.changed.notify_all();
        // Ranks waiting at a step barrier wake and see the stop.
        barrier::stop(&self.arena);
        // Outside the state lock: the loader's threads may be finishing a batch.
        let loader = self.loader.lock().expect("host loader poisoned").take();
        drop(loader);
    }

    /// The slot's bytes in the arena.
    fn slot_offset(&self, rank: usize, slot: u32) -> u64 {
        let index = rank as u64 * self.options.slots_per_rank as u64 + u64::from(slot);
        barrier::HEADER_BYTES + index * self.options.slot_bytes
    }
}

/// The node's host, running on this process's threads until every rank has its last batch
/// or the job stops.
pub struct NodeHost {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for NodeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHost")
            .field("address", &self.shared.address)
            .finish_non_exhaustive()
    }
}

impl NodeHost {
    /// Starts the host of `env`'s node over `loader` (built for the node's local ranks),
    /// listening at `env.address()`; `config` is what every attaching rank must present
    /// (see [`fingerprint`]).
    ///
    /// # Errors
    /// Bad options, an arena larger than the memory available, or an address held by another
    /// process ([`NodeError::AddressTaken`]: a host of the same job and node, or a squatter).
    pub fn start<T>(
        env: &NodeEnv,
        mut loader: Loader<T>,
        config: Vec<(String, String)>,
        options: HostOptions,
    ) -> Result<NodeHost, NodeError>
    where
        T: AsRef<[u8]> + Send + 'static,
    {
        let ranks = env.local_world_size;
        if options.slots_per_rank == 0 || options.slot_bytes == 0 {
            return Err(NodeError::Launch {
                variable: "slots_per_rank, slot_bytes".into(),
                reason: "both must be at least 1".into(),
            });
        }
        let handles = loader.ranks().ok_or_else(|| NodeError::Loader {
            reason: "the loader's rank handles were already taken".into(),
        })?;
        if handles.len() != ranks {
            return Err(NodeError::Launch {
                variable: "LOCAL_WORLD_SIZE".into(),
                reason: format!(
                    "{ranks} local ranks, but the loader was built for {}",
                    handles.len()
                ),
            });
        }
        let arena_bytes = ((ranks * options.slots_per_rank) as u64)
            .checked_mul(options.slot_bytes)
            .and_then(|b| b.checked_add(barrier::HEADER_BYTES))
            .ok_or_else(|| NodeError::Launch {
                variable: "slot_bytes".into(),
                reason: format!("{} bytes a slot overflow the arena", options.slot_bytes),
            })?;
        let positions = serde_json::to_string(&loader.positions()).expect("plain data");
        let address = env.address();
        let addr = SocketAddr::from_abstract_name(address.as_bytes())
            .map_err(|e| os("bind", &address, e))?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => NodeError::AddressTaken {
                address: address.clone(),
            },
            _ => os("bind", &address, e),
        })?;
        let arena = SharedArena::create(&format!("lobster-node {address}"), arena_bytes)?;
        barrier::init(&arena);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                ranks: (0..ranks)
                    .map(|_| RankState {
                        free: (0..options.slots_per_rank as u32).collect(),
                        ..RankState::default()
                    })
                    .collect(),
                stopped: None,
                attached: 0,
            }),
            changed: Condvar::new(),
            arena,
            options,
            config,
            positions,
            address,
            hellos: AtomicUsize::new(0),
            loader: Mutex::new(Some(Box::new(loader))),
        });
        let mut threads = Vec::with_capacity(1 + ranks);
        let s = Arc::clone(&shared);
        threads.push(spawn("lobster-host-accept", move || accept(&s, listener))?);
        for handle in handles {
            let s = Arc::clone(&shared);
            let name = format!("lobster-host-feed-{}", handle.rank());
            threads.push(spawn(&name, move || feed(&s, handle))?);
        }
        Ok(NodeHost { shared, threads })
    }

    /// The address ranks attach to.
    pub fn address(&self) -> &str {
        &self.shared.address
    }

    /// Stops the job (for example: a rank process that could not start): the loader is
    /// dropped and every attached rank told `reason`.
    pub fn stop(&self, reason: impl Into<String>) {
        self.shared.stop(Stopped::Loader(reason.into()));
    }

    /// The loader's metrics so far (`None` once the job stopped early).
    pub fn metrics(&self) -> Option<RunMetrics> {
        let loader = self.shared.loader.lock().expect("host loader poisoned");
        loader.as_ref().map(|l| l.metrics())
    }

    /// Waits until every rank had its last batch (`Ok`, with the loader's metrics) or the
    /// job stopped (the first cause); the loader is dropped either way.
    ///
    /// # Errors
    /// A rank that went away, ranks that never attached, or a loader that stopped.
    pub fn wait(self) -> Result<RunMetrics, NodeError> {
        for t in self.threads {
            let _ = t.join();
        }
        let stopped = self.shared.lock().stopped.clone();
        let loader = self
            .shared
            .loader
            .lock()
            .expect("host loader poisoned")
            .take();
        match (stopped, loader) {
            (None, Some(loader)) => Ok(loader.metrics()),
            (Some(why), _) => Err(why.error()),
            (None, None) => Err(NodeError::Loader {
                reason: "the loader was dropped".into(),
            }),
        }
    }
}

fn os(call: &'static str, what: &str, source: std::io::Error) -> NodeError {
    NodeError::Os {
        call,
        what: what.to_owned(),
        source,
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, NodeError> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .map_err(|e| os("spawn", name, e))
}

/// How long a connection has, from its accept, to send its whole hello: a peer that trickles
/// bytes, or says nothing, is dropped then.
const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// Hellos a host reads at once, each on a thread of its own (`lobster-host-hello`). Past this
/// the host accepts no more until one ends (within 10 s, the deadline of a whole hello);
/// connections wait meanwhile in the kernel's backlog, and a rank's wait for its welcome is
/// its attach timeout. Only peers of the host's user or root take a place: others are
/// refused at once.
pub const HELLOS_MAX: usize = 16;

/// The longest hello read: a fingerprint is a few hundred bytes.
const HELLO_MAX_BYTES: usize = 64 << 10;

/// How long a write of the hello's answer may block: a peer that never reads is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts ranks until all attached, the job stopped, or the attach timeout passed. Each
/// connection's user is checked here; its hello is read on a thread of its own.
fn accept(shared: &Arc<Shared>, listener: UnixListener) {
    let ranks = shared.lock().ranks.len();
    let deadline = Instant::now() + shared.options.attach_timeout;
    if let Err(e) = listener.set_nonblocking(true) {
        shared.stop(Stopped::Loader(format!(
            "listening at {}: {e}",
            shared.address
        )));
        return;
    }
    loop {
        {
            let s = shared.lock();
            if s.stopped.is_some() || s.attached == ranks {
                return;
            }
        }
        let busy = shared.hellos.load(Ordering::Acquire) >= HELLOS_MAX;
        let accepted = match busy {
            true => Err(std::io::ErrorKind::WouldBlock.into()),
            false => listener.accept(),
        };
        match accepted {
            Ok((stream, _)) => admit(shared, stream),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let s = shared.lock();
                    let missing: Vec<usize> = (0..ranks)
                        .filter(|&r| s.ranks[r].stream.is_none())
                        .collect();
                    drop(s);
                    shared.stop(Stopped::Loader(format!(
                        "local ranks {missing:?} did not attach within {:.1} s",
                        shared.options.attach_timeout.as_secs_f64()
                    )));
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                shared.stop(Stopped::Loader(format!(
                    "accepting at {}: {e}",
                    shared.address
                )));
                return;
            }
        }
    }
}

/// Counts a hello in progress until dropped (with its thread, or with the closure a failed
/// spawn drops).
struct HelloPlace(Arc<Shared>);

impl Drop for HelloPlace {
    fn drop(&mut self) {
        self.0.hellos.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Checks a new connection's user: another user (not root) is refused at once, learning
/// nothing; a trusted peer's hello is read on a thread of its own.
fn admit(shared: &Arc<Shared>, stream: UnixStream) {
    let peer = match cred::peer(&stream) {
        Ok(p) => p,
        Err(e) => {
            log::warn!(
                "lobster-node host {}: a connection's credentials: {e}",
                shared.address
            );
            return;
        }
    };
    if !peer.trusted() {
        log::warn!(
            "lobster-node host {}: refused pid {} of uid {}: only uid {} or root may attach",
            shared.address,
            peer.pid,
            peer.uid,
            cred::our_uid()
        );
        refuse_bare(stream);
        return;
    }
    shared.hellos.fetch_add(1, Ordering::AcqRel);
    let place = HelloPlace(Arc::clone(shared));
    let s = Arc::clone(shared);
    let spawned = spawn("lobster-host-hello", move || {
        let _place = place;
        if let Err(e) = welcome(&s, stream, peer) {
            log::warn!(
                "lobster-node host {}: pid {} not attached: {e}",
                s.address,
                peer.pid
            );
        }
    });
    if let Err(e) = spawned {
        log::warn!(
            "lobster-node host {}: pid {} not attached: {e}",
            shared.address,
            peer.pid
        );
    }
}

/// Refuses a peer of another user with an empty refusal (no field, no value), never blocking,
/// and closes the connection without reading what it sent.
fn refuse_bare(mut stream: UnixStream) {
    let bare = ToRank::Refused {
        field: String::new(),
        host: String::new(),
        rank: String::new(),
    };
    if stream.set_nonblocking(true).is_ok() {
        let _ = stream.write_all(&bare.encode());
    }
}

/// Reads `out.len()` bytes by `deadline`, whatever the pace of the peer.
fn read_by(stream: &mut UnixStream, mut out: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    while !out.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no whole hello within {:.0} s",
                    HELLO_DEADLINE.as_secs_f64()
                ),
            ));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(out) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => out = &mut out[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads a hello's frame body into `buf`, all of it by `deadline`.
fn read_hello(
    stream: &mut UnixStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> std::io::Result<()> {
    let mut len = [0u8; 4];
    read_by(stream, &mut len, deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > HELLO_MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a hello of {len} bytes, more than {HELLO_MAX_BYTES}"),
        ));
    }
    buf.resize(len, 0);
    read_by(stream, buf, deadline)
}

/// The first field where a rank's configuration differs from the host's: the field, the
/// host's value and the rank's (with its field's name where the fields differ).
fn first_difference<'a>(
    ours: &'a [(String, String)],
    theirs: &[(String, String)],
) -> Option<(&'a str, String, String)> {
    (0..ours.len().max(theirs.len())).find_map(|i| {
        let (name, host) = entry(ours, i);
        let (their_name, their_value) = entry(theirs, i);
        if (name, host) == (their_name, their_value) {
            return None;
        }
        let rank = match their_name == name {
            true => their_value.to_owned(),
            false => format!("{their_name}={their_value}"),
        };
        Some((name, host.to_owned(), rank))
    })
}

/// A configuration's `i`th field and value, `("(none)", "")` past its end.
fn entry(config: &[(String, String)], i: usize) -> (&str, &str) {
    config
        .get(i)
        .map_or(("(none)", ""), |(k, v)| (k.as_str(), v.as_str()))
}

/// Reads a trusted connection's hello; refuses it (naming the field that differs) or attaches
/// it and starts its reader.
fn welcome(shared: &Arc<Shared>, mut stream: UnixStream, peer: Peer) -> Result<(), NodeError> {
    let deadline = Instant::now() + HELLO_DEADLINE;
    let io = |e: std::io::Error| os("attach", &shared.address, e);
    stream.set_nonblocking(false).map_err(io)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(io)?;
    let mut buf = Vec::new();
    match read_hello(&mut stream, &mut buf, deadline) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(NodeError::Protocol {
                reason: "a connection closed before its hello".into(),
            })
        }
        Err(e) => return Err(io(e)),
    }
    let ToHost::Hello {
        local_rank, config, ..
    } = ToHost::decode(&buf)?
    else {
        return Err(NodeError::Protocol {
            reason: "the first message was not a hello".into(),
        });
    };
    stream.set_read_timeout(None).map_err(io)?;
    let refuse = |mut stream: UnixStream, field: &str, host: String, rank: String| {
        let m = ToRank::Refused {
            field: field.into(),
            host: host.clone(),
            rank: rank.clone(),
        };
        let _ = stream.write_all(&m.encode());
        Err(NodeError::Mismatch {
            field: field.into(),
            host,
            rank,
        })
    };
    let ranks = shared.lock().ranks.len();
    let r = local_rank as usize;
    if r >= ranks {
        return refuse(stream, "local_rank", format!("< {ranks}"), r.to_string());
    }
    if let Some((field, host, rank)) = first_difference(&shared.config, &config) {
        return refuse(stream, field, host, rank);
    }
    let reader = stream.try_clone().map_err(io)?;
    // The rank's place is held while the welcome is sent, outside the lock.
    {
        let mut s = shared.lock();
        if s.ranks[r].stream.is_some() || s.ranks[r].attaching {
            drop(s);
            return refuse(
                stream,
                "local_rank",
                "attached already".into(),
                r.to_string(),
            );
        }
        s.ranks[r].attaching = true;
    }
    let welcome = ToRank::Welcome {
        pid: std::process::id(),
        arena_bytes: shared.arena.len() as u64,
        slots: shared.options.slots_per_rank as u32,
        positions: shared.positions.clone(),
    };
    // Attached from here on, the rank's writes are the feeder's, bounded by its slots.
    let sent = send_with_fd(&stream, &welcome.encode(), shared.arena.fd())
        .and_then(|()| stream.set_write_timeout(None));
    {
        let mut s = shared.lock();
        s.ranks[r].attaching = false;
        if sent.is_ok() {
            s.ranks[r].stream = Some(stream);
            s.attached += 1;
        }
    }
    sent.map_err(io)?;
    shared.changed.notify_all();
    let pid = peer.pid;
    log::debug!(
        "lobster-node host {}: local rank {r} (pid {pid}) attached",
        shared.address
    );
    let s = Arc::clone(shared);
    spawn(&format!("lobster-host-read-{r}"), move || {
        read_releases(&s, r, reader, pid)
    })?;
    Ok(())
}

/// Takes rank `r`'s releases until its socket closes.
fn read_releases(shared: &Arc<Shared>, r: usize, mut stream: UnixStream, pid: u32) {
    let mut buf = Vec::new();
    let why = loop {
        match read_frame(&mut stream, &mut buf) {
            Ok(true) => match ToHost::decode(&buf) {
                Ok(ToHost::Want) => {
                    shared.lock().ranks[r].wants += 1;
                    shared.changed.notify_all();
                }
                Ok(ToHost::Release { slot }) if (slot as usize) < shared.options.slots_per_rank => {
                    let mut s = shared.lock();
                    if !s.ranks[r].free.contains(&slot) {
                        s.ranks[r].free.push_back(slot);
                    }
                    drop(s);
                    shared.changed.notify_all();
                }
                Ok(other) => break format!("sent {other:?} instead of a release"),
                Err(e) => break e.to_string(),
            },
            Ok(false) => break format!("process {pid} closed its connection"),
            Err(e) => break format!("process {pid}: {e}"),
        }
    };
    let ended = shared.lock().ranks[r].ended;
    if !ended {
        shared.stop(Stopped::RankGone {
            rank: r,
            reason: why,
        });
    }
}

/// Sends `m` to a rank; a failed send is that rank going away (its reader says why).
fn send(stream: &mut Option<UnixStream>, m: &ToRank) -> bool {
    match stream {
        Some(s) => s.write_all(&m.encode()).is_ok(),
        None => false,
    }
}

/// Writes `batch`'s samples into rank `r`'s `slot` of the arena: where each is. `None` (and
/// the job stopped, naming the sample) when they do not fit in a slot.
fn place<T: AsRef<[u8]>>(
    shared: &Shared,
    r: usize,
    slot: u32,
    batch: &lobster_io::Batch<T>,
) -> Option<Vec<Placed>> {
    let slot_bytes = shared.options.slot_bytes;
    let base = shared.slot_offset(r, slot);
    let mut at = 0u64;
    let mut samples = Vec::with_capacity(batch.samples.len());
    for s in &batch.samples {
        let bytes = s.value.as_ref();
        let len = bytes.len() as u64;
        if at + len > slot_bytes {
            shared.stop(Stopped::Loader(format!(
                "local rank {r}'s batch (epoch {}, iteration {}) needs more than a slot's \
                 {slot_bytes} bytes at sample {}: raise slot_bytes",
                batch.epoch, batch.iteration, s.id
            )));
            return None;
        }
        shared.arena.write_at((base + at) as usize, bytes);
        samples.push(Placed {
            id: s.id,
            label: s.label,
            offset: base + at,
            len,
        });
        at += len;
    }
    Some(samples)
}

/// Feeds rank handle `handle`'s batches to its process, one each time the rank asks.
fn feed<T: AsRef<[u8]>>(shared: &Arc<Shared>, handle: RankHandle<T>) {
    let r = handle.rank();
    // Wait for the rank to attach (or the job to stop); this thread alone writes to it.
    let mut stream = {
        let mut s = shared.lock();
        while s.ranks[r].stream.is_none() && s.stopped.is_none() {
            s = shared.changed.wait(s).expect("host state poisoned");
        }
        s.ranks[r].stream.as_ref().and_then(|s| s.try_clone().ok())
    };
    let mut handle = handle;
    loop {
        // The rank's next ask, or the job stopped.
        {
            let mut s = shared.lock();
            while s.ranks[r].wants == 0 && s.stopped.is_none() {
                s = shared.changed.wait(s).expect("host state poisoned");
            }
            if s.stopped.is_some() {
                break;
            }
            s.ranks[r].wants -= 1;
        }
        let Some(batch) = handle.next() else { break };
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                if shared.lock().stopped.is_some() {
                    break;
                }
                // A failed batch, as the in-process loader reports it; the handle ends
                // itself after an error that stops the loader.
                let failed = ToRank::Failed {
                    kind: Failure::of(&e),
                    reason: e.to_string(),
                };
                if !send(&mut stream, &failed) {
                    break;
                }
                continue;
            }
        };
        // A free slot, or the job stopped.
        let slot = {
            let mut s = shared.lock();
            loop {
                if s.stopped.is_some() {
                    break None;
                }
                if let Some(slot) = s.ranks[r].free.pop_front() {
                    break Some(slot);
                }
                s = shared.changed.wait(s).expect("host state poisoned");
            }
        };
        let Some(slot) = slot else { break };
        let Some(samples) = place(shared, r, slot, &batch) else {
            break;
        };
        let m = ToRank::Batch {
            slot,
            epoch: batch.epoch,
            iteration: batch.iteration,
            samples,
            skipped: batch.skipped,
        };
        if !send(&mut stream, &m) {
            break;
        }
    }
    let stopped = shared.lock().stopped.clone();
    match stopped {
        Some(why) => {
            send(&mut stream, &why.message());
        }
        None => {
            shared.lock().ranks[r].ended = true;
            send(&mut stream, &ToRank::End);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lobster_io::{Assign, FolderOptions, LinkPrices};

    /// The fields in which two fingerprints differ.
    fn differing(a: &[(String, String)], b: &[(String, String)]) -> Vec<String> {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .filter(|(x, y)| x != y)
            .map(|(x, _)| x.0.clone())
            .collect()
    }

    #[test]
    fn what_changes_which_node_reads_what_is_in_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("c0")).unwrap();
        std::fs::write(dir.path().join("c0/a.bin"), b"sample").unwrap();
        let options = FolderOptions {
            table_dir: None,
            extensions: vec!["bin".into()],
        };
        let ds = Dataset::open_folder(dir.path(), &options).unwrap();
        let base = LoaderConfig::default();
        let mut locality = base.clone();
        locality.job.assign = Assign::Locality;
        let mut priced = base.clone();
        priced.cache.link_prices = Some(LinkPrices {
            storage_bytes_per_s: 30_000_000,
            net_bytes_per_s: 40_000_000,
        });
        let of = |c: &LoaderConfig| fingerprint(&ds, c, 1);
        assert_eq!(differing(&of(&base), &of(&locality)), ["assign"]);
        assert_eq!(differing(&of(&base), &of(&priced)), ["link_prices"]);
        let shown = of(&priced);
        assert!(shown.contains(&("link_prices".into(), "30000000 40000000".into())));
    }
}
