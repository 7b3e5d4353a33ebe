//! Peer nodes' caches: a miss a peer is planned to hold ([`PeerPlan`]) is fetched from it
//! when the cost model prices that below a storage read; a peer that answers "miss", or not
//! in time, sends the read to storage after all, counted. This node's cache is served to its
//! peers from the slots the planner keeps.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use lobster_net::{Answer, Served, Transport};
use lobster_sched::{CostModel, Tier};

use super::context::Context;
use super::order::{IoRequest, ToDispatcher};
use super::slot::{Origin, Slot};
use super::state::PipelineState;
use super::sync::lock;
use crate::holders::PeerPlan;

/// The peers of this node, fixed at build time.
pub(crate) struct Peers {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) plan: PeerPlan,
    pub(crate) served: Arc<ServedSlots>,
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
    pub(crate) fn source(&self, model: &CostModel, position: u64, bytes: u64) -> Option<usize> {
        let peer = self.plan.holder(position)?;
        let cost = |tier| {
            let t = model.params().tier(tier);
            t.request_s + t.per_byte_s * bytes as f64
        };
        (cost(Tier::Remote) <= cost(Tier::Storage)).then_some(peer)
    }
}

/// The cached samples' slots by sample, as peers see them: a sample whose read has not
/// completed, or that failed, is a miss.
#[derive(Debug, Default)]
pub(crate) struct ServedSlots {
    slots: Mutex<HashMap<u32, Arc<Slot>>>,
}

impl ServedSlots {
    pub(crate) fn insert(&self, sample: u32, slot: Arc<Slot>) {
        lock(&self.slots).insert(sample, slot);
    }

    pub(crate) fn remove_all(&self, samples: &[u32]) {
        if samples.is_empty() {
            return;
        }
        let mut slots = lock(&self.slots);
        for s in samples {
            slots.remove(s);
        }
    }
}

impl Served for ServedSlots {
    fn get(&self, sample: u32) -> Option<Bytes> {
        let slot = lock(&self.slots).get(&sample).cloned()?;
        slot.bytes()
    }
}

/// Fetches `req`'s sample from `peer`; the answer fills its slot, or sends the read to the
/// dispatcher.
pub(crate) fn fetch<T: Send + 'static>(
    ctx: &Arc<Context<T>>,
    state: &Arc<PipelineState<T>>,
    req: IoRequest,
    peer: usize,
) {
    let peers = ctx.peers.as_ref().expect("a peer fetch has peers");
    peers.counters.planned.fetch_add(1, Ordering::Relaxed);
    let (c, s) = (ctx.clone(), state.clone());
    let sample = req.sample;
    let issued = Instant::now();
    peers.transport.fetch(
        peer,
        sample,
        Box::new(move |answer| answered(&c, &s, req, peer, issued, answer)),
    );
}

fn answered<T>(
    ctx: &Context<T>,
    state: &PipelineState<T>,
    req: IoRequest,
    peer: usize,
    issued: Instant,
    answer: Answer,
) {
    let peers = ctx.peers.as_ref().expect("a peer fetch has peers");
    let size = ctx.meta(req.sample).size_bytes;
    match checked(answer, size, req.sample, peer, &peers.counters) {
        Some(bytes) => {
            peers.counters.hits.fetch_add(1, Ordering::Relaxed);
            lock(&state.model).observe_read(Tier::Remote, size, issued.elapsed());
            let mut released = Vec::new();
            // A kept sample is copied out of the message it came in.
            req.slot.fill(
                Ok(bytes),
                req.admitted,
                Origin::Pool,
                ctx.arena.as_ref(),
                &mut released,
            );
            state.ready(released);
        }
        None => {
            state.read_path.dispatched.fetch_add(1, Ordering::Relaxed);
            let tx = state.to_dispatcher.as_ref().expect("pipelined");
            // Fails only once the pipeline stops, which then ends the sample anyway.
            let _ = tx.send(ToDispatcher::Reads(vec![req]));
        }
    }
}

/// Fetches `sample` from `peer` and waits for the answer (a read-then-decode worker):
/// its bytes, or `None` when storage must serve it.
pub(crate) fn fetch_blocking<T>(
    ctx: &Context<T>,
    state: &PipelineState<T>,
    sample: u32,
    peer: usize,
) -> Option<Bytes> {
    let peers = ctx.peers.as_ref().expect("a peer fetch has peers");
    peers.counters.planned.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = crossbeam_channel::bounded(1);
    let issued = Instant::now();
    peers.transport.fetch(
        peer,
        sample,
        Box::new(move |answer| {
            let _ = tx.send(answer);
        }),
    );
    let answer = rx
        .recv()
        .unwrap_or_else(|_| Answer::Failed("the transport dropped the fetch".into()));
    let size = ctx.meta(sample).size_bytes;
    let bytes = checked(answer, size, sample, peer, &peers.counters)?;
    peers.counters.hits.fetch_add(1, Ordering::Relaxed);
    lock(&state.model).observe_read(Tier::Remote, size, issued.elapsed());
    Some(bytes)
}

/// The answer's bytes if they are the sample's; anything else is counted as a remote miss.
fn checked(
    answer: Answer,
    size_bytes: u64,
    sample: u32,
    peer: usize,
    counters: &PeerCounters,
) -> Option<Bytes> {
    match answer {
        Answer::Bytes(b) if b.len() as u64 == size_bytes => return Some(b),
        Answer::Bytes(b) => log::warn!(
            "node {peer} sent {} bytes for sample {sample} of {size_bytes}: read from storage",
            b.len()
        ),
        Answer::Miss => {}
        Answer::TimedOut => {
            counters.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        Answer::Failed(why) => log::warn!("fetching sample {sample} from node {peer}: {why}"),
    }
    counters.misses.fetch_add(1, Ordering::Relaxed);
    None
}
