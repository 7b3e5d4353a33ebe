//! `lobster soak` end to end through the built binary: a short soak with faults injected loses
//! no sample and leaves no descriptor or thread behind.

use std::process::Command;

#[test]
fn a_short_soak_with_faults_loses_nothing_and_leaks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("soak.json");
    let out = Command::new(env!("CARGO_BIN_EXE_lobster"))
        .args([
            "soak",
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
            // Four epochs are no steady state for memory (the reader's buffer pool is paged in
            // as first used, and the cache fills): the long soak checks that bound; this one
            // checks loss, descriptors and threads.
            "--rss-growth-max",
            "1.0",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
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
