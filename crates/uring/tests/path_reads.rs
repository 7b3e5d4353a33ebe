//! Reads by path on sessions (`Session::submit_path`): the file is opened for the read and
//! closed after it, through direct descriptors where the kernel has them. Every test runs on
//! both backends.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lobster_uring::{Backend, Completion, PathRead, ReadError, Reader, ReaderBuilder, Session};
use rand::Rng;

mod common;

use common::{backends, make_file, seeded_rng, test_dir, DepthWatch};

fn builder(backend: Backend) -> ReaderBuilder {
    common::builder(backend).pread_threads(2)
}

fn path_read(
    path: &Path,
    direct: bool,
    offset: u64,
    len: usize,
    class: usize,
    tag: u64,
) -> PathRead {
    PathRead {
        path: Arc::from(path),
        dir: None,
        direct,
        offset,
        len,
        to_eof: false,
        class,
        tag,
    }
}

/// A reader of one class of io_depth 8, reads up to 1 MiB and an 8 MiB pool.
fn one_class_reader(backend: Backend) -> Reader {
    builder(backend)
        .classes(1, 8)
        .max_read_bytes(1 << 20)
        .pool_bytes(8 << 20)
        .build()
        .unwrap()
}

/// Says (once per reader) when this kernel has no direct descriptors, so that the slot
/// checks below are skipped for a reason that shows.
fn direct_descriptors(reader: &Reader) -> bool {
    let info = reader.backend();
    if !info.direct_descriptors && reader.backend().active == lobster_uring::ActiveBackend::Uring {
        eprintln!(
            "no direct descriptors on this kernel, slot checks skipped: {}",
            info.reason
        );
    }
    info.direct_descriptors
}

/// Waits for every pending read of `session`, checking after each call that the slots held
/// never exceed the session's bound; returns the completions and the most slots held.
fn drain(session: &mut Session, out: &mut Vec<Completion>) -> usize {
    let mut peak = session.path_slots_in_use();
    while session.pending() > 0 {
        session.wait(1, out).unwrap();
        let in_use = session.path_slots_in_use();
        assert!(
            in_use <= session.path_slots(),
            "{in_use} slots held of {}",
            session.path_slots()
        );
        peak = peak.max(in_use);
    }
    assert_eq!(session.path_slots_in_use(), 0, "a slot was not given back");
    peak
}

#[test]
fn reads_by_path_give_the_files_bytes_with_more_files_than_slots() {
    let dir = test_dir();
    let mut rng = seeded_rng(31);
    let files: Vec<(PathBuf, Vec<u8>)> = (0..40)
        .map(|i| {
            let size = rng.gen_range(1..300_000);
            make_file(dir.path(), &format!("f{i}"), size, 100 + i)
        })
        .collect();
    // One file over 1 MiB, which O_DIRECT reads in chunks (the close then goes in last).
    let (big, big_data) = make_file(dir.path(), "big", (5 << 19) + 77, 7);
    for backend in backends() {
        // ring_entries 2: no room for a linked close, it goes in after the read.
        for (direct, ring_entries) in [(false, 16), (true, 16), (false, 2), (true, 2)] {
            let reader = builder(backend)
                .classes(2, 8)
                .ring_entries(ring_entries)
                .max_read_bytes(4 << 20)
                .pool_bytes(16 << 20)
                .build()
                .unwrap();
            let mut session = reader.session().unwrap();
            let slotted = backend == Backend::Uring && direct_descriptors(&reader);
            if slotted {
                assert!(session.path_slots() > 0 && session.path_slots() <= ring_entries as usize);
            } else {
                assert_eq!(session.path_slots(), 0);
            }
            let mut reqs = Vec::new();
            let mut expected = Vec::new();
            for (tag, (path, data)) in files.iter().enumerate() {
                // Whole files and inner ranges.
                let (offset, len) = if tag % 2 == 0 {
                    (0, data.len())
                } else {
                    let offset = rng.gen_range(0..data.len());
                    (offset, rng.gen_range(0..=data.len() - offset))
                };
                reqs.push(path_read(
                    path,
                    direct,
                    offset as u64,
                    len,
                    tag % 2,
                    tag as u64,
                ));
                expected.push(&data[offset..offset + len]);
            }
            reqs.push(path_read(&big, direct, 4095, big_data.len() - 5000, 0, 40));
            expected.push(&big_data[4095..big_data.len() - 905]);
            let mut out = Vec::new();
            let mut peak = 0;
            let mut rest = &reqs[..];
            while !rest.is_empty() {
                let n = session.submit_path_batch(rest).unwrap();
                peak = peak.max(session.path_slots_in_use());
                rest = &rest[n..];
                if !rest.is_empty() {
                    session.wait(1, &mut out).unwrap();
                }
            }
            peak = peak.max(drain(&mut session, &mut out));
            if slotted {
                assert_eq!(
                    peak,
                    session.path_slots(),
                    "the slot bound was never reached"
                );
            }
            assert_eq!(out.len(), reqs.len());
            for c in out {
                let bytes = c
                    .result
                    .unwrap_or_else(|e| panic!("{backend:?} direct={direct}: {e}"));
                assert_eq!(c.class, c.tag as usize % 2);
                assert!(
                    bytes[..] == *expected[c.tag as usize],
                    "{backend:?} direct={direct}: bytes of tag {} differ",
                    c.tag
                );
            }
        }
    }
}

