//! A naive reference model of the three policies, written for clarity (quadratic), and the
//! checker that runs the real planner against it. Shared by unit tests and fuzz targets.
//!
//! It stays in this crate, not in lobster-testkit with the other oracles: the index shrinks
//! its bounds under cfg(test) and cfg(fuzzing) so that the checker reaches its far map, the
//! wrap of its batch ids and its fallback scan, and the kit's build of this crate (what an
//! integration test links) has the production bounds.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::index::{NextUseIndex, VecSource};
use crate::planner::{Planner, PlannerConfig, Stats};
use crate::policy::{PolicyKind, NEVER};
use crate::SampleId;

/// What the reference model decided for one access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) hit: bool,
    pub(crate) admitted: bool,
    pub(crate) evicted: Vec<SampleId>,
}

/// First position after `p` where `s` is accessed.
fn next_after(stream: &[SampleId], p: usize, s: SampleId) -> u64 {
    (p + 1..stream.len())
        .find(|&j| stream[j] == s)
        .map_or(NEVER, |j| j as u64)
}

/// The semantics, followed to the letter over a whole stream.
pub(crate) fn reference(
    stream: &[SampleId],
    sizes: &[u32],
    capacity: u64,
    kind: PolicyKind,
) -> Vec<Step> {
    let size = |s: SampleId| u64::from(sizes[s as usize]);
    let mut steps = Vec::with_capacity(stream.len());
    // (sample, last access) of the cached samples.
    let mut cached: Vec<(SampleId, usize)> = Vec::new();
    let mut pinned = vec![false; sizes.len()];
    if kind == PolicyKind::Static {
        let mut samples: Vec<SampleId> = stream.to_vec();
        samples.sort_unstable();
        samples.dedup();
        let count = |s: SampleId| stream.iter().filter(|&&x| x == s).count();
        let first = |s: SampleId| stream.iter().position(|&x| x == s);
        samples.sort_by_key(|&s| (Reverse(count(s)), first(s)));
        let mut total = 0;
        for s in samples {
            if total + size(s) <= capacity {
                total += size(s);
                pinned[s as usize] = true;
            }
        }
    }
    for (p, &s) in stream.iter().enumerate() {
        let used: u64 = cached.iter().map(|&(c, _)| size(c)).sum();
        let mut step = Step {
            hit: false,
            admitted: false,
            evicted: Vec::new(),
        };
        let n = next_after(stream, p, s);
        if let Some(i) = cached.iter().position(|&(c, _)| c == s) {
            step.hit = true;
            cached[i].1 = p;
            if kind == PolicyKind::Reuse && n == NEVER {
                cached.remove(i);
                step.evicted.push(s);
            }
            steps.push(step);
            continue;
        }
        let admit = match kind {
            PolicyKind::Static => pinned[s as usize],
            PolicyKind::Lru => {
                if size(s) <= capacity {
                    let mut used = used;
                    while used + size(s) > capacity {
                        let i = (0..cached.len()).min_by_key(|&i| cached[i].1).unwrap();
                        let (victim, _) = cached.remove(i);
                        used -= size(victim);
                        step.evicted.push(victim);
                    }
                    true
                } else {
                    false
                }
            }
            PolicyKind::Reuse => {
                if n == NEVER || size(s) > capacity {
                    false
                } else if used + size(s) <= capacity {
                    true
                } else {
                    let mut later: Vec<(u64, SampleId)> = cached
                        .iter()
                        .map(|&(c, _)| (next_after(stream, p, c), c))
                        .filter(|&(k, _)| k > n)
                        .collect();
                    later.sort_by_key(|&(k, _)| Reverse(k));
                    let freeable: u64 = later.iter().map(|&(_, c)| size(c)).sum();
                    if used - freeable + size(s) > capacity {
                        false
                    } else {
                        let mut used = used;
                        for (_, c) in later {
                            if used + size(s) <= capacity {
                                break;
                            }
                            used -= size(c);
                            cached.retain(|&(x, _)| x != c);
                            step.evicted.push(c);
                        }
                        true
                    }
                }
            }
        };
        if admit {
            cached.push((s, p));
            step.admitted = true;
        }
        steps.push(step);
    }
    steps
}

