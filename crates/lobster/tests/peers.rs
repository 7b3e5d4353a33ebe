//! Nodes that fetch misses from each other's caches (in one process, through
//! `InProcessNodes`): without faults every planned remote hit is served and every sample
//! delivered with its bytes; a silent peer's fetches fall back to storage, nothing lost.

use std::sync::Arc;

use lobster_io::net::{InProcessNode, InProcessNodes, Transport};
use lobster_io::{
    Assign, Batch, CachePolicy, Dataset, Error, Execution, LoaderBuilder, PeerPlanChoice,
    PeerPlanKind, RunMetrics, StorageEmulation,
};
use lobster_testkit::data::make_dataset;
use lobster_testkit::loader::{rank_plan, Shape};

const NODES: usize = 3;
const RANKS: usize = 2;

fn shape(node: usize) -> Shape {
    Shape {
        nodes: NODES,
        ranks: RANKS,
        node,
        seed: 9,
        epochs: 4,
        batch: 4,
    }
}

type Got = Vec<Vec<Result<Batch<Vec<u8>>, Error>>>;

/// Runs every node's ranks in lock-step (one barrier across the job after each step, as
/// synchronous training's all-reduce), each node with its own loader and its transport.
fn run_job(
    ds: &Arc<Dataset>,
    policy: CachePolicy,
    execution: Execution,
    nodes: &[Arc<InProcessNode>],
    silent: Option<usize>,
) -> Vec<(Got, RunMetrics)> {
    let capacity = ds.samples().iter().map(|s| s.size_bytes).sum::<u64>() / 3;
    run_job_with(
        ds,
        (policy, capacity, PeerPlanChoice::Auto, Assign::Sampler),
        execution,
        nodes,
        silent,
    )
}

/// [`run_job`] with the cache's capacity, how the nodes plan it, and which rank of a step
/// gets which sample.
fn run_job_with(
    ds: &Arc<Dataset>,
    (policy, capacity, peer_plan, assign): (CachePolicy, u64, PeerPlanChoice, Assign),
    execution: Execution,
    nodes: &[Arc<InProcessNode>],
    silent: Option<usize>,
) -> Vec<(Got, RunMetrics)> {
    let mut loaders: Vec<_> = (0..NODES)
        .map(|node| {
            LoaderBuilder::new(ds.clone())
                .world(NODES, RANKS, node)
                .seed(shape(node).seed)
                .batch_size(shape(node).batch)
                .epochs(shape(node).epochs)
                .cache(policy, capacity)
                .peer_plan(peer_plan)
                .assign(assign)
                .execution(execution)
                .decode_threads(2)
                .io_depth(4)
                // Slow storage: the cost model keeps preferring the peers.
                .storage_emulation(Some(StorageEmulation {
                    bandwidth_bytes_per_s: 50e6,
                    latency_us: 500,
                }))
                .peers(nodes[node].clone() as Arc<dyn Transport>)
                .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
                .build()
                .unwrap()
        })
        .collect();
    if let Some(n) = silent {
        nodes[n].silence();
    }
    let got = lobster_testkit::loader::run_lock_step(&mut loaders, None, |b| b);
    got.into_iter()
        .zip(&loaders)
        .map(|(g, l)| (g, l.metrics()))
        .collect()
}

/// Each rank of `node` got its planned batches, each sample with its file's bytes.
fn check(ds: &Dataset, got: Got, node: usize, what: &str) {
    let plan = rank_plan(ds.len(), shape(node));
    for (rank, (batches, planned)) in got.into_iter().zip(plan).enumerate() {
        assert_eq!(
            batches.len(),
            planned.len(),
            "{what}: node {node} rank {rank}"
        );
        for (b, (epoch, iteration, ids)) in batches.into_iter().zip(planned) {
            let b = b.unwrap_or_else(|e| panic!("{what}: node {node} rank {rank}: {e}"));
            assert_eq!((b.epoch, b.iteration), (epoch, iteration), "{what}");
            let got: Vec<u32> = b.samples.iter().map(|s| s.id).collect();
            assert_eq!(got, ids, "{what}: node {node} rank {rank}");
            for s in &b.samples {
                let file = std::fs::read(&ds.samples()[s.id as usize].path).unwrap();
                assert_eq!(s.value, file, "{what}: bytes of sample {}", s.id);
            }
        }
    }
}

