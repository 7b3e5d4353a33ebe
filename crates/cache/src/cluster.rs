//! The nodes' caches as one cluster cache: a plan every node computes from the shared inputs
//! (orders, sizes, shape, capacity), without traffic, saying which node keeps which sample
//! over which interval and where each access is served from (its own cache, a peer's, or
//! storage).
//!
//! # The global stream
//! All nodes' accesses in canonical order (epoch, iteration, local rank, position in batch,
//! node: the nodes interleaved within a step), laid out by [`ClusterLayout`] from one order per epoch split over the ranks as
//! PyTorch's `DistributedSampler` does (padded by repeating the head; no `drop_last`). One
//! [`NextUseIndex`] over it gives each access its global next use.
//!
//! # The cluster plan
//! One [`ReusePolicy`] of `capacity_bytes` per node, all driven with global positions and
//! global next uses, and a holder per sample (the node keeping it, or none). For the access at
//! position `t` by node `a` of sample `s` with next use `n`:
//! - nobody holds `s`: `a` reads it from storage, and `a`'s policy decides whether `a` keeps
//!   it (a miss there, Belady with "do no harm" among `a`'s samples); its evictions leave the
//!   cluster;
//! - node `h` holds `s` (`h == a`: a local hit; otherwise a remote hit served by `h`): `s`
//!   stays where it is and `h`'s policy takes the hit (its next use becomes `n`, or it leaves
//!   at [`NEVER`](crate::NEVER)).
//!
//! A policy's entry goes stale exactly at its next use, and every next use is an access that
//! reaches the holder's policy, so each node's bytes are exact and never over capacity.
//!
//! What is optimal and what is a heuristic:
//! - Each node's policy is Belady over the accesses routed to it (its storage reads and every
//!   access of what it holds): for unit sizes, optimal for that node's cache over that routed
//!   subsequence.
//! - The routing is the heuristic: a sample is kept only by the node that read it from storage,
//!   and a node's choice changes which node reads a sample next, so per-node Belady is not
//!   optimal for the cluster, even for unit sizes (the test
//!   `per_node_belady_is_not_the_holder_model_optimum` shows a stream where evicting a sample
//!   needed sooner lets another node keep it, and saves a read). Byte sizes make every
//!   per-node choice a heuristic too (Belady ranks by next use only).
//! - Bounds: no plan reads less than the pooled optimum (one cache of `nodes *
//!   capacity_bytes`, any sample anywhere), which reads at least the floor: in each epoch, the
//!   first access of each distinct sample hits only if the sample was held when the epoch
//!   began, so the epoch reads at least `max(0, F - nodes * capacity_bytes)` where `F` is the
//!   bytes of its distinct samples. lobster-testkit's `cluster_optimum` finds both optima by
//!   exhaustive search on small cases, and the tests compare.
//!
//! # Priced remote hits
//! With [`LinkPrices`] (the cluster plan only) a remote hit may be served by storage instead, so
//! that a slow interconnect does not become the bound. The caches and holders are exactly the
//! unpriced plan's (the holder's policy takes the access either way); only where the bytes of
//! an access come from changes. Within each epoch the plan counts, per node, the bytes each
//! node received and sent over the interconnect and the storage bytes it read in place of a
//! remote hit, and takes the node's compulsory storage reads as its floor share
//! `max(0, F - nodes * capacity_bytes) / nodes`, counted from the epoch's start (hits come
//! early in an epoch and the misses late). A remote hit of `b` bytes of holder `h` for node
//! `a` goes to storage when `a`'s storage time with it, `(floor share + rerouted + b) /
//! storage bandwidth`, is below the busier link's time with it, `max(in(a), out(h)) + b` over
//! the interconnect bandwidth, so that each node's storage and interconnect times end the
//! epoch about equal. The rule is a heuristic (a greedy balance from configured bandwidths,
//! never from timings); on a fast interconnect it reroutes nothing.
//!
//! # Locality-aware assignment
//! With [`Assign::Locality`] (the cluster plan only) the global stream keeps its samples and their
//! positions (so every next use is the same), but which node makes each access is decided at
//! the start of each step from the holders at that moment. Each node makes exactly its ranks'
//! batches' worth of the step. In stream order, the accesses nobody holds go first, one at a
//! time, to the node with room that reads the fewest bytes from storage in the step so far
//! (the step's storage reads spread over every node's link); then an access whose sample a
//! node holds goes to that node while it has room; the rest (held by a node without room:
//! remote hits) fill the remaining room. A node's accesses of a step are its
//! ranks' batches in stream order ([`ClusterDecision::slot`]). The step's content and every
//! rank's batch size are unchanged; which rank sees which sample is not the sampler's. The
//! rule is a heuristic: it turns remote hits into local ones where that leaves the storage
//! reads spread, but does not search the assignments.
//!
//! # Each node's own plan
//! Where `capacity_bytes * nodes^2 <= F` (`F` the bytes of the size table) the cluster gains
//! little (per-node Belady already reads about the floor), so the plan is today's: each node
//! runs [`Planner`] with [`PolicyKind::Reuse`] on its own stream (local next uses), and a
//! local miss is served by a peer that holds the sample at that moment, if any (the first
//! holder after the accessing node, in node order), else by storage. Its decisions are exactly
//! those of `nodes` independent planners (tested). It needs one next-use index per node, so
//! its memory grows with the nodes (about `6 * nodes` bytes per sample); a loader under it
//! runs only its own node's planner and finds holders by replaying peers, as it does today.
//!
//! # Memory (the cluster plan)
//! The index over the global stream (as [`Planner`]'s: about 6 bytes per sample + 8 per access
//! of its batch, by default one epoch, + 4 per access of an epoch), 2 bytes per sample of holder table, 1 bit per
//! sample per node (each policy's cached bits), and each policy's heap (at most `1.25 *
//! cached + 1024` entries of 16 bytes). Locality-aware assignment adds 4 bytes per access of
//! an epoch (the epoch's stream, which it reads a step ahead) and 6 per access of a step.
//! [`ClusterPlanner::memory_bytes`] reports it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::mem::size_of;
use std::sync::Arc;

use crate::index::{NextUseIndex, StreamSource};
use crate::planner::{Planner, PlannerConfig};
use crate::policy::{Policy, PolicyKind};
use crate::reuse::ReusePolicy;
use crate::{CacheError, SampleId};

/// No node holds the sample.
const NONE: u16 = u16::MAX;

/// Default batch of the global index: 2.5 accesses per sample, as [`Planner`]'s.
const DEFAULT_BATCH_PER_SAMPLE_X2: usize = 5;

/// Decisions between two loads of the upcoming accesses' table entries.
const WARM_AHEAD: usize = 16;

/// Why a cluster plan could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClusterError {
    /// A parameter of the job's shape is out of range.
    Shape {
        /// The parameter.
        parameter: &'static str,
        /// Its value.
        value: u64,
        /// What it must be.
        expected: &'static str,
    },
    /// The stream or the size table was refused by the cache planner.
    Cache(CacheError),
    /// [`Assign::Locality`] with [`PeerPlanKind::Node`]: each node's own plan runs its own
    /// stream as the sampler splits it.
    LocalityInLocalMode,
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::Shape {
                parameter,
                value,
                expected,
            } => write!(f, "cluster plan: {parameter} = {value}: must be {expected}"),
            ClusterError::Cache(e) => write!(f, "cluster plan: {e}"),
            ClusterError::LocalityInLocalMode => write!(
                f,
                "cluster plan: locality-aware assignment needs cluster mode \
                 (the local plan runs each node's stream as the sampler splits it)"
            ),
        }
    }
}

