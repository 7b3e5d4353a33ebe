//! Two forms in one budget: per sample the cache holds nothing, its encoded bytes, or its
//! decoded image. A decoded image is several times larger, but a hit on it saves the decode
//! as well as the read. The rule is [`FormPolicy`]'s.

use std::fmt;
use std::mem::size_of;
use std::sync::Arc;

use crate::heap::{Entry, QuadHeap};
use crate::index::{NextUseIndex, StreamSource};
use crate::policy::NEVER;
use crate::{CacheError, SampleId};

/// What the cache keeps of a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Form {
    /// The bytes as stored: a hit saves the read.
    Encoded,
    /// The decoder's full output: a hit saves the read and the decode.
    Decoded,
}

impl Form {
    /// Both forms, in the order tables print them.
    pub const ALL: [Form; 2] = [Form::Encoded, Form::Decoded];

    pub(crate) fn index(self) -> usize {
        match self {
            Form::Encoded => 0,
            Form::Decoded => 1,
        }
    }

    /// The form's name: `encoded` or `decoded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Form::Encoded => "encoded",
            Form::Decoded => "decoded",
        }
    }
}

impl fmt::Display for Form {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which forms the cache may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum FormChoice {
    /// Encoded bytes only (what a cache without a decoded tier keeps).
    #[default]
    #[cfg_attr(feature = "clap", value(help = "Encoded bytes"))]
    Encoded,
    /// Decoded images only.
    #[cfg_attr(feature = "clap", value(help = "Decoded images"))]
    Decoded,
    /// Either, per sample and per use, by the rule of [`FormPolicy`].
    #[cfg_attr(feature = "clap", value(help = "Either, by the cost model"))]
    Auto,
}

impl FormChoice {
    /// Every choice, in the order tables print them.
    pub const ALL: [FormChoice; 3] = [FormChoice::Encoded, FormChoice::Decoded, FormChoice::Auto];

    /// Whether `form` may be held.
    pub fn allows(self, form: Form) -> bool {
        match self {
            FormChoice::Encoded => form == Form::Encoded,
            FormChoice::Decoded => form == Form::Decoded,
            FormChoice::Auto => true,
        }
    }
}

names!(FormChoice, CacheError, |name: &str| CacheError::UnknownFormChoice {
    name: name.to_owned()
}, {
    Encoded => "encoded",
    Decoded => "decoded",
    Auto => "auto",
});

/// The time a hit saves, as lines in the encoded size: reading a sample costs
/// `read_s + read_per_byte_s * bytes`, decoding it `decode_s + decode_per_byte_s * bytes`.
/// An encoded hit saves the read, a decoded hit both.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FormCosts {
    /// Fixed time of one read, in seconds.
    pub read_s: f64,
    /// Read time per encoded byte, in seconds.
    pub read_per_byte_s: f64,
    /// Fixed time of one decode, in seconds.
    pub decode_s: f64,
    /// Decode time per encoded byte, in seconds.
    pub decode_per_byte_s: f64,
}

impl FormCosts {
    /// Seconds a hit on a sample of `encoded_bytes` kept in `form` saves.
    pub fn saving_s(&self, form: Form, encoded_bytes: u32) -> f64 {
        let b = f64::from(encoded_bytes);
        let read = self.read_s + self.read_per_byte_s * b;
        match form {
            Form::Encoded => read,
            Form::Decoded => read + self.decode_s + self.decode_per_byte_s * b,
        }
    }

    /// Checks that every cost is finite and non-negative.
    ///
    /// # Errors
    /// [`CacheError::InvalidCost`] naming the first that is not.
    pub fn validate(&self) -> Result<(), CacheError> {
        for (parameter, value) in [
            ("read_s", self.read_s),
            ("read_per_byte_s", self.read_per_byte_s),
            ("decode_s", self.decode_s),
            ("decode_per_byte_s", self.decode_per_byte_s),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(CacheError::InvalidCost { parameter, value });
            }
        }
        Ok(())
    }
}

