//! Behaviour of the reader, every test run against both backends.

use std::collections::HashMap;
use std::sync::Arc;

use lobster_uring::{ActiveBackend, Backend, Bytes, OpenOptions, ReadError, ReadRequest, Reader};

mod common;

use common::{
    backends, builder, check, make_file, random_range, seeded_rng, test_dir, truncate, DepthWatch,
};
use rand::Rng;

fn read_one(
    reader: &Reader,
    file: lobster_uring::FileId,
    offset: u64,
    len: usize,
) -> Result<Bytes, ReadError> {
    let rx = reader.completions();
    reader.submit(ReadRequest {
        file,
        offset,
        len,
        class: 0,
        tag: 7,
    })?;
    let c = rx.recv().unwrap();
    assert_eq!(c.tag, 7);
    c.result
}

#[test]
fn random_ranges_match_std_fs_on_both_backends() {
    let dir = test_dir();
    let size = (6 << 20) + 123;
    let (path, data) = make_file(dir.path(), "data", size, 1);
    for backend in backends() {
        // Two rings share the class queues and the fixed-file table.
        for (direct, rings) in [(false, 1), (true, 1), (false, 2), (true, 2)] {
            let reader = builder(backend)
                .rings(rings)
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
            let rx = reader.completions();
            let mut rng = seeded_rng(99 + direct as u64);
            let mut expected: HashMap<u64, (u64, usize)> = HashMap::new();
            let total = 300;
            let mut received = 0;
            for tag in 0..total {
                let (offset, len) = random_range(&mut rng, size);
                expected.insert(tag, (offset, len));
                let class = (tag % 3) as usize;
                reader
                    .submit(ReadRequest {
                        file,
                        offset,
                        len,
                        class,
                        tag,
                    })
                    .unwrap();
                // Keep a few reads outstanding without exhausting the pool.
                while tag - received >= 8 {
                    check(&rx.recv().unwrap(), &expected, &data, 3, backend, direct);
                    received += 1;
                }
            }
            while received < total {
                check(&rx.recv().unwrap(), &expected, &data, 3, backend, direct);
                received += 1;
            }
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
                let err = read_one(&reader, file, offset, len).unwrap_err();
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

            // Unknown class, unknown file, too large: refused at submission.
            let req = ReadRequest {
                file,
                offset: 0,
                len: 10,
                class: 5,
                tag: 1,
            };
            assert!(matches!(
                reader.submit(req),
                Err(ReadError::InvalidClass {
                    class: 5,
                    classes: 1
                })
            ));
            let req = ReadRequest {
                file,
                offset: 0,
                len: 1 << 20,
                class: 0,
                tag: 1,
            };
            assert!(matches!(
                reader.submit(req),
                Err(ReadError::TooLarge { .. })
            ));

            // The engine still serves good reads after all that.
            let ok = read_one(&reader, file, 1234, 5000).unwrap();
            assert_eq!(&ok[..], &data[1234..6234]);
            assert_eq!(read_one(&reader, file, 100, 0).unwrap().len(), 0);

            reader.close(file).unwrap();
            let req = ReadRequest {
                file,
                offset: 0,
                len: 10,
                class: 0,
                tag: 1,
            };
            assert!(matches!(
                reader.submit(req),
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
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            assert_eq!(
                &read_one(&reader, file, 8192, 4096).unwrap()[..],
                &data[8192..12288]
            );
            truncate(&path, 5000);
            let err = read_one(&reader, file, 4096, 4096).unwrap_err();
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
                &read_one(&reader, file, 0, 4096).unwrap()[..],
                &data[..4096]
            );
        }
    }
}

#[test]
fn in_flight_reads_per_class_never_exceed_io_depth_while_it_changes() {
    const CLASSES: usize = 3;
    let dir = test_dir();
    let size = 32 << 20;
    let (path, data) = make_file(dir.path(), "depth", size, 4);
    for backend in backends() {
        let watch = DepthWatch::new(CLASSES, 4);
        // Two rings: the limits hold across engine threads.
        let reader = builder(backend)
            .rings(2)
            .classes(CLASSES, 4)
            .pread_threads(16)
            .pool_bytes(48 * (64 << 10))
            .max_read_bytes(64 << 10)
            .observer(watch.observer())
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions { direct: true }).unwrap();
        let total: u64 = 1500;
        let consumer = {
            let rx = reader.completions();
            let data = data.clone();
            std::thread::spawn(move || {
                for _ in 0..total {
                    let c = rx.recv().unwrap();
                    let offset = (c.tag >> 8) as usize;
                    assert_eq!(&c.result.unwrap()[..], &data[offset..offset + (64 << 10)]);
                }
            })
        };
        let submitter = {
            let reader = reader.clone();
            std::thread::spawn(move || {
                let mut rng = seeded_rng(6);
                for i in 0..total {
                    let offset = rng.gen_range(0..(size as u64) / 4096 - 16) * 4096;
                    let class = (i % CLASSES as u64) as usize;
                    let req = ReadRequest {
                        file,
                        offset,
                        len: 64 << 10,
                        class,
                        tag: offset << 8 | i & 0xff,
                    };
                    reader.submit(req).unwrap();
                }
            })
        };
        let mut rng = seeded_rng(7);
        while !submitter.is_finished() {
            let class = rng.gen_range(0..CLASSES as u64) as usize;
            let new = 1 + rng.gen_range(0..12) as usize;
            watch.set_io_depth(&reader, class, new);
            std::thread::yield_now();
        }
        submitter.join().unwrap();
        for class in 0..CLASSES {
            watch.set_io_depth(&reader, class, 8);
        }
        consumer.join().unwrap();
        watch.assert_held(backend);
        let stats = reader.stats();
        for (class, s) in stats.classes.iter().enumerate() {
            assert_eq!(s.in_flight, 0);
            assert_eq!(watch.in_flight(class), 0);
            assert!(s.peak_in_flight <= 12, "{s:?}");
        }
    }
}

