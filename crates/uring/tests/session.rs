//! Caller-driven sessions, every test run against both backends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use lobster_uring::{
    ActiveBackend, Backend, Completion, FileId, OpenOptions, ReadError, ReadRequest, ReaderBuilder,
};

mod common;

use common::{
    backends, check, make_file, random_range, seeded_rng, test_dir, truncate, DepthWatch, StdRng,
};
use rand::Rng;

fn builder(backend: Backend) -> ReaderBuilder {
    common::builder(backend).pread_threads(4)
}

fn req(file: FileId, offset: u64, len: usize, class: usize, tag: u64) -> ReadRequest {
    ReadRequest {
        file,
        offset,
        len,
        class,
        tag,
    }
}

#[test]
fn sessions_on_several_threads_read_the_same_bytes_as_std_fs() {
    let dir = test_dir();
    let size = (6 << 20) + 321;
    let (path, data) = make_file(dir.path(), "data", size, 1);
    for backend in backends() {
        // rings 0: an io_uring reader without engine threads, serving sessions only.
        for (direct, rings) in [(false, 0), (true, 0), (false, 1), (true, 1)] {
            let reader = builder(backend)
                .rings(rings)
                .classes(2, 3)
                .ring_entries(4)
                .pool_bytes(16 << 22)
                .max_read_bytes(3 << 20)
                .build()
                .unwrap();
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            std::thread::scope(|scope| {
                for thread in 0..2u64 {
                    let (reader, data) = (&reader, &data);
                    scope.spawn(move || {
                        let mut session = reader.session().unwrap();
                        if backend == Backend::Pread {
                            assert!(!session.fixed_buffers());
                        }
                        let mut rng = seeded_rng(10 + thread + 2 * direct as u64);
                        let mut expected = HashMap::new();
                        let mut done: Vec<Completion> = Vec::new();
                        let total = 120;
                        let mut received = 0;
                        for tag in 0..total {
                            let (offset, len) = random_range(&mut rng, size);
                            expected.insert(tag, (offset, len));
                            let class = (tag % 2) as usize;
                            let queued = session
                                .submit_batch(&[req(file, offset, len, class, tag)])
                                .unwrap();
                            assert_eq!(queued, 1);
                            while session.pending() > 6 {
                                session.wait(1, &mut done).unwrap();
                                for c in done.drain(..) {
                                    check(&c, &expected, data, 2, backend, direct);
                                    received += 1;
                                }
                            }
                        }
                        while session.pending() > 0 {
                            session.wait(session.pending(), &mut done).unwrap();
                            for c in done.drain(..) {
                                check(&c, &expected, data, 2, backend, direct);
                                received += 1;
                            }
                        }
                        assert_eq!(received, total);
                    });
                }
            });
            let stats = reader.stats();
            assert_eq!(stats.classes.iter().map(|c| c.completed).sum::<u64>(), 240);
            assert!(stats.classes.iter().all(|c| c.in_flight == 0));
            assert_eq!(
                stats.pool_free_bytes, stats.pool_budget_bytes,
                "every buffer came back"
            );
        }
    }
}

/// Reads one range through `session`, waiting for it.
fn read_one(
    session: &mut lobster_uring::Session,
    file: FileId,
    offset: u64,
    len: usize,
) -> Result<lobster_uring::Bytes, ReadError> {
    session.submit(req(file, offset, len, 0, 9))?;
    let mut done = Vec::new();
    session.wait(1, &mut done)?;
    assert_eq!(done.len(), 1);
    let c = done.pop().unwrap();
    assert_eq!(c.tag, 9);
    c.result
}

