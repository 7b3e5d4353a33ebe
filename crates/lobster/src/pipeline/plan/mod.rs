//! The planner thread: walks the node stream in canonical order a window at a time, makes
//! every cache decision (so hits and misses are a pure function of the inputs), opens the
//! window's batches in the reorder buffers, runs the allocator, and hands the window's accesses
//! to the decode queues and its reads to the dispatcher.

pub(super) mod allocate;
pub(super) mod cluster;
pub(super) mod handles;
pub(super) mod read_ahead;
pub(super) mod remote;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use lobster_cache::{
    Form, FormPlanner, FormPolicy, FormStats, Planner, Store, Tier, TierEvicted, TierPlanner,
};
use lobster_sched::{AllocConfig, Allocator, Budgets};

use crate::config::{IoOrder, LoaderConfig, Schedule};
use crate::error::Error;
use crate::metrics::IterationMetrics;
use crate::pipeline::access::{Access, AccessLanding, Cached, Read, Ready};
use crate::pipeline::context::Context;
use crate::pipeline::deliver::reorder::PendingBatch;
use crate::pipeline::disk::DiskOp;
use crate::pipeline::io::order::{set_read_fractions, ToDispatcher};
use crate::pipeline::layout::Layout;
use crate::pipeline::peers::ServedLandings;
use crate::pipeline::read_path::ResidentGate;
use crate::pipeline::sync::lock;
use crate::pipeline::threads::schedule_this_thread;
use allocate::{allocate, AccessLoad};
pub(crate) use handles::ForPlanner;
pub(crate) use read_ahead::budget_bytes as read_ahead_budget_bytes;
use read_ahead::ReadAhead;

/// The policy deciding the cache: one form (encoded bytes), two (with a decoded tier),
/// this node's share of the nodes' caches planned as one, or memory over a local disk.
enum Decider {
    Encoded(Box<Planner<Layout>>),
    Forms(Box<FormPlanner<Layout>>),
    Cluster(Box<cluster::NodeShare>),
    Tiers(Box<TierPlanner<Layout>>, TierEvicted),
}

/// A disk operation as the planner decides it; a disk hit's access joins it once routed.
enum PlannedDiskOp {
    /// The next disk hit of the window reads its entry.
    Read,
    Remove(u32),
    Write(u32, Arc<AccessLanding>),
}

/// One access's cache decision: what it finds and keeps, and the peer planned to serve it.
struct Decided {
    sample: u32,
    /// Under locality-aware assignment: the access's iteration and its slot among this node's
    /// accesses of that step (local rank `slot / batch_len`, position `slot % batch_len`).
    placed: Option<(usize, usize)>,
    cached: Cached,
    landing: Arc<AccessLanding>,
    /// Under the cluster plan, the peer whose cache serves this miss.
    peer: Option<usize>,
    /// The sample is read from the disk cache.
    from_disk: bool,
}

/// A planner's decision for the next access, whichever planner made it.
#[derive(Clone, Copy)]
struct NextDecision {
    sample: u32,
    position: u64,
    /// The form the access finds its sample in, if a hit.
    hit_form: Option<Form>,
    /// The form the access stores the sample in (none for a hit that stays as it was).
    kept: Option<Form>,
    kept_bytes: u64,
    peer: Option<usize>,
    placed: Option<(usize, usize)>,
    /// Found on the disk cache.
    from_disk: bool,
    /// Kept on the disk cache after a storage read: written there.
    write_disk: bool,
}

/// The cache decisions and what the cache holds: the landing of every sample the policy keeps.
struct Cache {
    decider: Decider,
    landings: Store<Arc<AccessLanding>>,
    evicted: Vec<u32>,
    /// Under the cluster plan: this node's evictions, with the step of the access that
    /// evicted each.
    leaving: Vec<(u32, u64)>,
    /// The same landings as peers see them, where there are peers.
    served: Option<Arc<ServedLandings>>,
    /// With a disk cache: its operations decided and not yet sent, in plan order.
    disk_ops: Vec<PlannedDiskOp>,
}

