//! Which peer node's cache can serve each of this node's accesses: the remote half of the
//! plan, computed locally from the inputs every node shares, without traffic.
//!
//! Every node's cache is a pure function of the seed, the world, the sizes, the capacity and
//! the policy, so this node replays each peer's cache plan (one peer at a time, so memory is
//! one planner's, not the job's) and records, for each of its own accesses, a peer that holds
//! the sample throughout the access's neighbourhood. Nodes train in lock-step (every step
//! ends in a collective), so a node is at most its prefetch window ahead of another; a peer
//! is planned only where it admitted the sample more than `margin_steps` steps before the
//! access and evicts it more than `margin_steps` steps after. Without faults the peer then
//! holds the sample whenever it is asked.
//!
//! Among several peers that qualify, the choice is a hash of the access and the peer, so the
//! serving load spreads over the holders and every node computes the same choice.

use std::sync::Arc;

use lobster_cache::{Planner, PolicyKind};

use crate::error::Error;
use crate::pipeline::layout::{Head, Layout};
use crate::sampler::{DistributedSampler, EpochOrder};

/// No peer serves the access.
const NO_PEER: u16 = u16::MAX;

/// The job's shape and cache, as every node has it.
#[derive(Clone, Debug)]
pub struct PeerHoldersInputs {
    /// Each sample's size, by sample id.
    pub sizes: Arc<[u32]>,
    /// Nodes in the job.
    pub nodes: usize,
    /// Ranks per node.
    pub ranks_per_node: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Epochs of the run.
    pub epochs: u32,
    /// How each epoch is ordered.
    pub order: EpochOrder,
    /// PyTorch's `drop_last`.
    pub drop_last: bool,
    /// Every node's cache policy and capacity.
    pub policy: PolicyKind,
    /// Every node's cache capacity.
    pub capacity_bytes: u64,
    /// Steps the holder must keep the sample on either side of the access.
    pub margin_steps: u64,
}

/// For each access of one node's stream, in canonical order, the peer planned to serve it.
// What the plan-bench reads of a plan (its size, its start) is public with the lab alone.
#[cfg_attr(not(feature = "lab"), allow(dead_code))]
#[derive(Clone, Debug)]
pub struct PeerHolders {
    holders: Vec<u16>,
    planned: u64,
    build_peak_bytes: usize,
    replay_threads: usize,
}

/// Shuffled epoch orders kept for the build at most, in bytes: beyond it each peer's replay
/// draws the orders again (slower, not larger).
const ORDERS_HELD_MAX_BYTES: usize = 1 << 30;

/// Threads that replay peers at once at most: each holds a planner and a table of the
/// dataset's samples, so memory grows with them.
const REPLAY_THREADS_MAX: usize = 4;

#[cfg_attr(not(feature = "lab"), allow(dead_code))]
impl PeerHolders {
    /// Replays every peer's cache plan and plans the remote sources of `node`'s accesses.
    ///
    /// # Errors
    /// Inputs the sampler or the cache planner refuse (naming the parameter), or more than
    /// 65,535 nodes.
    pub fn build(inputs: &PeerHoldersInputs, node: usize) -> Result<PeerHolders, Error> {
        PeerHolders::build_resumed(inputs, node, &(0, None))
    }

