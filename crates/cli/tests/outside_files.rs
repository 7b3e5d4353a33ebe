//! Files from outside read by the built binary: a folder replaced under its kept table by
//! one with the same modification times (as `tar --mtime` extracts it), a loader state
//! that never ends (`--resume /dev/zero`), a sample that is a symlink to a device, and a
//! trace without line ends.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The built `lobster` binary.
fn lobster() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lobster"))
}

/// `cmd` run to its end, killed (and the test failed) if it runs past `limit`: a guard
/// against a hang, not a measure of time.
fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{cmd:?} still ran after {limit:?}: killed");
        }
    }
}

/// The keys `lobster ls --data data` lists, tables kept under `cache`.
fn ls_keys(data: &Path, cache: &Path) -> Vec<String> {
    let mut cmd = lobster();
    cmd.env("XDG_CACHE_HOME", cache)
        .arg("ls")
        .arg("--data")
        .arg(data);
    let out = output_within(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.rsplit('\t').next().unwrap().to_owned())
        .collect()
}

/// A tarball of `files` (each holding its name) made with `tar --mtime=2024-01-01`.
fn tarball(dir: &Path, name: &str, files: &[&str]) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.src"));
    for f in files {
        let p = src.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, f.as_bytes()).unwrap();
    }
    let tar = dir.join(format!("{name}.tar"));
    let made = Command::new("tar")
        .arg("--mtime=2024-01-01")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()
        .unwrap();
    assert!(made.success());
    tar
}

fn extract(tar: &Path, into: &Path) {
    std::fs::create_dir_all(into).unwrap();
    let done = Command::new("tar")
        .arg("-xf")
        .arg(tar)
        .arg("-C")
        .arg(into)
        .status()
        .unwrap();
    assert!(done.success());
}

#[test]
fn ls_lists_a_folder_replaced_by_a_tarball_with_the_same_mtimes() {
    if Command::new("tar").arg("--version").output().is_err() {
        eprintln!("skipped: no tar on this machine");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (data, cache) = (dir.path().join("data"), dir.path().join("cache"));
    let one = tarball(dir.path(), "one", &["a/0.jpg", "a/1.jpg", "b/2.jpg"]);
    let two = tarball(dir.path(), "two", &["a/0.jpg", "b/2.jpg", "b/3.jpg"]);
    extract(&one, &data);
    // Older than the racy window, so that the table is kept: a folder extracted before
    // the job.
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(ls_keys(&data, &cache), ["a/0.jpg", "a/1.jpg", "b/2.jpg"]);
    let tables = cache.join("lobster-io/tables");
    assert_eq!(
        std::fs::read_dir(&tables).unwrap().count(),
        1,
        "the table is kept"
    );
    std::fs::remove_dir_all(&data).unwrap();
    extract(&two, &data);
    assert_eq!(ls_keys(&data, &cache), ["a/0.jpg", "b/2.jpg", "b/3.jpg"]);
}

#[test]
fn resume_from_dev_zero_is_refused_promptly_naming_the_file_and_the_bound() {
    // Under a 2 GB address space, so that reading without a bound fails the test rather
    // than the machine.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -v 2000000 && exec \"$@\"", "sh"])
        .arg(env!("CARGO_BIN_EXE_lobster"))
        .args(["run", "--quiet", "--samples", "8", "--epochs", "1"])
        .args(["--resume", "/dev/zero"]);
    let out = output_within(cmd, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("/dev/zero") && err.contains(&(16u64 << 20).to_string()),
        "{err}"
    );
}

#[test]
fn pack_refuses_a_sample_that_is_a_symlink_to_a_device_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("a")).unwrap();
    std::fs::write(data.join("a/0.jpg"), b"0").unwrap();
    std::os::unix::fs::symlink("/dev/zero", data.join("a/1.jpg")).unwrap();
    // Under a 2 GB address space, so that reading without a bound fails the test rather
    // than the machine.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -v 2000000 && exec \"$@\"", "sh"])
        .arg(env!("CARGO_BIN_EXE_lobster"))
        .arg("pack")
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(dir.path().join("shards"));
    let out = output_within(cmd, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("a/1.jpg") && err.contains("changed size"),
        "{err}"
    );
}

#[test]
fn replay_refuses_a_trace_without_line_ends_naming_the_bound() {
    // Under a 2 GB address space, so that reading without a bound fails the test rather
    // than the machine.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -v 2000000 && exec \"$@\"", "sh"])
        .arg(env!("CARGO_BIN_EXE_lobster"))
        .args(["replay", "--trace", "/dev/zero", "--capacity-bytes", "1"])
        .args(["--policy", "lru"]);
    let out = output_within(cmd, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("/dev/zero") && err.contains("line 1") && err.contains("4096"),
        "{err}"
    );
}
