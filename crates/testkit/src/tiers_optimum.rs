//! The references for the two-level (memory over disk) plan: Belady's rule on unit sizes,
//! simulated plainly, and the best exclusive two-level placement of a small stream, found by
//! trying every placement.
//!
//! The placement model: after each access every sample is in memory, on the disk or
//! nowhere; the accessed sample may go anywhere (its bytes were just read), another may stay,
//! be dropped, or move from memory to the disk (a demotion), never from the disk to memory
//! (that takes an access). Memory bytes never exceed `M` nor disk bytes `D`. An access is a
//! store read if the sample is nowhere, a memory hit if it is in memory. The best placement
//! reads the fewest bytes from the store and, among those, hits memory for the most bytes.

use std::sync::Arc;

use lobster_cache::{
    Planner, PolicyKind, SampleId, Tier, TierDecision, TierEvicted, TierPlanner, TierStats,
    VecSource, NEVER,
};

/// The most distinct samples [`optimal_two_level`] searches (3 places each).
pub const MAX_SAMPLES: usize = 5;
/// The most accesses [`optimal_two_level`] searches.
pub const MAX_ACCESSES: usize = 32;

/// Misses and hits of Belady's rule (evict the sample used farthest ahead, admit a miss only
/// if that evicts nothing needed sooner, drop a sample at its last use) with room for
/// `capacity` samples of one size: the fewest misses any cache of that room can have.
pub fn belady_unit(stream: &[SampleId], capacity: usize) -> (u64, u64) {
    let next_after = |p: usize, s: SampleId| {
        (p + 1..stream.len())
            .find(|&j| stream[j] == s)
            .map_or(NEVER, |j| j as u64)
    };
    let mut cached: Vec<SampleId> = Vec::new();
    let (mut misses, mut hits) = (0, 0);
    for (p, &s) in stream.iter().enumerate() {
        let n = next_after(p, s);
        if let Some(i) = cached.iter().position(|&c| c == s) {
            hits += 1;
            if n == NEVER {
                cached.remove(i);
            }
            continue;
        }
        misses += 1;
        if n == NEVER || capacity == 0 {
            continue;
        }
        if cached.len() < capacity {
            cached.push(s);
            continue;
        }
        let (i, far) = cached
            .iter()
            .enumerate()
            .map(|(i, &c)| (i, next_after(p, c)))
            .max_by_key(|&(_, k)| k)
            .expect("a full cache of room 1 or more");
        if far > n {
            cached[i] = s;
        }
    }
    (misses, hits)
}

/// The best two-level placement's totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TwoLevelOptimum {
    /// The fewest bytes any placement reads from the store.
    pub store_read_bytes: u64,
    /// The most bytes a placement reading that little hits in memory.
    pub memory_hit_bytes: u64,
}