impl Cache {
    fn new<T>(ctx: &Context<T>, state: &ForPlanner<T>) -> Result<Option<Self>, Error> {
        let config = &ctx.config;
        let (Some(kind), Some(sizes)) = (config.cache.policy.kind(), &ctx.sizes) else {
            return Ok(None);
        };
        let engine = |e| Error::engine("cache planner", e);
        let cluster = state.peers.as_ref().is_some_and(|p| p.cluster);
        let mut disk_ops = Vec::new();
        let decider = match (&state.disk, &state.tier) {
            (Some(disk), _) => {
                let planner = TierPlanner::new(
                    ctx.layout.clone(),
                    sizes.clone(),
                    config.cache.capacity_bytes,
                    disk.plan_capacity_bytes,
                    kind,
                    &disk.seeds,
                )
                .map_err(engine)?;
                // Entries the plan does not keep go before the first access.
                disk_ops.extend(
                    planner
                        .dropped_seeds()
                        .iter()
                        .map(|&s| PlannedDiskOp::Remove(s)),
                );
                Decider::Tiers(Box::new(planner), TierEvicted::default())
            }
            _ if cluster => Decider::Cluster(Box::new(cluster::NodeShare::new(
                &ctx.layout,
                (config.job.nodes, config.job.node),
                sizes.clone(),
                config.cache.capacity_bytes,
                (
                    state.peers.as_ref().is_some_and(|p| p.locality),
                    config.cache.link_prices,
                ),
            )?)),
            (None, Some(tier)) => {
                let policy = FormPolicy::new(
                    sizes.clone(),
                    tier.decoded_sizes.clone(),
                    config.cache.capacity_bytes,
                    tier.choice,
                    tier.costs,
                )
                .map_err(engine)?;
                Decider::Forms(Box::new(FormPlanner::new(ctx.layout.clone(), policy)))
            }
            (None, None) => Decider::Encoded(Box::new(
                Planner::new(
                    ctx.layout.clone(),
                    sizes.clone(),
                    config.cache.capacity_bytes,
                    kind,
                )
                .map_err(engine)?,
            )),
        };
        Ok(Some(Cache {
            decider,
            landings: Store::new(config.cache.capacity_bytes),
            evicted: Vec::new(),
            leaving: Vec::new(),
            served: state.peers.as_ref().map(|p| p.served.clone()),
            disk_ops,
        }))
    }

    /// Decides the next access of the stream, which must be `expected` unless the plan
    /// assigns the accesses: what the cache does, and the landing the access's bytes appear
    /// in.
    fn decide(&mut self, expected: Option<u32>) -> Result<Decided, Error> {
        let next = self.next_decision()?;
        if let Some(want) = expected {
            assert_eq!(
                next.sample, want,
                "the planner and the node stream disagree at {}",
                next.position
            );
        }
        let landing = self.store(&next)?;
        // Last of the decision's disk operations: the bytes it reads go to the disk.
        if next.write_disk {
            self.disk_ops
                .push(PlannedDiskOp::Write(next.sample, landing.clone()));
        }
        Ok(Decided {
            sample: next.sample,
            placed: next.placed,
            cached: Cached {
                found: next.hit_form,
                kept: next.kept,
                to_disk: next.write_disk,
            },
            landing,
            peer: next.peer,
            from_disk: next.from_disk,
        })
    }