/// What one access found and what the cache keeps of its sample afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FormOutcome {
    /// The form the sample was cached in when accessed: a hit.
    pub hit: Option<Form>,
    /// The form it is cached in after the access.
    pub kept: Option<Form>,
}

/// The two-form rule, at the access of sample `x` at position `t` whose next use is
/// `n`. A form `f` of `x` has a size, a saving (the seconds its hit at `n` saves, by the
/// [`FormCosts`]) and a density, `saving / (size * (n - t))`: seconds saved per byte held per
/// position until then.
/// 1. If `x` is cached the access is a hit in that form; `x` leaves the cache, and the rest
///    decides what to keep of it until `n`.
/// 2. With no next use nothing is kept.
/// 3. The forms `x` may be kept in: those the [`FormChoice`] allows and the budget can hold,
///    decoded only where a decoded size is known, and after a decoded hit only decoded (the
///    encoded bytes are gone). They are tried in `x`'s preferred order (below), and the first
///    that fits is kept.
/// 4. A form fits if the free bytes hold it, or if room can be made: cached samples are
///    evicted one at a time, the least dense of the two forms' farthest-used samples first,
///    and only while the one to go is less dense than `x` in `f` ("do no harm"). If those
///    that may go would not free enough, none goes.
///
/// The preferred form is fixed per sample before the stream starts, by the budget's price of
/// a byte: were every sample cached at once, in the form (or none) that maximises the
/// saving minus the price of its bytes, the price at which the budget is exactly spent
/// (each sample's choices from nothing to encoded to decoded form a concave curve of saving
/// against bytes, and the budget takes the steepest steps first). With room for every
/// decoded image the price is 0 and decoded is preferred; with little room, the form with
/// the most saving per byte.
///
/// With one form allowed and every sample of one size and one saving this is exactly
/// Belady's rule with "do no harm" ([`ReusePolicy`](crate::ReusePolicy)): the least dense is
/// the farthest used. Sizes and savings that differ make it weigh them, which Belady does not.
/// Decisions are a pure function of the stream, the two size tables, the budget and the
/// costs. lobster-testkit's `forms_optimum` checks the rule against an exhaustive search on
/// small streams.
///
/// Memory: 1 byte per sample, plus per form a max-heap of at most `1.25 * cached + 1024`
/// entries of 16 bytes.
#[derive(Debug)]
pub struct FormPolicy {
    encoded: Arc<[u32]>,
    /// Decoded sizes; 0 where the sample has no decoded form.
    decoded: Arc<[u32]>,
    capacity_bytes: u64,
    used_bytes: u64,
    /// `used_bytes` per form.
    used_by_form: [u64; 2],
    choice: FormChoice,
    costs: FormCosts,
    /// Per sample: 0 not cached, 1 encoded, 2 decoded.
    forms: Vec<u8>,
    /// Per sample: the form tried first (see [`preferred_forms`]).
    preferred: Vec<Form>,
    position: u64,
    /// Per form, by next use; an entry is live iff its next use is after `position` (it
    /// goes stale only when its sample is accessed there).
    heaps: [QuadHeap; 2],
    live: [usize; 2],
    popped: Vec<(Form, Entry)>,
}

impl FormPolicy {
    /// An empty cache of `capacity_bytes` holding the forms `choice` allows of samples sized
    /// by `encoded` and `decoded` (same length; a decoded size of 0: no decoded form).
    ///
    /// # Errors
    /// [`CacheError::SizeTables`] if the tables differ in length, [`CacheError::InvalidCost`]
    /// for a cost that is negative or not finite.
    pub fn new(
        encoded: Arc<[u32]>,
        decoded: Arc<[u32]>,
        capacity_bytes: u64,
        choice: FormChoice,
        costs: FormCosts,
    ) -> Result<Self, CacheError> {
        if encoded.len() != decoded.len() {
            return Err(CacheError::SizeTables {
                encoded: encoded.len(),
                decoded: decoded.len(),
            });
        }
        costs.validate()?;
        let preferred = preferred_forms(&encoded, &decoded, capacity_bytes, choice, &costs);
        Ok(FormPolicy {
            preferred,
            forms: vec![0; encoded.len()],
            encoded,
            decoded,
            capacity_bytes,
            used_bytes: 0,
            used_by_form: [0; 2],
            choice,
            costs,
            position: 0,
            heaps: [QuadHeap::default(), QuadHeap::default()],
            live: [0; 2],
            popped: Vec::new(),
        })
    }