    /// [`PeerHolders::build`] for a run resumed at `start` (its first epoch, and the rest of it
    /// when it resumes within one): every node's stream begins there, its cache cold.
    pub(crate) fn build_resumed(
        inputs: &PeerHoldersInputs,
        node: usize,
        start: &(u32, Option<Head>),
    ) -> Result<PeerHolders, Error> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, REPLAY_THREADS_MAX);
        PeerHolders::build_on(inputs, node, threads, start)
    }

    /// [`PeerHolders::build_resumed`] replaying peers on at most `threads` threads.
    fn build_on(
        inputs: &PeerHoldersInputs,
        node: usize,
        threads: usize,
        start: &(u32, Option<Head>),
    ) -> Result<PeerHolders, Error> {
        let nodes = inputs.nodes;
        if nodes >= usize::from(NO_PEER) {
            return Err(Error::invalid(
                "nodes",
                nodes,
                "at most 65534 with peer caches",
            ));
        }
        if node >= nodes {
            return Err(Error::invalid(
                "node",
                node,
                format!("below the {nodes} nodes"),
            ));
        }
        let world = nodes * inputs.ranks_per_node;
        let samples = inputs.sizes.len();
        let (sampler, orders_bytes) = held_orders(inputs, world, samples)?;
        let layout = |p: usize| {
            Layout::of_node(
                sampler.clone(),
                inputs.ranks_per_node,
                p,
                inputs.batch_size,
                inputs.epochs,
            )
            .resumed(start.0, start.1.clone())
        };
        let own = own_accesses(&layout(node));
        let peers: Vec<usize> = (0..nodes).filter(|&p| p != node).collect();
        let threads = threads.clamp(1, peers.len().max(1));
        // Each thread replays every `threads`-th peer into its own choices; the choices merge
        // by the same score, so the plan does not depend on the threads.
        let replays: Vec<Result<Replay, Error>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (own, peers, layout) = (&own, &peers, &layout);
                    s.spawn(move || {
                        let mut r = Replay::new(own.len(), samples);
                        for &p in peers.iter().skip(t).step_by(threads) {
                            r.peer(inputs, own, layout(p), p as u16)?;
                        }
                        Ok(r)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("a peer replay panicked"))
                .collect()
        });
        let mut holders = vec![NO_PEER; own.len()];
        let mut build_peak_bytes = own.capacity() * std::mem::size_of::<OwnAccess>()
            + holders.capacity() * 2
            + orders_bytes;
        for r in replays {
            let r = r?;
            build_peak_bytes += r.peak_bytes();
            for (i, &h) in r.holders.iter().enumerate() {
                if h != NO_PEER && better(i as u64, h, holders[i]) {
                    holders[i] = h;
                }
            }
        }
        let planned = holders.iter().filter(|&&h| h != NO_PEER).count() as u64;
        Ok(PeerHolders {
            holders,
            planned,
            build_peak_bytes,
            replay_threads: threads,
        })
    }

    /// A plan in which no peer serves any access (no node has a cache).
    pub(crate) fn empty() -> PeerHolders {
        PeerHolders {
            holders: Vec::new(),
            planned: 0,
            build_peak_bytes: 0,
            replay_threads: 0,
        }
    }

    /// The peer planned to serve this node's access at `position` of its stream, if any.
    pub fn holder(&self, position: u64) -> Option<usize> {
        match self.holders.get(position as usize) {
            Some(&h) if h != NO_PEER => Some(usize::from(h)),
            _ => None,
        }
    }

    /// Accesses of this node's stream.
    pub fn accesses(&self) -> u64 {
        self.holders.len() as u64
    }

    /// Accesses a peer is planned to serve (whether or not this node's own cache hits them).
    pub fn planned(&self) -> u64 {
        self.planned
    }

    /// Bytes the plan holds while the job runs.
    pub fn memory_bytes(&self) -> usize {
        self.holders.capacity() * 2 + std::mem::size_of::<Self>()
    }

    /// The most bytes the build held at once (each replay thread's largest peer planner and
    /// tables, this node's sorted accesses, the shuffled orders).
    pub fn build_peak_bytes(&self) -> usize {
        self.build_peak_bytes
    }

    /// Threads the build replayed peers on.
    pub fn replay_threads(&self) -> usize {
        self.replay_threads
    }
}

/// One replay thread: the peer it prefers for each access among the peers it replayed, and
/// its tables (reused from peer to peer).
struct Replay {
    holders: Vec<u16>,
    admitted_at: Vec<u64>,
    touched: Vec<u32>,
    evicted: Vec<u32>,
    planner_peak: usize,
}

impl Replay {
    fn new(accesses: usize, samples: usize) -> Replay {
        Replay {
            holders: vec![NO_PEER; accesses],
            admitted_at: vec![u64::MAX; samples],
            touched: Vec::new(),
            evicted: Vec::new(),
            planner_peak: 0,
        }
    }

    fn peak_bytes(&self) -> usize {
        self.planner_peak
            + self.holders.capacity() * 2
            + self.admitted_at.capacity() * 8
            + (self.touched.capacity() + self.evicted.capacity()) * 4
    }

    /// Replays peer `p`'s cache plan over its layout `theirs`, keeping each holding interval
    /// that covers some of `own`'s accesses with the margin.
    fn peer(
        &mut self,
        inputs: &PeerHoldersInputs,
        own: &[OwnAccess],
        theirs: Layout,
        p: u16,
    ) -> Result<(), Error> {
        let mut planner = Planner::new(
            theirs.clone(),
            inputs.sizes.clone(),
            inputs.capacity_bytes,
            inputs.policy,
        )
        .map_err(|e| Error::engine("peer cache plan", e))?;
        let margin = inputs.margin_steps;
        let holders = &mut self.holders;
        let mut interval = |sample: u32, from: u64, to: u64| {
            // Our accesses of `sample` at steps in (from + margin, to - margin).
            let first = own
                .partition_point(|a| (a.sample, a.step) <= (sample, from.saturating_add(margin)));
            for a in own[first..].iter().take_while(|a| a.sample == sample) {
                if a.step.saturating_add(margin) >= to {
                    break;
                }
                let h = &mut holders[a.position as usize];
                if better(a.position, p, *h) {
                    *h = p;
                }
            }
        };
        while let Some(d) = planner
            .next(&mut self.evicted)
            .map_err(|e| Error::engine("peer cache plan", e))?
        {
            let step = theirs.step_at(d.position);
            for &e in &self.evicted {
                let from = std::mem::replace(&mut self.admitted_at[e as usize], u64::MAX);
                interval(e, from, step);
            }
            if d.admitted {
                self.admitted_at[d.sample as usize] = step;
                self.touched.push(d.sample);
            }
            if d.position % 65_536 == 0 {
                self.planner_peak = self.planner_peak.max(planner.memory_bytes());
            }
        }
        self.planner_peak = self.planner_peak.max(planner.memory_bytes());
        for s in self.touched.drain(..) {
            let from = std::mem::replace(&mut self.admitted_at[s as usize], u64::MAX);
            if from != u64::MAX {
                interval(s, from, u64::MAX);
            }
        }
        Ok(())
    }
}