impl std::error::Error for ClusterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClusterError::Cache(e) => Some(e),
            ClusterError::Shape { .. } | ClusterError::LocalityInLocalMode => None,
        }
    }
}

impl From<CacheError> for ClusterError {
    fn from(e: CacheError) -> Self {
        ClusterError::Cache(e)
    }
}

fn shape_error(parameter: &'static str, value: usize, expected: &'static str) -> ClusterError {
    ClusterError::Shape {
        parameter,
        value: value as u64,
        expected,
    }
}

/// The job's shape over one order per epoch: which node makes each access of the global
/// stream.
///
/// Each epoch's order (from `orders`, a [`StreamSource`] whose every epoch has `order_len`
/// entries, e.g. a seeded permutation of the dataset) is padded by repeating its head to
/// `per_rank * world` entries (`world = nodes * ranks_per_node`, `per_rank =
/// ceil(order_len / world)`), and rank `r` takes entries `r, r + world, ...`, as PyTorch's
/// `DistributedSampler` without `drop_last`. Node `a` has ranks `a * ranks_per_node ..`.
/// Iteration `i` of an epoch is a block of every node's batch `i`, the nodes interleaved: the
/// `j`-th access of every node's block (its ranks' batches, rank after rank), node after node,
/// then the `j + 1`-th. Every iteration but the last holds `batch_size` accesses per rank.
///
/// Interleaving keeps the plan fair: Belady breaks ties in next use by stream position, and
/// with the nodes' blocks one after another the last node's samples would always be the
/// farthest of their step, so every cache would drop them first and that node would read
/// more from storage than the others, and the job waits for it.
#[derive(Debug, Clone)]
pub struct ClusterLayout<O> {
    orders: O,
    order_len: usize,
    nodes: usize,
    ranks_per_node: usize,
    batch_size: usize,
    per_rank: usize,
}

impl<O: StreamSource> ClusterLayout<O> {
    /// The layout of `nodes` nodes of `ranks_per_node` ranks with batches of `batch_size`
    /// over `orders`, each epoch of which has `order_len` samples.
    ///
    /// # Errors
    /// [`ClusterError::Shape`] naming a zero parameter, more than 65,535 nodes, or an epoch of
    /// `u32::MAX` accesses or more.
    pub fn new(
        orders: O,
        order_len: usize,
        nodes: usize,
        ranks_per_node: usize,
        batch_size: usize,
    ) -> Result<Self, ClusterError> {
        if nodes == 0 || nodes > usize::from(NONE) {
            return Err(shape_error("nodes", nodes, "1 to 65535"));
        }
        for (parameter, value) in [
            ("ranks_per_node", ranks_per_node),
            ("batch_size", batch_size),
            ("order_len", order_len),
        ] {
            if value == 0 {
                return Err(shape_error(parameter, value, "at least 1"));
            }
        }
        let world = nodes.checked_mul(ranks_per_node).ok_or_else(|| {
            shape_error(
                "ranks_per_node",
                ranks_per_node,
                "nodes x ranks_per_node below 2^32",
            )
        })?;
        let per_rank = order_len.div_ceil(world);
        if per_rank
            .checked_mul(world)
            .is_none_or(|n| n >= u32::MAX as usize - 1)
        {
            return Err(shape_error(
                "order_len",
                order_len,
                "padded to the world, below 2^32 - 2 accesses per epoch",
            ));
        }
        Ok(ClusterLayout {
            orders,
            order_len,
            nodes,
            ranks_per_node,
            batch_size,
            per_rank,
        })
    }

    /// Nodes in the job.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Accesses of every epoch of the global stream.
    pub fn epoch_accesses(&self) -> u64 {
        (self.per_rank * self.nodes * self.ranks_per_node) as u64
    }

    /// Epochs of the stream.
    pub fn epochs(&self) -> u32 {
        self.orders.epochs()
    }

    fn iterations(&self) -> usize {
        self.per_rank.div_ceil(self.batch_size)
    }

    fn batch_len(&self, iteration: usize) -> usize {
        self.batch_size
            .min(self.per_rank - iteration * self.batch_size)
    }

    /// The node making the access at `index` of an epoch of the global stream, as the sampler
    /// assigns it.
    pub fn node_at(&self, index: u64) -> u16 {
        (self.within_step(index) % self.nodes as u64) as u16
    }

    /// The access's place among its node's accesses of its step (see
    /// [`ClusterDecision::slot`]), as the sampler assigns it.
    fn slot_at(&self, index: u64) -> u32 {
        (self.within_step(index) / self.nodes as u64) as u32
    }

    /// The iteration, within its epoch, of the access at `index` of an epoch.
    pub fn iteration_at(&self, index: u64) -> usize {
        let block = (self.nodes * self.ranks_per_node * self.batch_size) as u64;
        (index / block).min(self.iterations() as u64 - 1) as usize
    }

    fn within_step(&self, index: u64) -> u64 {
        let block = (self.nodes * self.ranks_per_node * self.batch_size) as u64;
        index - self.iteration_at(index) as u64 * block
    }

    /// The positions of an epoch's step `iteration`, within the epoch.
    fn step_range(&self, iteration: usize) -> std::ops::Range<u64> {
        let block = (self.nodes * self.ranks_per_node * self.batch_size) as u64;
        let start = iteration as u64 * block;
        start..start + (self.nodes * self.ranks_per_node * self.batch_len(iteration)) as u64
    }

    /// The step (iteration since the first epoch's first) of the access at `position` of the
    /// global stream.
    pub fn step_at(&self, position: u64) -> u64 {
        let per_epoch = self.epoch_accesses();
        let block = (self.nodes * self.ranks_per_node * self.batch_size) as u64;
        let iterations = self.iterations() as u64;
        let (epoch, index) = (position / per_epoch, position % per_epoch);
        epoch * iterations + (index / block).min(iterations - 1)
    }

    /// The global stream: every node's accesses in canonical order.
    pub fn global(&self) -> ClusterView<O>
    where
        O: Clone,
    {
        ClusterView {
            layout: self.clone(),
            node: None,
        }
    }

    /// Node `node`'s own stream, in canonical order (a subsequence of the global one).
    ///
    /// # Panics
    /// If `node` is not below [`nodes`](ClusterLayout::nodes).
    pub fn node(&self, node: usize) -> ClusterView<O>
    where
        O: Clone,
    {
        assert!(node < self.nodes, "node {node} of {}", self.nodes);
        ClusterView {
            layout: self.clone(),
            node: Some(node),
        }
    }

    fn fill(&self, epoch: u32, node: Option<usize>, out: &mut Vec<SampleId>) {
        let mut order = Vec::with_capacity(self.order_len);
        self.orders.fill_epoch(epoch, &mut order);
        assert_eq!(
            order.len(),
            self.order_len,
            "epoch {epoch}'s order has {} samples, the layout {}",
            order.len(),
            self.order_len
        );
        let world = self.nodes * self.ranks_per_node;
        let nodes = node.map_or(0..self.nodes, |a| a..a + 1);
        out.reserve(self.per_rank * self.ranks_per_node * nodes.len());
        for iteration in 0..self.iterations() {
            let batch_len = self.batch_len(iteration);
            for local in 0..self.ranks_per_node {
                for pos in 0..batch_len {
                    for a in nodes.clone() {
                        let rank = a * self.ranks_per_node + local;
                        let i = rank + (iteration * self.batch_size + pos) * world;
                        // Past the order: the padding repeats its head.
                        let i = if i < self.order_len {
                            i
                        } else {
                            i % self.order_len
                        };
                        out.push(order[i]);
                    }
                }
            }
        }
    }
}