/// The best placement (see the module docs) of `epochs` with `memory_capacity_bytes` over
/// `disk_capacity_bytes`, starting with any subset of `seeds` on the disk (that fits) and
/// memory empty; `None` if the stream has more than [`MAX_SAMPLES`] distinct samples or
/// [`MAX_ACCESSES`] accesses.
///
/// # Panics
/// If a sample of the stream or a seed has no size.
pub fn optimal_two_level(
    epochs: &[Vec<SampleId>],
    sizes: &[u32],
    memory_capacity_bytes: u64,
    disk_capacity_bytes: u64,
    seeds: &[SampleId],
) -> Option<TwoLevelOptimum> {
    let stream: Vec<SampleId> = epochs.iter().flatten().copied().collect();
    let mut ids: Vec<SampleId> = stream.clone();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > MAX_SAMPLES || stream.len() > MAX_ACCESSES {
        return None;
    }
    let k = ids.len();
    let states = 3usize.pow(k as u32);
    // Place of sample index j in state x: 0 nowhere, 1 memory, 2 disk.
    let place = |x: usize, j: usize| x / 3usize.pow(j as u32) % 3;
    let size = |j: usize| u64::from(sizes[ids[j] as usize]);
    let bytes: Vec<[u64; 2]> = (0..states)
        .map(|x| {
            let mut b = [0, 0];
            for j in 0..k {
                match place(x, j) {
                    1 => b[0] += size(j),
                    2 => b[1] += size(j),
                    _ => {}
                }
            }
            b
        })
        .collect();
    let fits =
        |x: usize| bytes[x][0] <= memory_capacity_bytes && bytes[x][1] <= disk_capacity_bytes;
    // Cost to reach each state: (store bytes, memory hit bytes), lexicographic.
    type Cost = Option<(u64, u64)>;
    let better = |a: (u64, u64), b: Cost| b.is_none_or(|b| a.0 < b.0 || (a.0 == b.0 && a.1 > b.1));
    let mut cost: Vec<Cost> = vec![None; states];
    for (x, c) in cost.iter_mut().enumerate() {
        let only_seeds_on_disk = (0..k).all(|j| match place(x, j) {
            0 => true,
            2 => seeds.contains(&ids[j]),
            _ => false,
        });
        if only_seeds_on_disk && fits(x) {
            *c = Some((0, 0));
        }
    }
    // Per sample index, the places it may move to from each place; the accessed one may go
    // anywhere.
    const MOVES: [&[usize]; 3] = [&[0], &[1, 2, 0], &[2, 0]];
    let pow3: Vec<usize> = (0..k).map(|j| 3usize.pow(j as u32)).collect();
    let mut choice = vec![0usize; k];
    for &s in &stream {
        let i = ids.binary_search(&s).expect("every sample is listed");
        let mut next: Vec<Cost> = vec![None; states];
        for (x, c) in cost.iter().enumerate() {
            let Some((reads, hits)) = *c else { continue };
            let (reads, hits) = match place(x, i) {
                0 => (reads + size(i), hits),
                1 => (reads, hits + size(i)),
                _ => (reads, hits),
            };
            let options = |j: usize| -> &[usize] {
                if j == i {
                    &[0, 1, 2]
                } else {
                    MOVES[place(x, j)]
                }
            };
            // Every combination of the samples' moves, as a mixed-radix counter.
            choice.iter_mut().for_each(|c| *c = 0);
            loop {
                let y: usize = (0..k).map(|j| options(j)[choice[j]] * pow3[j]).sum();
                if fits(y) && better((reads, hits), next[y]) {
                    next[y] = Some((reads, hits));
                }
                let mut j = 0;
                while j < k && choice[j] + 1 == options(j).len() {
                    choice[j] = 0;
                    j += 1;
                }
                if j == k {
                    break;
                }
                choice[j] += 1;
            }
        }
        cost = next;
    }
    let best = cost
        .into_iter()
        .flatten()
        .reduce(|a, b| if better(b, Some(a)) { b } else { a })
        .expect("the empty placement is always allowed");
    Some(TwoLevelOptimum {
        store_read_bytes: best.0,
        memory_hit_bytes: best.1,
    })
}

/// One run of the two-level plan, carried out by a loader model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierRun {
    /// The planner's totals.
    pub stats: TierStats,
    /// Store bytes read in each epoch.
    pub store_read_bytes_per_epoch: Vec<u64>,
    /// Every decision with what it evicted.
    pub decisions: Vec<(TierDecision, TierEvicted)>,
    /// The seeds the plan dropped at the start.
    pub dropped_seeds: Vec<SampleId>,
    /// What is on the disk at the end, ascending: the next run's seeds.
    pub disk_at_end: Vec<SampleId>,
    /// The bytes the plan holds in both levels ([`TierPlanner::held_capacity_bytes`]).
    pub held_capacity_bytes: u64,
}

