//! Helpers shared by the integration tests.
// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lobster_io::{Batch, Dataset, DistributedSampler, EpochOrder, Loader};

/// The bytes of generated sample `i`: its id, then a length that varies with it, so a sample
/// delivered in the wrong place or with the wrong bytes is caught.
pub fn content(i: u32) -> Vec<u8> {
    let len = 100 + (i as usize * 7919) % 3000;
    let mut v = format!("sample {i};").into_bytes();
    v.extend((0..len).map(|k| (k as u32 ^ i) as u8));
    v
}

/// An ImageFolder of `samples` files of [`content`] spread round-robin over `classes`
/// classes; file names carry the generator index.
pub fn make_dataset(dir: &Path, samples: u32, classes: u32) -> Arc<Dataset> {
    for i in 0..samples {
        let class = dir.join(format!("c{}", i % classes));
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join(format!("{i:06}.jpg")), content(i)).unwrap();
    }
    Arc::new(Dataset::open_image_folder(dir).unwrap())
}

/// A folder of `count` JPEGs spread round-robin over `classes` classes, image `i` a gradient of
/// `size(i)` pixels (so that crops and flips differ between images), opened without a kept
/// table.
pub fn gradient_jpegs(
    dir: &Path,
    count: u16,
    classes: u16,
    size: impl Fn(u16) -> (u16, u16),
    quality: u8,
) -> Arc<Dataset> {
    for i in 0..count {
        let class = dir.join(format!("c{}", i % classes));
        std::fs::create_dir_all(&class).unwrap();
        let (w, h) = size(i);
        let mut rgb = Vec::with_capacity(usize::from(w) * usize::from(h) * 3);
        for y in 0..h {
            for x in 0..w {
                rgb.extend_from_slice(&[(x * 9) as u8, (y * 13) as u8, ((x + y) * 5 + i) as u8]);
            }
        }
        jpeg_encoder::Encoder::new_file(class.join(format!("{i:02}.jpg")), quality)
            .unwrap()
            .encode(&rgb, w, h, jpeg_encoder::ColorType::Rgb)
            .unwrap();
    }
    let options = lobster_io::FolderOptions {
        table_dir: None,
        ..Default::default()
    };
    Arc::new(Dataset::open_folder(dir, &options).unwrap())
}

/// The job's shape, as the loader is built with it (shuffled order, tails padded).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub nodes: usize,
    pub ranks: usize,
    pub node: usize,
    pub seed: u64,
    pub epochs: u32,
    pub batch: usize,
}

/// Each local rank's batches from the sampler alone: (epoch, iteration, sample ids).
pub fn rank_plan(samples: usize, s: Shape) -> Vec<Vec<(u32, u32, Vec<u32>)>> {
    let sampler = DistributedSampler::new(
        samples,
        s.nodes * s.ranks,
        false,
        EpochOrder::Shuffle { seed: s.seed },
    )
    .unwrap();
    (0..s.ranks)
        .map(|rank| {
            let mut batches = Vec::new();
            for epoch in 0..s.epochs {
                let indices = sampler.rank_indices(epoch, s.node * s.ranks + rank);
                for (iteration, chunk) in indices.chunks(s.batch).enumerate() {
                    batches.push((epoch, iteration as u32, chunk.to_vec()));
                }
            }
            batches
        })
        .collect()
}

