//! Helpers shared by the CLI's end-to-end tests.

use std::path::Path;
use std::process::Command;

/// The built `lobster` binary.
pub fn lobster() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lobster"))
}

/// `lobster gen`: `samples` images of about `mean_kb` KiB over 3 classes in `dir`.
pub fn gen(dir: &Path, samples: u32, mean_kb: u32) {
    let out = lobster()
        .args(["gen", "--samples", &samples.to_string()])
        .args(["--classes", "3", "--mean-kb", &mean_kb.to_string(), "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `lobster pack`: the ImageFolder `images` as shards of at most `shard_bytes` in `out`.
// Every test binary compiles this module; only some pack.
#[allow(dead_code)]
pub fn pack(images: &Path, out: &Path, shard_bytes: u64) {
    let done = lobster()
        .args(["pack", "--shard-bytes", &shard_bytes.to_string(), "--data"])
        .arg(images)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
}
