//! What a reader gives every session, every test run against both backends: the bytes of
//! its open files, errors naming path, offset and OS error, the checks at submission, and
//! the choice of backend.

use std::collections::HashMap;

use lobster_uring::{ActiveBackend, Backend, OpenOptions, ReadError, ReadRequest, Reader};

mod common;

use common::{
    backends, builder, check, make_file, random_range, read_one, req, seeded_rng, test_dir,
    truncate, wait_all,
};

#[test]
fn random_ranges_match_std_fs_on_both_backends() {
    let dir = test_dir();
    let size = (6 << 20) + 123;
    let (path, data) = make_file(dir.path(), "data", size, 1);
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend)
                .classes(3, 4)
                .pool_bytes(12 << 20)
                .max_read_bytes(3 << 20)
                .build()
                .unwrap();
            assert_eq!(
                reader.backend().active,
                if backend == Backend::Uring {
                    ActiveBackend::Uring
                } else {
                    ActiveBackend::Pread
                }
            );
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            let mut session = reader.session().unwrap();
            let mut rng = seeded_rng(99 + direct as u64);
            let mut expected: HashMap<u64, (u64, usize)> = HashMap::new();
            let total = 300;
            let mut done = Vec::new();
            let mut received = 0;
            for tag in 0..total {
                let (offset, len) = random_range(&mut rng, size);
                expected.insert(tag, (offset, len));
                let class = (tag % 3) as usize;
                // Eight reads of up to 2.5 MB can outgrow the 12 MiB pool, and how its
                // blocks merge depends on the order reads complete: on a full pool, reap
                // one, drop it (its block returns) and retry, as `submit` documents.
                let read = req(file, offset, len, class, tag);
                while let Err(e) = session.submit(read) {
                    assert!(matches!(e, ReadError::WouldBlock { .. }), "{e}");
                    session.wait(1, &mut done).unwrap();
                    for c in done.drain(..) {
                        check(&c, &expected, &data, 3, backend, direct);
                        received += 1;
                    }
                }
                while session.pending() >= 8 {
                    session.wait(1, &mut done).unwrap();
                }
                for c in done.drain(..) {
                    check(&c, &expected, &data, 3, backend, direct);
                    received += 1;
                }
            }
            wait_all(&mut session, &mut done);
            for c in done.drain(..) {
                check(&c, &expected, &data, 3, backend, direct);
                received += 1;
            }
            assert_eq!(received, total);
            let stats = reader.stats();
            assert_eq!(
                stats.classes.iter().map(|c| c.completed).sum::<u64>(),
                total
            );
            assert_eq!(
                stats.pool_free_bytes, stats.pool_budget_bytes,
                "every block came back"
            );
            assert_eq!(stats.pool_largest_free_bytes, 4 << 20, "and coalesced");
        }
    }
}

#[test]
fn errors_name_path_offset_and_os_error_and_the_reader_keeps_serving() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "ten-thousand", 10_000, 2);
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend).max_read_bytes(64 << 10).build().unwrap();
            let mut session = reader.session().unwrap();
            let opts = OpenOptions { direct };

            let missing = dir.path().join("missing");
            let err = reader.open(&missing, opts).unwrap_err();
            assert!(
                matches!(&err, ReadError::Open { path, .. } if path == &missing),
                "{err:?}"
            );
            assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
            assert!(err.to_string().contains("missing"), "{err}");

            let err = reader.open(dir.path(), opts).unwrap_err();
            assert!(
                matches!(&err, ReadError::Open { path, .. } if path == dir.path()),
                "{err:?}"
            );
            assert_eq!(err.raw_os_error(), Some(libc::EISDIR));

            let file = reader.open(&path, opts).unwrap();
            for (offset, len) in [(9_000u64, 2_000usize), (20_000, 10)] {
                let err = read_one(&mut session, file, offset, len).unwrap_err();
                match &err {
                    ReadError::UnexpectedEof {
                        path: p,
                        offset: o,
                        len: l,
                        file_end,
                    } => {
                        assert_eq!((p, *o, *l, *file_end), (&path, offset, len, 10_000));
                    }
                    other => panic!("{backend:?} direct={direct}: {other:?}"),
                }
                let msg = err.to_string();
                assert!(
                    msg.contains(&offset.to_string()) && msg.contains("ten-thousand"),
                    "{msg}"
                );
            }

            // Unknown class, too large: refused at submission, nothing queued.
            assert!(matches!(
                session.submit(req(file, 0, 10, 5, 1)),
                Err(ReadError::InvalidClass {
                    class: 5,
                    classes: 1
                })
            ));
            assert!(matches!(
                session.submit(req(file, 0, 1 << 20, 0, 1)),
                Err(ReadError::TooLarge { .. })
            ));
            assert_eq!(session.pending(), 0);

            // The session still serves good reads after all that.
            let ok = read_one(&mut session, file, 1234, 5000).unwrap();
            assert_eq!(&ok[..], &data[1234..6234]);
            assert_eq!(read_one(&mut session, file, 100, 0).unwrap().len(), 0);

            reader.close(file).unwrap();
            assert!(matches!(
                session.submit(req(file, 0, 10, 0, 1)),
                Err(ReadError::UnknownFile { .. })
            ));
            assert!(matches!(
                reader.close(file),
                Err(ReadError::UnknownFile { .. })
            ));
        }
    }
}

