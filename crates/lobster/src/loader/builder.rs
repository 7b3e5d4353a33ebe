//! The loader builder: every setting, checked, then the pipeline started.

use std::sync::Arc;

use super::handles::{Loader, RankHandle};
use super::sizing::{build_reader, memory_parts, pool_shape, window_bytes};
use crate::config::{CachePolicy, Execution, IoOrder, LoaderConfig, PeerPlanChoice, Schedule};
use crate::dataset::{Dataset, SampleMeta};
#[cfg(feature = "lab")]
use crate::emulate::StorageEmulation;
use crate::error::{Cause, Error};
#[cfg(feature = "lab")]
use crate::faults::FaultInjection;
use crate::faults::OnError;
use crate::memory::{MachineMemory, MemoryPart};
use crate::metrics::{CacheForms, Mode};
use crate::pipeline::{self, Context, DecodeFn, Layout, Pipeline};
use crate::resume::{self, JobFingerprint, LoaderState};
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

    /// A local disk cache of `capacity_bytes` in `dir`, below the memory cache and planned
    /// with it (see [`DiskCache`](crate::DiskCache)): the `reuse` and `static` policies,
    /// one node (no peers), encoded bytes. A later run of the same dataset starts with what
    /// this one left in `dir`.
    pub fn disk_cache(mut self, dir: impl Into<std::path::PathBuf>, capacity_bytes: u64) -> Self {
        self.config.cache.disk = Some(crate::DiskCache {
            dir: dir.into(),
            capacity_bytes,
        });
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
        /// Charge every storage read an emulated shared tier's latency and bandwidth
        /// (feature `lab`).
        #[cfg(feature = "lab")]
        storage_emulation => reads.storage_emulation: Option<StorageEmulation>,
        /// Inject deterministic faults into every storage read (feature `lab`); `None` for
        /// none.
        #[cfg(feature = "lab")]
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
            decode: Arc::new(move |bytes: &[u8], meta: &SampleMeta, side: Option<u32>| {
                let image = decode(bytes, meta).map_err(|e| Cause::from(e.into()))?;
                match side {
                    Some(side) => lobster_image::downscale((&image).into(), side).map_err(|e| {
                        Cause::from(Box::<dyn std::error::Error + Send + Sync>::from(format!(
                            "image {:?} brought down to {side} px: {e}",
                            meta.key()
                        )))
                    }),
                    None => Ok(image),
                }
            }),
            finish: Arc::new(
                move |image: lobster_image::ImageRef<'_>, meta: &SampleMeta, epoch: u32| {
                    finish(image, meta, epoch).map_err(|e| Cause::from(e.into()))
                },
            ),
            whole: None,
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
        let config = for_source(self.config.resolved(), &dataset)?;
        let seed = match self.order {
            EpochOrder::Shuffle { seed } => seed,
            EpochOrder::Sequential | EpochOrder::Explicit(_) => 0,
        };
        let staged = self.staged.map(|make| make(seed, &config));
        let (decode, staged) = bounded_decode(&config, self.decode, staged, self.measure)?;
        let fingerprint = JobFingerprint::of(&dataset, &self.order, &config);
        let layout = node_layout(
            &config,
            &dataset,
            self.order,
            self.resume.as_ref(),
            &fingerprint,
        )?;
        let sizes = match config.cache.policy.kind() {
            Some(_) => Some(cache_sizes(&dataset)?),
            None => None,
        };
        config.disk_refused(self.peers.is_some())?;
        let disk = match (&config.cache.disk, &sizes) {
            (Some(disk), Some(sizes)) => Some(open_disk(disk, &dataset, sizes)?),
            _ => None,
        };
        let (peers, peer_plan) = match self.peers {
            Some(transport) => {
                let (p, mode) = peers(&config, sizes.as_ref(), &layout, transport)?;
                (Some(p), mode)
            }
            None => (None, Mode::because(PeerPlanKind::Node, "no peers")),
        };
        let assign = assignment(config.job.assign, &peer_plan);
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
        let dirs = (config.execution.dispatches()
            && matches!(dataset.source(), crate::dataset::Source::Files))
        .then(|| crate::pipeline::SampleDirs::new(dataset.samples()));
        let (forms, cache_forms) = decoded_tier(&config, &dataset, staged, peers.is_some())?;
        let ctx = Context {
            layout,
            config: config.clone(),
            dirs,
            dataset,
            decode,
            storage: pipeline::ReadFates::new(
                config.reads.emulation(),
                config.reads.faults().cloned(),
                config.job.epochs,
            ),
            reader: reader.clone(),
            arena: cache_arena(&config),
            sizes,
        };
        let pipeline = Pipeline::start(ctx, peers, (forms, disk), reader)?;
        let handles = (0..config.job.ranks_per_node)
            .map(|rank| RankHandle::new(pipeline.for_ranks.clone(), rank, pipeline.layout.ends()))
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

