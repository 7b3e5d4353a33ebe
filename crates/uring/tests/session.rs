//! Caller-driven sessions, every test run against both backends: several at once on the
//! classes' shared limits, waits, pauses and drops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use lobster_uring::{
    Backend, Completion, OpenOptions, PathRead, ReadError, ReadRequest, ReaderBuilder,
};

mod common;

use common::{
    backends, check, make_file, random_range, req, seeded_rng, test_dir, wait_all, DepthWatch,
    StdRng,
};
use rand::Rng;

fn builder(backend: Backend) -> ReaderBuilder {
    common::builder(backend).pread_threads(4)
}

#[test]
fn sessions_on_several_threads_read_the_same_bytes_as_std_fs() {
    let dir = test_dir();
    let size = (6 << 20) + 321;
    let (path, data) = make_file(dir.path(), "data", size, 1);
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend)
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

#[test]
fn in_flight_reads_of_several_sessions_never_exceed_io_depth_while_it_changes() {
    const CLASSES: usize = 3;
    const SESSIONS: usize = 3;
    const LEN: usize = 64 << 10;
    let dir = test_dir();
    let size = 32 << 20;
    let (path, data) = make_file(dir.path(), "depth", size, 4);
    for backend in backends() {
        let watch = DepthWatch::new(CLASSES, 4);
        let reader = builder(backend)
            .classes(CLASSES, 4)
            .pread_threads(8)
            .pool_bytes(96 * LEN)
            .max_read_bytes(LEN)
            .observer(watch.observer())
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions { direct: true }).unwrap();
        let total: u64 = 600;
        let offset_of = |rng: &mut StdRng| rng.gen_range(0..(size / 4096 - 16) as u64) * 4096;
        let finished = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let (reader, finished, data) = (&reader, &finished, &data);
            let mut threads = Vec::new();
            // Sessions on the same classes, each with more reads pending than a class allows.
            for thread in 0..SESSIONS as u64 {
                threads.push(scope.spawn(move || {
                    let mut session = reader.session().unwrap();
                    let mut rng = seeded_rng(20 + thread);
                    let mut done = Vec::new();
                    let check = |done: &mut Vec<Completion>| {
                        for c in done.drain(..) {
                            let offset = (c.tag >> 8) as usize;
                            assert_eq!(&c.result.unwrap()[..], &data[offset..offset + LEN]);
                        }
                    };
                    for i in 0..total {
                        let offset = offset_of(&mut rng);
                        let class = (i % CLASSES as u64) as usize;
                        let read = req(file, offset, LEN, class, offset << 8);
                        // The other sessions may hold the pool: wait for ours, then retry.
                        while let Err(e) = session.submit(read) {
                            assert!(matches!(e, ReadError::WouldBlock { .. }), "{e}");
                            session.wait(1, &mut done).unwrap();
                            check(&mut done);
                        }
                        while session.pending() >= 12 {
                            session.wait(1, &mut done).unwrap();
                            check(&mut done);
                        }
                    }
                    wait_all(&mut session, &mut done);
                    check(&mut done);
                    finished.fetch_add(1, Ordering::SeqCst);
                }));
            }
            let mut rng = seeded_rng(7);
            // Until the sessions are done (or one failed: the scope then reports it).
            loop {
                let done = finished.load(Ordering::SeqCst);
                let ended = threads.iter().filter(|t| t.is_finished()).count();
                if done == SESSIONS || ended > done {
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
            SESSIONS as u64 * total
        );
        for (class, s) in stats.classes.iter().enumerate() {
            assert_eq!(s.in_flight, 0);
            assert_eq!(watch.in_flight(class), 0);
            assert!(s.peak_in_flight <= 12, "{s:?}");
        }
        assert_eq!(stats.pool_free_bytes, stats.pool_budget_bytes);
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
    let (path, data) = make_file(dir.path(), "drop", size, 8);
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend)
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
            // Two done and kept: their bytes outlive the session and the reader.
            assert_eq!(session.submit_batch(&reqs[..2]).unwrap(), 2);
            let mut kept = Vec::new();
            wait_all(&mut session, &mut kept);
            // 16 go to the kernel (or the workers), the rest stay queued behind the io_depth.
            assert_eq!(session.submit_batch(&reqs[2..]).unwrap(), 38);
            assert_eq!(session.pending(), 38);
            drop(session);
            let stats = reader.stats();
            assert!(
                stats.classes.iter().all(|c| c.in_flight == 0),
                "{backend:?}: {stats:?}"
            );
            // Every block is back but those of the bytes kept (reads widened to 4 KiB with
            // O_DIRECT).
            let align = if direct { 4096 } else { 1 };
            let held: usize = kept
                .iter()
                .map(|c| {
                    let read = reqs[c.tag as usize];
                    let start = read.offset / align * align;
                    let end = (read.offset + read.len as u64).div_ceil(align) * align;
                    lobster_uring::block_bytes((end - start) as usize)
                })
                .sum();
            assert_eq!(
                stats.pool_budget_bytes - stats.pool_free_bytes,
                held,
                "{backend:?} direct={direct}"
            );
            drop(reader);
            for c in kept {
                let read = reqs[c.tag as usize];
                let at = read.offset as usize;
                assert_eq!(&c.result.unwrap()[..], &data[at..at + read.len]);
            }
        }
    }
}

