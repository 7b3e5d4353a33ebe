//! What a loader needs from the nodes around it: ask a peer for a sample its cache holds,
//! and let peers ask this node's cache. Implemented over MPI (`MpiNodes`, feature `mpi`) and
//! in one process ([`InProcessNodes`](crate::InProcessNodes), for tests and simulations).

use std::sync::Arc;

use bytes::Bytes;

/// A peer's answer to one fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The sample's bytes, from the peer's cache.
    Bytes(Bytes),
    /// The peer does not hold the sample (no longer, or not yet).
    Miss,
    /// No answer within the transport's timeout.
    TimedOut,
    /// The transport cannot reach the peer at all (stopped, or the peer is gone).
    Failed(String),
}

/// Called exactly once with a fetch's answer, on a thread of the transport.
pub type Done = Box<dyn FnOnce(Answer) + Send>;

/// Called exactly once with what the served cache has of a sample (`None`: a miss).
pub type Reply = Box<dyn FnOnce(Option<Bytes>) + Send>;

/// What this node's cache offers its peers.
pub trait Served: Send + Sync {
    /// The bytes of `sample` if the cache holds them now.
    fn get(&self, sample: u32) -> Option<Bytes>;

    /// Answers `reply` with the bytes of `sample`, now or, where the cache's plan says it
    /// will hold them shortly (its read is in flight, or not yet issued), once it does. A
    /// cache must answer every reply it takes, a miss if it stops first. By default the
    /// answer is [`Served::get`]'s, at once.
    fn get_or_wait(&self, sample: u32, reply: Reply) {
        reply(self.get(sample));
    }
}

/// The nodes around a loader.
pub trait Transport: Send + Sync {
    /// This node.
    fn node(&self) -> usize;

    /// Nodes in the job.
    fn nodes(&self) -> usize;

    /// Asks `peer` for `sample`; `done` is called once with the answer. Never blocks on the
    /// peer: requests go out in batches per peer from the transport's own thread.
    fn fetch(&self, peer: usize, sample: u32, done: Done);

    /// Answers peers' fetches from `cache` from now on (replacing an earlier one); until
    /// then, and after [`Transport::unserve`], every fetch of this node is a miss.
    fn serve(&self, cache: Arc<dyn Served>);

    /// Stops answering from the cache given to [`Transport::serve`].
    fn unserve(&self);

    /// What the transport did so far.
    fn stats(&self) -> TransportStats;
}

/// Counters of a transport, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Fetches asked of peers, and the request messages they went out in.
    pub fetches: u64,
    pub request_batches: u64,
    /// Fetches answered with bytes, with a miss, and not answered in time.
    pub answered_bytes: u64,
    pub answered_miss: u64,
    pub timed_out: u64,
    /// Peers' fetches this node answered with bytes, and with a miss.
    pub served_bytes: u64,
    pub served_miss: u64,
}