#[test]
fn without_faults_every_planned_remote_hit_is_served_and_every_sample_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    for (policy, execution) in [
        (CachePolicy::Static, Execution::Pipelined),
        (CachePolicy::Static, Execution::ReadThenDecode),
        (CachePolicy::Reuse, Execution::Pipelined),
        (CachePolicy::Reuse, Execution::ReadThenDecode),
    ] {
        let nodes = InProcessNodes::connect(NODES);
        let what = format!("{policy:?} {execution:?}");
        let mut planned = 0;
        for (node, (got, m)) in run_job(&ds, policy, execution, &nodes, None)
            .into_iter()
            .enumerate()
        {
            check(&ds, got, node, &what);
            assert_eq!(
                m.remote_hits, m.planned_remote_hits,
                "{what} node {node}: {m:?}"
            );
            // A third of the dataset per node on 3 nodes: the reuse cache is planned as one,
            // and the cluster plan sends every remote hit it plans.
            let cluster = policy == CachePolicy::Reuse;
            let kind = if cluster {
                PeerPlanKind::Cluster
            } else {
                PeerPlanKind::Node
            };
            assert_eq!(m.peer_plan.mode, kind, "{what}: {:?}", m.peer_plan);
            if cluster {
                assert_eq!(m.planned_remote_hits, m.peer_planned_accesses, "{what}");
                let plan = m.cluster_plan.as_ref().expect("the cluster plan's share");
                let planned: u64 = plan.epochs.iter().map(|e| e.storage_reads).sum();
                assert_eq!(planned, m.accesses - m.hits - m.remote_hits, "{what}");
            }
            assert_eq!((m.remote_misses, m.remote_timeouts), (0, 0), "{what}");
            // A planned remote hit is a local miss the plan gave a holder.
            assert!(m.planned_remote_hits <= m.peer_planned_accesses, "{what}");
            assert!(m.planned_remote_hits <= m.accesses - m.hits, "{what}");
            let t = nodes[node].stats();
            assert_eq!(t.answered_bytes, m.remote_hits, "{what}");
            eprintln!(
                "{what} node {node}: {} accesses, {} local hits, {} planned remote, {} remote hits",
                m.accesses, m.hits, m.planned_remote_hits, m.remote_hits
            );
            planned += m.planned_remote_hits;
        }
        let served: u64 = nodes.iter().map(|n| n.stats().served_bytes).sum();
        assert_eq!(
            served, planned,
            "{what}: every fetch was served by some peer"
        );
        if policy == CachePolicy::Static {
            assert!(planned > 0, "{what}: the test must plan remote hits");
        }
    }
}

#[test]
fn a_silent_peers_fetches_time_out_and_storage_serves_them() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    for execution in [Execution::Pipelined, Execution::ReadThenDecode] {
        let nodes = InProcessNodes::connect(NODES);
        let results = run_job(&ds, CachePolicy::Static, execution, &nodes, Some(1));
        let mut timeouts = 0;
        for (node, (got, m)) in results.into_iter().enumerate() {
            check(&ds, got, node, "silent node 1");
            assert_eq!(
                m.remote_hits + m.remote_misses,
                m.planned_remote_hits,
                "{execution:?} node {node}: {m:?}"
            );
            assert_eq!(m.remote_misses, m.remote_timeouts, "{m:?}");
            timeouts += m.remote_timeouts;
        }
        assert!(
            timeouts > 0,
            "{execution:?}: node 1 was asked and did not answer"
        );
    }
}

#[test]
fn a_transport_of_another_world_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 24, 2);
    let nodes = InProcessNodes::connect(2);
    let e = LoaderBuilder::new(ds)
        .world(3, 1, 0)
        .batch_size(2)
        .peers(nodes[0].clone() as Arc<dyn Transport>)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("peers"), "{e}");
}

/// Storage reads of a node: its accesses neither its cache nor a peer served.
fn storage_reads(m: &RunMetrics) -> u64 {
    m.accesses - m.hits - m.remote_hits
}

#[test]
fn the_cluster_plan_reads_less_from_storage_than_each_nodes_own_and_serves_all_it_plans() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    let capacity = ds.samples().iter().map(|s| s.size_bytes).sum::<u64>() / 3;
    let mut reads = Vec::new();
    for choice in [PeerPlanChoice::Node, PeerPlanChoice::Auto] {
        let nodes = InProcessNodes::connect(NODES);
        let results = run_job_with(
            &ds,
            (CachePolicy::Reuse, capacity, choice, Assign::Sampler),
            Execution::Pipelined,
            &nodes,
            None,
        );
        let mut total = 0;
        for (node, (got, m)) in results.into_iter().enumerate() {
            check(&ds, got, node, &format!("{choice:?}"));
            assert_eq!(m.remote_hits, m.planned_remote_hits, "{choice:?}: {m:?}");
            assert_eq!(m.remote_misses, 0, "{choice:?}");
            let bytes: u64 = nodes[node].stats().answered_bytes;
            assert_eq!(bytes, m.remote_hits, "{choice:?}");
            total += storage_reads(&m);
        }
        reads.push(total);
    }
    let (own, cluster) = (reads[0], reads[1]);
    assert!(
        cluster < own,
        "the cluster plan reads {cluster} samples from storage, each node's own {own}"
    );
}

