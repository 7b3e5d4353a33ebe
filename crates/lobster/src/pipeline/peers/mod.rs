//! Peer nodes' caches: which peer a miss may come from ([`PeerHolders`], priced by the cost
//! model), what the peers did for this node, and this node's cache as its peers see it (the
//! landings the planner keeps). The fetches themselves are in [`fetch`].

pub(super) mod fetch;
pub mod plan;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use lobster_net::{Reply, Served, Transport};
use lobster_sched::{CostParams, Tier};

use crate::pipeline::access::AccessLanding;
use crate::pipeline::sync::lock;
use plan::PeerHolders;

/// The peers of this node, fixed at build time.
pub(crate) struct Peers {
    pub(crate) transport: Arc<dyn Transport>,
    /// Each peer's own plan replayed (`PeerHolders::empty` under the cluster plan, where the
    /// cache's decisions say where each miss comes from).
    pub(crate) plan: PeerHolders,
    /// The nodes' caches are planned as one (see `lobster_cache::cluster`).
    pub(crate) cluster: bool,
    /// Under the cluster plan: each step's samples go to the ranks of the nodes that hold
    /// them (`lobster_cache::Assign::Locality`).
    pub(crate) locality: bool,
    /// Under the cluster plan: the storage bytes the planner may read ahead of the prefetch
    /// distance (the pool holds them on top of its window).
    pub(crate) read_ahead_bytes: u64,
    pub(crate) served: Arc<ServedLandings>,
    pub(crate) counters: PeerCounters,
    /// Answers being handled; closed when the loader stops.
    pub(crate) gate: Arc<FetchGate>,
}

/// The answers of fetches being handled, so that a stopping loader waits for them and none
/// starts after: the loader is then dropped by the thread that drops it, never by a
/// transport's thread finishing an answer.
#[derive(Debug, Default)]
pub(crate) struct FetchGate {
    state: Mutex<(bool, usize)>,
    idle: std::sync::Condvar,
}

/// An answer being handled; leaving lets a stopping loader go on.
pub(crate) struct InGate<'a>(&'a FetchGate);

impl FetchGate {
    /// Whether an answer may be handled (the loader has not stopped); held while it is.
    pub(crate) fn enter(&self) -> Option<InGate<'_>> {
        let mut s = lock(&self.state);
        if s.0 {
            return None;
        }
        s.1 += 1;
        Some(InGate(self))
    }

    /// No answer is handled from now on; waits for those being handled.
    pub(crate) fn close(&self) {
        let mut s = lock(&self.state);
        s.0 = true;
        while s.1 > 0 {
            s = self.idle.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for InGate<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.1 -= 1;
        if s.1 == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// What the peers did for this node.
#[derive(Debug, Default)]
pub(crate) struct PeerCounters {
    /// Misses sent to a peer (the planned remote hits), and those it answered with bytes.
    pub(crate) planned: AtomicU64,
    pub(crate) hits: AtomicU64,
    /// The bytes of those hits: what came over the interconnect.
    pub(crate) hit_bytes: AtomicU64,
    /// Sent and not served by the peer (a miss, a timeout, a failure), read from storage.
    pub(crate) misses: AtomicU64,
    /// Of those, no answer in time.
    pub(crate) timeouts: AtomicU64,
}

impl Peers {
    /// The peer to fetch the miss at stream position `position` of `bytes` from, if one is
    /// planned to hold it and the cost model prices it below storage.
    pub(crate) fn source(&self, costs: &CostParams, position: u64, bytes: u64) -> Option<usize> {
        let peer = self.plan.holder(position)?;
        let cost = |tier| {
            let t = costs.tier(tier);
            t.request_s + t.per_byte_s * bytes as f64
        };
        (cost(Tier::Remote) <= cost(Tier::Storage)).then_some(peer)
    }
}

/// Parked fetches at most: beyond it a fetch of a sample not yet read here is a miss.
const PARKED_MAX: usize = 1 << 16;

/// The cached samples' landings by sample, as peers see them: a sample whose read failed is
/// a miss. Under the cluster plan a peer may ask before this node's planner has reached the
/// read it was planned to serve from (the peer runs ahead within its prefetch window): the
/// fetch is parked until the sample is admitted, and answered when its read lands; and a
/// sample the plan evicts stays served until every node has passed the step, since a peer's
/// last planned use may still be in flight.
#[derive(Debug, Default)]
pub(crate) struct ServedLandings {
    inner: Mutex<ServedInner>,
}

#[derive(Default)]
struct ServedInner {
    landings: HashMap<u32, Arc<AccessLanding>>,
    /// Under the cluster plan: fetches may park, and evictions wait.
    cluster: bool,
    /// Steps a parked fetch waits at most, counted in batches this node's ranks take.
    park_steps: u64,
    /// Batches the slowest rank of this node has taken, as last told.
    taken: u64,
    /// Evicted samples still served, with the count of taken batches that releases them.
    leaving: VecDeque<(u64, u32, Arc<AccessLanding>)>,
    /// Fetches of samples not yet admitted, with the count of taken batches they wait until.
    parked: HashMap<u32, Vec<(u64, Reply)>>,
    parked_count: usize,
    /// The planner has decided every access: a sample not held now never will be.
    planned_all: bool,
}

impl std::fmt::Debug for ServedInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedInner")
            .field("landings", &self.landings.len())
            .field("cluster", &self.cluster)
            .field("leaving", &self.leaving.len())
            .field("parked", &self.parked_count)
            .finish()
    }
}