/// Runs the two-level plan of `kind` over `epochs` and carries out every decision on a
/// model of the loader's two levels in the documented order, panicking at the first broken
/// contract: a sample not where `found` says, an eviction of a sample not in the level it
/// leaves, a demotion not from memory, a write to the disk of a sample not just read, or a
/// level over its capacity at any point of the order (or apart from the planner's count).
pub fn run_tiers(
    epochs: &[Vec<SampleId>],
    sizes: &[u32],
    memory_capacity_bytes: u64,
    disk_capacity_bytes: u64,
    kind: PolicyKind,
    seeds: &[SampleId],
) -> TierRun {
    let sizes_arc: Arc<[u32]> = sizes.to_vec().into();
    let mut planner = TierPlanner::new(
        VecSource::new(epochs.to_vec()),
        sizes_arc,
        memory_capacity_bytes,
        disk_capacity_bytes,
        kind,
        seeds,
    )
    .expect("a valid case");
    let size = |s: SampleId| u64::from(sizes[s as usize]);
    let mut at: Vec<Option<Tier>> = vec![None; sizes.len()];
    let dropped_seeds = planner.dropped_seeds().to_vec();
    for &s in seeds {
        if !dropped_seeds.contains(&s) {
            at[s as usize] = Some(Tier::Disk);
        }
    }
    let used = |at: &[Option<Tier>], t: Tier| -> u64 {
        at.iter()
            .enumerate()
            .filter(|(_, &a)| a == Some(t))
            .map(|(s, _)| size(s as SampleId))
            .sum()
    };
    assert!(
        used(&at, Tier::Disk) <= disk_capacity_bytes,
        "seeds over the disk"
    );
    assert_eq!(used(&at, Tier::Disk), planner.disk_used_bytes());
    let mut per_epoch = vec![0u64; epochs.len()];
    let mut decisions = Vec::new();
    let mut evicted = TierEvicted::default();
    while let Some(d) = planner.next(&mut evicted).expect("a valid stream") {
        let s = d.sample;
        let p = d.position;
        assert_eq!(d.found, at[s as usize], "at {p}: sample {s} found");
        if d.found.is_none() {
            per_epoch[d.epoch as usize] += size(s);
        }
        if d.found == Some(Tier::Memory) {
            assert_ne!(d.kept, Some(Tier::Disk), "at {p}: memory hit kept on disk");
        }
        assert_eq!(
            d.write_disk,
            d.found.is_none() && d.kept == Some(Tier::Disk),
            "at {p}: write_disk"
        );
        assert_eq!(
            evicted.disk.contains(&s),
            d.found == Some(Tier::Disk) && d.kept != Some(Tier::Disk),
            "at {p}: the accessed sample's disk entry"
        );
        assert_eq!(
            evicted.memory.contains(&s),
            d.found == Some(Tier::Memory) && d.kept.is_none(),
            "at {p}: the accessed sample leaving memory"
        );
        assert!(
            !evicted.demoted.contains(&s),
            "at {p}: accessed sample demoted"
        );
        // 2: drop disk entries.
        for &e in &evicted.disk {
            assert_eq!(at[e as usize], Some(Tier::Disk), "at {p}: {e} not on disk");
            at[e as usize] = None;
        }
        // 3: demote, then drop from memory.
        let mut demoted = evicted.demoted.iter().peekable();
        for &e in &evicted.memory {
            assert_eq!(
                at[e as usize],
                Some(Tier::Memory),
                "at {p}: {e} not in memory"
            );
            if demoted.peek() == Some(&&e) {
                demoted.next();
                at[e as usize] = Some(Tier::Disk);
                assert!(
                    used(&at, Tier::Disk) <= disk_capacity_bytes,
                    "at {p}: disk over capacity after demoting {e}"
                );
            } else {
                at[e as usize] = None;
            }
        }
        assert!(
            demoted.next().is_none(),
            "at {p}: demoted not in memory's list, in order"
        );
        // 4: keep the sample.
        at[s as usize] = d.kept;
        let (m, k) = (used(&at, Tier::Memory), used(&at, Tier::Disk));
        assert!(m <= memory_capacity_bytes, "at {p}: memory {m} bytes");
        assert!(k <= disk_capacity_bytes, "at {p}: disk {k} bytes");
        assert_eq!(m, planner.memory_used_bytes(), "at {p}: memory bytes");
        assert_eq!(k, planner.disk_used_bytes(), "at {p}: disk bytes");
        for &e in evicted.memory.iter().chain(&evicted.disk).chain([&s]) {
            assert_eq!(planner.location(e), at[e as usize], "at {p}: where {e} is");
        }
        decisions.push((d, evicted.clone()));
    }
    let disk_at_end = (0..sizes.len() as SampleId)
        .filter(|&s| at[s as usize] == Some(Tier::Disk))
        .collect();
    TierRun {
        stats: planner.stats(),
        store_read_bytes_per_epoch: per_epoch,
        decisions,
        dropped_seeds,
        disk_at_end,
        held_capacity_bytes: planner.held_capacity_bytes(),
    }
}

