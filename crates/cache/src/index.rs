//! The next-use index: a multi-epoch stream, read a window of epochs at a time.

use std::collections::{HashMap, VecDeque};
use std::mem::size_of;
use std::sync::Arc;

use crate::policy::NEVER;
use crate::{CacheError, SampleId};

/// A stream of accesses made of epochs that can be (re)generated on demand, in any order.
///
/// The planner regenerates an epoch each time it needs it (a few times per epoch of the
/// stream), so `fill_epoch` should be cheap and must be deterministic.
pub trait StreamSource {
    /// Number of epochs in the stream.
    fn epochs(&self) -> u32;

    /// Appends the sample ids accessed in `epoch`, in stream order, to `out` (which the
    /// caller has cleared). Must return the same ids every time it is called.
    fn fill_epoch(&self, epoch: u32, out: &mut Vec<SampleId>);
}

impl<S: StreamSource + ?Sized> StreamSource for &S {
    fn epochs(&self) -> u32 {
        (**self).epochs()
    }

    fn fill_epoch(&self, epoch: u32, out: &mut Vec<SampleId>) {
        (**self).fill_epoch(epoch, out)
    }
}

impl<S: StreamSource + ?Sized> StreamSource for Arc<S> {
    fn epochs(&self) -> u32 {
        (**self).epochs()
    }

    fn fill_epoch(&self, epoch: u32, out: &mut Vec<SampleId>) {
        (**self).fill_epoch(epoch, out)
    }
}

/// A stream whose epochs are held in memory (traces, tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VecSource {
    epochs: Vec<Vec<SampleId>>,
}

impl VecSource {
    /// A stream of the given epochs.
    ///
    /// # Panics
    /// If there are more than `u32::MAX` epochs.
    pub fn new(epochs: Vec<Vec<SampleId>>) -> Self {
        assert!(
            u32::try_from(epochs.len()).is_ok(),
            "at most u32::MAX epochs"
        );
        VecSource { epochs }
    }

    /// The epochs.
    pub fn as_epochs(&self) -> &[Vec<SampleId>] {
        &self.epochs
    }
}

impl StreamSource for VecSource {
    fn epochs(&self) -> u32 {
        self.epochs.len() as u32
    }

    fn fill_epoch(&self, epoch: u32, out: &mut Vec<SampleId>) {
        out.extend_from_slice(&self.epochs[epoch as usize]);
    }
}

/// One access of the stream with the position of the sample's next access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// 0-based position in the whole stream.
    pub position: u64,
    /// Epoch of the access.
    pub epoch: u32,
    /// The sample accessed.
    pub sample: SampleId,
    /// Position of the sample's next access, [`NEVER`] if none (or if the index was built
    /// without look-ahead).
    pub next_use: u64,
}

/// Batch slots are 32-bit; `NEXT_NEVER` and `NEXT_FAR` are not slots.
const MAX_BATCH_ACCESSES: usize = NEXT_FAR as usize;
const NEXT_NEVER: u32 = u32::MAX;
const NEXT_FAR: u32 = u32::MAX - 1;
/// Deltas from here on go to the `far` map; tiny under test so the checker covers that path.
const FAR_FROM: u64 = if cfg!(any(test, fuzzing)) {
    40
} else {
    NEXT_FAR as u64
};

/// Accesses per group whose table entries are loaded together in the backward pass.
const WARM_AHEAD: usize = 16;

/// The frontier keeps batch ids modulo `BATCH_MOD` in 16 bits; `NO_BATCH` is none. Every
/// `SWEEP_EVERY` batches it forgets the batches too old to matter, so the age of every id
/// it holds stays below `BATCH_MOD` and decodes exactly. Small under test, so the checker
/// covers the wrap.
const BATCH_MOD: u32 = if cfg!(any(test, fuzzing)) { 16 } else { 65_535 };
const NO_BATCH: u16 = u16::MAX;
const SWEEP_EVERY: u32 = if cfg!(any(test, fuzzing)) { 4 } else { 32_768 };
/// Batches the frontier may plan ahead of the one being built; small under test so the
/// checker covers the fallback scan.
const PLAN_MAX: usize = if cfg!(any(test, fuzzing)) { 6 } else { 256 };
const _: () = assert!(PLAN_MAX as u32 + 1 + SWEEP_EVERY < BATCH_MOD);

