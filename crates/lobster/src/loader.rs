//! The loader builder, the loader, and one batch iterator per local rank.

use std::sync::Arc;

use crate::batch::Batch;
use crate::config::{
    CachePolicy, Execution, IoOrder, LoaderConfig, PeerPlanChoice, PipelineThreads, Schedule,
};
use crate::dataset::{Dataset, SampleMeta};
use crate::emulate::StorageEmulation;
use crate::error::{Cause, Error};
use crate::faults::{FaultInjection, OnError};
use crate::memory::{MachineMemory, MemoryPart};
use crate::metrics::{CacheForms, CacheStore, Mode, ReadPath, RunMetrics, ThreadClass};
use crate::pipeline::{self, Context, DecodeFn, ForRanks, Layout, Pipeline};
use crate::resume::{self, JobFingerprint, LoaderState, Positions};
use crate::sampler::{DistributedSampler, EpochOrder};
use lobster_cache::{Assign, PeerPlanKind};
use lobster_cache::{FormChoice, FormCosts, LinkPrices};

/// Builds a [`Loader`]: the dataset, the job's layout, the cache, the budgets and the decode
/// function. Every setting is checked by [`build`](LoaderBuilder::build) before any thread
/// starts.
pub struct LoaderBuilder<T> {
    dataset: Arc<Dataset>,
    config: LoaderConfig,
    order: EpochOrder,
    decode: Option<DecodeFn<T>>,
    /// The decoder in two stages, where it has them (images): what a decoded tier needs.
    staged: Option<MakeStaged<T>>,
    peers: Option<Arc<dyn lobster_net::Transport>>,
    /// A decoded sample's size in bytes, where `T` has one: what
    /// [`LoaderBuilder::decoded_sample_bytes_max`] bounds.
    measure: Option<fn(&T) -> u64>,
    /// Where a resumed loader starts.
    resume: Option<LoaderState>,
    /// Memory the embedder allocates for the run beside the loader, counted in the check
    /// `build` makes before anything is allocated.
    reserved: Vec<MemoryPart>,
}

impl<T: AsRef<[u8]> + Send + 'static> LoaderBuilder<T> {
    /// Bytes a decoded sample may have: a sample that decodes to more fails, naming itself
    /// and its file, and `on_error` decides (skip within the budget, or fail). A node's host
    /// sets each rank's share of a slot, `slot_bytes / batch_size`, so that one large sample
    /// is one bad sample instead of a job stopped.
    pub fn decoded_sample_bytes_max(mut self, bytes: u64) -> Self {
        self.config.limits.decoded_sample_bytes_max = Some(bytes);
        self.measure = Some(|value: &T| value.as_ref().len() as u64);
        self
    }
}

/// `value`, or the cause that fails its sample when it is larger than the bound.
fn within<T>((bytes_max, measure): (u64, fn(&T) -> u64), value: T) -> Result<T, Cause> {
    let bytes = measure(&value);
    if bytes > bytes_max {
        return Err(Cause::from(
            Box::<dyn std::error::Error + Send + Sync>::from(format!(
                "decoded to {bytes} bytes, more than decoded_sample_bytes_max ({bytes_max})"
            )),
        ));
    }
    Ok(value)
}

/// Makes the two-stage decoder once the run's seed and configuration are known (at
/// `build`), so that a decoder seeding augmentation need not be given the seed twice.
pub(crate) type MakeStaged<T> = Box<dyn FnOnce(u64, &LoaderConfig) -> pipeline::Staged<T> + Send>;

impl<T> std::fmt::Debug for LoaderBuilder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoaderBuilder")
            .field("config", &self.config)
            .field("order", &self.order)
            .finish_non_exhaustive()
    }
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident => $($field:ident).+ : $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.config.$($field).+ = value;
                self
            }
        )*
    };
}