/// The global stream of a [`ClusterLayout`], or one node's.
#[derive(Debug, Clone)]
pub struct ClusterView<O> {
    layout: ClusterLayout<O>,
    node: Option<usize>,
}

impl<O: StreamSource> StreamSource for ClusterView<O> {
    fn epochs(&self) -> u32 {
        self.layout.epochs()
    }

    fn fill_epoch(&self, epoch: u32, out: &mut Vec<SampleId>) {
        self.layout.fill(epoch, self.node, out);
    }
}

/// How the nodes' caches are planned: each node's own, or the cluster's (one plan over the
/// job's caches). In the loader's configuration, reports and JSON: `node`, `cluster`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PeerPlanKind {
    /// No peers, or each node runs Belady on its own stream and plans its own cache; peers
    /// serve what they happen to hold.
    #[default]
    Node,
    /// The nodes' caches are planned as one: one plan over the global stream (see the module
    /// docs).
    Cluster,
}

impl PeerPlanKind {
    /// The rule: each node's own plan where `capacity_bytes * nodes^2 <= dataset_bytes`,
    /// where per-node Belady already reaches about the floor, the cluster's otherwise.
    pub fn auto(dataset_bytes: u64, nodes: usize, capacity_bytes: u64) -> PeerPlanKind {
        let n2 = (nodes as u128) * (nodes as u128);
        if u128::from(capacity_bytes) * n2 <= u128::from(dataset_bytes) {
            PeerPlanKind::Node
        } else {
            PeerPlanKind::Cluster
        }
    }
}

names!(PeerPlanKind, CacheError, |name: &str| CacheError::UnknownChoice {
    choice: "peer plan",
    name: name.to_owned(),
    expected: "node or cluster",
}, {
    Node => "node",
    Cluster => "cluster",
});

/// Which rank of a step (global batch) gets which of its samples: which node (and rank)
/// makes each access of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Assign {
    /// As PyTorch's `DistributedSampler` splits each epoch's order: every rank's samples are
    /// the ones a PyTorch job's rank would get.
    #[default]
    #[cfg_attr(feature = "clap", value(help = "PyTorch's DistributedSampler split"))]
    Sampler,
    /// Locality-aware (Yang and Cong, HiPC '19), under the cluster plan only: within each
    /// step, a sample goes to a rank of a node whose cache holds it, once the step's storage
    /// reads are spread over the nodes (see [`ClusterPlanner`]). The step's samples and every
    /// rank's batch size are unchanged; which rank sees which sample is not PyTorch's.
    #[cfg_attr(
        feature = "clap",
        value(help = "To the nodes holding the samples, under the cluster plan")
    )]
    Locality,
}

names!(Assign, CacheError, |name: &str| CacheError::UnknownChoice {
    choice: "assign",
    name: name.to_owned(),
    expected: "sampler or locality",
}, {
    Sampler => "sampler",
    Locality => "locality",
});

/// Where an access's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The accessing node's own cache.
    Local,
    /// Another node's cache: this node.
    Remote(u16),
    /// Storage, read by the accessing node.
    Storage,
}

/// Each node's bandwidths, as the plan prices a remote hit against a storage read (see the
/// module docs). Configured, never timed: every node must plan with the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LinkPrices {
    /// A node's storage bandwidth, bytes per second.
    pub storage_bytes_per_s: u64,
    /// A node's interconnect bandwidth each way, bytes per second.
    pub net_bytes_per_s: u64,
}

/// One decision of the cluster plan, for the access at `position` of the global stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterDecision {
    /// 0-based position in the global stream.
    pub position: u64,
    /// Epoch of the access.
    pub epoch: u32,
    /// The node making the access.
    pub node: u16,
    /// The access's place among the node's accesses of its step, in stream order: its local
    /// rank is `slot / batch_len` and its place in that rank's batch `slot % batch_len`, where
    /// `batch_len` is the step's batch size.
    pub slot: u32,
    /// The sample accessed.
    pub sample: SampleId,
    /// Its size.
    pub size_bytes: u32,
    /// Where its bytes come from.
    pub served: Served,
    /// The node keeping it after this access (under the node plan, the accessing node, if it keeps
    /// it; another node may hold a copy too).
    pub kept_at: Option<u16>,
}

/// Counts and bytes of the accesses of one node (or of all) in one epoch (or in all), by
/// where they are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClusterCounts {
    /// Accesses served by the accessing node's cache.
    pub local_hits: u64,
    /// Their bytes.
    pub local_hit_bytes: u64,
    /// Accesses served by another node's cache.
    pub remote_hits: u64,
    /// Their bytes: what comes over the interconnect.
    pub remote_hit_bytes: u64,
    /// Accesses read from storage.
    pub storage_reads: u64,
    /// Their bytes.
    pub storage_bytes: u64,
    /// Of the storage reads, those of a sample a peer held, read from storage because the
    /// interconnect was priced dearer ([`LinkPrices`]).
    pub rerouted_reads: u64,
    /// Their bytes.
    pub rerouted_bytes: u64,
}

impl ClusterCounts {
    fn record(&mut self, served: Served, size_bytes: u32) {
        let b = u64::from(size_bytes);
        match served {
            Served::Local => {
                self.local_hits += 1;
                self.local_hit_bytes += b;
            }
            Served::Remote(_) => {
                self.remote_hits += 1;
                self.remote_hit_bytes += b;
            }
            Served::Storage => {
                self.storage_reads += 1;
                self.storage_bytes += b;
            }
        }
    }

    fn add(&mut self, o: &ClusterCounts) {
        self.local_hits += o.local_hits;
        self.local_hit_bytes += o.local_hit_bytes;
        self.remote_hits += o.remote_hits;
        self.remote_hit_bytes += o.remote_hit_bytes;
        self.storage_reads += o.storage_reads;
        self.storage_bytes += o.storage_bytes;
        self.rerouted_reads += o.rerouted_reads;
        self.rerouted_bytes += o.rerouted_bytes;
    }

    /// Accesses counted.
    pub fn accesses(&self) -> u64 {
        self.local_hits + self.remote_hits + self.storage_reads
    }

    /// Bytes of the accesses counted.
    pub fn bytes(&self) -> u64 {
        self.local_hit_bytes + self.remote_hit_bytes + self.storage_bytes
    }
}

/// Counters of a cluster plan, per epoch and node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStats {
    nodes: usize,
    /// Epoch-major: `counts[epoch * nodes + node]`.
    counts: Vec<ClusterCounts>,
    dataset_bytes: u64,
    capacity_bytes: u64,
}

impl ClusterStats {
    fn new(nodes: usize, epochs: u32, dataset_bytes: u64, capacity_bytes: u64) -> Self {
        ClusterStats {
            nodes,
            counts: vec![ClusterCounts::default(); nodes * epochs as usize],
            dataset_bytes,
            capacity_bytes,
        }
    }

    /// Epochs counted.
    pub fn epochs(&self) -> u32 {
        (self.counts.len() / self.nodes) as u32
    }

    /// Node `node`'s accesses in `epoch`.
    pub fn of(&self, epoch: u32, node: usize) -> ClusterCounts {
        self.counts[epoch as usize * self.nodes + node]
    }

    /// Every node's accesses in `epoch`.
    pub fn epoch(&self, epoch: u32) -> ClusterCounts {
        let mut c = ClusterCounts::default();
        for n in 0..self.nodes {
            c.add(&self.of(epoch, n));
        }
        c
    }

