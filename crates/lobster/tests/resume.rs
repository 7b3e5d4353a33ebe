//! Checkpoint and resume, in the style of torchdata's StatefulDataLoader tests: a loader
//! stopped after `k` batches per rank saves its state, a new loader resumes from it, and the
//! batches it gives are the uninterrupted run's from `k` on, bit for bit (ids, labels, and the
//! pixels' CRC with augmentation and the decoded tier on). Elastic resumes (8 ranks to 4, 4 to
//! 8) take every sample of the interrupted epoch once, beyond the sampler's padding.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use lobster_io::images::Pixels;
use lobster_io::images::Transform;
use lobster_io::{
    Batch, CachePolicy, Dataset, DistributedSampler, EpochOrder, Error, FormChoice, Loader,
    LoaderBuilder, LoaderState,
};

/// One batch as a resume must reproduce it: epoch, iteration, ids, labels, CRC of values.
type Seen = (u32, u32, Vec<u32>, Vec<u32>, u32);

fn seen<T: AsRef<[u8]>>(b: &Batch<T>) -> Seen {
    let mut crc = crc32(0, &[]);
    for s in &b.samples {
        crc = crc32(crc, s.value.as_ref());
    }
    (
        b.epoch,
        b.iteration,
        b.samples.iter().map(|s| s.id).collect(),
        b.samples.iter().map(|s| s.label).collect(),
        crc,
    )
}

