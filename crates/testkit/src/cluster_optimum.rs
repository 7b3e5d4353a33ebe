//! Exhaustive references for the cluster plan on small jobs: the fewest storage bytes any plan
//! reads under the holder model (a sample is kept only by the node that read it from storage,
//! until it leaves; every node within its capacity at every position) and with one pooled
//! cache of all the nodes' bytes, found by trying every keep/drop choice.
//!
//! Each access with a next use opens an interval that ends at that next use; keeping the
//! sample over the whole interval turns the access at its end into a hit. Keeping it for less
//! than the whole interval saves nothing, so an optimum keeps whole intervals. Under the holder
//! model an interval is kept at the node holding the sample when it opens: the holder of the
//! interval before, if that one was kept, else the node whose access opens it (a storage
//! read). The capacity holds at every position for every node.
//!
//! The floor: in every epoch, the first access of each distinct sample hits only if the sample
//! was held when the epoch began, so no plan reads less than the bytes of the epoch's distinct
//! samples minus all the nodes' capacity.

use std::collections::BTreeSet;
use std::sync::Arc;

use lobster_cache::{
    CacheError, ClusterConfig, ClusterLayout, ClusterPlanner, PeerPlanKind, Planner, PolicyKind,
    SampleId, Served, StreamSource, VecSource, NEVER,
};

use crate::OracleError;

/// The most intervals [`optimal_storage_bytes`] searches (2 choices each).
pub const MAX_INTERVALS: usize = 18;

#[derive(Clone, Copy, Debug)]
struct Interval {
    start: usize,
    end: usize,
    size: u64,
    /// The node whose access opens it.
    opener: usize,
    /// The interval of the same sample that ends where this one starts.
    previous: Option<usize>,
}

/// Position of each access's next access of the same sample, [`NEVER`] if none.
fn next_uses(stream: &[(u16, SampleId)]) -> Vec<u64> {
    let mut next = vec![NEVER; stream.len()];
    let mut seen = std::collections::HashMap::new();
    for (p, &(_, s)) in stream.iter().enumerate().rev() {
        next[p] = seen.insert(s, p as u64).unwrap_or(NEVER);
    }
    next
}

/// The fewest bytes any plan reads from storage over `stream` ((node, sample) accesses in
/// global order), with `nodes` caches of `capacity_bytes` under the holder model, or with one
/// pooled cache of `nodes * capacity_bytes` if `pooled`.
///
/// # Errors
/// [`OracleError::Cache`] of [`CacheError::SampleOutOfRange`] for a sample without a size
/// (epoch 0 is reported);
/// [`OracleError::TooManyIntervals`] for a stream of more than [`MAX_INTERVALS`] reuses.
pub fn optimal_storage_bytes(
    stream: &[(u16, SampleId)],
    sizes: &[u32],
    nodes: usize,
    capacity_bytes: u64,
    pooled: bool,
) -> Result<u64, OracleError> {
    if let Some(&(_, sample)) = stream.iter().find(|(_, s)| *s as usize >= sizes.len()) {
        return Err(CacheError::SampleOutOfRange {
            sample,
            epoch: 0,
            num_samples: sizes.len(),
        }
        .into());
    }
    let (caches, capacity) = if pooled {
        (1, capacity_bytes.saturating_mul(nodes as u64))
    } else {
        (nodes, capacity_bytes)
    };
    let next = next_uses(stream);
    let mut ending_at = vec![None; stream.len()];
    let mut intervals = Vec::new();
    for (p, &(node, s)) in stream.iter().enumerate() {
        let size = u64::from(sizes[s as usize]);
        if next[p] == NEVER || size > capacity {
            continue;
        }
        ending_at[next[p] as usize] = Some(intervals.len());
        intervals.push(Interval {
            start: p,
            end: next[p] as usize,
            size,
            opener: if pooled { 0 } else { usize::from(node) },
            previous: ending_at[p],
        });
    }
    if intervals.len() > MAX_INTERVALS {
        return Err(OracleError::TooManyIntervals {
            intervals: intervals.len(),
            max: MAX_INTERVALS,
        });
    }
    let mut best_after = vec![0; intervals.len() + 1];
    for i in (0..intervals.len()).rev() {
        best_after[i] = best_after[i + 1] + intervals[i].size;
    }
    let mut search = Search {
        intervals: &intervals,
        best_after: &best_after,
        capacity,
        held: vec![vec![0; stream.len()]; caches],
        kept_at: vec![None; intervals.len()],
        best: 0,
    };
    search.visit(0, 0);
    let total: u64 = stream
        .iter()
        .map(|&(_, s)| u64::from(sizes[s as usize]))
        .sum();
    Ok(total - search.best)
}

