//! Speed of lobster-cache at ImageNet-1k scale (1,281,167 samples): cache decisions per
//! second for each policy (steady state, next uses precomputed), the planner end to end
//! (index included) from a cold start and, on this thread's CPU time, cold and in steady
//! state; and the next-use index build per epoch.
//!
//! Run: `cargo bench -p lobster-benches --bench cache_planner`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use lobster_cache::{
    Access, LruPolicy, NextUseIndex, Planner, Policy, PolicyKind, ReusePolicy, StaticPolicy,
    StreamSource,
};
use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};

const SAMPLES: u32 = 1_281_167;
const SEED: u64 = 7;

fn stream(nodes: u32, epochs: u32) -> ShuffledStream {
    ShuffledStream {
        num_samples: SAMPLES,
        epochs,
        nodes,
        node: 0,
        seed: SEED,
    }
}

fn sizes() -> Arc<[u32]> {
    lognormal_sizes(SAMPLES as usize, 110_000.0, 0.5, SEED).into()
}

fn capacity(sizes: &[u32], pct: u64) -> u64 {
    sizes.iter().map(|&s| u64::from(s)).sum::<u64>() * pct / 100
}

/// The accesses of the first `epochs` epochs of a 90-epoch stream, with next uses that
/// look past them as the planner's would.
fn first_accesses(nodes: u32, epochs: u32) -> Vec<Access> {
    let mut index = NextUseIndex::new(
        stream(nodes, 90),
        SAMPLES as usize,
        true,
        5 * SAMPLES as usize / 2,
    );
    let mut out = Vec::new();
    while let Some(a) = index.next_access().expect("valid stream") {
        if a.epoch == epochs {
            break;
        }
        out.push(a);
    }
    out
}

fn policy(
    kind: PolicyKind,
    sizes: &Arc<[u32]>,
    capacity: u64,
    stream: &[Access],
) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Reuse => Box::new(ReusePolicy::new(sizes.clone(), capacity)),
        PolicyKind::Lru => Box::new(LruPolicy::new(sizes.clone(), capacity)),
        PolicyKind::Static => {
            let mut counts = vec![0u32; sizes.len()];
            let mut first = vec![u64::MAX; sizes.len()];
            for a in stream {
                let s = a.sample as usize;
                counts[s] += 1;
                first[s] = first[s].min(a.position);
            }
            Box::new(StaticPolicy::new(sizes.clone(), capacity, &counts, &first))
        }
    }
}