impl<T: Send + 'static> LoaderBuilder<T> {
    /// A builder over `dataset` with [`LoaderConfig::default`] and the PyTorch shuffle with
    /// seed 0.
    pub fn new(dataset: impl Into<Arc<Dataset>>) -> Self {
        Self {
            dataset: dataset.into(),
            config: LoaderConfig::default(),
            order: EpochOrder::Shuffle { seed: 0 },
            decode: None,
            staged: None,
            peers: None,
            measure: None,
            resume: None,
            reserved: Vec::new(),
        }
    }

    /// Memory the embedder will allocate for the run beside the loader (its collation
    /// buffers, say), `what` naming the parameters that size it. `build` refuses a run whose
    /// memory, this included, is more than the process may have (see [`MachineMemory`]).
    pub fn reserve_memory(mut self, what: impl Into<String>, bytes: u64) -> Self {
        self.reserved.push(MemoryPart::new(what, bytes));
        self
    }

    /// Continues from `state` (from [`Loader::state`] of a loader of the same job): every rank
    /// is given the batches the saved loader would have given after those it had delivered,
    /// the same samples, labels and decoded values. The cache starts cold and plans the rest
    /// of the run. The world may differ (see [`LoaderState`]); the dataset, the order, the
    /// batch size and `drop_last` may not, and `build` refuses a state that differs, naming
    /// the field.
    pub fn resume_from(mut self, state: LoaderState) -> Self {
        self.resume = Some(state);
        self
    }

    /// The other nodes of the job, reached through `transport`: misses a peer's cache is
    /// planned to hold are fetched from it (when the cost model prices that below storage),
    /// and this node's cache serves theirs. The transport's node and nodes must be the
    /// world's; every node must be built alike (see `lobster_net::Agreement`).
    pub fn peers(mut self, transport: Arc<dyn lobster_net::Transport>) -> Self {
        self.peers = Some(transport);
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: LoaderConfig) -> Self {
        self.config = config;
        self
    }

    /// The world: `nodes` nodes of `ranks_per_node` ranks; this process is node `node`.
    pub fn world(mut self, nodes: usize, ranks_per_node: usize, node: usize) -> Self {
        self.config.job.nodes = nodes;
        self.config.job.ranks_per_node = ranks_per_node;
        self.config.job.node = node;
        self
    }

    /// Shuffle like `DistributedSampler(shuffle=True, seed=seed)`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.order = EpochOrder::Shuffle { seed };
        self
    }

    /// Where each epoch's order comes from (shuffled, sequential or explicit).
    pub fn epoch_order(mut self, order: EpochOrder) -> Self {
        self.order = order;
        self
    }

    /// The cache: a policy and its capacity in bytes.
    pub fn cache(mut self, policy: CachePolicy, capacity_bytes: u64) -> Self {
        self.config.cache.policy = policy;
        self.config.cache.capacity_bytes = capacity_bytes;
        self
    }

    setters! {
        /// Samples per batch per rank.
        batch_size => job.batch_size: usize,
        /// Epochs to load.
        epochs => job.epochs: u32,
        /// Drop each epoch's tail instead of padding it.
        drop_last => job.drop_last: bool,
        /// Which rank of a step gets which of its samples: the sampler's (the default) or
        /// locality-aware under the cluster plan (see [`Assign`](crate::Assign)).
        assign => job.assign: Assign,
        /// Reads in flight the node's ranks share.
        io_depth => budgets.io_depth: usize,
        /// Decode threads the node's ranks share (0: the machine's cores, at least one per
        /// rank).
        decode_threads => budgets.decode_threads: usize,
        /// Iterations the loader may run ahead of the slowest rank.
        prefetch_iterations => budgets.prefetch_iterations: usize,
        /// Iterations per allocation window.
        window_iterations => budgets.window_iterations: usize,
        /// How the budgets are split among ranks.
        schedule => budgets.schedule: Schedule,
        /// How the kernel schedules the planner and the decode workers.
        pipeline_threads => budgets.pipeline_threads: crate::config::PipelineThreads,
        /// How the pipelined mode orders storage reads.
        io_order => reads.io_order: IoOrder,
        /// Whether decode workers read samples the page cache holds themselves.
        resident_reads => reads.resident_reads: crate::config::ResidentReads,
        /// The I/O backend.
        backend => reads.backend: lobster_uring::Backend,
        /// Read with O_DIRECT.
        direct => reads.direct: bool,
        /// Charge every storage read an emulated shared tier's latency and bandwidth.
        storage_emulation => reads.storage_emulation: Option<StorageEmulation>,
        /// Inject deterministic faults into every storage read (tests and demos); `None` for
        /// none.
        inject_faults => reads.inject_faults: Option<FaultInjection>,
        /// What a rank's iterator does with a sample that cannot be read or decoded:
        /// [`OnError::Fail`] (the default) or skip it within a per-epoch budget.
        on_error => on_error: OnError,
        /// Pipelined (io_uring reads, separate decode) or read-then-decode workers.
        execution => execution: Execution,
        /// With peers: the nodes' caches planned as one where that gains, or each node's own.
        peer_plan => cache.peer_plan: PeerPlanChoice,
        /// Pixels an image sample may have ([`LoaderBuilder::decode_images`]); one whose
        /// header claims more fails before it is decoded (see
        /// [`SampleLimits::image_pixels_max`](crate::SampleLimits::image_pixels_max)).
        image_pixels_max => limits.image_pixels_max: u64,
    }

    /// The function that turns a sample's bytes into `T`, run on the decode threads.
    pub fn decode<F, E>(self, decode: F) -> Self
    where
        F: Fn(&[u8], &SampleMeta) -> Result<T, E> + Send + Sync + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.decode_in_epoch(move |bytes, meta, _epoch| decode(bytes, meta))
    }

    /// Like [`LoaderBuilder::decode`], with the epoch of each access as well, so that
    /// augmentation can be seeded by (seed, epoch, sample id) and a run repeats exactly.
    pub fn decode_in_epoch<F, E>(mut self, decode: F) -> Self
    where
        F: Fn(&[u8], &SampleMeta, u32) -> Result<T, E> + Send + Sync + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let decode: DecodeFn<T> = Arc::new(move |bytes: &[u8], meta: &SampleMeta, epoch: u32| {
            decode(bytes, meta, epoch).map_err(|e| Cause::from(e.into()))
        });
        self.decode = Some(decode);
        self.staged = None;
        self
    }

    /// What the cache keeps of each sample (see [`CacheConfig::forms`](crate::CacheConfig::forms)).
    pub fn cache_forms(mut self, forms: FormChoice) -> Self {
        self.config.cache.forms = Some(forms);
        self
    }

    /// Lossy: decoded images the cache keeps are brought down to at most `max_side` pixels a
    /// side (see [`CacheConfig::decoded_max_side`](crate::CacheConfig::decoded_max_side)).
    pub fn decoded_max_side(mut self, max_side: u32) -> Self {
        self.config.cache.decoded_max_side = Some(max_side);
        self
    }

    /// Each node's storage and interconnect bandwidths, with which the cluster plan prices a
    /// remote hit against a storage read (see [`CacheConfig::link_prices`](crate::CacheConfig::link_prices)).
    pub fn link_prices(mut self, prices: LinkPrices) -> Self {
        self.config.cache.link_prices = Some(prices);
        self
    }

    /// The costs the two-form rule prices with (see [`CacheConfig::form_costs`](crate::CacheConfig::form_costs)).
    pub fn form_costs(mut self, costs: FormCosts) -> Self {
        self.config.cache.form_costs = Some(costs);
        self
    }

    /// Decodes in two stages: `decode` turns a sample's bytes into its full-resolution image,
    /// `finish` turns that image (and the epoch, to seed augmentation) into `T`. Running both
    /// is the decode; in between, the cache may keep the image ([`LoaderBuilder::cache_forms`],
    /// auto by default), and its hits then run `finish` alone. `decode` must be a pure
    /// function of the bytes, so that the outputs are the same with and without the tier.
    pub fn decode_in_two_stages<D, F, E>(self, decode: D, finish: F) -> Self
    where
        D: Fn(&[u8], &SampleMeta) -> Result<lobster_image::Image, E> + Send + Sync + 'static,
        F: for<'a> Fn(lobster_image::ImageRef<'a>, &SampleMeta, u32) -> Result<T, E>
            + Send
            + Sync
            + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let staged = pipeline::Staged {
            decode: Arc::new(move |bytes: &[u8], meta: &SampleMeta| {
                decode(bytes, meta).map_err(|e| Cause::from(e.into()))
            }),
            finish: Arc::new(
                move |image: lobster_image::ImageRef<'_>, meta: &SampleMeta, epoch: u32| {
                    finish(image, meta, epoch).map_err(|e| Cause::from(e.into()))
                },
            ),
        };
        self.decode_staged_seeded(move |_, _| staged)
    }

    /// Decodes in two stages (an image decoder and the transform after it) made from the
    /// run's seed; without a decoded tier the two run in turn.
    pub(crate) fn decode_staged_seeded(
        mut self,
        make: impl FnOnce(u64, &LoaderConfig) -> pipeline::Staged<T> + Send + 'static,
    ) -> Self {
        self.staged = Some(Box::new(make));
        self.decode = None;
        self
    }

    /// Checks the configuration and starts the pipeline.
    pub fn build(self) -> Result<Loader<T>, Error> {
        let dataset = self.dataset;
        self.config.validate(dataset.len())?;
        let config = self.config.resolved();
        let seed = match self.order {
            EpochOrder::Shuffle { seed } => seed,
            EpochOrder::Sequential | EpochOrder::Explicit(_) => 0,
        };
        let staged = self.staged.map(|make| make(seed, &config));
        let bound = config.limits.decoded_sample_bytes_max;
        let bound =
            match (bound, self.measure) {
                (Some(bytes_max), Some(measure)) => Some((bytes_max, measure)),
                (Some(bytes_max), None) => return Err(Error::invalid(
                    "decoded_sample_bytes_max",
                    bytes_max,
                    "only through LoaderBuilder::decoded_sample_bytes_max, for samples of bytes",
                )),
                (None, _) => None,
            };
        // Both the whole decode and a decoded hit's second stage end in `T`: both are bounded.
        let staged = staged.map(|s| pipeline::Staged {
            finish: match bound {
                Some(bound) => {
                    let finish = s.finish;
                    Arc::new(
                        move |image: lobster_image::ImageRef<'_>, meta: &SampleMeta, epoch| {
                            within(bound, finish(image, meta, epoch)?)
                        },
                    )
                }
                None => s.finish,
            },
            decode: s.decode,
        });
        let decode: DecodeFn<T> = match (self.decode, &staged) {
            (Some(decode), _) => match bound {
                Some(bound) => Arc::new(move |bytes: &[u8], meta: &SampleMeta, epoch: u32| {
                    within(bound, decode(bytes, meta, epoch)?)
                }),
                None => decode,
            },
            (None, Some(stages)) => {
                let stages = stages.clone();
                Arc::new(move |bytes: &[u8], meta: &SampleMeta, epoch: u32| {
                    let image = (stages.decode)(bytes, meta)?;
                    (stages.finish)((&image).into(), meta, epoch)
                })
            }
            (None, None) => return Err(Error::invalid("decode", "none", "a decode function")),
        };
        let fingerprint = JobFingerprint::of(&dataset, &self.order, &config);
        let sampler = DistributedSampler::new(
            dataset.len(),
            config.world(),
            config.job.drop_last,
            self.order,
        )?;
        if let Some(n) = sampler.explicit_epochs() {
            if (config.job.epochs as usize) > n {
                return Err(Error::invalid(
                    "epochs",
                    config.job.epochs,
                    format!("at most the {n} explicit epoch orders"),
                ));
            }
        }
        let layout = Layout::of_node(
            sampler,
            config.job.ranks_per_node,
            config.job.node,
            config.job.batch_size,
            config.job.epochs,
        );
        let layout = match &self.resume {
            Some(state) => {
                let at = state.position(&fingerprint)?;
                let (epoch, head) = resume::start(&at, &layout.sampler, config.job.batch_size)?;
                // A state at the run's very end resumes to nothing; past it, the run asked for
                // fewer epochs than the state has done.
                let needed = epoch + u32::from(head.is_some());
                if needed > config.job.epochs {
                    return Err(Error::invalid(
                        "epochs",
                        config.job.epochs,
                        format!("at least {needed}: the state resumes at epoch {epoch}"),
                    ));
                }
                layout.resumed(epoch, head)
            }
            None => layout,
        };
        let sizes = match config.cache.policy.kind() {
            Some(_) => Some(cache_sizes(&dataset)?),
            None => None,
        };
        let (peers, peer_plan) = match self.peers {
            Some(transport) => {
                let (p, mode) = peers(&config, sizes.as_ref(), &layout, transport)?;
                (Some(p), mode)
            }
            None => (None, Mode::because(PeerPlanKind::Node, "no peers")),
        };
        let assign = match (config.job.assign, &peer_plan) {
            (Assign::Locality, Mode { mode, reason }) if *mode != PeerPlanKind::Cluster => {
                let why = reason.as_deref().unwrap_or("each node's own plan");
                Mode::because(
                    Assign::Sampler,
                    format!("locality-aware assignment needs the cluster plan: {why}"),
                )
            }
            (chosen, _) => Mode::chosen(chosen),
        };
        let read_ahead_bytes = peers.as_ref().map_or(0, |p| p.read_ahead_bytes);
        let pool = config
            .execution
            .dispatches()
            .then(|| pool_shape(&config, &dataset, read_ahead_bytes));
        let window_bytes = window_bytes(&config, &dataset, pool.map(|(bytes, _)| bytes));
        let mut memory = memory_parts(&config, &dataset, read_ahead_bytes);
        memory.extend(self.reserved);
        MachineMemory::now().check(&memory).map_err(Error::Memory)?;
        let reader = match pool {
            Some(shape) => Some(build_reader(&config, shape)?),
            None => None,
        };
        let backend = reader.as_ref().map(|r| r.backend().clone());
        let dirs = config
            .execution
            .dispatches()
            .then(|| crate::pipeline::SampleDirs::new(dataset.samples()));
        let (forms, cache_forms) = decoded_tier(&config, &dataset, staged, peers.is_some())?;
        let ctx = Context {
            layout,
            config: config.clone(),
            dirs,
            dataset,
            decode,
            storage: pipeline::Storage::new(
                config.reads.storage_emulation,
                config.reads.inject_faults,
                config.job.epochs,
            ),
            reader: reader.clone(),
            arena: cache_arena(&config),
            sizes,
        };
        let pipeline = Pipeline::start(ctx, peers, forms, reader)?;
        let handles = (0..config.job.ranks_per_node)
            .map(|rank| RankHandle {
                state: pipeline.for_ranks.clone(),
                rank,
                ends: pipeline.layout.ends(),
                done: false,
            })
            .collect();
        Ok(Loader {
            pipeline,
            handles: Some(handles),
            config,
            backend,
            window_bytes,
            cache_forms,
            peer_plan,
            assign,
            fingerprint,
        })
    }
}

