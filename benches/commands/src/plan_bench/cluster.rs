//! `lobster-bench plan-bench --plan cluster`: the whole job's cluster plan (every node's cache
//! planned as one, `lobster_cache::ClusterPlanner`) built and run over every epoch of the
//! stream, as a loader of the job plans it at start-up; steady-state storage reads set
//! against the floor `max(0, F - N*C)` per epoch, with the plan's CPU time and the process's
//! peak memory. `--sweep` runs a grid of such cases, each in a fresh child process (this
//! binary again) so that each peak RSS is the case's own.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use lobster_cache::{
    Assign, ClusterConfig, ClusterLayout, ClusterPlanner, ClusterStats, PeerPlanKind,
};
use lobster_io::{DistributedSampler, EpochOrder, SamplerOrders};
use lobster_testkit::gen::lognormal_sizes;
use serde::{Deserialize, Serialize};

/// Which mode the cluster plan runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeChoice {
    /// The loader's rule: local where `C * N^2 <= F`, cluster otherwise.
    Auto,
    /// One plan over the global stream whatever the sizes.
    Cluster,
    /// Each node's own Belady plan, peers serving what they happen to hold.
    Local,
}

/// One case of the cluster plan.
#[derive(Clone, Debug)]
pub struct Case {
    pub samples: usize,
    pub median_kb: f64,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub batch_size: usize,
    pub epochs: u32,
    pub cache_frac: f64,
    pub seed: u64,
    pub mode: ModeChoice,
    pub assign: Assign,
}

/// What one case measured; the sweep's children print it as JSON for the parent.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub samples: usize,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub batch_size: usize,
    pub epochs: u32,
    pub cache_frac: f64,
    /// "cluster" or "local".
    pub mode: String,
    /// Whether the mode came from the `C * N^2` rule (else it was forced: by `--mode`, or by
    /// `--assign locality`, which needs cluster mode).
    pub mode_auto: bool,
    /// Which node made each access of a step: "sampler" or "locality".
    pub assign: Assign,
    pub dataset_bytes: u64,
    pub capacity_bytes_per_node: u64,
    pub floor_bytes_per_epoch: u64,
    /// The floor as a share of the dataset's bytes.
    pub floor_frac: f64,
    pub first_epoch_storage_bytes: u64,
    /// Mean over the epochs after the first.
    pub steady_storage_bytes_per_epoch: f64,
    /// The fewest and most storage bytes of one steady epoch.
    pub steady_storage_bytes_min: u64,
    pub steady_storage_bytes_max: u64,
    /// Steady storage bytes per epoch over the floor; `None` where the floor is 0.
    pub storage_over_floor: Option<f64>,
    pub steady_accesses: u64,
    pub steady_bytes: u64,
    /// Shares of the steady accesses, by count.
    pub storage_frac_accesses: f64,
    /// Shares of the steady accesses' bytes.
    pub storage_frac_bytes: f64,
    pub local_hit_frac_bytes: f64,
    pub remote_hit_frac_bytes: f64,
    /// Building the plan and running it to the end: CPU of the planning thread, and wall.
    pub plan_cpu_seconds: f64,
    pub plan_wall_seconds: f64,
    /// The plan's own heap at its peak (as it counts it).
    pub plan_peak_bytes: u64,
    pub plan_peak_bytes_per_sample: f64,
    /// The process's peak resident set (VmHWM): the size table, the orders and the plan.
    pub peak_rss_bytes: u64,
    pub peak_rss_bytes_per_sample: f64,
    /// The process that ran the case (the sweep runs each in its own).
    pub process_id: u32,
}

/// This thread's CPU time (utime + stime from procfs, in ticks of 10 ms), so that other
/// processes on a shared machine do not count.
fn thread_cpu() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").context("procfs")?;
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let tick = |i: usize| -> Result<u64> {
        let field = fields.get(i).context("thread stat: too few fields")?;
        Ok(field.parse()?)
    };
    Ok(Duration::from_millis((tick(11)? + tick(12)?) * 10))
}

/// The process's peak resident set (VmHWM), in bytes.
fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status").context("procfs")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .context("no VmHWM in /proc/self/status")?;
    Ok(kb.parse::<u64>()? * 1024)
}