/// Whether peer `p` is preferred over `current` for the access at `position`.
fn better(position: u64, p: u16, current: u16) -> bool {
    current == NO_PEER || score(position, p) < score(position, current)
}

/// One access of this node: sorted by (sample, step) so a peer's holding of a sample finds
/// the accesses it covers by binary search.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct OwnAccess {
    sample: u32,
    step: u64,
    position: u64,
}

fn own_accesses(layout: &Layout) -> Vec<OwnAccess> {
    let mut own = Vec::with_capacity(layout.ranks * layout.per_rank * layout.epochs as usize);
    for epoch in layout.start_epoch..layout.epochs {
        layout.walk_epoch(epoch, |iteration, _, _, sample| {
            own.push(OwnAccess {
                sample,
                step: layout.step(epoch, iteration),
                position: own.len() as u64,
            });
        });
    }
    own.sort_unstable();
    own
}

/// The sampler the replays share, and the bytes of the orders it holds: a shuffled order is
/// drawn once per epoch and held, where that fits [`ORDERS_HELD_MAX_BYTES`] (every peer's
/// replay walks every epoch).
fn held_orders(
    inputs: &PeerHoldersInputs,
    world: usize,
    samples: usize,
) -> Result<(DistributedSampler, usize), Error> {
    let held_bytes = samples * 4 * inputs.epochs as usize;
    let (order, held_bytes) = match &inputs.order {
        EpochOrder::Shuffle { seed } if held_bytes <= ORDERS_HELD_MAX_BYTES => {
            let orders: Vec<Vec<u32>> = (0..inputs.epochs)
                .map(|e| crate::sampler::torch_randperm(samples, seed.wrapping_add(u64::from(e))))
                .collect();
            (EpochOrder::Explicit(orders.into()), held_bytes)
        }
        other => (other.clone(), 0),
    };
    let sampler = DistributedSampler::new(samples, world, inputs.drop_last, order)?;
    Ok((sampler, held_bytes))
}

