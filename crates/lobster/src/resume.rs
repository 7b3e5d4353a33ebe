//! Checkpoint and resume. The order and the plan are a pure function of the job's inputs, so
//! a loader's state is where each rank's next batch comes from, and a resumed loader replans
//! the rest of the run from there with a cold cache.
//!
//! Every epoch's order is one sequence Q (the sampler's order, padded or cut for the world the
//! epoch began in); rank `r`'s `k`-th sample is `Q[r + k * world]`, so the ranks' first `s`
//! batches together consume exactly the prefix `Q[..s * batch * world]`. A position is that
//! prefix's length (`consumed`). A resumed epoch splits the rest, `Q[consumed..]`, over the
//! resumed world as the sampler splits a whole epoch: padded by repeating its head to a
//! multiple of the world (cut instead with `drop_last`). With the same world that is exactly
//! the uninterrupted run's split; with another, every sample of the epoch not yet consumed is
//! taken once (plus the padding). Later epochs are the resumed world's own.

use serde::{Deserialize, Serialize};

use crate::config::LoaderConfig;
use crate::dataset::Dataset;
use crate::error::Error;
use crate::pipeline::{Head, Layout};
use crate::sampler::{DistributedSampler, EpochOrder};

/// The state format this build writes and reads.
pub const STATE_VERSION: u32 = 1;

/// Bytes a state may take as JSON: far above any world's (a few hundred bytes a rank), low
/// enough that a wrong file is refused before it is parsed.
pub const STATE_JSON_MAX_BYTES: usize = 16 << 20;

/// Ranks a state's world may have: far above any job, low enough that a damaged state cannot
/// ask for an epoch order of terabytes.
pub const STATE_WORLD_MAX: usize = 1 << 20;

/// A loader's position: what every local rank has been delivered, and the job it belongs to.
/// Small and plain; [`LoaderState::to_json`] and [`LoaderState::from_json`] carry it with a
/// checksum. [`LoaderBuilder::resume_from`](crate::LoaderBuilder::resume_from) continues from
/// it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderState {
    /// [`STATE_VERSION`] of the build that saved it.
    pub version: u32,
    /// What a resumed loader must share with the saved one.
    pub job: JobFingerprint,
    /// Each local rank's next batch, in rank order.
    pub ranks: Vec<RankPosition>,
}

/// The inputs that fix the order: a state resumes only a loader built from the same ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFingerprint {
    /// Samples in the dataset.
    pub samples: u64,
    /// FNV-1a of every sample's size, offset and label, in id order (hex).
    pub dataset: String,
    /// The epoch order: `shuffle seed N`, `sequential`, or `explicit` with its digest.
    pub order: String,
    /// Samples per batch per rank.
    pub batch_size: usize,
    /// Whether the sampler cuts each epoch's tail instead of padding it.
    pub drop_last: bool,
    /// Ranks in the job when saved (a resume may change it: see the module docs).
    pub world: usize,
    /// Ranks per node when saved.
    pub ranks_per_node: usize,
    /// The node that saved it.
    pub node: usize,
}

/// Where one rank's next batch comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankPosition {
    /// The rank (in the job's world).
    pub rank: usize,
    /// The epoch of the next batch.
    pub epoch: u32,
    /// The next batch's iteration number, as [`Batch::iteration`](crate::Batch) gives it.
    pub iteration: u32,
    /// The world whose padding the epoch's order has: the world the epoch began in.
    pub epoch_world: usize,
    /// Entries of the epoch's order every rank together took before the next batch.
    pub consumed: u64,
}

/// The checksummed form a state is written in.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    lobster_loader_state: LoaderState,
    crc32: u32,
}

impl LoaderState {
    /// The state as JSON, with a CRC-32 of its contents so that a changed digit is caught.
    pub fn to_json(&self) -> String {
        let envelope = Envelope {
            crc32: self.crc32(),
            lobster_loader_state: self.clone(),
        };
        serde_json::to_string_pretty(&envelope).expect("a state serialises")
    }