#[test]
fn a_timed_wait_returns_the_reads_done_and_at_once_with_nothing_pending() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "timed", 1 << 20, 9);
    for backend in backends() {
        let reader = builder(backend).classes(1, 8).build().unwrap();
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

/// The fallback's own check that its workers run a session's reads side by side: reads by
/// path of FIFOs, whose opens block until a writer comes, are all at the workers at once
/// (each FIFO finds its reader) while no more than the class's io_depth are.
#[test]
fn the_pread_workers_serve_a_sessions_reads_at_once_up_to_its_io_depth() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    const DEPTH: usize = 3;
    let dir = test_dir();
    let fifos: Vec<PathBuf> = (0..2 * DEPTH)
        .map(|i| {
            let path = dir.path().join(format!("fifo{i}"));
            let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path that outlives the call.
            assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
            path
        })
        .collect();
    // A writer that does not wait for a reader (O_RDWR), and one that exists only once a
    // reader has the FIFO open (O_WRONLY | O_NONBLOCK, else ENXIO).
    let open_fifo = |path: &PathBuf, read: bool| {
        std::fs::OpenOptions::new()
            .read(read)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
    };
    let watch = DepthWatch::new(1, DEPTH);
    let reader = builder(Backend::Pread)
        .pread_threads(2 * DEPTH)
        .classes(1, DEPTH)
        .observer(watch.observer())
        .build()
        .unwrap();
    let mut session = reader.session().unwrap();
    // Dropped before the session, whose drop waits for its reads: every FIFO gets a writer,
    // so no open is left waiting should an assertion fail.
    struct Unblock<'a>(&'a [PathBuf], Vec<std::fs::File>);
    impl Drop for Unblock<'_> {
        fn drop(&mut self) {
            for path in self.0 {
                let writer = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(path);
                self.1.extend(writer);
            }
        }
    }
    let _unblock = Unblock(&fifos, Vec::new());
    let reads: Vec<PathRead> = fifos
        .iter()
        .enumerate()
        .map(|(tag, path)| PathRead {
            path: path.as_path().into(),
            dir: None,
            direct: false,
            offset: 0,
            len: 10,
            to_eof: false,
            class: 0,
            tag: tag as u64,
        })
        .collect();
    assert_eq!(session.submit_path_batch(&reads).unwrap(), reads.len());
    // The first DEPTH went to the workers. Last first: workers taking them one after
    // another would open the last FIFO only once the earlier ones had writers, so it finds
    // its reader only if every one of them is at a worker at the same time.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut writers = Vec::new();
    for path in fifos[..DEPTH].iter().rev() {
        loop {
            match open_fifo(path, false) {
                Ok(w) => break writers.push(w),
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                    assert!(
                        Instant::now() < deadline,
                        "the reads do not run side by side"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    // The rest wait in the session, behind the io_depth: no reader yet.
    assert!(
        matches!(open_fifo(&fifos[DEPTH], false), Err(e) if e.raw_os_error() == Some(libc::ENXIO)),
        "a read started over the io_depth"
    );
    for path in &fifos[DEPTH..] {
        writers.push(open_fifo(path, true).unwrap());
    }
    let mut done = Vec::new();
    wait_all(&mut session, &mut done);
    assert_eq!(done.len(), fifos.len());
    // A FIFO cannot be read at an offset: each read fails naming its path.
    for c in &done {
        match &c.result {
            Err(ReadError::Read { path, source, .. }) => {
                assert_eq!(path, &fifos[c.tag as usize]);
                assert_eq!(source.raw_os_error(), Some(libc::ESPIPE));
            }
            other => panic!("{other:?}"),
        }
    }
    watch.assert_held(Backend::Pread);
}
