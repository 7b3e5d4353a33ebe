//! Reads of one object queued together share one GET, against a real S3 server (s3s-fs on
//! loopback): what merges, what never does, and that each read still gets exactly its own
//! bytes or an error naming its own range.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lobster_store::{RangeRead, Store, StoreConfig, StoreError, StoreSession, StoreStats};
use lobster_testkit::process::guarded;
use lobster_testkit::s3::TestS3;

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i.wrapping_mul(31) % 241) as u8 ^ seed)
        .collect()
}

fn config(s3: &TestS3) -> StoreConfig {
    StoreConfig::default()
        .with_endpoint(&s3.endpoint())
        .with_credentials(s3.access_key(), s3.secret_key(), None)
}

fn server_with(objects: &[(&str, &[u8])]) -> TestS3 {
    let s3 = TestS3::start();
    s3.create_bucket("bkt");
    for (key, bytes) in objects {
        s3.put("bkt", key, bytes.to_vec());
    }
    s3
}

/// Queues `reads`, waits for all of them and returns each tag's result; every tag must come
/// back exactly once.
fn run(session: &mut StoreSession, reads: &[RangeRead]) -> HashMap<u64, Result<Bytes, StoreError>> {
    for r in reads {
        session.queue(r.clone()).unwrap();
    }
    collect(session, reads.len())
}

thread_local! {
    /// Completions this test's thread collected that rode another read's GET.
    static SHARED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn shared_so_far() -> u64 {
    SHARED.with(std::cell::Cell::get)
}

fn collect(session: &mut StoreSession, n: usize) -> HashMap<u64, Result<Bytes, StoreError>> {
    let mut results = HashMap::new();
    let mut done = Vec::new();
    guarded(format!("{n} queued reads"), || {
        while results.len() < n {
            done.clear();
            session
                .wait_timeout(n - results.len(), Duration::from_secs(60), &mut done)
                .unwrap();
            assert!(!done.is_empty(), "no completion within 60 s");
            for c in done.drain(..) {
                SHARED.with(|s| s.set(s.get() + u64::from(c.shared)));
                assert!(
                    results.insert(c.tag, c.result).is_none(),
                    "tag {} twice",
                    c.tag
                );
            }
        }
    });
    assert_eq!(session.in_flight(), 0);
    results
}

fn delta(after: StoreStats, before: StoreStats) -> StoreStats {
    StoreStats {
        get_requests: after.get_requests - before.get_requests,
        bytes_received: after.bytes_received - before.bytes_received,
        coalesced_reads: after.coalesced_reads - before.coalesced_reads,
        gap_bytes: after.gap_bytes - before.gap_bytes,
        list_requests: after.list_requests - before.list_requests,
        head_requests: after.head_requests - before.head_requests,
        failed_requests: after.failed_requests - before.failed_requests,
    }
}

fn bytes_of<'a>(blob: &'a [u8], r: &RangeRead) -> &'a [u8] {
    &blob[r.offset as usize..(r.offset + r.len) as usize]
}

fn assert_exact(
    results: &HashMap<u64, Result<Bytes, StoreError>>,
    reads: &[RangeRead],
    blob: &[u8],
) {
    for r in reads {
        let got = results[&r.tag]
            .as_ref()
            .unwrap_or_else(|e| panic!("{r:?}: {e}"));
        assert!(got[..] == *bytes_of(blob, r), "{r:?} has the wrong bytes");
    }
}

/// Runs `reads` of `blob`'s object, checks each got exactly its bytes and that the server saw
/// each GET the stats count: (GETs, coalesced reads, gap bytes, bytes received).
fn exact_counts(
    s3: &TestS3,
    store: &Store,
    session: &mut StoreSession,
    reads: &[RangeRead],
    blob: &[u8],
) -> (u64, u64, u64, u64) {
    let (requests, before) = (s3.requests(), store.stats());
    assert_exact(&run(session, reads), reads, blob);
    let d = delta(store.stats(), before);
    assert_eq!(
        s3.requests() - requests,
        d.get_requests,
        "the server saw each GET"
    );
    (
        d.get_requests,
        d.coalesced_reads,
        d.gap_bytes,
        d.bytes_received,
    )
}

#[test]
fn three_adjacent_ranges_of_one_object_are_one_get_each_with_its_bytes() {
    let blob = data(64 << 10, 1);
    let s3 = server_with(&[("shard.tar", &blob)]);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let mut session = store.session();
    let reads = [
        RangeRead::new("shard.tar", 300, 50, 12),
        RangeRead::new("shard.tar", 0, 100, 10),
        RangeRead::new("shard.tar", 100, 200, 11),
    ];
    assert_eq!(
        exact_counts(&s3, &store, &mut session, &reads, &blob),
        (1, 2, 0, 350)
    );
}

