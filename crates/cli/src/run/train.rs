//! The simulated synchronous training loop, shared by `lobster run` and `lobster-bench soak`:
//! one thread per rank takes its batches, "computes", and meets the other ranks at a barrier.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lobster_io::RankHandle;

/// What one rank consumed over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankTotals {
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
    let samples = batch.samples.iter();
    digest_parts(
        crc,
        samples.map(|s| (s.id, s.label, s.value.as_ref())),
        &batch.skipped,
    );
}

/// [`digest_batch`] of a batch given by its parts (id, label, bytes) and skipped ids, as a
/// rank process reads it from the node's arena.
pub(crate) fn digest_parts<'a>(
    crc: &mut crc32fast::Hasher,
    samples: impl Iterator<Item = (u32, u32, &'a [u8])>,
    skipped: &[u32],
) {
    for (id, label, bytes) in samples {
        crc.update(&id.to_le_bytes());
        crc.update(&label.to_le_bytes());
        crc.update(bytes);
    }
    for s in skipped {
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
pub fn train<T: Send + AsRef<[u8]>, C: Default>(
    handles: Vec<RankHandle<T>>,
    compute: Duration,
    label: &str,
    after_step: impl Fn(usize) + Sync,
    job_barrier: Option<&(dyn Fn() -> Result<()> + Sync)>,
    consume: impl Fn(&lobster_io::Batch<T>, &mut C) + Sync,
) -> Result<Vec<RankTotals>> {
    let runs = train_steps(
        handles,
        compute,
        label,
        TrainSteps::default(),
        after_step,
        job_barrier,
        consume,
    )?;
    Ok(runs.into_iter().map(|r| r.totals).collect())
}

/// Where [`train_steps`] stops and what it times.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TrainSteps {
    /// Steps after which every rank stops (None: the handles' end).
    pub stop_after: Option<u64>,
    /// Steps of the run's first epoch (a resumed run's first is what is left of its epoch):
    /// the steps [`RankRun::first_epoch_delivered`] and `first_epoch_end` cover.
    pub first_epoch: u64,
}

/// Steps whose digest a rank keeps: enough for a test or a short run to compare every
/// batch, bounded for a long one.
pub(crate) const STEP_DIGESTS_MAX: usize = 4096;

/// What one rank did over [`train_steps`]: its totals, when its batches came, and a digest
/// of each of its first [`STEP_DIGESTS_MAX`] batches.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankRun {
    pub totals: RankTotals,
    /// When its first batch was taken.
    pub first_batch: Option<Instant>,
    /// When the last step of the run's first epoch ended (its barrier met).
    pub first_epoch_end: Option<Instant>,
    /// Samples delivered in the run's first epoch.
    pub first_epoch_delivered: u64,
    /// (epoch, iteration, CRC-32 of the batch as [`RankTotals::crc32`] digests it), in order.
    pub steps: Vec<(u32, u32, u32)>,
}

/// [`train`], stopping after `steps.stop_after` steps if given, and returning each rank's
/// [`RankRun`] in the handles' order.
pub(crate) fn train_steps<T: Send + AsRef<[u8]>, C: Default>(
    handles: Vec<RankHandle<T>>,
    compute: Duration,
    label: &str,
    steps: TrainSteps,
    after_step: impl Fn(usize) + Sync,
    job_barrier: Option<&(dyn Fn() -> Result<()> + Sync)>,
    consume: impl Fn(&lobster_io::Batch<T>, &mut C) + Sync,
) -> Result<Vec<RankRun>> {
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
                s.spawn(move || -> Result<RankRun> {
                    let rank = handle.rank();
                    let mut run = RankRun::default();
                    let totals = &mut run.totals;
                    let mut state = C::default();
                    let mut crc = crc32fast::Hasher::new();
                    let stop_after = steps.stop_after.unwrap_or(u64::MAX);
                    for (step, batch) in handle.enumerate() {
                        run.first_batch.get_or_insert_with(Instant::now);
                        let first_epoch = (step as u64) < steps.first_epoch;
                        match &batch {
                            Ok(batch) => {
                                totals.delivered += batch.samples.len() as u64;
                                totals.skipped += batch.skipped.len() as u64;
                                if first_epoch {
                                    run.first_epoch_delivered += batch.samples.len() as u64;
                                }
                                // The batch's own CRC, combined into the running one
                                // (the same as digesting it there): each byte read once.
                                let mut one = crc32fast::Hasher::new();
                                digest_batch(&mut one, batch);
                                crc.combine(&one);
                                if run.steps.len() < STEP_DIGESTS_MAX {
                                    let digest = (batch.epoch, batch.iteration, one.finalize());
                                    run.steps.push(digest);
                                }
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
                        if step as u64 + 1 == steps.first_epoch {
                            run.first_epoch_end = Some(Instant::now());
                        }
                        // Every rank stops at the same step, its barrier met by all.
                        if step as u64 + 1 >= stop_after {
                            break;
                        }
                    }
                    run.totals.crc32 = crc.finalize();
                    Ok(run)
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