/// The rank of peer `p` for the access at `position`: lowest wins.
fn score(position: u64, p: u16) -> u64 {
    let mut z = position ^ (u64::from(p) << 48);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn inputs(policy: PolicyKind, capacity_bytes: u64, margin_steps: u64) -> PeerHoldersInputs {
        PeerHoldersInputs {
            sizes: (0..96u32).map(|s| 100 + s % 7 * 10).collect(),
            nodes: 3,
            ranks_per_node: 2,
            batch_size: 4,
            epochs: 4,
            order: EpochOrder::Shuffle { seed: 11 },
            drop_last: false,
            policy,
            capacity_bytes,
            margin_steps,
        }
    }

    /// Node `node`'s layout, built directly from the inputs.
    fn layout_of(inputs: &PeerHoldersInputs, node: usize) -> Layout {
        let world = inputs.nodes * inputs.ranks_per_node;
        let sampler =
            DistributedSampler::new(inputs.sizes.len(), world, false, inputs.order.clone())
                .unwrap();
        Layout::of_node(
            sampler,
            inputs.ranks_per_node,
            node,
            inputs.batch_size,
            inputs.epochs,
        )
    }

    /// Each node's cache contents at the end of every step, and the samples it evicted
    /// during each step (one may be evicted and admitted again within a step), replayed with
    /// the public planner.
    fn held_after_steps(
        inputs: &PeerHoldersInputs,
        node: usize,
    ) -> Vec<(HashSet<u32>, HashSet<u32>)> {
        let layout = layout_of(inputs, node);
        let mut steps = Vec::new();
        for e in 0..inputs.epochs {
            layout.walk_epoch(e, |it, _, _, _| steps.push(layout.step(e, it)));
        }
        let mut planner = Planner::new(
            layout,
            inputs.sizes.clone(),
            inputs.capacity_bytes,
            inputs.policy,
        )
        .unwrap();
        let mut held = HashSet::new();
        let mut after: Vec<(HashSet<u32>, HashSet<u32>)> = Vec::new();
        let mut evicted = Vec::new();
        let mut i = 0;
        while let Some(d) = planner.next(&mut evicted).unwrap() {
            let step = steps[i] as usize;
            if after.len() <= step {
                after.resize(step + 1, Default::default());
            }
            for e in &evicted {
                held.remove(e);
                after[step].1.insert(*e);
            }
            if d.admitted {
                held.insert(d.sample);
            }
            after[step].0 = held.clone();
            i += 1;
        }
        after
    }

    /// The peers that qualify for each access by brute force: a peer holds the sample at
    /// the end of the step `margin + 1` before the access and evicts it in none of the
    /// steps from there to `margin` after it.
    fn qualifying(inputs: &PeerHoldersInputs, node: usize) -> Vec<HashSet<usize>> {
        let held: Vec<_> = (0..inputs.nodes)
            .map(|p| held_after_steps(inputs, p))
            .collect();
        let layout = layout_of(inputs, node);
        let last = (layout.step(inputs.epochs, 0) - 1) as i64;
        let m = inputs.margin_steps as i64;
        let mut out = Vec::new();
        for e in 0..inputs.epochs {
            layout.walk_epoch(e, |it, _, _, s| {
                let t = layout.step(e, it) as i64;
                let ok = |p: usize| {
                    let from = t - m - 1;
                    // Before the first step nothing is held; after the last, all stays.
                    from >= 0
                        && held[p][from as usize].0.contains(&s)
                        && (from + 1..=t + m)
                            .all(|k| k > last || !held[p][k as usize].1.contains(&s))
                };
                out.push((0..inputs.nodes).filter(|&p| p != node && ok(p)).collect());
            });
        }
        out
    }

    #[test]
    fn planned_holders_are_exactly_the_peers_that_hold_the_sample_around_the_access() {
        for (policy, capacity, margin) in [
            (PolicyKind::Reuse, 2_000, 1),
            (PolicyKind::Reuse, 5_000, 0),
            (PolicyKind::Static, 3_000, 2),
            (PolicyKind::Lru, 5_000, 1),
        ] {
            let inputs = inputs(policy, capacity, margin);
            let mut any = 0;
            for node in 0..inputs.nodes {
                let plan = PeerHolders::build(&inputs, node).unwrap();
                let want = qualifying(&inputs, node);
                assert_eq!(plan.accesses() as usize, want.len());
                for (i, peers) in want.iter().enumerate() {
                    match plan.holder(i as u64) {
                        Some(p) => assert!(peers.contains(&p), "{policy} access {i}: {p}"),
                        None => assert!(peers.is_empty(), "{policy} access {i}: {peers:?}"),
                    }
                }
                let planned = want.iter().filter(|p| !p.is_empty()).count() as u64;
                assert_eq!(plan.planned(), planned, "{policy} node {node}");
                any += planned;
            }
            assert!(any > 0, "{policy}: the test must plan some remote hits");
        }
    }

    #[test]
    fn every_node_computes_the_same_choice_and_the_load_spreads() {
        let inputs = inputs(PolicyKind::Static, 6_000, 0);
        let a = PeerHolders::build(&inputs, 1).unwrap();
        let b = PeerHolders::build(&inputs, 1).unwrap();
        assert_eq!(a.holders, b.holders);
        let served: HashSet<usize> = (0..a.accesses()).filter_map(|i| a.holder(i)).collect();
        assert_eq!(served, HashSet::from([0, 2]), "both peers serve some");
        assert!(a.holder(a.accesses()).is_none());
    }

    #[test]
    fn the_plan_does_not_depend_on_the_replay_threads() {
        let inputs = inputs(PolicyKind::Reuse, 3_000, 1);
        let one = PeerHolders::build_on(&inputs, 2, 1, &(0, None)).unwrap();
        for threads in [2, 3, 8] {
            let many = PeerHolders::build_on(&inputs, 2, threads, &(0, None)).unwrap();
            assert_eq!(many.holders, one.holders, "{threads} threads");
            assert_eq!(many.replay_threads(), threads.min(2));
        }
        assert!(one.planned() > 0);
    }

    #[test]
    fn no_cache_plans_no_remote_hit_and_bad_nodes_are_refused() {
        let plan = PeerHolders::build(&inputs(PolicyKind::Reuse, 0, 0), 0).unwrap();
        assert_eq!(plan.planned(), 0);
        let e = PeerHolders::build(&inputs(PolicyKind::Reuse, 0, 0), 3).unwrap_err();
        assert!(e.to_string().contains("node"), "{e}");
    }
}
