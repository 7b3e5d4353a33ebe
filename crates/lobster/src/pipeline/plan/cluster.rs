//! This node's share of the cluster plan (`lobster_cache::ClusterPlanner`): every node runs
//! the whole job's plan over the global stream, from the inputs they all share, and acts on
//! the decisions that touch it: its own accesses (a local hit, a peer's cache, or storage,
//! and whether it keeps the sample) and the evictions from its cache that other nodes'
//! accesses cause. No traffic decides anything.

use std::sync::Arc;

use lobster_cache::{
    Assign, ClusterConfig, ClusterDecision, ClusterLayout, ClusterPlanner, LinkPrices, PeerPlanKind,
};

use crate::error::Error;
use crate::metrics::ClusterPlanMetrics;
use crate::pipeline::layout::Layout;
use crate::sampler::SamplerOrders;

/// The global plan, walked up to this node's next access.
pub(crate) struct NodeShare {
    planner: ClusterPlanner<SamplerOrders>,
    node: u16,
    evicted: Vec<(u32, u16)>,
    /// Accesses of other nodes this node's cache is planned to serve.
    serves_planned: u64,
    locality: bool,
    prices: Option<LinkPrices>,
}

impl std::fmt::Debug for NodeShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeShare")
            .field("node", &self.node)
            .field("serves_planned", &self.serves_planned)
            .finish()
    }
}

/// The cluster plan's layout of `nodes` nodes shaped as `layout` (this node's), from the
/// epoch the run starts at; a run resumed within an epoch is not planned as one cluster (see
/// the loader's choice).
pub(crate) fn cluster_layout(
    layout: &Layout,
    nodes: usize,
) -> Result<ClusterLayout<SamplerOrders>, Error> {
    debug_assert!(layout.head.is_none(), "the cluster plan starts at an epoch");
    let orders =
        SamplerOrders::from_epoch(layout.sampler.clone(), layout.start_epoch, layout.epochs);
    ClusterLayout::new(
        orders,
        layout.per_rank * layout.world,
        nodes,
        layout.ranks,
        layout.batch,
    )
    .map_err(|e| Error::engine("cluster plan", e))
}

impl NodeShare {
    /// Node `node`'s share of the plan of `nodes` nodes each caching `capacity_bytes`; with
    /// `locality`, each step's samples go to the nodes that hold them; with `prices`, a remote
    /// hit may be read from storage instead.
    pub(crate) fn new(
        layout: &Layout,
        (nodes, node): (usize, usize),
        sizes: Arc<[u32]>,
        capacity_bytes: u64,
        (locality, prices): (bool, Option<LinkPrices>),
    ) -> Result<NodeShare, Error> {
        let config = ClusterConfig {
            mode: Some(PeerPlanKind::Cluster),
            assign: if locality {
                Assign::Locality
            } else {
                Assign::Sampler
            },
            prices,
            ..ClusterConfig::default()
        };
        let planner = ClusterPlanner::with_config(
            cluster_layout(layout, nodes)?,
            sizes,
            capacity_bytes,
            config,
        )
        .map_err(|e| Error::engine("cluster plan", e))?;
        Ok(NodeShare {
            planner,
            node: u16::try_from(node).map_err(|_| Error::invalid("node", node, "below 65535"))?,
            evicted: Vec::new(),
            serves_planned: 0,
            locality,
            prices,
        })
    }

    /// Decides the global stream up to and including this node's next access, and returns
    /// its decision. `leaving` receives the samples this node's cache lets go on the way, each
    /// with the step of the access that evicts it.
    pub(crate) fn next_own(
        &mut self,
        leaving: &mut Vec<(u32, u64)>,
    ) -> Result<ClusterDecision, Error> {
        loop {
            let d = self
                .planner
                .next(&mut self.evicted)
                .map_err(|e| Error::engine("cluster plan", e))?
                .ok_or_else(|| Error::Stopped {
                    reason: "the cluster plan ended before this node's stream".into(),
                })?;
            let step = self.planner.layout().step_at(d.position);
            leaving.extend(
                self.evicted
                    .iter()
                    .filter(|e| e.1 == self.node)
                    .map(|e| (e.0, step)),
            );
            if d.node == self.node {
                return Ok(d);
            }
            if d.served == lobster_cache::Served::Remote(self.node) {
                self.serves_planned += 1;
            }
        }
    }

    /// The iteration (within its epoch) of this node's access `d`.
    pub(crate) fn iteration_of(&self, d: &ClusterDecision) -> usize {
        let layout = self.planner.layout();
        layout.iteration_at(d.position % layout.epoch_accesses())
    }

    /// Whether this node's accesses are the plan's (locality) rather than the sampler's.
    pub(crate) fn assigns(&self) -> bool {
        self.locality
    }

    /// This node.
    pub(crate) fn node(&self) -> u16 {
        self.node
    }

    /// This node's share as the metrics report it.
    pub(crate) fn metrics(&self) -> ClusterPlanMetrics {
        let stats = self.planner.stats();
        ClusterPlanMetrics {
            nodes: self.planner.layout().nodes(),
            dataset_bytes: stats.dataset_bytes(),
            floor_bytes_per_epoch: stats.floor_bytes_per_epoch(),
            epochs: (0..stats.epochs())
                .map(|e| stats.of(e, usize::from(self.node)))
                .collect(),
            serves_planned: self.serves_planned,
            link_prices: self.prices,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{DistributedSampler, EpochOrder};
    use lobster_cache::StreamSource;

    /// The cluster layout's view of every node is the pipeline's layout of that node, access
    /// for access, padded or cut as the sampler does.
    #[test]
    fn every_nodes_stream_is_its_pipeline_layout() {
        for (samples, drop_last) in [(103, false), (103, true), (96, false), (5, false)] {
            let (nodes, ranks, batch, epochs) = (3, 2, 4, 3);
            let sampler = DistributedSampler::new(
                samples,
                nodes * ranks,
                drop_last,
                EpochOrder::Shuffle { seed: 7 },
            )
            .unwrap();
            let layout = |n| Layout::of_node(sampler.clone(), ranks, n, batch, epochs);
            let cluster = cluster_layout(&layout(0), nodes).unwrap();
            for n in 0..nodes {
                let view = cluster.node(n);
                for e in 0..epochs {
                    let (mut want, mut got) = (Vec::new(), Vec::new());
                    layout(n).fill_epoch(e, &mut want);
                    view.fill_epoch(e, &mut got);
                    assert_eq!(
                        got, want,
                        "{samples} samples, drop_last {drop_last}, node {n}"
                    );
                }
            }
        }
    }
}
