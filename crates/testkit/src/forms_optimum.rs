//! The exhaustive reference for the two-form rule: the best assignment of forms over a small
//! stream, found by trying them all.
//!
//! Each access with a next use opens an interval that ends at that next use; keeping the
//! sample in form `f` over the whole interval costs `size_f` bytes at every position it spans
//! and saves `saving_f` at its end. Keeping it for less than the whole interval saves nothing,
//! so an optimum keeps whole intervals. An interval may be decoded only where the sample has a
//! decoded size, and the one after a decoded interval may not be encoded (the hit has no
//! encoded bytes). The budget holds at every position.

use std::sync::Arc;

use lobster_cache::{
    CacheError, Form, FormChoice, FormCosts, FormPlanner, FormPolicy, SampleId, VecSource, NEVER,
};

use crate::gen::FormCase;
use crate::OracleError;

/// The most intervals [`optimal_saving_s`] searches (3 choices each).
pub const MAX_INTERVALS: usize = 16;

#[derive(Clone, Copy, Debug)]
struct Interval {
    start: usize,
    end: usize,
    /// The interval of the same sample that ends where this one starts.
    previous: Option<usize>,
    /// Per form: bytes and seconds saved, or `None` where the form is not allowed.
    options: [Option<(u64, f64)>; 2],
}

/// The most seconds any assignment of forms to the reuse intervals of `epochs` saves, with
/// at most `capacity_bytes` cached at any position, by `costs`.
///
/// # Errors
/// [`OracleError::Cache`] of [`CacheError::SampleOutOfRange`] for a sample without sizes;
/// [`OracleError::TooManyIntervals`] for a stream of more than [`MAX_INTERVALS`] reuses.
pub fn optimal_saving_s(
    epochs: &[Vec<SampleId>],
    encoded: &[u32],
    decoded: &[u32],
    capacity_bytes: u64,
    choice: FormChoice,
    costs: &FormCosts,
) -> Result<f64, OracleError> {
    let stream: Vec<(u32, SampleId)> = epochs
        .iter()
        .enumerate()
        .flat_map(|(e, ids)| ids.iter().map(move |&s| (e as u32, s)))
        .collect();
    let n = encoded.len().min(decoded.len());
    if let Some(&(epoch, sample)) = stream.iter().find(|(_, s)| *s as usize >= n) {
        return Err(CacheError::SampleOutOfRange {
            sample,
            epoch,
            num_samples: n,
        }
        .into());
    }
    let mut next = vec![NEVER; stream.len()];
    let mut seen = vec![NEVER; n];
    for (p, &(_, s)) in stream.iter().enumerate().rev() {
        next[p] = seen[s as usize];
        seen[s as usize] = p as u64;
    }
    let mut ending_at = vec![None; stream.len()];
    let mut intervals = Vec::new();
    for (p, &(_, s)) in stream.iter().enumerate() {
        if next[p] == NEVER {
            continue;
        }
        let options = Form::ALL.map(|f| {
            let size = u64::from(match f {
                Form::Encoded => encoded[s as usize],
                Form::Decoded => decoded[s as usize],
            });
            (choice.allows(f) && size > 0 && size <= capacity_bytes)
                .then(|| (size, costs.saving_s(f, encoded[s as usize])))
        });
        ending_at[next[p] as usize] = Some(intervals.len());
        intervals.push(Interval {
            start: p,
            end: next[p] as usize,
            previous: ending_at[p],
            options,
        });
    }
    if intervals.len() > MAX_INTERVALS {
        return Err(OracleError::TooManyIntervals {
            intervals: intervals.len(),
            max: MAX_INTERVALS,
        });
    }
    // best_after[i]: the most intervals i.. could save with no budget, to prune.
    let mut best_after = vec![0.0; intervals.len() + 1];
    for i in (0..intervals.len()).rev() {
        let most = intervals[i]
            .options
            .iter()
            .flatten()
            .map(|o| o.1)
            .fold(0.0, f64::max);
        best_after[i] = best_after[i + 1] + most;
    }
    let mut search = Search {
        intervals: &intervals,
        best_after: &best_after,
        capacity_bytes,
        held: vec![0; stream.len()],
        chosen: vec![None; intervals.len()],
        best: 0.0,
    };
    search.visit(0, 0.0);
    Ok(search.best)
}

