//! Per-access cost of the hashed maps on the loader's per-sample path, std's SipHash against
//! ahash, side by side in one run:
//!
//! - `cache_step`: what the loader's planner thread does per access (`pipeline/plan.rs`,
//!   `Cache::decide`): a reuse-policy decision, then the slot store's get on a hit, removes of
//!   the evicted and insert of the admitted; with the planner alone as the floor.
//! - `store_replay`: the store alone replaying those operations, at 100,000 samples and at
//!   ImageNet-1k scale.
//! - `open_files`: a model of the dispatcher's open-files map (`pipeline/files.rs`, which
//!   needs a live reader) per acquire and release, next to one `stat`, one of the two system
//!   calls each acquire makes anyway.
//!
//! The next-use index's far maps are not here: only next uses 2^32 or more accesses ahead go
//! there, which no realistic stream has, so they are never on the per-access path.
//!
//! Ends with a plain ratio table measured in the same run (skipped in `cargo test` mode).
//!
//! `cargo bench -p lobster-benches --bench cache_maps -- --warm-up-time 1 --measurement-time 3`

use std::collections::hash_map::RandomState as SipState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ahash::RandomState as AState;
use criterion::{Criterion, Throughput};
use lobster_cache::{Planner, PolicyKind, Store};
use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};

const SEED: u64 = 7;
const OPEN_FILES_MAX: usize = 1024;
const IN_FLIGHT: usize = 32;

/// A reuse planner over `epochs` shuffled epochs of `samples` samples on one node, with a
/// cache of 10% of the dataset.
fn planner(samples: u32, epochs: u32) -> Planner<ShuffledStream> {
    let sizes: Arc<[u32]> = lognormal_sizes(samples as usize, 110_000.0, 0.5, SEED).into();
    let capacity = sizes.iter().map(|&s| u64::from(s)).sum::<u64>() / 10;
    let stream = ShuffledStream {
        num_samples: samples,
        epochs,
        nodes: 1,
        node: 0,
        seed: SEED,
    };
    Planner::new(stream, sizes, capacity, PolicyKind::Reuse).expect("valid stream")
}

fn capacity_of(p: &Planner<ShuffledStream>) -> u64 {
    p.policy().capacity_bytes()
}

/// The planner alone: the floor under `cache_step`.
fn walk(samples: u32, epochs: u32) -> u64 {
    let mut p = planner(samples, epochs);
    let mut evicted = Vec::new();
    let mut hits = 0;
    while let Some(d) = p.next(&mut evicted).expect("valid stream") {
        hits += u64::from(d.hit);
    }
    hits
}

/// The planner with a slot store of hasher `S` mirroring its decisions, as the loader does
/// (a `u64` stands for the slot's `Arc`: same entry size).
fn walk_with_store<S: BuildHasher>(samples: u32, epochs: u32, hasher: S) -> u64 {
    let mut p = planner(samples, epochs);
    let mut store = Store::with_hasher(capacity_of(&p), hasher);
    let mut evicted = Vec::new();
    let mut sum = 0u64;
    while let Some(d) = p.next(&mut evicted).expect("valid stream") {
        let slot = if d.hit {
            *store.get(d.sample).expect("a hit is cached")
        } else {
            d.position
        };
        for &e in &evicted {
            store.remove(e);
        }
        if d.admitted {
            store
                .insert(d.sample, u64::from(d.size_bytes), slot)
                .expect("the planner keeps within capacity");
        }
        sum = sum.wrapping_add(slot);
    }
    sum
}

#[derive(Clone, Copy)]
enum Op {
    Get(u32),
    Remove(u32),
    Insert(u32, u64),
}

/// The store operations of a whole walk, and the samples read (misses), in order.
struct Recorded {
    capacity_bytes: u64,
    accesses: u64,
    ops: Vec<Op>,
    misses: Vec<u32>,
}

fn record(samples: u32, epochs: u32) -> Recorded {
    let mut p = planner(samples, epochs);
    let mut evicted = Vec::new();
    let (mut ops, mut misses) = (Vec::new(), Vec::new());
    while let Some(d) = p.next(&mut evicted).expect("valid stream") {
        if d.hit {
            ops.push(Op::Get(d.sample));
        } else {
            misses.push(d.sample);
        }
        ops.extend(evicted.iter().map(|&e| Op::Remove(e)));
        if d.admitted {
            ops.push(Op::Insert(d.sample, u64::from(d.size_bytes)));
        }
    }
    Recorded {
        capacity_bytes: capacity_of(&p),
        accesses: p.stats().accesses,
        ops,
        misses,
    }
}

