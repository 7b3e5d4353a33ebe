//! `lobster-bench plan-bench`: what planning costs at start-up. By default, what planning remote
//! hits costs one node: it replays every peer's cache plan to learn which peer holds each
//! of its accesses. With `--open D`, one open of dataset D as a run starts it (with
//! `--decoded`, as the decoded tier does: with every sample's image header, from the
//! dataset's table once kept). With `--decode-constants D`, the built-in decoder's time per
//! pixel of each format on D's images, the constants the two-form rule's cost model uses.
//! With `--plan cluster`, the whole job's cluster plan instead (see [`cluster`]), and with
//! `--sweep`, a grid of those, each case in its own process.

mod cluster;

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use lobster_cache::PolicyKind;
use lobster_io::{EpochOrder, PeerHolders, PeerHoldersInputs};
use lobster_testkit::gen::lognormal_sizes;

/// Which plan `lobster-bench plan-bench` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanKind {
    /// One node's plan: its own cache plan and every peer's replayed to find remote holders.
    Node,
    /// The whole job's cluster plan (every node's cache planned as one), run over every epoch
    /// of the stream; the orders are the loader's `DistributedSampler`'s.
    Cluster,
}

/// Arguments of `lobster-bench plan-bench`; the defaults are ImageNet-22k on 64 nodes.
#[derive(Debug, clap::Args)]
pub struct PlanBenchArgs {
    /// The plan to build: `node` (this node's plan and its peers' replay) or `cluster` (the
    /// job's cluster plan, reporting steady storage reads against the floor F - N*C).
    #[arg(long, value_enum, default_value_t = PlanKind::Node)]
    pub plan: PlanKind,
    /// With `--plan cluster`: the plan's mode; `auto` is the loader's rule (cluster where
    /// C*N^2 > F, else each node's own plan with peers serving what they hold).
    #[arg(long, value_enum, default_value_t = cluster::ModeChoice::Auto)]
    pub mode: cluster::ModeChoice,
    /// With `--plan cluster`: which node makes each access of a step, `sampler` (the
    /// DistributedSampler's split) or `locality` (each step's samples to the nodes holding
    /// them; cluster mode only).
    #[arg(long, value_enum, default_value_t = lobster_io::Assign::Sampler)]
    pub assign: lobster_io::Assign,
    /// Run the cluster plan over a grid (every `--sweep-samples` x `--sweep-cache-fracs` x
    /// `--sweep-nodes`), each case in a fresh process of this binary so each peak RSS is its
    /// own, and print one table (one JSON array with `--json`). Shape, epochs, sizes, seed
    /// and mode come from the other options.
    #[arg(long, conflicts_with_all = ["open", "decode_constants"])]
    pub sweep: bool,
    /// Dataset sizes of the sweep (ImageNet-1k and -22k).
    #[arg(long, value_delimiter = ',', default_value = "1281167,14197122")]
    pub sweep_samples: Vec<usize>,
    /// Node counts of the sweep.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
    pub sweep_nodes: Vec<usize>,
    /// Cache per node, as a share of the dataset's bytes, of the sweep: at 20% the floor is
    /// 0 from 5 nodes up; at 1% it stays above 0 up to 99 nodes (and 4 nodes at 1% are in
    /// local mode).
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.01")]
    pub sweep_cache_fracs: Vec<f64>,
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
    /// Time one open of this dataset (an ImageFolder or shards) instead, and print its
    /// seconds and samples; run it in a fresh process per figure.
    #[arg(long, conflicts_with = "decode_constants")]
    pub open: Option<String>,
    /// With `--open`: also every sample's image header, as the decoded tier asks it.
    #[arg(long, requires = "open")]
    pub decoded: bool,
    /// Time the built-in decoder per pixel on the JPEG and PNG files under this directory
    /// (at most 400 of each, held in memory) instead.
    #[arg(long)]
    pub decode_constants: Option<std::path::PathBuf>,
    /// Runs of `--decode-constants`; the median is printed.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
}