/// Runs every policy through the planner (with a batch of `batch` accesses) and the reference
/// model over `epochs`, and panics at the first disagreement or broken invariant.
pub(crate) fn check_case(epochs: &[Vec<SampleId>], sizes: &[u32], capacity: u64, batch: usize) {
    let flat: Vec<SampleId> = epochs.iter().flatten().copied().collect();
    let epoch_of: Vec<u32> = epochs
        .iter()
        .enumerate()
        .flat_map(|(e, v)| std::iter::repeat_n(e as u32, v.len()))
        .collect();
    let sizes_arc: Arc<[u32]> = sizes.into();

    // The index alone: exact next uses whatever the batch.
    let mut index = NextUseIndex::new(VecSource::new(epochs.to_vec()), sizes.len(), true, batch);
    for (p, &s) in flat.iter().enumerate() {
        let a = index.next_access().unwrap().unwrap();
        assert_eq!((a.position, a.sample, a.epoch), (p as u64, s, epoch_of[p]));
        assert_eq!(a.next_use, next_after(&flat, p, s), "next use at {p}");
    }
    assert_eq!(index.next_access().unwrap(), None);

    for kind in PolicyKind::ALL {
        let want = reference(&flat, sizes, capacity, kind);
        let config = PlannerConfig {
            batch_accesses_max: Some(batch),
        };
        let source = VecSource::new(epochs.to_vec());
        let mut planner =
            Planner::with_config(source, sizes_arc.clone(), capacity, kind, config).unwrap();
        let mut evicted = Vec::new();
        let mut cached = BTreeSet::new();
        let mut stats = Stats::default();
        for (p, &s) in flat.iter().enumerate() {
            let d = planner
                .next(&mut evicted)
                .unwrap()
                .expect("stream ended early");
            let w = &want[p];
            assert_eq!((d.position, d.sample, d.epoch), (p as u64, s, epoch_of[p]));
            assert_eq!(d.size_bytes, sizes[s as usize]);
            assert_eq!(
                (d.hit, d.admitted, &evicted),
                (w.hit, w.admitted, &w.evicted),
                "{kind} at position {p} (sample {s}, capacity {capacity}, batch {batch})"
            );
            assert_eq!(d.hit, cached.contains(&s));
            stats.record(d.hit, d.size_bytes);
            if d.admitted {
                cached.insert(s);
            }
            for e in &evicted {
                assert!(cached.remove(e), "{kind} evicted {e}, which was not cached");
            }
            let used: u64 = cached.iter().map(|&c| u64::from(sizes[c as usize])).sum();
            let policy = planner.policy();
            assert_eq!(policy.used_bytes(), used);
            assert!(used <= capacity, "{kind} holds {used} bytes > {capacity}");
            for c in 0..sizes.len() as SampleId {
                assert_eq!(policy.contains(c), cached.contains(&c), "{kind} sample {c}");
            }
            if kind == PolicyKind::Reuse {
                for &c in &cached {
                    assert_ne!(
                        next_after(&flat, p, c),
                        NEVER,
                        "reuse keeps sample {c} with no next use after {p}"
                    );
                }
            }
        }
        assert_eq!(planner.next(&mut evicted).unwrap(), None);
        assert_eq!(planner.stats(), stats);
    }
}

/// Decodes arbitrary bytes into a short multi-epoch stream, sizes, capacity and batch, then
/// runs [`check_case`]. Panics on any disagreement (what the fuzz targets look for).
pub fn check_bytes(data: &[u8]) {
    let mut it = data.iter().copied();
    let mut byte = || it.next().unwrap_or(0);
    let num_samples = 1 + usize::from(byte() % 24);
    let capacity = u64::from(u16::from_le_bytes([byte(), byte()]) % 1024);
    let batch = 1 + usize::from(byte() % 16);
    let sizes: Vec<u32> = (0..num_samples).map(|_| u32::from(byte()) * 2).collect();
    let mut epochs = vec![Vec::new()];
    for b in data.iter().skip(4 + num_samples).take(256) {
        if *b == 0xFF {
            epochs.push(Vec::new());
        } else {
            let s = (usize::from(*b) % num_samples) as SampleId;
            epochs.last_mut().unwrap().push(s);
        }
    }
    check_case(&epochs, &sizes, capacity, batch);
}