#[test]
fn dropping_the_reader_with_reads_in_flight_completes_or_cancels_each() {
    let dir = test_dir();
    let size = 16 << 20;
    let (path, data) = make_file(dir.path(), "drop", size, 8);
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend)
                .classes(2, 4)
                .pool_bytes(64 * (256 << 10))
                .max_read_bytes(256 << 10)
                .build()
                .unwrap();
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            let rx = reader.completions();
            let mut rng = seeded_rng(9);
            let mut expected = HashMap::new();
            for tag in 0..64u64 {
                let offset = rng.gen_range(0..(size - (256 << 10)) as u64);
                let len = 1 + rng.gen_range(0..200_000) as usize;
                expected.insert(tag, (offset as usize, len));
                reader
                    .submit(ReadRequest {
                        file,
                        offset,
                        len,
                        class: (tag % 2) as usize,
                        tag,
                    })
                    .unwrap();
            }
            drop(reader);
            let mut seen = 0;
            let mut kept = Vec::new();
            for c in rx.iter() {
                let (offset, len) = expected[&c.tag];
                match c.result {
                    Ok(bytes) => {
                        assert_eq!(&bytes[..], &data[offset..offset + len]);
                        kept.push((bytes, offset, len));
                    }
                    Err(ReadError::Cancelled {
                        offset: o, len: l, ..
                    }) => {
                        assert_eq!((o as usize, l), (offset, len))
                    }
                    Err(e) => panic!("{backend:?}: {e}"),
                }
                seen += 1;
            }
            assert_eq!(
                seen, 64,
                "{backend:?}: every request completes exactly once"
            );
            // Bytes outlive the reader and still hold the right data.
            for (bytes, offset, len) in kept {
                assert_eq!(&bytes[..], &data[offset..offset + len]);
            }
        }
    }
}

#[test]
fn a_full_pool_defers_submission_until_bytes_drop() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "pool", 1 << 20, 10);
    for backend in backends() {
        let reader = builder(backend)
            .pool_bytes(3 * 4096)
            .max_read_bytes(4096)
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let rx = reader.completions();
        let mut held = Vec::new();
        for tag in 0..3 {
            reader
                .try_submit(ReadRequest {
                    file,
                    offset: tag * 100,
                    len: 4096,
                    class: 0,
                    tag,
                })
                .unwrap();
            held.push(rx.recv().unwrap().result.unwrap());
        }
        let req = ReadRequest {
            file,
            offset: 0,
            len: 10,
            class: 0,
            tag: 9,
        };
        assert!(matches!(
            reader.try_submit(req),
            Err(ReadError::WouldBlock {
                bound: "buffer pool"
            })
        ));
        let clone = held[1].clone();
        held.remove(1);
        assert!(
            matches!(reader.try_submit(req), Err(ReadError::WouldBlock { .. })),
            "a clone still holds it"
        );
        drop(clone);
        reader.try_submit(req).unwrap();
        held.push(rx.recv().unwrap().result.unwrap());
        assert_eq!(&held[2][..], &data[..10]);
        // A blocking submit returns at once; the read waits in the reader for a block, and
        // try_submit does not overtake it.
        reader.submit(ReadRequest { tag: 10, ..req }).unwrap();
        assert!(matches!(
            reader.try_submit(ReadRequest { tag: 11, ..req }),
            Err(ReadError::WouldBlock {
                bound: "buffer pool"
            })
        ));
        assert_eq!(reader.stats().classes[0].completed, 4);
        drop(held.pop());
        assert_eq!(rx.recv().unwrap().tag, 10);
    }
}

