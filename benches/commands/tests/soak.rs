//! `lobster-bench soak` end to end through the built binary: a short soak with faults injected
//! loses no sample, leaves no descriptor or thread behind, and its resident memory levels off.

use std::path::Path;
use std::process::Command;

fn soak(args: &[&str], json: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lobster-bench"))
        .arg("soak")
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

#[test]
fn a_short_soak_with_faults_loses_nothing_and_leaks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("soak.json");
    let report = soak(
        &[
            "--epochs",
            "4",
            "--samples",
            "160",
            "--mean-kb",
            "4",
            "--ranks-per-node",
            "2",
            "--batch",
            "4",
            "--inject-faults",
            "seed=2,eio=0.02,short=0.2,delay=0.05,corrupt=0.02,delay_us=200",
            "--max-failures",
            "20%",
        ],
        &json,
    );
    let n = |k: &str| report[k].as_u64().unwrap();
    assert_eq!(n("samples_lost"), 0, "{report}");
    assert_eq!(
        n("samples_delivered") + n("samples_skipped"),
        n("samples_planned")
    );
    assert!(
        n("faults_injected") > 0 && n("read_retries") > 0,
        "{report}"
    );
    assert_eq!(report["fds_after"], report["fds_before"], "{report}");
    assert_eq!(
        report["threads_after"], report["threads_before"],
        "{report}"
    );
    assert_eq!(report["rss_bytes_per_epoch"].as_array().unwrap().len(), 4);
}

const MIB: u64 = 1 << 20;

#[test]
fn resident_memory_stops_growing_after_the_first_epoch() {
    let dir = tempfile::tempdir().unwrap();
    // 256 files of 64 KiB (16 MiB): this node of two reads 8 MiB an epoch. Plain bytes and the
    // raw decoder keep a debug build fast; faults still take the retry and skip paths.
    let data = dir.path().join("data");
    for i in 0..256u32 {
        let class = data.join(format!("c{}", i % 4));
        std::fs::create_dir_all(&class).unwrap();
        let bytes: Vec<u8> = (0..64 << 10).map(|k: u32| (k ^ i) as u8).collect();
        std::fs::write(class.join(format!("{i:04}.jpg")), bytes).unwrap();
    }
    let json = dir.path().join("soak.json");
    // The pipelined and the read-then-decode executions.
    for strategy in ["lobster", "pytorch"] {
        let report = soak(
            &[
                "--data",
                data.to_str().unwrap(),
                "--decoder",
                "raw",
                "--strategy",
                strategy,
                "--epochs",
                "8",
                "--ranks-per-node",
                "2",
                "--batch",
                "4",
                "--inject-faults",
                "seed=2,eio=0.02,short=0.2,delay=0.05,corrupt=0.02,delay_us=200",
                "--max-failures",
                "20%",
                // The bound below decides, not soak's own relative one.
                "--rss-growth-max",
                "100",
            ],
            &json,
        );
        assert_eq!(report["samples_lost"], 0, "{report}");
        let rss: Vec<u64> = report["rss_bytes_per_epoch"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        assert_eq!(rss.len(), 8);
        let after_build = report["rss_bytes_after_build"].as_u64().unwrap();
        assert!(after_build > 0 && rss[0] >= after_build / 2, "{report}");
        // The reader's pool is committed at build and the threads are warm after epoch 1; what
        // may still grow is the cache filling to its capacity, plus 2 MiB and 5% for the
        // allocator's free lists: under 6 MiB here. Over the 7 epochs that follow, keeping every
        // read would add 56 MiB; keeping a fifth of them, 11 MiB.
        let cache = report["cache_capacity_bytes"].as_u64().unwrap();
        let allowed = cache + 2 * MIB + rss[0] / 20;
        let growth = rss[1..].iter().max().unwrap().saturating_sub(rss[0]);
        assert!(
            growth <= allowed,
            "{strategy}: resident memory grew {growth} bytes after epoch 1, allowed {allowed}: \
             {rss:?}"
        );
    }
}

/// Resident bytes after each epoch, from a soak's JSON.
fn rss_per_epoch(report: &serde_json::Value) -> Vec<u64> {
    rss_per_epoch_of(report, "rss_bytes_per_epoch")
}

/// One of a soak's per-epoch memory series.
fn rss_per_epoch_of(report: &serde_json::Value, field: &str) -> Vec<u64> {
    report[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect()
}

#[test]
fn resident_memory_stays_level_over_many_short_epochs() {
    // One sample a batch: 220 iterations an epoch per rank, so whatever is kept per iteration
    // (records of batches and allocations, failures, the ranks' step digests) adds up within
    // tens of epochs of a small dataset, as over a long run of a large one. Every bounded
    // record is at its bound by epoch 20.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("soak.json");
    let epochs = 60;
    let report = soak(
        &[
            "--samples",
            "440",
            "--mean-kb",
            "2",
            "--decoder",
            "raw",
            "--nodes",
            "1",
            "--ranks-per-node",
            "2",
            "--batch",
            "1",
            "--epochs",
            &epochs.to_string(),
            "--inject-faults",
            "seed=3,eio=0.01,short=0.05,delay=0.02,corrupt=0.01,delay_us=100",
            "--max-failures",
            "20%",
            // The long-run check below decides, not the one from epoch 2.
            "--rss-growth-max",
            "100",
        ],
        &json,
    );
    let rss = rss_per_epoch(&report);
    assert_eq!(rss.len(), epochs);
    // From epoch 20 on the cache is long full: the run holds no more than then, within 5%.
    let at_20 = rss[19];
    let max_after = *rss[19..].iter().max().unwrap();
    assert!(
        max_after as f64 <= at_20 as f64 * 1.05,
        "resident memory grew from {at_20} bytes after epoch 20 to {max_after}: {rss:?}"
    );
    // The soak checks the epochs' peaks itself, by the same rule, and says so.
    let peaks = rss_per_epoch_of(&report, "rss_peak_bytes_per_epoch");
    assert_eq!(peaks.len(), epochs);
    assert!(peaks.iter().zip(&rss).all(|(p, r)| p >= r), "{report}");
    let peak_at_20 = peaks[19];
    let peak_max_after = *peaks[19..].iter().max().unwrap();
    assert!(
        peak_max_after as f64 <= peak_at_20 as f64 * 1.05,
        "the epochs' peak resident memory grew from {peak_at_20} bytes in epoch 20 to \
         {peak_max_after}: {peaks:?}"
    );
    // Its own rule compares levels, medians of 20 epochs' peaks (lower middle): the one from
    // epoch 20 and the highest of a later window.
    assert_eq!(report["rss_steady_epoch"], 20, "{report}");
    assert_eq!(report["rss_level_epochs"], 20, "{report}");
    let levels: Vec<u64> = peaks[19..]
        .windows(20)
        .map(|w| {
            let mut w = w.to_vec();
            w.sort_unstable();
            w[9]
        })
        .collect();
    let highest = *levels.iter().max().unwrap();
    assert_eq!(
        report["rss_level_bytes_at_steady_epoch"], levels[0],
        "{report}"
    );
    assert_eq!(
        report["rss_level_bytes_highest_after_steady_epoch"],
        highest
    );
    let growth = report["rss_growth_after_steady_epoch"].as_f64().unwrap();
    assert!(
        (growth - (highest as f64 / levels[0] as f64 - 1.0)).abs() < 1e-9,
        "{report}"
    );
    let excursion = report["rss_excursion_after_steady_epoch"].as_f64().unwrap();
    assert!(
        (excursion - (peak_max_after as f64 / levels[0] as f64 - 1.0)).abs() < 1e-9,
        "{report}"
    );
}

#[test]
fn the_long_run_check_fails_the_soak_past_its_bound() {
    // With a bound of 0, any growth after the steady epoch (2 of 4; too short a run for a
    // level of more than one epoch) fails the soak, named.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lobster-bench"))
        .args([
            "soak",
            "--samples",
            "40",
            "--mean-kb",
            "2",
            "--decoder",
            "raw",
        ])
        .args(["--epochs", "4", "--nodes", "1", "--ranks-per-node", "2"])
        .args(["--rss-growth-max", "100", "--rss-steady-growth-max", "0"])
        .arg("--json")
        .arg(dir.path().join("soak.json"))
        .output()
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("soak.json")).unwrap())
            .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let grew = report["rss_growth_after_steady_epoch"].as_f64().unwrap() > 0.0;
    assert_eq!(out.status.success(), !grew, "{report} {stderr}");
    if grew {
        assert!(stderr.contains("after epoch 2"), "{stderr}");
    }
}