    /// Records the access of `sample` at `position`, whose next access is at `next_use`
    /// ([`NEVER`] if none); positions must increase. `evicted` receives every other sample
    /// the call drops from the cache, and `sample` itself if it was cached and is not kept.
    pub fn access(
        &mut self,
        sample: SampleId,
        position: u64,
        next_use: u64,
        evicted: &mut Vec<SampleId>,
    ) -> FormOutcome {
        debug_assert!(
            position > self.position || self.position == 0,
            "positions must increase"
        );
        self.position = position;
        let hit = self.form(sample);
        if let Some(f) = hit {
            // Its entry's next use is this position: stale from now on.
            self.used_bytes -= self.size(sample, f);
            self.used_by_form[f.index()] -= self.size(sample, f);
            self.live[f.index()] -= 1;
            self.forms[sample as usize] = 0;
        }
        let kept = if next_use == NEVER {
            None
        } else {
            self.keep(sample, next_use, hit, evicted)
        };
        if hit.is_some() && kept.is_none() {
            evicted.push(sample);
        }
        assert!(
            self.used_bytes <= self.capacity_bytes,
            "form cache holds {} bytes over its capacity of {}",
            self.used_bytes,
            self.capacity_bytes
        );
        FormOutcome { hit, kept }
    }

    /// The form `sample` is cached in now.
    pub fn form(&self, sample: SampleId) -> Option<Form> {
        match self.forms[sample as usize] {
            1 => Some(Form::Encoded),
            2 => Some(Form::Decoded),
            _ => None,
        }
    }

    /// Bytes of the cached samples, each in its form.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Bytes of the samples cached in `form`.
    pub fn used_bytes_in(&self, form: Form) -> u64 {
        self.used_by_form[form.index()]
    }

    /// The byte budget.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Samples cached in `form` now.
    pub fn cached(&self, form: Form) -> usize {
        self.live[form.index()]
    }

    /// The costs the densities are priced with.
    pub fn costs(&self) -> &FormCosts {
        &self.costs
    }

    /// Heap bytes held by the policy's own tables.
    pub fn memory_bytes(&self) -> usize {
        self.forms.capacity()
            + (self.heaps[0].capacity() + self.heaps[1].capacity() + self.popped.capacity())
                * size_of::<Entry>()
    }

    /// Bytes of `sample` in `form`.
    pub fn size(&self, sample: SampleId, form: Form) -> u64 {
        u64::from(match form {
            Form::Encoded => self.encoded[sample as usize],
            Form::Decoded => self.decoded[sample as usize],
        })
    }

    /// Seconds a hit on `sample` in `form` saves.
    pub fn saving_s(&self, sample: SampleId, form: Form) -> f64 {
        self.costs.saving_s(form, self.encoded[sample as usize])
    }

    /// Saving per byte per position, for a sample of `size` bytes held until `next_use`.
    fn density(&self, sample: SampleId, form: Form, size: u64, next_use: u64) -> f64 {
        let held = (next_use - self.position) as f64 * size.max(1) as f64;
        self.saving_s(sample, form) / held
    }