#[test]
fn a_gap_up_to_the_limit_is_bridged_and_counted_and_a_larger_one_is_two_gets() {
    let blob = data(64 << 10, 2);
    let s3 = server_with(&[("o", &blob)]);
    let store = Store::open(&config(&s3).with_coalescing(1000, 1 << 20), "bkt").unwrap();
    let mut session = store.session();
    let bridged = [
        RangeRead::new("o", 0, 100, 0),
        RangeRead::new("o", 1100, 100, 1),
    ];
    assert_eq!(
        exact_counts(&s3, &store, &mut session, &bridged, &blob),
        (1, 1, 1000, 1200)
    );
    let apart = [
        RangeRead::new("o", 0, 100, 2),
        RangeRead::new("o", 1101, 100, 3),
    ];
    assert_eq!(
        exact_counts(&s3, &store, &mut session, &apart, &blob),
        (2, 0, 0, 200)
    );
}

#[test]
fn no_coalesced_get_spans_more_than_the_limit() {
    let blob = data(64 << 10, 3);
    let s3 = server_with(&[("o", &blob)]);
    let store = Store::open(&config(&s3).with_coalescing(0, 1000), "bkt").unwrap();
    let mut session = store.session();
    let reads: Vec<RangeRead> = (0..10)
        .map(|i| RangeRead::new("o", i * 250, 250, i))
        .collect();
    // 0..1000, 1000..2000, 2000..2500.
    assert_eq!(
        exact_counts(&s3, &store, &mut session, &reads, &blob),
        (3, 7, 0, 2500)
    );
    // Span 0 is off: one GET per read, as queued.
    let off = Store::open(&config(&s3).with_coalescing(1 << 20, 0), "bkt").unwrap();
    let mut session = off.session();
    let requests = s3.requests();
    assert_exact(&run(&mut session, &reads), &reads, &blob);
    assert_eq!(s3.requests() - requests, 10);
    assert_eq!(off.stats().coalesced_reads, 0);
}

#[test]
fn different_objects_and_whole_objects_are_never_merged() {
    let (a, b) = (data(1000, 4), data(1000, 5));
    let s3 = server_with(&[("a", &a), ("b", &b)]);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let mut session = store.session();
    let whole = RangeRead {
        whole_object: true,
        ..RangeRead::new("a", 0, 1000, 4)
    };
    let reads = [
        RangeRead::new("a", 0, 10, 0),
        RangeRead::new("b", 10, 10, 1),
        RangeRead::new("a", 10, 10, 2),
        RangeRead::new("b", 0, 10, 3),
        whole.clone(),
    ];
    let (requests, before) = (s3.requests(), store.stats());
    let results = run(&mut session, &reads);
    assert_exact(&results, &[reads[0].clone(), reads[2].clone(), whole], &a);
    assert_exact(&results, &[reads[1].clone(), reads[3].clone()], &b);
    // a's two ranges, b's two, and the whole of a on its own.
    assert_eq!(s3.requests() - requests, 3);
    let d = delta(store.stats(), before);
    assert_eq!((d.get_requests, d.coalesced_reads), (3, 2));
}

#[test]
fn overlapping_ranges_each_get_exactly_their_own_bytes() {
    let blob = data(4096, 6);
    let s3 = server_with(&[("o", &blob)]);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let mut session = store.session();
    let reads = [
        RangeRead::new("o", 0, 100, 0),
        RangeRead::new("o", 50, 100, 1),
        RangeRead::new("o", 60, 10, 2),
        RangeRead::new("o", 0, 150, 3),
        RangeRead::new("o", 50, 100, 4),
    ];
    assert_eq!(
        exact_counts(&s3, &store, &mut session, &reads, &blob),
        (1, 4, 0, 150)
    );
}

/// Each member's error, and the tags and ranges it must name.
fn assert_each_names_its_range(
    results: &HashMap<u64, Result<Bytes, StoreError>>,
    reads: &[RangeRead],
    what: &str,
) {
    for r in reads {
        let e = results[&r.tag].as_ref().unwrap_err();
        let want = format!(
            "s3://bkt/{} bytes {}..{}: {what}",
            r.key,
            r.offset,
            r.offset + r.len
        );
        assert!(e.to_string().starts_with(&want), "{e} is not {want}");
    }
}

