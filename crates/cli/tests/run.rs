//! `lobster gen`, `lobster order` and `lobster run` end to end, through the built binary.

mod common;

use std::process::Command;

use common::{gen, lobster};

/// Runs `cmd` (`lobster` with its environment) as `lobster run --quiet` with no compute and
/// no emulated storage, 2 ranks per node and batches of 4 unless `args` say otherwise,
/// writing its report to `json`; asserts it succeeded and returns its output and report.
fn run_json(
    mut cmd: Command,
    json: &std::path::Path,
    args: &[&std::ffi::OsStr],
) -> (String, serde_json::Value) {
    cmd.args(["run", "--quiet", "--compute-ms", "0", "--storage-mbps", "0"])
        .args(["--ranks-per-node", "2", "--batch", "4"]);
    run_report(cmd, json, args)
}

/// Runs `cmd` with `args`, writing its report to `json`; asserts it succeeded and returns its
/// output and report.
fn run_report(
    mut cmd: Command,
    json: &std::path::Path,
    args: &[&std::ffi::OsStr],
) -> (String, serde_json::Value) {
    let out = cmd.args(args).arg("--json").arg(json).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), report)
}

/// [`run_json`] on `data`, the report in `dir`.
fn run_ok(
    dir: &std::path::Path,
    data: &std::path::Path,
    args: &[&str],
) -> (String, serde_json::Value) {
    let mut all: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    all.extend([std::ffi::OsStr::new("--data"), data.as_os_str()]);
    run_json(lobster(), &dir.join("run.json"), &all)
}

#[test]
fn run_writes_every_strategy_with_the_documented_keys() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 64, 8);
    let (stdout, report) = run_ok(
        dir.path(),
        &data,
        &[
            "--epochs",
            "2",
            "--nodes",
            "2",
            "--decoder",
            "jpeg",
            "--workers-per-rank",
            "3",
        ],
    );
    assert!(stdout.contains("speedup"), "{stdout}");
    assert!(stdout.contains("3 workers per rank"), "{stdout}");
    assert_eq!(report["config"]["ranks_per_node"], 2);
    assert_eq!(report["config"]["workers_per_rank"], 3);
    let results = report["results"].as_array().unwrap();
    let strategies: Vec<&str> = results
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(
        strategies,
        [
            "pytorch",
            "nopfs",
            "lobster-cache-only",
            "lobster-alloc-only",
            "lobster"
        ]
    );
    for r in results {
        for key in [
            "epoch_seconds",
            "samples_per_second",
            "stall_fraction",
            "job_stall_fraction",
            "imbalance_p50",
            "imbalance_p95",
            "hit_ratio",
            "speedup_vs_pytorch",
            "peak_rss_bytes",
            "cpu_seconds",
        ] {
            assert!(!r[key].is_null(), "{key} in {r}");
        }
        assert_eq!(r["epoch_seconds"].as_array().unwrap().len(), 2, "{r}");
        assert!(r["samples_per_second"].as_f64().unwrap() > 0.0);
        // 64 samples over 2 nodes: this node delivers 32 per epoch, for 2 epochs.
        assert_eq!(r["samples"], 64, "{r}");
        assert!(r["cpu_seconds"].as_f64().unwrap() >= 0.0, "{r}");
        // 2 epochs x 4 iterations x 2 ranks, and the median imbalance follows from them.
        let iterations = r["iterations"].as_array().unwrap();
        assert_eq!(iterations.len(), 16, "{r}");
        let mut loads: std::collections::BTreeMap<(u64, u64), Vec<f64>> = Default::default();
        for m in iterations {
            let key = (
                m["epoch"].as_u64().unwrap(),
                m["iteration"].as_u64().unwrap(),
            );
            loads
                .entry(key)
                .or_default()
                .push(m["load_s"].as_f64().unwrap());
        }
        let mut ratios: Vec<f64> = loads
            .values()
            .map(|l| {
                assert_eq!(l.len(), 2);
                lobster_sched::imbalance(l)
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len().div_ceil(2) - 1];
        let p50 = r["imbalance_p50"].as_f64().unwrap();
        assert!(
            p50 >= median && p50 <= median + 0.0011,
            "imbalance_p50 {p50} is the median {median} to the histogram's 0.001"
        );
        // Per iteration the longest wait is at least the ranks' mean wait.
        let (job, mean) = (
            r["job_stall_fraction"].as_f64().unwrap(),
            r["stall_fraction"].as_f64().unwrap(),
        );
        assert!(job >= mean - 1e-9, "job stall {job} < mean stall {mean}");
    }
    assert_eq!(results[0]["hit_ratio"], 0.0, "pytorch has no cache");
}