    /// Node `node`'s accesses in every epoch.
    pub fn node(&self, node: usize) -> ClusterCounts {
        let mut c = ClusterCounts::default();
        for e in 0..self.epochs() {
            c.add(&self.of(e, node));
        }
        c
    }

    /// Every access of epochs `from..`.
    pub fn since(&self, from: u32) -> ClusterCounts {
        let mut c = ClusterCounts::default();
        for e in from..self.epochs() {
            c.add(&self.epoch(e));
        }
        c
    }

    /// Every access.
    pub fn total(&self) -> ClusterCounts {
        self.since(0)
    }

    /// Bytes of the size table (`F`).
    pub fn dataset_bytes(&self) -> u64 {
        self.dataset_bytes
    }

    /// The floor of storage bytes in an epoch that accesses every sample of the size table:
    /// `max(0, F - nodes * capacity_bytes)` (see the module docs).
    pub fn floor_bytes_per_epoch(&self) -> u64 {
        self.dataset_bytes
            .saturating_sub((self.nodes as u64).saturating_mul(self.capacity_bytes))
    }
}

/// Tuning of the cluster plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterConfig {
    /// `None`: [`PeerPlanKind::auto`]; otherwise the plan to use whatever the sizes.
    pub mode: Option<PeerPlanKind>,
    /// Accesses per batch of the global index (8 bytes each; at least one epoch). `None`: one
    /// epoch under the cluster plan; 2.5 per sample under the node plan, where each node's
    /// index takes this divided by the nodes.
    pub batch_accesses_max: Option<usize>,
    /// Which node makes each access. [`Assign::Locality`] needs the cluster plan.
    pub assign: Assign,
    /// `None`: a remote hit is always served by its holder; otherwise it may be read from
    /// storage where the interconnect is the dearer link (see the module docs). The cluster
    /// plan only: the node plan ignores it.
    pub prices: Option<LinkPrices>,
}

/// Priced remote hits' state: this epoch's bytes per node (see the module docs).
#[derive(Debug)]
struct Pricing {
    prices: LinkPrices,
    /// Each node's share of the floor, bytes per epoch.
    floor_share_bytes: u64,
    epoch: u32,
    received: Vec<u64>,
    sent: Vec<u64>,
    rerouted: Vec<u64>,
}

impl Pricing {
    fn new(prices: LinkPrices, nodes: usize, floor_bytes: u64) -> Self {
        Pricing {
            prices,
            floor_share_bytes: floor_bytes / nodes as u64,
            epoch: 0,
            received: vec![0; nodes],
            sent: vec![0; nodes],
            rerouted: vec![0; nodes],
        }
    }

    /// Whether node `a`'s access of `size_bytes` held by node `h` in `epoch` is read from
    /// storage; counts it either way.
    fn reroutes(&mut self, epoch: u32, (a, h): (usize, usize), size_bytes: u32) -> bool {
        if epoch != self.epoch {
            self.epoch = epoch;
            for v in [&mut self.received, &mut self.sent, &mut self.rerouted] {
                v.fill(0);
            }
        }
        let b = u128::from(size_bytes);
        // The epoch's compulsory reads are counted from its start: hits come early in an
        // epoch and misses late, so a share prorated over the accesses would let the early
        // hits reroute more than the epoch's end can balance.
        let storage = u128::from(self.floor_share_bytes) + u128::from(self.rerouted[a]) + b;
        let link = u128::from(self.received[a].max(self.sent[h])) + b;
        // storage / S < link / L, without division.
        let reroute = storage * u128::from(self.prices.net_bytes_per_s)
            < link * u128::from(self.prices.storage_bytes_per_s);
        if reroute {
            self.rerouted[a] += u64::from(size_bytes);
        } else {
            self.received[a] += u64::from(size_bytes);
            self.sent[h] += u64::from(size_bytes);
        }
        reroute
    }

    fn memory_bytes(&self) -> usize {
        size_of::<Self>()
            + (self.received.capacity() + self.sent.capacity() + self.rerouted.capacity())
                * size_of::<u64>()
    }
}

/// Locality-aware assignment's state: the epoch's stream and the current step's nodes.
#[derive(Debug, Default)]
struct Locality {
    /// The epoch whose global stream `stream` holds.
    epoch: Option<u32>,
    stream: Vec<SampleId>,
    /// Global position of the current step's first access; its `i`-th access is made by
    /// `nodes[i]` at `slots[i]`.
    step_start: u64,
    nodes: Vec<u16>,
    slots: Vec<u32>,
    room: Vec<u32>,
    /// Min-heap of (storage bytes in the step, tie rank, node) over the nodes with room.
    by_storage: BinaryHeap<Reverse<(u64, u32, u16)>>,
}

impl Locality {
    /// The node and slot of the access at global `position` (in `epoch`), its step assigned
    /// first if it is not yet: from `holder` as it is before the step's first access.
    fn at<O: StreamSource>(
        &mut self,
        layout: &ClusterLayout<O>,
        epoch: u32,
        position: u64,
        holder: &[u16],
        sizes: &[u32],
    ) -> (u16, u32) {
        let i = position.wrapping_sub(self.step_start);
        if i >= self.nodes.len() as u64 {
            let index = position % layout.epoch_accesses();
            let iteration = layout.iteration_at(index);
            let range = layout.step_range(iteration);
            debug_assert_eq!(index, range.start, "a step is assigned at its first access");
            self.step_start = position - (index - range.start);
            self.assign(layout, epoch, iteration, range, holder, sizes);
        }
        let i = (position - self.step_start) as usize;
        (self.nodes[i], self.slots[i])
    }

    fn assign<O: StreamSource>(
        &mut self,
        layout: &ClusterLayout<O>,
        epoch: u32,
        iteration: usize,
        range: std::ops::Range<u64>,
        holder: &[u16],
        sizes: &[u32],
    ) {
        if self.epoch != Some(epoch) {
            self.stream.clear();
            layout.fill(epoch, None, &mut self.stream);
            self.epoch = Some(epoch);
        }
        let step = &self.stream[range.start as usize..range.end as usize];
        let nodes = layout.nodes;
        let quota = (layout.ranks_per_node * layout.batch_len(iteration)) as u32;
        self.room.clear();
        self.room.resize(nodes, quota);
        self.nodes.clear();
        self.nodes.resize(step.len(), NONE);
        // What nobody holds (storage reads) first, each to the node with room reading the
        // fewest bytes of the step so far, so that every node's link carries its share; ties
        // go first to a node that rotates with the step, so no node is always first.
        self.by_storage.clear();
        let first = iteration % nodes;
        for n in 0..nodes {
            let rank = ((n + nodes - first) % nodes) as u32;
            self.by_storage.push(Reverse((0, rank, n as u16)));
        }
        for (j, &s) in step.iter().enumerate() {
            if holder[s as usize] != NONE {
                continue;
            }
            let Reverse((bytes, rank, n)) = self.by_storage.pop().expect("room for every access");
            self.nodes[j] = n;
            let room = &mut self.room[usize::from(n)];
            *room -= 1;
            if *room > 0 {
                let bytes = bytes + u64::from(sizes[s as usize]);
                self.by_storage.push(Reverse((bytes, rank, n)));
            }
        }
        // Then what a node holds, to that node while it has room: a local hit.
        for (j, &s) in step.iter().enumerate() {
            let h = holder[s as usize];
            if h != NONE && self.room[usize::from(h)] > 0 {
                self.nodes[j] = h;
                self.room[usize::from(h)] -= 1;
            }
        }
        // The rest are held by a node without room (remote hits): any room left.
        let mut n = 0;
        for node in self.nodes.iter_mut().filter(|n| **n == NONE) {
            while self.room[n] == 0 {
                n += 1;
            }
            *node = n as u16;
            self.room[n] -= 1;
        }
        // A node's accesses, in stream order, are its ranks' batches one after another.
        self.room.fill(0);
        self.slots.clear();
        for &n in &self.nodes {
            self.slots.push(self.room[usize::from(n)]);
            self.room[usize::from(n)] += 1;
        }
    }