fn mode_name(mode: PeerPlanKind) -> &'static str {
    match mode {
        PeerPlanKind::Cluster => "cluster",
        PeerPlanKind::Node => "local",
    }
}

/// Builds the job's plan for `case`, runs it over every epoch and reports.
pub fn run_case(case: &Case) -> Result<Report> {
    ensure!(
        case.epochs >= 2,
        "--epochs {}: the cluster plan's steady state is every epoch after the first, so at least 2",
        case.epochs
    );
    ensure!(
        (0.0..=1.0).contains(&case.cache_frac),
        "--cache-frac {}: expected 0 to 1",
        case.cache_frac
    );
    let sizes: Arc<[u32]> = lognormal_sizes(case.samples, case.median_kb * 1024.0, 0.5, 7).into();
    let dataset_bytes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let capacity_bytes = (dataset_bytes as f64 * case.cache_frac) as u64;
    let world = case.nodes * case.ranks_per_node;
    let sampler = DistributedSampler::new(
        case.samples,
        world,
        false,
        EpochOrder::Shuffle { seed: case.seed },
    )?;
    let order_len = sampler.per_rank() * world;
    let orders = SamplerOrders::new(sampler, case.epochs);
    let config = ClusterConfig {
        mode: match case.mode {
            ModeChoice::Auto => None,
            ModeChoice::Cluster => Some(PeerPlanKind::Cluster),
            ModeChoice::Local => Some(PeerPlanKind::Node),
        },
        batch_accesses_max: None,
        assign: case.assign,
        // The floor counts storage reads; rerouting remote hits only adds to them.
        prices: None,
    };

    let (cpu0, wall0) = (thread_cpu()?, Instant::now());
    let layout = ClusterLayout::new(
        orders,
        order_len,
        case.nodes,
        case.ranks_per_node,
        case.batch_size,
    )?;
    let mut planner = ClusterPlanner::with_config(layout, sizes, capacity_bytes, config)?;
    let stats = planner.run_to_end()?;
    let (cpu, wall) = (thread_cpu()? - cpu0, wall0.elapsed());
    let peak_rss = peak_rss_bytes()?;
    Ok(report(
        case,
        &stats,
        planner.mode(),
        capacity_bytes,
        Measured {
            cpu,
            wall,
            plan_peak_bytes: planner.peak_memory_bytes() as u64,
            peak_rss_bytes: peak_rss,
        },
    ))
}

/// Costs measured around the plan.
struct Measured {
    cpu: Duration,
    wall: Duration,
    plan_peak_bytes: u64,
    peak_rss_bytes: u64,
}

fn report(
    case: &Case,
    stats: &ClusterStats,
    mode: PeerPlanKind,
    capacity_bytes: u64,
    m: Measured,
) -> Report {
    let steady = stats.since(1);
    let steady_epochs = stats.epochs() - 1;
    let per_epoch: Vec<u64> = (1..stats.epochs())
        .map(|e| stats.epoch(e).storage_bytes)
        .collect();
    let mean = steady.storage_bytes as f64 / f64::from(steady_epochs);
    let floor = stats.floor_bytes_per_epoch();
    let share = |part: u64, whole: u64| part as f64 / whole.max(1) as f64;
    let per_sample = |b: u64| b as f64 / case.samples as f64;
    Report {
        samples: case.samples,
        nodes: case.nodes,
        ranks_per_node: case.ranks_per_node,
        batch_size: case.batch_size,
        epochs: case.epochs,
        cache_frac: case.cache_frac,
        mode: mode_name(mode).to_owned(),
        // Locality needs cluster mode: where the rule says local, it forces it.
        mode_auto: case.mode == ModeChoice::Auto
            && mode == PeerPlanKind::auto(stats.dataset_bytes(), case.nodes, capacity_bytes),
        assign: case.assign,
        dataset_bytes: stats.dataset_bytes(),
        capacity_bytes_per_node: capacity_bytes,
        floor_bytes_per_epoch: floor,
        floor_frac: share(floor, stats.dataset_bytes()),
        first_epoch_storage_bytes: stats.epoch(0).storage_bytes,
        steady_storage_bytes_per_epoch: mean,
        steady_storage_bytes_min: per_epoch.iter().copied().min().unwrap_or(0),
        steady_storage_bytes_max: per_epoch.iter().copied().max().unwrap_or(0),
        storage_over_floor: (floor > 0).then(|| mean / floor as f64),
        steady_accesses: steady.accesses(),
        steady_bytes: steady.bytes(),
        storage_frac_accesses: share(steady.storage_reads, steady.accesses()),
        storage_frac_bytes: share(steady.storage_bytes, steady.bytes()),
        local_hit_frac_bytes: share(steady.local_hit_bytes, steady.bytes()),
        remote_hit_frac_bytes: share(steady.remote_hit_bytes, steady.bytes()),
        plan_cpu_seconds: m.cpu.as_secs_f64(),
        plan_wall_seconds: m.wall.as_secs_f64(),
        plan_peak_bytes: m.plan_peak_bytes,
        plan_peak_bytes_per_sample: per_sample(m.plan_peak_bytes),
        peak_rss_bytes: m.peak_rss_bytes,
        peak_rss_bytes_per_sample: per_sample(m.peak_rss_bytes),
        process_id: std::process::id(),
    }
}

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