#[test]
fn a_full_class_queue_blocks_try_submit() {
    let dir = test_dir();
    let (path, _) = make_file(dir.path(), "queue", 1 << 16, 11);
    for backend in backends() {
        let reader = builder(backend)
            .classes(1, 0)
            .queue_capacity(2)
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let req = ReadRequest {
            file,
            offset: 0,
            len: 100,
            class: 0,
            tag: 0,
        };
        reader.try_submit(req).unwrap();
        reader.try_submit(req).unwrap();
        assert!(matches!(
            reader.try_submit(req),
            Err(ReadError::WouldBlock {
                bound: "class queue"
            })
        ));
        assert_eq!(
            reader.stats().classes[0].queued,
            2,
            "depth 0 pauses the class"
        );
        reader.set_io_depth(0, 1).unwrap();
        let rx = reader.completions();
        rx.recv().unwrap().result.unwrap();
        rx.recv().unwrap().result.unwrap();
    }
}

#[test]
fn files_beyond_the_fixed_table_are_read_through_plain_fds() {
    let dir = test_dir();
    let files: Vec<_> = (0..5)
        .map(|i| make_file(dir.path(), &format!("f{i}"), 9000, 20 + i))
        .collect();
    for backend in backends() {
        let reader = builder(backend).fixed_files(2).build().unwrap();
        if backend == Backend::Uring {
            assert_eq!(
                reader.backend().fixed_file_slots,
                2,
                "{:?}",
                reader.backend()
            );
        }
        let mut ids: Vec<_> = files
            .iter()
            .map(|(p, _)| reader.open(p, OpenOptions::default()).unwrap())
            .collect();
        for (id, (_, data)) in ids.iter().zip(&files) {
            assert_eq!(
                &read_one(&reader, *id, 100, 8000).unwrap()[..],
                &data[100..8100]
            );
        }
        // Closing frees slots for files opened later.
        reader.close(ids.remove(0)).unwrap();
        let again = reader
            .open(&files[0].0, OpenOptions { direct: true })
            .unwrap();
        assert_eq!(
            &read_one(&reader, again, 4096, 4000).unwrap()[..],
            &files[0].1[4096..8096]
        );
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

        let reader = Reader::builder().backend(Backend::Auto).build().unwrap();
        let info = reader.backend();
        if std::env::var("LOBSTER_IO").as_deref() != Ok("pread") {
            assert!(info.reason.contains("io_uring_setup"), "{info:?}");
            assert!(info.reason.contains("not permitted"), "{info:?}");
        }
        assert_eq!(info.active, ActiveBackend::Pread);
        let file = reader.open(&path, OpenOptions { direct: true }).unwrap();
        assert_eq!(
            &read_one(&reader, file, 513, 70_000).unwrap()[..],
            &data[513..70_513]
        );
    })
    .join()
    .unwrap();
}

#[test]
fn submit_batch_checks_every_request_first_and_may_exceed_the_pool() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "batch", 1 << 20, 13);
    let data = Arc::new(data);
    for backend in backends() {
        let data = data.clone();
        let reader = builder(backend)
            .classes(2, 2)
            .pool_bytes(4 * 4096)
            .max_read_bytes(4096)
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let rx = reader.completions();
        let mut reqs: Vec<ReadRequest> = (0..10u64)
            .map(|tag| ReadRequest {
                file,
                offset: tag * 1000,
                len: 3000 + tag as usize,
                class: (tag % 2) as usize,
                tag,
            })
            .collect();
        reqs[7].class = 2;
        assert!(matches!(
            reader.submit_batch(&reqs),
            Err(ReadError::InvalidClass { class: 2, .. })
        ));
        assert!(
            rx.try_recv().is_err(),
            "nothing of a refused batch was queued"
        );
        assert_eq!(reader.stats().pool_free_bytes, 4 * 4096);
        reqs[7].class = 1;
        // Ten reads through a pool of four blocks: the consumer frees them as the batch goes
        // in.
        let consumer = std::thread::spawn(move || {
            let mut tags: Vec<u64> = (0..10)
                .map(|_| {
                    let c = rx.recv().unwrap();
                    let (o, l) = (c.tag as usize * 1000, 3000 + c.tag as usize);
                    assert_eq!(&c.result.unwrap()[..], &data[o..o + l]);
                    c.tag
                })
                .collect();
            tags.sort_unstable();
            tags
        });
        reader.submit_batch(&reqs).unwrap();
        assert_eq!(consumer.join().unwrap(), (0..10).collect::<Vec<u64>>());
    }
}
