//! The byte-budget buffer pool seen through sessions, every test run against both backends.

use std::sync::{Arc, Mutex};

use lobster_uring::{
    ActiveBackend, Backend, Completion, IoEvent, IoEventKind, OpenOptions, PathRead, ReadError,
    ReadRequest, Reader,
};

mod common;

use common::{backends, builder, make_file, read_one, req, seeded_rng, test_dir, wait_all};
use rand::Rng;

fn memlock_limit_bytes() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit to write into.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) },
        0
    );
    lim.rlim_cur
}

const MAX_READ: usize = 300_000;

/// Many reads of random sizes up to the largest accepted, through a pool far smaller than
/// what they ask for together: a session takes what the pool holds, every byte matches
/// std::fs, and every block comes back and coalesces.
#[test]
fn reads_of_random_sizes_up_to_max_read_bytes_match_std_fs() {
    let dir = test_dir();
    let size = 4 << 20;
    let (path, data) = make_file(dir.path(), "sizes", size, 1);
    for backend in backends() {
        for direct in [false, true] {
            // Four largest blocks (512 KiB each): a few large reads fill it.
            let reader = builder(backend)
                .classes(2, 8)
                .pool_bytes(4 * (512 << 10))
                .max_read_bytes(MAX_READ)
                .build()
                .unwrap();
            let mut session = reader.session().unwrap();
            if backend == Backend::Uring {
                assert_eq!(reader.backend().active, ActiveBackend::Uring);
                if reader.stats().pool_budget_bytes as u64 <= memlock_limit_bytes() {
                    assert!(
                        reader.backend().fixed_buffers && session.fixed_buffers(),
                        "the pool fits RLIMIT_MEMLOCK but is not registered: {:?}",
                        reader.backend()
                    );
                }
            }
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            let total = 400u64;
            let mut rng = seeded_rng(7 + direct as u64);
            let reqs: Vec<ReadRequest> = (0..total)
                .map(|tag| {
                    // With O_DIRECT the read widens to 4 KiB on both ends.
                    let max = if direct { MAX_READ - 8192 } else { MAX_READ };
                    let len = match rng.gen_range(0..4) {
                        0 => max,
                        _ => 1 + rng.gen_range(0..max as u64) as usize,
                    };
                    let offset = rng.gen_range(0..(size - len) as u64);
                    req(
                        file,
                        offset,
                        len,
                        (tag % 2) as usize,
                        offset << 20 | len as u64,
                    )
                })
                .collect();
            let check = |done: &mut Vec<Completion>| {
                for c in done.drain(..) {
                    let (offset, len) = ((c.tag >> 20) as usize, (c.tag & 0xf_ffff) as usize);
                    let bytes = c.result.unwrap();
                    assert!(
                        bytes[..] == data[offset..offset + len],
                        "{backend:?} direct={direct}: bytes differ at {offset}+{len}"
                    );
                }
            };
            // As many as the pool takes at once, the rest after completions give blocks back.
            let mut rest = &reqs[..];
            let mut done = Vec::new();
            let mut pool_full = 0;
            while !rest.is_empty() {
                match session.submit_batch(rest) {
                    Ok(n) => {
                        pool_full += usize::from(n < rest.len());
                        rest = &rest[n..];
                    }
                    Err(ReadError::WouldBlock {
                        bound: "buffer pool",
                    }) => pool_full += 1,
                    Err(e) => panic!("{e}"),
                }
                session.wait(1, &mut done).unwrap();
                check(&mut done);
            }
            wait_all(&mut session, &mut done);
            check(&mut done);
            assert!(
                pool_full > 0,
                "the pool never ran out: the test proves nothing"
            );
            let stats = reader.stats();
            assert_eq!(stats.pool_free_bytes, stats.pool_budget_bytes);
            assert_eq!(stats.pool_largest_free_bytes, 512 << 10);
        }
    }
}