fn decisions(c: &mut Criterion) {
    let sizes = sizes();
    let cap = capacity(&sizes, 10);
    let mut group = c.benchmark_group("decide");
    group.sample_size(10);
    for (nodes, warm_epochs, epochs) in [(1u32, 1u32, 2u32), (4, 3, 4)] {
        let all = first_accesses(nodes, epochs);
        let split = all.iter().position(|a| a.epoch == warm_epochs).unwrap();
        let (warm, measured) = all.split_at(split);
        let measured_samples: Vec<_> = measured.iter().map(|a| a.sample).collect();
        let sample_chunks: Vec<&[u32]> = measured_samples.chunks(16).collect();
        group.throughput(Throughput::Elements(measured.len() as u64));
        for kind in PolicyKind::ALL {
            group.bench_function(format!("{kind}/{nodes}-node/cache-10pct"), |b| {
                b.iter_batched(
                    || {
                        let mut p = policy(kind, &sizes, cap, &all);
                        let mut evicted = Vec::new();
                        for a in warm {
                            evicted.clear();
                            p.access(a.sample, a.position, a.next_use, &mut evicted);
                        }
                        p
                    },
                    |mut p| {
                        let mut evicted = Vec::new();
                        let mut hits = 0u64;
                        // As the planner does: every 16 decisions, warm the 16 after next.
                        for (i, chunk) in measured.chunks(16).enumerate() {
                            if let Some(ahead) = sample_chunks.get(i + 1) {
                                p.warm(ahead);
                            }
                            for a in chunk {
                                evicted.clear();
                                hits += u64::from(
                                    p.access(a.sample, a.position, a.next_use, &mut evicted).hit,
                                );
                            }
                        }
                        (p, hits)
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    group.finish();
}

fn planner_end_to_end(c: &mut Criterion) {
    let sizes = sizes();
    let cap = capacity(&sizes, 10);
    let mut group = c.benchmark_group("planner");
    group.sample_size(10);
    // Whole default batches (2.5 accesses per sample: 2 epochs at 1 node, 10 at 4), and enough
    // epochs after them that look-ahead is not cut short by the end of the stream.
    for (nodes, measured_epochs) in [(1u32, 2u32), (4, 10)] {
        let per_epoch = u64::from(SAMPLES / nodes);
        group.throughput(Throughput::Elements(per_epoch * u64::from(measured_epochs)));
        group.bench_function(format!("reuse/{nodes}-node/cache-10pct"), |b| {
            b.iter(|| {
                let mut planner =
                    Planner::new(stream(nodes, 90), sizes.clone(), cap, PolicyKind::Reuse)
                        .expect("valid stream");
                let mut evicted = Vec::new();
                let mut hits = 0u64;
                while let Some(d) = planner.next(&mut evicted).expect("valid stream") {
                    if d.epoch == measured_epochs {
                        break;
                    }
                    hits += u64::from(d.hit);
                }
                hits
            })
        });
    }
    group.finish();
}

/// CPU time of this thread (user + system, 10 ms ticks) from /proc, or wall time where
/// that is unavailable: the machines these run on are shared, and CPU time is what a
/// planner costs its core.
fn thread_clock() -> Duration {
    let cpu = std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|stat| {
            let after_name = stat.rsplit(')').next()?.to_owned();
            let fields: Vec<&str> = after_name.split_whitespace().collect();
            let user: u64 = fields.get(11)?.parse().ok()?;
            let system: u64 = fields.get(12)?.parse().ok()?;
            Some(Duration::from_millis((user + system) * 10))
        });
    cpu.unwrap_or_else(|| {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed()
    })
}

/// The planner on this thread's CPU time: `cold` decides the first `measured` epochs of a
/// 90-epoch stream (the first batch's look-ahead included, as `planner` does, and the next
/// batch's build that its last access triggers); `steady` decides whole default batches
/// after the first (untimed) on a 400-epoch stream, so look-ahead is never cut short.
fn planner_cpu(c: &mut Criterion) {
    let sizes = sizes();
    let cap = capacity(&sizes, 10);
    let mut group = c.benchmark_group("planner_cpu");
    group.sample_size(10);
    // (nodes, first batch in epochs, epochs timed in steady state)
    for (nodes, first_batch, steady_epochs) in [(1u32, 2u64, 4u64), (4, 10, 30)] {
        let mut epoch = Vec::new();
        stream(nodes, 1).fill_epoch(0, &mut epoch);
        let per_epoch = epoch.len() as u64;
        for (phase, epochs, warm, timed) in [
            ("cold", 90, 0, first_batch),
            ("steady", 400, first_batch, steady_epochs),
        ] {
            group.throughput(Throughput::Elements(per_epoch * timed));
            group.bench_function(format!("{phase}/reuse/{nodes}-node/cache-10pct"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let mut planner = Planner::new(
                            stream(nodes, epochs),
                            sizes.clone(),
                            cap,
                            PolicyKind::Reuse,
                        )
                        .expect("valid stream");
                        let mut evicted = Vec::new();
                        for _ in 0..per_epoch * warm {
                            planner.next(&mut evicted).expect("valid stream");
                        }
                        let start = thread_clock();
                        let mut hits = 0u64;
                        for _ in 0..per_epoch * timed {
                            let d = planner.next(&mut evicted).expect("valid stream");
                            hits += u64::from(d.expect("stream continues").hit);
                        }
                        if phase == "cold" {
                            // As `planner`: the access after the batch builds the next one.
                            planner.next(&mut evicted).expect("valid stream");
                        }
                        total += thread_clock() - start;
                        std::hint::black_box(hits);
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

fn index_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("index_build");
    group.sample_size(10);
    for (nodes, measured_epochs) in [(1u32, 2u32), (4, 10)] {
        group.throughput(Throughput::Elements(u64::from(measured_epochs)));
        group.bench_function(format!("per-epoch/{nodes}-node"), |b| {
            b.iter(|| {
                let mut index = NextUseIndex::new(
                    stream(nodes, 90),
                    SAMPLES as usize,
                    true,
                    5 * SAMPLES as usize / 2,
                );
                let mut sum = 0u64;
                while let Some(a) = index.next_access().expect("valid stream") {
                    if a.epoch == measured_epochs {
                        break;
                    }
                    sum = sum.wrapping_add(a.next_use);
                }
                sum
            })
        });
    }
    group.finish();
}

/// The baseline the index pays per regeneration: one epoch from the generator.
fn source_fill(c: &mut Criterion) {
    let mut group = c.benchmark_group("source");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    for nodes in [1u32, 4] {
        let s = stream(nodes, 90);
        let mut out = Vec::new();
        group.bench_function(format!("fill_epoch/{nodes}-node"), |b| {
            b.iter(|| {
                out.clear();
                s.fill_epoch(3, &mut out);
                out.len()
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    decisions,
    planner_end_to_end,
    planner_cpu,
    index_build,
    source_fill
);
criterion_main!(benches);