/// The decoded tier the config asks for, and what the metrics report of it.
fn decoded_tier<T>(
    config: &LoaderConfig,
    dataset: &Dataset,
    staged: Option<pipeline::Staged<T>>,
    has_peers: bool,
) -> Result<(Option<pipeline::DecodedTier<T>>, Mode<CacheForms>), Error> {
    if config.cache.policy == CachePolicy::None {
        return Ok((None, Mode::chosen(CacheForms::None)));
    }
    let chosen = config.cache.forms;
    let staged = match staged {
        _ if chosen == Some(FormChoice::Encoded) => {
            return Ok((None, Mode::chosen(CacheForms::Encoded)))
        }
        None => {
            Err("the decoder has no decoded form; decode_images and decode_in_two_stages give one")
        }
        Some(_) if config.cache.policy != CachePolicy::Reuse => {
            Err("decoded forms need the reuse policy")
        }
        Some(_) if has_peers => Err("peer nodes serve encoded bytes"),
        Some(staged) => Ok(staged),
    };
    let staged = match (staged, chosen) {
        (Ok(staged), _) => staged,
        (Err(why), Some(forms)) => {
            return Err(Error::invalid(
                "cache_forms",
                forms,
                format!("encoded: {why}"),
            ))
        }
        (Err(why), None) => return Ok((None, Mode::because(CacheForms::Encoded, why))),
    };
    let choice = chosen.unwrap_or(FormChoice::Auto);
    // Headers as the dataset's table keeps them: a second open reads no image.
    let probes = dataset.image_probes();
    let (costs, costs_from) = match config.cache.form_costs {
        Some(costs) => (costs, pipeline::CostsFrom::CONFIG),
        None => pipeline::form_costs(&probes, dataset.samples(), config.reads.storage_emulation),
    };
    let max_side = config.cache.decoded_max_side;
    let tier = pipeline::DecodedTier {
        staged,
        choice,
        decoded_sizes: pipeline::decoded_sizes(&probes, max_side),
        costs,
        costs_from,
        max_side,
    };
    let forms = match max_side {
        Some(side) => Mode::because(
            choice.into(),
            format!("decoded images kept at most {side} px a side: lossy"),
        ),
        None => Mode::chosen(choice.into()),
    };
    Ok((Some(tier), forms))
}