    /// The cache's next decision, from whichever planner runs; `evicted` (and `leaving`,
    /// under the cluster plan) hold what it evicts.
    fn next_decision(&mut self) -> Result<NextDecision, Error> {
        let engine = |e| Error::engine("cache planner", e);
        let stopped = || Error::Stopped {
            reason: "cache planner ended early".into(),
        };
        let form = |b: bool| b.then_some(Form::Encoded);
        Ok(match &mut self.decider {
            Decider::Cluster(share) => {
                let d = share.next_own(&mut self.leaving)?;
                let me = share.node();
                // Only a storage read is kept (by the node that made it); a hit stays put.
                let admitted = d.served == lobster_cache::Served::Storage && d.kept_at == Some(me);
                self.evicted.extend(self.leaving.iter().map(|l| l.0));
                NextDecision {
                    hit_form: form(d.served == lobster_cache::Served::Local),
                    kept: form(admitted),
                    kept_bytes: u64::from(d.size_bytes),
                    position: d.position,
                    sample: d.sample,
                    peer: match d.served {
                        lobster_cache::Served::Remote(h) => Some(usize::from(h)),
                        _ => None,
                    },
                    placed: share
                        .assigns()
                        .then(|| (share.iteration_of(&d), d.slot as usize)),
                    from_disk: false,
                    write_disk: false,
                }
            }
            Decider::Encoded(planner) => {
                let d = planner
                    .next(&mut self.evicted)
                    .map_err(engine)?
                    .ok_or_else(stopped)?;
                // One form: a hit that stays keeps its place in the store (one that goes is
                // among the evicted), so only an admission is stored.
                NextDecision {
                    hit_form: form(d.hit),
                    kept: form(d.admitted),
                    kept_bytes: u64::from(d.size_bytes),
                    position: d.position,
                    sample: d.sample,
                    peer: None,
                    placed: None,
                    from_disk: false,
                    write_disk: false,
                }
            }
            Decider::Forms(planner) => {
                let d = planner
                    .next(&mut self.evicted)
                    .map_err(engine)?
                    .ok_or_else(stopped)?;
                let o = d.outcome;
                NextDecision {
                    hit_form: o.hit,
                    kept: o.kept,
                    kept_bytes: o.kept.map_or(0, |f| planner.policy().size(d.sample, f)),
                    position: d.position,
                    sample: d.sample,
                    peer: None,
                    placed: None,
                    from_disk: false,
                    write_disk: false,
                }
            }
            Decider::Tiers(planner, evicted) => {
                let d = planner.next(evicted).map_err(engine)?.ok_or_else(stopped)?;
                // In the order the plan's contract gives: read the hit, drop disk entries,
                // write demotions from their memory copies (then memory drops them).
                if d.found == Some(Tier::Disk) {
                    self.disk_ops.push(PlannedDiskOp::Read);
                }
                self.disk_ops
                    .extend(evicted.disk.iter().map(|&s| PlannedDiskOp::Remove(s)));
                for &s in &evicted.demoted {
                    let landing = self.landings.get(s).cloned().expect("a demotion is cached");
                    self.disk_ops.push(PlannedDiskOp::Write(s, landing));
                }
                self.evicted.extend_from_slice(&evicted.memory);
                let memory = |t: Option<Tier>| form(t == Some(Tier::Memory));
                NextDecision {
                    hit_form: memory(d.found),
                    kept: memory(d.kept),
                    kept_bytes: u64::from(d.size_bytes),
                    position: d.position,
                    sample: d.sample,
                    peer: None,
                    placed: None,
                    from_disk: d.found == Some(Tier::Disk),
                    write_disk: d.write_disk,
                }
            }
        })
    }

    /// Applies `next` to the store of landings (and to what peers are served): evictions
    /// leave, an admission (or a hit kept in another form) comes in. Returns the access's
    /// landing.
    fn store(&mut self, next: &NextDecision) -> Result<Arc<AccessLanding>, Error> {
        let NextDecision {
            hit_form,
            kept,
            kept_bytes,
            sample,
            ..
        } = *next;
        let landing = if hit_form.is_some() {
            self.landings.get(sample).cloned().expect("a hit is cached")
        } else {
            AccessLanding::new()
        };
        if let Some(served) = &self.served {
            if self.leaving.is_empty() {
                served.remove_all(&self.evicted);
            } else {
                // Peers may still fetch what the cluster plan evicts: it leaves later.
                for &(s, step) in &self.leaving {
                    served.leave(&[s], step);
                }
            }
        }
        self.leaving.clear();
        // A hit kept in another form is stored again at its new size.
        let changed = hit_form.is_some() && kept.is_some() && kept != hit_form;
        if changed {
            self.landings.remove(sample);
        }
        for e in self.evicted.drain(..) {
            self.landings.remove(e);
        }
        if kept.is_some() && (hit_form.is_none() || changed) {
            self.landings
                .insert(sample, kept_bytes, landing.clone())
                .map_err(|e| Error::engine("cache store", e))?;
            if let Some(served) = &self.served {
                served.insert(sample, landing.clone());
            }
        }
        Ok(landing)
    }