    /// The state in the file at `path`, read through its bound ([`STATE_JSON_MAX_BYTES`])
    /// whatever the file is: a pipe (`--resume <(...)`) is read, a device or a file past the
    /// bound is refused after at most one byte more than it.
    ///
    /// # Errors
    /// A file that cannot be read, holds more than the bound, or is not a state (see
    /// [`from_json`](LoaderState::from_json)), naming the file.
    pub fn read_file(path: &std::path::Path) -> Result<LoaderState, Error> {
        let named = |what: String| Error::StateUnreadable {
            reason: format!("{}: {what}", path.display()),
        };
        let bytes = crate::dataset::read_at_most(path, STATE_JSON_MAX_BYTES as u64)
            .map_err(|e| named(e.to_string()))?;
        let json = String::from_utf8(bytes).map_err(|_| named("not UTF-8".into()))?;
        LoaderState::from_json(&json).map_err(|e| match e {
            Error::StateUnreadable { reason } => named(reason),
            other => other,
        })
    }

    /// A state written by [`to_json`](LoaderState::to_json); anything else (truncated,
    /// edited, another format version) is an error saying what is wrong.
    pub fn from_json(json: &str) -> Result<LoaderState, Error> {
        if json.len() > STATE_JSON_MAX_BYTES {
            return Err(Error::StateUnreadable {
                reason: format!(
                    "{} bytes, more than a state's {STATE_JSON_MAX_BYTES}",
                    json.len()
                ),
            });
        }
        let envelope: Envelope =
            serde_json::from_str(json).map_err(|e| Error::StateUnreadable {
                reason: format!("not a lobster loader state: {e}"),
            })?;
        let state = envelope.lobster_loader_state;
        state.check_version()?;
        let crc = state.crc32();
        if crc != envelope.crc32 {
            return Err(Error::StateUnreadable {
                reason: format!(
                    "checksum {crc:#010x} of its contents differs from the saved {:#010x}: \
                     the state was changed or damaged",
                    envelope.crc32
                ),
            });
        }
        Ok(state)
    }

    /// Where the state resumes, as one line every node of a job must agree on (nodes
    /// whose caches serve each other plan from the same point); `None` without ranks.
    pub fn resume_point(&self) -> Option<String> {
        self.ranks.first().map(|p| {
            format!(
                "epoch {} iteration {} of {} ranks, {} consumed",
                p.epoch, p.iteration, p.epoch_world, p.consumed
            )
        })
    }

    /// Whether this build reads the state's format.
    fn check_version(&self) -> Result<(), Error> {
        if self.version == STATE_VERSION {
            return Ok(());
        }
        Err(Error::Resume {
            field: "version",
            saved: self.version.to_string(),
            now: STATE_VERSION.to_string(),
        })
    }

    fn crc32(&self) -> u32 {
        crc32fast::hash(
            serde_json::to_string(self)
                .expect("a state serialises")
                .as_bytes(),
        )
    }

    /// Where the node's ranks resume: the position every one of them agrees on, checked
    /// against this loader's job.
    pub(crate) fn position(&self, now: &JobFingerprint) -> Result<RankPosition, Error> {
        self.check_version()?;
        let saved = &self.job;
        let same = |field, a: String, b: String| {
            if a == b {
                Ok(())
            } else {
                Err(Error::Resume {
                    field,
                    saved: a,
                    now: b,
                })
            }
        };
        same(
            "samples",
            saved.samples.to_string(),
            now.samples.to_string(),
        )?;
        same("dataset", saved.dataset.clone(), now.dataset.clone())?;
        same("order", saved.order.clone(), now.order.clone())?;
        same(
            "batch_size",
            saved.batch_size.to_string(),
            now.batch_size.to_string(),
        )?;
        same(
            "drop_last",
            saved.drop_last.to_string(),
            now.drop_last.to_string(),
        )?;
        let Some(&first) = self.ranks.first() else {
            return Err(Error::StateUnreadable {
                reason: "no rank positions".into(),
            });
        };
        for r in &self.ranks[1..] {
            let at = |p: &RankPosition| (p.epoch, p.iteration, p.epoch_world, p.consumed);
            if at(r) != at(&first) {
                return Err(Error::Resume {
                    field: "ranks",
                    saved: format!(
                        "rank {} at epoch {} iteration {}, rank {} at epoch {} iteration {}",
                        first.rank, first.epoch, first.iteration, r.rank, r.epoch, r.iteration
                    ),
                    now: "every rank resumed from the same batch: save the state when every \
                          rank has taken the same number of batches (after a training step)"
                        .into(),
                });
            }
        }
        if first.epoch_world == 0 || first.epoch_world > STATE_WORLD_MAX {
            return Err(Error::StateUnreadable {
                reason: format!(
                    "epoch_world {}: 1 to {STATE_WORLD_MAX} ranks",
                    first.epoch_world
                ),
            });
        }
        Ok(first)
    }
}

