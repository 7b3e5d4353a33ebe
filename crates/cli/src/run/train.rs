//! The simulated synchronous training loop, shared by `lobster run` and `lobster soak`: one
//! thread per rank takes its batches, "computes", and meets the other ranks at a barrier.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use anyhow::{Context, Result};
use lobster_io::RankHandle;

/// What one rank consumed over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RankTotals {
    /// Samples delivered in its batches.
    pub delivered: u64,
    /// Samples left out of its batches by `--on-error skip`.
    pub skipped: u64,
    /// CRC-32 of its batches in delivery order: each sample's id, label and decoded bytes,
    /// then the ids skipped. Equal across runs, strategies and I/O paths that deliver the
    /// same batches.
    pub crc32: u32,
}

/// A rank's running CRC of what it was delivered.
fn digest_batch<T: AsRef<[u8]>>(crc: &mut crc32fast::Hasher, batch: &lobster_io::Batch<T>) {
    for s in &batch.samples {
        crc.update(&s.id.to_le_bytes());
        crc.update(&s.label.to_le_bytes());
        crc.update(s.value.as_ref());
    }
    for s in &batch.skipped {
        crc.update(&s.to_le_bytes());
    }
}

/// Runs every rank handle to its end on its own thread: per batch `consume` (with the rank's
/// own state, made once: a collation buffer) and `compute` of simulated work, then a barrier
/// with the other ranks, as a synchronous training step. Once every rank has
/// reached the barrier of step `step` (counted from 0 across epochs), one of them calls
/// `after_step(step)`, then `job_barrier` if there is one (the other nodes' ranks, as DDP's
/// all-reduce meets them), which every rank of this node waits for. The first failed batch
/// stops the run: that step's barrier is still met by every rank, then all stop, and the
/// error names `label` and the rank; a failed job barrier stops every rank with its error.
/// Returns the ranks' totals in the handles' order.
pub(crate) fn train<T: Send + AsRef<[u8]>, C: Default>(
    handles: Vec<RankHandle<T>>,
    compute: Duration,
    label: &str,
    after_step: impl Fn(usize) + Sync,
    job_barrier: Option<&(dyn Fn() -> Result<()> + Sync)>,
    consume: impl Fn(&lobster_io::Batch<T>, &mut C) + Sync,
) -> Result<Vec<RankTotals>> {
    let barrier = Barrier::new(handles.len());
    // The first failed step: a failure in step k + 1 cannot stop a rank just released from
    // step k's barrier before it reaches k + 1, so no rank waits forever at a barrier.
    let failed_step = AtomicUsize::new(usize::MAX);
    let job_failure: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .into_iter()
            .map(|handle| {
                let (barrier, failed_step, after_step) = (&barrier, &failed_step, &after_step);
                let job_failure = &job_failure;
                let consume = &consume;
                s.spawn(move || -> Result<RankTotals> {
                    let rank = handle.rank();
                    let mut totals = RankTotals::default();
                    let mut state = C::default();
                    let mut crc = crc32fast::Hasher::new();
                    for (step, batch) in handle.enumerate() {
                        match &batch {
                            Ok(batch) => {
                                totals.delivered += batch.samples.len() as u64;
                                totals.skipped += batch.skipped.len() as u64;
                                digest_batch(&mut crc, batch);
                                consume(batch, &mut state);
                                std::hint::black_box(batch);
                                if !compute.is_zero() {
                                    std::thread::sleep(compute);
                                }
                            }
                            Err(_) => {
                                failed_step.fetch_min(step, Ordering::SeqCst);
                            }
                        }
                        if barrier.wait().is_leader() {
                            after_step(step);
                            if let Some(Err(e)) = job_barrier.map(|b| b()) {
                                *job_failure.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some(format!("{e:#}"));
                            }
                        }
                        if job_barrier.is_some() {
                            barrier.wait();
                            let failed = job_failure.lock().unwrap_or_else(|p| p.into_inner());
                            if let Some(e) = failed.as_ref() {
                                anyhow::bail!("{label}: rank {rank}: at step {step}: {e}");
                            }
                        }
                        if failed_step.load(Ordering::SeqCst) <= step {
                            batch.with_context(|| format!("{label}: rank {rank}"))?;
                            break;
                        }
                    }
                    totals.crc32 = crc.finalize();
                    Ok(totals)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a training thread panicked"))
            .collect()
    })
}

/// One CRC for a node's batches: the ranks' CRCs in rank order.
pub(crate) fn batches_crc32(totals: &[RankTotals]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    for t in totals {
        crc.update(&t.crc32.to_le_bytes());
    }
    crc.finalize()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use lobster_io::{CachePolicy, Dataset, FailureBudget, LoaderBuilder, OnError};

    use super::*;

    /// 24 samples of 64 bytes in 3 classes; sample i's bytes are all i.
    fn loader(dir: &std::path::Path, on_error: OnError) -> lobster_io::Loader<Vec<u8>> {
        for i in 0..24u32 {
            let class = dir.join(format!("class{}", i % 3));
            std::fs::create_dir_all(&class).unwrap();
            std::fs::write(class.join(format!("{i:03}.jpg")), vec![i as u8; 64]).unwrap();
        }
        let dataset = Dataset::open_image_folder(dir).unwrap();
        LoaderBuilder::new(dataset)
            .world(1, 3, 0)
            .batch_size(4)
            .epochs(3)
            .cache(CachePolicy::Reuse, 1 << 20)
            .on_error(on_error)
            .decode(|bytes: &[u8], _meta| {
                // Sample 5 cannot be decoded: a failure the error policy decides about.
                if bytes[0] == 5 {
                    Err(std::io::Error::other("sample 5 is bad"))
                } else {
                    Ok(bytes.to_vec())
                }
            })
            .build()
            .unwrap()
    }

    #[test]
    fn every_step_ends_once_for_all_ranks_and_totals_match_the_loader() {
        let dir = tempfile::tempdir().unwrap();
        let skip = OnError::Skip {
            max_failures: FailureBudget::Count(1),
        };
        let mut loader = loader(dir.path(), skip);
        let steps = Mutex::new(Vec::new());
        let totals = train(
            loader.ranks().unwrap(),
            Duration::ZERO,
            "test",
            |step| steps.lock().unwrap().push(step),
            None,
            |_, _: &mut ()| {},
        )
        .unwrap();
        // 8 samples per rank per epoch in batches of 4: 2 steps per epoch, 3 epochs.
        assert_eq!(steps.into_inner().unwrap(), (0..6).collect::<Vec<_>>());
        assert_eq!(totals.len(), 3);
        let metrics = loader.metrics();
        let delivered: u64 = totals.iter().map(|t| t.delivered).sum();
        let skipped: u64 = totals.iter().map(|t| t.skipped).sum();
        assert_eq!((delivered, skipped), (metrics.samples, metrics.skipped));
        // Sample 5 is read once per epoch and skipped each time.
        assert_eq!((delivered, skipped), (69, 3));
    }

    #[test]
    fn a_failed_batch_stops_every_rank_and_names_the_rank() {
        let dir = tempfile::tempdir().unwrap();
        let mut loader = loader(dir.path(), OnError::Fail);
        let steps = Mutex::new(Vec::new());
        let e = train(
            loader.ranks().unwrap(),
            Duration::ZERO,
            "test",
            |step| steps.lock().unwrap().push(step),
            None,
            |_, _: &mut ()| {},
        )
        .unwrap_err();
        let e = format!("{e:#}");
        assert!(e.starts_with("test: rank "), "{e}");
        assert!(e.contains("sample 5 is bad"), "{e}");
        // Sample 5 is in the first epoch: the run stops within it.
        assert!(steps.into_inner().unwrap().len() <= 2);
    }

    #[test]
    fn the_job_barrier_is_met_once_a_step_and_its_failure_stops_every_rank() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = loader(
            dir.path(),
            OnError::Skip {
                max_failures: FailureBudget::Count(3),
            },
        );
        let met = AtomicUsize::new(0);
        let count = || -> Result<()> {
            met.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        train(
            l.ranks().unwrap(),
            Duration::ZERO,
            "test",
            |_| {},
            Some(&count),
            |_, _: &mut ()| {},
        )
        .unwrap();
        assert_eq!(met.load(Ordering::SeqCst), 6, "2 steps per epoch, 3 epochs");
        let dir = tempfile::tempdir().unwrap();
        let mut l = loader(
            dir.path(),
            OnError::Skip {
                max_failures: FailureBudget::Count(3),
            },
        );
        let fail_third = || -> Result<()> {
            if met.fetch_add(1, Ordering::SeqCst) == 8 {
                anyhow::bail!("node 2 is gone");
            }
            Ok(())
        };
        let e = train(
            l.ranks().unwrap(),
            Duration::ZERO,
            "test",
            |_| {},
            Some(&fail_third),
            |_, _: &mut ()| {},
        )
        .unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("at step 2") && e.contains("node 2 is gone"),
            "{e}"
        );
    }
}