#[test]
fn a_file_truncated_after_open_gives_unexpected_eof() {
    let dir = test_dir();
    for backend in backends() {
        for direct in [false, true] {
            let (path, data) = make_file(dir.path(), "shrinks", 64 << 10, 3);
            let reader = builder(backend).max_read_bytes(64 << 10).build().unwrap();
            let mut session = reader.session().unwrap();
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            assert_eq!(
                &read_one(&mut session, file, 8192, 4096).unwrap()[..],
                &data[8192..12288]
            );
            truncate(&path, 5000);
            let err = read_one(&mut session, file, 4096, 4096).unwrap_err();
            assert!(
                matches!(
                    &err,
                    ReadError::UnexpectedEof {
                        offset: 4096,
                        len: 4096,
                        file_end: 5000,
                        ..
                    }
                ),
                "{backend:?} direct={direct}: {err:?}"
            );
            assert!(err.to_string().contains("shrinks"));
            assert_eq!(
                &read_one(&mut session, file, 0, 4096).unwrap()[..],
                &data[..4096]
            );
        }
    }
}

#[test]
fn a_full_class_queue_refuses_more_and_depth_0_pauses_the_class() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "queue", 1 << 16, 11);
    for backend in backends() {
        let reader = builder(backend)
            .classes(1, 0)
            .queue_capacity(2)
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let mut session = reader.session().unwrap();
        let reqs: Vec<ReadRequest> = (0..3).map(|tag| req(file, tag * 10, 100, 0, tag)).collect();
        assert_eq!(session.submit_batch(&reqs).unwrap(), 2, "{backend:?}");
        assert!(matches!(
            session.submit(reqs[2]),
            Err(ReadError::WouldBlock {
                bound: "class queue"
            })
        ));
        let mut done = Vec::new();
        assert_eq!(
            session.poll(&mut done).unwrap(),
            0,
            "depth 0 pauses the class"
        );
        assert_eq!(session.pending(), 2);
        assert_eq!(reader.stats().classes[0].in_flight, 0);
        reader.set_io_depth(0, 1).unwrap();
        // The first read leaves the queue once the session looks again.
        session.poll(&mut done).unwrap();
        session.submit(reqs[2]).unwrap();
        wait_all(&mut session, &mut done);
        assert_eq!(
            done.iter().map(|c| c.tag).collect::<Vec<_>>(),
            [0, 1, 2],
            "{backend:?}: a class's reads start in the order they were queued"
        );
        for c in &done {
            let at = c.tag as usize * 10;
            assert_eq!(&c.result.as_ref().unwrap()[..], &data[at..at + 100]);
        }
        assert_eq!(reader.stats().classes[0].peak_in_flight, 1);
    }
}

