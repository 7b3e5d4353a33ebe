//! The `tokio-uring` feature: the same reads as futures (`cargo test --features tokio-uring`).
#![cfg(feature = "tokio-uring")]

use lobster_uring::{AsyncFile, ReadError};

#[test]
fn async_reads_match_std_fs_and_report_eof() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("data");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 + 7) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    tokio_uring::start(async {
        let file = AsyncFile::open(&path).await.unwrap();
        let bytes = file.read_exact_at(12_345, 200_000).await.unwrap();
        assert_eq!(&bytes[..], &data[12_345..212_345]);
        let err = file.read_exact_at(299_000, 5_000).await.unwrap_err();
        assert!(
            matches!(
                err,
                ReadError::UnexpectedEof {
                    file_end: 300_000,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = AsyncFile::open(dir.path()).await.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EISDIR));
    });
}

#[test]
fn concurrent_async_reads_each_get_their_own_range() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("data");
    let data: Vec<u8> = (0..1_000_000u32)
        .map(|i| (i * 131 + i / 4096) as u8)
        .collect();
    std::fs::write(&path, &data).unwrap();
    let ranges: Vec<(u64, usize)> = (0..64u64)
        .map(|i| (i * 15_013 % 900_000, 1 + (i as usize * 7_919) % 90_000))
        .collect();
    tokio_uring::start(async {
        let file = std::rc::Rc::new(AsyncFile::open(&path).await.unwrap());
        let tasks: Vec<_> = ranges
            .iter()
            .map(|&(offset, len)| {
                let file = file.clone();
                tokio_uring::spawn(async move { file.read_exact_at(offset, len).await })
            })
            .collect();
        for (task, &(offset, len)) in tasks.into_iter().zip(&ranges) {
            let bytes = task.await.unwrap().unwrap();
            assert!(
                bytes[..] == data[offset as usize..offset as usize + len],
                "range {offset}+{len} differs"
            );
        }
        let missing = dir.path().join("missing");
        match AsyncFile::open(&missing).await {
            Err(ReadError::Open { path, source }) => {
                assert_eq!(path, missing);
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("expected an open error naming the path, got {other:?}"),
        }
    });
}