#[test]
fn a_merged_get_past_its_deadline_fails_every_member_naming_its_own_range() {
    let blob = data(64 << 10, 7);
    let s3 = server_with(&[("obj", &blob)]);
    let deadline = Duration::from_millis(500);
    let store = Store::open(&config(&s3).with_request_deadline(deadline), "bkt").unwrap();
    let mut session = store.session();
    let reads = [
        RangeRead::new("obj", 100, 10, 0),
        RangeRead::new("obj", 110, 20, 1),
        RangeRead::new("obj", 200, 5, 2),
    ];
    let before = store.stats();
    s3.slow_down_next(u64::MAX);
    let results = run(&mut session, &reads);
    s3.slow_down_next(0);
    for r in results.values() {
        assert!(matches!(r, Err(StoreError::Deadline { .. })), "{r:?}");
    }
    assert_each_names_its_range(&results, &reads, "no answer within the deadline");
    let d = delta(store.stats(), before);
    assert_eq!(
        (d.get_requests, d.coalesced_reads, d.failed_requests),
        (1, 2, 1)
    );
    // The storm over, the same reads succeed.
    assert_exact(&run(&mut session, &reads), &reads, &blob);
}

#[test]
fn a_merged_get_of_a_missing_or_replaced_object_fails_every_member() {
    let s3 = TestS3::start();
    s3.create_bucket("bkt");
    let etag: Arc<str> = Arc::from(s3.put("bkt", "c", data(500, 8)));
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let mut session = store.session();
    let gone = [
        RangeRead::new("gone", 0, 4, 0),
        RangeRead::new("gone", 4, 4, 1),
    ];
    let before = store.stats();
    let results = run(&mut session, &gone);
    for r in results.values() {
        let e = r.as_ref().unwrap_err();
        assert!(matches!(e, StoreError::NotFound { .. }), "{e:?}");
        // As a read's own GET would say it: the object has no byte ranges.
        assert_eq!(e.to_string(), "s3://bkt/gone: no such object");
    }
    let d = delta(store.stats(), before);
    assert_eq!((d.get_requests, d.failed_requests), (1, 1));

    let tagged = |offset, len, tag| RangeRead {
        if_match: Some(etag.clone()),
        ..RangeRead::new("c", offset, len, tag)
    };
    let reads = [tagged(10, 20, 2), tagged(30, 5, 3), tagged(100, 1, 4)];
    assert_exact(&run(&mut session, &reads), &reads, &data(500, 8));
    s3.put("bkt", "c", data(500, 9));
    let results = run(&mut session, &reads);
    for r in results.values() {
        assert!(
            matches!(r, Err(StoreError::Changed { etag: t, .. }) if *t == etag),
            "{r:?}"
        );
    }
    assert_each_names_its_range(&results, &reads, "the object changed");
}

#[test]
fn a_short_body_fails_only_the_members_it_cuts_short() {
    let blob = data(1000, 10);
    let s3 = server_with(&[("s", &blob)]);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let mut session = store.session();
    let reads = [
        RangeRead::new("s", 900, 50, 0),
        RangeRead::new("s", 950, 50, 1),
        RangeRead::new("s", 990, 20, 2),
        RangeRead::new("s", 1005, 5, 3),
    ];
    let before = store.stats();
    let results = run(&mut session, &reads);
    assert_exact(&results, &reads[..2], &blob);
    assert!(
        matches!(results[&2], Err(StoreError::Short { got_bytes: 10, .. })),
        "{:?}",
        results[&2]
    );
    assert!(
        matches!(results[&3], Err(StoreError::Short { got_bytes: 0, .. })),
        "{:?}",
        results[&3]
    );
    assert_each_names_its_range(&results, &reads[2..], "got");
    let d = delta(store.stats(), before);
    assert_eq!(
        (
            d.get_requests,
            d.coalesced_reads,
            d.bytes_received,
            d.failed_requests
        ),
        (1, 3, 100, 1)
    );
}

#[test]
fn flush_sends_what_is_queued_and_a_full_queue_sends_itself() {
    let blob = data(256 << 10, 11);
    let s3 = server_with(&[("o", &blob)]);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let mut session = store.session();
    // A flush between two runs of adjacent reads keeps them apart.
    let first: Vec<RangeRead> = (0..3).map(|i| RangeRead::new("o", i * 10, 10, i)).collect();
    let second: Vec<RangeRead> = (3..6).map(|i| RangeRead::new("o", i * 10, 10, i)).collect();
    let requests = s3.requests();
    for r in &first {
        session.queue(r.clone()).unwrap();
    }
    session.flush();
    for r in &second {
        session.queue(r.clone()).unwrap();
    }
    let results = collect(&mut session, 6);
    assert_exact(&results, &first, &blob);
    assert_exact(&results, &second, &blob);
    assert_eq!(s3.requests() - requests, 2);

    // 1024 reads waiting unsent go by themselves; the 1025th waits for the next send.
    let reads: Vec<RangeRead> = (0..1025)
        .map(|i| RangeRead::new("o", i * 100, 100, i))
        .collect();
    let before = store.stats();
    for r in &reads {
        session.queue(r.clone()).unwrap();
    }
    let shown = format!("{session:?}");
    assert!(shown.contains("in_flight: 1025, pending: 1 "), "{shown}");
    let results = collect(&mut session, reads.len());
    assert_exact(&results, &reads, &blob);
    let d = delta(store.stats(), before);
    assert_eq!((d.get_requests, d.coalesced_reads), (2, 1023));
}