fn ratio_text(r: &Report) -> String {
    r.storage_over_floor
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.5}"))
}

fn mode_text(r: &Report) -> String {
    let assign = match r.assign {
        Assign::Sampler => "",
        Assign::Locality => ", locality",
    };
    match r.mode_auto {
        true => format!("{}{assign}", r.mode),
        false => format!("{} (forced){assign}", r.mode),
    }
}

/// The text report of one case.
pub fn print_case(r: &Report) {
    println!(
        "cluster plan: {} samples ({:.1} GiB = F), {} nodes x {} ranks, batch {}, {} epochs, \
         cache {:.1}% of F per node ({} bytes); orders: the loader's DistributedSampler \
         (shuffled, seeded), sizes log-normal",
        r.samples,
        r.dataset_bytes as f64 / GIB,
        r.nodes,
        r.ranks_per_node,
        r.batch_size,
        r.epochs,
        100.0 * r.cache_frac,
        r.capacity_bytes_per_node
    );
    println!("mode: {} (rule: cluster where C x N^2 > F)", mode_text(r));
    println!(
        "floor F - N x C: {} bytes per epoch ({:.4} of F)",
        r.floor_bytes_per_epoch, r.floor_frac
    );
    println!(
        "storage per steady epoch (epochs 1-{}): {:.0} bytes (min {}, max {}); over the floor: {}; \
         first epoch {} bytes",
        r.epochs - 1,
        r.steady_storage_bytes_per_epoch,
        r.steady_storage_bytes_min,
        r.steady_storage_bytes_max,
        ratio_text(r),
        r.first_epoch_storage_bytes
    );
    println!(
        "steady accesses from storage: {:.4} of accesses, {:.4} of bytes (local hits {:.4}, \
         remote hits {:.4} of bytes)",
        r.storage_frac_accesses,
        r.storage_frac_bytes,
        r.local_hit_frac_bytes,
        r.remote_hit_frac_bytes
    );
    println!(
        "build + run: {:.1} s CPU of the planning thread, {:.1} s wall",
        r.plan_cpu_seconds, r.plan_wall_seconds
    );
    println!(
        "memory: peak RSS {:.0} MiB ({:.1} bytes per sample), plan peak {:.0} MiB ({:.1} bytes \
         per sample)",
        r.peak_rss_bytes as f64 / MIB,
        r.peak_rss_bytes_per_sample,
        r.plan_peak_bytes as f64 / MIB,
        r.plan_peak_bytes_per_sample
    );
}

/// The grid `--sweep` runs.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub samples: Vec<usize>,
    pub nodes: Vec<usize>,
    pub cache_fracs: Vec<f64>,
    /// Shape and sizes every case shares (its `samples`, `nodes` and `cache_frac` unused).
    pub base: Case,
}