/// A batch whose epochs the frontier has read.
#[derive(Debug)]
struct Planned {
    id: u32,
    first_epoch: u32,
    /// One past its last epoch so far (final once a later batch is planned or the frontier
    /// has read the whole stream).
    end_epoch: u32,
    /// Position of its first access.
    base: u64,
    accesses: usize,
    /// Next uses after this batch that lie beyond the batch after it: (sample, position -
    /// `base`), those too far for 32 bits in `far_answers`.
    answers: Vec<[u32; 2]>,
    far_answers: Vec<(SampleId, u64)>,
}

/// Encodes next use `pos` relative to `base`, spilling far ones to `far` under `key`.
#[inline]
fn encode(far: &mut HashMap<u32, u64>, base: u64, key: u32, pos: u64) -> u32 {
    let delta = pos - base;
    if delta < FAR_FROM {
        delta as u32
    } else {
        far.insert(key, pos);
        NEXT_FAR
    }
}

/// Yields a stream's accesses in order, each with its exact next use, while holding only a
/// batch of epochs.
///
/// How: epochs are read into a batch of at most `batch_accesses_max` accesses (at least one
/// epoch). Each sample needs its first access after the batch: the epochs of the next batch
/// are regenerated and scanned for them (near look-ahead). The few samples not found there
/// (for a node that sees each sample with probability `f` per epoch, a fraction
/// `(1 - f)^epochs per batch`) come from the frontier: a single pass over the stream, ahead
/// of the batches, that reads each epoch once, remembers the latest batch of each sample,
/// and records an answer when a sample comes back after skipping a whole batch. So each
/// epoch is generated about three times (batch, near look-ahead, frontier) however long
/// samples stay away, instead of once per batch that waits for them (the first batch still
/// waits: the frontier's lead is built then, once per stream). Past its bounds (see
/// memory) the frontier stops and the remaining samples are found by regenerating the
/// following epochs, as many as they need. A backward pass over the batch then gives each
/// access the next use of its sample and replaces it by its own position.
///
/// Memory: 6 bytes + 1 bit per sample + 8 bytes per access of the batch + one epoch of
/// scratch (4 bytes per access) + 8 bytes per frontier answer (it stops reading once it
/// holds `num_samples / 4 + 1024`, or plans 256 batches). Next uses are stored as
/// 32-bit offsets from the batch start; the rare ones beyond 2^32 accesses go to a map.
#[derive(Debug)]
pub struct NextUseIndex<S> {
    source: S,
    num_samples: usize,
    epochs: u32,
    look_ahead: bool,
    batch_accesses_max: usize,
    samples: Vec<SampleId>,
    /// Next use of each access of the batch, relative to `batch_position`: `NEXT_NEVER`, or
    /// `NEXT_FAR` when it does not fit in 32 bits (then it is in `far`).
    next: Vec<u32>,
    /// std's hasher here and in `far_of`, not ahash as in `Store`: only next uses 2^32 or
    /// more accesses ahead land in them, so no realistic stream touches them per access.
    far: HashMap<u32, u64>,
    /// (epoch, index of its first access in `samples`) for each epoch of the batch.
    bounds: Vec<(u32, usize)>,
    bound: usize,
    cursor: usize,
    batch_position: u64,
    following_position: u64,
    following_epoch: u32,
    /// Per sample: next use after the part of the batch already scanned backwards, as in
    /// `next` (meaningful only for samples of the batch).
    next_of: Vec<u32>,
    /// `next_of` values that do not fit in 32 bits.
    far_of: HashMap<SampleId, u64>,
    /// Samples of the batch whose next use after the batch is not found yet.
    pending: Vec<u64>,
    scratch: Vec<SampleId>,
    epochs_generated: u64,
    /// Frontier: per sample, the id (modulo `BATCH_MOD`) of the latest batch it was seen
    /// in, or `NO_BATCH`.
    last_batch: Vec<u16>,
    /// Batches from the one built next (or being built) to the frontier's.
    plan: VecDeque<Planned>,
    front_epoch: u32,
    front_position: u64,
    next_batch_id: u32,
    answers_held: usize,
    answers_max: usize,
}