impl JobFingerprint {
    /// This loader's fingerprint.
    pub(crate) fn of(dataset: &Dataset, order: &EpochOrder, config: &LoaderConfig) -> Self {
        let fnv = |h: u64, bytes: &[u8]| {
            bytes.iter().fold(h, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        };
        const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;
        let digest = dataset.samples().iter().fold(FNV_START, |h, s| {
            let h = fnv(h, &s.size_bytes.to_le_bytes());
            let h = fnv(h, &s.offset.to_le_bytes());
            fnv(h, &s.label.to_le_bytes())
        });
        let order = match order {
            EpochOrder::Shuffle { seed } => format!("shuffle seed {seed}"),
            EpochOrder::Sequential => "sequential".into(),
            EpochOrder::Explicit(orders) => {
                let h = orders.iter().fold(FNV_START, |h, epoch| {
                    epoch.iter().fold(h, |h, i| fnv(h, &i.to_le_bytes()))
                });
                format!("explicit {} epochs {h:016x}", orders.len())
            }
        };
        JobFingerprint {
            samples: dataset.len() as u64,
            dataset: format!("{digest:016x}"),
            order,
            batch_size: config.job.batch_size,
            drop_last: config.job.drop_last,
            world: config.world(),
            ranks_per_node: config.job.ranks_per_node,
            node: config.job.node,
        }
    }
}

/// Where a run resumed at `at` starts: its first epoch, and the rest of that epoch split over
/// `sampler`'s world when it resumes within one.
pub(crate) fn start(
    at: &RankPosition,
    sampler: &DistributedSampler,
    batch: usize,
) -> Result<(u32, Option<Head>), Error> {
    if at.consumed == 0 {
        if at.iteration != 0 {
            return Err(Error::StateUnreadable {
                reason: format!(
                    "iteration {} of epoch {} with nothing of it consumed",
                    at.iteration, at.epoch
                ),
            });
        }
        return Ok((at.epoch, None));
    }
    let base = sampler.with_world(at.epoch_world)?;
    let order = base.epoch_indices(at.epoch);
    let consumed = usize::try_from(at.consumed).unwrap_or(usize::MAX);
    if consumed >= order.len() {
        return Err(Error::Resume {
            field: "consumed",
            saved: at.consumed.to_string(),
            now: format!(
                "below the {} entries of epoch {}'s order for {} ranks",
                order.len(),
                at.epoch,
                at.epoch_world
            ),
        });
    }
    let world = sampler.world();
    let mut rest = order[consumed..].to_vec();
    if sampler.drop_last() {
        rest.truncate(rest.len() / world * world);
    } else {
        let mut i = 0;
        while rest.len() % world != 0 {
            rest.push(rest[i]);
            i += 1;
        }
    }
    let per_rank = rest.len() / world;
    let first_iteration = consumed / (batch * world);
    if world == at.epoch_world && first_iteration != at.iteration as usize {
        return Err(Error::StateUnreadable {
            reason: format!(
                "iteration {} but {} entries of epoch {} consumed by {world} ranks of batch \
                 {batch}",
                at.iteration, at.consumed, at.epoch
            ),
        });
    }
    Ok((
        at.epoch,
        Some(Head {
            order: rest.into(),
            per_rank,
            first_iteration,
            epoch_world: at.epoch_world,
            consumed: at.consumed,
        }),
    ))
}

/// How a run's batches map to positions: what a process that hands a rank its batches (a
/// node's host and its rank processes) needs to say where the rank is, from the number of
/// batches it was given. [`Loader::positions`](crate::Loader::positions) gives it; it is
/// plain data, so it can be sent to another process as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Positions {
    /// The job the positions belong to.
    pub job: JobFingerprint,
    /// The run's first rank on this node.
    pub first_rank: usize,
    /// Ranks in the world.
    pub world: usize,
    /// Samples per batch per rank.
    pub batch_size: usize,
    /// Iterations of a whole epoch.
    pub iterations: u64,
    /// The run's epochs.
    pub epochs: u32,
    /// The run's first epoch.
    pub start_epoch: u32,
    /// Where the run begins within its first epoch, when resumed within it: (iterations it
    /// has, the first one's number, the epoch's world, entries consumed before it).
    pub head: Option<(u64, u32, usize, u64)>,
}

