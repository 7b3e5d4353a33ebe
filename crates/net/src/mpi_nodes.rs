//! The nodes of an MPI job, on one thread that owns MPI.
//!
//! lobster's threads never call MPI themselves: they send commands to the owning thread and
//! wait for its answer, so MPI is called from one thread at a time and
//! `MPI_THREAD_SERIALIZED` is enough. If the program initialised MPI before, lobster uses that
//! library and leaves finalising it to the program; otherwise it initialises MPI on its
//! thread and finalises it when [`MpiNodes`] drops.
//!
//! The thread is an event loop: fetches queued in one turn go to each peer as one request
//! message ([`crate::wire`]), peers' requests are answered from the served cache (a request
//! whose samples' reads are in flight here is answered when they land), replies
//! complete their fetches, and a fetch without a reply within the fetch timeout is answered
//! [`Answer::TimedOut`] (a late reply is dropped). The step barrier is `MPI_Ibarrier`, polled
//! between the rest, so a node waiting at it still serves its peers; one that does not
//! complete within the collective timeout fails with an error saying so.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use mpi::datatype::PartitionMut;
use mpi::environment::{self, Threading};
use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};
use mpi::{Count, Tag};

use crate::agreement::{Agreement, ENCODED_MAX_BYTES};
use crate::error::NetError;
use crate::transport::{Answer, Done, Served, Transport, TransportStats};
use crate::wire;

/// How long the transport waits before it gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// A fetch not answered within this is answered [`Answer::TimedOut`].
    pub fetch: Duration,
    /// A barrier not completed within this fails: a node has stopped or hangs.
    pub collective: Duration,
}

impl Default for Timeouts {
    /// 5 s a fetch (a reply is milliseconds away), 120 s a barrier (a step may be long).
    fn default() -> Self {
        Timeouts {
            fetch: Duration::from_secs(5),
            collective: Duration::from_secs(120),
        }
    }
}
/// The event loop's longest sleep while nothing of its own is in flight: how soon a peer's
/// request is seen.
const IDLE_POLL: Duration = Duration::from_micros(500);
/// Its sleep while fetches, sends or a barrier are in flight.
const BUSY_POLL: Duration = Duration::from_micros(50);
/// Incoming messages taken per turn at most, so commands are never starved.
const RECEIVES_PER_TURN: usize = 64;

const TAG_REQUEST: Tag = 0x4c42_0001;
const TAG_REPLY: Tag = 0x4c42_0002;

/// What the owning thread is asked to do; each command carries where its answer goes.
enum Command {
    Agree(Agreement, Sender<Result<(), NetError>>),
    Barrier(Sender<Result<(), NetError>>),
    Gather(Vec<u8>, Sender<Result<Vec<Vec<u8>>, NetError>>),
    Fetch {
        peer: usize,
        sample: u32,
        done: Done,
    },
    Serve(Option<Arc<dyn Served>>),
    #[cfg(feature = "lab")]
    Silence,
}

/// This process as one node of the MPI job.
pub struct MpiNodes {
    commands: Option<Sender<Command>>,
    thread: Option<JoinHandle<()>>,
    node: usize,
    nodes: usize,
    stats: Arc<Mutex<TransportStats>>,
}