impl<S: StreamSource> NextUseIndex<S> {
    /// An index over `source`, whose sample ids are below `num_samples`.
    ///
    /// With `look_ahead` false, next uses are not computed (all [`NEVER`]) and each batch is
    /// one epoch: what the baselines need. `batch_accesses_max` is clamped to at least 1.
    pub fn new(source: S, num_samples: usize, look_ahead: bool, batch_accesses_max: usize) -> Self {
        let epochs = source.epochs();
        NextUseIndex {
            source,
            num_samples,
            epochs,
            look_ahead,
            batch_accesses_max: batch_accesses_max.clamp(1, MAX_BATCH_ACCESSES),
            samples: Vec::new(),
            next: Vec::new(),
            far: HashMap::new(),
            bounds: Vec::new(),
            bound: 0,
            cursor: 0,
            batch_position: 0,
            following_position: 0,
            following_epoch: 0,
            next_of: if look_ahead {
                vec![NEXT_NEVER; num_samples]
            } else {
                Vec::new()
            },
            far_of: HashMap::new(),
            pending: if look_ahead {
                vec![0; num_samples.div_ceil(64)]
            } else {
                Vec::new()
            },
            scratch: Vec::new(),
            epochs_generated: 0,
            last_batch: if look_ahead {
                vec![NO_BATCH; num_samples]
            } else {
                Vec::new()
            },
            plan: VecDeque::new(),
            front_epoch: 0,
            front_position: 0,
            next_batch_id: 0,
            answers_held: 0,
            answers_max: if cfg!(any(test, fuzzing)) {
                4
            } else {
                num_samples / 4 + 1024
            },
        }
    }

    /// The next access, or `None` at the end of the stream.
    ///
    /// # Errors
    /// [`CacheError::SampleOutOfRange`] if the source names a sample id not below
    /// `num_samples`.
    ///
    /// # Panics
    /// If a single epoch has `u32::MAX` accesses or more.
    #[inline]
    pub fn next_access(&mut self) -> Result<Option<Access>, CacheError> {
        loop {
            if self.cursor < self.samples.len() {
                let c = self.cursor;
                while self.bound + 1 < self.bounds.len() && self.bounds[self.bound + 1].1 <= c {
                    self.bound += 1;
                }
                self.cursor += 1;
                return Ok(Some(Access {
                    position: self.batch_position + c as u64,
                    epoch: self.bounds[self.bound].0,
                    sample: self.samples[c],
                    next_use: if self.look_ahead {
                        self.next_use(c)
                    } else {
                        NEVER
                    },
                }));
            }
            if !self.build_batch()? {
                return Ok(None);
            }
        }
    }

    /// Up to `n` samples accessed next, as far as the current batch reaches.
    pub fn upcoming(&self, n: usize) -> &[SampleId] {
        let end = self.samples.len().min(self.cursor + n);
        &self.samples[self.cursor.min(end)..end]
    }

    /// Epochs generated so far, counting every regeneration (look-ahead included).
    pub fn epochs_generated(&self) -> u64 {
        self.epochs_generated
    }

