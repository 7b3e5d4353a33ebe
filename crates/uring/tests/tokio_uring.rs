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