/// Parses arbitrary bytes as a trace: it must never panic; a trace that parses must survive
/// being written back and parsed again, and short ones are checked against the reference
/// model through [`check_case`].
pub fn check_trace_bytes(data: &[u8]) {
    let Ok(parsed) = crate::trace::parse(data) else {
        return;
    };
    let text: String = parsed
        .accesses()
        .map(|(id, size)| format!("{id} {size}\n"))
        .collect();
    let again = crate::trace::parse(text.as_bytes()).expect("a written trace parses");
    assert_eq!(again, parsed);
    if parsed.len() <= 256 {
        let (stream, sizes) = parsed.dense();
        let capacity = parsed.dataset_bytes() / 3;
        check_case(&[stream.to_vec()], sizes, capacity, 1 + stream.len() / 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use lobster_testkit::gen::{lognormal_sizes, ShuffledStream};

    #[test]
    fn seeded_random_traces_parse_or_fail_cleanly() {
        let mut rng = StdRng::seed_from_u64(0x7ACE);
        let mut parsed_ok = 0;
        for _ in 0..400 {
            let sizes: Vec<u64> = (0..8).map(|_| rng.gen_range(0..300u64)).collect();
            let mut text = Vec::new();
            for _ in 0..rng.gen_range(0..60u64) {
                let id = rng.gen_range(0..8u64);
                match rng.gen_range(0..100u64) {
                    0 => text.extend_from_slice(b"junk\n"),
                    1 => text
                        .extend_from_slice(format!("{id} {}\n", rng.gen_range(0..9u64)).as_bytes()),
                    2 => text.extend_from_slice(b"# comment only\n\n"),
                    _ => text.extend_from_slice(
                        format!("{id} {}  # c\n", sizes[id as usize]).as_bytes(),
                    ),
                }
            }
            parsed_ok += usize::from(crate::trace::parse(&text[..]).is_ok());
            check_trace_bytes(&text);
        }
        assert!(parsed_ok > 50, "only {parsed_ok} generated traces parsed");
    }

    #[test]
    fn seeded_random_streams_agree_with_reference() {
        let mut rng = StdRng::seed_from_u64(0xC0FFEE);
        for _ in 0..1500 {
            let len = rng.gen_range(0..200usize);
            let data: Vec<u8> = (0..len).map(|_| rng.gen::<u8>()).collect();
            check_bytes(&data);
        }
    }

    #[test]
    fn shuffled_multi_node_streams_agree_with_reference() {
        for (nodes, capacity_frac, batch) in
            [(1, 0.1, 50), (4, 0.1, 40), (4, 0.3, 7), (3, 0.5, 1000)]
        {
            let n = 60;
            let sizes = lognormal_sizes(n, 1000.0, 0.6, 7);
            let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
            let stream = ShuffledStream {
                num_samples: n as u32,
                epochs: 12,
                nodes,
                node: nodes - 1,
                seed: 42,
            };
            let epochs: Vec<Vec<SampleId>> = stream.to_epochs();
            check_case(
                &epochs,
                &sizes,
                (total as f64 * capacity_frac) as u64,
                batch,
            );
        }
    }

    #[test]
    fn reuse_refuses_to_harm_and_evicts_farthest_first() {
        // Cache of 100: 1 (40 B, next use 4) and 2 (60 B, next use 7) fill it; 3 (60 B, next
        // use 5) evicts 2, the farther; 4 (100 B, next use 6) would need 1 and 3, both
        // needed sooner, so it is bypassed and nothing is evicted.
        let epochs = vec![vec![1, 2, 3, 4, 1, 3, 4, 2]];
        let sizes = [0, 40, 60, 60, 100];
        let want = reference(&epochs[0], &sizes, 100, PolicyKind::Reuse);
        assert_eq!(want[2].evicted, vec![2]);
        assert!(want[2].admitted);
        assert!(!want[3].admitted && want[3].evicted.is_empty());
        assert!(want[4].hit && want[5].hit && !want[6].hit);
        check_case(&epochs, &sizes, 100, 2);
    }
}