/// Whether the nodes' caches are planned as one: where the config allows it and it can gain
/// (see [`PeerPlanChoice::Auto`]), else why not.
fn cluster_plan(
    config: &LoaderConfig,
    sizes: Option<&Arc<[u32]>>,
    layout: &Layout,
) -> Result<(), String> {
    if config.cache.peer_plan == PeerPlanChoice::Node {
        return Err("each node's own plan, as configured".into());
    }
    if layout.head.is_some() {
        return Err(
            "resumed within an epoch: the cluster plan resumes at an epoch's start only".into(),
        );
    }
    if config.cache.policy != CachePolicy::Reuse {
        return Err(format!(
            "the {:?} policy plans each node's own cache",
            config.cache.policy
        ));
    }
    let Some(sizes) = sizes.filter(|s| !s.is_empty()) else {
        return Err("no cache".into());
    };
    let dataset_bytes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let (nodes, capacity) = (config.job.nodes, config.cache.capacity_bytes);
    if PeerPlanKind::auto(dataset_bytes, nodes, capacity) == PeerPlanKind::Node {
        return Err(format!(
            "caches small enough that each node's own plan reads about the floor \
             ({capacity} bytes x {nodes}^2 nodes <= {dataset_bytes} dataset bytes)"
        ));
    }
    // Priced by the cost model's priors (constants), so the same inputs make the same plan.
    let mean_bytes = dataset_bytes / sizes.len() as u64;
    let costs = lobster_sched::CostParams::PRIORS;
    let cost = |tier| {
        let t = costs.tier(tier);
        t.request_s + t.per_byte_s * mean_bytes as f64
    };
    if cost(lobster_sched::Tier::Remote) > cost(lobster_sched::Tier::Storage) {
        return Err("a peer's cache costs more than storage".into());
    }
    Ok(())
}

/// The peers: their caches and this node's planned as one (the cluster plan), or every
/// peer's own cache replayed, so that each of this node's accesses knows which peer (if any)
/// holds its sample around it.
fn peers(
    config: &LoaderConfig,
    sizes: Option<&Arc<[u32]>>,
    layout: &Layout,
    transport: Arc<dyn lobster_net::Transport>,
) -> Result<(pipeline::Peers, Mode<PeerPlanKind>), Error> {
    if (transport.nodes(), transport.node()) != (config.job.nodes, config.job.node) {
        return Err(Error::invalid(
            "peers",
            format!("node {} of {}", transport.node(), transport.nodes()),
            format!(
                "node {} of {}, as the world says",
                config.job.node, config.job.nodes
            ),
        ));
    }
    // The planner runs at most this far ahead of its slowest rank, and nodes meet every
    // step: see the holders module.
    let ahead_steps = config
        .budgets
        .prefetch_iterations
        .max(config.budgets.window_iterations) as u64;
    if let Err(why) = cluster_plan(config, sizes, layout) {
        let plan = match (config.cache.policy.kind(), sizes) {
            (Some(policy), Some(sizes)) => {
                let inputs = crate::pipeline::PeerHoldersInputs {
                    sizes: sizes.clone(),
                    nodes: config.job.nodes,
                    ranks_per_node: config.job.ranks_per_node,
                    batch_size: config.job.batch_size,
                    epochs: config.job.epochs,
                    order: layout.sampler.order().clone(),
                    drop_last: config.job.drop_last,
                    policy,
                    capacity_bytes: config.cache.capacity_bytes,
                    margin_steps: ahead_steps + 1,
                };
                crate::pipeline::PeerHolders::build_resumed(
                    &inputs,
                    config.job.node,
                    &(layout.start_epoch, layout.head.clone()),
                )?
            }
            // Without caches no peer holds anything.
            _ => crate::pipeline::PeerHolders::empty(),
        };
        let peers = pipeline::Peers {
            transport,
            plan,
            cluster: false,
            locality: false,
            read_ahead_bytes: 0,
            served: Arc::default(),
            counters: pipeline::PeerCounters::default(),
            gate: Arc::default(),
        };
        return Ok((peers, Mode::because(PeerPlanKind::Node, why)));
    }
    let peers = pipeline::Peers {
        transport,
        plan: crate::pipeline::PeerHolders::empty(),
        cluster: true,
        locality: config.job.assign == Assign::Locality,
        read_ahead_bytes: crate::pipeline::read_ahead_budget_bytes(
            sizes.map_or(0, |s| s.iter().map(|&b| u64::from(b)).sum()),
            config.job.nodes,
            config.cache.capacity_bytes,
        ),
        // A peer runs at most its prefetch window ahead, a step apart: a fetch of a sample
        // not yet read here waits that long and a little more.
        served: Arc::new(pipeline::ServedLandings::for_cluster(2 * ahead_steps + 4)),
        counters: pipeline::PeerCounters::default(),
        gate: Arc::default(),
    };
    Ok((peers, Mode::chosen(PeerPlanKind::Cluster)))
}

/// Each sample's size as the cache plans with it.
fn cache_sizes(dataset: &Dataset) -> Result<Arc<[u32]>, Error> {
    dataset
        .samples()
        .iter()
        .map(|s| {
            u32::try_from(s.size_bytes).map_err(|_| {
                Error::dataset(
                    &*s.path,
                    format!(
                        "{} bytes: samples of 4 GiB or more are not supported",
                        s.size_bytes
                    ),
                )
            })
        })
        .collect()
}