#[test]
fn where_caches_are_small_the_cluster_plan_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    // C * N^2 <= F: each node's own plan already reads about the floor.
    let capacity = ds.samples().iter().map(|s| s.size_bytes).sum::<u64>() / 10;
    let mut runs = Vec::new();
    for choice in [PeerPlanChoice::Node, PeerPlanChoice::Auto] {
        let nodes = InProcessNodes::connect(NODES);
        let results = run_job_with(
            &ds,
            (CachePolicy::Reuse, capacity, choice, Assign::Sampler),
            Execution::Pipelined,
            &nodes,
            None,
        );
        let mut figures = Vec::new();
        for (node, (got, m)) in results.into_iter().enumerate() {
            check(&ds, got, node, "small caches");
            assert_eq!(m.peer_plan.mode, PeerPlanKind::Node, "{:?}", m.peer_plan);
            assert!(m.cluster_plan.is_none());
            figures.push((m.hits, m.peer_planned_accesses, m.planned_remote_hits));
        }
        runs.push(figures);
    }
    assert_eq!(
        runs[0], runs[1],
        "the same hits and remote hits as each node's own plan"
    );
}

#[test]
fn under_the_cluster_plan_a_silent_peers_fetches_fall_back_to_storage() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    for execution in [Execution::Pipelined, Execution::ReadThenDecode] {
        let nodes = InProcessNodes::connect(NODES);
        let results = run_job(&ds, CachePolicy::Reuse, execution, &nodes, Some(2));
        let mut timeouts = 0;
        for (node, (got, m)) in results.into_iter().enumerate() {
            check(&ds, got, node, "silent node 2, cluster plan");
            assert_eq!(m.peer_plan.mode, PeerPlanKind::Cluster);
            assert_eq!(
                m.remote_hits + m.remote_misses,
                m.planned_remote_hits,
                "{execution:?} node {node}: {m:?}"
            );
            assert_eq!(m.remote_misses, m.remote_timeouts, "{m:?}");
            timeouts += m.remote_timeouts;
        }
        assert!(
            timeouts > 0,
            "{execution:?}: node 2 was asked and did not answer"
        );
    }
}

/// Where the caches together do not hold the dataset (the floor `F - N*C` is above zero), the
/// planner reads storage ahead of the prefetch distance and holds back the peer fetches of
/// those windows: every sample still arrives as it is, every planned remote hit is served (or,
/// from a silent peer, read from storage), and the steady epochs read at least the floor.
#[test]
fn reading_ahead_under_the_cluster_plan_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    let total = ds.samples().iter().map(|s| s.size_bytes).sum::<u64>();
    // C * N^2 = 9F/5 > F (the cluster plan), N * C = 3F/5 < F (something to read ahead).
    let capacity = total / 5;
    let floor = total - NODES as u64 * capacity;
    for silent in [None, Some(2)] {
        let nodes = InProcessNodes::connect(NODES);
        let results = run_job_with(
            &ds,
            (
                CachePolicy::Reuse,
                capacity,
                PeerPlanChoice::Auto,
                Assign::Sampler,
            ),
            Execution::Pipelined,
            &nodes,
            silent,
        );
        let (mut steady_bytes, mut epochs) = (0, 0);
        for (node, (got, m)) in results.into_iter().enumerate() {
            check(&ds, got, node, &format!("read-ahead, silent {silent:?}"));
            assert_eq!(m.peer_plan.mode, PeerPlanKind::Cluster, "{:?}", m.peer_plan);
            assert_eq!(
                m.remote_hits + m.remote_misses,
                m.planned_remote_hits,
                "silent {silent:?}, node {node}: {m:?}"
            );
            if silent.is_none() {
                assert_eq!(m.remote_misses, 0, "node {node}: {m:?}");
            }
            steady_bytes += m.storage_bytes_by_epoch.iter().skip(1).sum::<u64>();
            epochs = m.storage_bytes_by_epoch.len() as u64 - 1;
        }
        assert!(epochs > 0);
        assert!(
            steady_bytes >= epochs * floor,
            "silent {silent:?}: {steady_bytes} bytes read in {epochs} steady epochs, floor {floor}"
        );
    }
}

/// A step's samples over every node and rank, by (epoch, iteration), sorted; and each rank's
/// batch sizes, node after node, rank after rank.
type Steps = (Vec<((u32, u32), Vec<u32>)>, Vec<Vec<usize>>);

