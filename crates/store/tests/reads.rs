//! Reads, listings and errors against a real S3 server (s3s-fs on loopback).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lobster_store::{
    ObjectInfo, RangeRead, Store, StoreCompletion, StoreConfig, StoreError, StoreUrl,
};
use lobster_testkit::s3::TestS3;

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i.wrapping_mul(7) % 251) as u8 ^ seed)
        .collect()
}

fn config(s3: &TestS3) -> StoreConfig {
    StoreConfig::default()
        .with_endpoint(&s3.endpoint())
        .with_credentials(s3.access_key(), s3.secret_key(), None)
}

fn server_with(bucket: &str, objects: &[(&str, &[u8])]) -> TestS3 {
    let s3 = TestS3::start();
    s3.create_bucket(bucket);
    for (key, bytes) in objects {
        s3.put(bucket, key, bytes.to_vec());
    }
    s3
}

#[test]
fn ranged_reads_return_exactly_the_bytes_asked_for() {
    let blob = data(1 << 20, 0);
    let s3 = server_with("bkt", &[("train/a.bin", &blob)]);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    for (offset, len) in [
        (0u64, 1u64),
        (0, 4096),
        (1000, 5000),
        (123_457, 65_536),
        ((1 << 20) - 10, 10),
    ] {
        let got = store
            .get(&RangeRead::new("train/a.bin", offset, len, 0))
            .unwrap();
        assert_eq!(
            &got[..],
            &blob[offset as usize..(offset + len) as usize],
            "{offset}+{len}"
        );
    }
    // An empty range needs no request.
    let before = store.stats().get_requests;
    assert!(store
        .get(&RangeRead::new("train/a.bin", 5, 0, 0))
        .unwrap()
        .is_empty());
    assert_eq!(store.stats().get_requests, before);
    // The whole object, asked as such.
    let whole = RangeRead {
        whole_object: true,
        ..RangeRead::new("train/a.bin", 0, 1 << 20, 0)
    };
    assert_eq!(&store.get(&whole).unwrap()[..], &blob[..]);
    let stats = store.stats();
    assert_eq!(stats.get_requests, 6);
    assert_eq!(
        stats.bytes_received,
        1 + 4096 + 5000 + 65_536 + 10 + (1 << 20)
    );
    assert_eq!(stats.failed_requests, 0);
}

#[test]
fn a_session_completes_every_read_once_with_its_bytes() {
    let shards: Vec<Vec<u8>> = (0..4).map(|i| data(256 << 10, i as u8)).collect();
    let s3 = TestS3::start();
    s3.create_bucket("bkt");
    for (i, s) in shards.iter().enumerate() {
        s3.put("bkt", &format!("s/{i}.tar"), s.clone());
    }
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let mut session = store.session();
    let (reads, depth) = (512u64, 32usize);
    let read_of = |tag: u64| {
        let shard = tag % 4;
        let offset = (tag * 4099) % ((256 << 10) - 8192);
        (shard, offset, 1 + tag % 8192)
    };
    let keys: Vec<Arc<str>> = (0..4).map(|i| Arc::from(format!("s/{i}.tar"))).collect();
    let mut next = 0u64;
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut done: Vec<StoreCompletion> = Vec::new();
    let (_, took) = lobster_testkit::process::guarded("512 reads at depth 32".into(), || {
        while (seen.len() as u64) < reads {
            while session.in_flight() < depth && next < reads {
                let (shard, offset, len) = read_of(next);
                let read = RangeRead {
                    key: keys[shard as usize].clone(),
                    ..RangeRead::new("", offset, len, next)
                };
                session.queue(read).unwrap();
                next += 1;
            }
            assert!(session.in_flight() <= depth);
            done.clear();
            session
                .wait_timeout(1, Duration::from_secs(60), &mut done)
                .unwrap();
            assert!(!done.is_empty(), "no completion within 60 s");
            for c in done.drain(..) {
                let (shard, offset, len) = read_of(c.tag);
                let bytes = c.result.unwrap();
                let want = &shards[shard as usize][offset as usize..(offset + len) as usize];
                assert!(bytes[..] == *want, "read {} has the wrong bytes", c.tag);
                *seen.entry(c.tag).or_default() += 1;
            }
        }
    });
    println!("{reads} reads at depth {depth}: {took:?}");
    assert_eq!(session.in_flight(), 0);
    assert_eq!(seen.len() as u64, reads);
    assert!(seen.values().all(|&n| n == 1));
    // Each read made a GET or shared the GET of reads of its object queued with it.
    let stats = store.stats();
    assert_eq!(stats.get_requests + stats.coalesced_reads, reads);
    // Nothing more comes.
    assert_eq!(
        session
            .wait_timeout(1, Duration::from_millis(50), &mut done)
            .unwrap(),
        0
    );
}