/// Runs a soak on a generated dataset with `TMPDIR` in a directory of the test's, sends it
/// `signal` once its loader runs, and returns the process's outcome and what it left there.
fn soak_stopped_by(signal: &str) -> (std::process::ExitStatus, String, Vec<std::path::PathBuf>) {
    use std::io::{BufRead, Read};
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lobster-bench"))
        .args([
            "soak",
            "--samples",
            "64",
            "--mean-kb",
            "2",
            "--decoder",
            "raw",
        ])
        .args([
            "--epochs",
            "100000",
            "--nodes",
            "1",
            "--ranks-per-node",
            "2",
        ])
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("generating"), "{line}");
    // The loader's threads (planner, reader, decoders, 2 ranks) run once the dataset is made:
    // the signal then comes mid-run, the dataset in use.
    let threads = || std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while threads() < 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "the loader never started"
        );
        assert!(child.try_wait().unwrap().is_none(), "the soak ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let made: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(
        made.len(),
        1,
        "the generated dataset is there while it runs"
    );
    let kill = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    // A hang guard only: the soak stops at its next step.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the soak did not stop after SIG{signal}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let left = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    (status, stderr, left)
}

#[test]
fn a_soak_stopped_by_sigterm_or_sigint_removes_its_generated_dataset() {
    for signal in ["TERM", "INT"] {
        let (status, stderr, left) = soak_stopped_by(signal);
        assert!(left.is_empty(), "SIG{signal} left {left:?}; {stderr}");
        assert!(!status.success(), "SIG{signal}: {status}");
        assert!(
            stderr.contains(&format!("SIG{signal}")),
            "the error names the signal: {stderr}"
        );
    }
}