fn replay<S: BuildHasher>(r: &Recorded, hasher: S) -> u64 {
    let mut store = Store::with_hasher(r.capacity_bytes, hasher);
    let mut sum = 0u64;
    for &op in &r.ops {
        match op {
            Op::Get(s) => sum = sum.wrapping_add(*store.get(s).expect("a hit is cached")),
            Op::Remove(s) => sum = sum.wrapping_add(store.remove(s).expect("evicted is cached")),
            Op::Insert(s, size) => store.insert(s, size, size).expect("within capacity"),
        }
    }
    sum
}

/// `pipeline/files.rs`'s `OpenFiles` with the reader taken out: the same map and order
/// operations per acquire and release.
struct OpenFiles<S> {
    by_sample: HashMap<u32, (u32, usize), S>,
    order: VecDeque<u32>,
    next_file: u32,
}

impl<S: BuildHasher> OpenFiles<S> {
    fn new(hasher: S) -> Self {
        OpenFiles {
            by_sample: HashMap::with_hasher(hasher),
            order: VecDeque::new(),
            next_file: 0,
        }
    }

    fn acquire(&mut self, sample: u32) -> u32 {
        if let Some((file, users)) = self.by_sample.get_mut(&sample) {
            *users += 1;
            return *file;
        }
        while self.by_sample.len() >= OPEN_FILES_MAX {
            let Some(i) = self.order.iter().position(|s| self.by_sample[s].1 == 0) else {
                break;
            };
            let s = self.order.remove(i).expect("position is in range");
            let (file, _) = self.by_sample.remove(&s).expect("order mirrors the map");
            black_box(file);
        }
        self.next_file = self.next_file.wrapping_add(1);
        self.by_sample.insert(sample, (self.next_file, 1));
        self.order.push_back(sample);
        self.next_file
    }

    fn release(&mut self, sample: u32) {
        if let Some((_, users)) = self.by_sample.get_mut(&sample) {
            *users -= 1;
        }
    }
}

/// The dispatcher's reads (the misses) through the open-files map, `IN_FLIGHT` at a time.
fn open_files<S: BuildHasher>(misses: &[u32], hasher: S) -> u64 {
    let mut files = OpenFiles::new(hasher);
    let mut in_flight = VecDeque::with_capacity(IN_FLIGHT);
    let mut sum = 0u64;
    for &s in misses {
        if in_flight.len() == IN_FLIGHT {
            files.release(in_flight.pop_front().expect("full"));
        }
        sum = sum.wrapping_add(u64::from(files.acquire(s)));
        in_flight.push_back(s);
    }
    sum
}

/// One `stat` per read, as `OpenFiles::acquire` does after its open.
fn stats(path: &Path, n: usize) -> u64 {
    (0..n)
        .map(|_| std::fs::metadata(path).expect("bench manifest").len())
        .fold(0, u64::wrapping_add)
}

const SMALL: (u32, u32) = (100_000, 4);
const IMAGENET: (u32, u32) = (1_281_167, 2);