impl Positions {
    pub(crate) fn of(layout: &Layout, job: JobFingerprint) -> Positions {
        Positions {
            job,
            first_rank: layout.first_rank,
            world: layout.world,
            batch_size: layout.batch,
            iterations: layout.iterations() as u64,
            epochs: layout.epochs,
            start_epoch: layout.start_epoch,
            head: layout.head.as_ref().map(|h| {
                (
                    h.steps(layout.batch) as u64,
                    h.first_iteration as u32,
                    h.epoch_world,
                    h.consumed,
                )
            }),
        }
    }

    /// Where local rank `rank` is after it was given `taken` batches of the run.
    pub fn after(&self, rank: usize, taken: u64) -> RankPosition {
        let per_step = (self.batch_size * self.world) as u64;
        let rank = self.first_rank + rank;
        let mut left = taken;
        let mut epoch = self.start_epoch;
        if let Some((steps, first_iteration, epoch_world, consumed)) = self.head {
            if left < steps {
                return RankPosition {
                    rank,
                    epoch,
                    iteration: first_iteration + left as u32,
                    epoch_world,
                    consumed: consumed + left * per_step,
                };
            }
            left -= steps;
            epoch += 1;
        }
        let epochs_done = u32::try_from(left / self.iterations).unwrap_or(u32::MAX);
        let epoch = epoch.saturating_add(epochs_done).min(self.epochs);
        let iteration = if epoch == self.epochs {
            0
        } else {
            left % self.iterations
        };
        RankPosition {
            rank,
            epoch,
            iteration: iteration as u32,
            epoch_world: self.world,
            consumed: iteration * per_step,
        }
    }

    /// The state of the node whose local ranks were given `taken` batches each.
    pub fn state(&self, taken: &[u64]) -> LoaderState {
        LoaderState {
            version: STATE_VERSION,
            job: self.job.clone(),
            ranks: taken
                .iter()
                .enumerate()
                .map(|(rank, &t)| self.after(rank, t))
                .collect(),
        }
    }
}