    /// Steps 3 and 4 of the rule: the form `sample` is kept in until `next_use`, if any.
    fn keep(
        &mut self,
        sample: SampleId,
        next_use: u64,
        hit: Option<Form>,
        evicted: &mut Vec<SampleId>,
    ) -> Option<Form> {
        let order = match self.preferred[sample as usize] {
            Form::Encoded => Form::ALL,
            Form::Decoded => [Form::Decoded, Form::Encoded],
        };
        for form in order {
            let size = self.size(sample, form);
            let possible = self.choice.allows(form)
                && size > 0
                && size <= self.capacity_bytes
                && !(hit == Some(Form::Decoded) && form == Form::Encoded);
            if !possible {
                continue;
            }
            let fits = self.used_bytes + size <= self.capacity_bytes;
            if fits || self.make_room(sample, form, next_use, evicted) {
                self.used_bytes += size;
                self.used_by_form[form.index()] += size;
                self.live[form.index()] += 1;
                self.forms[sample as usize] = 1 + form.index() as u8;
                let heap = &mut self.heaps[form.index()];
                heap.push(Entry::new(next_use, sample, size as u32));
                heap.compact_if_stale(self.live[form.index()], self.position);
                return Some(form);
            }
        }
        None
    }

    /// Step 4: evicts what must go for `sample` to fit in `form` until `next_use`, or
    /// nothing and `false` if what may go would not free enough.
    fn make_room(
        &mut self,
        sample: SampleId,
        form: Form,
        next_use: u64,
        evicted: &mut Vec<SampleId>,
    ) -> bool {
        let size = self.size(sample, form);
        let need = self.used_bytes + size - self.capacity_bytes;
        let density = self.density(sample, form, size, next_use);
        let mut freed = 0u64;
        self.popped.clear();
        while freed < need {
            // The least dense of the two forms' farthest-used samples that may go.
            let mut victim: Option<(Form, Entry, f64)> = None;
            for g in Form::ALL {
                let Some(top) = self.heaps[g.index()].live_top(self.position) else {
                    continue;
                };
                let d = self.density(top.sample, g, u64::from(top.size_bytes), top.next_use());
                if d < density && victim.is_none_or(|(_, _, best)| d < best) {
                    victim = Some((g, top, d));
                }
            }
            let Some((g, top, _)) = victim else {
                for (g, e) in self.popped.drain(..) {
                    self.heaps[g.index()].push(e);
                }
                return false;
            };
            self.heaps[g.index()].pop();
            freed += u64::from(top.size_bytes);
            self.popped.push((g, top));
        }
        let mut popped = std::mem::take(&mut self.popped);
        for (g, e) in popped.drain(..) {
            self.forms[e.sample as usize] = 0;
            self.used_bytes -= u64::from(e.size_bytes);
            self.used_by_form[g.index()] -= u64::from(e.size_bytes);
            self.live[g.index()] -= 1;
            evicted.push(e.sample);
        }
        self.popped = popped;
        true
    }
}

/// One decision of a [`FormPlanner`], for the access at `position`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormDecision {
    /// 0-based position in the whole stream.
    pub position: u64,
    /// Epoch of the access.
    pub epoch: u32,
    /// The sample accessed.
    pub sample: SampleId,
    /// What the access found, and what the cache keeps of the sample after it.
    pub outcome: FormOutcome,
}

/// Counters over a [`FormPlanner`]'s decisions so far.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct FormStats {
    /// Accesses decided.
    pub accesses: u64,
    /// Hits, per form ([`Form::ALL`]'s order).
    pub hits: [u64; 2],
    /// The most bytes held in each form at once.
    pub peak_bytes: [u64; 2],
    /// Seconds the hits saved, by the costs the rule priced them with.
    pub saved_s: f64,
}

/// Drives a [`FormPolicy`] over a multi-epoch stream in stream order, as
/// [`Planner`](crate::Planner) drives the single-form policies.
#[derive(Debug)]
pub struct FormPlanner<S> {
    index: NextUseIndex<S>,
    policy: FormPolicy,
    stats: FormStats,
}

impl<S: StreamSource> FormPlanner<S> {
    /// A planner over `source` with `policy`, empty.
    pub fn new(source: S, policy: FormPolicy) -> Self {
        let n = policy.forms.len();
        FormPlanner {
            index: NextUseIndex::new(source, n, true, 5 * n / 2),
            policy,
            stats: FormStats::default(),
        }
    }