#[test]
fn a_missing_file_fails_its_open_naming_the_path_and_others_still_read() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "present", 10_000, 3);
    let missing = dir.path().join("missing");
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend).build().unwrap();
            let mut session = reader.session().unwrap();
            session
                .submit_path_batch(&[
                    path_read(&missing, direct, 0, 100, 0, 1),
                    path_read(&path, direct, 10, 100, 0, 2),
                    path_read(&missing, direct, 0, 100, 0, 3),
                ])
                .unwrap();
            let mut out = Vec::new();
            drain(&mut session, &mut out);
            out.sort_by_key(|c| c.tag);
            for c in [&out[0], &out[2]] {
                match &c.result {
                    Err(ReadError::Open { path, source }) => {
                        assert_eq!(path, &missing);
                        assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
                    }
                    other => {
                        panic!("{backend:?} direct={direct}: expected an open error, got {other:?}")
                    }
                }
                let shown = c.result.as_ref().unwrap_err().to_string();
                assert!(shown.contains("missing"), "{shown}");
            }
            assert_eq!(&out[1].result.as_ref().unwrap()[..], &data[10..110]);
        }
    }
}

#[test]
fn a_read_by_path_past_the_end_is_a_short_read_with_the_file_end() {
    let dir = test_dir();
    let (path, _) = make_file(dir.path(), "short", 10_000, 4);
    for backend in backends() {
        for direct in [false, true] {
            let reader = builder(backend).build().unwrap();
            let mut session = reader.session().unwrap();
            session
                .submit_path(path_read(&path, direct, 9_000, 5_000, 0, 1))
                .unwrap();
            let mut out = Vec::new();
            drain(&mut session, &mut out);
            match &out[0].result {
                Err(ReadError::UnexpectedEof {
                    path: p,
                    offset: 9_000,
                    len: 5_000,
                    file_end: 10_000,
                }) => assert_eq!(p, &path),
                other => {
                    panic!("{backend:?} direct={direct}: expected a short read, got {other:?}")
                }
            }
            // The slot of the failed read was closed and given back: a later read works.
            session
                .submit_path(path_read(&path, direct, 0, 10_000, 0, 2))
                .unwrap();
            out.clear();
            drain(&mut session, &mut out);
            assert_eq!(out[0].result.as_ref().unwrap().len(), 10_000);
        }
    }
}

#[test]
fn reads_by_path_hold_each_class_to_its_io_depth() {
    let dir = test_dir();
    let files: Vec<(PathBuf, Vec<u8>)> = (0..24)
        .map(|i| make_file(dir.path(), &format!("f{i}"), 64 << 10, 200 + i))
        .collect();
    for backend in backends() {
        let watch = DepthWatch::new(2, 2);
        let reader = builder(backend)
            .classes(2, 2)
            .ring_entries(16)
            .observer(watch.observer())
            .build()
            .unwrap();
        let mut session = reader.session().unwrap();
        let reqs: Vec<PathRead> = files
            .iter()
            .enumerate()
            .map(|(i, (path, _))| path_read(path, true, 0, 64 << 10, i % 2, i as u64))
            .collect();
        assert_eq!(session.submit_path_batch(&reqs).unwrap(), reqs.len());
        let mut out = Vec::new();
        drain(&mut session, &mut out);
        for c in &out {
            assert_eq!(c.result.as_ref().unwrap()[..], files[c.tag as usize].1[..]);
        }
        assert!(watch.in_flight(0) == 0 && watch.in_flight(1) == 0);
        watch.assert_held(backend);
    }
}