/// The [`Steps`] of every node's ranks' batches (epoch, iteration, ids).
fn steps_of(ranks: impl Iterator<Item = Vec<(u32, u32, Vec<u32>)>>) -> Steps {
    let mut steps = std::collections::BTreeMap::<(u32, u32), Vec<u32>>::new();
    let mut sizes = Vec::new();
    for batches in ranks {
        sizes.push(batches.iter().map(|b| b.2.len()).collect());
        for (epoch, iteration, ids) in batches {
            steps.entry((epoch, iteration)).or_default().extend(ids);
        }
    }
    for ids in steps.values_mut() {
        ids.sort_unstable();
    }
    (steps.into_iter().collect(), sizes)
}

/// What each rank got, as (epoch, iteration, ids), every sample's bytes checked.
fn delivered(ds: &Dataset, got: Got, what: &str) -> Vec<Vec<(u32, u32, Vec<u32>)>> {
    got.into_iter()
        .map(|batches| {
            batches
                .into_iter()
                .map(|b| {
                    let b = b.unwrap_or_else(|e| panic!("{what}: {e}"));
                    for s in &b.samples {
                        let file = std::fs::read(&ds.samples()[s.id as usize].path).unwrap();
                        assert_eq!(s.value, file, "{what}: bytes of sample {}", s.id);
                    }
                    (
                        b.epoch,
                        b.iteration,
                        b.samples.iter().map(|s| s.id).collect(),
                    )
                })
                .collect()
        })
        .collect()
}

/// Locality-aware assignment changes which rank sees which sample, nothing else: every
/// step holds the sampler's step's samples, every rank's batches are as many and as large,
/// every sample arrives with its bytes and every planned remote hit is served (a silent
/// peer's read from storage). More accesses hit the node's own cache than under the
/// sampler's split.
#[test]
fn locality_keeps_every_steps_samples_and_hits_the_own_cache_more() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    let total = ds.samples().iter().map(|s| s.size_bytes).sum::<u64>();
    let capacity = total / 5;
    let want = steps_of((0..NODES).flat_map(|node| rank_plan(ds.len(), shape(node))));
    let mut local_hits = Vec::new();
    for (assign, silent) in [
        (Assign::Sampler, None),
        (Assign::Locality, None),
        (Assign::Locality, Some(2)),
    ] {
        let what = format!("{assign:?}, silent {silent:?}");
        let nodes = InProcessNodes::connect(NODES);
        let results = run_job_with(
            &ds,
            (CachePolicy::Reuse, capacity, PeerPlanChoice::Auto, assign),
            Execution::Pipelined,
            &nodes,
            silent,
        );
        let mut ranks = Vec::new();
        let mut hits = 0;
        for (node, (g, m)) in results.into_iter().enumerate() {
            assert_eq!(
                m.peer_plan.mode,
                PeerPlanKind::Cluster,
                "{what}: {:?}",
                m.peer_plan
            );
            assert_eq!(m.assign.mode, assign, "{what}: {:?}", m.assign);
            assert_eq!(
                m.remote_hits + m.remote_misses,
                m.planned_remote_hits,
                "{what}, node {node}: {m:?}"
            );
            if silent.is_none() {
                assert_eq!(m.remote_misses, 0, "{what}, node {node}: {m:?}");
            }
            hits += m.hits;
            ranks.extend(delivered(&ds, g, &format!("{what}, node {node}")));
        }
        assert_eq!(steps_of(ranks.into_iter()), want, "{what}");
        if silent.is_none() {
            local_hits.push(hits);
        }
    }
    assert!(
        local_hits[1] > local_hits[0],
        "own-cache hits: locality {}, the sampler's split {}",
        local_hits[1],
        local_hits[0]
    );
}

/// Asked for where the nodes' caches are not planned as one, locality-aware assignment is not
/// used, and the metrics say why: each rank gets the sampler's batches.
#[test]
fn locality_without_the_cluster_plan_is_the_samplers_split_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make_dataset(dir.path(), 96, 3);
    let capacity = ds.samples().iter().map(|s| s.size_bytes).sum::<u64>() / 3;
    let nodes = InProcessNodes::connect(NODES);
    let results = run_job_with(
        &ds,
        (
            CachePolicy::Reuse,
            capacity,
            PeerPlanChoice::Node,
            Assign::Locality,
        ),
        Execution::Pipelined,
        &nodes,
        None,
    );
    for (node, (got, m)) in results.into_iter().enumerate() {
        check(&ds, got, node, "locality without the cluster plan");
        assert_eq!(m.assign.mode, Assign::Sampler);
        let why = m.assign.reason.as_deref().unwrap_or_default();
        assert!(
            why.contains("cluster plan") && why.contains("own plan"),
            "{why}"
        );
    }
}