    /// The two-form decisions' totals (with a decoded tier).
    fn form_stats(&self) -> Option<FormStats> {
        match &self.decider {
            Decider::Forms(planner) => Some(planner.stats()),
            Decider::Encoded(_) | Decider::Cluster(_) | Decider::Tiers(..) => None,
        }
    }

    /// The two-level plan's totals, and the seeds it dropped (with a disk cache).
    fn tier_stats(&self) -> Option<(lobster_cache::TierStats, u64)> {
        match &self.decider {
            Decider::Tiers(planner, _) => {
                Some((planner.stats(), planner.dropped_seeds().len() as u64))
            }
            _ => None,
        }
    }

    /// The window's disk operations, each disk hit's read with its access (`reads`, the
    /// window's disk hits in stream order).
    fn take_disk_ops(&mut self, reads: Vec<Access>) -> Vec<DiskOp> {
        let mut reads = reads.into_iter();
        let ops = self
            .disk_ops
            .drain(..)
            .map(|op| match op {
                PlannedDiskOp::Read => DiskOp::Read(reads.next().expect("one access per read")),
                PlannedDiskOp::Remove(sample) => DiskOp::Remove(sample),
                PlannedDiskOp::Write(sample, landing) => DiskOp::Write { sample, landing },
            })
            .collect();
        assert!(reads.next().is_none(), "every disk hit has its read");
        ops
    }

    /// Whether the plan assigns this node's accesses (locality) instead of the sampler.
    fn assigns(&self) -> bool {
        self.cluster().is_some_and(cluster::NodeShare::assigns)
    }

    /// This node's share of the cluster plan, if it plans with one.
    fn cluster(&self) -> Option<&cluster::NodeShare> {
        match &self.decider {
            Decider::Cluster(share) => Some(share),
            _ => None,
        }
    }
}

