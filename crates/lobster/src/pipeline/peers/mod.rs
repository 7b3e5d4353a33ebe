//! Peer nodes' caches: which peer a miss may come from ([`PeerPlan`], priced by the cost
//! model), what the peers did for this node, and this node's cache as its peers see it (the
//! landings the planner keeps). The fetches themselves are in [`fetch`].

pub(super) mod fetch;
pub mod plan;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use lobster_net::{Served, Transport};
use lobster_sched::{CostParams, Tier};

use crate::pipeline::access::AccessLanding;
use crate::pipeline::sync::lock;
use plan::PeerPlan;

/// The peers of this node, fixed at build time.
pub(crate) struct Peers {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) plan: PeerPlan,
    pub(crate) served: Arc<ServedLandings>,
    pub(crate) counters: PeerCounters,
}

/// What the peers did for this node.
#[derive(Debug, Default)]
pub(crate) struct PeerCounters {
    /// Misses sent to a peer (the planned remote hits), and those it answered with bytes.
    pub(crate) planned: AtomicU64,
    pub(crate) hits: AtomicU64,
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

/// The cached samples' landings by sample, as peers see them: a sample whose read has not
/// completed, or that failed, is a miss.
#[derive(Debug, Default)]
pub(crate) struct ServedLandings {
    landings: Mutex<HashMap<u32, Arc<AccessLanding>>>,
}

impl ServedLandings {
    pub(crate) fn insert(&self, sample: u32, landing: Arc<AccessLanding>) {
        lock(&self.landings).insert(sample, landing);
    }

    pub(crate) fn remove_all(&self, samples: &[u32]) {
        if samples.is_empty() {
            return;
        }
        let mut landings = lock(&self.landings);
        for s in samples {
            landings.remove(s);
        }
    }
}

impl Served for ServedLandings {
    fn get(&self, sample: u32) -> Option<Bytes> {
        let landing = lock(&self.landings).get(&sample).cloned()?;
        landing.bytes()
    }
}
