//! Helpers shared by the reader's integration tests (each test crate uses a subset).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use lobster_uring::{Backend, Reader, ReaderBuilder};

/// Deterministic pseudo-random bytes and numbers (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A directory on the target's file system (O_DIRECT needs a real one, not tmpfs).
pub fn test_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// A file of `size` pseudo-random bytes, and the bytes.
pub fn make_file(dir: &Path, name: &str, size: usize, seed: u64) -> (PathBuf, Vec<u8>) {
    let mut rng = Rng(seed | 1);
    let data: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
    let path = dir.join(name);
    std::fs::write(&path, &data).unwrap();
    (path, data)
}

/// The backends to test: both, unless this kernel cannot run io_uring (then said so).
pub fn backends() -> Vec<Backend> {
    match Reader::builder().backend(Backend::Uring).build() {
        Ok(_) => vec![Backend::Uring, Backend::Pread],
        Err(e) => {
            eprintln!("io_uring unavailable on this kernel, testing pread only: {e}");
            vec![Backend::Pread]
        }
    }
}

/// A builder for `backend` with 8 pread threads.
pub fn builder(backend: Backend) -> ReaderBuilder {
    Reader::builder().backend(backend).pread_threads(8)
}