/// A tiny deterministic generator: the test needs no crate for it.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[test]
fn random_reads_under_any_config_each_complete_once_with_their_bytes() {
    let sizes = [50_000usize, 200_000, 1_000, 0];
    let objects: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("p/{i}"), data(n, i as u8)))
        .collect();
    let s3 = TestS3::start();
    s3.create_bucket("bkt");
    for (key, blob) in &objects {
        s3.put("bkt", key, blob.clone());
    }
    let keys: Vec<Arc<str>> = objects.iter().map(|(k, _)| Arc::from(k.as_str())).collect();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut tag = 0u64;
    for round in 0..8 {
        let gap = [0, 1, 100, 4096, 1 << 20][rng.below(5) as usize];
        let span = [0, 1, 500, 10_000, 8 << 20][rng.below(5) as usize];
        let store = Store::open(&config(&s3).with_coalescing(gap, span), "bkt").unwrap();
        let mut session = store.session();
        let mut reads = Vec::new();
        for _ in 0..1 + rng.below(80) {
            let o = rng.below(objects.len() as u64) as usize;
            let size = objects[o].1.len() as u64;
            let read = if rng.below(10) == 0 {
                RangeRead {
                    whole_object: true,
                    ..RangeRead::new(keys[o].clone(), 0, size, tag)
                }
            } else {
                let offset = rng.below(size + 1);
                let len = rng.below((size - offset).min(6000) + 1);
                RangeRead::new(keys[o].clone(), offset, len, tag)
            };
            tag += 1;
            reads.push(read);
        }
        let (requests, before, shared) = (s3.requests(), store.stats(), shared_so_far());
        for r in &reads {
            session.queue(r.clone()).unwrap();
            if rng.below(20) == 0 {
                session.flush();
            }
        }
        let results = collect(&mut session, reads.len());
        assert_eq!(results.len(), reads.len());
        for r in &reads {
            let blob = &objects.iter().find(|(k, _)| **k == *r.key).unwrap().1;
            let got = results[&r.tag]
                .as_ref()
                .unwrap_or_else(|e| panic!("round {round}, gap {gap}, span {span}: {r:?}: {e}"));
            assert!(
                got[..] == *bytes_of(blob, r),
                "round {round}, gap {gap}, span {span}: {r:?} has the wrong bytes"
            );
        }
        // Each read that needs a request makes a GET or joins one; the server saw each GET.
        let d = delta(store.stats(), before);
        let needing = reads.iter().filter(|r| r.len > 0 || r.whole_object).count() as u64;
        assert_eq!(d.get_requests + d.coalesced_reads, needing, "round {round}");
        assert_eq!(s3.requests() - requests, d.get_requests, "round {round}");
        // A completion says whether it rode another's GET: the engine counts requests so.
        assert_eq!(shared_so_far() - shared, d.coalesced_reads, "round {round}");
        assert_eq!(d.failed_requests, 0);
        if span == 0 {
            assert_eq!((d.coalesced_reads, d.gap_bytes), (0, 0));
        }
        // What is not gap is the reads' bytes: no more than they asked, at least each byte
        // they cover once.
        let asked: u64 = reads.iter().map(|r| r.len).sum();
        let mut covered = 0;
        for key in &keys {
            let mut ranges: Vec<_> = reads
                .iter()
                .filter(|r| r.key == *key)
                .map(RangeRead::range)
                .collect();
            ranges.sort_by_key(|r| r.start);
            let mut to = 0;
            for r in ranges {
                let start = r.start.max(to);
                if r.end > start {
                    covered += r.end - start;
                    to = r.end;
                }
            }
        }
        let reads_bytes = d.bytes_received - d.gap_bytes;
        assert!(
            (covered..=asked).contains(&reads_bytes),
            "round {round}: {reads_bytes} not in {covered}..={asked}"
        );
    }
}