pub fn run(args: &PlanBenchArgs) -> Result<()> {
    if let Some(data) = &args.open {
        return open(data, args.decoded);
    }
    if let Some(dir) = &args.decode_constants {
        return decode_constants(dir, args.runs);
    }
    if args.sweep || args.plan == PlanKind::Cluster {
        return run_cluster(args);
    }
    if !(0.0..=1.0).contains(&args.cache_frac) {
        anyhow::bail!("--cache-frac {}: expected 0 to 1", args.cache_frac);
    }
    let sizes: Arc<[u32]> = lognormal_sizes(args.samples, args.median_kb * 1024.0, 0.5, 7).into();
    let dataset_bytes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let inputs = PeerHoldersInputs {
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
    let plan = PeerHolders::build(&inputs, args.node)?;
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

/// The cluster plan: one case, or a sweep of them.
fn run_cluster(args: &PlanBenchArgs) -> Result<()> {
    anyhow::ensure!(
        args.policy == PolicyKind::Reuse,
        "the cluster plan runs the reuse policy on every node, not {}",
        args.policy
    );
    let case = cluster::Case {
        samples: args.samples,
        median_kb: args.median_kb,
        nodes: args.nodes,
        ranks_per_node: args.ranks_per_node,
        batch_size: args.batch_size,
        epochs: args.epochs,
        cache_frac: args.cache_frac,
        seed: args.seed,
        mode: args.mode,
        assign: args.assign,
    };
    if args.sweep {
        let sweep = cluster::Sweep {
            samples: args.sweep_samples.clone(),
            nodes: args.sweep_nodes.clone(),
            cache_fracs: args.sweep_cache_fracs.clone(),
            base: case,
        };
        return cluster::run_sweep(&sweep, args.json);
    }
    let report = cluster::run_case(&case)?;
    match args.json {
        true => println!("{}", serde_json::to_string(&report)?),
        false => cluster::print_case(&report),
    }
    Ok(())
}

/// One open of `data`, timed: `<seconds>\t<samples>\t<samples with a header>`.
fn open(data: &str, decoded: bool) -> Result<()> {
    let started = Instant::now();
    let ds = lobster_io::Dataset::open(data)?;
    let headers = match decoded {
        true => ds
            .image_probes()
            .iter()
            .filter(|p| p.dimensions().is_some())
            .count(),
        false => 0,
    };
    let seconds = started.elapsed().as_secs_f64();
    println!("{seconds}\t{}\t{headers}", ds.len());
    Ok(())
}

/// Files of each format decoded per run.
const DECODE_FILES_MAX: usize = 400;

/// The built-in decoder's nanoseconds per pixel on the JPEGs and PNGs under `dir`.
fn decode_constants(dir: &std::path::Path, runs: usize) -> Result<()> {
    anyhow::ensure!(runs >= 1, "--runs must be at least 1");
    let mut formats: [(&str, Vec<Vec<u8>>); 2] = [("jpeg", Vec::new()), ("png", Vec::new())];
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d)?.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let Ok(bytes) = std::fs::read(&p) else {
                continue;
            };
            let at = match bytes.first() {
                Some(0xFF) => 0,
                Some(0x89) => 1,
                _ => continue,
            };
            if formats[at].1.len() < DECODE_FILES_MAX && lobster_image::decode(&bytes).is_ok() {
                formats[at].1.push(bytes);
            }
        }
    }
    for (name, files) in &formats {
        if files.is_empty() {
            println!("{name}: no files");
            continue;
        }
        let mut per_pixel = Vec::with_capacity(runs);
        let mut pixels = 0u64;
        for _ in 0..runs {
            let started = Instant::now();
            pixels = 0;
            for f in files {
                let image = lobster_image::decode(f)?;
                pixels += u64::from(image.width()) * u64::from(image.height());
            }
            per_pixel.push(started.elapsed().as_secs_f64() * 1e9 / pixels as f64);
        }
        per_pixel.sort_by(f64::total_cmp);
        println!(
            "{name}: {} files, {pixels} pixels a run, {:.3} ns per pixel (median of {runs}; runs {:?})",
            files.len(),
            per_pixel[runs / 2],
            per_pixel.iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>()
        );
        if *name == "jpeg" {
            scaled_shares(files, runs)?;
        }
    }
    Ok(())
}

/// What a JPEG's whole decode at each coarser DCT scale (the decoded tier's decode of an
/// image it keeps brought down to a side) takes, over its decode at full scale, on the same
/// files in the same run: the medians over `runs` runs, each scale timed beside a full
/// decode.
fn scaled_shares(files: &[Vec<u8>], runs: usize) -> Result<()> {
    let time = |scale: u32| -> Result<f64> {
        let mut out = Vec::new();
        let started = Instant::now();
        for f in files {
            let (width, height) = lobster_image::dimensions(f)
                .ok_or_else(|| anyhow::anyhow!("a JPEG without a readable header"))?;
            let whole = lobster_image::Region {
                left: 0,
                top: 0,
                width,
                height,
            };
            lobster_image::decode_region_into(f, u64::MAX, whole, scale, &mut out, 0)?;
        }
        Ok(started.elapsed().as_secs_f64())
    };
    for scale in [2, 4, 8] {
        let mut shares = Vec::with_capacity(runs);
        for _ in 0..runs {
            let full = time(1)?;
            shares.push(time(scale)? / full);
        }
        shares.sort_by(f64::total_cmp);
        println!(
            "jpeg at 1/{scale}: {:.3} of the full-scale decode (median of {runs}; runs {:?})",
            shares[runs / 2],
            shares
                .iter()
                .map(|x| (x * 1000.0).round() / 1000.0)
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}
