//! Every local rank of a node as a task on one tokio thread: each takes its batches as an
//! async stream, "trains" for a few milliseconds, and meets the other ranks at a step
//! barrier, as synchronous data-parallel training does. No thread blocks per rank: the
//! decode worker that completes a rank's batch wakes its task.
//!
//! `cargo run -p lobster-io --example tokio_ranks [DIR]` (without DIR, a small generated
//! folder).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lobster_io::{CachePolicy, Dataset, LoaderBuilder};

fn main() -> anyhow::Result<()> {
    let generated = tempfile::tempdir()?;
    let root = match std::env::args().nth(1) {
        Some(dir) => dir.into(),
        None => {
            for i in 0..256u32 {
                let class = generated.path().join(format!("class{}", i % 4));
                std::fs::create_dir_all(&class)?;
                let bytes: Vec<u8> = (0..2048 + i * 64).map(|k| (k ^ i) as u8).collect();
                std::fs::write(class.join(format!("{i:04}.jpg")), bytes)?;
            }
            generated.path().to_path_buf()
        }
    };
    let dataset = Dataset::open(&root.to_string_lossy())?;
    let ranks = 4;
    let mut loader = LoaderBuilder::new(dataset)
        .world(1, ranks, 0)
        .seed(3)
        .batch_size(8)
        .epochs(3)
        .cache(CachePolicy::Reuse, 256 << 10)
        .decode(|bytes: &[u8], _meta| Ok::<_, std::io::Error>(bytes.len()))
        .build()?;
    let streams: Vec<_> = loader
        .ranks()
        .expect("first call")
        .into_iter()
        .map(|h| h.into_stream())
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let started = Instant::now();
    let per_rank = runtime.block_on(async {
        let barrier = Arc::new(tokio::sync::Barrier::new(ranks));
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|mut stream| {
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let (mut batches, mut samples) = (0, 0);
                    while let Some(batch) = stream.next_batch().await {
                        let batch = batch?;
                        samples += batch.samples.len();
                        batches += 1;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        barrier.wait().await;
                    }
                    Ok::<_, lobster_io::Error>((stream.rank(), batches, samples))
                })
            })
            .collect();
        let mut per_rank = Vec::new();
        for t in tasks {
            per_rank.push(t.await??);
        }
        Ok::<_, anyhow::Error>(per_rank)
    })?;
    for (rank, batches, samples) in per_rank {
        println!("rank {rank}: {batches} batches, {samples} samples");
    }
    let m = loader.metrics();
    println!(
        "{} samples in {:.2} s on one runtime thread; hit ratio {:.3}, stall {:.1}%",
        m.samples,
        started.elapsed().as_secs_f64(),
        m.hit_ratio,
        100.0 * m.stall_fraction
    );
    Ok(())
}