    /// Heap bytes held by the index.
    pub fn memory_bytes(&self) -> usize {
        self.next_of.capacity() * size_of::<u32>()
            + self.pending.capacity() * size_of::<u64>()
            + self.far_of.capacity() * size_of::<(SampleId, u64)>()
            + (self.samples.capacity() + self.scratch.capacity()) * size_of::<SampleId>()
            + self.next.capacity() * size_of::<u32>()
            + self.far.capacity() * size_of::<(u32, u64)>()
            + self.bounds.capacity() * size_of::<(u32, usize)>()
            + self.last_batch.capacity() * size_of::<u16>()
            + self.plan.capacity() * size_of::<Planned>()
            + self
                .plan
                .iter()
                .map(|p| {
                    p.answers.capacity() * size_of::<[u32; 2]>()
                        + p.far_answers.capacity() * size_of::<(SampleId, u64)>()
                })
                .sum::<usize>()
    }

    /// The stream source.
    pub fn source(&self) -> &S {
        &self.source
    }

    fn fill(&mut self, epoch: u32) -> Result<(), CacheError> {
        self.scratch.clear();
        self.source.fill_epoch(epoch, &mut self.scratch);
        self.epochs_generated += 1;
        assert!(
            self.scratch.len() <= MAX_BATCH_ACCESSES,
            "epoch {epoch} has {} accesses; at most {} are supported",
            self.scratch.len(),
            MAX_BATCH_ACCESSES
        );
        let n = self.num_samples;
        if let Some(&sample) = self.scratch.iter().find(|&&s| s as usize >= n) {
            return Err(CacheError::SampleOutOfRange {
                sample,
                epoch,
                num_samples: n,
            });
        }
        Ok(())
    }

    #[inline]
    fn next_use(&self, c: usize) -> u64 {
        match self.next[c] {
            NEXT_NEVER => NEVER,
            NEXT_FAR => self.far[&(c as u32)],
            delta => self.batch_position + u64::from(delta),
        }
    }

    /// Puts epoch `e` (at most the frontier's) in `scratch`, through the frontier if it has
    /// not read it yet.
    fn obtain(&mut self, e: u32) -> Result<(), CacheError> {
        debug_assert!(e <= self.front_epoch);
        if e == self.front_epoch {
            self.advance_front()
        } else {
            self.fill(e)
        }
    }

    /// Whether epoch `e`, read by the frontier, belongs to the batch after the one being
    /// built.
    fn in_next_batch(&self, e: u32) -> bool {
        self.plan.get(1).is_some_and(|p| e < p.end_epoch)
    }

    /// The frontier reads one more epoch into `scratch`: extends the plan and records the
    /// samples that come back after skipping a whole batch.
    fn advance_front(&mut self) -> Result<(), CacheError> {
        let e = self.front_epoch;
        self.fill(e)?;
        let n = self.scratch.len();
        let new_batch = match self.plan.back() {
            None => true,
            Some(p) => {
                p.end_epoch < e
                    || (p.end_epoch > p.first_epoch && p.accesses + n > self.batch_accesses_max)
            }
        };
        if new_batch {
            self.plan.push_back(Planned {
                id: self.next_batch_id,
                first_epoch: e,
                end_epoch: e,
                base: self.front_position,
                accesses: 0,
                answers: Vec::new(),
                far_answers: Vec::new(),
            });
            self.next_batch_id += 1;
            if self.next_batch_id % SWEEP_EVERY == 0 {
                self.forget_old_batches();
            }
        }
        let oldest = self.plan[0].id;
        let current = {
            let p = self.plan.back_mut().expect("planned");
            p.end_epoch = e + 1;
            p.accesses += n;
            p.id
        };
        let current_mod = (current % BATCH_MOD) as u16;
        // Batches `last` with `2 <= current - last <= current - oldest` need an answer.
        let outstanding = current - oldest;
        for (i, &s) in self.scratch.iter().enumerate() {
            let last_mod = self.last_batch[s as usize];
            if last_mod == current_mod {
                continue;
            }
            self.last_batch[s as usize] = current_mod;
            if last_mod == NO_BATCH {
                continue;
            }
            let age = (u32::from(current_mod) + BATCH_MOD - u32::from(last_mod)) % BATCH_MOD;
            // Back after skipping batch `last + 1`: `last` needs this position.
            if (2..=outstanding).contains(&age) {
                let last = current - age;
                let p = self.front_position + i as u64;
                let batch = &mut self.plan[(last - oldest) as usize];
                match u32::try_from(p - batch.base) {
                    Ok(delta) if u64::from(delta) < FAR_FROM => batch.answers.push([s, delta]),
                    _ => batch.far_answers.push((s, p)),
                }
                self.answers_held += 1;
            }
        }
        self.front_epoch = e + 1;
        self.front_position += n as u64;
        Ok(())
    }