fn mode_arg(mode: ModeChoice) -> &'static str {
    match mode {
        ModeChoice::Auto => "auto",
        ModeChoice::Cluster => "cluster",
        ModeChoice::Local => "local",
    }
}

fn assign_arg(assign: Assign) -> &'static str {
    match assign {
        Assign::Sampler => "sampler",
        Assign::Locality => "locality",
    }
}

/// Runs `case` in a fresh process of this binary and reads its JSON report.
fn run_child(case: &Case) -> Result<Report> {
    let exe = std::env::current_exe().context("this binary's path")?;
    let out = Command::new(exe)
        .args(["plan-bench", "--plan", "cluster", "--json"])
        .args(["--samples", &case.samples.to_string()])
        .args(["--median-kb", &case.median_kb.to_string()])
        .args(["--nodes", &case.nodes.to_string()])
        .args(["--ranks-per-node", &case.ranks_per_node.to_string()])
        .args(["--batch-size", &case.batch_size.to_string()])
        .args(["--epochs", &case.epochs.to_string()])
        .args(["--cache-frac", &case.cache_frac.to_string()])
        .args(["--seed", &case.seed.to_string()])
        .args(["--mode", mode_arg(case.mode)])
        .args(["--assign", assign_arg(case.assign)])
        .output()
        .context("run a case")?;
    if !out.status.success() {
        bail!(
            "case of {} samples, {} nodes, cache {}: {}; {}",
            case.samples,
            case.nodes,
            case.cache_frac,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("a case's JSON report")
}

/// Runs every case of `sweep`, one child process each, and prints one table (or, with
/// `json`, one JSON array).
pub fn run_sweep(sweep: &Sweep, json: bool) -> Result<()> {
    ensure!(
        !sweep.samples.is_empty() && !sweep.nodes.is_empty() && !sweep.cache_fracs.is_empty(),
        "--sweep needs at least one value of --sweep-samples, --sweep-nodes and --sweep-cache-fracs"
    );
    let b = &sweep.base;
    if !json {
        println!(
            "cluster plan sweep: {} ranks per node, batch {}, {} epochs (steady: epochs 1-{}), \
             cache per node {} of F, mode {}, assign {}; sizes log-normal, median {} KiB; each case in its \
             own process; CPU is the planning thread's",
            b.ranks_per_node,
            b.batch_size,
            b.epochs,
            b.epochs.saturating_sub(1),
            sweep
                .cache_fracs
                .iter()
                .map(|f| format!("{}%", 100.0 * f))
                .collect::<Vec<_>>()
                .join(" and "),
            mode_arg(b.mode),
            assign_arg(b.assign),
            b.median_kb
        );
        println!(
            "| samples | nodes | cache/node | mode | floor/F | storage B/steady epoch | \
             storage/floor | storage (accesses) | storage (bytes) | local hits | remote hits | \
             build+run CPU s (wall) | peak RSS MiB (B/sample) | plan peak B/sample |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
    let mut reports = Vec::new();
    for &samples in &sweep.samples {
        for &cache_frac in &sweep.cache_fracs {
            for &nodes in &sweep.nodes {
                let case = Case {
                    samples,
                    nodes,
                    cache_frac,
                    ..b.clone()
                };
                let r = run_child(&case)?;
                if !json {
                    println!(
                        "| {} | {} | {}% | {} | {:.4} | {:.0} | {} | {:.4} | {:.4} | {:.4} | \
                         {:.4} | {:.1} ({:.1}) | {:.0} ({:.1}) | {:.1} |",
                        r.samples,
                        r.nodes,
                        100.0 * r.cache_frac,
                        mode_text(&r),
                        r.floor_frac,
                        r.steady_storage_bytes_per_epoch,
                        ratio_text(&r),
                        r.storage_frac_accesses,
                        r.storage_frac_bytes,
                        r.local_hit_frac_bytes,
                        r.remote_hit_frac_bytes,
                        r.plan_cpu_seconds,
                        r.plan_wall_seconds,
                        r.peak_rss_bytes as f64 / MIB,
                        r.peak_rss_bytes_per_sample,
                        r.plan_peak_bytes_per_sample
                    );
                }
                reports.push(r);
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string(&reports)?);
    }
    Ok(())
}