fn bench(c: &mut Criterion, small: &Recorded, imagenet: &Recorded, manifest: &Path) {
    let (samples, epochs) = SMALL;
    let mut group = c.benchmark_group("cache_step");
    group.sample_size(10);
    group.throughput(Throughput::Elements(small.accesses));
    let id = |v: &str| format!("{v}/100k-samples/4-epochs/reuse/cache-10pct");
    group.bench_function(id("planner-only"), |b| b.iter(|| walk(samples, epochs)));
    group.bench_function(id("std"), |b| {
        b.iter(|| walk_with_store(samples, epochs, SipState::new()))
    });
    group.bench_function(id("ahash"), |b| {
        b.iter(|| walk_with_store(samples, epochs, AState::new()))
    });
    group.finish();

    let mut group = c.benchmark_group("store_replay");
    group.sample_size(10);
    for (scale, r) in [
        ("100k-samples/4-epochs", small),
        ("imagenet/2-epochs", imagenet),
    ] {
        group.throughput(Throughput::Elements(r.accesses));
        group.bench_function(format!("std/{scale}"), |b| {
            b.iter(|| replay(r, SipState::new()))
        });
        group.bench_function(format!("ahash/{scale}"), |b| {
            b.iter(|| replay(r, AState::new()))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("open_files");
    group.sample_size(10);
    group.throughput(Throughput::Elements(small.misses.len() as u64));
    group.bench_function("std", |b| {
        b.iter(|| open_files(&small.misses, SipState::new()))
    });
    group.bench_function("ahash", |b| {
        b.iter(|| open_files(&small.misses, AState::new()))
    });
    group.bench_function("stat-only", |b| {
        b.iter(|| stats(manifest, small.misses.len()))
    });
    group.finish();
}

/// Median of five runs, alternating the variants so drift on a shared machine hits both.
fn medians<const N: usize>(runs: [&dyn Fn(); N]) -> [Duration; N] {
    let mut times: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::with_capacity(5));
    for _ in 0..5 {
        for (t, run) in times.iter_mut().zip(&runs) {
            let start = Instant::now();
            run();
            t.push(start.elapsed());
        }
    }
    times.map(|mut t| {
        t.sort();
        t[2]
    })
}

fn ratio_table(small: &Recorded, imagenet: &Recorded, manifest: &Path) {
    let (samples, epochs) = SMALL;
    let ns = |d: Duration, n: u64| d.as_nanos() as f64 / n as f64;
    println!("\nper-access cost, std SipHash vs ahash (median of 5 alternating runs)");
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>12}",
        "map", "std ns", "ahash ns", "ahash/std", "floor ns"
    );

    let [floor, sip, a] = medians([
        &|| {
            black_box(walk(samples, epochs));
        },
        &|| {
            black_box(walk_with_store(samples, epochs, SipState::new()));
        },
        &|| {
            black_box(walk_with_store(samples, epochs, AState::new()));
        },
    ]);
    let n = small.accesses;
    println!(
        "{:<44} {:>9.1} {:>9.1} {:>9.3} {:>12.1}",
        "cache step (planner + store), 100k",
        ns(sip, n),
        ns(a, n),
        a.as_secs_f64() / sip.as_secs_f64(),
        ns(floor, n)
    );
    println!(
        "{:<44} {:>9.1} {:>9.1} {:>9.3}",
        "  of which the store (minus planner floor)",
        ns(sip.saturating_sub(floor), n),
        ns(a.saturating_sub(floor), n),
        a.saturating_sub(floor).as_secs_f64() / sip.saturating_sub(floor).as_secs_f64()
    );

    for (name, r) in [
        ("store replay, 100k samples", small),
        ("store replay, imagenet", imagenet),
    ] {
        let [sip, a] = medians([
            &|| {
                black_box(replay(r, SipState::new()));
            },
            &|| {
                black_box(replay(r, AState::new()));
            },
        ]);
        println!(
            "{:<44} {:>9.1} {:>9.1} {:>9.3}",
            format!(
                "{name} ({:.2} ops/access)",
                r.ops.len() as f64 / r.accesses as f64
            ),
            ns(sip, r.accesses),
            ns(a, r.accesses),
            a.as_secs_f64() / sip.as_secs_f64()
        );
    }

    let m = &small.misses;
    let [sip, a, stat] = medians([
        &|| {
            black_box(open_files(m, SipState::new()));
        },
        &|| {
            black_box(open_files(m, AState::new()));
        },
        &|| {
            black_box(stats(manifest, m.len()));
        },
    ]);
    let n = m.len() as u64;
    println!(
        "{:<44} {:>9.1} {:>9.1} {:>9.3} {:>12.1}",
        "open files per read (floor: one stat)",
        ns(sip, n),
        ns(a, n),
        a.as_secs_f64() / sip.as_secs_f64(),
        ns(stat, n)
    );
    println!(
        "open files: ahash saves {:.1} ns per read, {:.2}% of one stat",
        ns(sip.saturating_sub(a), n),
        100.0 * sip.saturating_sub(a).as_secs_f64() / stat.as_secs_f64()
    );
}

fn main() {
    let small = record(SMALL.0, SMALL.1);
    let imagenet = record(IMAGENET.0, IMAGENET.1);
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, &small, &imagenet, &manifest);
    c.final_summary();
    // `cargo bench` passes `--bench`; `cargo test` runs each bench once and wants no table.
    if std::env::args().any(|a| a == "--bench") {
        ratio_table(&small, &imagenet, &manifest);
    }
}