/// The cache's arena: address space for its capacity and an eighth more (runs are whole
/// pages; copies the planner evicted while planned hits still use them come on top until
/// they drop), faulted in as used. `None` without a cache, or where the system refuses the
/// mapping: large cached samples then get mappings of their own.
fn cache_arena(config: &LoaderConfig) -> Option<lobster_uring::Arena> {
    if config.cache.policy == CachePolicy::None || config.cache.capacity_bytes == 0 {
        return None;
    }
    let budget = config
        .cache
        .capacity_bytes
        .saturating_add(config.cache.capacity_bytes / 8);
    lobster_uring::Arena::new(usize::try_from(budget).ok()?).ok()
}

impl LoaderConfig {
    /// What the parameters make a loader of this configuration over `dataset` allocate: its
    /// cache, the samples it reads ahead and, with a
    /// [`decoded_sample_bytes_max`](crate::SampleLimits::decoded_sample_bytes_max), its
    /// decoded samples in flight. [`LoaderBuilder::build`] checks them, with what the
    /// embedder reserves, against [`MachineMemory`]; an embedder running several
    /// configurations may check them all before building any.
    pub fn memory_parts(&self, dataset: &Dataset) -> Vec<MemoryPart> {
        memory_parts(self, dataset, 0)
    }
}

/// [`LoaderConfig::memory_parts`] with `read_ahead_bytes` of peers' plan read ahead.
fn memory_parts(
    config: &LoaderConfig,
    dataset: &Dataset,
    read_ahead_bytes: u64,
) -> Vec<MemoryPart> {
    let pool = config
        .execution
        .dispatches()
        .then(|| pool_shape(config, dataset, read_ahead_bytes).0);
    let window_bytes = window_bytes(config, dataset, pool);
    let cache = config.cache.capacity_bytes.min(dataset.total_bytes());
    let mut parts = vec![
        // The arena reserves an eighth over the capacity for its blocks' rounding.
        MemoryPart::new(
            "the cache (cache_bytes, at most the dataset)",
            cache.saturating_add(cache / 8),
        ),
        MemoryPart::new(
            "samples read ahead (prefetch_iterations, window_iterations, ranks_per_node, \
             batch_size)",
            window_bytes,
        ),
    ];
    if let Some(bytes) = config.limits.decoded_sample_bytes_max {
        // Decoded samples waiting in the ranks' reorder buffers, and each rank's batch.
        let samples = window_samples(config) + config.job.ranks_per_node * config.job.batch_size;
        parts.push(MemoryPart::new(
            "decoded samples in flight (decoded_sample_bytes_max x (prefetch_iterations + \
             window_iterations + 1) x ranks_per_node x batch_size)",
            bytes.saturating_mul(samples as u64),
        ));
    }
    parts
}

/// Accesses the planner may have handed out and not yet delivered.
fn window_samples(config: &LoaderConfig) -> usize {
    (config.budgets.prefetch_iterations + config.budgets.window_iterations)
        * config.job.ranks_per_node
        * config.job.batch_size
}

/// The reader's allocation unit and O_DIRECT alignment we plan for.
const PAGE_BYTES: u64 = 4096;

/// Bytes the reader reads for a sample of `size` bytes (at offset 0): the sample and the
/// byte that shows a file grew, with O_DIRECT widened to the alignment on both ends.
fn read_bytes(config: &LoaderConfig, size: u64) -> u64 {
    if config.reads.direct {
        (size + 2 * PAGE_BYTES).next_multiple_of(PAGE_BYTES)
    } else {
        size + 1
    }
}

/// The pool block a read takes: the next power of two pages at or above it.
fn block_bytes(read: u64) -> u64 {
    usize::try_from(read).map_or(u64::MAX, |r| lobster_uring::block_bytes(r) as u64)
}

/// Accesses that may hold a pool block at once: those of iterations the planner handed out
/// and the slowest rank has not taken (it plans at most `prefetch_iterations` ahead of it, a
/// window at a time). Reads in flight and samples awaiting decode are among them.
fn pool_accesses(config: &LoaderConfig) -> usize {
    config
        .budgets
        .prefetch_iterations
        .max(config.budgets.window_iterations)
        * config.job.ranks_per_node
        * config.job.batch_size
}

/// The reader's pool: (budget, largest read). Sized from the dataset's actual sizes, not its
/// largest: every access that may hold a block at once ([`pool_accesses`]) at the mean
/// block size the dataset's samples take, plus two largest blocks, so a run of large samples
/// or a fragmented pool still has room; rounded up to whole largest blocks.
///
/// Correctness does not depend on it: blocks are held by reads in flight, completions the
/// dispatcher has not taken yet, reads parked for emulated storage time, and samples awaiting
/// decode. Decode workers always drain (they take no pool memory and wait on nothing that
/// does), and the dispatcher never waits for pool memory (its session refuses a read that
/// finds no free block while others hold some, and the dispatcher tries it again when memory
/// is back), so every block is eventually returned and
/// coalesced and any budget of one largest block or more makes progress. A budget below
/// the working set costs throughput (reads wait for memory), not a deadlock.
fn pool_shape(config: &LoaderConfig, dataset: &Dataset, read_ahead_bytes: u64) -> (u64, u64) {
    let samples = dataset.samples();
    let largest_read = read_bytes(config, dataset.max_sample_bytes());
    let largest_block = block_bytes(largest_read);
    let (blocks_total, bytes_total) = samples.iter().fold((0, 0), |(blocks, bytes), s| {
        (
            blocks + block_bytes(read_bytes(config, s.size_bytes)),
            bytes + s.size_bytes,
        )
    });
    let count = samples.len().max(1) as u64;
    let mean_block = blocks_total.div_ceil(count);
    let accesses = pool_accesses(config) as u64;
    // Read-ahead blocks come on top, rounded as the blocks are.
    let ahead = read_ahead_bytes.div_ceil((bytes_total / count).max(1)) * mean_block;
    let budget =
        (accesses * mean_block + ahead + 2 * largest_block).next_multiple_of(largest_block);
    (budget, largest_read)
}

/// The most bytes of samples the prefetch window holds outside the cache's capacity. Each
/// planned access holds at most its sample's bytes once: a read in flight or awaiting decode,
/// or a cached copy the planner has since evicted but a planned hit still uses. Pipelined,
/// reads live in the reader's pool (its budget, committed up front) and only evicted copies
/// come on top; read-then-decode, both are among the window's accesses. Either way the
/// accesses are bounded by the largest samples of the dataset, as many as the window plans.
fn window_bytes(config: &LoaderConfig, dataset: &Dataset, pool_bytes: Option<u64>) -> u64 {
    let accesses = || largest_bytes(dataset, window_samples(config));
    match pool_bytes {
        Some(pool) if config.cache.policy == CachePolicy::None => pool,
        Some(pool) => pool + accesses(),
        None => accesses(),
    }
}