/// The `loader_state` fuzz target: arbitrary bytes as a state file are read or refused, and a
/// state that reads resumes a small job or is refused; never a panic, a loop, or an
/// allocation beyond the job's size.
#[cfg(fuzzing)]
pub(crate) fn fuzz_check(data: &[u8]) {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(state) = LoaderState::from_json(json) else {
        return;
    };
    assert_eq!(
        LoaderState::from_json(&state.to_json()).ok(),
        Some(state.clone())
    );
    let Ok(at) = state.position(&state.job) else {
        return;
    };
    let sampler = DistributedSampler::new(100, 4, false, EpochOrder::Shuffle { seed: 1 })
        .expect("a valid sampler");
    if let Ok((_, Some(head))) = start(&at, &sampler, 3) {
        assert_eq!(head.order.len(), head.per_rank * 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state file is read through its bound whatever it is: a pipe holding a state is
    /// read, a device or a pipe past the bound refused naming the file and the bound.
    #[test]
    fn a_state_file_is_read_at_most_its_bound_whatever_it_is() {
        let bound = STATE_JSON_MAX_BYTES.to_string();
        let e = LoaderState::read_file(std::path::Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/zero") && e.contains(&bound), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let fifo = |name: &str, bytes: Vec<u8>| {
            let at = dir.path().join(name);
            let made = std::process::Command::new("mkfifo")
                .arg(&at)
                .status()
                .unwrap();
            assert!(made.success());
            let path = at.clone();
            let writer = std::thread::spawn(move || {
                use std::io::Write;
                let mut f = std::fs::File::options().write(true).open(&path).unwrap();
                let _ = f.write_all(&bytes);
            });
            (at, writer)
        };
        let (at, writer) = fifo("state.json", state().to_json().into_bytes());
        assert_eq!(LoaderState::read_file(&at).unwrap(), state());
        writer.join().unwrap();
        let (at, writer) = fifo("long.json", vec![b' '; STATE_JSON_MAX_BYTES + 1]);
        let e = LoaderState::read_file(&at).unwrap_err().to_string();
        writer.join().unwrap();
        assert!(e.contains("long.json") && e.contains(&bound), "{e}");
        let big = dir.path().join("big.json");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(STATE_JSON_MAX_BYTES as u64 + 1).unwrap();
        let e = LoaderState::read_file(&big).unwrap_err().to_string();
        assert!(e.contains("big.json") && e.contains(&bound), "{e}");
    }

    fn state() -> LoaderState {
        LoaderState {
            version: STATE_VERSION,
            job: JobFingerprint {
                samples: 10,
                dataset: "00ff".into(),
                order: "shuffle seed 3".into(),
                batch_size: 2,
                drop_last: false,
                world: 2,
                ranks_per_node: 2,
                node: 0,
            },
            ranks: (0..2)
                .map(|rank| RankPosition {
                    rank,
                    epoch: 1,
                    iteration: 1,
                    epoch_world: 2,
                    consumed: 4,
                })
                .collect(),
        }
    }

    #[test]
    fn a_state_round_trips_through_json_and_a_changed_digit_is_refused() {
        let json = state().to_json();
        assert_eq!(LoaderState::from_json(&json).unwrap(), state());
        let edited = json.replace("\"consumed\": 4", "\"consumed\": 6");
        assert_ne!(edited, json, "the edit must change something");
        let err = LoaderState::from_json(&edited).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        let err = LoaderState::from_json(&json[..json.len() / 2]).unwrap_err();
        assert!(
            err.to_string().contains("not a lobster loader state"),
            "{err}"
        );
    }

    #[test]
    fn another_version_is_refused_naming_the_field() {
        let mut old = state();
        old.version = STATE_VERSION + 1;
        let err = LoaderState::from_json(&old.to_json()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Resume {
                    field: "version",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn ranks_at_different_batches_are_refused() {
        let mut s = state();
        s.ranks[1].iteration = 2;
        s.ranks[1].consumed = 8;
        let err = s.position(&state().job).unwrap_err();
        assert!(matches!(err, Error::Resume { field: "ranks", .. }), "{err}");
    }

    /// The rest of an epoch split over another world takes every entry of it once, padded
    /// to the world as the sampler pads.
    #[test]
    fn the_rest_of_an_epoch_over_another_world_is_every_remaining_entry_once() {
        let order = EpochOrder::Shuffle { seed: 5 };
        for (samples, from, to, drop_last) in [
            (103, 8, 4, false),
            (103, 4, 8, false),
            (100, 4, 8, true),
            (17, 2, 3, false),
        ] {
            let old = DistributedSampler::new(samples, from, drop_last, order.clone()).unwrap();
            let new = DistributedSampler::new(samples, to, drop_last, order.clone()).unwrap();
            let q = old.epoch_indices(0);
            let batch = 2;
            let consumed = 2 * batch * from; // two steps of the old world
            let at = RankPosition {
                rank: 0,
                epoch: 0,
                iteration: 2,
                epoch_world: from,
                consumed: consumed as u64,
            };
            let (epoch, head) = start(&at, &new, batch).unwrap();
            let head = head.expect("resumed within the epoch");
            assert_eq!(epoch, 0);
            let rest = &q[consumed..];
            let taken = &head.order[..];
            if drop_last {
                assert_eq!(taken, &rest[..rest.len() / to * to]);
            } else {
                assert_eq!(&taken[..rest.len()], rest, "{samples} {from}->{to}");
                assert!(taken.len() - rest.len() < to, "padding below one world");
            }
            assert_eq!(head.per_rank * to, taken.len());
        }
    }
}
