//! What the planner thread is given, built in `pipeline/mod.rs`.

use std::sync::{Arc, Mutex};

use crossbeam_channel::Sender;
use lobster_cache::FormStats;
use lobster_sched::CostModel;

use crate::metrics::{ClusterPlanMetrics, Collector};
use crate::pipeline::decode::forms::DecodedTier;
use crate::pipeline::decode::queue::DecodeQueues;
use crate::pipeline::deliver::reorder::ReorderBuffer;
use crate::pipeline::disk::DiskLevel;
use crate::pipeline::io::order::ToDispatcher;
use crate::pipeline::outstanding::Outstanding;
use crate::pipeline::peers::Peers;
use crate::pipeline::progress::Progress;
use crate::pipeline::read_path::ReadPathCounters;
use crate::pipeline::sync::StopSignal;

/// What the planner is given; its peer fetches' answers use it too, after the planner ends.
pub(crate) struct ForPlanner<T> {
    pub(crate) stop: Arc<StopSignal>,
    /// Why the planner could not run as `SCHED_BATCH`, if it could not.
    pub(crate) batch_refused: Arc<Mutex<Option<String>>>,
    pub(crate) progress: Arc<Progress>,
    pub(crate) outstanding: Arc<Outstanding>,
    pub(crate) decode: Arc<DecodeQueues>,
    pub(crate) ranks: Arc<[ReorderBuffer<T>]>,
    /// The dispatcher's queue (pipelined only): the planner's reads, and the reads of
    /// misses a peer did not serve.
    pub(crate) to_dispatcher: Option<Sender<ToDispatcher>>,
    pub(crate) collector: Arc<Mutex<Collector>>,
    pub(crate) model: Arc<Mutex<CostModel>>,
    pub(crate) read_path: Arc<ReadPathCounters>,
    /// The planner's form decisions, once it is done (with a decoded tier).
    pub(crate) form_plan: Arc<Mutex<Option<FormStats>>>,
    /// This node's share of the cluster plan, once the planner is done (under it).
    pub(crate) cluster_plan: Arc<Mutex<Option<ClusterPlanMetrics>>>,
    /// Peer nodes whose caches serve planned misses.
    pub(crate) peers: Option<Arc<Peers>>,
    /// The decoded tier, whose forms the planner prices.
    pub(crate) tier: Option<Arc<DecodedTier<T>>>,
    /// The disk cache below the memory cache, planned with it.
    pub(crate) disk: Option<Arc<DiskLevel>>,
}