#[test]
fn files_opened_on_the_reader_serve_every_session_until_closed() {
    let dir = test_dir();
    let files: Vec<_> = (0..5)
        .map(|i| make_file(dir.path(), &format!("f{i}"), 9000, 20 + i))
        .collect();
    for backend in backends() {
        let reader = builder(backend).build().unwrap();
        let mut ids: Vec<_> = files
            .iter()
            .map(|(p, _)| reader.open(p, OpenOptions::default()).unwrap())
            .collect();
        assert_eq!(reader.stats().files_open, 5);
        // Two sessions on two threads read every file opened before either started.
        std::thread::scope(|scope| {
            for thread in 0..2usize {
                let (reader, ids, files) = (&reader, &ids, &files);
                scope.spawn(move || {
                    let mut session = reader.session().unwrap();
                    for (id, (_, data)) in ids.iter().zip(files).skip(thread) {
                        assert_eq!(
                            &read_one(&mut session, *id, 100, 8000).unwrap()[..],
                            &data[100..8100]
                        );
                    }
                });
            }
        });
        // A closed file is refused; reopened (here with O_DIRECT), it reads again.
        let mut session = reader.session().unwrap();
        let closed = ids.remove(0);
        reader.close(closed).unwrap();
        assert!(matches!(
            read_one(&mut session, closed, 0, 10),
            Err(ReadError::UnknownFile { file }) if file == closed
        ));
        let again = reader
            .open(&files[0].0, OpenOptions { direct: true })
            .unwrap();
        assert_ne!(again, closed, "ids of closed files are not reused");
        assert_eq!(
            &read_one(&mut session, again, 4096, 4000).unwrap()[..],
            &files[0].1[4096..8096]
        );
        assert_eq!(reader.stats().files_open, 5);
    }
}

/// Installs a seccomp filter on the calling thread (and threads it spawns) that fails
/// io_uring_setup with EPERM, as container runtimes do.
fn deny_io_uring_setup_on_this_thread() {
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JEQ_K: u16 = 0x15;
    const BPF_RET_K: u16 = 0x06;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const NR_IO_URING_SETUP: u32 = 425;
    let stmt = |code, k| SockFilter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let filter = [
        stmt(BPF_LD_W_ABS, 4), // seccomp_data.arch
        SockFilter {
            code: BPF_JMP_JEQ_K,
            jt: 1,
            jf: 0,
            k: AUDIT_ARCH_X86_64,
        },
        stmt(BPF_RET_K, RET_ALLOW),
        stmt(BPF_LD_W_ABS, 0), // seccomp_data.nr
        SockFilter {
            code: BPF_JMP_JEQ_K,
            jt: 0,
            jf: 1,
            k: NR_IO_URING_SETUP,
        },
        stmt(BPF_RET_K, RET_ERRNO | libc::EPERM as u32),
        stmt(BPF_RET_K, RET_ALLOW),
    ];
    let prog = SockFprog {
        len: filter.len() as u16,
        filter: filter.as_ptr(),
    };
    // SAFETY: plain prctl calls; `prog` points at a filter that lives across the call (the
    // kernel copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                2, /* SECCOMP_MODE_FILTER */
                &prog as *const SockFprog
            ),
            0,
            "seccomp: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn the_pread_fallback_is_chosen_when_ring_setup_fails_and_works() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "fallback", 1 << 20, 12);
    // A thread of its own: the filter stays with it and its children.
    std::thread::spawn(move || {
        deny_io_uring_setup_on_this_thread();
        let err = Reader::builder()
            .backend(Backend::Uring)
            .build()
            .unwrap_err();
        assert!(matches!(err, ReadError::Setup { .. }), "{err:?}");
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));

        let reader = Reader::builder()
            .backend(Backend::Auto)
            .pread_threads(3)
            .build()
            .unwrap();
        let info = reader.backend();
        if std::env::var("LOBSTER_IO").as_deref() != Ok("pread") {
            assert!(info.reason.contains("io_uring_setup"), "{info:?}");
            assert!(info.reason.contains("not permitted"), "{info:?}");
        }
        assert_eq!(info.active, ActiveBackend::Pread);
        assert_eq!(info.threads, 3, "{info:?}");
        // A session needs no ring on this backend.
        let mut session = reader.session().unwrap();
        assert!(!session.fixed_buffers());
        let file = reader.open(&path, OpenOptions { direct: true }).unwrap();
        assert_eq!(
            &read_one(&mut session, file, 513, 70_000).unwrap()[..],
            &data[513..70_513]
        );
    })
    .join()
    .unwrap();
}

#[test]
fn a_reader_starts_threads_only_for_the_pread_backend() {
    for backend in backends() {
        let reader = builder(backend).pread_threads(5).build().unwrap();
        let info = reader.backend();
        match info.active {
            // Each session drives its own ring: the reader has no thread of its own.
            ActiveBackend::Uring => {
                assert_eq!(info.threads, 0, "{info:?}");
                assert!(info.ring_capacity >= 256, "{info:?}");
            }
            ActiveBackend::Pread => {
                assert_eq!(info.threads, 5, "{info:?}");
                assert!(!info.direct_descriptors && !info.fixed_buffers, "{info:?}");
            }
        }
    }
}