/// The planner thread's body.
pub(crate) fn planner<T: Send + 'static>(
    ctx: &Arc<Context<T>>,
    state: &Arc<ForPlanner<T>>,
    to_disk: Option<Sender<Vec<DiskOp>>>,
) -> Result<(), Error> {
    schedule_this_thread(ctx.config.budgets.pipeline_threads, &state.batch_refused);
    let layout = &ctx.layout;
    let config = &ctx.config;
    let to_dispatcher = state.to_dispatcher.as_ref();
    let mut gate = ResidentGate::new(config.resident_reads_enabled().is_ok());
    let mut cache = Cache::new(ctx, state)?;
    let mut allocator = allocator(config)?;
    let iterations = layout.iterations();
    let prefetch = config
        .budgets
        .prefetch_iterations
        .max(config.budgets.window_iterations);
    // Under the cluster plan, storage reads may go up to an epoch ahead (see read_ahead).
    let mut read_ahead = match (&state.peers, to_dispatcher, cache.as_ref()) {
        (Some(p), Some(_), Some(c)) if c.cluster().is_some() && p.read_ahead_bytes > 0 => {
            Some(ReadAhead::new(p.read_ahead_bytes, iterations, prefetch))
        }
        _ => None,
    };
    let mut window: Vec<Access> = Vec::new();
    let mut global_iteration = 0usize;
    let mut seq = 0u64;
    for epoch in layout.start_epoch..layout.epochs {
        // The node stream of this epoch, grouped by window; under locality-aware assignment
        // the plan makes it as it goes.
        let assigned = cache.as_ref().is_some_and(Cache::assigns);
        let accesses = if assigned {
            Vec::new()
        } else {
            layout.epoch_accesses(epoch)
        };
        let mut next = 0;
        let std::ops::Range {
            start: mut first,
            end: epoch_end,
        } = layout.iteration_range(epoch);
        while first < epoch_end {
            let last = (first + config.budgets.window_iterations).min(epoch_end);
            // A window wider than the prefetch distance is planned whole, or its first batch
            // would wait for batches not yet planned.
            let end = global_iteration + (last - first);
            state.progress.wait_for_room(
                &state.stop,
                end,
                read_ahead.as_ref().map_or(prefetch, ReadAhead::lead_max),
            )?;
            if let Some(served) = cache.as_ref().and_then(|c| c.served.as_ref()) {
                served.expire(state.progress.slowest() as u64);
            }
            window.clear();
            let storage_bytes = decide_window(
                ctx,
                cache.as_mut(),
                (epoch, first, last),
                (!assigned).then_some(accesses.as_slice()),
                (&mut next, &mut seq),
                &mut window,
            )?;
            let ahead = match read_ahead.as_mut() {
                Some(r) => r.admit(ctx, state, end, storage_bytes)?,
                None => false,
            };
            let issued = Instant::now();
            lock(&state.collector).epoch_issued(epoch, issued);
            if let Some(alloc) = allocator.as_mut() {
                reallocate(ctx, state, alloc, &window, (epoch, first), seq)?;
            }
            open_batches(ctx, state, &window, (epoch, first, last), issued);
            let on_workers = gate.next_window(&state.read_path);
            // Counted before any of them can be delivered (a hit may be released at once).
            state.outstanding.planned(window.len());
            let Routed {
                ready,
                reads,
                remote,
                disk,
            } = route(ctx, state, &mut window, on_workers);
            if let (Some(c), Some(tx)) = (cache.as_mut(), to_disk.as_ref()) {
                let ops = c.take_disk_ops(disk);
                if !ops.is_empty() && tx.send(ops).is_err() {
                    return Err(Error::Stopped {
                        reason: "the disk cache's thread ended".into(),
                    });
                }
            }
            hand_out(ctx, state, ready, reads)?;
            // After the window's hits wait on their landings: an answer may come at once.
            for (access, peer) in remote {
                match read_ahead.as_mut() {
                    Some(r) if ahead => r.defer(end, access, peer),
                    _ => remote::start(ctx, state, access, peer),
                }
            }
            global_iteration += last - first;
            first = last;
        }
    }
    if let Some(r) = read_ahead.as_mut() {
        r.finish(ctx, state)?;
    }
    planned_all(state, cache.as_ref());
    Ok(())
}

/// The allocator of io_depth and decode threads, where the schedule and the execution
/// reallocate them.
fn allocator(config: &LoaderConfig) -> Result<Option<Allocator>, Error> {
    match config.budgets.schedule {
        Schedule::Allocate { hysteresis } if config.execution.reallocates() => {
            let mut alloc = AllocConfig::new(Budgets {
                io_depth_total: config.budgets.io_depth as u32,
                decode_threads_total: config.budgets.decode_threads as u32,
            });
            alloc.hysteresis_fraction = hysteresis;
            Allocator::new(alloc)
                .map(Some)
                .map_err(|e| Error::engine("allocator", e))
        }
        _ => Ok(None),
    }
}

/// The run is planned: what the plan decided goes to the metrics, and the ranks (and the
/// peers served) learn that nothing more comes.
fn planned_all<T>(state: &ForPlanner<T>, cache: Option<&Cache>) {
    if let Some(stats) = cache.and_then(Cache::form_stats) {
        *lock(&state.form_plan) = Some(stats);
    }
    if let Some(share) = cache.and_then(Cache::cluster) {
        *lock(&state.cluster_plan) = Some(share.metrics());
    }
    if let (Some(stats), Some(disk)) = (cache.and_then(Cache::tier_stats), &state.disk) {
        *lock(&disk.planned) = Some(stats);
    }
    if let Some(served) = cache.and_then(|c| c.served.as_ref()) {
        served.planned_all();
    }
    for r in state.ranks.iter() {
        r.planned_all();
    }
}

