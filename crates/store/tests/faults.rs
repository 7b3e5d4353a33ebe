//! Faults of a real S3 server (s3s-fs on loopback): 503 storms, stalled bodies, deadlines, and
//! a store dropped with reads in flight. Every step runs under a hang watchdog.

use std::sync::Mutex;
use std::time::Duration;

use lobster_store::{RangeRead, Store, StoreConfig, StoreError};
use lobster_testkit::process::{guarded, threads};
use lobster_testkit::s3::TestS3;

/// One test at a time: the drop test counts the process's store threads.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i.wrapping_mul(13) % 253) as u8).collect()
}

fn config(s3: &TestS3) -> StoreConfig {
    StoreConfig::default()
        .with_endpoint(&s3.endpoint())
        .with_credentials(s3.access_key(), s3.secret_key(), None)
}

fn server(len: usize) -> TestS3 {
    let s3 = TestS3::start();
    s3.create_bucket("bkt");
    s3.put("bkt", "obj", data(len));
    s3
}

#[test]
fn a_storm_of_slow_downs_is_retried_until_it_passes() {
    let _serial = serial();
    let s3 = server(64 << 10);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let before = s3.requests();
    s3.slow_down_next(5);
    let (got, took) = guarded("a read through 5 x 503".into(), || {
        store.get(&RangeRead::new("obj", 100, 4000, 0))
    });
    println!("through 5 x 503 SlowDown: {took:?}");
    assert_eq!(&got.unwrap()[..], &data(64 << 10)[100..4100]);
    // Five refused, one answered; one request as far as the store counts.
    assert_eq!(s3.requests() - before, 6);
    assert_eq!(store.stats().get_requests, 1);
    assert_eq!(store.stats().failed_requests, 0);
}

#[test]
fn a_storm_longer_than_the_deadline_fails_naming_object_and_range() {
    let _serial = serial();
    let s3 = server(64 << 10);
    let deadline = Duration::from_millis(800);
    let store = Store::open(&config(&s3).with_request_deadline(deadline), "bkt").unwrap();
    s3.slow_down_next(u64::MAX);
    let (e, took) = guarded("a read through an endless 503 storm".into(), || {
        store.get(&RangeRead::new("obj", 4096, 100, 0)).unwrap_err()
    });
    println!("endless 503 storm, deadline {deadline:?}: failed after {took:?}");
    assert!(took >= deadline, "{took:?}");
    assert!(matches!(e, StoreError::Deadline { .. }), "{e:?}");
    assert!(!e.is_transient());
    assert!(
        e.to_string()
            .starts_with("s3://bkt/obj bytes 4096..4196: no answer within the deadline"),
        "{e}"
    );
    // The same through a session, several at once.
    let mut session = store.session();
    for tag in 0..4 {
        session
            .queue(RangeRead::new("obj", tag * 10, 10, tag))
            .unwrap();
    }
    let mut done = Vec::new();
    let (n, _) = guarded("session reads through an endless storm".into(), || {
        session
            .wait_timeout(4, Duration::from_secs(20), &mut done)
            .unwrap()
    });
    assert_eq!(n, 4);
    assert!(done
        .iter()
        .all(|c| matches!(c.result, Err(StoreError::Deadline { .. }))));
    // The four adjacent reads shared one GET; each error names the read's own range.
    for c in &done {
        let (start, end) = (c.tag * 10, c.tag * 10 + 10);
        let e = c.result.as_ref().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("s3://bkt/obj bytes {start}..{end}: no answer")),
            "{e}"
        );
    }
    assert_eq!(store.stats().get_requests, 2);
    assert_eq!(store.stats().coalesced_reads, 3);
    assert_eq!(store.stats().failed_requests, 2);
    s3.slow_down_next(0);
    assert_eq!(store.get(&RangeRead::new("obj", 0, 3, 0)).unwrap().len(), 3);
}