    fn memory_bytes(&self) -> usize {
        self.stream.capacity() * size_of::<SampleId>()
            + self.nodes.capacity() * size_of::<u16>()
            + (self.slots.capacity() + self.room.capacity()) * size_of::<u32>()
            + self.by_storage.capacity() * size_of::<Reverse<(u64, u32, u16)>>()
    }
}

#[derive(Debug)]
enum Engine<O> {
    Cluster {
        /// Boxed: the index is much larger than the local engine's handles.
        index: Box<NextUseIndex<ClusterView<O>>>,
        policies: Vec<ReusePolicy>,
        holder: Vec<u16>,
        scratch: Vec<SampleId>,
        until_warm: usize,
        locality: Option<Box<Locality>>,
        pricing: Option<Box<Pricing>>,
    },
    Local {
        planners: Vec<Planner<ClusterView<O>>>,
        /// Nodes holding each sample.
        holders: Vec<u16>,
        scratch: Vec<SampleId>,
        position: u64,
        end: u64,
    },
}

/// Loads the holder and size entries of the group after next all at once, so their cache
/// misses overlap instead of stalling one decision each.
fn warm(upcoming: &[SampleId], holder: &[u16], sizes: &[u32]) {
    let acc = upcoming
        .get(WARM_AHEAD..)
        .unwrap_or_default()
        .iter()
        .fold(0u32, |acc, &s| {
            acc.wrapping_add(u32::from(holder[s as usize]))
                .wrapping_add(sizes[s as usize])
        });
    std::hint::black_box(acc);
}

/// The first node after `node` (in ring order) whose planner holds `sample`: the peer that
/// serves a sample some node holds.
fn next_holder<O: StreamSource>(
    planners: &[Planner<ClusterView<O>>],
    node: usize,
    sample: SampleId,
) -> u16 {
    let nodes = planners.len();
    let h = (1..nodes)
        .map(|i| (node + i) % nodes)
        .find(|&h| planners[h].policy().contains(sample))
        .expect("a counted holder holds the sample");
    h as u16
}

/// The next decision of each node's own plan replayed in global order (the local mode):
/// `at` is the position in the global stream and its end.
fn next_local<O: StreamSource + Clone>(
    layout: &ClusterLayout<O>,
    planners: &mut [Planner<ClusterView<O>>],
    holders: &mut [u16],
    scratch: &mut Vec<SampleId>,
    (position, end): (&mut u64, u64),
    evicted: &mut Vec<(SampleId, u16)>,
) -> Result<Option<ClusterDecision>, ClusterError> {
    let epoch_accesses = layout.epoch_accesses();
    if *position == end {
        return Ok(None);
    }
    let p = *position;
    *position += 1;
    let node = layout.node_at(p % epoch_accesses);
    let slot = layout.slot_at(p % epoch_accesses);
    let a = usize::from(node);
    let d = planners[a]
        .next(scratch)?
        .expect("a node's stream is its share of the global one");
    let s = d.sample;
    let served = if d.hit {
        Served::Local
    } else if holders[s as usize] > 0 {
        Served::Remote(next_holder(planners, a, s))
    } else {
        Served::Storage
    };
    if d.admitted {
        holders[s as usize] += 1;
    }
    for &e in scratch.iter() {
        holders[e as usize] -= 1;
        evicted.push((e, node));
    }
    let kept_at = planners[a].policy().contains(s).then_some(node);
    Ok(Some(ClusterDecision {
        position: p,
        epoch: d.epoch,
        node,
        slot,
        sample: s,
        size_bytes: d.size_bytes,
        served,
        kept_at,
    }))
}

/// The cluster plan: every decision of every node, in global canonical order, without
/// allocating per call. See the module docs.
#[derive(Debug)]
pub struct ClusterPlanner<O> {
    layout: ClusterLayout<O>,
    sizes: Arc<[u32]>,
    capacity_bytes: u64,
    mode: PeerPlanKind,
    engine: Engine<O>,
    stats: ClusterStats,
    peak_memory_bytes: usize,
}

impl<O: StreamSource + Clone> ClusterPlanner<O> {
    /// A plan over `layout`'s global stream with a cache of `capacity_bytes` per node, over
    /// samples sized by `sizes`, under the plan [`PeerPlanKind::auto`] picks.
    ///
    /// # Errors
    /// As [`with_config`](ClusterPlanner::with_config).
    pub fn new(
        layout: ClusterLayout<O>,
        sizes: Arc<[u32]>,
        capacity_bytes: u64,
    ) -> Result<Self, ClusterError> {
        Self::with_config(layout, sizes, capacity_bytes, ClusterConfig::default())
    }

