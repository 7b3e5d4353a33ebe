//! The cluster plan at ImageNet scale: steady-state storage reads against the floor, beside
//! per-node Belady, with the plan's build time and memory.
//!
//! `cargo run --release -p lobster-cache --example cluster_scale -- [RUNS_1K] [RANKS] [BATCH]
//! [EPOCHS] [SETS]`
//!
//! Each case runs in a child process of its own (`--case SET NODES FRACTION MODE RANKS BATCH
//! EPOCHS`), so its peak RSS is its own. The job: a seeded permutation of the dataset per
//! epoch (default 3 epochs), split over `nodes * RANKS` ranks as PyTorch's `DistributedSampler` (the loader's
//! sampler lives in the facade, which this crate cannot use), batches of `BATCH`; log-normal
//! sizes of mean about 110 KB. Steady state is every epoch after the first (which starts
//! cold). `SETS`: `1k,22k` by default.
//!
//! `cluster_scale --margin SET NODES FRACTION MARGIN_STEPS [RANKS] [BATCH]`: how many remote
//! hits a loader whose nodes drift up to `MARGIN_STEPS` apart could not serve as planned.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lobster_cache::{
    ClusterConfig, ClusterLayout, ClusterPlanner, PeerPlanKind, Planner, PolicyKind, StreamSource,
    VecSource,
};
use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};

/// Median of the log-normal sizes; with sigma 0.5 the mean is 1.133 times it: 110 KB.
const MEDIAN_BYTES: f64 = 97_100.0;
const SIGMA: f64 = 0.5;

fn samples_of(set: &str) -> u32 {
    match set {
        "1k" => 1_281_167,
        "22k" => 14_197_122,
        "small" => 50_000,
        _ => panic!("dataset {set}: 1k, 22k or small"),
    }
}

/// This thread's CPU time (utime + stime from procfs, in ticks of 10 ms), so other processes
/// on the shared machine do not count.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("procfs");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .expect("stat has a )")
        .split_whitespace()
        .collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// The process's peak resident set (VmHWM), in bytes.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .expect("a value")
        .parse()
        .expect("kB");
    kb * 1024
}

/// One case, printed as one tab-separated line for the parent.
fn run_case(
    set: &str,
    nodes: usize,
    fraction: f64,
    mode: &str,
    ranks: usize,
    batch: usize,
    epochs: u32,
) {
    let n = samples_of(set);
    let sizes: Arc<[u32]> = lognormal_sizes(n as usize, MEDIAN_BYTES, SIGMA, 2022).into();
    let dataset: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let capacity = (dataset as f64 * fraction) as u64;
    let shuffle = ShuffledStream {
        num_samples: n,
        epochs,
        nodes: 1,
        node: 0,
        seed: 7,
    };
    // The orders drawn once and held, as the loader's peer plan does (4 bytes per sample per
    // epoch).
    let orders: Vec<Vec<u32>> = (0..epochs)
        .map(|e| {
            let mut v = Vec::new();
            shuffle.fill_epoch(e, &mut v);
            v
        })
        .collect();
    let orders = Arc::new(VecSource::new(orders));
    let layout =
        ClusterLayout::new(orders.clone(), n as usize, nodes, ranks, batch).expect("layout");
    let config = ClusterConfig {
        mode: match mode {
            "auto" => None,
            "cluster" => Some(PeerPlanKind::Cluster),
            "local" => Some(PeerPlanKind::Node),
            _ => panic!("mode {mode}: auto, cluster or local"),
        },
        batch_accesses_max: None,
        ..ClusterConfig::default()
    };
    let (cpu0, wall0) = (thread_cpu(), Instant::now());
    let mut planner =
        ClusterPlanner::with_config(layout.clone(), sizes.clone(), capacity, config).expect("plan");
    let stats = planner.run_to_end().expect("plan");
    let (cpu, wall) = (thread_cpu() - cpu0, wall0.elapsed());
    let rss = peak_rss_bytes();
    let plan_peak = planner.peak_memory_bytes();
    let used_mode = planner.mode();
    drop(planner);

    let steady = stats.since(1);
    let steady_bytes = steady.bytes() as f64;
    let floor = stats.floor_bytes_per_epoch() as f64 * f64::from(epochs - 1);

    // Per-node Belady alone: each node's own planner, one after another, no peers.
    let (cpu1, wall1) = (thread_cpu(), Instant::now());
    let mut alone_storage = 0u64;
    let mut evicted = Vec::new();
    for a in 0..nodes {
        let mut p = Planner::new(layout.node(a), sizes.clone(), capacity, PolicyKind::Reuse)
            .expect("per-node plan");
        while let Some(d) = p.next(&mut evicted).expect("per-node plan") {
            if d.epoch >= 1 && !d.hit {
                alone_storage += u64::from(d.size_bytes);
            }
        }
    }
    let alone_cpu = thread_cpu() - cpu1;
    let alone_wall = wall1.elapsed();
    // Per-node Belady with peers serving what they hold (local mode), where its per-node
    // indexes fit (about 6 bytes per sample per node).
    let with_peers = if u64::from(n) * nodes as u64 <= 64_000_000 && used_mode != PeerPlanKind::Node
    {
        let config = ClusterConfig {
            mode: Some(PeerPlanKind::Node),
            batch_accesses_max: None,
            ..ClusterConfig::default()
        };
        let s = ClusterPlanner::with_config(layout, sizes, capacity, config)
            .expect("local plan")
            .run_to_end()
            .expect("local plan");
        format!("{:.4}", s.since(1).storage_bytes as f64 / steady_bytes)
    } else if used_mode == PeerPlanKind::Node {
        format!("{:.4}", steady.storage_bytes as f64 / steady_bytes)
    } else {
        "-".to_owned()
    };
    println!(
        "ROW\t{set}\t{nodes}\t{fraction}\t{mode}\t{used_mode:?}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{with_peers}\t{:.3}\t{:.3}\t{:.3}\t{:.3}\t{}\t{}\t{}",
        steady.storage_bytes,
        floor,
        steady_bytes,
        steady.local_hit_bytes,
        steady.remote_hit_bytes,
        dataset,
        alone_storage,
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        alone_cpu.as_secs_f64(),
        alone_wall.as_secs_f64(),
        plan_peak,
        rss,
        n,
    );
}