struct Search<'a> {
    intervals: &'a [Interval],
    best_after: &'a [u64],
    capacity: u64,
    /// Per cache, bytes held over each position by the intervals kept so far.
    held: Vec<Vec<u64>>,
    kept_at: Vec<Option<usize>>,
    /// The most bytes of hits found.
    best: u64,
}

impl Search<'_> {
    fn visit(&mut self, i: usize, saved: u64) {
        if saved + self.best_after[i] <= self.best {
            return;
        }
        let Some(&iv) = self.intervals.get(i) else {
            self.best = self.best.max(saved);
            return;
        };
        let node = iv
            .previous
            .and_then(|p| self.kept_at[p])
            .unwrap_or(iv.opener);
        let span = iv.start..iv.end;
        if self.held[node][span.clone()]
            .iter()
            .all(|&h| h + iv.size <= self.capacity)
        {
            self.held[node][span.clone()]
                .iter_mut()
                .for_each(|h| *h += iv.size);
            self.kept_at[i] = Some(node);
            self.visit(i + 1, saved + iv.size);
            self.kept_at[i] = None;
            self.held[node][span].iter_mut().for_each(|h| *h -= iv.size);
        }
        self.visit(i + 1, saved);
    }
}

/// The floor of storage bytes over `stream` split in epochs by `epoch_of`: per epoch, its
/// distinct samples' bytes minus `nodes * capacity_bytes`, at least 0.
pub fn floor_bytes(
    stream: &[(u16, SampleId)],
    epoch_of: &[u32],
    sizes: &[u32],
    nodes: usize,
    capacity_bytes: u64,
) -> u64 {
    let pool = capacity_bytes.saturating_mul(nodes as u64);
    let mut floor = 0;
    let mut p = 0;
    while p < stream.len() {
        let e = epoch_of[p];
        let mut distinct = BTreeSet::new();
        while p < stream.len() && epoch_of[p] == e {
            distinct.insert(stream[p].1);
            p += 1;
        }
        let bytes: u64 = distinct.iter().map(|&s| u64::from(sizes[s as usize])).sum();
        floor += bytes.saturating_sub(pool);
    }
    floor
}

/// What one decision of the naive cluster model is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Step {
    served: Served,
    kept_at: Option<u16>,
    evicted: Vec<(SampleId, u16)>,
}

/// The module docs of the cluster plan followed to the letter, quadratic: per node the cached
/// (sample, next use) pairs, and the holder of each sample.
fn reference(stream: &[(u16, SampleId)], sizes: &[u32], nodes: usize, capacity: u64) -> Vec<Step> {
    let next = next_uses(stream);
    let size = |s: SampleId| u64::from(sizes[s as usize]);
    let mut cached: Vec<Vec<(SampleId, u64)>> = vec![Vec::new(); nodes];
    let mut steps = Vec::with_capacity(stream.len());
    for (p, &(a, s)) in stream.iter().enumerate() {
        let n = next[p];
        let holder = (0..nodes).find(|&h| cached[h].iter().any(|&(c, _)| c == s));
        let mut evicted = Vec::new();
        if let Some(h) = holder {
            let i = cached[h].iter().position(|&(c, _)| c == s).unwrap();
            let served = if h == usize::from(a) {
                Served::Local
            } else {
                Served::Remote(h as u16)
            };
            if n == NEVER {
                cached[h].remove(i);
                evicted.push((s, h as u16));
            } else {
                cached[h][i].1 = n;
            }
            steps.push(Step {
                served,
                kept_at: (n != NEVER).then_some(h as u16),
                evicted,
            });
            continue;
        }
        let c = &mut cached[usize::from(a)];
        let used: u64 = c.iter().map(|&(x, _)| size(x)).sum();
        let admit = if n == NEVER || size(s) > capacity {
            false
        } else if used + size(s) <= capacity {
            true
        } else {
            let mut later: Vec<(u64, SampleId)> = c
                .iter()
                .filter(|&&(_, k)| k > n)
                .map(|&(x, k)| (k, x))
                .collect();
            later.sort_unstable_by(|x, y| y.cmp(x));
            let freeable: u64 = later.iter().map(|&(_, x)| size(x)).sum();
            if used - freeable + size(s) > capacity {
                false
            } else {
                let mut used = used;
                for (_, x) in later {
                    if used + size(s) <= capacity {
                        break;
                    }
                    used -= size(x);
                    c.retain(|&(y, _)| y != x);
                    evicted.push((x, a));
                }
                true
            }
        };
        if admit {
            c.push((s, n));
        }
        steps.push(Step {
            served: Served::Storage,
            kept_at: admit.then_some(a),
            evicted,
        });
    }
    steps
}