/// CRC-32 (IEEE), bitwise: the test's own, so it checks the loader's bytes independently.
fn crc32(crc: u32, bytes: &[u8]) -> u32 {
    let mut c = !crc;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A folder of 4 classes x 10 JPEGs of different sizes, so that crops and flips differ.
fn jpegs(dir: &Path) -> Arc<Dataset> {
    lobster_testkit::data::gradient_jpegs(dir, 40, 4, |i| (24 + i, 18 + (i * 7) % 13), 90)
}

/// 2 ranks of batch 3 over 40 images, 3 epochs: 7 iterations an epoch, the last of 2.
/// Augmented (random crops and flips seeded by seed, epoch, id); the cache keeps decoded
/// images where that pays, so hits run only the transform.
fn image_loader(ds: &Arc<Dataset>, resume: Option<LoaderState>) -> Result<Loader<Pixels>, Error> {
    let mut b = LoaderBuilder::<Pixels>::new(ds.clone())
        .world(1, 2, 0)
        .batch_size(3)
        .epochs(3)
        .seed(11)
        .decode_threads(2)
        .prefetch_iterations(2)
        .cache(CachePolicy::Reuse, 40 << 10)
        .cache_forms(FormChoice::Decoded)
        .decode_images(Transform::Train { size: 8 });
    if let Some(state) = resume {
        b = b.resume_from(state);
    }
    b.build()
}

/// Takes `k` batches on every rank (each on its own thread), then every rank's rest if
/// `rest`; returns what each rank saw.
fn take<T: AsRef<[u8]> + Send>(loader: &mut Loader<T>, k: Option<usize>) -> Vec<Vec<Seen>> {
    let handles = loader.ranks().unwrap();
    std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .into_iter()
            .map(|h| {
                s.spawn(move || {
                    h.take(k.unwrap_or(usize::MAX))
                        .map(|b| seen(&b.unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// Each rank's batches from `from` on.
fn after(run: &[Vec<Seen>], from: usize) -> Vec<Vec<Seen>> {
    run.iter()
        .map(|r| r[from.min(r.len())..].to_vec())
        .collect()
}

#[test]
fn a_resumed_loader_gives_the_uninterrupted_runs_batches_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let ds = jpegs(dir.path());
    let mut whole = image_loader(&ds, None).unwrap();
    assert_eq!(whole.iterations_per_epoch(), 7);
    let full = take(&mut whole, None);
    assert_eq!(full[0].len(), 21);
    let decoded_hits = whole.metrics().decoded_hits_served;
    assert!(
        decoded_hits > 0,
        "the decoded tier must serve hits, or it is not tested"
    );
    drop(whole);
    // 0, 1, mid-epoch, the last iteration of epoch 0, the first of epoch 1, the last of the
    // run, and after it.
    for k in [0, 1, 3, 6, 7, 13, 20, 21] {
        let mut first = image_loader(&ds, None).unwrap();
        let before = take(&mut first, Some(k));
        assert_eq!(
            before,
            full.iter().map(|r| r[..k].to_vec()).collect::<Vec<_>>()
        );
        let state = first.state();
        drop(first);
        // Through its JSON, as a job saves it.
        let state = LoaderState::from_json(&state.to_json()).unwrap();
        let mut resumed = image_loader(&ds, Some(state)).unwrap();
        assert_eq!(resumed.steps(), 21 - k as u64, "after {k}");
        let rest = take(&mut resumed, None);
        assert_eq!(rest, after(&full, k), "resumed after {k} batches");
        // The steady state is measured after the resumed run's own first epoch.
        let m = resumed.metrics();
        assert_eq!(
            m.steady_samples_per_second > 0.0,
            k < 14,
            "after {k}: steady {} (more than one epoch left: measured)",
            m.steady_samples_per_second
        );
        // Nothing delivered twice: the resumed run counts only its own batches.
        assert_eq!(
            resumed.metrics().samples,
            (full[0][k..].iter().chain(&full[1][k..]))
                .map(|b| b.2.len() as u64)
                .sum::<u64>()
        );
    }
}

#[test]
fn two_consecutive_resumes_give_the_same_batches_as_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let ds = jpegs(dir.path());
    let full = take(&mut image_loader(&ds, None).unwrap(), None);
    let mut a = image_loader(&ds, None).unwrap();
    take(&mut a, Some(4));
    let state = a.state();
    drop(a);
    let mut b = image_loader(&ds, Some(state)).unwrap();
    let middle = take(&mut b, Some(5));
    assert_eq!(
        middle,
        full.iter().map(|r| r[4..9].to_vec()).collect::<Vec<_>>()
    );
    let state = b.state();
    assert_eq!(state.ranks[0].epoch, 1);
    assert_eq!(state.ranks[0].iteration, 2);
    drop(b);
    let rest = take(&mut image_loader(&ds, Some(state)).unwrap(), None);
    assert_eq!(rest, after(&full, 9));
}

/// A byte-decoded loader of `ranks` ranks on one node, batch 4, 3 epochs.
fn bytes_loader(
    ds: &Arc<Dataset>,
    ranks: usize,
    resume: Option<LoaderState>,
) -> Result<Loader<Vec<u8>>, Error> {
    let mut b = LoaderBuilder::new(ds.clone())
        .world(1, ranks, 0)
        .batch_size(4)
        .epochs(3)
        .seed(3)
        .decode_threads(ranks)
        .cache(CachePolicy::Reuse, 64 << 10)
        .decode(|bytes: &[u8], _| Ok::<_, std::io::Error>(bytes.to_vec()));
    if let Some(state) = resume {
        b = b.resume_from(state);
    }
    b.build()
}

/// World `from` stops after `k` batches of epoch 1; world `to` resumes. Every sample of epoch 1
/// is taken, none twice beyond the two worlds' padding, and epoch 2 is the new world's own.
fn elastic(from: usize, to: usize, k: usize) {
    let dir = tempfile::tempdir().unwrap();
    let samples = 203u32;
    let ds = lobster_testkit::data::make_dataset(dir.path(), samples, 3);
    let mut old = bytes_loader(&ds, from, None).unwrap();
    let per_epoch = old.iterations_per_epoch();
    let before = take(&mut old, Some(per_epoch + k));
    let state = old.state();
    drop(old);
    assert_eq!(
        (state.ranks[0].epoch, state.ranks[0].iteration),
        (1, k as u32)
    );
    let mut new = bytes_loader(&ds, to, Some(state)).unwrap();
    let rest = take(&mut new, None);
    let mut count: HashMap<u32, usize> = HashMap::new();
    for batch in before.iter().chain(&rest).flatten() {
        if batch.0 == 1 {
            for &id in &batch.2 {
                *count.entry(id).or_default() += 1;
            }
        }
    }
    assert_eq!(
        count.len(),
        samples as usize,
        "{from}->{to}: every sample of epoch 1"
    );
    let repeats: usize = count.values().map(|c| c - 1).sum();
    let padding = |w: usize| (samples as usize).div_ceil(w) * w - samples as usize;
    assert!(
        repeats <= padding(from) + padding(to),
        "{from}->{to}: {repeats} repeats, padding {} + {}",
        padding(from),
        padding(to)
    );
    // Bytes are each sample's.
    for batch in rest.iter().flatten() {
        assert_eq!(batch.3.len(), batch.2.len());
    }
    // Epoch 2 is the new world's DistributedSampler order.
    let sampler =
        DistributedSampler::new(samples as usize, to, false, EpochOrder::Shuffle { seed: 3 })
            .unwrap();
    for (rank, batches) in rest.iter().enumerate() {
        let got: Vec<u32> = batches
            .iter()
            .filter(|b| b.0 == 2)
            .flat_map(|b| b.2.clone())
            .collect();
        assert_eq!(
            got,
            sampler.rank_indices(2, rank),
            "{from}->{to}: rank {rank}"
        );
    }
    // Every rank of the new world got as many batches in epoch 1 (steps stay in lockstep).
    let counts: Vec<usize> = rest
        .iter()
        .map(|r| r.iter().filter(|b| b.0 == 1).count())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] == w[1]), "{counts:?}");
}

#[test]
fn elastic_resume_from_8_ranks_to_4_takes_every_sample_of_the_epoch_once() {
    elastic(8, 4, 3);
}

#[test]
fn elastic_resume_from_4_ranks_to_8_takes_every_sample_of_the_epoch_once() {
    elastic(4, 8, 5);
}

#[test]
fn a_state_from_another_job_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let ds = lobster_testkit::data::make_dataset(dir.path(), 50, 2);
    let mut a = bytes_loader(&ds, 2, None).unwrap();
    take(&mut a, Some(2));
    let state = a.state();
    drop(a);
    let refused = |b: LoaderBuilder<Vec<u8>>, field: &str| {
        let err = b.resume_from(state.clone()).build().unwrap_err();
        match &err {
            Error::Resume { field: f, .. } => assert_eq!(*f, field, "{err}"),
            other => panic!("expected a refusal naming {field}, got {other}"),
        }
        assert!(err.to_string().contains(field), "{err}");
    };
    let builder = || {
        LoaderBuilder::new(ds.clone())
            .world(1, 2, 0)
            .batch_size(4)
            .epochs(3)
            .seed(3)
            .decode(|bytes: &[u8], _| Ok::<_, std::io::Error>(bytes.to_vec()))
    };
    refused(builder().seed(4), "order");
    refused(builder().batch_size(5), "batch_size");
    refused(builder().drop_last(true), "drop_last");
    let resumed_on = |ds: Arc<Dataset>| {
        LoaderBuilder::new(ds)
            .world(1, 2, 0)
            .batch_size(4)
            .seed(3)
            .decode(|bytes: &[u8], _| Ok::<_, std::io::Error>(bytes.to_vec()))
            .resume_from(state.clone())
            .build()
            .unwrap_err()
    };
    let other = tempfile::tempdir().unwrap();
    let err = resumed_on(lobster_testkit::data::make_dataset(other.path(), 51, 2));
    assert!(
        matches!(
            err,
            Error::Resume {
                field: "samples",
                ..
            }
        ),
        "{err}"
    );
    // Same count, one file changed: the dataset's digest differs.
    let third = tempfile::tempdir().unwrap();
    lobster_testkit::data::make_dataset(third.path(), 50, 2);
    std::fs::write(third.path().join("c0").join("000000.jpg"), b"other bytes").unwrap();
    let err = resumed_on(Arc::new(Dataset::open_image_folder(third.path()).unwrap()));
    assert!(
        matches!(
            err,
            Error::Resume {
                field: "dataset",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn ranks_saved_at_different_batches_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ds = lobster_testkit::data::make_dataset(dir.path(), 50, 2);
    let mut a = bytes_loader(&ds, 2, None).unwrap();
    let mut handles = a.ranks().unwrap();
    let mut second = handles.pop().unwrap();
    let mut first = handles.pop().unwrap();
    first.next().unwrap().unwrap();
    first.next().unwrap().unwrap();
    second.next().unwrap().unwrap();
    let state = a.state();
    assert_eq!(
        state.ranks.iter().map(|r| r.iteration).collect::<Vec<_>>(),
        vec![2, 1],
        "the state names what each rank was given"
    );
    drop((first, second, a));
    let err = bytes_loader(&ds, 2, Some(state)).unwrap_err();
    assert!(matches!(err, Error::Resume { field: "ranks", .. }), "{err}");
}

#[test]
fn a_damaged_state_file_is_an_error_not_a_fresh_start() {
    let dir = tempfile::tempdir().unwrap();
    let ds = lobster_testkit::data::make_dataset(dir.path(), 50, 2);
    let mut a = bytes_loader(&ds, 2, None).unwrap();
    take(&mut a, Some(3));
    let json = a.state().to_json();
    for (what, damaged) in [
        ("truncated", json[..json.len() - 5].to_string()),
        ("empty", String::new()),
        (
            "a digit changed",
            json.replacen("\"iteration\": 3", "\"iteration\": 0", 1),
        ),
        ("a field added", json.replacen("{", "{\"extra\": 1,", 1)),
    ] {
        assert_ne!(damaged, json, "{what}: the damage must change the file");
        let err = LoaderState::from_json(&damaged).unwrap_err();
        assert!(
            matches!(err, Error::StateUnreadable { .. }),
            "{what}: {err}"
        );
    }
}

const NODES: usize = 3;
const RANKS: usize = 2;

/// Node `node` of a 3-node job over in-process transports, its cache a third of the dataset
/// (the cluster plan gains there), slow storage so that peers are preferred.
fn node_loader(
    ds: &Arc<Dataset>,
    node: usize,
    transport: Arc<lobster_io::net::InProcessNode>,
    resume: Option<LoaderState>,
) -> Loader<Vec<u8>> {
    let capacity = ds.samples().iter().map(|s| s.size_bytes).sum::<u64>() / 3;
    let mut b = LoaderBuilder::new(ds.clone())
        .world(NODES, RANKS, node)
        .seed(9)
        .batch_size(4)
        .epochs(5)
        .cache(CachePolicy::Reuse, capacity)
        .decode_threads(2)
        .io_depth(4)
        .storage_emulation(Some(lobster_io::StorageEmulation {
            bandwidth_bytes_per_s: 50e6,
            latency_us: 500,
        }))
        .peers(transport as Arc<dyn lobster_io::net::Transport>)
        .decode(|b: &[u8], _| Ok::<_, std::io::Error>(b.to_vec()));
    if let Some(state) = resume {
        b = b.resume_from(state);
    }
    b.build().unwrap()
}

/// A job of several nodes whose caches serve each other resumes exactly too: at an epoch's
/// start under the cluster plan, within an epoch under each node's own plan (the cluster plan
/// starts at an epoch), and every remote hit planned after the resume is served.
#[test]
fn a_job_of_nodes_with_peers_resumes_exactly_and_serves_every_planned_remote_hit() {
    let dir = tempfile::tempdir().unwrap();
    let ds = lobster_testkit::data::make_dataset(dir.path(), 96, 3);
    let nodes = lobster_io::net::InProcessNodes::connect(NODES);
    let mut whole: Vec<_> = (0..NODES)
        .map(|n| node_loader(&ds, n, nodes[n].clone(), None))
        .collect();
    let per_epoch = whole[0].iterations_per_epoch();
    let full = lobster_testkit::loader::run_lock_step(&mut whole, None, |b| seen(&b.unwrap()));
    drop(whole);
    for (k, plan) in [
        (per_epoch, lobster_io::PeerPlanKind::Cluster),
        (per_epoch + 2, lobster_io::PeerPlanKind::Node),
    ] {
        let nodes = lobster_io::net::InProcessNodes::connect(NODES);
        let mut first: Vec<_> = (0..NODES)
            .map(|n| node_loader(&ds, n, nodes[n].clone(), None))
            .collect();
        lobster_testkit::loader::run_lock_step(&mut first, Some(k), |b| seen(&b.unwrap()));
        let states: Vec<LoaderState> = first.iter().map(Loader::state).collect();
        drop(first);
        let nodes = lobster_io::net::InProcessNodes::connect(NODES);
        let mut resumed: Vec<_> = states
            .into_iter()
            .enumerate()
            .map(|(n, s)| node_loader(&ds, n, nodes[n].clone(), Some(s)))
            .collect();
        let rest =
            lobster_testkit::loader::run_lock_step(&mut resumed, None, |b| seen(&b.unwrap()));
        for (n, (got, want)) in rest.iter().zip(&full).enumerate() {
            assert_eq!(got, &after(want, k), "node {n} resumed after {k}");
            let m = resumed[n].metrics();
            assert_eq!(m.peer_plan.mode, plan, "after {k}: {:?}", m.peer_plan);
            assert!(
                m.planned_remote_hits > 0,
                "after {k}: peers must serve, or this tests nothing"
            );
            assert_eq!(m.remote_hits, m.planned_remote_hits, "after {k}");
            assert_eq!(m.remote_misses, 0, "after {k}");
        }
    }
}