#[test]
fn a_body_stalled_mid_way_is_resumed_and_complete() {
    let _serial = serial();
    let s3 = server(1 << 20);
    let config = config(&s3).with_stall_timeout(Duration::from_millis(300));
    let store = Store::open(&config, "bkt").unwrap();
    s3.stall_next(2);
    let whole = RangeRead {
        whole_object: true,
        ..RangeRead::new("obj", 0, 1 << 20, 0)
    };
    let before = s3.requests();
    let (got, took) = guarded("a read stalled twice".into(), || store.get(&whole));
    println!("1 MiB stalled twice after the first chunk: {took:?}");
    assert_eq!(got.unwrap()[..], data(1 << 20)[..]);
    // The two stalled attempts and the one that finished.
    assert_eq!(s3.requests() - before, 3);
}

#[test]
fn a_body_stalled_forever_fails_at_the_deadline() {
    let _serial = serial();
    let s3 = server(1 << 20);
    let deadline = Duration::from_millis(1500);
    let config = config(&s3)
        .with_stall_timeout(Duration::from_millis(200))
        .with_request_deadline(deadline);
    let store = Store::open(&config, "bkt").unwrap();
    s3.stall_next(u64::MAX);
    let (e, took) = guarded("a read stalled forever".into(), || {
        store
            .get(&RangeRead::new("obj", 0, 512 << 10, 0))
            .unwrap_err()
    });
    println!("stalled forever, deadline {deadline:?}: failed after {took:?}");
    assert!(matches!(e, StoreError::Deadline { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("s3://bkt/obj bytes 0..524288: no answer"),
        "{e}"
    );
}

#[test]
fn dropping_the_store_with_reads_in_flight_neither_hangs_nor_leaks_its_thread() {
    let _serial = serial();
    let s3 = server(1 << 20);
    let threads_before = threads().iter().filter(|t| *t == "lobster-store").count();
    // Stalls are cut only after a minute: the reads are still in flight at the drop.
    let config = config(&s3).with_stall_timeout(Duration::from_secs(60));
    let store = Store::open(&config, "bkt").unwrap();
    assert_eq!(
        threads().iter().filter(|t| *t == "lobster-store").count(),
        threads_before + 1
    );
    s3.stall_next(u64::MAX);
    let mut session = store.session();
    for tag in 0..16 {
        session
            .queue(RangeRead::new("obj", tag * 65_536, 65_536, tag))
            .unwrap();
    }
    let mut done = Vec::new();
    assert_eq!(
        session
            .wait_timeout(1, Duration::from_millis(300), &mut done)
            .unwrap(),
        0
    );
    let (_, took) = guarded("dropping a store with 16 reads in flight".into(), || {
        drop(store);
        drop(session);
    });
    println!("dropped with 16 reads in flight: {took:?}");
    assert_eq!(
        threads().iter().filter(|t| *t == "lobster-store").count(),
        threads_before
    );
}

#[test]
fn reads_in_flight_when_the_store_is_dropped_are_answered_by_a_session_that_outlives_it() {
    let _serial = serial();
    let s3 = server(64 << 10);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let mut session = store.session();
    drop(store);
    // The session keeps the thread: its reads still complete.
    session.queue(RangeRead::new("obj", 0, 10, 9)).unwrap();
    let mut done = Vec::new();
    let (n, _) = guarded("a read after the store was dropped".into(), || {
        session
            .wait_timeout(1, Duration::from_secs(30), &mut done)
            .unwrap()
    });
    assert_eq!(n, 1);
    assert_eq!(done[0].tag, 9);
    assert_eq!(&done[0].result.as_ref().unwrap()[..], &data(10)[..]);
}

#[test]
fn an_endpoint_nobody_answers_fails_open_at_the_deadline() {
    let _serial = serial();
    // A port that was free a moment ago: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = StoreConfig::default()
        .with_endpoint(&format!("http://127.0.0.1:{port}"))
        .with_credentials("AKID", "secret", None)
        .with_request_deadline(Duration::from_millis(500));
    let (e, took) = guarded("open against a closed port".into(), || {
        Store::open(&config, "bkt").unwrap_err()
    });
    println!("open against a closed port: {e} after {took:?}");
    assert!(matches!(e, StoreError::Deadline { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("s3://bkt: no answer within the deadline of 500ms"),
        "{e}"
    );
}