    /// Decides the next access; `None` at the stream's end. `evicted` is cleared, then
    /// receives the samples to drop, as [`FormPolicy::access`] says.
    ///
    /// # Errors
    /// [`CacheError::SampleOutOfRange`] if the stream names a sample without a size.
    pub fn next(
        &mut self,
        evicted: &mut Vec<SampleId>,
    ) -> Result<Option<FormDecision>, CacheError> {
        evicted.clear();
        let Some(a) = self.index.next_access()? else {
            return Ok(None);
        };
        let outcome = self
            .policy
            .access(a.sample, a.position, a.next_use, evicted);
        self.stats.accesses += 1;
        if let Some(f) = outcome.hit {
            self.stats.hits[f.index()] += 1;
            self.stats.saved_s += self.policy.saving_s(a.sample, f);
        }
        for (peak, form) in self.stats.peak_bytes.iter_mut().zip(Form::ALL) {
            *peak = (*peak).max(self.policy.used_bytes_in(form));
        }
        Ok(Some(FormDecision {
            position: a.position,
            epoch: a.epoch,
            sample: a.sample,
            outcome,
        }))
    }

    /// Runs the stream to its end and returns the totals.
    ///
    /// # Errors
    /// As [`next`](FormPlanner::next).
    pub fn run_to_end(&mut self) -> Result<FormStats, CacheError> {
        let mut evicted = Vec::new();
        while self.next(&mut evicted)?.is_some() {}
        Ok(self.stats)
    }

    /// Counters so far.
    pub fn stats(&self) -> FormStats {
        self.stats
    }

    /// The policy (what is cached, in which form, and how many bytes).
    pub fn policy(&self) -> &FormPolicy {
        &self.policy
    }

    /// Heap bytes held by the planner, excluding the shared size tables.
    pub fn memory_bytes(&self) -> usize {
        self.index.memory_bytes() + self.policy.memory_bytes() + size_of::<Self>()
    }
}