#[test]
fn list_follows_pages_and_sorts_by_key() {
    let s3 = TestS3::start();
    s3.create_bucket("bkt");
    let mut names: Vec<String> = (0..25).map(|i| format!("p/{:03}", (i * 11) % 25)).collect();
    names.push("q/outside".to_string());
    for (i, n) in names.iter().enumerate() {
        s3.put("bkt", n, vec![b'x'; i + 1]);
    }
    let store = Store::open(&config(&s3).with_list_page_keys(7), "bkt").unwrap();
    let lists_before = store.stats().list_requests;
    let listed = store.list("p/").unwrap();
    let keys: Vec<&str> = listed.iter().map(|o| o.key.as_str()).collect();
    let mut want: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| n.starts_with("p/"))
        .collect();
    want.sort_unstable();
    assert_eq!(keys, want);
    for o in &listed {
        let i = names.iter().position(|n| *n == o.key).unwrap();
        assert_eq!(o.size_bytes, i as u64 + 1, "{}", o.key);
        // s3s-fs lists no ETag (S3 does): `etag` is whatever the server sent.
    }
    // 25 keys at 7 a page: 4 pages.
    assert_eq!(store.stats().list_requests - lists_before, 4);
    assert_eq!(store.list("").unwrap().len(), 26);
    assert!(store.list("nothing/").unwrap().is_empty());
    // A listing past its bound stops with an error naming the prefix.
    let bounded = Store::open(
        &config(&s3).with_list_page_keys(7).with_list_objects_max(10),
        "bkt",
    )
    .unwrap();
    let e = bounded.list("p/").unwrap_err();
    assert!(
        matches!(e, StoreError::TooManyObjects { max: 10, .. }),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("s3://bkt/p/: more than 10 objects"),
        "{e}"
    );
}

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Store>();
    send_sync::<StoreConfig>();
    send_sync::<StoreError>();
    send::<lobster_store::StoreSession>();
    send::<StoreCompletion>();
}

#[test]
fn list_dir_gives_one_level_of_prefixes_and_objects() {
    let s3 = server_with(
        "bkt",
        &[
            ("d/b/1", b"1"),
            ("d/a/1", b"1"),
            ("d/a/2", b"2"),
            ("d/y", b"yy"),
            ("d/x", b"x"),
            ("e/z", b"z"),
        ],
    );
    let store = Store::open(&config(&s3).with_list_page_keys(2), "bkt").unwrap();
    let (prefixes, objects) = store.list_dir("d/").unwrap();
    assert_eq!(prefixes, ["d/a/", "d/b/"]);
    let keys: Vec<(&str, u64)> = objects
        .iter()
        .map(|o| (o.key.as_str(), o.size_bytes))
        .collect();
    assert_eq!(keys, [("d/x", 1), ("d/y", 2)]);
    let (top, none) = store.list_dir("").unwrap();
    assert_eq!(top, ["d/", "e/"]);
    assert!(none.is_empty());
}

#[test]
fn head_gives_the_size_and_the_etag_of_the_upload() {
    let s3 = TestS3::start();
    s3.create_bucket("bkt");
    let etag = s3.put("bkt", "k/obj", data(3000, 1));
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let info = store.head("k/obj").unwrap();
    assert_eq!(
        info,
        ObjectInfo {
            key: "k/obj".into(),
            size_bytes: 3000,
            etag: Some(etag)
        }
    );
    assert_eq!(store.stats().head_requests, 1);
    let e = store.head("k/none").unwrap_err();
    assert!(matches!(e, StoreError::NotFound { .. }), "{e:?}");
    assert_eq!(e.to_string(), "s3://bkt/k/none: no such object");
    assert_eq!(store.stats().failed_requests, 1);
}