/// Drives every rank on its own thread to the end and returns each rank's items.
pub fn run_ranks<T: Send>(loader: &mut Loader<T>) -> Vec<Vec<Result<Batch<T>, lobster_io::Error>>> {
    let handles = loader.ranks().unwrap();
    std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .into_iter()
            .map(|h| s.spawn(move || h.collect::<Vec<_>>()))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// Drives every node's ranks in lock-step (one barrier across the job after each step, as
/// synchronous training's all-reduce), each rank taking at most `take` batches; each node's
/// ranks' items, each as `each` makes it.
pub fn run_lock_step<T: Send, R: Send>(
    loaders: &mut [Loader<T>],
    take: Option<usize>,
    each: impl Fn(Result<Batch<T>, lobster_io::Error>) -> R + Sync,
) -> Vec<Vec<Vec<R>>> {
    let handles: Vec<_> = loaders.iter_mut().map(|l| l.ranks().unwrap()).collect();
    let barrier = Barrier::new(handles.iter().map(Vec::len).sum());
    std::thread::scope(|s| {
        let threads: Vec<Vec<_>> = handles
            .into_iter()
            .map(|ranks| {
                ranks
                    .into_iter()
                    .map(|h| {
                        let (barrier, each) = (&barrier, &each);
                        s.spawn(move || {
                            let mut got = Vec::new();
                            for b in h.take(take.unwrap_or(usize::MAX)) {
                                got.push(each(b));
                                barrier.wait();
                            }
                            got
                        })
                    })
                    .collect()
            })
            .collect();
        threads
            .into_iter()
            .map(|node| node.into_iter().map(|t| t.join().unwrap()).collect())
            .collect()
    })
}

/// Every rank got exactly its planned batches, every sample with its generated bytes.
pub fn assert_delivered(
    plan: &[Vec<(u32, u32, Vec<u32>)>],
    got: Vec<Vec<Result<Batch<Vec<u8>>, lobster_io::Error>>>,
    what: &str,
) {
    assert_eq!(got.len(), plan.len(), "{what}: ranks");
    for (rank, (results, planned)) in got.into_iter().zip(plan).enumerate() {
        assert_eq!(
            results.len(),
            planned.len(),
            "{what}: rank {rank}'s batches"
        );
        for (result, (epoch, iteration, ids)) in results.into_iter().zip(planned) {
            let batch = result.unwrap_or_else(|e| panic!("{what}: rank {rank}: {e}"));
            assert_eq!(
                (batch.epoch, batch.iteration),
                (*epoch, *iteration),
                "{what}"
            );
            let delivered: Vec<u32> = batch.samples.iter().map(|s| s.id).collect();
            assert_eq!(&delivered, ids, "{what}: rank {rank} epoch {epoch}");
            assert!(batch.skipped.is_empty(), "{what}");
            for s in &batch.samples {
                assert_eq!(s.value, content(s.id), "{what}: bytes of sample {}", s.id);
            }
        }
    }
}

/// A step (a drop, a join) that has not returned by then is hung. Not a speed limit: tests
/// print the figures; this only turns a hang into a failure with a message.
pub const HANG: Duration = Duration::from_secs(30);

/// Names of the process's threads (one per task).
pub fn threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|t| {
            let comm = t.unwrap().path().join("comm");
            std::fs::read_to_string(comm)
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .collect();
    names.sort();
    names
}

/// Open file descriptors of the process (the listing's own included, every time).
pub fn fds() -> Vec<String> {
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.display()
            )
        })
        .collect();
    fds.sort();
    fds
}

/// Ends the process with a message if it is not disarmed within [`HANG`].
pub struct Watchdog {
    disarm: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Watchdog {
    pub fn arm(what: String) -> Watchdog {
        let (disarm, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(HANG) {
                eprintln!("{what} has not returned after {HANG:?}: it hangs");
                std::process::exit(1);
            }
        });
        Watchdog { disarm, thread }
    }

    pub fn disarm(self) {
        let _ = self.disarm.send(());
        self.thread.join().unwrap();
    }
}

/// Runs `f` under a watchdog and returns its result and how long it took.
pub fn guarded<R>(what: String, f: impl FnOnce() -> R) -> (R, Duration) {
    let dog = Watchdog::arm(what);
    let started = Instant::now();
    let r = f();
    let took = started.elapsed();
    dog.disarm();
    (r, took)
}

/// A ustar archive of `members` (name, bytes), in order, with its end blocks.
pub fn ustar(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(name, bytes) in members {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[124..136].copy_from_slice(format!("{:011o}\0", bytes.len()).as_bytes());
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(bytes);
        out.resize(out.len().next_multiple_of(512), 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}
