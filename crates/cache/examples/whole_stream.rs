//! Decides a whole multi-epoch stream at ImageNet-1k scale and prints decisions per second
//! of thread CPU time, cold start included: what a training job pays for its plan.
//!
//! `cargo run --release -p lobster-cache --example whole_stream -- [NODES] [EPOCHS] [CACHE_PCT]`

use std::sync::Arc;
use std::time::Duration;

use lobster_cache::{Planner, PolicyKind};
use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};

/// This thread's CPU time from procfs (utime + stime, in clock ticks of 10 ms), so other
/// processes on the shared machine do not count.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("procfs");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of stat(5); after the ')' they are 11 and 12.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nodes: u32 = args.first().map_or(4, |s| s.parse().expect("NODES"));
    let epochs: u32 = args.get(1).map_or(90, |s| s.parse().expect("EPOCHS"));
    let cache_pct: f64 = args.get(2).map_or(10.0, |s| s.parse().expect("CACHE_PCT"));
    let n = 1_281_167u32;
    let sizes: Arc<[u32]> = lognormal_sizes(n as usize, 110_000.0, 0.5, 2022).into();
    let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let capacity = (total as f64 * cache_pct / 100.0) as u64;
    let source = ShuffledStream {
        num_samples: n,
        epochs,
        nodes,
        node: 0,
        seed: 7,
    };
    let start = thread_cpu();
    let wall = std::time::Instant::now();
    let mut planner = Planner::new(source, sizes, capacity, PolicyKind::Reuse).expect("planner");
    let stats = planner.run_to_end().expect("plan");
    let cpu = thread_cpu() - start;
    println!(
        "nodes {nodes} epochs {epochs} cache {cache_pct}%: {} decisions, hit ratio {:.3}, \
         {:.2} M decisions/s of CPU ({:.1} s CPU, {:.1} s wall), {:.1} B/sample",
        stats.accesses,
        stats.hit_ratio(),
        stats.accesses as f64 / cpu.as_secs_f64() / 1e6,
        cpu.as_secs_f64(),
        wall.elapsed().as_secs_f64(),
        planner.memory_bytes() as f64 / f64::from(n),
    );
}