/// The summed size of the `k` largest samples.
fn largest_bytes(dataset: &Dataset, k: usize) -> u64 {
    let mut sizes: Vec<u64> = dataset.samples().iter().map(|s| s.size_bytes).collect();
    if k < sizes.len() {
        sizes.select_nth_unstable_by(k, |a, b| b.cmp(a));
        sizes.truncate(k);
    }
    sizes.iter().sum()
}

/// The reader, with the pool of [`pool_shape`] (`(budget, largest read)`) and class queues
/// that hold the whole prefetch window, so a submission never waits on a later stage.
fn build_reader(
    config: &LoaderConfig,
    (pool_bytes, max_read_bytes): (u64, u64),
) -> Result<lobster_uring::Reader, Error> {
    let window_samples = window_samples(config);
    // Past usize, the reader's own range check names the parameter.
    let fit = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    lobster_uring::Reader::builder()
        .backend(config.reads.backend)
        .max_read_bytes(fit(max_read_bytes))
        .pool_bytes(fit(pool_bytes))
        .classes(
            config.job.ranks_per_node,
            (config.budgets.io_depth / config.job.ranks_per_node).max(1),
        )
        .queue_capacity(window_samples.max(1))
        // The budget is sized for the window's worst case; pages come in as blocks first
        // use them, so a run of small or page-cache reads never pays for the rest.
        .commit_pool(false)
        .build()
        .map_err(|e| Error::engine("I/O reader", e))
}

/// A running loader. Take the rank handles with [`ranks`](Loader::ranks), give one to each
/// rank's training thread, and keep the loader alive while they iterate; dropping it stops
/// and joins every thread it started.
#[derive(Debug)]
pub struct Loader<T> {
    pipeline: Pipeline<T>,
    handles: Option<Vec<RankHandle<T>>>,
    config: LoaderConfig,
    backend: Option<lobster_uring::BackendInfo>,
    window_bytes: u64,
    /// What the cache keeps of samples, as the metrics report it.
    cache_forms: Mode<CacheForms>,
    /// How the nodes' caches are planned, as the metrics report it.
    peer_plan: Mode<PeerPlanKind>,
    /// Which rank of a step gets which sample, as the metrics report it.
    assign: Mode<Assign>,
    /// What a saved state must share with a loader it resumes.
    fingerprint: JobFingerprint,
}

impl<T> Loader<T> {
    /// One handle per local rank, in rank order; `None` after the first call.
    pub fn ranks(&mut self) -> Option<Vec<RankHandle<T>>> {
        self.handles.take()
    }

    /// The configuration the loader runs with.
    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// The I/O backend and why it was chosen (`None` for read-then-decode workers).
    pub fn backend(&self) -> Option<&lobster_uring::BackendInfo> {
        self.backend.as_ref()
    }

    /// Bound on the bytes of samples the prefetch window holds outside the cache: reads in
    /// flight or waiting for decode (pipelined: the reader's pool budget), and cached copies
    /// evicted while planned hits still use them. The cache's bytes come on top, up to its
    /// capacity.
    pub fn prefetch_window_bytes(&self) -> u64 {
        self.window_bytes
    }

    /// Where every local rank is: the batches it was given so far (taken from its handle, not
    /// prefetched), as a state [`LoaderBuilder::resume_from`] continues from. Save it when
    /// every rank has taken the same number of batches (after a training step): a resume
    /// refuses ranks at different batches.
    pub fn state(&self) -> LoaderState {
        self.positions()
            .state(&self.pipeline.for_ranks.progress.delivered())
    }

    /// How the run's batches map to positions, for a process that counts a rank's batches
    /// itself (a node's rank process) and saves its state.
    pub fn positions(&self) -> Positions {
        Positions::of(&self.pipeline.layout, self.fingerprint.clone())
    }

    /// Batches every rank is given in this run (fewer than the epochs' when resumed).
    pub fn steps(&self) -> u64 {
        self.pipeline.layout.steps()
    }

    /// Batches per epoch per rank.
    pub fn iterations_per_epoch(&self) -> usize {
        self.pipeline.layout.iterations()
    }

    /// The run's metrics so far.
    pub fn metrics(&self) -> RunMetrics {
        let shared = &self.pipeline;
        let mut m = pipeline::lock(&shared.for_ranks.collector).summary();
        let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        m.faults_injected = count(&self.pipeline.context.storage.counters.injected);
        let path = &shared.read_path;
        let tried = count(&path.tried);
        m.reads_resident = count(&path.resident);
        m.reads_not_resident = tried - m.reads_resident.min(tried);
        m.reads_dispatched = count(&path.dispatched);
        m.dirs_held = self.pipeline.dirs_held as u64;
        m.pipeline_threads = match (
            self.config.budgets.pipeline_threads,
            &*pipeline::lock(&shared.batch_refused),
        ) {
            (PipelineThreads::Normal, _) => Mode::chosen(ThreadClass::Normal),
            (PipelineThreads::Batch, None) => Mode::chosen(ThreadClass::Batch),
            (PipelineThreads::Batch, Some(why)) => {
                Mode::because(ThreadClass::Normal, format!("SCHED_BATCH refused: {why}"))
            }
        };
        m.read_path = match self.config.resident_reads_enabled() {
            Ok(()) => Mode::chosen(ReadPath::ResidentOnWorkers),
            Err(why) if self.config.execution == Execution::ReadThenDecode => {
                Mode::because(ReadPath::BlockingWorkers, why)
            }
            Err(why) => Mode::because(ReadPath::Dispatcher, why),
        };
        m.cached_in_page_cache = count(&path.left_in_page_cache);
        m.hits_from_page_cache = count(&path.page_cache_hits);
        m.hits_lost_by_page_cache = count(&path.page_cache_lost);
        m.cache_store = match self.config.cache_in_page_cache() {
            _ if self.config.cache.policy == CachePolicy::None => Mode::chosen(CacheStore::None),
            _ if self.pipeline.peers.is_some() => {
                Mode::because(CacheStore::Copies, "served to peers")
            }
            Ok(()) if path.leave_in_page_cache() => {
                Mode::chosen(CacheStore::PageCacheWhereResident)
            }
            Ok(()) => Mode::because(
                CacheStore::Copies,
                format!("the page cache let {} hits go", m.hits_lost_by_page_cache),
            ),
            Err(why) => Mode::because(CacheStore::Copies, why),
        };
        if let Some(peers) = &self.pipeline.peers {
            let c = &peers.counters;
            m.planned_remote_hits = count(&c.planned);
            m.remote_hits = count(&c.hits);
            m.remote_misses = count(&c.misses);
            m.remote_timeouts = count(&c.timeouts);
            m.peer_planned_accesses = peers.plan.planned();
            m.remote_hit_bytes = count(&c.hit_bytes);
        }
        m.peer_plan = self.peer_plan.clone();
        m.assign = self.assign.clone();
        if let Some(plan) = pipeline::lock(&shared.cluster_plan).clone() {
            m.peer_planned_accesses = plan.epochs.iter().map(|e| e.remote_hits).sum();
            m.cluster_plan = Some(plan);
        }
        m.read_retries = count(&self.pipeline.context.storage.counters.retries);
        (m.storage_reads_by_epoch, m.storage_bytes_by_epoch) =
            self.pipeline.context.storage.delivered.counts();
        m.reads_recovered = count(&self.pipeline.context.storage.counters.recovered);
        m.cache_forms = self.cache_forms.clone();
        if let Some(tier) = &self.pipeline.tier {
            let f = &shared.forms;
            m.form_costs = Some(tier.costs_from.report(tier.costs));
            m.decoded_hits_served = count(&f.decoded_hits);
            m.decode_saved_seconds = count(&f.decode_saved_ns) as f64 * 1e-9;
            m.images_kept = count(&f.images_kept);
            m.decoded_again = count(&f.decoded_again);
            if let Some(plan) = *pipeline::lock(&shared.form_plan) {
                [m.hits_encoded, m.hits_decoded] = plan.hits;
                [m.peak_cached_encoded_bytes, m.peak_cached_decoded_bytes] = plan.peak_bytes;
            }
        }
        m
    }
}