/// Per sample, the form tried first: the one that maximises its saving less the price of its
/// bytes, at the price per byte at which a budget of `capacity_bytes` holding every sample at
/// once is spent (see [`FormPolicy`]).
fn preferred_forms(
    encoded: &[u32],
    decoded: &[u32],
    capacity_bytes: u64,
    choice: FormChoice,
    costs: &FormCosts,
) -> Vec<Form> {
    // Each sample's upper hull of (bytes, saving) from nothing: segments (slope, bytes).
    let mut segments: Vec<(f64, u64)> = Vec::new();
    let points = |s: usize| {
        Form::ALL.map(|f| {
            let size = u64::from(match f {
                Form::Encoded => encoded[s],
                Form::Decoded => decoded[s],
            });
            (choice.allows(f) && size > 0).then(|| (size, costs.saving_s(f, encoded[s])))
        })
    };
    for s in 0..encoded.len() {
        match points(s) {
            [Some((se, ve)), Some((sd, vd))]
                if sd > se && (vd - ve) / ((sd - se) as f64) < ve / (se as f64) =>
            {
                segments.push((ve / se as f64, se));
                segments.push(((vd - ve) / (sd - se) as f64, sd - se));
            }
            [_, Some((sd, vd))] => segments.push((vd / sd as f64, sd)),
            [Some((se, ve)), None] => segments.push((ve / se as f64, se)),
            [None, None] => {}
        }
    }
    segments.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut left = capacity_bytes;
    let mut price = 0.0;
    for (slope, bytes) in segments {
        if bytes > left {
            price = slope;
            break;
        }
        left -= bytes;
    }
    (0..encoded.len())
        .map(|s| {
            let value = |p: Option<(u64, f64)>| {
                p.map_or(f64::NEG_INFINITY, |(size, v)| v - price * size as f64)
            };
            let [e, d] = points(s);
            if value(d) > value(e) {
                Form::Decoded
            } else {
                Form::Encoded
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Planner, PolicyKind, VecSource};
    use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};

    const COSTS: FormCosts = FormCosts {
        read_s: 1.0,
        read_per_byte_s: 0.0,
        decode_s: 4.0,
        decode_per_byte_s: 0.0,
    };

    fn planner(
        epochs: Vec<Vec<SampleId>>,
        encoded: &[u32],
        decoded: &[u32],
        capacity_bytes: u64,
        choice: FormChoice,
        costs: FormCosts,
    ) -> FormPlanner<VecSource> {
        let policy = FormPolicy::new(
            encoded.to_vec().into(),
            decoded.to_vec().into(),
            capacity_bytes,
            choice,
            costs,
        )
        .unwrap();
        FormPlanner::new(VecSource::new(epochs), policy)
    }

    #[test]
    fn one_form_of_one_size_decides_exactly_as_the_reuse_policy() {
        let sizes = vec![3000u32; 400];
        let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        let stream = ShuffledStream {
            num_samples: 400,
            epochs: 5,
            nodes: 2,
            node: 1,
            seed: 4,
        };
        let epochs: Vec<Vec<SampleId>> = stream.to_epochs();
        for capacity in [total / 20, total / 5, total / 2] {
            let sizes: Arc<[u32]> = sizes.clone().into();
            let mut reuse = Planner::new(
                VecSource::new(epochs.clone()),
                sizes.clone(),
                capacity,
                PolicyKind::Reuse,
            )
            .unwrap();
            // Decoded sizes that would be the better form, were they allowed.
            let decoded: Vec<u32> = sizes.iter().map(|&s| s * 2).collect();
            let _ = lognormal_sizes;
            let mut forms = planner(
                epochs.clone(),
                &sizes,
                &decoded,
                capacity,
                FormChoice::Encoded,
                COSTS,
            );
            let (mut ev_a, mut ev_b) = (Vec::new(), Vec::new());
            while let Some(a) = reuse.next(&mut ev_a).unwrap() {
                let b = forms.next(&mut ev_b).unwrap().unwrap();
                assert_eq!(a.hit, b.outcome.hit.is_some(), "at {}", a.position);
                let kept_before_and_after = a.hit && !ev_a.contains(&a.sample);
                assert_eq!(
                    a.admitted || kept_before_and_after,
                    b.outcome.kept.is_some(),
                    "at {}",
                    a.position
                );
                assert!(b.outcome.kept.is_none_or(|f| f == Form::Encoded));
                ev_a.sort_unstable();
                ev_b.sort_unstable();
                assert_eq!(ev_a, ev_b, "at {}", a.position);
            }
            assert!(forms.next(&mut ev_b).unwrap().is_none());
        }
    }

    #[test]
    fn where_decoding_dominates_auto_keeps_decoded_and_where_reads_do_encoded() {
        // Four samples of 10 encoded and 30 decoded bytes, room for two decoded or six
        // encoded: every form fits once, so the costs alone choose.
        let epochs = vec![vec![0, 1, 2, 3], vec![3, 2, 1, 0], vec![0, 1, 2, 3]];
        let run = |costs| {
            let mut p = planner(
                epochs.clone(),
                &[10; 4],
                &[30; 4],
                60,
                FormChoice::Auto,
                costs,
            );
            let stats = p.run_to_end().unwrap();
            stats.hits
        };
        let decode_bound = FormCosts {
            read_s: 0.1,
            read_per_byte_s: 0.0,
            decode_s: 2.0,
            decode_per_byte_s: 0.0,
        };
        let read_bound = FormCosts {
            read_s: 9.0,
            decode_s: 1.0,
            ..decode_bound
        };
        let [encoded, decoded] = run(decode_bound);
        assert!(
            decoded > 0 && encoded == 0,
            "{encoded} encoded, {decoded} decoded hits"
        );
        let [encoded, decoded] = run(read_bound);
        assert!(
            encoded > 0 && decoded == 0,
            "{encoded} encoded, {decoded} decoded hits"
        );
    }
}
