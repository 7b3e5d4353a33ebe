//! `lobster run --disk-cache DIR --disk-cache-bytes N`: each cached strategy gets its own
//! `DIR/<strategy>`, delivers the batches of a run without it, and a second run over the same
//! DIR starts with the first's entries; with peers or a decoded tier it is refused, naming
//! both options.

mod common;

use std::path::Path;
use std::process::Output;

use common::{gen, lobster};
use serde_json::Value;

/// `lobster run` on `data` on one node, with no compute, no emulated storage and the raw
/// decoder, writing `json`, with `args`.
fn run(data: &Path, json: &Path, args: &[&str]) -> Output {
    lobster()
        .args(["run", "--quiet", "--compute-ms", "0", "--storage-mbps", "0"])
        .args(["--decoder", "raw", "--ranks-per-node", "2", "--batch", "4"])
        .args(["--epochs", "3", "--cache-frac", "0.1"])
        .arg("--data")
        .arg(data)
        .arg("--json")
        .arg(json)
        .args(args)
        .output()
        .unwrap()
}

fn results(out: &Output, json: &Path) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    v["results"].as_array().unwrap().clone()
}

fn storage_epoch0(r: &Value) -> u64 {
    r["storage_bytes_by_epoch"][0].as_u64().unwrap()
}

#[test]
fn each_strategy_keeps_its_batches_and_a_second_run_reuses_its_disk() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 96, 8);
    let cache = dir.path().join("disk");
    let strategies = ["--nodes", "1", "--strategy", "pytorch,nopfs,lobster"];
    let with_disk: Vec<&str> = strategies
        .iter()
        .copied()
        .chain(["--disk-cache", cache.to_str().unwrap()])
        .chain(["--disk-cache-bytes", "400000"])
        .collect();

    let json = dir.path().join("plain.json");
    let plain = results(&run(&data, &json, &strategies), &json);
    let json = dir.path().join("first.json");
    let first = results(&run(&data, &json, &with_disk), &json);
    let json = dir.path().join("second.json");
    let second = results(&run(&data, &json, &with_disk), &json);

    for ((p, a), b) in plain.iter().zip(&first).zip(&second) {
        let name = p["strategy"].as_str().unwrap();
        assert_eq!(a["batches_crc32"], p["batches_crc32"], "{name}");
        assert_eq!(b["batches_crc32"], p["batches_crc32"], "{name}");
        if name == "pytorch" {
            assert!(
                a["disk_cache"].is_null(),
                "no cache, no disk: {}",
                a["disk_cache"]
            );
            assert!(!cache.join(name).exists());
            continue;
        }
        let (d1, d2) = (&a["disk_cache"], &b["disk_cache"]);
        assert!(
            d1["dir"].as_str().unwrap().contains(&format!("/{name}/")),
            "{name}: {}",
            d1["dir"]
        );
        assert!(d1["writes"].as_u64().unwrap() > 0, "{name}: {d1}");
        assert!(
            d1["used_bytes"].as_u64().unwrap() <= d1["capacity_bytes"].as_u64().unwrap(),
            "{name}: {d1}"
        );
        assert_eq!(d2["seeds"], d1["entries"], "{name}");
        let seed_bytes = d2["seed_bytes"].as_u64().unwrap();
        assert!(seed_bytes > 0, "{name}: {d2}");
        // Every entry is accessed in the first epoch: read from the disk, not storage.
        assert!(
            storage_epoch0(b) + seed_bytes * 9 / 10 <= storage_epoch0(a),
            "{name}: epoch 0 read {} then {} bytes, {seed_bytes} found on the disk",
            storage_epoch0(a),
            storage_epoch0(b)
        );
    }
}

#[test]
fn the_disk_cache_with_peers_or_a_decoded_tier_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 32, 4);
    let cache = dir.path().join("disk");
    let disk = [
        "--disk-cache",
        cache.to_str().unwrap(),
        "--disk-cache-bytes",
        "1000000",
    ];
    let json = dir.path().join("r.json");
    for (args, other) in [
        (&["--cluster", "--nodes", "2"][..], "--cluster"),
        (
            &["--strategy", "lobster", "--cache-forms", "decoded"][..],
            "cache_forms",
        ),
    ] {
        let all: Vec<&str> = args.iter().chain(&disk).copied().collect();
        let out = run(&data, &json, &all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("--disk-cache"), "{stderr}");
        assert!(stderr.contains(other), "{stderr}");
        assert!(!cache.exists(), "nothing made before the refusal");
    }
}
