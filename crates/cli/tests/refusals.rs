//! `lobster run` refuses what cannot run before it runs anything: options checked for every
//! strategy up front, output files probed, memory sized by the options checked against the
//! machine, a resume past the run's end named.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{gen, lobster};

/// `lobster run --quiet` on `data` with no compute and no emulated storage, 2 ranks per node,
/// batches of 4, and `args`.
fn run(data: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--ranks-per-node", "2", "--batch", "4"];
    all.extend(args);
    run_with(lobster(), data, &all)
}

/// `cmd run --quiet` on `data` with no compute and no emulated storage, and `args`.
fn run_with(mut cmd: Command, data: &Path, args: &[&str]) -> Output {
    cmd.args(["run", "--quiet", "--compute-ms", "0", "--storage-mbps", "0"])
        .arg("--data")
        .arg(data)
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The results table's header: printed only once a strategy has run.
const TABLE: &str = "samples/s";

#[test]
fn a_bad_option_is_refused_naming_it_before_any_strategy_runs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 64, 4);
    // Only the pipelined strategies take --decode-threads: pytorch would have run first.
    let out = run(
        &data,
        &[
            "--strategy",
            "pytorch,lobster",
            "--decode-threads",
            "100000",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--decode-threads"), "{stderr}");
    assert!(stderr.contains("100000"), "{stderr}");
    assert!(!stdout.contains(TABLE), "a strategy ran first:\n{stdout}");
    // The read-then-decode strategies' threads are their workers: named as such.
    let out = run(
        &data,
        &["--strategy", "pytorch", "--workers-per-rank", "4096"],
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--workers-per-rank"), "{stderr}");
}

#[test]
fn the_deepest_io_depth_runs_with_workers_at_the_thread_bound() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 64, 4);
    // io_depth allows 65536; the read-then-decode workers it implies stop at 1024 a node.
    let out = run(
        &data,
        &["--strategy", "pytorch,lobster", "--io-depth", "65536"],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("65536 reads in flight"), "{stdout}");
    assert!(stdout.contains("512 workers per rank"), "{stdout}");
}

#[test]
fn an_output_file_that_cannot_be_written_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 64, 4);
    let missing = dir.path().join("no-such-folder").join("run.json");
    for option in ["--json", "--save-state"] {
        let mut args = vec!["--strategy", "lobster", option, missing.to_str().unwrap()];
        if option == "--save-state" {
            args.extend(["--stop-after-iterations", "2"]);
        }
        let out = run(&data, &args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{option}: {stderr}");
        assert!(stderr.contains(option), "{option}: {stderr}");
        assert!(stderr.contains("no-such-folder"), "{option}: {stderr}");
        assert!(!stdout.contains(TABLE), "{option}: the run ran:\n{stdout}");
    }
    // A folder where the file should be.
    let out = run(
        &data,
        &[
            "--strategy",
            "lobster",
            "--json",
            dir.path().to_str().unwrap(),
        ],
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("a directory"), "{stderr}");
    assert!(!dir.path().join(".lobster-probe").exists());
}

#[test]
fn memory_sized_by_the_options_is_checked_against_the_address_space_limit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 64, 4);
    // 16 GB of address space; 8192-pixel images in batches of 16 on 4 ranks need far more.
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg("ulimit -v 16000000 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_lobster"));
    let out = run_with(
        sh,
        &data,
        &[
            "--ranks-per-node",
            "4",
            "--batch",
            "16",
            "--transform",
            "train",
            "--image-size",
            "8192",
            "--nodes",
            "1",
        ],
    );
    let (stdout, stderr) = text(&out);
    // Refused with an error, not aborted by a failed allocation.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("ulimit -v"), "{stderr}");
    assert!(stderr.contains("--image-size"), "{stderr}");
    assert!(stderr.contains("batch_size"), "{stderr}");
    assert!(!stdout.contains(TABLE), "{stdout}");
}

#[test]
fn a_resume_past_the_runs_epochs_is_refused_naming_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 64, 4);
    let state = dir.path().join("state.json");
    // 64 samples over 4 nodes of 2 ranks in batches of 4: 2 steps an epoch; 5 steps end
    // within epoch 2.
    let job = ["--strategy", "lobster", "--epochs", "3"];
    let mut first = job.to_vec();
    first.extend(["--stop-after-iterations", "5", "--save-state"]);
    first.push(state.to_str().unwrap());
    let out = run(&data, &first);
    assert!(out.status.success(), "{}", text(&out).1);
    let resume = ["--strategy", "lobster", "--resume", state.to_str().unwrap()];
    for epochs in ["1", "2"] {
        let mut args = resume.to_vec();
        args.extend(["--epochs", epochs]);
        let out = run(&data, &args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "--epochs {epochs}: {stdout}");
        assert!(stderr.contains("epochs"), "{stderr}");
        assert!(stderr.contains("at least 3"), "{stderr}");
        assert!(!stdout.contains("NaN"), "{stdout}");
    }
    let mut args = resume.to_vec();
    args.extend(["--epochs", "3"]);
    let out = run(&data, &args);
    assert!(out.status.success(), "{}", text(&out).1);
}