/// Decides the window's accesses, in stream order: the sampler's (`expected`, walked from
/// `next`) or, under locality-aware assignment, the plan's; returns the bytes the window
/// reads from storage.
fn decide_window<T>(
    ctx: &Context<T>,
    mut cache: Option<&mut Cache>,
    (epoch, first, last): (u32, usize, usize),
    expected: Option<&[(usize, usize, usize, u32)]>,
    (next, seq): (&mut usize, &mut u64),
    window: &mut Vec<Access>,
) -> Result<u64, Error> {
    let layout = &ctx.layout;
    let mut storage_bytes = 0;
    // Both streams hold every rank's batches of the window, the sampler's or the plan's.
    let in_window: usize = (first..last)
        .map(|it| layout.ranks * layout.batch_len(epoch, it))
        .sum();
    for _ in 0..in_window {
        let walked = expected.map(|e| e[*next]);
        *next += 1;
        *seq += 1;
        let Decided {
            sample,
            placed,
            cached,
            landing,
            peer,
            from_disk,
        } = match cache.as_deref_mut() {
            None => Decided {
                sample: walked.expect("without a plan, the sampler's stream").3,
                placed: None,
                cached: Cached::default(),
                landing: AccessLanding::new(),
                peer: None,
                from_disk: false,
            },
            Some(c) => c.decide(walked.map(|a| a.3))?,
        };
        let (iteration, rank, pos) = match (walked, placed) {
            (Some((it, rank, pos, _)), _) => {
                debug_assert!((first..last).contains(&it), "walked in its window");
                (it, rank, pos)
            }
            (None, Some((it, slot))) => {
                debug_assert!((first..last).contains(&it), "planned in its window");
                let len = layout.batch_len(epoch, it);
                (it, slot / len, slot % len)
            }
            (None, None) => unreachable!("an assigning plan places every access"),
        };

        // A miss is read from storage unless the routing finds it a cheaper way.
        let read = match peer {
            _ if cached.hit() => Read::Cached,
            _ if from_disk => Read::Disk,
            // The cluster plan's remote hit: storage only if the peer fails.
            Some(p) => Read::Peer(p),
            None => ctx.storage_read(epoch, iteration, sample),
        };
        if let Read::Storage(r) = &read {
            storage_bytes += r.bytes;
        }
        window.push(Access {
            seq: *seq,
            epoch,
            iteration: iteration as u32,
            rank,
            pos,
            sample,
            cached,
            read,
            landing: Some(landing),
        });
    }
    Ok(storage_bytes)
}

/// Runs the allocator on the window and applies what it gives: io_depth to the dispatcher
/// (under `IoOrder::Shares`), decode threads to the queues.
fn reallocate<T>(
    ctx: &Context<T>,
    state: &ForPlanner<T>,
    alloc: &mut Allocator,
    window: &[Access],
    (epoch, first): (u32, usize),
    seq: u64,
) -> Result<(), Error> {
    let config = &ctx.config;
    let loads = window.iter().map(|a| AccessLoad {
        rank: a.rank,
        bytes: ctx.meta(a.sample).size_bytes,
        hit: a.cached.hit(),
    });
    let record = {
        let model = lock(&state.model);
        allocate(
            alloc,
            &model,
            ctx.layout.ranks,
            config.budgets.decode_threads as u32,
            loads,
            (epoch, first),
        )?
    };
    if let (Some(tx), IoOrder::Shares) = (&state.to_dispatcher, config.reads.io_order) {
        let _ = tx.send(ToDispatcher::Depths {
            from_seq: window.first().map_or(seq + 1, |a| a.seq),
            io_depth: record.io_depth.clone(),
        });
    }
    state.decode.set_assignment(&record.decode_threads);
    lock(&state.collector).allocation(record);
    Ok(())
}

/// A window's accesses by who takes them next.
struct Routed {
    /// Bytes at hand (a hit released at once) or read by the worker itself: the decode
    /// queues.
    ready: Vec<Ready>,
    /// The dispatcher's storage reads.
    reads: Vec<Access>,
    /// Planned remote hits, with the peer that serves each.
    remote: Vec<(Access, usize)>,
    /// Disk hits, in stream order: the disk thread's reads.
    disk: Vec<Access>,
}