impl std::fmt::Debug for MpiNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiNodes")
            .field("node", &self.node)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl MpiNodes {
    /// Starts the thread that owns MPI (initialising it if the program has not).
    ///
    /// # Errors
    /// MPI initialised, by the program or here, with less than `MPI_THREAD_SERIALIZED`, or the
    /// thread could not start.
    pub fn start() -> Result<MpiNodes, NetError> {
        MpiNodes::start_with(Timeouts::default())
    }

    /// As [`MpiNodes::start`], with these timeouts.
    ///
    /// # Errors
    /// As [`MpiNodes::start`].
    pub fn start_with(timeouts: Timeouts) -> Result<MpiNodes, NetError> {
        let (started_tx, started_rx) = bounded(1);
        // Fetches are queued here too: room for a prefetch window of them.
        let (commands, queue) = bounded(1 << 16);
        let stats = Arc::new(Mutex::new(TransportStats::default()));
        let s = stats.clone();
        let thread = std::thread::Builder::new()
            .name("lobster-mpi".into())
            .spawn(move || own_mpi(started_tx, queue, s, timeouts))
            .map_err(|e| NetError::Mpi {
                reason: format!("cannot start the thread that owns MPI: {e}"),
            })?;
        let started = started_rx.recv().unwrap_or(Err(NetError::Stopped));
        let (node, nodes) = match started {
            Ok(place) => place,
            Err(e) => {
                let _ = thread.join();
                return Err(e);
            }
        };
        Ok(MpiNodes {
            commands: Some(commands),
            thread: Some(thread),
            node,
            nodes,
            stats,
        })
    }

    /// This process's node, its rank in `MPI_COMM_WORLD`.
    pub fn node(&self) -> usize {
        self.node
    }

    /// Nodes in the job.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Checks that every node brings the same fields: collective, every node must call it.
    ///
    /// # Errors
    /// [`NetError::Disagree`] on every node, naming the first node and field that differ from
    /// node 0's; [`NetError::Garbled`] if a node's fields did not decode.
    pub fn agree(&self, ours: Agreement) -> Result<(), NetError> {
        let (tx, rx) = bounded(1);
        self.send(Command::Agree(ours, tx))?;
        rx.recv().map_err(|_| NetError::Stopped)?
    }

    /// Waits until every node is here, serving peers meanwhile.
    ///
    /// # Errors
    /// [`NetError::Timeout`] if some node does not arrive within the collective timeout; the
    /// owning thread has stopped.
    pub fn barrier(&self) -> Result<(), NetError> {
        let (tx, rx) = bounded(1);
        self.send(Command::Barrier(tx))?;
        rx.recv().map_err(|_| NetError::Stopped)?
    }

    /// Every node's `ours`, in node order: collective, every node must call it.
    ///
    /// # Errors
    /// A node's bytes past [`wire::SAMPLE_MAX_BYTES`]; the owning thread has stopped.
    pub fn all_gather(&self, ours: Vec<u8>) -> Result<Vec<Vec<u8>>, NetError> {
        let (tx, rx) = bounded(1);
        self.send(Command::Gather(ours, tx))?;
        rx.recv().map_err(|_| NetError::Stopped)?
    }

    /// From now on this node takes its peers' requests and never answers them (a fault;
    /// feature `lab`): their fetches time out.
    #[cfg(feature = "lab")]
    pub fn silence(&self) -> Result<(), NetError> {
        self.send(Command::Silence)
    }

    fn send(&self, c: Command) -> Result<(), NetError> {
        self.commands
            .as_ref()
            .ok_or(NetError::Stopped)?
            .send(c)
            .map_err(|_| NetError::Stopped)
    }
}

impl Transport for MpiNodes {
    fn node(&self) -> usize {
        self.node
    }

    fn nodes(&self) -> usize {
        self.nodes
    }

    fn fetch(&self, peer: usize, sample: u32, done: Done) {
        let Some(commands) = &self.commands else {
            done(Answer::Failed(
                "the thread that owns MPI has stopped".into(),
            ));
            return;
        };
        if let Err(e) = commands.send(Command::Fetch { peer, sample, done }) {
            if let Command::Fetch { done, .. } = e.into_inner() {
                done(Answer::Failed(
                    "the thread that owns MPI has stopped".into(),
                ));
            }
        }
    }

    fn serve(&self, cache: Arc<dyn Served>) {
        let _ = self.send(Command::Serve(Some(cache)));
    }

    fn unserve(&self) {
        let _ = self.send(Command::Serve(None));
    }