#[test]
fn a_whole_object_that_grew_or_shrank_is_named() {
    let s3 = server_with("bkt", &[("w", &[7u8; 100])]);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let whole = RangeRead {
        whole_object: true,
        ..RangeRead::new("w", 0, 100, 0)
    };
    assert_eq!(store.get(&whole).unwrap().len(), 100);
    s3.put("bkt", "w", vec![7u8; 101]);
    let e = store.get(&whole).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Grew {
                size_bytes: 100,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("s3://bkt/w: the object is longer than the 100 bytes"),
        "{e}"
    );
    s3.put("bkt", "w", vec![7u8; 90]);
    let e = store.get(&whole).unwrap_err();
    assert!(
        matches!(e, StoreError::Short { got_bytes: 90, .. }),
        "{e:?}"
    );
    // An empty object read whole.
    s3.put("bkt", "empty", Vec::new());
    let empty = RangeRead {
        whole_object: true,
        ..RangeRead::new("empty", 0, 0, 0)
    };
    assert!(store.get(&empty).unwrap().is_empty());
}

#[test]
fn a_range_past_the_end_is_short_naming_object_and_range() {
    let s3 = server_with("bkt", &[("s", &[1u8; 1000])]);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let e = store.get(&RangeRead::new("s", 990, 20, 0)).unwrap_err();
    assert!(
        matches!(e, StoreError::Short { got_bytes: 10, .. }),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "s3://bkt/s bytes 990..1010: got 10 bytes, the object is shorter than its index says"
    );
    let e = store.get(&RangeRead::new("s", 2000, 20, 0)).unwrap_err();
    assert!(matches!(e, StoreError::Short { got_bytes: 0, .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("s3://bkt/s bytes 2000..2020: got 0 bytes"),
        "{e}"
    );
    assert!(!e.is_transient());
}

#[test]
fn an_object_replaced_since_it_was_indexed_is_changed() {
    let s3 = TestS3::start();
    s3.create_bucket("bkt");
    let etag: Arc<str> = Arc::from(s3.put("bkt", "c", data(500, 1)));
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let read = RangeRead {
        if_match: Some(etag.clone()),
        ..RangeRead::new("c", 10, 20, 0)
    };
    assert_eq!(&store.get(&read).unwrap()[..], &data(500, 1)[10..30]);
    s3.put("bkt", "c", data(500, 2));
    let e = store.get(&read).unwrap_err();
    assert!(
        matches!(&e, StoreError::Changed { etag: t, .. } if *t == etag),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("s3://bkt/c bytes 10..30: the object changed"),
        "{e}"
    );
}

#[test]
fn open_names_a_missing_bucket_and_refused_credentials() {
    let s3 = server_with("bkt", &[("x", b"x")]);
    let e = Store::open(&config(&s3), "nobucket").unwrap_err();
    assert!(matches!(e, StoreError::NoSuchBucket { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("s3://nobucket: no such bucket"),
        "{e}"
    );
    let wrong = config(&s3).with_credentials(s3.access_key(), "not-the-secret", None);
    let e = Store::open(&wrong, "bkt").unwrap_err();
    assert!(matches!(e, StoreError::AccessDenied { .. }), "{e:?}");
    assert!(e.to_string().starts_with("s3://bkt: access denied"), "{e}");
    let e = Store::open(&config(&s3), "Bad_Bucket").unwrap_err();
    assert!(matches!(e, StoreError::Url { .. }), "{e:?}");
    let e = Store::open(&config(&s3).with_endpoint("localhost:1"), "bkt").unwrap_err();
    assert!(matches!(e, StoreError::Config { .. }), "{e:?}");
}

#[test]
fn a_missing_key_is_not_found_in_reads_and_sessions() {
    let s3 = server_with("bkt", &[("there", b"0123456789")]);
    let store = Store::open(&config(&s3), "bkt").unwrap();
    let e = store.get(&RangeRead::new("gone", 0, 4, 0)).unwrap_err();
    assert_eq!(e.to_string(), "s3://bkt/gone: no such object");
    let mut session = store.session();
    session.queue(RangeRead::new("there", 2, 3, 1)).unwrap();
    session.queue(RangeRead::new("gone", 0, 4, 2)).unwrap();
    let mut done = Vec::new();
    assert_eq!(
        session
            .wait_timeout(2, Duration::from_secs(60), &mut done)
            .unwrap(),
        2
    );
    done.sort_by_key(|c| c.tag);
    assert_eq!(&done[0].result.as_ref().unwrap()[..], b"234");
    assert!(matches!(done[1].result, Err(StoreError::NotFound { .. })));
}

#[test]
fn store_urls_address_what_the_store_lists() {
    let s3 = server_with("bkt", &[("train/c1/a", b"a"), ("train/c2/b", b"b")]);
    let url = StoreUrl::parse("s3://bkt/train/").unwrap();
    let store = Store::open(&config(&s3), url.bucket()).unwrap();
    let (classes, _) = store.list_dir(url.key()).unwrap();
    assert_eq!(classes, ["train/c1/", "train/c2/"]);
    let a = StoreUrl::parse("s3://bkt/train/c1").unwrap().join("a");
    assert_eq!(
        &store.get(&RangeRead::new(a.key(), 0, 1, 0)).unwrap()[..],
        b"a"
    );
    assert_eq!(
        format!("{store:?}"),
        format!(
            "Store {{ endpoint: Some({:?}), bucket: \"bkt\" }}",
            s3.endpoint()
        )
    );
}

/// Neither the secret nor the token shows in any `Debug` or `Display` of the configuration, the
/// store or an error, real or constructed.
#[test]
fn no_secret_is_ever_printed() {
    const SECRET: &str = "S3CR3T-canary";
    const TOKEN: &str = "T0K3N-canary";
    let s3 = server_with("bkt", &[("k", b"0123456789")]);
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".aws")).unwrap();
    std::fs::write(
        home.path().join(".aws/credentials"),
        format!("[default]\naws_access_key_id = A\naws_secret_access_key = {SECRET}\naws_session_token = {TOKEN}\n"),
    )
    .unwrap();
    let from_files = StoreConfig::from_vars(|_| None, Some(home.path())).unwrap();
    let env = |k: &str| match k {
        "AWS_ACCESS_KEY_ID" => Some("AKIDCANARY".to_string()),
        "AWS_SECRET_ACCESS_KEY" => Some(SECRET.to_string()),
        "AWS_SESSION_TOKEN" => Some(TOKEN.to_string()),
        _ => None,
    };
    let from_env = StoreConfig::from_vars(env, None).unwrap();
    let given = config(&s3).with_credentials(s3.access_key(), SECRET, Some(TOKEN));
    let mut printed = vec![
        format!("{from_files:?}"),
        format!("{from_env:?}"),
        format!("{given:?}"),
    ];

    // Real errors, made with the canary credentials.
    let mut errors = vec![
        Store::open(&given, "bkt").unwrap_err(),
        Store::open(&config(&s3), "nobucket").unwrap_err(),
    ];
    let good = Store::open(&config(&s3), "bkt").unwrap();
    printed.push(format!("{good:?}"));
    for read in [
        RangeRead::new("k", 5, 10, 0),
        RangeRead::new("none", 0, 1, 0),
    ] {
        errors.push(good.get(&read).unwrap_err());
    }
    let short_deadline = given
        .clone()
        .with_request_deadline(Duration::from_millis(300));
    s3.slow_down_next(u64::MAX);
    errors.push(Store::open(&short_deadline, "bkt").unwrap_err());
    s3.slow_down_next(0);
    // Every other variant, constructed.
    let cause = lobster_store::StoreError::Stopped;
    errors.extend([
        StoreUrl::parse("s3://x").unwrap_err(),
        StoreError::Config {
            key: "k".into(),
            reason: "r".into(),
        },
        StoreError::Profile {
            file: "/f".into(),
            line: 1,
            reason: "r".into(),
        },
        StoreError::NotFound {
            url: "s3://b/k".into(),
        },
        StoreError::Changed {
            url: "s3://b/k".into(),
            range: 0..1,
            etag: Arc::from("\"e\""),
        },
        StoreError::Grew {
            url: "s3://b/k".into(),
            size_bytes: 1,
        },
        StoreError::Request {
            url: "s3://b/k".into(),
            range: None,
            status: Some(500),
            cause: Arc::new(cause.clone()),
        },
        StoreError::Start {
            cause: Arc::new(cause),
        },
        StoreError::Stopped,
    ]);
    let kinds: std::collections::HashSet<String> = errors
        .iter()
        .map(|e| {
            format!("{e:?}")
                .split([' ', '{'])
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    for want in [
        "AccessDenied",
        "NoSuchBucket",
        "Short",
        "NotFound",
        "Deadline",
        "Url",
        "Changed",
        "Grew",
    ] {
        assert!(kinds.contains(want), "{want} missing from {kinds:?}");
    }
    for e in &errors {
        printed.push(format!("{e:?}"));
        printed.push(format!("{e}"));
    }
    for p in &printed {
        assert!(!p.contains(SECRET) && !p.contains(TOKEN), "a secret in {p}");
    }
}