#[test]
fn in_flight_reads_of_sessions_and_engines_together_never_exceed_io_depth() {
    const CLASSES: usize = 3;
    const LEN: usize = 64 << 10;
    let dir = test_dir();
    let size = 32 << 20;
    let (path, data) = make_file(dir.path(), "depth", size, 4);
    for backend in backends() {
        let watch = DepthWatch::new(CLASSES, 4);
        let reader = builder(backend)
            .rings(1)
            .classes(CLASSES, 4)
            .pread_threads(8)
            .pool_bytes(96 * LEN)
            .max_read_bytes(LEN)
            .observer(watch.observer())
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions { direct: true }).unwrap();
        let total: u64 = 900;
        let offset_of = |rng: &mut StdRng| rng.gen_range(0..(size / 4096 - 16) as u64) * 4096;
        let finished = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            // The reader's engine (or pread pool), fed by one thread, drained by another.
            let rx = reader.completions();
            let data = &data;
            let mut threads = Vec::new();
            threads.push(scope.spawn(move || {
                for _ in 0..total {
                    let c = rx.recv().unwrap();
                    let offset = (c.tag >> 8) as usize;
                    assert_eq!(&c.result.unwrap()[..], &data[offset..offset + LEN]);
                }
            }));
            let (reader, finished) = (&reader, &finished);
            threads.push(scope.spawn(move || {
                let mut rng = seeded_rng(6);
                for i in 0..total {
                    let offset = offset_of(&mut rng);
                    let class = (i % CLASSES as u64) as usize;
                    reader
                        .submit(req(file, offset, LEN, class, offset << 8 | i & 0xff))
                        .unwrap();
                }
                finished.fetch_add(1, Ordering::SeqCst);
            }));
            // Two sessions on the same classes.
            for thread in 0..2u64 {
                threads.push(scope.spawn(move || {
                    let mut session = reader.session().unwrap();
                    let mut rng = seeded_rng(20 + thread);
                    let mut done = Vec::new();
                    for i in 0..total {
                        let offset = offset_of(&mut rng);
                        let class = (i % CLASSES as u64) as usize;
                        let read = req(file, offset, LEN, class, offset << 8);
                        // The other submitter may hold the pool: wait for ours, then retry.
                        while let Err(e) = session.submit(read) {
                            assert!(matches!(e, ReadError::WouldBlock { .. }), "{e}");
                            session.wait(1, &mut done).unwrap();
                            done.clear();
                        }
                        while session.pending() >= 12 {
                            session.wait(1, &mut done).unwrap();
                            for c in done.drain(..) {
                                let offset = (c.tag >> 8) as usize;
                                assert_eq!(&c.result.unwrap()[..], &data[offset..offset + LEN]);
                            }
                        }
                    }
                    while session.pending() > 0 {
                        session.wait(1, &mut done).unwrap();
                        for c in done.drain(..) {
                            let offset = (c.tag >> 8) as usize;
                            assert_eq!(&c.result.unwrap()[..], &data[offset..offset + LEN]);
                        }
                    }
                    finished.fetch_add(1, Ordering::SeqCst);
                }));
            }
            let mut rng = seeded_rng(7);
            // Until the submitters are done (or one failed: the scope then reports it).
            loop {
                let done = finished.load(Ordering::SeqCst);
                let ended = threads[1..].iter().filter(|t| t.is_finished()).count();
                if done == 3 || ended > done {
                    break;
                }
                let class = rng.gen_range(0..CLASSES as u64) as usize;
                let new = 1 + rng.gen_range(0..12) as usize;
                watch.set_io_depth(reader, class, new);
                std::thread::yield_now();
            }
        });
        watch.assert_held(backend);
        let stats = reader.stats();
        assert_eq!(
            stats.classes.iter().map(|c| c.completed).sum::<u64>(),
            3 * total
        );
        for (class, s) in stats.classes.iter().enumerate() {
            assert_eq!(s.in_flight, 0);
            assert_eq!(watch.in_flight(class), 0);
        }
        assert_eq!(stats.pool_free_bytes, stats.pool_budget_bytes);
    }
}

#[test]
fn a_session_reports_errors_with_path_and_offset_and_keeps_serving() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "err", 3 << 20, 3);
    let (shrinks, _) = make_file(dir.path(), "shrinks", 1 << 20, 5);
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend).rings(0).build().unwrap();
            let mut session = reader.session().unwrap();
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            let err = read_one(&mut session, file, (3 << 20) - 100, 4096).unwrap_err();
            match &err {
                ReadError::UnexpectedEof {
                    path: p,
                    offset,
                    len,
                    file_end,
                } => {
                    assert_eq!(p, &path);
                    assert_eq!((*offset, *len, *file_end), ((3 << 20) - 100, 4096, 3 << 20));
                }
                other => panic!("{backend:?} direct={direct}: {other:?}"),
            }
            let small = reader.open(&shrinks, OpenOptions { direct }).unwrap();
            truncate(&shrinks, 4096);
            let err = read_one(&mut session, small, 8192, 4096).unwrap_err();
            assert!(
                matches!(err, ReadError::UnexpectedEof { file_end: 4096, .. }),
                "{backend:?} direct={direct}: {err:?}"
            );
            assert!(err.to_string().contains("shrinks"), "{err}");
            let bytes = read_one(&mut session, file, 12_345, 100_000).unwrap();
            assert_eq!(&bytes[..], &data[12_345..112_345]);
            let stray = reader.open(dir.path(), OpenOptions { direct });
            assert!(matches!(stray, Err(ReadError::Open { .. })));
        }
    }
}

#[test]
fn a_paused_class_holds_a_session_read_until_its_depth_is_raised() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "pause", 1 << 20, 6);
    for backend in backends() {
        let reader = builder(backend).classes(2, 0).build().unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let mut session = reader.session().unwrap();
        session.submit(req(file, 100, 1000, 1, 1)).unwrap();
        let mut done = Vec::new();
        assert_eq!(session.poll(&mut done).unwrap(), 0, "{backend:?}");
        let stats = reader.stats();
        assert_eq!(stats.classes[1].in_flight, 0);
        assert_eq!(session.pending(), 1);
        std::thread::scope(|scope| {
            let reader = &reader;
            scope.spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                reader.set_io_depth(1, 1).unwrap();
            });
            // Sleeps until the other thread raises the depth.
            assert_eq!(session.wait(1, &mut done).unwrap(), 1);
        });
        assert_eq!(&done[0].result.as_ref().unwrap()[..], &data[100..1100]);
        assert_eq!(reader.stats().classes[1].peak_in_flight, 1);
    }
}