/// One local rank's batches, epoch after epoch, in plan order. `Send`: the rank's training
/// thread owns it.
pub struct RankHandle<T> {
    state: Arc<ForRanks<T>>,
    rank: usize,
    ends: pipeline::EpochEnds,
    done: bool,
}

impl<T> std::fmt::Debug for RankHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankHandle")
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

impl<T> RankHandle<T> {
    /// The local rank this handle serves.
    pub fn rank(&self) -> usize {
        self.rank
    }
}

impl<T> RankHandle<T> {
    /// The rank's batches as an async stream over the same engine: a task waiting for its
    /// batch holds no thread, so every rank of a node can run on one runtime thread.
    pub fn into_stream(self) -> RankStream<T> {
        RankStream {
            handle: self,
            waiting: None,
        }
    }

    /// Notes what the rank was given: after the last batch, or an error that ends the run,
    /// nothing more comes.
    fn given(&mut self, next: &Option<Result<Batch<T>, Error>>) {
        if matches!(
            next,
            None | Some(Err(Error::Stopped { .. } | Error::TooManyFailures { .. }))
        ) {
            self.done = true;
        }
    }
}

impl<T> Iterator for RankHandle<T> {
    type Item = Result<Batch<T>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = pipeline::next_batch(&self.state, self.rank, self.ends);
        self.given(&next);
        next
    }
}

/// One local rank's batches as a [`futures_core::Stream`] ([`RankHandle::into_stream`]): the
/// same batches, in the same order and with the same errors, as the rank handle's iterator.
/// A poll that finds the batch incomplete registers the task's waker, which the decode
/// worker completing the batch (or a stop) wakes. Dropping the stream detaches the rank as
/// dropping its handle does.
///
/// ```
/// use lobster_io::{CachePolicy, Dataset, LoaderBuilder};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # for i in 0..24u32 {
/// #     let class = dir.path().join(format!("class{}", i % 3));
/// #     std::fs::create_dir_all(&class)?;
/// #     std::fs::write(class.join(format!("{i:03}.jpg")), vec![i as u8; 64])?;
/// # }
/// let mut loader = LoaderBuilder::new(Dataset::open_image_folder(dir.path())?)
///     .world(1, 2, 0)
///     .batch_size(4)
///     .cache(CachePolicy::Reuse, 1 << 20)
///     .decode(|bytes: &[u8], _meta| Ok::<_, std::io::Error>(bytes.len()))
///     .build()?;
/// let streams: Vec<_> = loader.ranks().expect("first call").into_iter().map(|h| h.into_stream()).collect();
/// // One thread drives both ranks: each waits for its batch without blocking the other.
/// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
/// let counts = runtime.block_on(async {
///     let tasks: Vec<_> = streams
///         .into_iter()
///         .map(|mut s| {
///             tokio::spawn(async move {
///                 let mut samples = 0;
///                 while let Some(batch) = s.next_batch().await {
///                     samples += batch.expect("readable samples").samples.len();
///                 }
///                 samples
///             })
///         })
///         .collect();
///     let mut counts = Vec::new();
///     for t in tasks {
///         counts.push(t.await.expect("a rank task"));
///     }
///     counts
/// });
/// assert_eq!(counts, vec![12, 12]); // 24 samples, 2 ranks, one epoch
/// # Ok(())
/// # }
/// ```
pub struct RankStream<T> {
    handle: RankHandle<T>,
    /// When the rank began to wait for the batch it polls for: its stall.
    waiting: Option<std::time::Instant>,
}

impl<T> std::fmt::Debug for RankStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankStream")
            .field("rank", &self.handle.rank)
            .finish_non_exhaustive()
    }
}

impl<T> RankStream<T> {
    /// The local rank this stream serves.
    pub fn rank(&self) -> usize {
        self.handle.rank
    }

    /// The next batch, `None` after the last: the stream's next item without a stream
    /// combinator crate.
    pub async fn next_batch(&mut self) -> Option<Result<Batch<T>, Error>> {
        std::future::poll_fn(|cx| {
            futures_core::Stream::poll_next(std::pin::Pin::new(&mut *self), cx)
        })
        .await
    }
}

impl<T> futures_core::Stream for RankStream<T> {
    type Item = Result<Batch<T>, Error>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let handle = &mut this.handle;
        if handle.done {
            return std::task::Poll::Ready(None);
        }
        let next = std::task::ready!(pipeline::poll_next_batch(
            &handle.state,
            handle.rank,
            handle.ends,
            cx,
            &mut this.waiting,
        ));
        handle.given(&next);
        std::task::Poll::Ready(next)
    }
}