/// A small job: one order per epoch and the job's shape.
#[derive(Debug, Clone)]
pub struct ClusterCase {
    /// Each epoch's order of the samples.
    pub orders: Vec<Vec<SampleId>>,
    /// Each sample's size.
    pub sizes: Vec<u32>,
    /// Nodes.
    pub nodes: usize,
    /// Ranks per node.
    pub ranks_per_node: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Each node's cache.
    pub capacity_bytes: u64,
}

/// Storage bytes of the plans and the references on one [`ClusterCase`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterComparison {
    /// The cluster-mode plan.
    pub cluster_bytes: u64,
    /// The local-mode plan (each node's Belady, peers serving what they hold).
    pub local_bytes: u64,
    /// The holder-model optimum, if the stream is small enough to search.
    pub holder_optimum_bytes: Option<u64>,
    /// The pooled optimum, if the stream is small enough to search.
    pub pooled_optimum_bytes: Option<u64>,
    /// The floor.
    pub floor_bytes: u64,
}

fn layout_of(case: &ClusterCase) -> ClusterLayout<VecSource> {
    ClusterLayout::new(
        VecSource::new(case.orders.clone()),
        case.orders.first().map_or(1, Vec::len),
        case.nodes,
        case.ranks_per_node,
        case.batch_size,
    )
    .expect("a valid small layout")
}

/// Runs the plan in `mode` over `case` beside a mirror of every node's cache, panicking at the
/// first broken invariant; returns the decisions as (node, sample, served, kept_at, evicted)
/// and the storage bytes.
fn run_checked(case: &ClusterCase, mode: PeerPlanKind, batch: usize) -> (Vec<Step>, u64) {
    let layout = layout_of(case);
    let sizes: Arc<[u32]> = case.sizes.clone().into();
    let nodes = case.nodes;
    let config = ClusterConfig {
        mode: Some(mode),
        batch_accesses_max: Some(batch),
        ..ClusterConfig::default()
    };
    let mut planner =
        ClusterPlanner::with_config(layout.clone(), sizes, case.capacity_bytes, config).unwrap();
    let mut mirror: Vec<BTreeSet<SampleId>> = vec![BTreeSet::new(); nodes];
    let mut evicted = Vec::new();
    let mut steps = Vec::new();
    let mut storage = 0;
    let mut position = 0;
    while let Some(d) = planner.next(&mut evicted).unwrap() {
        assert_eq!(d.position, position, "{mode:?}");
        position += 1;
        let (a, s) = (usize::from(d.node), d.sample);
        assert_eq!(d.size_bytes, case.sizes[s as usize]);
        match d.served {
            Served::Local => assert!(mirror[a].contains(&s), "{mode:?}: local hit not held"),
            Served::Remote(h) => {
                assert_ne!(usize::from(h), a);
                assert!(
                    mirror[usize::from(h)].contains(&s),
                    "{mode:?}: remote hit of {s} at {position} not held by node {h}"
                );
                assert!(
                    !mirror[a].contains(&s),
                    "{mode:?}: remote hit of a local sample"
                );
            }
            Served::Storage => {
                storage += u64::from(d.size_bytes);
                assert!(
                    mirror.iter().all(|m| !m.contains(&s)),
                    "{mode:?}: storage read of {s}, held by a node"
                );
            }
        }
        for &(e, n) in &evicted {
            assert!(
                mirror[usize::from(n)].remove(&e),
                "{mode:?}: node {n} evicted {e}, which it did not hold"
            );
        }
        if let Some(k) = d.kept_at {
            mirror[usize::from(k)].insert(s);
        }
        if mode == PeerPlanKind::Cluster {
            let holders = mirror.iter().filter(|m| m.contains(&s)).count();
            assert!(holders <= 1, "{mode:?}: {s} held by {holders} nodes");
            assert_eq!(holders == 1, d.kept_at.is_some());
        }
        for (n, m) in mirror.iter().enumerate() {
            let used: u64 = m.iter().map(|&c| u64::from(case.sizes[c as usize])).sum();
            assert_eq!(planner.used_bytes(n), used, "{mode:?} node {n}");
            assert!(
                used <= case.capacity_bytes,
                "{mode:?} node {n} over capacity"
            );
            assert!(planner.holds(n, s) == m.contains(&s));
        }
        steps.push(Step {
            served: d.served,
            kept_at: d.kept_at,
            evicted: evicted.clone(),
        });
    }
    let stats = planner.stats();
    assert_eq!(stats.total().storage_bytes, storage);
    assert_eq!(
        stats.total().accesses(),
        layout.epoch_accesses() * u64::from(layout.epochs())
    );
    (steps, storage)
}