impl ServedLandings {
    /// Landings served under the cluster plan: a fetch of a sample not yet admitted waits up
    /// to `park_steps` batches of this node's slowest rank.
    pub(crate) fn for_cluster(park_steps: u64) -> Self {
        ServedLandings {
            inner: Mutex::new(ServedInner {
                landings: HashMap::new(),
                cluster: true,
                park_steps,
                taken: 0,
                leaving: VecDeque::new(),
                parked: HashMap::new(),
                parked_count: 0,
                planned_all: false,
            }),
        }
    }

    pub(crate) fn insert(&self, sample: u32, landing: Arc<AccessLanding>) {
        let parked = {
            let mut inner = lock(&self.inner);
            inner.landings.insert(sample, landing.clone());
            let parked = inner.parked.remove(&sample).unwrap_or_default();
            inner.parked_count -= parked.len();
            parked
        };
        for (_, reply) in parked {
            landing.serve(reply);
        }
    }

    /// Stops serving `samples` at once (each node's own plan: peers ask only with a margin).
    pub(crate) fn remove_all(&self, samples: &[u32]) {
        if samples.is_empty() {
            return;
        }
        let mut inner = lock(&self.inner);
        for s in samples {
            inner.landings.remove(s);
        }
    }

    /// Stops serving `samples`, which the cluster plan evicts at step `step`, once this
    /// node's ranks have all taken the batch two steps later: nodes meet every step, so
    /// every peer has taken its batch of `step` by then, and with it its fetches.
    pub(crate) fn leave(&self, samples: &[u32], step: u64) {
        if samples.is_empty() {
            return;
        }
        let mut inner = lock(&self.inner);
        for &s in samples {
            if let Some(l) = inner.landings.get(&s).cloned() {
                inner.leaving.push_back((step + 3, s, l));
            }
        }
    }

    /// This node's slowest rank has taken `taken` batches: samples left and fetches parked
    /// past their time go (the latter answered as misses).
    pub(crate) fn expire(&self, taken: u64) {
        let late = {
            let mut inner = lock(&self.inner);
            inner.taken = inner.taken.max(taken);
            while inner.leaving.front().is_some_and(|l| l.0 <= taken) {
                let (_, s, l) = inner.leaving.pop_front().expect("looked at");
                // Admitted again since: the new landing stays.
                if inner
                    .landings
                    .get(&s)
                    .is_some_and(|now| Arc::ptr_eq(now, &l))
                {
                    inner.landings.remove(&s);
                }
            }
            let mut late = Vec::new();
            if inner.parked_count > 0 {
                for waits in inner.parked.values_mut() {
                    let mut i = 0;
                    while i < waits.len() {
                        if waits[i].0 <= taken {
                            late.push(waits.swap_remove(i).1);
                        } else {
                            i += 1;
                        }
                    }
                }
                inner.parked.retain(|_, w| !w.is_empty());
                inner.parked_count -= late.len();
            }
            late
        };
        for reply in late {
            reply(None);
        }
    }

    /// The planner has decided every access: parked fetches are misses, and so is any
    /// later fetch of a sample not held.
    pub(crate) fn planned_all(&self) {
        let parked = {
            let mut inner = lock(&self.inner);
            inner.planned_all = true;
            inner.parked_count = 0;
            std::mem::take(&mut inner.parked)
        };
        for (_, waits) in parked {
            for (_, reply) in waits {
                reply(None);
            }
        }
    }
}

impl Served for ServedLandings {
    fn get(&self, sample: u32) -> Option<Bytes> {
        let landing = lock(&self.inner).landings.get(&sample).cloned()?;
        landing.bytes()
    }

    fn get_or_wait(&self, sample: u32, reply: Reply) {
        let landing = {
            let mut inner = lock(&self.inner);
            match inner.landings.get(&sample).cloned() {
                Some(l) => Some(l),
                None if inner.cluster && !inner.planned_all && inner.parked_count < PARKED_MAX => {
                    // Saturating: with every local rank gone, `taken` is the end of time.
                    let until = inner.taken.saturating_add(inner.park_steps);
                    inner.parked.entry(sample).or_default().push((until, reply));
                    inner.parked_count += 1;
                    return;
                }
                None => None,
            }
        };
        match landing {
            Some(l) => l.serve(reply),
            None => reply(None),
        }
    }
}

impl Drop for ServedInner {
    fn drop(&mut self) {
        // Every parked fetch is answered, if only with a miss.
        for (_, waits) in self.parked.drain() {
            for (_, reply) in waits {
                reply(None);
            }
        }
    }
}
