//! `lobster plan-bench`: what planning remote hits costs one node at start-up: it replays
//! every peer's cache plan to learn which peer holds each of its accesses.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use lobster_io::cache::{gen::lognormal_sizes, PolicyKind};
use lobster_io::{EpochOrder, PeerPlan, PeerPlanInputs};

/// Arguments of `lobster plan-bench`; the defaults are ImageNet-22k on 64 nodes.
#[derive(Debug, clap::Args)]
pub struct PlanBenchArgs {
    /// Samples in the dataset (ImageNet-22k: 14.2 M).
    #[arg(long, default_value_t = 14_200_000)]
    pub samples: usize,
    /// Median sample size in KiB (log-normal sizes, sigma 0.5).
    #[arg(long, default_value_t = 110.0)]
    pub median_kb: f64,
    #[arg(long, default_value_t = 64)]
    pub nodes: usize,
    #[arg(long, default_value_t = 8)]
    pub ranks_per_node: usize,
    #[arg(long, visible_alias = "batch", default_value_t = 32)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 3)]
    pub epochs: u32,
    /// Each node's cache, as a share of the dataset's bytes.
    #[arg(long, default_value_t = 0.1)]
    pub cache_frac: f64,
    /// Cache policy every node runs: reuse, static or lru.
    #[arg(long, default_value = "reuse")]
    pub policy: PolicyKind,
    /// Steps a holder must keep a sample on either side of the access.
    #[arg(long, default_value_t = 4)]
    pub margin_steps: u64,
    /// The node whose plan is built.
    #[arg(long, default_value_t = 0)]
    pub node: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &PlanBenchArgs) -> Result<()> {
    if !(0.0..=1.0).contains(&args.cache_frac) {
        anyhow::bail!("--cache-frac {}: expected 0 to 1", args.cache_frac);
    }
    let sizes: Arc<[u32]> = lognormal_sizes(args.samples, args.median_kb * 1024.0, 0.5, 7).into();
    let dataset_bytes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let inputs = PeerPlanInputs {
        sizes,
        nodes: args.nodes,
        ranks_per_node: args.ranks_per_node,
        batch_size: args.batch_size,
        epochs: args.epochs,
        order: EpochOrder::Shuffle { seed: args.seed },
        drop_last: false,
        policy: args.policy,
        capacity_bytes: (dataset_bytes as f64 * args.cache_frac) as u64,
        margin_steps: args.margin_steps,
    };
    let started = Instant::now();
    let plan = PeerPlan::build(&inputs, args.node)?;
    let seconds = started.elapsed().as_secs_f64();
    let per_sample = |b: usize| b as f64 / args.samples as f64;
    let out = serde_json::json!({
        "samples": args.samples,
        "dataset_bytes": dataset_bytes,
        "nodes": args.nodes,
        "ranks_per_node": args.ranks_per_node,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "cache_frac": args.cache_frac,
        "policy": args.policy.as_str(),
        "margin_steps": args.margin_steps,
        "node": args.node,
        "accesses": plan.accesses(),
        "planned_remote": plan.planned(),
        "plan_bytes": plan.memory_bytes(),
        "plan_bytes_per_sample": per_sample(plan.memory_bytes()),
        "build_peak_bytes": plan.build_peak_bytes(),
        "build_peak_bytes_per_sample": per_sample(plan.build_peak_bytes()),
        "build_seconds": seconds,
        "replay_threads": plan.replay_threads(),
    });
    if args.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "{} samples ({:.1} GiB), {} nodes x {} ranks, batch {}, {} epochs, {} cache of {:.0}% per node",
        args.samples,
        dataset_bytes as f64 / f64::from(1u32 << 30),
        args.nodes,
        args.ranks_per_node,
        args.batch_size,
        args.epochs,
        args.policy,
        100.0 * args.cache_frac
    );
    println!(
        "node {}: {} accesses, {} with a peer holder ({:.1}%)",
        args.node,
        plan.accesses(),
        plan.planned(),
        100.0 * plan.planned() as f64 / plan.accesses().max(1) as f64
    );
    println!(
        "plan held while running: {} bytes ({:.3} bytes per sample)",
        plan.memory_bytes(),
        per_sample(plan.memory_bytes())
    );
    println!(
        "build peak: {:.0} MiB ({:.1} bytes per sample); start-up {:.1} s on {} threads",
        plan.build_peak_bytes() as f64 / f64::from(1u32 << 20),
        per_sample(plan.build_peak_bytes()),
        seconds,
        plan.replay_threads()
    );
    Ok(())
}