/// Says who reads each of the window's misses (the dispatcher, a peer, the worker itself)
/// and sets its hits waiting on their landings.
fn route<T>(
    ctx: &Context<T>,
    state: &ForPlanner<T>,
    window: &mut Vec<Access>,
    on_workers: bool,
) -> Routed {
    let pipelined = state.to_dispatcher.is_some();
    let mut routed = Routed {
        ready: Vec::new(),
        reads: Vec::new(),
        remote: Vec::new(),
        disk: Vec::new(),
    };
    // Priced once a window: the model moves slowly, and its lock is shared.
    let costs = state.peers.as_ref().map(|_| *lock(&state.model).params());
    for mut a in window.drain(..) {
        if !a.cached.hit() && a.read != Read::Disk {
            let peer = match (&a.read, &state.peers, &costs) {
                (Read::Peer(p), ..) => Some(*p),
                (_, Some(p), Some(c)) => p.source(c, a.seq - 1, ctx.meta(a.sample).size_bytes),
                _ => None,
            };
            match (pipelined, on_workers, peer) {
                (false, ..) => a.read = Read::Blocking { peer },
                (true, _, Some(p)) => a.read = Read::Peer(p),
                (true, true, None) => a.read = Read::IfResident,
                (true, false, None) => {}
            }
        }
        match a.read {
            Read::Cached => {
                let landing = a.landing.take().expect("planned with its landing");
                if let Some(r) = a.wait_on(&landing) {
                    routed.ready.push(r);
                }
            }
            Read::Storage(_) => routed.reads.push(a),
            Read::Peer(p) => routed.remote.push((a, p)),
            Read::Disk => routed.disk.push(a),
            Read::Blocking { .. } | Read::IfResident => routed.ready.push(Ready {
                access: a,
                bytes: Ok(bytes::Bytes::new()),
            }),
            Read::PageCacheHit => {
                unreachable!("a landing, not the plan, makes page-cache hits")
            }
        }
    }
    routed
}

/// Hands the window's accesses on: those whose bytes are at hand to the decode queues, the
/// storage reads to the dispatcher.
fn hand_out<T>(
    ctx: &Context<T>,
    state: &ForPlanner<T>,
    ready: Vec<Ready>,
    mut reads: Vec<Access>,
) -> Result<(), Error> {
    // Accesses whose bytes are at hand start decoding as soon as they are queued; the
    // queues order them by stream position, one lock for the whole window.
    state.decode.push(ready);
    if let Some(tx) = &state.to_dispatcher {
        state
            .read_path
            .dispatched
            .fetch_add(reads.len() as u64, Ordering::Relaxed);
        if ctx.config.reads.io_order == IoOrder::Deadline {
            set_read_fractions(&mut reads);
        }
        if !reads.is_empty() && tx.send(ToDispatcher::Reads(reads)).is_err() {
            return Err(Error::Stopped {
                reason: "the I/O dispatcher ended".into(),
            });
        }
    }
    Ok(())
}

/// Queues the window's batches in the reorder buffers, with their planned hit/miss figures.
fn open_batches<T>(
    ctx: &Context<T>,
    state: &ForPlanner<T>,
    window: &[Access],
    (epoch, first, last): (u32, usize, usize),
    issued: Instant,
) {
    let span = last - first;
    // One pass over the window: the figures of batch (rank, iteration) at rank * span + i.
    let mut metrics: Vec<IterationMetrics> = (0..state.ranks.len() * span)
        .map(|k| IterationMetrics {
            epoch,
            iteration: (first + k % span) as u32,
            rank: k / span,
            ..Default::default()
        })
        .collect();
    for a in window {
        let m = &mut metrics[a.rank * span + (a.iteration as usize - first)];
        let bytes = ctx.meta(a.sample).size_bytes;
        if a.cached.hit() {
            m.hits += 1;
            m.hit_bytes += bytes;
        } else {
            m.misses += 1;
            m.miss_bytes += bytes;
        }
    }
    let mut metrics = metrics.into_iter();
    for r in state.ranks.iter() {
        let batches = (first..last).zip(metrics.by_ref()).map(|(iteration, m)| {
            PendingBatch::new(
                epoch,
                iteration as u32,
                ctx.layout.batch_len(epoch, iteration),
                issued,
                m,
            )
        });
        r.open(batches);
    }
}