struct Search<'a> {
    intervals: &'a [Interval],
    best_after: &'a [f64],
    capacity_bytes: u64,
    /// Bytes held over each position by the intervals chosen so far.
    held: Vec<u64>,
    chosen: Vec<Option<Form>>,
    best: f64,
}

impl Search<'_> {
    fn visit(&mut self, i: usize, saved: f64) {
        if saved + self.best_after[i] <= self.best {
            return;
        }
        let Some(&iv) = self.intervals.get(i) else {
            self.best = saved;
            return;
        };
        // `options` follows `Form::ALL`.
        for (option, f) in iv.options.into_iter().zip(Form::ALL) {
            let Some((size, saving)) = option else {
                continue;
            };
            let after_decoded = iv.previous.and_then(|p| self.chosen[p]) == Some(Form::Decoded);
            if f == Form::Encoded && after_decoded {
                continue;
            }
            let span = iv.start..iv.end;
            if self.held[span.clone()]
                .iter()
                .any(|&h| h + size > self.capacity_bytes)
            {
                continue;
            }
            self.held[span.clone()].iter_mut().for_each(|h| *h += size);
            self.chosen[i] = Some(f);
            self.visit(i + 1, saved + saving);
            self.chosen[i] = None;
            self.held[span].iter_mut().for_each(|h| *h -= size);
        }
        self.visit(i + 1, saved);
    }
}

/// The rule against the optimum on one case, for each choice ([`FormChoice::ALL`]'s order).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// Seconds the rule's hits saved.
    pub rule_s: [f64; 3],
    /// The most any assignment saves.
    pub optimum_s: [f64; 3],
}

impl Comparison {
    /// The rule's saving over the optimum's for `choice` (1 where both are 0).
    pub fn ratio(&self, choice: FormChoice) -> f64 {
        let i = FormChoice::ALL
            .iter()
            .position(|&c| c == choice)
            .expect("every choice is listed");
        if self.optimum_s[i] == 0.0 {
            1.0
        } else {
            self.rule_s[i] / self.optimum_s[i]
        }
    }
}

/// Seconds the rule's hits save on `case`, for each choice ([`FormChoice::ALL`]'s order).
///
/// # Errors
/// [`CacheError::SampleOutOfRange`] for a sample without sizes.
pub fn rule_savings_s(case: &FormCase) -> Result<[f64; 3], CacheError> {
    let encoded: Arc<[u32]> = case.encoded.clone().into();
    let decoded: Arc<[u32]> = case.decoded.clone().into();
    let mut out = [0.0; 3];
    for (saved, choice) in out.iter_mut().zip(FormChoice::ALL) {
        let policy = FormPolicy::new(
            encoded.clone(),
            decoded.clone(),
            case.capacity_bytes,
            choice,
            case.costs,
        )?;
        let mut planner = FormPlanner::new(VecSource::new(case.epochs.clone()), policy);
        *saved = planner.run_to_end()?.saved_s;
    }
    Ok(out)
}

/// Runs the rule and the exhaustive search on `case` for every choice.
///
/// # Errors
/// As [`optimal_saving_s`], and [`rule_savings_s`]'s in [`OracleError::Cache`].
pub fn compare(case: &FormCase) -> Result<Comparison, OracleError> {
    let rule_s = rule_savings_s(case)?;
    let mut optimum_s = [0.0; 3];
    for (best, choice) in optimum_s.iter_mut().zip(FormChoice::ALL) {
        *best = optimal_saving_s(
            &case.epochs,
            &case.encoded,
            &case.decoded,
            case.capacity_bytes,
            choice,
            &case.costs,
        )?;
    }
    Ok(Comparison { rule_s, optimum_s })
}