#[test]
fn a_read_to_eof_gives_what_the_file_holds_and_one_byte_more_shows_growth() {
    let dir = test_dir();
    let mut rng = seeded_rng(57);
    // Sizes on and off the page and O_DIRECT alignment.
    let sizes = [1usize, 4095, 4096, 4097, 70_000, rng.gen_range(1..200_000)];
    let files: Vec<(PathBuf, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| make_file(dir.path(), &format!("e{i}"), size, 300 + i as u64))
        .collect();
    for backend in backends() {
        for direct in [false, true] {
            let reader = one_class_reader(backend);
            let mut session = reader.session().unwrap();
            let mut out = Vec::new();
            for (tag, (path, data)) in files.iter().enumerate() {
                // One byte more than the file holds: its bytes, not an error.
                let mut req = path_read(path, direct, 0, data.len() + 1, 0, tag as u64);
                req.to_eof = true;
                session.submit_path(req.clone()).unwrap();
                // The same without to_eof is a short read.
                req.to_eof = false;
                req.tag += 100;
                session.submit_path(req).unwrap();
            }
            drain(&mut session, &mut out);
            assert_eq!(out.len(), 2 * files.len());
            for c in out.drain(..) {
                let (path, data) = &files[c.tag as usize % 100];
                match (c.tag >= 100, c.result) {
                    (false, Ok(bytes)) => {
                        assert_eq!(&bytes[..], &data[..], "{backend:?} direct={direct}")
                    }
                    (true, Err(ReadError::UnexpectedEof { path: p, .. })) => assert_eq!(&p, path),
                    (to_eof, other) => {
                        panic!("{backend:?} direct={direct} to_eof={}: {other:?}", !to_eof)
                    }
                }
            }
            // A file that grew by a byte past the size its reader expects (`len - 1`): asking
            // that size plus one gives all `len` bytes, so the growth shows.
            let (path, data) = &files[4];
            let expected_bytes = data.len() - 1;
            let mut req = path_read(path, direct, 0, expected_bytes + 1, 0, 7);
            req.to_eof = true;
            session.submit_path(req).unwrap();
            drain(&mut session, &mut out);
            let c = out.pop().unwrap();
            assert_eq!(c.result.unwrap().len(), expected_bytes + 1);
        }
    }
}

#[test]
fn queued_reads_reach_the_kernel_with_the_next_wait() {
    let dir = test_dir();
    let files: Vec<(PathBuf, Vec<u8>)> = (0..40)
        .map(|i| {
            make_file(
                dir.path(),
                &format!("q{i}"),
                1_000 + 997 * i,
                900 + i as u64,
            )
        })
        .collect();
    for backend in backends() {
        for direct in [false, true] {
            let reader = one_class_reader(backend);
            let mut session = reader.session().unwrap();
            let mut out = Vec::new();
            // More than the class's io_depth: the rest wait in its queue, then in order.
            for (tag, (path, data)) in files.iter().enumerate() {
                let req = path_read(path, direct, 0, data.len(), 0, tag as u64);
                session.queue_path(req).unwrap();
            }
            assert_eq!(session.pending(), files.len());
            drain(&mut session, &mut out);
            assert_eq!(out.len(), files.len(), "{backend:?} direct={direct}");
            for c in out {
                let bytes = c.result.unwrap();
                assert_eq!(&bytes[..], &files[c.tag as usize].1[..], "{backend:?}");
            }
        }
    }
}

#[test]
fn a_read_by_name_in_a_held_directory_gives_the_files_bytes_and_a_missing_name_its_path() {
    let dir = test_dir();
    let class = dir.path().join("class");
    std::fs::create_dir(&class).unwrap();
    let (path, data) = make_file(&class, "x.jpg", 10_000, 3);
    let held = Arc::new(lobster_uring::open_dir(&class).unwrap());
    let missing = class.join("missing.jpg");
    for backend in backends() {
        for direct in [false, true] {
            let reader = one_class_reader(backend);
            let mut session = reader.session().unwrap();
            for (tag, p) in [(0, &path), (1, &missing)] {
                let mut read = path_read(p, direct, 0, data.len(), 0, tag);
                read.dir = Some(held.clone());
                session.submit_path(read).unwrap();
            }
            let mut out = Vec::new();
            drain(&mut session, &mut out);
            out.sort_by_key(|c| c.tag);
            let what = format!("{backend:?} direct={direct}");
            assert_eq!(&out[0].result.as_ref().unwrap()[..], &data[..], "{what}");
            match &out[1].result {
                Err(ReadError::Open { path: p, .. }) => assert_eq!(p, &missing, "{what}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    // The held directory is what counts, on every backend: moved away from its path, it
    // still opens what it holds, and the error still names the path asked for.
    let moved = dir.path().join("moved");
    std::fs::rename(&class, &moved).unwrap();
    for backend in backends() {
        let reader = one_class_reader(backend);
        let mut session = reader.session().unwrap();
        let mut read = path_read(&path, false, 0, data.len(), 0, 0);
        read.dir = Some(held.clone());
        session.submit_path(read.clone()).unwrap();
        read.dir = None;
        read.tag = 1;
        session.submit_path(read).unwrap();
        let mut out = Vec::new();
        drain(&mut session, &mut out);
        out.sort_by_key(|c| c.tag);
        assert_eq!(
            &out[0].result.as_ref().unwrap()[..],
            &data[..],
            "{backend:?}"
        );
        assert!(
            matches!(&out[1].result, Err(ReadError::Open { path: p, .. }) if p == &path),
            "{backend:?}: {:?}",
            out[1].result
        );
    }
}