/// The decode the workers run, and the two stages a decoded tier runs, both bounded by
/// `decoded_sample_bytes_max` where it is set.
fn bounded_decode<T: Send + 'static>(
    config: &LoaderConfig,
    decode: Option<DecodeFn<T>>,
    staged: Option<pipeline::Staged<T>>,
    measure: Option<fn(&T) -> u64>,
) -> Result<(DecodeFn<T>, Option<pipeline::Staged<T>>), Error> {
    let bound = match (config.limits.decoded_sample_bytes_max, measure) {
        (Some(bytes_max), Some(measure)) => Some((bytes_max, measure)),
        (Some(bytes_max), None) => {
            return Err(Error::invalid(
                "decoded_sample_bytes_max",
                bytes_max,
                "only through LoaderBuilder::decoded_sample_bytes_max, for samples of bytes",
            ))
        }
        (None, _) => None,
    };
    // Both the whole decode and a decoded hit's second stage end in `T`: both are bounded.
    let staged = staged.map(|s| match bound {
        Some(bound) => {
            let finish = s.finish;
            let whole = s.whole.map(|whole| -> DecodeFn<T> {
                Arc::new(move |bytes: &[u8], meta: &SampleMeta, epoch| {
                    within(bound, whole(bytes, meta, epoch)?)
                })
            });
            pipeline::Staged {
                finish: Arc::new(
                    move |image: lobster_image::ImageRef<'_>, meta: &SampleMeta, epoch| {
                        within(bound, finish(image, meta, epoch)?)
                    },
                ),
                decode: s.decode,
                whole,
            }
        }
        None => s,
    });
    let decode: DecodeFn<T> = match (decode, &staged) {
        (Some(decode), _) => match bound {
            Some(bound) => Arc::new(move |bytes: &[u8], meta: &SampleMeta, epoch: u32| {
                within(bound, decode(bytes, meta, epoch)?)
            }),
            None => decode,
        },
        (None, Some(stages)) => match &stages.whole {
            Some(whole) => Arc::clone(whole),
            None => {
                let stages = stages.clone();
                Arc::new(move |bytes: &[u8], meta: &SampleMeta, epoch: u32| {
                    let image = (stages.decode)(bytes, meta, None)?;
                    (stages.finish)((&image).into(), meta, epoch)
                })
            }
        },
        (None, None) => return Err(Error::invalid("decode", "none", "a decode function")),
    };
    Ok((decode, staged))
}

/// This node's share of the run: the sampler's order split among the world's ranks, started
/// where a saved state left off.
fn node_layout(
    config: &LoaderConfig,
    dataset: &Dataset,
    order: EpochOrder,
    resume: Option<&LoaderState>,
    fingerprint: &JobFingerprint,
) -> Result<Layout, Error> {
    let sampler =
        DistributedSampler::new(dataset.len(), config.world(), config.job.drop_last, order)?;
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
    let Some(state) = resume else {
        return Ok(layout);
    };
    let at = state.position(fingerprint)?;
    let (epoch, head) = resume::start(&at, &layout.sampler, config.job.batch_size)?;
    // A state at the run's very end resumes to nothing; past it, the run asked for fewer
    // epochs than the state has done.
    let needed = epoch + u32::from(head.is_some());
    if needed > config.job.epochs {
        return Err(Error::invalid(
            "epochs",
            config.job.epochs,
            format!("at least {needed}: the state resumes at epoch {epoch}"),
        ));
    }
    Ok(layout.resumed(epoch, head))
}

/// The assignment the run gets: locality-aware only under the cluster plan.
fn assignment(chosen: Assign, peer_plan: &Mode<PeerPlanKind>) -> Mode<Assign> {
    match (chosen, peer_plan) {
        (Assign::Locality, Mode { mode, reason }) if *mode != PeerPlanKind::Cluster => {
            let why = reason.as_deref().unwrap_or("each node's own plan");
            Mode::because(
                Assign::Sampler,
                format!("locality-aware assignment needs the cluster plan: {why}"),
            )
        }
        (chosen, _) => Mode::chosen(chosen),
    }
}