impl<T> Drop for RankHandle<T> {
    fn drop(&mut self) {
        pipeline::detach(&self.state, self.rank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CachePolicy;

    /// 64 samples, every other one 200 KiB (a 256 KiB block), the rest 1 KiB.
    fn dataset(dir: &std::path::Path) -> Arc<Dataset> {
        for class in ["a", "b"] {
            std::fs::create_dir_all(dir.join(class)).unwrap();
        }
        for i in 0..64u32 {
            let size = if i % 2 == 0 { 200 << 10 } else { 1 << 10 };
            let bytes: Vec<u8> = (0..size).map(|k| (k as u32 ^ i) as u8).collect();
            let class = if i % 3 == 0 { "a" } else { "b" };
            std::fs::write(dir.join(class).join(format!("{i:03}.jpg")), bytes).unwrap();
        }
        Arc::new(Dataset::open_image_folder(dir).unwrap())
    }

    /// `n` samples of exactly `size` bytes each.
    fn uniform_dataset(dir: &std::path::Path, n: u32, size: usize) -> Dataset {
        std::fs::create_dir_all(dir.join("a")).unwrap();
        for i in 0..n {
            std::fs::write(
                dir.join("a").join(format!("{i:03}.jpg")),
                vec![i as u8; size],
            )
            .unwrap();
        }
        Dataset::open_image_folder(dir).unwrap()
    }

    /// Two ranks of eight samples, `prefetch` iterations ahead, one-iteration windows,
    /// buffered reads: the shape of the draining test below.
    fn pool_config(prefetch: usize) -> LoaderConfig {
        let mut c = LoaderConfig::default();
        (c.job.ranks_per_node, c.job.batch_size) = (2, 8);
        (c.budgets.prefetch_iterations, c.budgets.window_iterations) = (prefetch, 1);
        c.reads.direct = false;
        c
    }

    /// Worked out by hand from what the pool must hold, not from `pool_shape`'s code. Every
    /// sample is 16 KiB, so a buffered read asks 16 KiB + 1 byte (the byte that shows a
    /// grown file): 4 pages and a byte, 5 pages, whose power-of-two block is 8 pages,
    /// 32 KiB. Every block is the largest block. Two ranks of eight, one iteration ahead:
    /// 16 accesses may hold a block at once, plus two spare largest blocks, 18 blocks of
    /// 32 KiB = 589,824 bytes, already whole largest blocks. (Forgetting the extra byte would
    /// give 16 KiB blocks, 294,912; not rounding to a power of two, 20 KiB blocks, 368,640.)
    #[test]
    fn the_pool_of_same_size_samples_holds_every_access_in_the_block_its_read_takes_and_two_spare()
    {
        let dir = tempfile::tempdir().unwrap();
        let ds = uniform_dataset(dir.path(), 8, 16 << 10);
        let (budget, largest_read) = pool_shape(&pool_config(1), &ds, 0);
        assert_eq!(
            largest_read, 16_385,
            "the sample and the byte that shows growth"
        );
        assert_eq!(budget, 589_824);
        // Two iterations ahead: 32 accesses + 2 spare = 34 blocks of 32 KiB.
        assert_eq!(pool_shape(&pool_config(2), &ds, 0).0, 1_114_112);
    }

    /// Whatever the prefetch depth, the budget is a whole number of largest blocks (so the
    /// largest read always finds a block once the pool is free), holds at least one, and grows
    /// as the planner may run further ahead: more accesses hold blocks at once. The largest
    /// block is worked out by hand: a 200 KiB sample reads 200 KiB + 1 byte, 51 pages, in a
    /// 64-page block, 256 KiB.
    #[test]
    fn the_pool_is_whole_largest_blocks_and_grows_with_the_prefetch_depth() {
        let dir = tempfile::tempdir().unwrap();
        let ds = dataset(dir.path());
        let largest_block: u64 = 256 << 10;
        let budgets: Vec<u64> = (1..=4)
            .map(|prefetch| pool_shape(&pool_config(prefetch), &ds, 0).0)
            .collect();
        for (prefetch, &budget) in (1..).zip(&budgets) {
            assert_eq!(budget % largest_block, 0, "prefetch {prefetch}: {budget}");
            assert!(budget >= largest_block, "prefetch {prefetch}: {budget}");
        }
        assert!(
            budgets.windows(2).all(|w| w[0] < w[1]),
            "the budget must grow with prefetch_iterations: {budgets:?}"
        );
    }

    /// The budget follows the mean block, not the largest: worked out by hand for this
    /// dataset, and below every access at the largest size. A loader whose window of large
    /// samples exceeds it still delivers every sample intact: reads wait for memory, the
    /// pipeline does not deadlock.
    #[test]
    fn the_pool_is_sized_by_mean_block_and_a_window_larger_than_it_still_drains() {
        let dir = tempfile::tempdir().unwrap();
        let ds = dataset(dir.path());
        let mut loader = LoaderBuilder::new(ds.clone())
            .world(1, 2, 0)
            .batch_size(8)
            .epochs(3)
            .cache(CachePolicy::None, 0)
            .io_depth(4)
            .decode_threads(2)
            .prefetch_iterations(1)
            .decode(|bytes: &[u8], meta: &SampleMeta| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                let id = meta.path.file_stem().unwrap().to_str().unwrap();
                let id: u32 = id.parse().unwrap();
                let ok = bytes
                    .iter()
                    .enumerate()
                    .all(|(k, &b)| b == (k as u32 ^ id) as u8);
                if ok {
                    Ok(bytes.len())
                } else {
                    Err(format!("sample {id}: bytes differ"))
                }
            })
            .build()
            .unwrap();
        // By hand from what the pool must hold: 32 samples of 200 KiB read 200 KiB + 1 byte,
        // 51 pages, in 64-page (256 KiB) blocks; 32 of 1 KiB read 1 KiB + 1 byte in one-page
        // (4 KiB) blocks. Mean block (32 * 256 + 32 * 4) / 64 = 130 KiB. Two ranks of eight,
        // one iteration ahead: 16 accesses * 130 KiB = 2,080 KiB, plus two spare 256 KiB
        // blocks = 2,592 KiB = 10.125 largest blocks, rounded up to 11: 2,816 KiB. (Sized by
        // the largest block instead, it would be 18 blocks, 4,608 KiB.)
        let budget = pool_shape(&loader.config, &ds, 0).0;
        assert_eq!(budget, 2_883_584);
        assert!(
            budget < 2 * 8 * (200 << 10),
            "a window of large samples must not fit, or the test proves nothing"
        );
        assert_eq!(drain(&mut loader), 3 * 64);
        // The same through the dispatcher alone: its reads wait for pool memory, none fails.
        let mut loader = LoaderBuilder::new(ds.clone())
            .config(loader.config().clone())
            .resident_reads(crate::config::ResidentReads::Dispatcher)
            .decode(|bytes: &[u8], _meta: &SampleMeta| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                Ok::<_, std::io::Error>(bytes.len())
            })
            .build()
            .unwrap();
        assert_eq!(pool_shape(&loader.config, &ds, 0).0, budget);
        assert_eq!(drain(&mut loader), 3 * 64);
    }

    /// Every rank's samples, each batch unwrapped.
    fn drain(loader: &mut Loader<usize>) -> usize {
        let handles = loader.ranks().unwrap();
        std::thread::scope(|s| {
            let threads: Vec<_> = handles
                .into_iter()
                .map(|h| s.spawn(move || h.map(|b| b.unwrap().samples.len()).sum::<usize>()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        })
    }
}