#[test]
fn run_rejects_nonsense_parameters_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 16, 8);
    for (flag, value, name) in [
        ("--ranks-per-node", "0", "ranks_per_node"),
        ("--batch", "0", "batch_size"),
        ("--node", "9", "node"),
        ("--decode-threads", "1", "decode_threads"),
        ("--cache-frac", "2", "--cache-frac"),
        ("--io-order", "fifo", "--io-order"),
        ("--workers-per-rank", "0", "--workers-per-rank"),
        ("--assign", "locality", "--assign locality"),
        ("--assign", "nearest", "--assign"),
    ] {
        let mut args = vec![
            ("--ranks-per-node", "2"),
            ("--nodes", "2"),
            ("--batch", "2"),
        ];
        args.retain(|(f, _)| *f != flag);
        args.push((flag, value));
        let out = lobster()
            .args(["run", "--quiet"])
            .args(args.iter().flat_map(|(f, v)| [*f, *v]))
            .arg("--data")
            .arg(&data)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} {value} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(name), "{flag} {value}: {stderr}");
    }
}

#[test]
fn workers_per_rank_defaults_to_the_io_depth_share() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 16, 8);
    let (_, report) = run_ok(
        dir.path(),
        &data,
        &[
            "--strategy",
            "pytorch",
            "--epochs",
            "1",
            "--nodes",
            "1",
            "--io-depth",
            "6",
        ],
    );
    // 6 reads in flight over 2 ranks.
    assert_eq!(report["config"]["workers_per_rank"], 3);
}

#[test]
fn a_missing_dataset_is_named() {
    let out = lobster()
        .args(["run", "--quiet", "--data", "/nonexistent/lobster-data"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/lobster-data"));
}

/// PyTorch's own `DistributedSampler` output, vendored with its provenance in
/// `crates/lobster/tests/data/README.md`: the expectations come from outside this repository.
const TORCH_SAMPLER_JSON: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../lobster/tests/data/torch_sampler.json"
);

#[test]
fn order_prints_the_rank_indices_torch_distributed_sampler_yields() {
    let vectors: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(TORCH_SAMPLER_JSON).unwrap()).unwrap();
    let cases = vectors["distributed_sampler"].as_array().unwrap();
    // The file must cover both tails, or a case class could vanish unnoticed.
    for drop_last in [false, true] {
        assert!(
            cases.iter().any(|c| c["drop_last"] == drop_last),
            "no distributed_sampler case with drop_last = {drop_last}"
        );
    }
    for case in cases {
        // `lobster order` always shuffles, like DistributedSampler(shuffle=True).
        assert_eq!(case["shuffle"], true, "{case}");
        let field = |name: &str| {
            case[name]
                .as_u64()
                .unwrap_or_else(|| panic!("{name} in {case}"))
                .to_string()
        };
        let mut cmd = lobster();
        cmd.arg("order")
            .args(["--samples", &field("n")])
            .args(["--seed", &field("seed")])
            .args(["--epoch", &field("epoch")])
            .args(["--world", &field("num_replicas")])
            .args(["--rank", &field("rank")]);
        if case["drop_last"].as_bool().unwrap() {
            cmd.arg("--drop-last");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{case}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<u64> = serde_json::from_slice(&out.stdout).unwrap();
        let expected: Vec<u64> = serde_json::from_value(case["indices"].clone()).unwrap();
        assert_eq!(
            got,
            expected,
            "n {} seed {} epoch {} world {} rank {} drop_last {}",
            case["n"],
            case["seed"],
            case["epoch"],
            case["num_replicas"],
            case["rank"],
            case["drop_last"]
        );
    }
}

#[test]
fn ranks_as_processes_make_the_same_decisions_as_threads_with_faults_skipped_alike() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 96, 8);
    let common = [
        "--epochs",
        "3",
        "--nodes",
        "2",
        "--strategy",
        "pytorch,lobster",
        "--decoder",
        "raw",
        "--on-error",
        "skip",
        "--max-failures",
        "50%",
        "--inject-faults",
        "seed=3,eio=0.05",
    ];
    let (_, threads) = run_ok(dir.path(), &data, &common);
    let mut with = common.to_vec();
    with.extend(["--ranks-as", "processes"]);
    let (_, processes) = run_ok(dir.path(), &data, &with);
    assert_eq!(processes["config"]["ranks_as"], "processes");
    assert_eq!(threads["config"]["ranks_as"], "threads");
    let (t, p) = (
        threads["results"].as_array().unwrap(),
        processes["results"].as_array().unwrap(),
    );
    assert_eq!(t.len(), 2);
    for (t, p) in t.iter().zip(p) {
        // The same batches, step by step, whether the ranks are threads or processes.
        assert!(p["batches_crc32"].is_u64(), "{}", p["batches_crc32"]);
        // 96 samples over 2 nodes of 2 ranks in batches of 4: 6 steps an epoch, 3 epochs.
        assert_eq!(p["step_crc32"].as_array().map(Vec::len), Some(3 * 6));
        for key in [
            "strategy",
            "hits",
            "accesses",
            "samples",
            "skipped",
            "batches_crc32",
            "step_crc32",
        ] {
            assert_eq!(t[key], p[key], "{key} of {}", t["strategy"]);
        }
        // The same samples skipped; ranks record theirs in whichever order they get there.
        let sorted = |r: &serde_json::Value| {
            let mut v: Vec<String> = r["skipped_samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.to_string())
                .collect();
            v.sort();
            v
        };
        assert_eq!(sorted(t), sorted(p), "skipped samples of {}", t["strategy"]);
        assert!(t["skipped"].as_u64().unwrap() > 0, "faults were injected");
        assert!(p["memory"].as_str().unwrap().contains("PSS"));
        assert!(p["peak_rss_bytes"].as_u64().unwrap() > 0);
    }
}