#[test]
fn a_read_over_max_read_bytes_is_refused_naming_the_parameter() {
    let dir = test_dir();
    let (path, _) = make_file(dir.path(), "large", 1 << 20, 2);
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend)
                .max_read_bytes(65536)
                .pool_bytes(65536)
                .build()
                .unwrap();
            let mut session = reader.session().unwrap();
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            let over = req(file, 0, 65537, 0, 0);
            // O_DIRECT widens an unaligned read of exactly the maximum past it.
            let widened = ReadRequest {
                offset: 100,
                len: 65536,
                ..over
            };
            let cases: &[ReadRequest] = if direct { &[over, widened] } else { &[over] };
            for r in cases {
                let by_path = PathRead {
                    path: path.as_path().into(),
                    dir: None,
                    direct,
                    offset: r.offset,
                    len: r.len,
                    to_eof: false,
                    class: 0,
                    tag: 0,
                };
                for err in [
                    session.submit(*r).unwrap_err(),
                    session.submit_batch(&[*r]).unwrap_err(),
                    session.submit_path(by_path.clone()).unwrap_err(),
                    session.queue_path(by_path).unwrap_err(),
                ] {
                    assert!(
                        matches!(
                            &err,
                            ReadError::TooLarge { max_read_bytes: 65536, len, offset, path: p }
                                if *len == r.len && *offset == r.offset && p == &path
                        ),
                        "{err:?}"
                    );
                    assert!(err.to_string().contains("max_read_bytes = 65536"), "{err}");
                }
            }
            assert_eq!(session.pending(), 0);
            assert_eq!(read_one(&mut session, file, 0, 65536).unwrap().len(), 65536);
        }
    }
}

/// A session with reads pending takes no more than the pool holds: the rest is refused, and
/// goes in once the bytes holding the blocks (every clone of them) are dropped.
#[test]
fn a_session_refuses_what_the_pool_cannot_hold_until_bytes_drop() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "pool", 1 << 20, 10);
    for backend in backends() {
        let reader = builder(backend)
            .classes(2, 2)
            .pool_bytes(3 * 4096)
            .max_read_bytes(4096)
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let mut session = reader.session().unwrap();
        let read = |tag: u64| req(file, tag * 100, 4096, (tag % 2) as usize, tag);
        let mut reqs: Vec<ReadRequest> = (0..5).map(read).collect();
        // Every request is checked before any is queued.
        reqs[3].class = 2;
        assert!(matches!(
            session.submit_batch(&reqs),
            Err(ReadError::InvalidClass { class: 2, .. })
        ));
        assert_eq!(
            session.pending(),
            0,
            "nothing of a refused batch was queued"
        );
        assert_eq!(reader.stats().pool_free_bytes, 3 * 4096);
        reqs[3].class = 1;
        // Three blocks: three of the five go in.
        assert_eq!(session.submit_batch(&reqs).unwrap(), 3, "{backend:?}");
        let mut done = Vec::new();
        wait_all(&mut session, &mut done);
        let mut held: Vec<_> = done.drain(..).map(|c| c.result.unwrap()).collect();
        // A read paused behind its class's depth keeps one block and the session busy.
        reader.set_io_depth(1, 0).unwrap();
        drop(held.pop());
        session.submit(reqs[3]).unwrap();
        assert!(
            matches!(
                session.submit(reqs[4]),
                Err(ReadError::WouldBlock {
                    bound: "buffer pool"
                })
            ),
            "{backend:?}"
        );
        let clone = held[0].clone();
        held.remove(0);
        assert!(
            matches!(session.submit(reqs[4]), Err(ReadError::WouldBlock { .. })),
            "a clone still holds it"
        );
        drop(clone);
        session.submit(reqs[4]).unwrap();
        assert_eq!(session.pending(), 2);
        reader.set_io_depth(1, 2).unwrap();
        wait_all(&mut session, &mut done);
        done.sort_by_key(|c| c.tag);
        assert_eq!(&done[0].result.as_ref().unwrap()[..], &data[300..4396]);
        assert_eq!(&done[1].result.as_ref().unwrap()[..], &data[400..4496]);
        drop((held, done));
        let stats = reader.stats();
        assert_eq!(stats.pool_free_bytes, stats.pool_budget_bytes);
    }
}