/// Checks one case: [`run_tiers`]'s contract for `reuse` and `static`, the same decisions
/// twice, `static` never evicting, `reuse`'s store reads equal to one reuse policy's misses
/// of the held capacity (without seeds), and, where the stream is small enough, no
/// placement reading fewer store bytes than the plan; with all sizes equal (`v`), the plan's
/// store reads and memory hits equal to the best placement's and (without seeds) to
/// Belady's misses with room `M / v + D / v` samples and hits with room `M / v`.
pub fn check_tier_case(
    epochs: &[Vec<SampleId>],
    sizes: &[u32],
    memory_capacity_bytes: u64,
    disk_capacity_bytes: u64,
    seeds: &[SampleId],
) {
    let stream: Vec<SampleId> = epochs.iter().flatten().copied().collect();
    let run = |kind| {
        run_tiers(
            epochs,
            sizes,
            memory_capacity_bytes,
            disk_capacity_bytes,
            kind,
            seeds,
        )
    };
    let stat = run(PolicyKind::Static);
    for (d, e) in &stat.decisions {
        assert!(
            e.memory.is_empty() && e.demoted.is_empty() && e.disk.is_empty(),
            "static evicted at {}",
            d.position
        );
    }
    let reuse = run(PolicyKind::Reuse);
    assert!(
        reuse == run(PolicyKind::Reuse),
        "two runs decided differently"
    );
    let st = reuse.stats;
    // The documented bounds of the rule's held bytes; the disk bound itself is checked at
    // every step by the loader model.
    let held_bytes = reuse.held_capacity_bytes;
    let max_size = u64::from(sizes.iter().copied().max().unwrap_or(0).max(1));
    let (m, d) = (memory_capacity_bytes, disk_capacity_bytes);
    assert!(
        held_bytes <= m + d && held_bytes + max_size > m + d,
        "held bytes {held_bytes}"
    );
    if sizes.iter().all(|&z| z == sizes[0]) && m % u64::from(sizes[0].max(1)) == 0 {
        assert_eq!(held_bytes, m + d, "equal sizes dividing the memory");
    }
    if seeds.is_empty() {
        let mut single = Planner::new(
            VecSource::new(epochs.to_vec()),
            sizes.to_vec().into(),
            held_bytes,
            PolicyKind::Reuse,
        )
        .expect("a valid case");
        let one = single.run_to_end().expect("a valid stream");
        assert_eq!(
            (st.store_reads, st.store_read_bytes),
            (one.misses, one.miss_bytes),
            "store reads against one reuse policy of {held_bytes} bytes"
        );
    }
    // All sizes equal to `v` is unit sizes with room for whole samples only.
    let v = u64::from(sizes[0]);
    let unit = v > 0 && sizes.iter().all(|&z| u64::from(z) == v);
    if unit && seeds.is_empty() {
        let (m, d) = (
            (memory_capacity_bytes / v) as usize,
            (disk_capacity_bytes / v) as usize,
        );
        let (misses, _) = belady_unit(&stream, m + d);
        let (_, hits) = belady_unit(&stream, m);
        assert_eq!(st.store_reads, misses, "store reads against OPT(M + D)");
        assert_eq!(st.memory_hits, hits, "memory hits against OPT(M)");
    }
    if let Some(best) = optimal_two_level(
        epochs,
        sizes,
        memory_capacity_bytes,
        disk_capacity_bytes,
        seeds,
    ) {
        assert!(
            st.store_read_bytes >= best.store_read_bytes,
            "the plan read {} store bytes, below the optimum's {}",
            st.store_read_bytes,
            best.store_read_bytes
        );
        if unit {
            assert_eq!(
                (st.store_read_bytes, st.memory_hit_bytes),
                (best.store_read_bytes, best.memory_hit_bytes),
                "equal sizes: (store reads, memory hits) against the best placement"
            );
        }
    }
}

/// Decodes arbitrary bytes into a small two-level case (stream, sizes or all sizes equal,
/// both capacities, seeds) and runs [`check_tier_case`] on it.
pub fn check_tier_bytes(data: &[u8]) {
    let mut at = 0;
    let mut byte = || {
        at += 1;
        data.get(at - 1).copied().unwrap_or(0)
    };
    let flags = byte();
    let num_samples = 1 + usize::from(flags % 8);
    let unit = flags & 0x10 != 0;
    let equal_size = 1 + flags / 0x20 % 3;
    let (memory, disk) = if unit {
        let room = 5 * u64::from(equal_size);
        (u64::from(byte()) % room, u64::from(byte()) % room)
    } else {
        (
            u64::from(byte()),
            u64::from(byte()) + u64::from(byte() % 4) * 256,
        )
    };
    let sizes: Vec<u32> = (0..num_samples)
        .map(|_| {
            let b = byte();
            if unit {
                u32::from(equal_size)
            } else {
                u32::from(b)
            }
        })
        .collect();
    let seed_bits = byte();
    let seeds: Vec<SampleId> = (0..num_samples as SampleId)
        .filter(|&s| seed_bits & (1 << s) != 0)
        .collect();
    let mut epochs = vec![Vec::new()];
    for &b in data.iter().skip(at).take(MAX_ACCESSES) {
        if b == 0xFF {
            epochs.push(Vec::new());
        } else {
            epochs
                .last_mut()
                .expect("one epoch at least")
                .push((usize::from(b) % num_samples) as SampleId);
        }
    }
    check_tier_case(&epochs, &sizes, memory, disk, &seeds);
}