#[test]
fn a_failed_read_in_a_rank_process_fails_the_run_naming_the_sample() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 48, 8);
    let out = lobster()
        .args(["run", "--quiet", "--compute-ms", "0", "--storage-mbps", "0"])
        .args([
            "--ranks-per-node",
            "2",
            "--batch",
            "4",
            "--strategy",
            "lobster",
        ])
        .args(["--ranks-as", "processes", "--decoder", "raw"])
        .args(["--inject-faults", "seed=1,eio=0.5"])
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rank process") && err.contains("reading sample") && err.contains("EIO"),
        "{err}"
    );
}

#[test]
fn the_built_in_dataset_keeps_the_synthetic_decoder_in_both_rank_modes() {
    // The default set is resolved to a path like a user's --data; its decoder stays the
    // synthetic cost the main job is specified with, in the rank processes too.
    let dir = tempfile::tempdir().unwrap();
    for ranks_as in ["threads", "processes"] {
        let json = dir.path().join(format!("{ranks_as}.json"));
        let mut cmd = lobster();
        cmd.env("XDG_CACHE_HOME", dir.path());
        let args = ["--samples", "64", "--epochs", "1", "--strategy", "lobster"];
        let mut all: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        all.extend(["--ranks-as", ranks_as].map(std::ffi::OsStr::new));
        let (_, report) = run_json(cmd, &json, &all);
        assert_eq!(report["config"]["decoder"], "synthetic", "{ranks_as}");
        assert_eq!(report["results"][0]["samples"], 64 / 4, "{ranks_as}");
    }
}

#[test]
fn cache_forms_are_reported_per_strategy() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 48, 8);
    let args = [
        "--decoder",
        "jpeg",
        "--transform",
        "train",
        "--image-size",
        "8",
        "--epochs",
        "3",
        "--strategy",
        "lobster,nopfs",
        "--cache-forms",
        "decoded",
        "--cache-bytes",
        "20000000",
    ];
    let (stdout, report) = run_ok(dir.path(), &data, &args);
    let results = report["results"].as_array().unwrap();
    let lobster = &results[0];
    assert_eq!(lobster["strategy"], "lobster");
    assert_eq!(lobster["cache_forms"]["mode"], "decoded");
    assert!(lobster["cache_forms"]["reason"].is_null(), "{lobster}");
    assert!(lobster["hits_decoded"].as_u64().unwrap() > 0, "{lobster}");
    assert_eq!(lobster["hits_encoded"], 0);
    assert!(lobster["decode_saved_seconds"].as_f64().unwrap() > 0.0);
    assert!(lobster["peak_cached_decoded_bytes"].as_u64().unwrap() <= 20_000_000);
    assert!(lobster["form_costs"]["decode_per_byte_s"].as_f64().unwrap() > 0.0);
    // NoPFS's static placement keeps bytes, and says why.
    let nopfs = &results[1];
    assert_eq!(nopfs["cache_forms"]["mode"], "encoded", "{nopfs}");
    assert!(
        !nopfs["cache_forms"]["reason"].as_str().unwrap().is_empty(),
        "{nopfs}"
    );
    assert!(
        stdout.contains("lobster: cache forms decoded: hits 0 encoded"),
        "{stdout}"
    );
    assert_eq!(report["config"]["cache_forms"], "decoded");
}