/// The global stream of `layout` as (node, sample) pairs and each access's epoch, checked
/// against each node's view: its share of the global stream, in order.
fn global_stream(
    case: &ClusterCase,
    layout: &ClusterLayout<VecSource>,
) -> (Vec<(u16, SampleId)>, Vec<u32>) {
    let mut stream = Vec::new();
    let mut epoch_of = Vec::new();
    let view = layout.global();
    for e in 0..layout.epochs() {
        let mut ids = Vec::new();
        view.fill_epoch(e, &mut ids);
        assert_eq!(ids.len() as u64, layout.epoch_accesses());
        for (i, s) in ids.into_iter().enumerate() {
            stream.push((layout.node_at(i as u64), s));
            epoch_of.push(e);
        }
    }
    // Each node's view is its share of the global stream, in order.
    for a in 0..case.nodes {
        let mut own = Vec::new();
        let node_view = layout.node(a);
        for e in 0..layout.epochs() {
            node_view.fill_epoch(e, &mut own);
        }
        let share: Vec<SampleId> = stream
            .iter()
            .filter(|&&(n, _)| usize::from(n) == a)
            .map(|&(_, s)| s)
            .collect();
        assert_eq!(own, share, "node {a}'s stream");
    }
    (stream, epoch_of)
}

/// Checks the plan on `case` in both modes with an index batch of `batch` accesses: every
/// invariant, cluster mode against the naive model, local mode against independent per-node
/// planners, and both against the exhaustive optima and the floor. Panics on any failure.
pub fn check_cluster_case(case: &ClusterCase, batch: usize) -> ClusterComparison {
    let layout = layout_of(case);
    let sizes: Arc<[u32]> = case.sizes.clone().into();
    let (stream, epoch_of) = global_stream(case, &layout);

    let (cluster, cluster_bytes) = run_checked(case, PeerPlanKind::Cluster, batch);
    let want = reference(&stream, &case.sizes, case.nodes, case.capacity_bytes);
    for (p, (got, want)) in cluster.iter().zip(&want).enumerate() {
        assert_eq!(got, want, "cluster mode at {p} ({:?})", stream[p]);
    }

    let (local, local_bytes) = run_checked(case, PeerPlanKind::Node, batch);
    let mut alone: Vec<_> = (0..case.nodes)
        .map(|a| {
            Planner::new(
                layout.node(a),
                sizes.clone(),
                case.capacity_bytes,
                PolicyKind::Reuse,
            )
            .unwrap()
        })
        .collect();
    let mut evicted = Vec::new();
    for (p, step) in local.iter().enumerate() {
        let (a, s) = stream[p];
        let d = alone[usize::from(a)].next(&mut evicted).unwrap().unwrap();
        assert_eq!(d.sample, s);
        assert_eq!(d.hit, step.served == Served::Local, "local mode at {p}");
        assert_eq!(
            d.admitted,
            step.served != Served::Local && step.kept_at.is_some(),
            "local mode at {p}"
        );
        let own: Vec<(SampleId, u16)> = evicted.iter().map(|&e| (e, a)).collect();
        assert_eq!(step.evicted, own, "local mode at {p}");
    }

    let floor_bytes = floor_bytes(
        &stream,
        &epoch_of,
        &case.sizes,
        case.nodes,
        case.capacity_bytes,
    );
    let holder =
        optimal_storage_bytes(&stream, &case.sizes, case.nodes, case.capacity_bytes, false);
    let pooled = optimal_storage_bytes(&stream, &case.sizes, case.nodes, case.capacity_bytes, true);
    let (holder, pooled) = match (holder, pooled) {
        (Ok(h), Ok(p)) => (Some(h), Some(p)),
        (Err(OracleError::TooManyIntervals { .. }), _)
        | (_, Err(OracleError::TooManyIntervals { .. })) => (None, None),
        (Err(e), _) | (_, Err(e)) => panic!("optimum: {e}"),
    };
    assert!(cluster_bytes >= floor_bytes && local_bytes >= floor_bytes);
    if let (Some(h), Some(p)) = (holder, pooled) {
        assert!(
            cluster_bytes >= h,
            "cluster plan {cluster_bytes} below the optimum {h}"
        );
        assert!(h >= p, "holder optimum {h} below the pooled one {p}");
        assert!(
            local_bytes >= p,
            "local plan {local_bytes} below the pooled optimum {p}"
        );
        assert!(
            p >= floor_bytes,
            "pooled optimum {p} below the floor {floor_bytes}"
        );
        let unit = case.sizes.iter().all(|&s| s == case.sizes[0]);
        if case.nodes == 1 && unit {
            // One node: the holder model is one cache, where Belady is optimal.
            assert_eq!(cluster_bytes, h, "one node, unit sizes: Belady is optimal");
            assert_eq!(local_bytes, h);
        }
    }
    ClusterComparison {
        cluster_bytes,
        local_bytes,
        holder_optimum_bytes: holder,
        pooled_optimum_bytes: pooled,
        floor_bytes,
    }
}