/// Decodes arbitrary bytes into a small two-form case (stream, both size tables, budget,
/// choice, costs), runs the rule, and panics if an invariant breaks: a hit in a form other
/// than the one the sample was kept in, a decoded hit kept encoded, a form the choice does
/// not allow or a decoded size of 0, an eviction of a sample not cached, bytes over the
/// budget or apart from what is cached, decisions that differ between two runs, or (where
/// the stream is short enough) a saving above the exhaustive optimum's.
pub fn check_form_bytes(data: &[u8]) {
    let mut it = data.iter().copied();
    let mut byte = || it.next().unwrap_or(0);
    let num_samples = 1 + usize::from(byte() % 8);
    let capacity_bytes = u64::from(byte()) + u64::from(byte() % 4) * 256;
    let choice = FormChoice::ALL[usize::from(byte() % 3)];
    let mut cost = || f64::from(byte()) / 16.0;
    let costs = FormCosts {
        read_s: cost(),
        read_per_byte_s: cost() / 64.0,
        decode_s: cost(),
        decode_per_byte_s: cost() / 64.0,
    };
    let encoded: Vec<u32> = (0..num_samples).map(|_| u32::from(byte())).collect();
    // A decoded size of 0 says the sample has no decoded form.
    let decoded: Vec<u32> = (0..num_samples).map(|_| u32::from(byte()) * 2).collect();
    let mut epochs = vec![Vec::new()];
    for b in data.iter().skip(7 + 2 * num_samples).take(64) {
        if *b == 0xFF {
            epochs.push(Vec::new());
        } else {
            epochs
                .last_mut()
                .expect("one epoch at least")
                .push((usize::from(*b) % num_samples) as SampleId);
        }
    }
    let run = || {
        let policy = FormPolicy::new(
            encoded.clone().into(),
            decoded.clone().into(),
            capacity_bytes,
            choice,
            costs,
        )
        .expect("tables of one length and costs that are finite");
        let mut planner = FormPlanner::new(VecSource::new(epochs.clone()), policy);
        let mut evicted = Vec::new();
        let mut mirror: Vec<Option<Form>> = vec![None; num_samples];
        let mut decisions = Vec::new();
        while let Some(d) = planner.next(&mut evicted).expect("every sample has sizes") {
            let o = d.outcome;
            let s = d.sample as usize;
            assert_eq!(o.hit, mirror[s], "at {}: the hit's form", d.position);
            if let Some(f) = o.kept {
                assert!(
                    choice.allows(f),
                    "at {}: {f} kept under {choice}",
                    d.position
                );
                let size = match f {
                    Form::Encoded => encoded[s],
                    Form::Decoded => decoded[s],
                };
                assert!(
                    f == Form::Encoded || size > 0,
                    "at {}: no decoded size",
                    d.position
                );
            }
            if o.hit == Some(Form::Decoded) {
                assert_ne!(o.kept, Some(Form::Encoded), "at {}", d.position);
            }
            for &e in &evicted {
                if e != d.sample {
                    assert!(
                        mirror[e as usize].take().is_some(),
                        "at {}: {e}",
                        d.position
                    );
                } else {
                    assert!(o.hit.is_some() && o.kept.is_none(), "at {}", d.position);
                }
            }
            mirror[s] = o.kept;
            let used: u64 = mirror
                .iter()
                .zip(encoded.iter().zip(&decoded))
                .map(|(f, (&e, &dec))| match f {
                    Some(Form::Encoded) => u64::from(e),
                    Some(Form::Decoded) => u64::from(dec),
                    None => 0,
                })
                .sum();
            assert_eq!(used, planner.policy().used_bytes(), "at {}", d.position);
            assert!(used <= capacity_bytes, "at {}", d.position);
            decisions.push((d, evicted.clone()));
        }
        (decisions, planner.stats().saved_s)
    };
    let (first, saved_s) = run();
    assert!(first == run().0, "two runs decided differently");
    if let Ok(best) = optimal_saving_s(&epochs, &encoded, &decoded, capacity_bytes, choice, &costs)
    {
        assert!(
            saved_s <= best * (1.0 + 1e-9) + 1e-9,
            "the rule saved {saved_s} over the optimum's {best}"
        );
    }
}
