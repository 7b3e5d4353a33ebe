//! The byte-budget buffer pool seen through the reader, every test run against both backends.

use std::sync::{Arc, Mutex};

use lobster_uring::{
    ActiveBackend, Backend, IoEvent, IoEventKind, OpenOptions, ReadError, ReadRequest, Reader,
};

mod common;

use common::{backends, builder, make_file, seeded_rng, test_dir};
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
/// what they ask for together: submit never waits for memory, every byte matches std::fs, and
/// every block comes back and coalesces.
#[test]
fn reads_of_random_sizes_up_to_max_read_bytes_match_std_fs() {
    let dir = test_dir();
    let size = 4 << 20;
    let (path, data) = make_file(dir.path(), "sizes", size, 1);
    let data = Arc::new(data);
    for backend in backends() {
        for direct in [false, true] {
            // Four largest blocks (512 KiB each): a few large reads fill it.
            let reader = builder(backend)
                .classes(2, 8)
                .pool_bytes(4 * (512 << 10))
                .max_read_bytes(MAX_READ)
                .build()
                .unwrap();
            if backend == Backend::Uring {
                assert_eq!(reader.backend().active, ActiveBackend::Uring);
                let need = (reader.stats().pool_budget_bytes * reader.backend().threads) as u64;
                if need <= memlock_limit_bytes() {
                    assert!(
                        reader.backend().fixed_buffers,
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
                    ReadRequest {
                        file,
                        offset,
                        len,
                        class: (tag % 2) as usize,
                        tag: offset << 20 | len as u64,
                    }
                })
                .collect();
            let rx = reader.completions();
            let check = {
                let data = data.clone();
                std::thread::spawn(move || {
                    for _ in 0..total {
                        let c = rx.recv().unwrap();
                        let (offset, len) = ((c.tag >> 20) as usize, (c.tag & 0xf_ffff) as usize);
                        let bytes = c.result.unwrap();
                        assert!(
                            bytes[..] == data[offset..offset + len],
                            "{backend:?} direct={direct}: bytes differ at {offset}+{len}"
                        );
                    }
                })
            };
            // Submitted from this thread without waiting for completions: reads that find no
            // block wait in the reader, so this loop finishes whatever the pool holds.
            for (i, req) in reqs.iter().enumerate() {
                if i % 3 == 0 {
                    reader.submit_batch(std::slice::from_ref(req)).unwrap();
                } else {
                    reader.submit(*req).unwrap();
                }
            }
            check.join().unwrap();
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
            let file = reader.open(&path, OpenOptions { direct }).unwrap();
            let over = ReadRequest {
                file,
                offset: 0,
                len: 65537,
                class: 0,
                tag: 0,
            };
            // O_DIRECT widens an unaligned read of exactly the maximum past it.
            let widened = ReadRequest {
                offset: 100,
                len: 65536,
                ..over
            };
            let cases: &[ReadRequest] = if direct { &[over, widened] } else { &[over] };
            for req in cases {
                for err in [
                    reader.submit(*req).unwrap_err(),
                    reader.try_submit(*req).unwrap_err(),
                    reader.submit_batch(&[*req]).unwrap_err(),
                ] {
                    assert!(
                        matches!(
                            &err,
                            ReadError::TooLarge { max_read_bytes: 65536, len, offset, .. }
                                if *len == req.len && *offset == req.offset
                        ),
                        "{err:?}"
                    );
                    assert!(err.to_string().contains("max_read_bytes = 65536"), "{err}");
                }
            }
            let ok = ReadRequest { len: 65536, ..over };
            reader.submit(ok).unwrap();
            assert_eq!(
                reader.completions().recv().unwrap().result.unwrap().len(),
                65536
            );
        }
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

/// A large read waiting for memory is served before small reads submitted after it, even
/// though small blocks are free all along.
#[test]
fn a_large_read_is_served_before_later_small_ones() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "fair", 1 << 20, 3);
    for backend in backends() {
        let issued = Arc::new(Mutex::new(Vec::new()));
        let log = issued.clone();
        // Two largest blocks of 64 KiB; one class at depth 1, so reads run one at a time.
        let reader = builder(backend)
            .classes(1, 1)
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
        let rx = reader.completions();
        let read = |tag: u64, len: usize| ReadRequest {
            file,
            offset: 0,
            len,
            class: 0,
            tag,
        };
        // One small block in each half, so no 64 KiB block is free.
        reader.submit(read(0, 4096)).unwrap();
        let low = rx.recv().unwrap().result.unwrap();
        let fill: Vec<_> = [4096, 8192, 16384, 32768]
            .into_iter()
            .enumerate()
            .map(|(i, len)| {
                reader.submit(read(1 + i as u64, len)).unwrap();
                rx.recv().unwrap().result.unwrap()
            })
            .collect();
        reader.submit(read(5, 4096)).unwrap();
        let high = rx.recv().unwrap().result.unwrap();
        drop(fill);
        let stats = reader.stats();
        assert!(stats.pool_largest_free_bytes < 65536 && stats.pool_free_bytes >= 4096);

        reader.submit(read(10, 65536)).unwrap();
        reader.submit(read(11, 4096)).unwrap();
        assert!(matches!(
            reader.try_submit(read(12, 4096)),
            Err(ReadError::WouldBlock {
                bound: "buffer pool"
            })
        ));
        assert_eq!(
            reader.stats().classes[0].completed,
            6,
            "{backend:?}: the small read went ahead of the large one"
        );
        drop(low);
        let big = rx.recv().unwrap();
        assert_eq!(big.tag, 10);
        assert_eq!(&big.result.unwrap()[..], &data[..65536]);
        let small = rx.recv().unwrap();
        assert_eq!(small.tag, 11);
        assert_eq!(&small.result.unwrap()[..], &data[..4096]);
        assert_eq!(&issued.lock().unwrap()[6..], &[10, 11]);
        drop(high);
        let stats = reader.stats();
        assert_eq!(stats.pool_free_bytes, stats.pool_budget_bytes);
        assert_eq!(stats.pool_largest_free_bytes, 65536, "coalesced");
    }
}

/// Dropping the reader while reads wait for memory completes each of them as cancelled.
#[test]
fn reads_waiting_for_memory_are_cancelled_when_the_reader_drops() {
    let dir = test_dir();
    let (path, data) = make_file(dir.path(), "cancel", 1 << 20, 4);
    for backend in backends() {
        let reader = builder(backend)
            .pool_bytes(8192)
            .max_read_bytes(8192)
            .build()
            .unwrap();
        let file = reader.open(&path, OpenOptions::default()).unwrap();
        let rx = reader.completions();
        let read = |tag: u64| ReadRequest {
            file,
            offset: tag * 10,
            len: 8192,
            class: 0,
            tag,
        };
        reader.submit(read(0)).unwrap();
        let held = rx.recv().unwrap().result.unwrap();
        for tag in 1..=5 {
            reader.submit(read(tag)).unwrap();
        }
        drop(reader);
        let mut tags = Vec::new();
        for c in rx.iter() {
            assert!(
                matches!(c.result, Err(ReadError::Cancelled { offset, len: 8192, .. }) if offset == c.tag * 10),
                "{backend:?}: {:?}",
                c.result
            );
            tags.push(c.tag);
        }
        assert_eq!(tags, [1, 2, 3, 4, 5]);
        assert_eq!(&held[..], &data[..8192], "bytes outlive the reader");
    }
}