/// Decodes arbitrary bytes into a small job (1 to 3 nodes, 1 or 2 ranks, batches of 1 to 3,
/// 1 to 6 samples of unit or varied sizes, 1 to 3 epochs of shuffled orders) and runs
/// [`check_cluster_case`].
pub fn check_cluster_bytes(data: &[u8]) -> ClusterComparison {
    let mut it = data.iter().copied();
    let mut byte = || it.next().unwrap_or(0);
    let nodes = 1 + usize::from(byte() % 3);
    let ranks_per_node = 1 + usize::from(byte() % 2);
    let batch_size = 1 + usize::from(byte() % 3);
    let samples = 1 + usize::from(byte() % 6);
    let epochs = 1 + usize::from(byte() % 3);
    let varied = byte() % 2 == 1;
    let sizes: Vec<u32> = (0..samples)
        .map(|_| if varied { 1 + u32::from(byte() % 4) } else { 1 })
        .collect();
    let all: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let capacity_bytes = u64::from(byte()) % (all + 2);
    let batch = 1 + usize::from(byte() % 40);
    let mut orders = Vec::new();
    for _ in 0..epochs {
        let mut order: Vec<SampleId> = (0..samples as SampleId).collect();
        for i in (1..samples).rev() {
            order.swap(i, usize::from(byte()) % (i + 1));
        }
        orders.push(order);
    }
    check_cluster_case(
        &ClusterCase {
            orders,
            sizes,
            nodes,
            ranks_per_node,
            batch_size,
            capacity_bytes,
        },
        batch,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_node_belady_is_not_the_holder_model_optimum() {
        // Two nodes of one unit each. Node 0 reads x (next use: node 1 at 2) and y (next use:
        // node 0 at 3); Belady keeps x, needed sooner, and so reads y three times. Dropping x
        // instead lets node 1 read it once and keep it, and y hits twice at node 0.
        let stream = [(0, 0), (0, 1), (1, 0), (0, 1), (1, 0), (0, 1)];
        let sizes = [1, 1];
        let model = reference(&stream, &sizes, 2, 1);
        let reads = model.iter().filter(|s| s.served == Served::Storage).count() as u64;
        assert_eq!(reads, 4);
        assert_eq!(
            optimal_storage_bytes(&stream, &sizes, 2, 1, false).unwrap(),
            3
        );
        assert_eq!(
            optimal_storage_bytes(&stream, &sizes, 2, 1, true).unwrap(),
            2
        );
    }

    #[test]
    fn optimum_refuses_a_sample_without_a_size_and_a_long_stream() {
        let err = optimal_storage_bytes(&[(0, 3)], &[1], 1, 1, false).unwrap_err();
        assert!(matches!(
            err,
            OracleError::Cache(CacheError::SampleOutOfRange { sample: 3, .. })
        ));
        let long: Vec<(u16, SampleId)> = (0..40).map(|p| (0, p % 2)).collect();
        let err = optimal_storage_bytes(&long, &[1, 1], 1, 1, false).unwrap_err();
        assert!(matches!(err, OracleError::TooManyIntervals { .. }));
    }

    #[test]
    fn floor_counts_each_epochs_distinct_bytes_over_the_pool() {
        let stream = [(0, 0), (1, 1), (0, 0), (1, 2), (0, 1)];
        let epoch_of = [0, 0, 0, 1, 1];
        // Epoch 0: {0, 1} = 5 bytes, epoch 1: {1, 2} = 7 bytes; pool 2 x 2.
        assert_eq!(floor_bytes(&stream, &epoch_of, &[2, 3, 4], 2, 2), 1 + 3);
    }
}
