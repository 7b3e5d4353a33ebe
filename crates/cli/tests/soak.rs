//! `lobster soak` end to end through the built binary: a short soak with faults injected loses
//! no sample, leaves no descriptor or thread behind, and its resident memory levels off.

use std::path::Path;
use std::process::Command;

fn soak(args: &[&str], json: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lobster"))
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