#[test]
fn auto_forms_make_the_same_plan_run_after_run_and_in_processes_as_in_threads() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 48, 8);
    let common = [
        "--decoder",
        "jpeg",
        "--transform",
        "train",
        "--image-size",
        "8",
        "--epochs",
        "3",
        "--policy",
        "lobster",
        "--cache-forms",
        "auto",
        "--cache-bytes",
        "400000",
    ];
    let (_, first) = run_ok(dir.path(), &data, &common);
    let (_, again) = run_ok(dir.path(), &data, &common);
    let mut with = common.to_vec();
    with.extend(["--ranks-as", "processes"]);
    let (_, processes) = run_ok(dir.path(), &data, &with);
    let plan = |report: &serde_json::Value| {
        let r = &report["results"][0];
        [
            "hits",
            "hits_encoded",
            "hits_decoded",
            "peak_cached_encoded_bytes",
            "peak_cached_decoded_bytes",
            "form_costs",
        ]
        .map(|k| r[k].clone())
    };
    assert_eq!(plan(&first), plan(&again));
    assert_eq!(plan(&first), plan(&processes));
    let costs = &first["results"][0]["form_costs"];
    assert_eq!(costs["decode_source"], "model", "{costs}");
    assert!(costs["model_pixels"].as_u64().unwrap() > 0, "{costs}");
}

/// `--cluster --assign locality`: the lobster strategy's steps go to the nodes holding their
/// samples, and the JSON says so; the node plan cannot, and says why. Every node takes every
/// step's batches: as many samples as the sampler's split.
#[test]
fn locality_under_the_cluster_plan_is_reported_per_strategy() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 96, 8);
    let (stdout, report) = run_ok(
        dir.path(),
        &data,
        &[
            "--cluster",
            "--nodes",
            "3",
            "--epochs",
            "3",
            "--cache-frac",
            "0.2",
            "--decoder",
            "raw",
            "--assign",
            "locality",
            "--strategy",
            "lobster-node-plan,lobster",
        ],
    );
    assert!(stdout.contains("cluster,loc"), "{stdout}");
    assert_eq!(report["config"]["assign"], "locality");
    for node in report["nodes"].as_array().unwrap() {
        let (plan, lobster) = (&node[0], &node[1]);
        assert_eq!(lobster["assign"]["mode"], "locality", "{lobster}");
        assert_eq!(plan["assign"]["mode"], "sampler");
        let why = plan["assign"]["reason"].as_str().unwrap();
        assert!(why.contains("cluster plan"), "{why}");
        assert_eq!(plan["samples"], lobster["samples"]);
    }
}

/// `--link-prices`: on an interconnect about as slow as storage, the cluster plan reads some
/// remote hits from storage instead. Every node delivers the same batches either way, every
/// planned remote hit is served, and each storage byte more is a rerouted one.
#[test]
fn link_prices_send_remote_hits_to_storage_on_a_slow_interconnect() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 192, 8);
    let run = |prices: &str| {
        let mut cmd = lobster();
        cmd.args([
            "run",
            "--quiet",
            "--compute-ms",
            "0",
            "--cluster",
            "--nodes",
            "4",
        ])
        .args(["--ranks-per-node", "2", "--batch", "4", "--epochs", "3"])
        .args([
            "--cache-frac",
            "0.2",
            "--decoder",
            "raw",
            "--strategy",
            "lobster",
        ])
        .args([
            "--storage-mbps",
            "3",
            "--net-mbps",
            "4",
            "--link-prices",
            prices,
        ])
        .arg("--data")
        .arg(&data);
        run_report(cmd, &dir.path().join(format!("{prices}.json")), &[]).1
    };
    let (on, off) = (run("on"), run("off"));
    assert_eq!(on["config"]["link_prices"]["net_bytes_per_s"], 4_000_000);
    assert!(off["config"]["link_prices"].is_null());
    let storage = |r: &serde_json::Value| -> u64 {
        let epochs = r["storage_bytes_by_epoch"].as_array().unwrap();
        epochs.iter().map(|x| x.as_u64().unwrap()).sum()
    };
    let mut rerouted_all = 0;
    for n in 0..4 {
        let (a, b) = (&on["nodes"][n][0], &off["nodes"][n][0]);
        assert_eq!(a["batches_crc32"], b["batches_crc32"], "node {n}");
        assert_eq!(a["samples"], b["samples"], "node {n}");
        for r in [a, b] {
            assert_eq!(r["remote_hits"], r["planned_remote_hits"], "node {n}: {r}");
            assert_eq!(r["remote_misses"], 0, "node {n}");
        }
        let epochs = a["cluster_plan"]["epochs"].as_array().unwrap();
        let rerouted: u64 = epochs
            .iter()
            .map(|e| e["rerouted_bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(storage(a), storage(b) + rerouted, "node {n}");
        let remote = |r: &serde_json::Value| r["remote_hit_bytes"].as_u64().unwrap();
        assert_eq!(remote(a) + rerouted, remote(b), "node {n}");
        rerouted_all += rerouted;
    }
    assert!(
        rerouted_all > 0,
        "a 4 MB/s interconnect against 3 MB/s storage"
    );
}