#[test]
fn pool_bytes_out_of_range_is_refused_naming_the_parameter_and_range() {
    for (pool, max_read) in [(65535, 65536), (4096, 4097), (65 << 30, 1 << 20)] {
        let err = Reader::builder()
            .pool_bytes(pool)
            .max_read_bytes(max_read)
            .build()
            .unwrap_err();
        match &err {
            ReadError::InvalidConfig { parameter, reason } => {
                assert_eq!(*parameter, "pool_bytes");
                let block = max_read.div_ceil(4096).next_power_of_two() * 4096;
                assert!(reason.contains(&format!("{block}..=")), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    let err = Reader::builder()
        .max_read_bytes((1 << 30) + 1)
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        ReadError::InvalidConfig {
            parameter: "max_read_bytes",
            ..
        }
    ));
}

/// Waits until `n` sessions wait for pool memory.
fn wait_for_pool_waiters(reader: &Reader, n: usize) {
    while reader.stats().pool_waiters < n {
        std::thread::yield_now();
    }
}

/// A large read waiting for memory is served before small reads asked for after it, even
/// though small blocks are free all along.
#[test]
fn a_large_read_is_served_before_later_small_ones() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "fair", 1 << 20, 3);
    for backend in backends() {
        let issued = Arc::new(Mutex::new(Vec::new()));
        let log = issued.clone();
        // Two largest blocks of 64 KiB; class 1 paused, to keep a read pending.
        let reader = builder(backend)
            .classes(2, 1)
            .pool_bytes(2 * 65536)
            .max_read_bytes(65536)
            .observer(move |e: IoEvent| {
                if e.kind == IoEventKind::Issued {
                    log.lock().unwrap().push(e.tag);
                }
            })
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let mut session = reader.session().unwrap();
        // One small block in each half, so no 64 KiB block is free.
        let low = read_one(&mut session, file, 0, 4096).unwrap();
        let fill: Vec<_> = [4096, 8192, 16384, 32768]
            .into_iter()
            .map(|len| read_one(&mut session, file, 0, len).unwrap())
            .collect();
        let high = read_one(&mut session, file, 0, 4096).unwrap();
        // Beside `high`: the session keeps a read pending (and its block) from here on.
        reader.set_io_depth(1, 0).unwrap();
        session.submit(req(file, 0, 4096, 1, 20)).unwrap();
        drop(fill);
        let stats = reader.stats();
        assert!(stats.pool_largest_free_bytes < 65536 && stats.pool_free_bytes >= 4096);

        std::thread::scope(|scope| {
            // Sessions with nothing pending wait for memory, in the order they ask.
            let one_read = |tag: u64, len: usize| {
                let reader = &reader;
                scope.spawn(move || {
                    let mut session = reader.session().unwrap();
                    session.submit(req(file, 0, len, 0, tag)).unwrap();
                    let mut done = Vec::new();
                    session.wait(1, &mut done).unwrap();
                    done.pop().unwrap().result.unwrap()
                })
            };
            let big = one_read(10, 65536);
            wait_for_pool_waiters(&reader, 1);
            let small = one_read(11, 4096);
            wait_for_pool_waiters(&reader, 2);
            // A small block is free, yet the small reads wait behind the large one.
            assert!(reader.stats().pool_free_bytes >= 4096);
            assert!(
                matches!(
                    session.submit(req(file, 0, 4096, 0, 12)),
                    Err(ReadError::WouldBlock {
                        bound: "buffer pool"
                    })
                ),
                "{backend:?}: a session with reads pending must not jump the queue"
            );
            assert_eq!(
                reader.stats().classes[0].completed,
                6,
                "{backend:?}: the small read went ahead of the large one"
            );
            drop(low);
            assert_eq!(&big.join().unwrap()[..], &data[..65536]);
            assert_eq!(&small.join().unwrap()[..], &data[..4096]);
        });
        let mut issued = issued.lock().unwrap().clone();
        issued[6..].sort_unstable();
        assert_eq!(issued, [9, 9, 9, 9, 9, 9, 10, 11]);
        drop(high);
        reader.set_io_depth(1, 1).unwrap();
        let mut done = Vec::new();
        wait_all(&mut session, &mut done);
        drop(done);
        let stats = reader.stats();
        assert_eq!(stats.pool_free_bytes, stats.pool_budget_bytes);
        assert_eq!(stats.pool_largest_free_bytes, 65536, "coalesced");
        assert_eq!(stats.pool_waiters, 0);
    }
}