/// Remote hits a loader can serve when nodes drift up to `margin` steps apart: the holder
/// admitted the sample more than `margin` steps before the access and drops it more than
/// `margin` steps after (the latest remote hit of each sample is checked at its eviction).
fn run_margin(set: &str, nodes: usize, fraction: f64, margin: u64, ranks: usize, batch: usize) {
    let n = samples_of(set);
    let sizes: Arc<[u32]> = lognormal_sizes(n as usize, MEDIAN_BYTES, SIGMA, 2022).into();
    let dataset: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let shuffle = ShuffledStream {
        num_samples: n,
        epochs: 3,
        nodes: 1,
        node: 0,
        seed: 7,
    };
    let layout = ClusterLayout::new(shuffle, n as usize, nodes, ranks, batch).expect("layout");
    let config = ClusterConfig {
        mode: Some(PeerPlanKind::Cluster),
        batch_accesses_max: None,
        ..ClusterConfig::default()
    };
    let capacity = (dataset as f64 * fraction) as u64;
    let mut planner =
        ClusterPlanner::with_config(layout.clone(), sizes, capacity, config).expect("plan");
    let mut since = vec![u64::MAX; n as usize];
    let mut last_remote: Vec<(u64, u32)> = vec![(u64::MAX, 0); n as usize];
    let (mut remote, mut late_start, mut early_end) = (0u64, 0u64, 0u64);
    let mut evicted = Vec::new();
    while let Some(d) = planner.next(&mut evicted).expect("plan") {
        let step = layout.step_at(d.position);
        let s = d.sample as usize;
        if let lobster_cache::Served::Remote(_) = d.served {
            remote += u64::from(d.size_bytes);
            if since[s] + margin >= step {
                late_start += u64::from(d.size_bytes);
            } else {
                last_remote[s] = (step, d.size_bytes);
            }
        }
        for &(e, _) in &evicted {
            let (t, b) = last_remote[e as usize];
            if e != d.sample && t != u64::MAX && t + margin >= step {
                early_end += u64::from(b);
            }
            last_remote[e as usize] = (u64::MAX, 0);
            since[e as usize] = u64::MAX;
        }
        if d.served == lobster_cache::Served::Storage && d.kept_at.is_some() {
            since[s] = step;
        }
    }
    println!(
        "| {set} | {nodes} | {:.0}% | {margin} | {:.4} | {:.5} | {:.5} |",
        fraction * 100.0,
        remote as f64 / planner.stats().total().bytes() as f64,
        late_start as f64 / remote.max(1) as f64,
        early_end as f64 / remote.max(1) as f64,
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--case") {
        let a = &args[1..];
        run_case(
            &a[0],
            a[1].parse().expect("NODES"),
            a[2].parse().expect("FRACTION"),
            &a[3],
            a[4].parse().expect("RANKS"),
            a[5].parse().expect("BATCH"),
            a[6].parse().expect("EPOCHS"),
        );
        return;
    }
    if args.first().map(String::as_str) == Some("--margin") {
        let a = &args[1..];
        println!("| dataset | nodes | cache/node | margin steps | remote hits (of all bytes) | holder admitted within the margin before | holder drops within the margin after |");
        println!("|---|---|---|---|---|---|---|");
        run_margin(
            &a[0],
            a[1].parse().expect("NODES"),
            a[2].parse().expect("FRACTION"),
            a[3].parse().expect("MARGIN"),
            a.get(4).map_or(8, |s| s.parse().expect("RANKS")),
            a.get(5).map_or(32, |s| s.parse().expect("BATCH")),
        );
        return;
    }
    let runs_1k: usize = args.first().map_or(3, |s| s.parse().expect("RUNS_1K"));
    let ranks: usize = args.get(1).map_or(8, |s| s.parse().expect("RANKS"));
    let batch: usize = args.get(2).map_or(32, |s| s.parse().expect("BATCH"));
    let epochs: u32 = args.get(3).map_or(3, |s| s.parse().expect("EPOCHS"));
    let sets = args.get(4).map_or("1k,22k", String::as_str);
    let mut cases = Vec::new();
    for set in sets.split(',') {
        for nodes in [4usize, 16, 64] {
            cases.push((set, nodes, 0.15, "auto"));
        }
        cases.push((set, 4, 0.20, "auto"));
        cases.push((set, 4, 0.05, "auto"));
        cases.push((set, 4, 0.05, "cluster"));
    }
    let exe = std::env::current_exe().expect("own path");
    println!(
        "cluster plan, {epochs} epochs, {ranks} ranks per node, batch {batch}; steady state = \
         epochs 1-{}; fractions of the bytes accessed; times are CPU seconds of the plan's \
         thread (median of the runs; the machine is shared)",
        epochs - 1
    );
    println!(
        "| dataset | nodes | cache/node | mode | storage | floor | storage/floor | local hits | \
         remote hits | per-node Belady alone | per-node + peers | build CPU s (wall) | runs | \
         plan peak B/sample | RSS peak B/sample | per-node alone CPU s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (set, nodes, fraction, mode) in cases {
        let runs = if set == "1k" { runs_1k } else { 1 };
        let mut rows: Vec<Vec<String>> = Vec::new();
        for _ in 0..runs {
            let out = Command::new(&exe)
                .args([
                    "--case",
                    set,
                    &nodes.to_string(),
                    &fraction.to_string(),
                    mode,
                    &ranks.to_string(),
                    &batch.to_string(),
                    &epochs.to_string(),
                ])
                .output()
                .expect("run a case");
            assert!(
                out.status.success(),
                "case failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find(|l| l.starts_with("ROW\t"))
                .expect("a row");
            rows.push(line.split('\t').skip(1).map(str::to_owned).collect());
        }
        let col = |i: usize| -> Vec<f64> {
            rows.iter()
                .map(|r| r[i].parse().expect("a number"))
                .collect()
        };
        // Decisions are deterministic: every run must count the same bytes.
        assert!(
            rows.iter().all(|r| r[5..13] == rows[0][5..13]),
            "runs disagree"
        );
        let r = &rows[0];
        let f = |i: usize| -> f64 { r[i].parse().expect("a number") };
        let (storage, floor, accessed) = (f(5), f(6), f(7));
        let ratio = if floor > 0.0 {
            format!("{:.3}", storage / floor)
        } else {
            "- (floor 0)".to_owned()
        };
        let n = f(19);
        let mode_label = if r[3] == "auto" {
            r[4].to_lowercase()
        } else {
            format!("{} (forced)", r[4].to_lowercase())
        };
        println!(
            "| {set} | {nodes} | {:.0}% | {mode_label} | {:.4} | {:.4} | {ratio} | {:.4} | {:.4} | {:.4} | {} | {:.1} ({:.1}) | {runs} | {:.1} | {:.1} | {:.1} |",
            fraction * 100.0,
            storage / accessed,
            floor / accessed,
            f(8) / accessed,
            f(9) / accessed,
            f(11) / accessed,
            r[12],
            median(&mut col(13)),
            median(&mut col(14)),
            median(&mut col(17)) / n,
            median(&mut col(18)) / n,
            median(&mut col(15)),
        );
    }
}