    fn stats(&self) -> TransportStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for MpiNodes {
    fn drop(&mut self) {
        // The thread ends when its queue closes, finalising MPI if it initialised it.
        drop(self.commands.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A message MPI is sending from memory the loop owns until the send completes.
struct OwnedSend {
    request: Option<Request<'static, [u8], StaticScope>>,
    buf: *mut [u8],
}

impl OwnedSend {
    fn start(world: &SimpleCommunicator, dest: usize, tag: Tag, bytes: Vec<u8>) -> OwnedSend {
        let buf: &'static mut [u8] = Box::leak(bytes.into_boxed_slice());
        let ptr: *mut [u8] = buf;
        let request =
            world
                .process_at_rank(dest as i32)
                .immediate_send_with_tag(StaticScope, &*buf, tag);
        OwnedSend {
            request: Some(request),
            buf: ptr,
        }
    }

    /// Whether the send completed (then its buffer is freed).
    fn done(&mut self) -> bool {
        let Some(r) = self.request.take() else {
            return true;
        };
        match r.test() {
            Ok(_) => {
                // SAFETY: the pointer came from Box::leak in `start`, MPI has completed the
                // send and so no longer reads the buffer, and the request that borrowed it
                // is gone.
                drop(unsafe { Box::from_raw(self.buf) });
                true
            }
            Err(r) => {
                self.request = Some(r);
                false
            }
        }
    }

    /// Gives up on an incomplete send at shutdown: its request and buffer are leaked, as
    /// MPI may still read the buffer.
    fn abandon(mut self) {
        if let Some(r) = self.request.take() {
            std::mem::forget(r);
        }
    }
}

/// Fetches sent to a peer, waiting for its reply.
struct Pending {
    peer: usize,
    entries: Vec<(u32, Done)>,
    deadline: Instant,
}

/// The step barrier in flight: its request, who waits for it, and its deadline.
type InBarrier = (Request<'static, ()>, Sender<Result<(), NetError>>, Instant);

/// A peer's request whose answers are still coming from the served cache (some of its
/// samples' reads are in flight on this node): sent once the last one arrives.
struct PartialReply {
    from: usize,
    id: u64,
    answers: Vec<Option<Bytes>>,
    left: usize,
}

/// A reply whose every answer is in: (the peer, the request id, the answers).
type FullReply = (usize, u64, Vec<Option<Bytes>>);

/// The event loop's state.
struct Loop<'w> {
    world: &'w SimpleCommunicator,
    nodes: usize,
    served: Option<Arc<dyn Served>>,
    silent: bool,
    queued: HashMap<usize, Vec<(u32, Done)>>,
    pending: HashMap<u64, Pending>,
    next_id: u64,
    sends: Vec<OwnedSend>,
    barrier: Option<InBarrier>,
    stats: Arc<Mutex<TransportStats>>,
    timeouts: Timeouts,
    /// Replies completed by the served cache on other threads, sent from here.
    full_tx: Sender<FullReply>,
    full_rx: Receiver<FullReply>,
}

/// The owning thread: initialise (or take up) MPI, say where this node stands, then serve
/// commands and peers until the queue closes.
fn own_mpi(
    started: Sender<Result<(usize, usize), NetError>>,
    queue: Receiver<Command>,
    stats: Arc<Mutex<TransportStats>>,
    timeouts: Timeouts,
) {
    let universe = if environment::is_initialized() {
        None
    } else {
        match mpi::initialize_with_threading(Threading::Serialized) {
            Some((universe, _)) => Some(universe),
            None => {
                let _ = started.send(Err(NetError::Mpi {
                    reason: "MPI_Init_thread failed".into(),
                }));
                return;
            }
        }
    };
    let level = environment::threading_support();
    if level < Threading::Serialized {
        let _ = started.send(Err(NetError::Mpi {
            reason: format!(
                "MPI was initialised with threading {level:?}; lobster calls MPI from its own \
                 thread and needs Serialized or Multiple (MPI_Init_thread)"
            ),
        }));
        return;
    }
    let world = SimpleCommunicator::world();
    let place = (world.rank() as usize, world.size() as usize);
    if started.send(Ok(place)).is_err() {
        return;
    }
    // Bounded by the peers' requests in flight: each holds at most one reply here.
    let (full_tx, full_rx) = crossbeam_channel::unbounded();
    let mut l = Loop {
        full_tx,
        full_rx,
        world: &world,
        nodes: place.1,
        served: None,
        silent: false,
        queued: HashMap::new(),
        pending: HashMap::new(),
        next_id: 0,
        sends: Vec::new(),
        barrier: None,
        stats,
        timeouts,
    };
    loop {
        let busy = !l.pending.is_empty() || !l.sends.is_empty() || l.barrier.is_some();
        let wait = if busy { BUSY_POLL } else { IDLE_POLL };
        match queue.recv_timeout(wait) {
            Ok(c) => {
                l.command(c);
                while let Ok(c) = queue.try_recv() {
                    l.command(c);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        l.turn();
    }
    l.shut_down();
    drop(universe);
}

impl Loop<'_> {
    fn command(&mut self, c: Command) {
        match c {
            Command::Agree(ours, answer) => {
                let _ = answer.send(agree(self.world, &ours));
            }
            Command::Gather(ours, answer) => {
                let _ = answer.send(all_gather(self.world, &ours));
            }
            Command::Barrier(answer) => {
                if self.barrier.is_some() {
                    let _ = answer.send(Err(NetError::Mpi {
                        reason: "a barrier was asked while one is in flight".into(),
                    }));
                    return;
                }
                let request = self.world.immediate_barrier();
                self.barrier = Some((request, answer, Instant::now() + self.timeouts.collective));
            }
            Command::Fetch { peer, sample, done } => {
                if peer >= self.nodes || peer == self.world.rank() as usize {
                    done(Answer::Failed(format!(
                        "node {peer} is not a peer in this job of {} nodes",
                        self.nodes
                    )));
                    return;
                }
                self.queued.entry(peer).or_default().push((sample, done));
            }
            Command::Serve(served) => self.served = served,
            #[cfg(feature = "lab")]
            Command::Silence => self.silent = true,
        }
    }

    /// One turn: send the queued fetches, take incoming messages, finish sends, time out
    /// fetches, and look at the barrier.
    fn turn(&mut self) {
        let now = Instant::now();
        for (peer, mut entries) in std::mem::take(&mut self.queued) {
            while !entries.is_empty() {
                let rest = entries.split_off(entries.len().min(wire::BATCH_MAX));
                let samples: Vec<u32> = entries.iter().map(|(s, _)| *s).collect();
                let id = self.next_id;
                self.next_id += 1;
                let msg = wire::encode_request(id, &samples);
                self.sends
                    .push(OwnedSend::start(self.world, peer, TAG_REQUEST, msg));
                {
                    let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                    st.fetches += samples.len() as u64;
                    st.request_batches += 1;
                }
                self.pending.insert(
                    id,
                    Pending {
                        peer,
                        entries,
                        deadline: now + self.timeouts.fetch,
                    },
                );
                entries = rest;
            }
        }
        for _ in 0..RECEIVES_PER_TURN {
            let Some((message, status)) = self.world.any_process().immediate_matched_probe() else {
                break;
            };
            let from = status.source_rank() as usize;
            let tag = status.tag();
            let (bytes, _) = (message, status).matched_receive_vec::<u8>();
            match tag {
                TAG_REQUEST => self.answer(from, &bytes),
                TAG_REPLY => self.replied(from, Bytes::from(bytes)),
                other => log::warn!("node {from} sent a message with tag {other}: dropped"),
            }
        }
        while let Ok((from, id, answers)) = self.full_rx.try_recv() {
            self.send_reply(from, id, &answers);
        }
        self.sends.retain_mut(|s| !s.done());
        let late: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            let p = self.pending.remove(&id).expect("listed");
            self.stats
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .timed_out += p.entries.len() as u64;
            log::warn!(
                "node {} did not answer {} fetches within {:?}",
                p.peer,
                p.entries.len(),
                self.timeouts.fetch
            );
            for (_, done) in p.entries {
                done(Answer::TimedOut);
            }
        }
        if let Some((request, answer, deadline)) = self.barrier.take() {
            match request.test() {
                Ok(_) => {
                    let _ = answer.send(Ok(()));
                }
                Err(request) if Instant::now() >= deadline => {
                    // MPI cannot cancel a collective: the request is left to MPI.
                    std::mem::forget(request);
                    let _ = answer.send(Err(NetError::Timeout {
                        what: "the step barrier".into(),
                        after: self.timeouts.collective,
                    }));
                }
                Err(request) => self.barrier = Some((request, answer, deadline)),
            }
        }
    }

    /// Answers a peer's request from the served cache.
    fn answer(&mut self, from: usize, bytes: &[u8]) {
        if self.silent {
            return;
        }
        let (id, samples) = match wire::decode_request(bytes) {
            Ok(r) => r,
            Err(why) => {
                log::warn!("node {from} sent a request that does not decode ({why}): dropped");
                return;
            }
        };
        let Some(served) = self.served.clone() else {
            self.send_reply(from, id, &vec![None; samples.len()]);
            return;
        };
        let partial = Arc::new(Mutex::new(PartialReply {
            from,
            id,
            answers: vec![None; samples.len()],
            left: samples.len(),
        }));
        for (i, &s) in samples.iter().enumerate() {
            let (partial, full) = (partial.clone(), self.full_tx.clone());
            served.get_or_wait(
                s,
                Box::new(move |found| {
                    let mut p = partial.lock().unwrap_or_else(|e| e.into_inner());
                    p.answers[i] = found;
                    p.left -= 1;
                    if p.left == 0 {
                        let answers = std::mem::take(&mut p.answers);
                        // Fails only once the loop has ended: the peer's fetch times out.
                        let _ = full.send((p.from, p.id, answers));
                    }
                }),
            );
        }
        // Answers that came at once go out this turn.
        while let Ok((from, id, answers)) = self.full_rx.try_recv() {
            self.send_reply(from, id, &answers);
        }
    }

    fn send_reply(&mut self, from: usize, id: u64, answers: &[Option<Bytes>]) {
        {
            let hits = answers.iter().filter(|a| a.is_some()).count() as u64;
            let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            st.served_bytes += hits;
            st.served_miss += answers.len() as u64 - hits;
        }
        let msg = wire::encode_reply(id, answers);
        self.sends
            .push(OwnedSend::start(self.world, from, TAG_REPLY, msg));
    }

    /// Completes the fetches a peer's reply answers.
    fn replied(&mut self, from: usize, bytes: Bytes) {
        let (id, answers) = match wire::decode_reply(bytes) {
            Ok(r) => r,
            Err(why) => {
                // Its fetches time out and read storage.
                log::warn!("node {from} sent a reply that does not decode ({why}): dropped");
                return;
            }
        };
        let Some(p) = self.pending.remove(&id) else {
            return; // timed out already
        };
        if p.peer != from || answers.len() != p.entries.len() {
            log::warn!(
                "node {from} answered request {id} of node {}: dropped",
                p.peer
            );
            self.pending.insert(id, p);
            return;
        }
        let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        for ((_, done), answer) in p.entries.into_iter().zip(answers) {
            match answer {
                Some(b) => {
                    st.answered_bytes += 1;
                    done(Answer::Bytes(b));
                }
                None => {
                    st.answered_miss += 1;
                    done(Answer::Miss);
                }
            }
        }
    }

    /// The queue closed: fail what is left, and give sends a moment to finish.
    fn shut_down(mut self) {
        for (_, entries) in std::mem::take(&mut self.queued) {
            for (_, done) in entries {
                done(Answer::Failed("the transport stopped".into()));
            }
        }
        for (_, p) in std::mem::take(&mut self.pending) {
            for (_, done) in p.entries {
                done(Answer::Failed("the transport stopped".into()));
            }
        }
        if let Some((request, answer, _)) = self.barrier.take() {
            std::mem::forget(request);
            let _ = answer.send(Err(NetError::Stopped));
        }
        let until = Instant::now() + Duration::from_secs(1);
        while !self.sends.is_empty() && Instant::now() < until {
            // Peers may still ask: keep answering while our own sends drain.
            self.sends.retain_mut(|s| !s.done());
            std::thread::sleep(BUSY_POLL);
        }
        for s in self.sends.drain(..) {
            s.abandon();
        }
    }
}

/// Every node's bytes: an allgather of the lengths, then of the bytes.
fn all_gather(world: &SimpleCommunicator, ours: &[u8]) -> Result<Vec<Vec<u8>>, NetError> {
    let nodes = world.size() as usize;
    let mut lens = vec![0u64; nodes];
    world.all_gather_into(&(ours.len() as u64), &mut lens[..]);
    if let Some(node) = lens
        .iter()
        .position(|&l| l as usize > wire::SAMPLE_MAX_BYTES)
    {
        return Err(NetError::Garbled {
            node,
            reason: format!("{} bytes to gather", lens[node]),
        });
    }
    let (all, displs) = gather_varcount(world, ours, &lens);
    Ok((0..nodes)
        .map(|n| {
            let at = displs[n] as usize;
            all[at..at + lens[n] as usize].to_vec()
        })
        .collect())
}

fn gather_varcount(world: &SimpleCommunicator, ours: &[u8], lens: &[u64]) -> (Vec<u8>, Vec<Count>) {
    let counts: Vec<Count> = lens.iter().map(|&l| l as Count).collect();
    let displs: Vec<Count> = counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect();
    let total = lens.iter().sum::<u64>() as usize;
    let mut all = vec![0u8; total];
    {
        let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
        world.all_gather_varcount_into(ours, &mut partition);
    }
    (all, displs)
}

/// One allgather of the digests; if they differ, an allgather of the fields' lengths and one
/// of the fields, so that every node can name what differs.
fn agree(world: &SimpleCommunicator, ours: &Agreement) -> Result<(), NetError> {
    let nodes = world.size() as usize;
    let mut digests = vec![0u64; nodes];
    world.all_gather_into(&ours.digest(), &mut digests[..]);
    if digests.iter().all(|&d| d == digests[0]) {
        return Ok(());
    }
    let bytes = ours.encode();
    // Every node sends its length whatever it is, so the collectives stay matched; a length
    // past the bound is refused after the exchange, on every node alike.
    let mut lens = vec![0u64; nodes];
    world.all_gather_into(&(bytes.len() as u64), &mut lens[..]);
    if let Some(node) = lens.iter().position(|&l| l as usize > ENCODED_MAX_BYTES) {
        return Err(NetError::Garbled {
            node,
            reason: format!("{} bytes of plan inputs", lens[node]),
        });
    }
    let (all, displs) = gather_varcount(world, &bytes, &lens);
    let agreements = (0..nodes)
        .map(|n| {
            let at = displs[n] as usize;
            Agreement::decode(n, &all[at..at + lens[n] as usize])
        })
        .collect::<Result<Vec<_>, _>>()?;
    Agreement::check(&agreements)?;
    // Digests differed but the fields did not: only a broken exchange does that.
    Err(NetError::Garbled {
        node: digests.iter().position(|&d| d != digests[0]).unwrap_or(0),
        reason: "its digest differs from node 0's though its fields do not".into(),
    })
}