    /// Forgets the batches of samples last seen more than `PLAN_MAX + 1` batches before the
    /// newest (none of them is still to be built), so held ids never age past `BATCH_MOD`.
    fn forget_old_batches(&mut self) {
        let newest = (self.next_batch_id - 1) % BATCH_MOD;
        for last in &mut self.last_batch {
            if *last != NO_BATCH {
                let age = (newest + BATCH_MOD - u32::from(*last)) % BATCH_MOD;
                if age > PLAN_MAX as u32 + 1 {
                    *last = NO_BATCH;
                }
            }
        }
    }

    /// Gives the batch being built (at `base`) the next uses the frontier found for it;
    /// returns how many.
    fn apply_answers(&mut self, base: u64) -> usize {
        let mut answers = std::mem::take(&mut self.plan[0].answers);
        let mut far_answers = std::mem::take(&mut self.plan[0].far_answers);
        let found = answers.len() + far_answers.len();
        self.answers_held -= found;
        debug_assert_eq!(self.plan[0].base, base);
        let near = answers
            .drain(..)
            .map(|[s, delta]| (s, base + u64::from(delta)));
        for (s, p) in near.chain(far_answers.drain(..)) {
            let (w, b) = (s as usize / 64, 1u64 << (s % 64));
            debug_assert!(
                self.pending[w] & b != 0,
                "answer for sample {s} not pending"
            );
            self.pending[w] &= !b;
            self.next_of[s as usize] = encode(&mut self.far_of, base, s, p);
        }
        // Keep the allocations for the answers to come.
        self.plan[0].answers = answers;
        self.plan[0].far_answers = far_answers;
        found
    }