/// Opens the disk cache's files for `dataset` and budgets the plan's disk bytes.
fn open_disk(
    disk: &crate::DiskCache,
    dataset: &Dataset,
    sizes: &Arc<[u32]>,
) -> Result<pipeline::DiskLevel, Error> {
    let tier = lobster_tier::DiskTier::open(
        &disk.dir,
        dataset_fingerprint(dataset),
        sizes.clone(),
        disk.capacity_bytes,
    )
    .map_err(|e| {
        Error::invalid(
            "disk_cache",
            disk.dir.display(),
            format!("a directory this loader can make, lock and write in: {e}"),
        )
    })?;
    let plan_bytes = disk_plan_bytes(sizes, tier.capacity_bytes());
    Ok(pipeline::DiskLevel::new(tier, sizes, plan_bytes))
}

/// The dataset's identity for the disk cache: its root and every sample's path, offset and
/// size (not the order or the seed, so that a run with another seed reuses the entries). A
/// file rewritten in place at the same size is not told apart; the entries' CRCs only
/// catch damage on the disk.
fn dataset_fingerprint(dataset: &Dataset) -> u64 {
    const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;
    let fnv = |h: u64, bytes: &[u8]| {
        bytes.iter().fold(h, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let h = fnv(FNV_START, dataset.root().as_os_str().as_encoded_bytes());
    dataset.samples().iter().fold(h, |h, s| {
        let h = fnv(h, s.path.as_os_str().as_encoded_bytes());
        let h = fnv(h, &s.offset.to_le_bytes());
        fnv(h, &s.size_bytes.to_le_bytes())
    })
}

/// The disk bytes the plan budgets, in sample bytes, for a tier of `capacity_bytes`: the
/// tier holds whole 4 KiB blocks, so the capacity is scaled by the table's sample bytes
/// over its block bytes, less one mean extent per segment file (an extent does not span two,
/// so each file's tail is lost: under one extent, exactly so where all samples have one
/// size). With sizes that vary, the tier's first fit may still find no hole for a write (or
/// the samples kept may round worse than the mean): that write is counted as full, and its
/// entry's planned hits read storage. A larger margin costs more than those misses (on the
/// CLI's default set, one largest extent per file read more from storage per epoch).
fn disk_plan_bytes(sizes: &[u32], capacity_bytes: u64) -> u64 {
    let sample_bytes: u128 = sizes.iter().map(|&z| u128::from(z)).sum();
    let extent_bytes: u128 = sizes
        .iter()
        .map(|&z| u128::from(lobster_tier::extent_bytes(z)))
        .sum();
    if extent_bytes == 0 {
        return 0;
    }
    let mean_extent_bytes = extent_bytes.div_ceil(sizes.len() as u128);
    let budget = u128::from(capacity_bytes) * sample_bytes / extent_bytes;
    let budget = budget.saturating_sub(u128::from(lobster_tier::SEGMENTS_MAX) * mean_extent_bytes);
    u64::try_from(budget).unwrap_or(u64::MAX)
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
        Some(_) if config.cache.disk.is_some() => Err("the disk cache keeps encoded bytes"),
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
    let max_side = config.cache.decoded_max_side;
    let (costs, costs_from) = match config.cache.form_costs {
        Some(costs) => (costs, pipeline::CostsFrom::CONFIG),
        None => pipeline::form_costs(
            &probes,
            dataset.samples(),
            config.reads.emulation(),
            max_side,
        ),
    };
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

/// `config` for `dataset`'s source: an object store's samples are read through the
/// dispatcher (no page cache holds them), and never with O_DIRECT.
fn for_source(mut config: LoaderConfig, dataset: &Dataset) -> Result<LoaderConfig, Error> {
    if matches!(dataset.source(), crate::dataset::Source::Files) {
        return Ok(config);
    }
    if config.reads.direct {
        return Err(Error::invalid(
            "direct",
            true,
            "false for a dataset in an object store (its reads are HTTP requests)",
        ));
    }
    config.reads.resident_reads = crate::config::ResidentReads::Dispatcher;
    Ok(config)
}