#[test]
fn dropping_a_session_with_reads_in_flight_returns_every_buffer_and_depth() {
    let dir = test_dir();
    let size = 16 << 20;
    let (path, _) = make_file(dir.path(), "drop", size, 8);
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend)
                .rings(0)
                .classes(2, 8)
                .pool_bytes(64 << 18)
                .max_read_bytes(256 << 10)
                .build()
                .unwrap();
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            let mut session = reader.session().unwrap();
            let mut rng = seeded_rng(9);
            let reqs: Vec<ReadRequest> = (0..40u64)
                .map(|tag| {
                    let offset = rng.gen_range(0..(size - (256 << 10)) as u64);
                    let len = 1 + rng.gen_range(0..200_000) as usize;
                    req(file, offset, len, (tag % 2) as usize, tag)
                })
                .collect();
            // 16 go to the kernel, the rest stay queued behind the io_depth.
            assert_eq!(session.submit_batch(&reqs).unwrap(), 40);
            drop(session);
            let stats = reader.stats();
            assert!(
                stats.classes.iter().all(|c| c.in_flight == 0),
                "{backend:?}: {stats:?}"
            );
            assert_eq!(
                stats.pool_free_bytes, stats.pool_budget_bytes,
                "{backend:?}"
            );
        }
    }
}

#[test]
fn a_reader_with_no_rings_refuses_submit_and_serves_sessions() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "norings", 1 << 20, 11);
    for backend in backends() {
        let reader = builder(backend).rings(0).build().unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let submitted = reader.submit(req(file, 0, 10, 0, 0));
        if reader.backend().active == ActiveBackend::Uring {
            assert_eq!(reader.backend().threads, 0);
            assert!(matches!(
                submitted,
                Err(ReadError::InvalidConfig {
                    parameter: "rings",
                    ..
                })
            ));
        } else {
            // The pread pool serves submit whatever the rings.
            submitted.unwrap();
            assert!(reader.completions().recv().unwrap().result.is_ok());
        }
        let mut session = reader.session().unwrap();
        assert_eq!(
            &read_one(&mut session, file, 5, 50).unwrap()[..],
            &data[5..55]
        );
    }
}

#[test]
fn a_session_refuses_what_the_pool_cannot_hold_while_it_has_reads_pending() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "pool", 1 << 20, 12);
    for backend in backends() {
        let reader = builder(backend)
            .rings(0)
            .pool_bytes(2 * 4096)
            .max_read_bytes(4096)
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let mut session = reader.session().unwrap();
        let reqs: Vec<ReadRequest> = (0..3).map(|i| req(file, i * 4096, 4096, 0, i)).collect();
        assert_eq!(session.submit_batch(&reqs).unwrap(), 2, "{backend:?}");
        assert!(matches!(
            session.submit(reqs[2]),
            Err(ReadError::WouldBlock {
                bound: "buffer pool"
            })
        ));
        let mut done = Vec::new();
        session.wait(2, &mut done).unwrap();
        assert_eq!(done.len(), 2);
        // The completions hold both buffers; dropping them lets the next read in.
        done.clear();
        assert_eq!(
            read_one(&mut session, file, 8192, 4096).unwrap()[..],
            data[8192..12288]
        );
    }
}

#[test]
fn a_timed_wait_returns_the_reads_done_and_at_once_with_nothing_pending() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "timed", 1 << 20, 9);
    for backend in backends() {
        let reader = builder(backend).rings(0).classes(1, 8).build().unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let mut session = reader.session().unwrap();
        let mut out = Vec::new();
        // Nothing pending: nothing to wait for, however long the timeout.
        assert_eq!(
            session
                .wait_timeout(1, std::time::Duration::from_secs(30), &mut out)
                .unwrap(),
            0
        );
        for tag in 0..8u64 {
            session
                .submit(req(file, tag << 16, 1 << 16, 0, tag))
                .unwrap();
        }
        while out.len() < 8 {
            session
                .wait_timeout(
                    8 - out.len(),
                    std::time::Duration::from_millis(50),
                    &mut out,
                )
                .unwrap();
        }
        for c in &out {
            let at = (c.tag << 16) as usize;
            assert_eq!(&c.result.as_ref().unwrap()[..], &data[at..at + (1 << 16)]);
        }
        assert_eq!(session.pending(), 0, "{backend:?}");
    }
}