    /// Regenerates the epochs from the frontier on until the `pending` samples are found or
    /// the stream ends (the frontier has found none of them before it); returns how many
    /// are left.
    fn scan_from_front(&mut self, base: u64, mut pending: usize) -> Result<usize, CacheError> {
        let mut pos = self.front_position;
        let mut e = self.front_epoch;
        'ahead: while pending > 0 && e < self.epochs {
            self.fill(e)?;
            for &s in &self.scratch {
                let (w, b) = (s as usize / 64, 1u64 << (s % 64));
                if self.pending[w] & b != 0 {
                    self.pending[w] &= !b;
                    self.next_of[s as usize] = encode(&mut self.far_of, base, s, pos);
                    pending -= 1;
                    if pending == 0 {
                        break 'ahead;
                    }
                }
                pos += 1;
            }
            e += 1;
        }
        Ok(pending)
    }

    /// Reads the next batch of epochs and resolves their next uses. False at the end.
    fn build_batch(&mut self) -> Result<bool, CacheError> {
        self.samples.clear();
        self.next.clear();
        self.far.clear();
        self.bounds.clear();
        self.bound = 0;
        self.cursor = 0;
        self.batch_position = self.following_position;
        if self.following_epoch >= self.epochs {
            return Ok(false);
        }
        let base = self.batch_position;
        let mut e = self.following_epoch;
        if !self.look_ahead {
            self.fill(e)?;
            self.bounds.push((e, 0));
            std::mem::swap(&mut self.samples, &mut self.scratch);
            self.following_epoch = e + 1;
            self.following_position = base + self.samples.len() as u64;
            return Ok(true);
        }
        // The batch: the frontier's next planned batch (planned now if not yet reached).
        let mut carried = false;
        while e < self.epochs {
            if e < self.front_epoch && e >= self.plan[0].end_epoch {
                break;
            }
            self.obtain(e)?;
            if e >= self.plan[0].end_epoch {
                // The first epoch of the next batch, just read by the frontier.
                carried = true;
                break;
            }
            self.bounds.push((e, self.samples.len()));
            // Exact growth: the batch is the bulk of the planner's memory.
            self.samples.reserve_exact(self.scratch.len());
            self.samples.extend_from_slice(&self.scratch);
            e += 1;
        }
        let len = self.samples.len();
        self.following_epoch = e;
        self.following_position = base + len as u64;
        let batch_id = self.plan[0].id;

        // Which samples need a next use after the batch (a bit set small enough for cache).
        let mut pending = 0usize;
        for &s in &self.samples {
            let (w, b) = (s as usize / 64, 1u64 << (s % 64));
            if self.pending[w] & b == 0 {
                self.pending[w] |= b;
                pending += 1;
            }
        }
        // Near look-ahead: the next batch, whole (the frontier answers only beyond it).
        let mut pos = base + len as u64;
        while pending > 0 && e < self.epochs {
            if !carried {
                if e < self.front_epoch && !self.in_next_batch(e) {
                    break;
                }
                self.obtain(e)?;
                if !self.in_next_batch(e) {
                    break;
                }
            }
            carried = false;
            for &s in &self.scratch {
                let (w, b) = (s as usize / 64, 1u64 << (s % 64));
                if self.pending[w] & b != 0 {
                    self.pending[w] &= !b;
                    self.next_of[s as usize] = encode(&mut self.far_of, base, s, pos);
                    pending -= 1;
                }
                pos += 1;
            }
            e += 1;
        }
        // The rest: answers of the frontier, which reads on while it may.
        loop {
            pending -= self.apply_answers(base);
            if pending == 0 || self.front_epoch >= self.epochs {
                break;
            }
            if self.answers_held >= self.answers_max || self.plan.len() >= PLAN_MAX {
                pending = self.scan_from_front(base, pending)?;
                break;
            }
            self.advance_front()?;
        }
        debug_assert_eq!(self.plan[0].id, batch_id);
        self.plan.pop_front();
        if pending > 0 {
            self.never_used_again();
        }
        self.link_backwards(base, len);
        self.far_of.clear();
        Ok(true)
    }

    /// Samples still pending after the batch are never used again.
    fn never_used_again(&mut self) {
        for (w, word) in self.pending.iter_mut().enumerate() {
            while *word != 0 {
                let b = word.trailing_zeros() as usize;
                *word &= *word - 1;
                self.next_of[w * 64 + b] = NEXT_NEVER;
            }
        }
    }

    /// Backwards through the batch: each access takes its sample's next use, then becomes
    /// it. Writes `next` in order; one random read-modify-write per access.
    fn link_backwards(&mut self, base: u64, len: usize) {
        self.next.clear();
        self.next.reserve_exact(len);
        self.next.resize(len, NEXT_NEVER);
        for q in (0..len).rev() {
            if q % WARM_AHEAD == 0 && q >= 2 * WARM_AHEAD {
                // Load the entries of the group after next all at once, so the misses overlap
                // each other and the current group's work.
                let group = &self.samples[q - 2 * WARM_AHEAD..q - WARM_AHEAD];
                let acc = group
                    .iter()
                    .fold(0u32, |acc, &s| acc.wrapping_add(self.next_of[s as usize]));
                std::hint::black_box(acc);
            }
            let s = self.samples[q];
            let mut v = self.next_of[s as usize];
            if v == NEXT_FAR {
                let p = self.far_of.remove(&s).expect("far next use recorded");
                self.far.insert(q as u32, p);
            }
            self.next[q] = v;
            v = encode(&mut self.far_of, base, s, base + q as u64);
            self.next_of[s as usize] = v;
        }
    }
}