    /// [`new`](ClusterPlanner::new) with explicit tuning.
    ///
    /// # Errors
    /// [`CacheError::TooManySamples`] (as [`ClusterError::Cache`]) if `sizes` has more than
    /// `u32::MAX` entries; a sample without a size is reported by
    /// [`next`](ClusterPlanner::next).
    pub fn with_config(
        layout: ClusterLayout<O>,
        sizes: Arc<[u32]>,
        capacity_bytes: u64,
        config: ClusterConfig,
    ) -> Result<Self, ClusterError> {
        let n = sizes.len();
        if u32::try_from(n).is_err() {
            return Err(CacheError::TooManySamples { num_samples: n }.into());
        }
        let nodes = layout.nodes();
        let dataset_bytes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        let mode = match config.assign {
            Assign::Sampler => config
                .mode
                .unwrap_or_else(|| PeerPlanKind::auto(dataset_bytes, nodes, capacity_bytes)),
            // Only the cluster plan knows every node's holdings.
            Assign::Locality => match config.mode {
                Some(PeerPlanKind::Node) => return Err(ClusterError::LocalityInLocalMode),
                _ => PeerPlanKind::Cluster,
            },
        };
        let batch = config.batch_accesses_max.unwrap_or(match mode {
            // Every sample of a shuffled global epoch comes back in the next one, so a batch of
            // one epoch finds every next use in the near look-ahead.
            PeerPlanKind::Cluster => layout.epoch_accesses() as usize,
            PeerPlanKind::Node => DEFAULT_BATCH_PER_SAMPLE_X2 * n / 2,
        });
        let engine = match mode {
            PeerPlanKind::Cluster => Engine::Cluster {
                index: Box::new(NextUseIndex::new(layout.global(), n, true, batch)),
                policies: (0..nodes)
                    .map(|_| ReusePolicy::new(sizes.clone(), capacity_bytes))
                    .collect(),
                holder: vec![NONE; n],
                scratch: Vec::new(),
                until_warm: 0,
                locality: (config.assign == Assign::Locality).then(Box::default),
                pricing: config.prices.map(|p| {
                    let floor =
                        dataset_bytes.saturating_sub((nodes as u64).saturating_mul(capacity_bytes));
                    Box::new(Pricing::new(p, nodes, floor))
                }),
            },
            PeerPlanKind::Node => {
                let planner_config = PlannerConfig {
                    batch_accesses_max: Some(batch / nodes),
                };
                let planners = (0..nodes)
                    .map(|a| {
                        Planner::with_config(
                            layout.node(a),
                            sizes.clone(),
                            capacity_bytes,
                            PolicyKind::Reuse,
                            planner_config,
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Engine::Local {
                    planners,
                    holders: vec![0; n],
                    scratch: Vec::new(),
                    position: 0,
                    end: layout.epoch_accesses() * u64::from(layout.epochs()),
                }
            }
        };
        let stats = ClusterStats::new(nodes, layout.epochs(), dataset_bytes, capacity_bytes);
        Ok(ClusterPlanner {
            layout,
            sizes,
            capacity_bytes,
            mode,
            engine,
            stats,
            peak_memory_bytes: 0,
        })
    }

    /// Which plan runs: each node's own or the cluster's.
    pub fn mode(&self) -> PeerPlanKind {
        self.mode
    }

    /// Each node's cache capacity.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// The layout planned.
    pub fn layout(&self) -> &ClusterLayout<O> {
        &self.layout
    }

    /// Decides the next access of the global stream; `None` at its end.
    ///
    /// `evicted` is cleared, then receives the (sample, node) pairs leaving a node's cache, in
    /// order (possibly the accessed sample itself, on a hit with no next use: serve the hit
    /// before dropping). After the decision no node holds more than `capacity_bytes`.
    ///
    /// # Errors
    /// [`CacheError::SampleOutOfRange`] (as [`ClusterError::Cache`]) if the stream names a
    /// sample without a size.
    pub fn next(
        &mut self,
        evicted: &mut Vec<(SampleId, u16)>,
    ) -> Result<Option<ClusterDecision>, ClusterError> {
        evicted.clear();
        let epoch_accesses = self.layout.epoch_accesses();
        let mut rerouted = false;
        let d = match &mut self.engine {
            Engine::Cluster {
                index,
                policies,
                holder,
                scratch,
                until_warm,
                locality,
                pricing,
            } => {
                if *until_warm == 0 {
                    *until_warm = WARM_AHEAD;
                    warm(index.upcoming(2 * WARM_AHEAD), holder, &self.sizes);
                }
                *until_warm -= 1;
                let Some(a) = index.next_access()? else {
                    return Ok(None);
                };
                let (node, slot) = match locality {
                    Some(l) => l.at(&self.layout, a.epoch, a.position, holder, &self.sizes),
                    None => {
                        let index = a.position % epoch_accesses;
                        (self.layout.node_at(index), self.layout.slot_at(index))
                    }
                };
                let s = a.sample;
                let h = holder[s as usize];
                scratch.clear();
                let size_bytes = self.sizes[s as usize];
                let (served, keeper) = if h == NONE {
                    (Served::Storage, node)
                } else if h == node {
                    (Served::Local, h)
                } else if pricing.as_mut().is_some_and(|p| {
                    p.reroutes(a.epoch, (usize::from(node), usize::from(h)), size_bytes)
                }) {
                    rerouted = true;
                    (Served::Storage, h)
                } else {
                    (Served::Remote(h), h)
                };
                let out = policies[usize::from(keeper)].access(s, a.position, a.next_use, scratch);
                debug_assert_eq!(out.hit, h != NONE);
                if out.admitted {
                    holder[s as usize] = keeper;
                }
                for &e in scratch.iter() {
                    holder[e as usize] = NONE;
                    evicted.push((e, keeper));
                }
                let kept_at = (holder[s as usize] != NONE).then_some(keeper);
                ClusterDecision {
                    position: a.position,
                    epoch: a.epoch,
                    node,
                    slot,
                    sample: s,
                    size_bytes,
                    served,
                    kept_at,
                }
            }
            Engine::Local {
                planners,
                holders,
                scratch,
                position,
                end,
            } => {
                let Some(d) = next_local(
                    &self.layout,
                    planners,
                    holders,
                    scratch,
                    (position, *end),
                    evicted,
                )?
                else {
                    return Ok(None);
                };
                d
            }
        };
        self.record(&d, rerouted);
        Ok(Some(d))
    }

    /// Counts decision `d` (`rerouted`: a remote hit read from storage instead), and samples
    /// the plan's memory now and then.
    fn record(&mut self, d: &ClusterDecision, rerouted: bool) {
        let counts =
            &mut self.stats.counts[d.epoch as usize * self.layout.nodes + usize::from(d.node)];
        counts.record(d.served, d.size_bytes);
        if rerouted {
            counts.rerouted_reads += 1;
            counts.rerouted_bytes += u64::from(d.size_bytes);
        }
        if d.position % 65_536 == 0 {
            self.peak_memory_bytes = self.peak_memory_bytes.max(self.memory_bytes());
        }
    }

    /// Runs the stream to its end and returns the counters.
    ///
    /// # Errors
    /// As [`next`](ClusterPlanner::next).
    pub fn run_to_end(&mut self) -> Result<ClusterStats, ClusterError> {
        let mut evicted = Vec::new();
        while self.next(&mut evicted)?.is_some() {}
        self.peak_memory_bytes = self.peak_memory_bytes.max(self.memory_bytes());
        Ok(self.stats.clone())
    }

    /// Counters so far.
    pub fn stats(&self) -> &ClusterStats {
        &self.stats
    }

    /// Whether node `node` holds `sample` now.
    pub fn holds(&self, node: usize, sample: SampleId) -> bool {
        match &self.engine {
            Engine::Cluster { holder, .. } => holder[sample as usize] == node as u16,
            Engine::Local { planners, .. } => planners[node].policy().contains(sample),
        }
    }

    /// Bytes node `node` holds now.
    pub fn used_bytes(&self, node: usize) -> u64 {
        match &self.engine {
            Engine::Cluster { policies, .. } => policies[node].used_bytes(),
            Engine::Local { planners, .. } => planners[node].policy().used_bytes(),
        }
    }

    /// Heap bytes held by the plan now, excluding the shared size table and the orders.
    pub fn memory_bytes(&self) -> usize {
        let engine = match &self.engine {
            Engine::Cluster {
                index,
                policies,
                holder,
                scratch,
                locality,
                pricing,
                ..
            } => {
                locality.as_ref().map_or(0, |l| l.memory_bytes())
                    + pricing.as_ref().map_or(0, |p| p.memory_bytes())
                    + index.memory_bytes()
                    + policies.iter().map(|p| p.memory_bytes()).sum::<usize>()
                    + policies.capacity() * size_of::<ReusePolicy>()
                    + holder.capacity() * size_of::<u16>()
                    + scratch.capacity() * size_of::<SampleId>()
            }
            Engine::Local {
                planners,
                holders,
                scratch,
                ..
            } => {
                planners.iter().map(|p| p.memory_bytes()).sum::<usize>()
                    + holders.capacity() * size_of::<u16>()
                    + scratch.capacity() * size_of::<SampleId>()
            }
        };
        engine + self.stats.counts.capacity() * size_of::<ClusterCounts>() + size_of::<Self>()
    }

    /// The most [`memory_bytes`](ClusterPlanner::memory_bytes) seen so far (sampled every
    /// 65,536 decisions and at the end of [`run_to_end`](ClusterPlanner::run_to_end)).
    pub fn peak_memory_bytes(&self) -> usize {
        self.peak_memory_bytes.max(self.memory_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VecSource;
    use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};

    /// The kit's shuffled stream as plain ids: this build's cfg(test) bounds of the index
    /// hold only in unit tests, which cannot take the kit's `StreamSource`.
    fn shuffled(samples: u32, epochs: u32, seed: u64) -> VecSource {
        let stream = ShuffledStream {
            num_samples: samples,
            epochs,
            nodes: 1,
            node: 0,
            seed,
        };
        VecSource::new(stream.to_epochs())
    }

    #[test]
    fn mode_rule_is_local_up_to_capacity_times_nodes_squared_equal_to_the_dataset() {
        assert_eq!(PeerPlanKind::auto(1600, 4, 100), PeerPlanKind::Node);
        assert_eq!(PeerPlanKind::auto(1600, 4, 101), PeerPlanKind::Cluster);
        assert_eq!(PeerPlanKind::auto(1600, 1, 1600), PeerPlanKind::Node);
        assert_eq!(
            PeerPlanKind::auto(u64::MAX, 65_535, u64::MAX),
            PeerPlanKind::Cluster
        );
        let layout = ClusterLayout::new(shuffled(10, 2, 1), 10, 2, 1, 2).unwrap();
        let sizes: Arc<[u32]> = vec![10; 10].into();
        let small = ClusterPlanner::new(layout.clone(), sizes.clone(), 25).unwrap();
        assert_eq!(small.mode(), PeerPlanKind::Node);
        let large = ClusterPlanner::new(layout, sizes, 26).unwrap();
        assert_eq!(large.mode(), PeerPlanKind::Cluster);
    }

    #[test]
    fn shapes_out_of_range_are_refused_naming_the_parameter() {
        let o = || shuffled(10, 1, 1);
        for (nodes, ranks, batch, len, parameter) in [
            (0, 1, 1, 10, "nodes"),
            (65_536, 1, 1, 10, "nodes"),
            (2, 0, 1, 10, "ranks_per_node"),
            (2, 1, 0, 10, "batch_size"),
            (2, 1, 1, 0, "order_len"),
            (2, 1, 1, u32::MAX as usize, "order_len"),
        ] {
            match ClusterLayout::new(o(), len, nodes, ranks, batch) {
                Err(e @ ClusterError::Shape { parameter: p, .. }) if p == parameter => {
                    assert!(e.to_string().contains(parameter), "{e}");
                }
                other => panic!("{parameter}: {other:?}"),
            }
        }
    }

    #[test]
    fn sample_without_a_size_is_an_error_in_both_modes() {
        for mode in [PeerPlanKind::Node, PeerPlanKind::Cluster] {
            let layout =
                ClusterLayout::new(VecSource::new(vec![vec![0, 1], vec![1, 5]]), 2, 2, 1, 1)
                    .unwrap();
            let config = ClusterConfig {
                mode: Some(mode),
                ..ClusterConfig::default()
            };
            let sizes: Arc<[u32]> = vec![1; 3].into();
            let mut planner = ClusterPlanner::with_config(layout, sizes, 1, config).unwrap();
            match planner.run_to_end() {
                Err(ClusterError::Cache(CacheError::SampleOutOfRange { sample: 5, .. })) => {}
                other => panic!("{mode:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn uneven_shares_pad_and_every_node_makes_its_share() {
        // 11 samples over 3 nodes of 2 ranks, batch 1: per rank 2, the head padded.
        let layout = ClusterLayout::new(shuffled(11, 1, 3), 11, 3, 2, 1).unwrap();
        assert_eq!(layout.epoch_accesses(), 12);
        let nodes: Vec<u16> = (0..12).map(|i| layout.node_at(i)).collect();
        assert_eq!(nodes, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]);
        let slots: Vec<u32> = (0..12).map(|i| layout.slot_at(i)).collect();
        assert_eq!(slots, [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]);
        let steps: Vec<u64> = (0..14).map(|p| layout.step_at(p)).collect();
        assert_eq!(steps, [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2]);
        let mut ids = Vec::new();
        layout.global().fill_epoch(0, &mut ids);
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct, (0..11).collect::<Vec<_>>());
    }

    /// 4,000 samples (about 110 kB) on 4 nodes of 2 ranks, batch 8, 4 epochs, each node
    /// caching 20% of the dataset (the floor: 20% of it per epoch), planned with `config`;
    /// and the dataset's bytes.
    fn twenty_percent_of_four(config: ClusterConfig) -> (ClusterStats, u64) {
        let n = 4000;
        let sizes: Arc<[u32]> = lognormal_sizes(n as usize, 110_000.0, 0.5, 5).into();
        let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        let layout = ClusterLayout::new(shuffled(n, 4, 9), n as usize, 4, 2, 8).unwrap();
        let stats = ClusterPlanner::with_config(layout, sizes, total / 5, config)
            .unwrap()
            .run_to_end()
            .unwrap();
        (stats, total)
    }

    #[test]
    fn cluster_mode_reaches_the_floor_where_per_node_belady_does_not() {
        let run = |mode| {
            twenty_percent_of_four(ClusterConfig {
                mode: Some(mode),
                ..ClusterConfig::default()
            })
        };
        let ((cluster, total), (local, _)) = (run(PeerPlanKind::Cluster), run(PeerPlanKind::Node));
        let floor = cluster.floor_bytes_per_epoch();
        assert_eq!(floor, total - 4 * (total / 5));
        for e in 1..4 {
            let c = cluster.epoch(e).storage_bytes;
            assert!(c >= floor, "epoch {e}: below the floor");
            assert!(
                (c as f64) < 1.1 * floor as f64,
                "epoch {e}: {c} vs floor {floor}"
            );
            assert!(local.epoch(e).storage_bytes as f64 > 1.3 * floor as f64);
        }
        assert_eq!(cluster.epoch(0).storage_bytes, total);
    }

    fn locality(mode: Option<PeerPlanKind>) -> ClusterConfig {
        ClusterConfig {
            mode,
            assign: Assign::Locality,
            ..ClusterConfig::default()
        }
    }

    /// Checks one step's decisions against the rule, from the holders before its first access.
    fn check_step(step: &[ClusterDecision], before: &[u16], nodes: usize, ranks: usize) {
        let quota = (step.len() / (nodes * ranks) * ranks) as u32;
        assert_eq!(
            step.len() as u32,
            quota * nodes as u32,
            "every node makes its share"
        );
        // Storage reads are placed first; a held sample then goes to its holder while the
        // holder has room.
        let mut room = vec![quota; nodes];
        for d in step.iter().filter(|d| before[d.sample as usize] == NONE) {
            room[usize::from(d.node)] -= 1;
        }
        let mut slots = vec![0u32; nodes];
        for d in step {
            let n = usize::from(d.node);
            assert_eq!(d.slot, slots[n], "a node's slots follow the stream");
            slots[n] += 1;
            let h = before[d.sample as usize];
            if h != NONE && room[usize::from(h)] > 0 {
                assert_eq!(
                    d.node, h,
                    "sample {} at {}: to its holder",
                    d.sample, d.position
                );
                room[usize::from(h)] -= 1;
            }
        }
        assert!(slots.iter().all(|&s| s == quota), "{slots:?} of {quota}");
    }

    #[test]
    fn locality_gives_each_step_to_its_holders_and_keeps_the_stream() {
        for (n, nodes, ranks, batch, frac, seed) in [
            (400u32, 4, 2, 4, 0.2, 1u64),
            (401, 3, 2, 5, 0.3, 2),
            (97, 2, 3, 4, 0.5, 3),
            (50, 5, 1, 3, 0.25, 4),
        ] {
            let sizes: Arc<[u32]> = lognormal_sizes(n as usize, 1000.0, 0.5, seed).into();
            let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
            let layout =
                ClusterLayout::new(shuffled(n, 3, seed), n as usize, nodes, ranks, batch).unwrap();
            let capacity = (total as f64 * frac) as u64;
            let mut planner =
                ClusterPlanner::with_config(layout.clone(), sizes, capacity, locality(None))
                    .unwrap();
            assert_eq!(planner.mode(), PeerPlanKind::Cluster);
            let mut stream = Vec::new();
            for e in 0..3 {
                layout.global().fill_epoch(e, &mut stream);
            }
            let (mut holder, mut before) = (vec![NONE; n as usize], vec![NONE; n as usize]);
            let (mut step, mut evicted, mut local) = (Vec::new(), Vec::new(), 0);
            while let Some(d) = planner.next(&mut evicted).unwrap() {
                assert_eq!(
                    d.sample, stream[d.position as usize],
                    "the stream is the sampler's"
                );
                if step.last().is_some_and(|p: &ClusterDecision| {
                    layout.step_at(p.position) != layout.step_at(d.position)
                }) {
                    check_step(&step, &before, nodes, ranks);
                    step.clear();
                }
                if step.is_empty() {
                    before.clone_from(&holder);
                }
                let h = holder[d.sample as usize];
                let want = match h {
                    NONE => Served::Storage,
                    h if h == d.node => Served::Local,
                    h => Served::Remote(h),
                };
                assert_eq!(d.served, want, "at {}", d.position);
                local += u64::from(d.served == Served::Local);
                for &(e, _) in &evicted {
                    holder[e as usize] = NONE;
                }
                holder[d.sample as usize] = d.kept_at.unwrap_or(NONE);
                step.push(d);
            }
            check_step(&step, &before, nodes, ranks);
            assert_eq!(stream.len(), step[0].position as usize + step.len());
            assert!(local > 0, "{n} samples: some local hits");
        }
    }

    #[test]
    fn locality_turns_remote_hits_local_and_keeps_the_floor() {
        let (sampler, _) = twenty_percent_of_four(ClusterConfig::default());
        let (near, total) = twenty_percent_of_four(locality(None));
        let floor = near.floor_bytes_per_epoch();
        for e in 1..4 {
            let (s, l) = (sampler.epoch(e), near.epoch(e));
            assert!(l.storage_bytes >= floor && (l.storage_bytes as f64) < 1.1 * floor as f64);
            assert!(
                l.local_hits > 3 * s.local_hits,
                "epoch {e}: {} local hits against the sampler's {}",
                l.local_hits,
                s.local_hits
            );
            let per_node: Vec<u64> = (0..4).map(|a| near.of(e, a).storage_bytes).collect();
            let (lo, hi) = (
                per_node.iter().min().unwrap(),
                per_node.iter().max().unwrap(),
            );
            assert!(
                (*hi as f64) < 1.1 * *lo as f64,
                "epoch {e}: storage per node {per_node:?}"
            );
        }
        assert_eq!(near.epoch(0).storage_bytes, total);
    }

    /// Every decision and eviction of [`twenty_percent_of_four`]'s plan with `config`.
    fn decisions_of_four(config: ClusterConfig) -> (Vec<ClusterDecision>, Vec<Vec<(u32, u16)>>) {
        let n = 4000;
        let sizes: Arc<[u32]> = lognormal_sizes(n as usize, 110_000.0, 0.5, 5).into();
        let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        let layout = ClusterLayout::new(shuffled(n, 4, 9), n as usize, 4, 2, 8).unwrap();
        let mut planner = ClusterPlanner::with_config(layout, sizes, total / 5, config).unwrap();
        let (mut decisions, mut evictions, mut evicted) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(d) = planner.next(&mut evicted).unwrap() {
            decisions.push(d);
            evictions.push(evicted.clone());
        }
        (decisions, evictions)
    }

    fn priced(storage_mbps: u64, net_mbps: u64, assign: Assign) -> ClusterConfig {
        ClusterConfig {
            prices: Some(LinkPrices {
                storage_bytes_per_s: storage_mbps * 1_000_000,
                net_bytes_per_s: net_mbps * 1_000_000,
            }),
            assign,
            ..ClusterConfig::default()
        }
    }

    /// Per warm epoch, the busiest node's time in the prices' model: the most of its storage
    /// bytes over the storage bandwidth and its bytes in or out over the interconnect's.
    fn busiest_s(decisions: &[ClusterDecision], prices: LinkPrices) -> Vec<f64> {
        let epochs = decisions.last().map_or(0, |d| d.epoch as usize + 1);
        let mut bytes = vec![[0u64; 3]; epochs * 4];
        for d in decisions {
            let b = u64::from(d.size_bytes);
            let at = |n: u16| d.epoch as usize * 4 + usize::from(n);
            match d.served {
                Served::Storage => bytes[at(d.node)][0] += b,
                Served::Remote(h) => {
                    bytes[at(d.node)][1] += b;
                    bytes[at(h)][2] += b;
                }
                Served::Local => {}
            }
        }
        let (s, l) = (
            prices.storage_bytes_per_s as f64,
            prices.net_bytes_per_s as f64,
        );
        (1..epochs)
            .map(|e| {
                (0..4)
                    .map(|n| {
                        let [st, i, o] = bytes[e * 4 + n];
                        (st as f64 / s).max(i.max(o) as f64 / l)
                    })
                    .fold(0.0, f64::max)
            })
            .collect()
    }

    #[test]
    fn priced_remote_hits_change_only_where_the_bytes_come_from() {
        let (plain, plain_evictions) = decisions_of_four(ClusterConfig::default());
        let config = priced(30, 40, Assign::Sampler);
        let (slow, slow_evictions) = decisions_of_four(config);
        assert_eq!(plain_evictions, slow_evictions, "the caches are the same");
        let mut rerouted = 0;
        for (p, s) in plain.iter().zip(&slow) {
            assert_eq!(
                (p.position, p.node, p.slot, p.sample, p.kept_at),
                (s.position, s.node, s.slot, s.sample, s.kept_at)
            );
            if p.served != s.served {
                // The holder keeps it, or lets it go after its last use.
                assert!(matches!(p.served, Served::Remote(h) if p.kept_at.is_none_or(|k| k == h)));
                assert_eq!(s.served, Served::Storage, "at {}", s.position);
                rerouted += 1;
            }
        }
        assert_eq!(plain.len(), slow.len());
        let (stats, _) = twenty_percent_of_four(config);
        assert_eq!(stats.total().rerouted_reads, rerouted);
        assert!(
            rerouted > 0,
            "a 40 MB/s interconnect against 30 MB/s storage"
        );
        assert_eq!(
            stats.epoch(0).rerouted_reads,
            0,
            "the cold epoch has no hits"
        );
        // The busiest node's time in the model is lower in every warm epoch.
        let prices = config.prices.unwrap();
        let (before, after) = (busiest_s(&plain, prices), busiest_s(&slow, prices));
        for (e, (b, a)) in before.iter().zip(&after).enumerate() {
            assert!(a < &(0.82 * b), "epoch {}: {a} s against {b} s", e + 1);
        }
    }

    #[test]
    fn a_fast_interconnect_reroutes_nothing() {
        for assign in [Assign::Sampler, Assign::Locality] {
            let plain = decisions_of_four(ClusterConfig {
                assign,
                ..ClusterConfig::default()
            });
            assert_eq!(decisions_of_four(priced(30, 12_500, assign)), plain);
        }
    }

    #[test]
    fn locality_needs_cluster_mode() {
        let layout = ClusterLayout::new(shuffled(10, 1, 1), 10, 2, 1, 2).unwrap();
        let sizes: Arc<[u32]> = vec![10; 10].into();
        match ClusterPlanner::with_config(layout, sizes, 1, locality(Some(PeerPlanKind::Node))) {
            Err(e @ ClusterError::LocalityInLocalMode) => {
                assert!(e.to_string().contains("cluster mode"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
